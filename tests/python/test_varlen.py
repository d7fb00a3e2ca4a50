"""Varlen (packed sequences with cu_seqlens) through the flash_attn varlen API, against the per-sequence
float64 reference."""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import cpu_backends
from fa_reference import assert_close, varlen_ref


def cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


VARLEN_CASES = [
    # (lengths_q, lengths_k, heads_q, heads_kv, dim, dim_v, causal, window, softcap)
    ([5, 1, 9], [5, 1, 9], 2, 2, 16, 16, True, (-1, -1), 0.0),
    ([3, 8, 0, 4], [7, 2, 5, 4], 4, 2, 8, 12, True, (-1, -1), 0.0),   # an empty query sequence, s_q > s_k rows
    ([6, 6], [10, 3], 4, 1, 32, 32, False, (2, 1), 0.0),
    ([4, 7], [9, 7], 2, 2, 16, 16, False, (-1, -1), 3.0),
    ([1, 1, 1], [4, 0, 2], 2, 2, 8, 8, False, (-1, -1), 0.0),          # an empty key sequence: zero output
]


def run_case(lengths_q, lengths_k, heads_q, heads_kv, dim, dim_v, causal, window, softcap, dtype, backend,
             device="cpu", **extra):
    """flash_attn_varlen_func forward and backward against the per-sequence reference; `extra` goes to the call
    (softmax_scale also to the reference)."""
    cu_q, cu_k = cu(lengths_q).to(device), cu(lengths_k).to(device)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(total_q, heads_q, dim, dtype=dtype, device=device)
    k = torch.randn(total_k, heads_kv, dim, dtype=dtype, device=device)
    v = torch.randn(total_k, heads_kv, dim_v, dtype=dtype, device=device)
    dout = torch.randn(total_q, heads_q, dim_v, dtype=dtype, device=device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                   causal=causal, window_size=window, softcap=softcap,
                                                   return_attn_probs=True, backend=backend, **extra)
    assert lse.shape == (heads_q, total_q)
    out.backward(dout)
    refs = {}
    for ref_dtype in (torch.float64, None):
        rl = [t.clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = varlen_ref(*rl, cu_q.tolist(), cu_k.tolist(), causal=causal, window=window, softcap=softcap,
                                  scale=extra.get("softmax_scale"), dtype=ref_dtype)
        r_out.backward(dout.to(r_out.dtype))
        refs[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in rl)
    ours = (out, lse) + tuple(t.grad for t in leaves)
    for name, o, r64, low in zip(("out", "lse", "dq", "dk", "dv"), ours, refs[torch.float64], refs[None]):
        assert_close(name, o, r64, low, dtype)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"q{c[0]}_k{c[1]}")
def test_varlen(case, dtype, backend):
    run_case(*case, dtype=dtype, backend=backend)


@pytest.mark.parametrize("backend", cpu_backends())
def test_varlen_packed_variants(backend):
    lengths = [4, 9, 2]
    cu_seqlens = cu(lengths)
    total, h, d = int(cu_seqlens[-1]), 2, 16
    qkv = torch.randn(total, 3, h, d, requires_grad=True)
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max(lengths), causal=True, backend=backend)
    q, k, v = qkv.unbind(1)
    ref = flashattn.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True,
                                           backend=backend)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape

    kv = torch.randn(total, 2, 1, d, requires_grad=True)
    q2 = torch.randn(total, h, d)
    out = flashattn.flash_attn_varlen_kvpacked_func(q2, kv, cu_seqlens, cu_seqlens, max(lengths), max(lengths),
                                                    window_size=(1, 1), backend=backend)
    ref = flashattn.flash_attn_varlen_func(q2, *kv.unbind(1), cu_seqlens, cu_seqlens, max(lengths), max(lengths),
                                           window_size=(1, 1), backend=backend)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_varlen_matches_padded_batch():
    """Equal lengths: varlen and the padded batch compute the same thing."""
    b, s, h, d = 3, 6, 2, 8
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    padded = flashattn.flash_attn_func(q, k, v, causal=True, backend="cpu_reference")
    cu_seqlens = cu([s] * b)
    packed = flashattn.flash_attn_varlen_func(*(t.reshape(b * s, h, d) for t in (q, k, v)), cu_seqlens, cu_seqlens,
                                              s, s, causal=True, backend="cpu_reference")
    torch.testing.assert_close(packed.reshape(b, s, h, d), padded, rtol=1e-6, atol=1e-6)
