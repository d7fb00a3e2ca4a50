"""flashattn.scaled_dot_product_attention against torch's own SDPA (math, float64): PyTorch's top-left causal
mask for every s_q / s_k relation, scale, GQA, ranks, and the [b, h, s, d] layout passed through without copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashattn
from conftest import cpu_backends
from fa_reference import f32


def torch_sdpa(q, k, v, **kwargs):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def compare(shape_q, shape_k, shape_v, backend, dtype=torch.float32, **kwargs):
    q = torch.randn(shape_q, dtype=dtype, requires_grad=True)
    k = torch.randn(shape_k, dtype=dtype, requires_grad=True)
    v = torch.randn(shape_v, dtype=dtype, requires_grad=True)
    out = flashattn.scaled_dot_product_attention(q, k, v, backend=backend, **kwargs)
    dout = torch.randn_like(out)
    out.backward(dout)

    ref_kwargs = dict(kwargs)
    ref_kwargs["scale"] = f32(kwargs.get("scale") or shape_q[-1] ** -0.5)  # the library's float32 scale
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch_sdpa(*leaves, **ref_kwargs)
    ref.backward(dout.double())
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.double(), ref, **tol)
    for name, ours, r in zip("qkv", (q.grad, k.grad, v.grad), leaves):
        torch.testing.assert_close(ours.double(), r.grad, **tol, msg=lambda m, n=name: f"d{n}: {m}")
    return out


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("seq_q,seq_k", [(9, 9), (5, 12), (12, 5), (1, 7), (7, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_torch_sdpa(seq_q, seq_k, is_causal, backend):
    compare((2, 3, seq_q, 16), (2, 3, seq_k, 16), (2, 3, seq_k, 8), backend, is_causal=is_causal)


@pytest.mark.parametrize("backend", cpu_backends())
def test_gqa_and_scale(backend):
    compare((1, 6, 7, 16), (1, 2, 10, 16), (1, 2, 10, 16), backend, is_causal=True, enable_gqa=True, scale=0.3)


def test_float64_exact():
    compare((1, 2, 6, 8), (1, 2, 9, 8), (1, 2, 9, 8), "cpu_reference", dtype=torch.float64, is_causal=True)


@pytest.mark.parametrize("backend", cpu_backends())
def test_rank3_and_rank5(backend):
    compare((3, 7, 16), (3, 9, 16), (3, 9, 16), backend, is_causal=True)
    compare((2, 2, 3, 7, 16), (2, 2, 3, 7, 16), (2, 2, 3, 7, 16), backend)


def test_layout_is_a_view():
    """Output is the [b, h, s, d] view of a [b, s, h, d] result, as torch's flash kernel returns it."""
    q = torch.randn(2, 4, 8, 16)
    out = flashattn.scaled_dot_product_attention(q, q, q, backend="cpu_reference")
    assert out.shape == (2, 4, 8, 16)
    assert out.transpose(1, 2).is_contiguous()


def test_heads_must_match_without_enable_gqa():
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        flashattn.scaled_dot_product_attention(q, k, k)


def test_unsupported_arguments_raise():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        flashattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.scaled_dot_product_attention(q, q, q, dropout_p=1.0)


@pytest.mark.parametrize("backend", cpu_backends())
def test_empty_rank5(backend):
    """Rank-5 inputs with no keys or no queries: the leading dimensions are flattened without reshape(-1, ...),
    which is ambiguous for an empty tensor."""
    compare((2, 2, 3, 6, 8), (2, 2, 3, 0, 8), (2, 2, 3, 0, 8), backend, is_causal=True)
    compare((2, 2, 3, 0, 8), (2, 2, 3, 4, 8), (2, 2, 3, 4, 8), backend)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("seq_q,seq_k,is_causal", [(9, 9, True), (5, 12, True), (12, 5, True), (6, 6, False)])
def test_float8_inputs_match_torch_sdpa_of_their_values(seq_q, seq_k, is_causal, backend):
    """float8_e4m3fn query / key / value: bfloat16 out, PyTorch's (top-left) causal mask, GQA; against torch's
    float64 SDPA of the same values."""
    q, k, v = (torch.randn(s).mul(2).to(torch.float8_e4m3fn) for s in ((2, 4, seq_q, 16), (2, 2, seq_k, 16),
                                                                        (2, 2, seq_k, 8)))
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True, backend=backend)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, seq_q, 8)
    ref = torch_sdpa(q.double(), k.double(), v.double(), is_causal=is_causal, enable_gqa=True,
                     scale=f32(16 ** -0.5))
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=2.0 ** -8)


def test_float8_errors():
    q = torch.randn(1, 2, 3, 16).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^key: float8_e4m3fn query needs"):
        flashattn.scaled_dot_product_attention(q, torch.randn(1, 2, 3, 16), q)
    with pytest.raises(NotImplementedError, match=r"^dropout_p: the FP8 forward"):
        flashattn.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
