"""examples/train_tiny_transformer.py as a test: a few training steps with flashattn and with torch SDPA from the
same initialisation must give the same loss curve."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import cpu_backends

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_transformer.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_tiny_transformer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("backend", cpu_backends())
def test_tiny_transformer_loss_curves_match(backend, capsys):
    example = load_example()
    threads = torch.get_num_threads()
    try:
        status = example.main(["--steps", "12", "--backend", backend, "--threads", "1", "--tolerance", "1e-4"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "largest relative difference" in printed


def test_curves_differ_when_attention_differs():
    """The comparison can fail: perturbing one model by 1% moves its curve off SDPA's by far more than 1e-4."""
    example = load_example()
    torch.manual_seed(0)
    model = example.TinyTransformer(impl="flashattn", backend="cpu_reference")
    other = copy.deepcopy(model)
    other.set_attention("sdpa")
    for blk in model.blocks:
        blk.attn.out.weight.data.mul_(1.01)
    a = example.train(model, 3, 4, 16, 5, 0)
    b = example.train(other, 3, 4, 16, 5, 0)
    assert max(abs(x - y) / y for x, y in zip(a, b)) > 1e-4
