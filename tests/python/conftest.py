"""Shared fixtures: which backends the CPU tests run on, the CUDA skip rule, and the skip summary.

No silent skips: only what is genuinely absent skips (no CUDA device, a build without the CUDA kernels, a GPU the
kernels do not support, an optional package). The automatic CPU path is always tested; if it cannot run a
supported shape, its cases fail (and test_dispatch.py says which shape), they are never turned into skips. At the
end of every run the skipped tests are listed grouped by reason, with a count per reason.
"""

from __future__ import annotations

from collections import Counter

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


def _cuda_absent() -> str | None:
    """Why the CUDA tests cannot run here (something genuinely absent), or None when they must run."""
    if not flashattn.built_with_cuda():
        return "needs a flashattn build with the CUDA kernels (this one is CPU-only)"
    if not torch.cuda.is_available():
        return "needs a CUDA device (none visible to torch)"
    if flashattn.cuda_device_count() == 0:
        # torch sees a GPU that the library does not: not an absence but a broken setup; test_native fails on it.
        return "needs a CUDA device visible to flashattn (torch sees one, flashattn none: see test_native)"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"needs compute capability >= 8.0 for the CUDA kernels (device 0 has {major}.{minor})"
    return None


CUDA_SKIP_REASON = _cuda_absent()
CUDA_AVAILABLE = CUDA_SKIP_REASON is None
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason=CUDA_SKIP_REASON or "")


def cpu_backends():
    """The reference backend and automatic dispatch (the default path: cpu_flash on CPU). Never skipped."""
    return ["cpu_reference", "auto"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(getattr(longrepr, "reprcrash", None) and longrepr.reprcrash.message or longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_terminal_summary(terminalreporter):
    """Every skipped group with its reason and count, also under -q (CI logs name each skipped group)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    groups = Counter(_skip_reason(r) for r in skipped)
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason")
    for reason, count in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{count:5d}  {reason}")
