"""Shared fixtures: which backends the CPU tests run on, and the CUDA skip rule."""

from __future__ import annotations

import pytest
import torch

import flashattn


def _backend_problem(backend: str, device: str = "cpu", dtype=torch.float32, head_dim: int = 8):
    """None if `backend` runs forward and backward on a small call, else the NotImplementedError message."""
    q = torch.zeros(1, 16, 2, head_dim, dtype=dtype, device=device, requires_grad=True)
    try:
        out = flashattn.flash_attn_func(q, q, q, backend=backend)
        out.sum().backward()
    except NotImplementedError as e:
        return str(e)
    return None


CUDA_AVAILABLE = torch.cuda.is_available() and flashattn.built_with_cuda() and flashattn.cuda_device_count() > 0
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE,
                                   reason="needs a CUDA device and a flashattn build with the CUDA kernels")

_auto_problem = _backend_problem("auto")


def cpu_backends():
    """The reference oracle always; automatic dispatch (the default path, cpu_flash on CPU) when it can run."""
    return [
        "cpu_reference",
        pytest.param("auto", marks=pytest.mark.skipif(_auto_problem is not None,
                                                      reason=f"automatic CPU dispatch unavailable: {_auto_problem}")),
    ]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
