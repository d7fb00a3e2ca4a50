"""Chunked attention (FA3's attention_chunk, Llama 4's local layers) through flashattn.fa3 and the library's own
entry points: forward and gradients against the float64 reference of fa_reference (a query row sees only the keys
of the chunk of `attention_chunk` keys that holds its bottom-right aligned diagonal, within causal and the window),
varlen and seqused, the KV cache (chunks counted from cache_leftpad, q rotated per row, pages, new rows), the
identity that makes a causal chunked call over s_q = s_k the same as a varlen call over the chunks, FA3's own
random chunk draw, and the argument errors. The `cuda` tests run the dense, varlen, FP8 and KV-cache checks on the
GPU (the Hopper forward's extras kernels, cuda_sm80's backward, the decode kernel).
"""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import cpu_backends, requires_cuda
from fa_reference import assert_close, attention_ref, dequantised_fp8, varlen_ref
from flashattn import fa3
from test_kvcache import KVCase, check_call, index_tensor, make_inputs, to_device

I32 = torch.int32

DENSE_CASES = [
    # (batch, s_q, s_k, heads_q, heads_kv, d, causal, window, chunk, dtype)
    (2, 37, 37, 4, 2, 16, True, (-1, -1), 8, torch.float32),      # Llama 4's case: causal, chunks inside the rows
    (1, 29, 45, 2, 1, 32, True, (-1, -1), 7, torch.bfloat16),     # s_q < s_k: the diagonal starts mid-chunk
    (2, 45, 29, 2, 2, 16, False, (-1, -1), 10, torch.float32),    # s_q > s_k: rows above the first key see nothing
    (1, 33, 50, 4, 4, 16, False, (5, 3), 12, torch.float16),      # a window inside the chunk
    (1, 20, 20, 2, 1, 8, True, (-1, -1), 1, torch.float32),       # chunks of one key: each row sees its own key
    (2, 16, 24, 2, 2, 16, True, (-1, -1), 1000, torch.float32),   # one chunk past every key: plain causal
    (1, 30, 30, 2, 2, 16, False, (-1, 0), 6, torch.float32),      # causal as a window edge
]


def _dense_inputs(b, s_q, s_k, hq, hkv, d, dtype, seed=11):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return make(b, s_q, hq, d), make(b, s_k, hkv, d), make(b, s_k, hkv, d), make(b, s_q, hq, d)


def _check_against_reference(out, lse, grads, q, k, v, dout, dtype, **mask):
    refs = {}
    for ref_dtype in (torch.float64, None):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = attention_ref(*leaves, dtype=ref_dtype, **mask)
        r_out.backward(dout.to(r_out.dtype))
        refs[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in leaves)
    for name, ours, r64, low in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + tuple(grads), refs[torch.float64],
                                    refs[None]):
        assert_close(name, ours, r64, low, dtype)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: f"q{c[1]}k{c[2]}-c{c[6]:d}-w{c[7][0]}_{c[7][1]}-"
                                                            f"chunk{c[8]}-{str(c[9])[6:]}")
def test_dense_forward_and_gradients(case, backend):
    b, s_q, s_k, hq, hkv, d, causal, window, chunk, dtype = case
    q, k, v, dout = _dense_inputs(b, s_q, s_k, hq, hkv, d, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fa3.flash_attn_func(*leaves, causal=causal, window_size=window, attention_chunk=chunk,
                                   return_attn_probs=True, backend=backend)
    out.backward(dout)
    _check_against_reference(out, lse, [t.grad for t in leaves], q, k, v, dout, dtype, causal=causal, window=window,
                             chunk=chunk)
    # The chunk does change the result where it cuts a row's keys (else the cases would not test it).
    if chunk < s_k:
        plain = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, backend=backend)
        assert not torch.equal(plain, out.detach())


def test_library_entry_points_take_it():
    q, k, v, _ = _dense_inputs(1, 21, 21, 2, 2, 16, torch.float32)
    out, lse = flashattn.attention(q, k, v, causal=True, attention_chunk=5)
    r_out, r_lse = attention_ref(q, k, v, causal=True, chunk=5)
    assert_close("out", out, r_out, attention_ref(q, k, v, causal=True, chunk=5, dtype=None)[0], torch.float32)
    choice = flashattn.choose_backend(q, k, v, causal=True, attention_chunk=5)
    assert choice.supported and choice.backend.startswith("cpu_")


def test_chunked_causal_is_varlen_over_the_chunks():
    """With s_q = s_k and a causal mask, a chunk of c keys makes attention block-diagonal: the same as a varlen
    call whose sequences are the chunks (the last one shorter). An identity that needs no mask reference."""
    s, c = 50, 16
    q, k, v, _ = _dense_inputs(2, s, s, 4, 2, 16, torch.float32, seed=5)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, attention_chunk=c, return_attn_probs=True)
    bounds = [0]
    for _ in range(q.shape[0]):
        start = bounds[-1]
        bounds += [start + min(end, s) for end in range(c, s + c, c)]
    cu = torch.tensor(bounds, dtype=I32)
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    v_out, v_lse = fa3.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, c, c, causal=True,
                                              return_attn_probs=True)
    assert torch.equal(flat(out), v_out)
    assert torch.equal(lse.transpose(0, 1).reshape(lse.shape[1], -1), v_lse)


@pytest.mark.parametrize("backend", cpu_backends())
def test_varlen_and_seqused(backend):
    g = torch.Generator().manual_seed(3)
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 40, 17]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=I32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=I32)
    q = torch.randn(sum(lens_q), 4, 16, generator=g)
    k, v = (torch.randn(sum(lens_k), 2, 16, generator=g) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fa3.flash_attn_varlen_func(*leaves, cu_q, cu_k, None, None, causal=True, attention_chunk=6,
                                          return_attn_probs=True, backend=backend)
    out.backward(dout)
    refs = {}
    for ref_dtype in (torch.float64, None):
        rl = [t.clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = varlen_ref(*rl, cu_q.tolist(), cu_k.tolist(), causal=True, chunk=6, dtype=ref_dtype)
        r_out.backward(dout)
        refs[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in rl)
    for name, ours, r64, low in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + tuple(t.grad for t in leaves),
                                    refs[torch.float64], refs[None]):
        assert_close(name, ours, r64, low, torch.float32)
    # seqused_k: the chunks count over the used keys of each segment, as if the segments were that long
    used_k = torch.tensor([7, 4, 30, 17], dtype=I32)
    out_u = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, None, None, seqused_k=used_k, causal=True,
                                       attention_chunk=6, backend=backend)
    starts = cu_k[:-1].tolist()
    k_used = torch.cat([k[s:s + n] for s, n in zip(starts, used_k.tolist())])
    v_used = torch.cat([v[s:s + n] for s, n in zip(starts, used_k.tolist())])
    cu_used = [0] + used_k.cumsum(0).tolist()
    r_out, _ = varlen_ref(q, k_used, v_used, cu_q.tolist(), cu_used, causal=True, chunk=6)
    low, _ = varlen_ref(q, k_used, v_used, cu_q.tolist(), cu_used, causal=True, chunk=6, dtype=None)
    assert_close("out (seqused_k)", out_u, r_out, low, torch.float32)


KV_CASES = [
    KVCase(2, 6, 3, (20, 31), page=16, rotary=0.5, batch_idx=True, leftpad=(3, 0), heads=(4, 2), d=32,
           causal=True, dtype=torch.float32),
    KVCase(2, 1, 1, (40, 9), rotary=1.0, interleaved=False, heads=(4, 1), d=32, dtype=torch.float32),
    KVCase(3, 4, 0, (17, 0, 33), page=1, heads=(2, 2), d=16, window=(5, 0), num_splits=3, dtype=torch.bfloat16),
]


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", KV_CASES, ids=str)
def test_with_kvcache(case, backend, chunk):
    inp = make_inputs(case)
    k_arg, v_arg = (t.clone() for t in inp.caches())
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        inp.q, k_arg, v_arg, inp.k_new, inp.v_new, None, inp.cos, inp.sin, index_tensor(inp.lengths, "cpu"),
        index_tensor(inp.batch_idx, "cpu"), index_tensor(inp.leftpad, "cpu"), to_device(inp.block_table, "cpu"),
        causal=case.causal, window_size=case.window, attention_chunk=chunk, rotary_interleaved=case.interleaved,
        num_splits=case.num_splits, return_softmax_lse=True, backend=backend)
    check_call(inp, case, k_arg, v_arg, out, lse, chunk=chunk)


def test_fa3_test_suite_draw():
    """FA3's tests draw attention_chunk from [1, 2 s_k) per case and run it with causal, local and neither."""
    torch.manual_seed(0)
    for s_q, s_k in ((1, 1), (113, 203), (799, 3), (239, 1), (128, 217)):
        chunk = int(torch.randint(1, s_k * 2, (1,)).item())
        q, k, v, _ = _dense_inputs(1, s_q, s_k, 2, 1, 16, torch.float32, seed=s_q)
        for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (s_k // 3, s_k // 5))):
            out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, attention_chunk=chunk,
                                           return_attn_probs=True)
            mask = dict(causal=causal, window=window, chunk=chunk)
            r_out, r_lse = attention_ref(q, k, v, **mask)
            low_out, low_lse = attention_ref(q, k, v, dtype=None, **mask)
            assert_close("out", out, r_out, low_out, torch.float32)
            assert_close("lse", lse, r_lse, low_lse, torch.float32)


@pytest.mark.parametrize("value,exc,pattern", [
    (-1, ValueError, r"^attention_chunk: must be >= 0"),
    (2.5, TypeError, r"^attention_chunk: expected an integer"),
    ("8", TypeError, r"^attention_chunk: expected an integer"),
])
def test_bad_values_name_the_argument(value, exc, pattern):
    q, k, v, _ = _dense_inputs(1, 4, 4, 2, 2, 8, torch.float32)
    with pytest.raises(exc, match=pattern):
        fa3.flash_attn_func(q, k, v, attention_chunk=value)
    with pytest.raises(exc, match=pattern):
        flashattn.attention(q, k, v, attention_chunk=value)
    cache = torch.zeros(1, 8, 2, 8)
    with pytest.raises(exc, match=pattern):
        fa3.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=2, attention_chunk=value)


def test_a_chunk_past_int64_is_every_key():
    q, k, v, _ = _dense_inputs(1, 9, 13, 2, 2, 8, torch.float32)
    wide = fa3.flash_attn_func(q, k, v, causal=True, attention_chunk=2 ** 70)
    assert torch.equal(wide, fa3.flash_attn_func(q, k, v, causal=True))


CUDA_DENSE_CASES = [c[:9] + (torch.bfloat16,) for c in DENSE_CASES if c[5] >= 8] + [
    (2, 700, 700, 4, 2, 128, True, (-1, -1), 96, torch.bfloat16),   # several query tiles per chunk
    (1, 300, 500, 2, 2, 64, False, (60, 20), 128, torch.float16),   # a window and a chunk
    (1, 260, 260, 2, 1, 256, True, (-1, -1), 100, torch.bfloat16),  # hd 256
]


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("case", CUDA_DENSE_CASES, ids=lambda c: f"q{c[1]}k{c[2]}d{c[5]}-chunk{c[8]}")
def test_cuda_dense_forward_and_gradients(case):
    b, s_q, s_k, hq, hkv, d, causal, window, chunk, dtype = case
    d = max(d, 16)
    q, k, v, dout = _dense_inputs(b, s_q, s_k, hq, hkv, d, dtype)
    leaves = [t.cuda().requires_grad_() for t in (q, k, v)]
    out, lse = fa3.flash_attn_func(*leaves, causal=causal, window_size=window, attention_chunk=chunk,
                                   return_attn_probs=True)
    out.backward(dout.cuda())
    _check_against_reference(out.cpu(), lse.cpu(), [t.grad.cpu() for t in leaves], q, k, v, dout, dtype,
                             causal=causal, window=window, chunk=chunk)


@requires_cuda
@pytest.mark.cuda
def test_cuda_varlen_and_kvcache():
    g = torch.Generator().manual_seed(4)
    lens_q, lens_k = [5, 0, 300, 17], [9, 4, 340, 17]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=I32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=I32)
    q = torch.randn(sum(lens_q), 4, 64, generator=g).bfloat16()
    k, v = (torch.randn(sum(lens_k), 2, 64, generator=g).bfloat16() for _ in range(2))
    out = fa3.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_k.cuda(), None, None,
                                     causal=True, attention_chunk=33)
    r_out, _ = varlen_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), causal=True, chunk=33)
    low, _ = varlen_ref(q, k, v, cu_q.tolist(), cu_k.tolist(), causal=True, chunk=33, dtype=None)
    assert_close("out", out.cpu(), r_out, low, torch.bfloat16)
    for case in KV_CASES:
        case = KVCase(**{**case.__dict__, "dtype": torch.bfloat16})
        inp = make_inputs(case)
        k_arg, v_arg = (t.clone().cuda() for t in inp.caches())
        out, lse, *_ = fa3.flash_attn_with_kvcache(
            inp.q.cuda(), k_arg, v_arg, to_device(inp.k_new, "cuda"), to_device(inp.v_new, "cuda"), None,
            to_device(inp.cos, "cuda"), to_device(inp.sin, "cuda"), index_tensor(inp.lengths, "cuda"),
            index_tensor(inp.batch_idx, "cuda"), index_tensor(inp.leftpad, "cuda"), to_device(inp.block_table, "cuda"),
            causal=case.causal, window_size=case.window, attention_chunk=7, rotary_interleaved=case.interleaved,
            num_splits=case.num_splits, return_softmax_lse=True)
        check_call(inp, case, k_arg, v_arg, out, lse, chunk=7)


@requires_cuda
@pytest.mark.cuda
def test_cuda_fp8_forward():
    """FA3's FP8 forward with a chunk (its test suite draws one for every FP8 case too); Hopper only."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs compute capability 9.0")
    g = torch.Generator().manual_seed(9)
    b, s, hq, hkv, d = 2, 400, 4, 2, 128
    q8, k8, v8 = (torch.randn(b, s, h, d, generator=g).to(torch.float8_e4m3fn) for h in (hq, hkv, hkv))
    descales = [torch.rand(b, hkv, generator=g) + 0.5 for _ in range(3)]
    out = fa3.flash_attn_func(q8.cuda(), k8.cuda(), v8.cuda(), causal=True, attention_chunk=64,
                              q_descale=descales[0].cuda(), k_descale=descales[1].cuda(),
                              v_descale=descales[2].cuda())
    qd, kd, vd = (dequantised_fp8(t, ds, hq // hkv if i == 0 else 1) for i, (t, ds) in
                  enumerate(zip((q8, k8, v8), descales)))
    ref, _ = attention_ref(qd, kd, vd, causal=True, chunk=64)
    err = (out.double().cpu() - ref).norm() / ref.norm()
    assert err < 2.5e-2, f"relative RMSE {err:.3g}"
