"""ALiBi through the flash_attn API (alibi_slopes of shape (nheads,) or (batch, nheads)): forward and gradients
against the float64 math reference, on the CPU backends and on CUDA, with masks, softcap, GQA, varlen and a KV cache;
and the errors for bad slopes."""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import cpu_backends, requires_cuda
from fa_reference import assert_close, attention_ref, varlen_ref

# (batch, s_q, s_k, heads_q, heads_kv, dim, causal, window, softcap, per_batch)
CASES = [
    (2, 13, 29, 4, 2, 32, False, (-1, -1), 0.0, False),
    (2, 13, 29, 4, 2, 32, True, (-1, -1), 0.0, True),
    (1, 29, 13, 4, 4, 16, True, (-1, -1), 0.0, False),    # s_q > s_k: the top rows see no key
    (2, 20, 20, 2, 1, 16, False, (5, 2), 0.0, True),      # two-sided window
    (1, 17, 33, 2, 2, 16, True, (-1, -1), 4.0, False),    # softcap, then the bias
    (2, 64, 64, 2, 2, 64, False, (-1, -1), 0.0, True),
]
IDS = [f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}x{c[4]}_d{c[5]}{'_causal' if c[6] else ''}"
       f"{'_win' if c[7] != (-1, -1) else ''}{'_cap' if c[8] else ''}{'_perbatch' if c[9] else ''}" for c in CASES]


def slopes_for(batch, heads, per_batch, device):
    # Spread slopes, one of them 0 (a head without bias beside biased ones).
    s = torch.rand(batch if per_batch else 1, heads) * 0.6 + 0.02
    s[0, min(1, heads - 1)] = 0.0
    return (s if per_batch else s[0]).to(device)


def check_case(case, dtype, backend, device):
    b, sq, sk, hq, hkv, d, causal, window, softcap, per_batch = case
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(b, sk, hkv, d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    slopes = slopes_for(b, hq, per_batch, device)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                            alibi_slopes=slopes, return_attn_probs=True, backend=backend)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    kw = dict(causal=causal, window=window, softcap=softcap, alibi=slopes)
    ref_out, ref_lse = attention_ref(q, k, v, **kw)
    low_out, low_lse = attention_ref(q, k, v, dtype=None, **kw)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout.double())
    low_grads = torch.autograd.grad(low_out, (q, k, v), dout)
    assert_close("out", out, ref_out, low_out, dtype)
    assert_close("lse", lse, ref_lse, low_lse.float(), torch.float32, ulps=64)
    for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
        assert_close(name, g, r, lo, dtype, ulps=16)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_alibi_cpu(case, backend):
    check_case(case, torch.float32, backend, "cpu")


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES + [(2, 300, 300, 2, 1, 128, True, (-1, -1), 0.0, True),
                                          (1, 200, 500, 2, 2, 256, False, (-1, -1), 0.0, False),
                                          (1, 100, 100, 2, 2, 80, True, (-1, -1), 0.0, True)],
                         ids=IDS + ["q300_d128_causal", "q200_k500_d256", "d80_causal"])
def test_alibi_cuda(case, dtype):
    check_case(case, dtype, "auto", "cuda")


def test_alibi_changes_the_result():
    # The bias is not silently dropped: a steep slope makes a row attend to its diagonal key.
    q, k, v = (torch.randn(1, 8, 1, 16) for _ in range(3))
    plain = flashattn.flash_attn_func(q, k, v)
    steep = flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.tensor([50.0]))
    torch.testing.assert_close(steep, v, atol=1e-5, rtol=0)
    assert (plain - steep).abs().max() > 0.1


@pytest.mark.parametrize("backend", cpu_backends())
def test_alibi_varlen(backend):
    lens_q, lens_k = [5, 0, 17, 3], [9, 4, 17, 0]
    cu_q = torch.tensor([0, 5, 5, 22, 25], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 13, 30, 30], dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 16, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 16, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 16, requires_grad=True)
    for slopes in (slopes_for(4, 4, True, "cpu"), slopes_for(4, 4, False, "cpu")):
        for causal in (False, True):
            out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 17, causal=causal, alibi_slopes=slopes,
                                                   backend=backend)
            ref, _ = varlen_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), causal=causal, alibi=slopes)
            low, _ = varlen_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), causal=causal, alibi=slopes, dtype=None)
            assert_close("out", out, ref, low, torch.float32)
            dout = torch.randn_like(out)
            g = torch.autograd.grad(out, (q, k, v), dout)
            r = torch.autograd.grad(ref, (q, k, v), dout.double())
            lo = torch.autograd.grad(low, (q, k, v), dout)
            for name, a, b, c in zip(("dq", "dk", "dv"), g, r, lo):
                assert_close(name, a, b, c, torch.float32, ulps=16)


def kvcache_case(device, dtype, paged):
    b, s_cache, hq, hkv, d = 3, 40, 4, 2, 32
    lengths = torch.tensor([7, 40, 19], dtype=torch.int32, device=device)
    k_cache = torch.randn(b, s_cache, hkv, d, dtype=dtype, device=device)
    v_cache = torch.randn(b, s_cache, hkv, d, dtype=dtype, device=device)
    q = torch.randn(b, 2, hq, d, dtype=dtype, device=device)
    slopes = slopes_for(b, hq, True, device)
    kw = {}
    if paged:  # pages of 8 rows, in reverse order
        page = 8
        pages = s_cache // page
        kc = k_cache.reshape(b * pages, page, hkv, d).flip(0).contiguous()
        vc = v_cache.reshape(b * pages, page, hkv, d).flip(0).contiguous()
        table = (b * pages - 1 - torch.arange(b * pages, device=device)).reshape(b, pages).to(torch.int32)
        kw = dict(block_table=table)
        caches = (kc, vc)
    else:
        caches = (k_cache, v_cache)
    out = flashattn.flash_attn_with_kvcache(q, *caches, cache_seqlens=lengths, causal=True, alibi_slopes=slopes, **kw)
    for i in range(b):
        n = int(lengths[i])
        ref, _ = attention_ref(q[i:i + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], causal=True,
                               alibi=slopes[i:i + 1])
        low, _ = attention_ref(q[i:i + 1], k_cache[i:i + 1, :n], v_cache[i:i + 1, :n], causal=True,
                               alibi=slopes[i:i + 1], dtype=None)
        assert_close(f"out[{i}]", out[i:i + 1], ref, low, dtype)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_alibi_kvcache_cpu(paged):
    kvcache_case("cpu", torch.float32, paged)


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_alibi_kvcache_cuda(paged):
    kvcache_case("cuda", torch.bfloat16, paged)


@pytest.mark.parametrize("slopes,exc,pattern", [
    (torch.ones(3), ValueError, r"^alibi_slopes: expected shape \[2\] or \[1, 2\]"),
    (torch.ones(2, 2), ValueError, r"^alibi_slopes: expected shape"),
    (torch.ones(1, 2, 1), ValueError, r"^alibi_slopes: expected shape"),
    (torch.ones(2, dtype=torch.float16), ValueError, r"^alibi_slopes: expected dtype float32"),
    (torch.tensor([0.5, float("nan")]), ValueError, r"^alibi_slopes: must be finite"),
    (torch.tensor([float("inf"), 0.5]), ValueError, r"^alibi_slopes: must be finite"),
    ([0.5, 0.5], TypeError, r"^alibi_slopes: expected a torch.Tensor"),
    (torch.ones(2, requires_grad=True), NotImplementedError, r"^alibi_slopes: gradients"),
], ids=["wrong_heads", "wrong_batch", "rank3", "fp16", "nan", "inf", "list", "requires_grad"])
def test_alibi_errors(slopes, exc, pattern):
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(exc, match=pattern):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=slopes)


@requires_cuda
@pytest.mark.cuda
def test_alibi_errors_cuda():
    q = torch.randn(1, 4, 2, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^alibi_slopes: must be finite"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=torch.tensor([0.5, float("nan")], device="cuda"))
    with pytest.raises(ValueError, match=r"^alibi_slopes: on cpu but q is on cuda"):
        flashattn.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
