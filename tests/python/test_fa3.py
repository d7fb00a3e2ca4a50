"""flashattn.fa3, FlashAttention-3's interface (hopper/flash_attn_interface.py at Dao-AILab/flash-attention
0251105a2fb1), against the float64 references of fa_reference / test_kvcache and against flashattn's flash_attn 2
API: signatures (names, positional order, defaults) as FA3's, values and gradients, seqused_q / seqused_k, the paged
path, the KV cache, flash_attn_combine against a float64 merge, and every unsupported FA3 argument raising
NotImplementedError that names it. The `cuda` tests run the same checks on the GPU (skipped, and counted in the skip
summary, without one).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import replace
from typing import List, Optional, Sequence

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import flashattn
from conftest import cpu_backends, requires_cuda
from fa_reference import assert_close, attention_ref, dequantised_fp8
from flashattn import fa3
from test_kvcache import (GRID, SPECIAL, KVCase, PagedVarlenCase, check_call, check_caches, check_outputs,
                          expected_caches, index_tensor, make_inputs, paged_varlen_inputs, reference, rotary_ref,
                          to_device)

I32 = torch.int32
NEG_INF = float("-inf")

# ---- signatures: FA3's, as read at that commit ----------------------------------------------------------------------

_E = inspect.Parameter.empty
FA3_SIGNATURES = {
    "flash_attn_func": [
        ("q", _E), ("k", _E), ("v", _E), ("softmax_scale", None), ("causal", False), ("qv", None),
        ("q_descale", None), ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None), ("deterministic", False),
        ("sm_margin", 0), ("return_attn_probs", False)],
    "flash_attn_qkvpacked_func": [
        ("qkv", _E), ("softmax_scale", None), ("causal", False), ("q_descale", None), ("k_descale", None),
        ("v_descale", None), ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
        ("deterministic", False), ("num_heads_q", None), ("sm_margin", 0), ("return_attn_probs", False)],
    "flash_attn_varlen_func": [
        ("q", _E), ("k", _E), ("v", _E), ("cu_seqlens_q", _E), ("cu_seqlens_k", _E), ("max_seqlen_q", _E),
        ("max_seqlen_k", _E), ("seqused_q", None), ("seqused_k", None), ("softmax_scale", None), ("causal", False),
        ("qv", None), ("q_descale", None), ("k_descale", None), ("v_descale", None), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1), ("pack_gqa", None), ("deterministic", False),
        ("sm_margin", 0), ("return_attn_probs", False)],
    "flash_attn_combine": [("out_partial", _E), ("lse_partial", _E), ("out", None), ("out_dtype", None)],
    "flash_attn_with_kvcache": [
        ("q", _E), ("k_cache", _E), ("v_cache", _E), ("k", None), ("v", None), ("qv", None), ("rotary_cos", None),
        ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None),
        ("page_table", None), ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None),
        ("rotary_seqlens", None), ("q_descale", None), ("k_descale", None), ("v_descale", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", 0),
        ("softcap", 0.0), ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0),
        ("pack_gqa", None), ("sm_margin", 0), ("return_softmax_lse", False)],
    "get_scheduler_metadata": [
        ("batch_size", _E), ("max_seqlen_q", _E), ("max_seqlen_k", _E), ("num_heads_q", _E), ("num_heads_kv", _E),
        ("headdim", _E), ("cache_seqlens", _E), ("qkv_dtype", torch.bfloat16), ("headdim_v", None),
        ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("cache_leftpad", None), ("page_size", None),
        ("max_seqlen_k_new", 0), ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", 0),
        ("has_softcap", False), ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0)],
}
# flashattn's keyword-only extensions (after FA3's arguments, so no FA3 call can reach them by position)
EXTRAS = {"flash_attn_func": ["backend", "num_threads"], "flash_attn_qkvpacked_func": ["backend", "num_threads"],
          "flash_attn_varlen_func": ["page_table", "backend", "num_threads"], "flash_attn_combine": [],
          "flash_attn_with_kvcache": ["backend", "num_threads", "check_index_values"], "get_scheduler_metadata": []}


@pytest.mark.parametrize("name", sorted(FA3_SIGNATURES))
def test_signature_matches_fa3(name):
    params = list(inspect.signature(getattr(fa3, name)).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == FA3_SIGNATURES[name]
    assert [p.name for p in params if p.kind == p.KEYWORD_ONLY] == EXTRAS[name]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)  # no *args / **kwargs
    assert name in fa3.__all__


# ---- flash_attn_func, flash_attn_qkvpacked_func --------------------------------------------------------------------

DENSE_CASES = [
    # (batch, s_q, s_k, heads_q, heads_kv, d, d_v, causal, window, softcap, dtype)
    (2, 5, 9, 4, 2, 16, 16, True, (-1, -1), 0.0, torch.float32),
    (1, 7, 7, 2, 2, 32, 16, False, (2, 1), 0.0, torch.bfloat16),
    (2, 6, 3, 4, 1, 8, 8, True, (-1, -1), 4.0, torch.float32),      # s_q > s_k: rows without keys, MQA
    (1, 4, 11, 3, 3, 16, 16, False, (-1, 0), 0.0, torch.float16),
]


def dense_inputs(b, s_q, s_k, hq, hkv, d, dv, dtype, device="cpu"):
    g = torch.Generator().manual_seed(7)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(device)  # noqa: E731
    return make(b, s_q, hq, d), make(b, s_k, hkv, d), make(b, s_k, hkv, dv), make(b, s_q, hq, dv)


def run_dense(case, backend, device="cpu"):
    b, s_q, s_k, hq, hkv, d, dv, causal, window, softcap, dtype = case
    q, k, v, dout = dense_inputs(b, s_q, s_k, hq, hkv, d, dv, dtype, device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    res = fa3.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap, return_attn_probs=True,
                              backend=backend)
    assert isinstance(res, tuple) and len(res) == 2  # FA3: (out, softmax_lse), no third entry
    out, lse = res
    assert out.shape == (b, s_q, hq, dv) and lse.shape == (b, hq, s_q) and lse.dtype == torch.float32
    out.backward(dout)
    refs = {}
    for ref_dtype in (torch.float64, None):
        rl = [t.cpu().clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = attention_ref(*rl, causal=causal, window=window, softcap=softcap, dtype=ref_dtype)
        r_out.backward(dout.cpu().to(r_out.dtype))
        refs[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in rl)
    ours = (out, lse) + tuple(t.grad for t in leaves)
    for name, o, r64, low in zip(("out", "lse", "dq", "dk", "dv"), ours, refs[torch.float64], refs[None]):
        assert_close(name, o.cpu(), r64, low, dtype)
    # the same operator as flashattn's flash_attn 2 API: the same bits
    fa2 = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, backend=backend)
    assert torch.equal(fa2, out.detach())
    plain = fa3.flash_attn_func(q, k, v, None, causal, window_size=window, softcap=softcap, backend=backend)
    assert isinstance(plain, Tensor) and torch.equal(plain, fa2)  # FA3's positional order: softmax_scale, causal


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: f"b{c[0]}q{c[1]}k{c[2]}h{c[3]}-{c[4]}")
def test_flash_attn_func(case, backend):
    run_dense(case, backend)


class OpSpy(TorchDispatchMode):
    """Records flashattn's operator calls (name, int options of the backward) under it."""

    def __init__(self):
        super().__init__()
        self.backward_options: List[List[int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "attention_backward" in str(func):
            self.backward_options.append(list(args[10]))  # int_options
        return func(*args, **(kwargs or {}))


def test_hints_do_not_change_results_and_deterministic_reaches_backward():
    q, k, v, dout = dense_inputs(2, 6, 9, 4, 2, 16, 16, torch.float32)
    results = []
    for num_splits, pack_gqa, sm_margin, deterministic in ((1, None, 0, False), (0, True, 8, True),
                                                           (4, False, 0, False), (-1, None, 132, True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with OpSpy() as spy:
            out, lse = fa3.flash_attn_func(*leaves, causal=True, num_splits=num_splits, pack_gqa=pack_gqa,
                                           sm_margin=sm_margin, deterministic=deterministic, return_attn_probs=True)
            out.backward(dout)
        (options,) = spy.backward_options
        assert options[5] == int(deterministic)  # op_options' "deterministic" slot
        results.append([out, lse] + [t.grad for t in leaves])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("backend", cpu_backends())
def test_qkvpacked(backend):
    b, s, d = 2, 7, 16
    qkv = torch.randn(b, s, 3, 4, d, requires_grad=True)
    out = fa3.flash_attn_qkvpacked_func(qkv, None, True, backend=backend)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref = fa3.flash_attn_func(q, k, v, causal=True, backend=backend)
    assert torch.equal(out, ref)
    out.sum().backward()
    ref.sum().backward()
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 2))
    # (batch, seqlen, heads_q + 2 * heads_k, d) with num_heads_q: GQA
    packed = torch.randn(b, s, 6 + 2 * 2, d, requires_grad=True)
    out, lse = fa3.flash_attn_qkvpacked_func(packed, window_size=(2, 0), num_heads_q=6, return_attn_probs=True,
                                             backend=backend)
    q, k, v = (t.detach().clone().requires_grad_() for t in packed.split([6, 2, 2], dim=2))
    ref, ref_lse = fa3.flash_attn_func(q, k, v, window_size=(2, 0), return_attn_probs=True, backend=backend)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    out.sum().backward()
    ref.sum().backward()
    assert torch.equal(packed.grad, torch.cat([q.grad, k.grad, v.grad], 2))


# ---- flash_attn_varlen_func ----------------------------------------------------------------------------------------


def cu(lengths: Sequence[int], device="cpu") -> Tensor:
    return torch.tensor([0] + torch.tensor(list(lengths), dtype=torch.int64).cumsum(0).tolist(), dtype=I32,
                        device=device)


def used_ref(q, k, v, cu_q, cu_k, used_q, used_k, qv=None, **kw):
    """out [total_q, h, d_v] and lse [h, total_q] of each sequence's used rows through attention_ref (qv packed
    like q); the other query rows give 0 / -inf (differentiable: built by concatenation)."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        uq, uk = used_q[b], used_k[b]
        qv_b = None if qv is None else qv[cu_q[b]:cu_q[b] + uq][None]
        o, l = attention_ref(q[cu_q[b]:cu_q[b] + uq][None], k[cu_k[b]:cu_k[b] + uk][None],
                             v[cu_k[b]:cu_k[b] + uk][None], qv=qv_b, **kw)
        pad = cu_q[b + 1] - cu_q[b] - uq
        outs += [o[0], o.new_zeros(pad, *o.shape[2:])]
        lses += [l[0], l.new_full((l.shape[1], pad), NEG_INF)]
    return torch.cat(outs, 0), torch.cat(lses, 1)


VARLEN_CASES = [
    # (segments q, used q (None: not given), segments k, used k, heads, d, d_v, causal, window, softcap, dtype)
    ((5, 1, 9), None, (5, 1, 9), None, (2, 2), 16, 16, True, (-1, -1), 0.0, torch.float32),
    ((3, 8, 0, 4), None, (7, 2, 5, 4), None, (4, 2), 8, 12, True, (-1, -1), 0.0, torch.bfloat16),
    ((3, 2, 5), None, (10, 4, 7), (6, 0, 7), (4, 1), 16, 16, True, (-1, -1), 0.0, torch.float32),
    ((4, 6), (2, 6), (5, 8), None, (2, 2), 16, 16, False, (-1, -1), 0.0, torch.float32),
    ((5, 3, 4), (5, 0, 2), (9, 6, 3), (4, 6, 0), (4, 2), 16, 8, False, (2, 0), 3.0, torch.bfloat16),
    ((6, 6), (6, 3), (6, 6), (2, 6), (2, 2), 8, 8, True, (-1, -1), 0.0, torch.float16),   # s_q > s_k used
]


def run_varlen(case, backend, device="cpu", max_seqlens_none=False):
    seg_q, used_q, seg_k, used_k, (hq, hkv), d, dv, causal, window, softcap, dtype = case
    cu_q, cu_k = cu(seg_q, device), cu(seg_k, device)
    g = torch.Generator().manual_seed(11)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    q, k, v = make(sum(seg_q), hq, d), make(sum(seg_k), hkv, d), make(sum(seg_k), hkv, dv)
    dout = make(sum(seg_q), hq, dv)
    leaves = [t.clone().to(device).requires_grad_() for t in (q, k, v)]
    lengths = lambda used, seg: list(seg if used is None else used)  # noqa: E731
    maxes = (None, None) if max_seqlens_none else (max(seg_q), max(seg_k))
    out, lse = fa3.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, *maxes, index_tensor(used_q, device), index_tensor(used_k, device), causal=causal,
        window_size=window, softcap=softcap, return_attn_probs=True, backend=backend)
    assert out.shape == (sum(seg_q), hq, dv) and lse.shape == (hq, sum(seg_q))
    out.backward(dout.to(device))
    refs = {}
    for ref_dtype in (torch.float64, None):
        rl = [t.clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = used_ref(*rl, cu_q.tolist(), cu_k.tolist(), lengths(used_q, seg_q), lengths(used_k, seg_k),
                                causal=causal, window=window, softcap=softcap, dtype=ref_dtype)
        r_out.backward(dout.to(r_out.dtype))
        refs[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in rl)
    ours = (out, lse) + tuple(t.grad for t in leaves)
    for name, o, r64, low in zip(("out", "lse", "dq", "dk", "dv"), ours, refs[torch.float64], refs[None]):
        assert_close(name, o.cpu(), r64, low, dtype)
    # rows outside seqused: exactly 0 (out, dq, dk, dv) and -inf (lse)
    for used, seg, tensors in ((used_q, seg_q, (out, leaves[0].grad)), (used_k, seg_k, (leaves[1].grad,
                                                                                        leaves[2].grad))):
        starts = [0] + list(torch.tensor(seg).cumsum(0).tolist())
        for b in range(len(seg)):
            lo = starts[b] + lengths(used, seg)[b]
            for t in tensors:
                assert not t[lo:starts[b + 1]].any()
    return out, lse


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"q{c[0]}u{c[1]}_k{c[2]}u{c[3]}")
def test_varlen(case, backend):
    run_varlen(case, backend)


def test_varlen_matches_flash_attn_2_api():
    out, lse = run_varlen(VARLEN_CASES[1], "auto", max_seqlens_none=True)
    seg_q, _, seg_k, _, (hq, hkv), d, dv, causal, *_ = VARLEN_CASES[1]
    g = torch.Generator().manual_seed(11)
    make = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v = make(sum(seg_q), hq, d), make(sum(seg_k), hkv, d), make(sum(seg_k), hkv, dv)
    fa2_out, fa2_lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(seg_q), cu(seg_k), max(seg_q), max(seg_k),
                                                           causal=causal, return_attn_probs=True)
    assert torch.equal(out.detach(), fa2_out) and torch.equal(lse, fa2_lse)


# ---- flash_attn_varlen_func(page_table=...): the keyword-only extension --------------------------------------------

PAGED_CASES = [
    PagedVarlenCase((1, 1, 1), (5, 0, 33), 16, (4, 1), 64, causal=True, dtype=torch.bfloat16),
    PagedVarlenCase((3, 0, 7), (10, 4, 7), 1, (8, 2), 32, causal=True, dtype=torch.float16),
    PagedVarlenCase((4, 5), (9, 20), 16, (4, 4), 64, softcap=4.0, window=(3, 1), dtype=torch.float32),
]


def run_paged(case: PagedVarlenCase, backend: str, lengths_from: str, device="cpu", used_q=None):
    inp = paged_varlen_inputs(case)
    kc, vc = (t.clone().to(device) for t in inp.caches())
    cu_q = torch.tensor(inp.cu_q, dtype=I32, device=device)
    lengths = dict(cu_seqlens_k=None, seqused_k=None)
    if lengths_from == "seqused_k":
        lengths["seqused_k"] = index_tensor(case.lengths_k, device)
    elif lengths_from == "cu_seqlens_k":
        lengths["cu_seqlens_k"] = cu(case.lengths_k, device)
    else:  # neither: FA3 uses every row of the table's pages
        inp = replace(inp, lengths=None)
    with torch.no_grad():
        out, lse = fa3.flash_attn_varlen_func(
            inp.q.to(device), kc, vc, cu_q, lengths["cu_seqlens_k"], max(case.lengths_q), None,
            seqused_q=index_tensor(used_q, device), seqused_k=lengths["seqused_k"], causal=case.causal,
            window_size=case.window, softcap=case.softcap, return_attn_probs=True,
            page_table=inp.block_table.to(device), backend=backend)
    check_caches(inp, kc, vc, inp.k_log, inp.v_log)  # nothing is written
    kw = dict(causal=case.causal, window=case.window, softcap=case.softcap, interleaved=True)
    r64, low = reference(inp, inp.k_log, inp.v_log, **kw), reference(inp, inp.k_log, inp.v_log, dtype=None, **kw)
    if used_q is not None:  # the reference over the used query rows only, the rest 0 / -inf
        rows = torch.cat([torch.arange(lo, lo + n) for lo, n in zip(inp.cu_q, used_q)])
        keep = torch.zeros(inp.q.shape[0], dtype=torch.bool)
        keep[rows] = True
        inp_used = replace(inp, q=inp.q[rows], cu_q=cu(used_q).tolist())
        r64, low = (reference(inp_used, inp.k_log, inp.v_log, dtype=dt, **kw) for dt in (torch.float64, None))
        r64, low = ((o.new_zeros(len(keep), *o.shape[1:]).index_copy(0, rows, o),
                     l.new_full((l.shape[0], len(keep)), NEG_INF).index_copy(1, rows, l)) for o, l in (r64, low))
    check_outputs(out, lse, r64, low, case.dtype)
    return out, lse


@pytest.mark.parametrize("lengths_from", ["seqused_k", "cu_seqlens_k", "capacity"])
@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", PAGED_CASES, ids=str)
def test_varlen_paged(case, backend, lengths_from):
    run_paged(case, backend, lengths_from)


def test_varlen_paged_seqused_q_and_flash_attn_2_api():
    case = PAGED_CASES[2]
    run_paged(case, "auto", "seqused_k", used_q=[2, 5])
    out, lse = run_paged(case, "auto", "seqused_k")
    inp = paged_varlen_inputs(case)
    fa2_out, fa2_lse, _ = flashattn.flash_attn_varlen_func(
        inp.q, inp.k_phys, inp.v_phys, torch.tensor(inp.cu_q, dtype=I32), None, max(case.lengths_q), 0,
        window_size=case.window, softcap=case.softcap, return_attn_probs=True, block_table=inp.block_table,
        seqused_k=index_tensor(case.lengths_k, "cpu"))
    assert torch.equal(out, fa2_out) and torch.equal(lse, fa2_lse)


def test_varlen_paged_is_inference_only():
    inp = paged_varlen_inputs(replace(PAGED_CASES[0], dtype=torch.float32))
    q = inp.q.clone().requires_grad_()
    args = (q, inp.k_phys, inp.v_phys, torch.arange(4, dtype=I32), None, 1, 33)
    kw = dict(seqused_k=torch.tensor([5, 0, 33], dtype=I32), page_table=inp.block_table)
    with pytest.raises(NotImplementedError, match=r"^page_table: the paged path \(page_table\) is inference-only"):
        fa3.flash_attn_varlen_func(*args, **kw)
    with torch.no_grad():
        fa3.flash_attn_varlen_func(*args, **kw)


# ---- flash_attn_with_kvcache ---------------------------------------------------------------------------------------

# A spread of test_kvcache's grid (dense and paged caches, page sizes 1 / 16 / 64, rotary both styles, GQA / MQA,
# masks, softcap, num_splits, cache_batch_idx, cache_leftpad), and its cases with int or absent cache_seqlens.
KV_CASES = GRID[::7] + [c for c in SPECIAL if c.int_seqlens or c.lengths is None or c.leftpad is not None]


def run_kvcache(case: KVCase, backend: str, device: str = "cpu", num_splits: Optional[int] = None):
    inp = make_inputs(case)
    k_arg, v_arg = (t.clone().to(device) for t in inp.caches())
    cache_seqlens = inp.lengths[0] if case.int_seqlens else index_tensor(inp.lengths, device)
    # FA3's positional order up to cache_leftpad, page_table; the rest by name
    res = fa3.flash_attn_with_kvcache(
        inp.q.to(device), k_arg, v_arg, to_device(inp.k_new, device), to_device(inp.v_new, device), None,
        to_device(inp.cos, device), to_device(inp.sin, device), cache_seqlens, index_tensor(inp.batch_idx, device),
        index_tensor(inp.leftpad, device), to_device(inp.block_table, device), causal=case.causal,
        window_size=case.window, softcap=case.softcap, rotary_interleaved=case.interleaved,
        num_splits=case.num_splits if num_splits is None else num_splits, return_softmax_lse=True, backend=backend)
    assert isinstance(res, tuple) and len(res) == 4  # FA3: (out, softmax_lse, out_accum, softmax_lse_accum)
    out, lse, out_accum, lse_accum = res
    for t in (out_accum, lse_accum):
        assert t.shape == (0,) and t.dtype == torch.float32 and t.device == out.device
    assert out.shape == (case.batch, case.s_q, case.heads[0], case.d_v or case.d) and not out.requires_grad
    assert lse.shape == (case.batch, case.heads[0], case.s_q)
    check_call(inp, case, k_arg, v_arg, out, lse)
    return inp, out, k_arg, v_arg


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", KV_CASES, ids=str)
def test_with_kvcache(case, backend):
    run_kvcache(case, backend)


def test_with_kvcache_matches_flash_attn_2_api():
    case = KVCase(2, 2, 2, (5, 30), page=16, rotary=0.5, interleaved=False, batch_idx=True, leftpad=(1, 0),
                  heads=(4, 2), causal=True, dtype=torch.float32)
    inp, out, k_cache, v_cache = run_kvcache(case, "auto")
    kc, vc = (t.clone() for t in inp.caches())
    fa2 = flashattn.flash_attn_with_kvcache(
        inp.q, kc, vc, inp.k_new, inp.v_new, inp.cos, inp.sin, index_tensor(inp.lengths, "cpu"),
        index_tensor(inp.batch_idx, "cpu"), index_tensor(inp.leftpad, "cpu"), inp.block_table, causal=True,
        rotary_interleaved=False)
    assert torch.equal(out, fa2) and torch.equal(kc, k_cache) and torch.equal(vc, v_cache)
    plain = fa3.flash_attn_with_kvcache(inp.q, *(t.clone() for t in inp.caches()), cache_seqlens=index_tensor(
        inp.lengths, "cpu"), page_table=inp.block_table, cache_batch_idx=index_tensor(inp.batch_idx, "cpu"))
    assert isinstance(plain, Tensor)  # without return_softmax_lse: out alone


def test_with_kvcache_hints_do_not_change_results():
    case = KVCase(2, 1, 1, (17, 40), page=16, heads=(8, 2), causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    outs = []
    for num_splits, pack_gqa, sm_margin in ((0, None, 0), (-3, True, 16), (0, False, 0)):
        kc, vc = (t.clone() for t in inp.caches())
        outs.append(fa3.flash_attn_with_kvcache(
            inp.q, kc, vc, inp.k_new, inp.v_new, cache_seqlens=index_tensor(inp.lengths, "cpu"),
            page_table=inp.block_table, causal=True, num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin,
            return_softmax_lse=True)[:2] + (kc, vc))
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))


@pytest.mark.parametrize("paged,max_seqlen_q", [(False, None), (True, 7)], ids=["dense", "paged"])
@pytest.mark.parametrize("backend", cpu_backends())
def test_with_kvcache_varlen_queries(backend, paged, max_seqlen_q):
    """Varlen queries (cu_seqlens_q) over a cache, dense or paged; an int cache_seqlens is one length per
    sequence of cu_seqlens_q."""
    for case, int_lengths in ((PagedVarlenCase((3, 0, 7), (10, 4, 7), 16, (8, 2), 32, causal=True,
                                               dtype=torch.float16), False),
                              (PagedVarlenCase((2, 7), (9, 9), 16, (4, 4), 64, window=(2, 0),
                                               dtype=torch.float32), True)):
        inp = paged_varlen_inputs(case)
        if not paged:
            inp = replace(inp, block_table=None, page=None)
        kc, vc = (t.clone() for t in inp.caches())
        out, lse, *_ = fa3.flash_attn_with_kvcache(
            inp.q, kc, vc, cache_seqlens=case.lengths_k[0] if int_lengths else index_tensor(case.lengths_k, "cpu"),
            page_table=inp.block_table, cu_seqlens_q=torch.tensor(inp.cu_q, dtype=I32), max_seqlen_q=max_seqlen_q,
            causal=case.causal, window_size=case.window, return_softmax_lse=True, backend=backend)
        assert out.shape == inp.q.shape[:2] + (case.d,) and lse.shape == (case.heads[0], inp.q.shape[0])
        check_caches(inp, kc, vc, inp.k_log, inp.v_log)
        kw = dict(causal=case.causal, window=case.window, softcap=0.0, interleaved=True)
        check_outputs(out, lse, reference(inp, inp.k_log, inp.v_log, **kw),
                      reference(inp, inp.k_log, inp.v_log, dtype=None, **kw), case.dtype)


def _varlen_append_inputs(device, dtype, paged, seed=3):
    """A batch of 3 over a cache with per-sequence new rows (one sequence appends none) and queries."""
    g = torch.Generator().manual_seed(seed)
    b, hq, hkv, d, cap, page = 3, 4, 2, 32, 48, 16
    k_cache = torch.randn(b * cap // page + 2 if paged else b, page if paged else cap, hkv, d, generator=g)
    v_cache = torch.randn(k_cache.shape, generator=g)
    table = torch.randperm(b * cap // page + 2, generator=g)[:b * cap // page].view(b, cap // page).to(I32)
    lengths, new = [5, 0, 17], [3, 4, 0]
    k_new = torch.randn(sum(new), hkv, d, generator=g)
    v_new = torch.randn(sum(new), hkv, d, generator=g)
    rot = torch.arange(cap + 8, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(8) / 8.0))
    cos, sin = rot.cos(), rot.sin()
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return dict(k_cache=cast(k_cache), v_cache=cast(v_cache), table=table.to(device) if paged else None,
                lengths=lengths, new=new, k_new=cast(k_new), v_new=cast(v_new), cos=cast(cos), sin=cast(sin),
                hq=hq, d=d, g=g, cast=cast)


@pytest.mark.parametrize("varlen_q", [False, True], ids=["padded_q", "varlen_q"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("backend", cpu_backends())
def test_with_kvcache_cu_seqlens_k_new(backend, paged, varlen_q, device="cpu", dtype=torch.float32):
    """Packed new rows (cu_seqlens_k_new), with padded or packed queries: each sequence's result, caches included,
    is the one of a call with that sequence alone and its rows padded."""
    x = _varlen_append_inputs(device, dtype, paged)
    lengths, new = x["lengths"], x["new"]
    lens_q = [2, 3, 1] if varlen_q else [2, 2, 2]
    q_rows = [x["cast"](torch.randn(n, x["hq"], x["d"], generator=x["g"])) for n in lens_q]
    q = torch.cat(q_rows) if varlen_q else torch.stack(q_rows)
    cu_new = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=I32, device=device)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=I32, device=device)
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        q, kc, vc, x["k_new"], x["v_new"], rotary_cos=x["cos"], rotary_sin=x["sin"],
        cache_seqlens=torch.tensor(lengths, dtype=I32, device=device), page_table=x["table"],
        cu_seqlens_q=cu_q if varlen_q else None, cu_seqlens_k_new=cu_new, causal=True, return_softmax_lse=True,
        backend=backend)
    kc_one, vc_one = x["k_cache"].clone(), x["v_cache"].clone()
    for b in range(3):
        rows = slice(int(cu_new[b]), int(cu_new[b + 1]))
        one, one_lse, *_ = fa3.flash_attn_with_kvcache(
            q_rows[b][None], kc_one, vc_one, x["k_new"][rows][None], x["v_new"][rows][None], rotary_cos=x["cos"],
            rotary_sin=x["sin"], cache_seqlens=torch.tensor([lengths[b]], dtype=I32, device=device),
            cache_batch_idx=None if paged else torch.tensor([b], dtype=I32, device=device),
            page_table=x["table"][b:b + 1] if paged else None, causal=True, return_softmax_lse=True,
            backend=backend)
        got = out[int(cu_q[b]):int(cu_q[b + 1])] if varlen_q else out[b]
        got_lse = lse[:, int(cu_q[b]):int(cu_q[b + 1])] if varlen_q else lse[b]
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 on CUDA: the split counts may differ with the batch
        torch.testing.assert_close(got, one[0], atol=tol, rtol=tol)
        torch.testing.assert_close(got_lse, one_lse[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(kc, kc_one) and torch.equal(vc, vc_one), "the caches differ from per-sequence appends"


def test_with_kvcache_rotary_seqlens_shift_the_positions():
    """rotary_seqlens = cache_seqlens + 3 rotates as cache_seqlens does over the table shifted by 3 rows, for the
    appended keys and for the queries; rotary_seqlens = cache_seqlens changes nothing."""
    x = _varlen_append_inputs("cpu", torch.float32, paged=True)
    lengths = torch.tensor(x["lengths"], dtype=I32)
    k_new = x["k_new"][:6].view(3, 2, 2, x["d"])
    v_new = x["v_new"][:6].view(3, 2, 2, x["d"])
    q = torch.randn(3, 2, x["hq"], x["d"], generator=x["g"])
    results = []
    for base, cos, sin in ((lengths + 3, x["cos"], x["sin"]), (None, x["cos"][3:], x["sin"][3:]),
                           (lengths, x["cos"][3:], x["sin"][3:])):
        kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
        out = fa3.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=lengths, page_table=x["table"], rotary_seqlens=base,
                                          causal=True, rotary_interleaved=False)
        results.append((out, kc, vc))
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    assert all(torch.equal(a, b) for a, b in zip(results[1], results[2]))


def test_with_kvcache_rotary_seqlens_without_tables_changes_nothing():
    """FA3 (and its tests) pass rotary_seqlens whether or not they pass rotary tables; without tables nothing
    rotates, so the call is the one without rotary_seqlens, bit for bit (its shape and dtype still checked)."""
    x = _varlen_append_inputs("cpu", torch.float32, paged=True)
    results = []
    for rotary_seqlens in (None, torch.tensor([1, 2, 3], dtype=I32)):
        kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
        out = fa3.flash_attn_with_kvcache(torch.randn(3, 2, x["hq"], x["d"], generator=torch.Generator().manual_seed(2)),
                                          kc, vc, x["k_new"][:7], x["v_new"][:7],
                                          cache_seqlens=torch.tensor(x["lengths"], dtype=I32), page_table=x["table"],
                                          cu_seqlens_k_new=torch.tensor([0, 3, 7, 7], dtype=I32),
                                          rotary_seqlens=rotary_seqlens, causal=True)
        results.append((out, kc, vc))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("change,pattern", [
    (dict(cu_seqlens_k_new=torch.tensor([0, 3, 7, 5], dtype=I32)), r"^cu_seqlens_k_new: must be non-decreasing"),
    (dict(cu_seqlens_k_new=torch.tensor([0, 3, 4, 6], dtype=I32)), r"^cu_seqlens_k_new: last entry 6"),
    (dict(cu_seqlens_k_new=torch.tensor([0, 3, 7], dtype=I32)), r"^cu_seqlens_k_new: expected shape"),
    (dict(k=None, v=None), r"^cu_seqlens_k_new: given without the new rows"),
    (dict(cache_seqlens=torch.tensor([5, 45, 17], dtype=I32)), r"^page_table: cache_seqlens\[1\] \(45\) \+ 4 new rows"),
    (dict(rotary_seqlens=torch.tensor([0, 55, 0], dtype=I32)), r"^rotary_seqlens: sequence 1 rotates rows"),
    (dict(rotary_seqlens=torch.tensor([0, -1, 0], dtype=I32)), r"^rotary_seqlens: entry 1 is negative"),
    (dict(rotary_seqlens=torch.tensor([0, 1], dtype=I32)), r"^rotary_seqlens: expected shape"),
    (dict(rotary_cos=None, rotary_sin=None, rotary_seqlens=torch.tensor([0, 1], dtype=I32)),
     r"^rotary_seqlens: expected shape"),
], ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_with_kvcache_varlen_append_errors(change, pattern):
    x = _varlen_append_inputs("cpu", torch.float32, paged=True)
    kw = dict(q=torch.randn(3, 1, x["hq"], x["d"]), k_cache=x["k_cache"].clone(), v_cache=x["v_cache"].clone(),
              k=x["k_new"][:7], v=x["v_new"][:7], rotary_cos=x["cos"], rotary_sin=x["sin"],
              cache_seqlens=torch.tensor(x["lengths"], dtype=I32), page_table=x["table"],
              cu_seqlens_k_new=torch.tensor([0, 3, 7, 7], dtype=I32), rotary_seqlens=torch.tensor([1, 2, 3], dtype=I32))
    kw.update(change)
    before = kw["k_cache"].clone(), kw["v_cache"].clone()
    with pytest.raises(ValueError, match=pattern):
        fa3.flash_attn_with_kvcache(**kw)
    assert torch.equal(kw["k_cache"], before[0]) and torch.equal(kw["v_cache"], before[1])


FP8_CASES = [  # (varlen, heads, d, causal, window, softcap, descales: "given" / "expanded" / None)
    (False, (4, 2), 64, True, (-1, -1), 0.0, "given"),
    (False, (8, 1), 32, False, (3, 1), 5.0, "expanded"),
    (True, (6, 3), 48, True, (-1, -1), 0.0, None),
    (True, (4, 4), 16, False, (2, 2), 0.0, "given"),
]


def run_fp8(case, backend, device="cpu"):
    """FA3's FP8 forward against flashattn's float64 forward of the dequantised inputs (each element times its
    (sequence, KV head)'s descale): out in bfloat16, within its rounding of the fp64 result."""
    varlen, (hq, hkv), d, causal, window, softcap, descales = case
    g = torch.Generator().manual_seed(11)
    lens_q, lens_k = [5, 0, 9], [7, 3, 12]
    b = len(lens_q)
    if varlen:
        shapes = [(sum(lens_q), hq, d), (sum(lens_k), hkv, d), (sum(lens_k), hkv, d)]
    else:
        shapes = [(b, 6, hq, d), (b, 11, hkv, d), (b, 11, hkv, d)]
    q8, k8, v8 = (torch.randn(*s, generator=g).mul(2).to(F8) for s in shapes)
    scales = {"given": [torch.rand(b, hkv, generator=g) + 0.5 for _ in range(3)],
              "expanded": [torch.tensor(1.5).expand(b, hkv) for _ in range(3)], None: [None] * 3}[descales]

    def dequantised(t, s, group, lens):
        return dequantised_fp8(t, s, group, lens if varlen else None)

    qd = dequantised(q8, scales[0], hq // hkv, lens_q)
    kd, vd = dequantised(k8, scales[1], 1, lens_k), dequantised(v8, scales[2], 1, lens_k)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    if varlen:
        cu_q, cu_k = cu(lens_q, device), cu(lens_k, device)
        out, lse = fa3.flash_attn_varlen_func(q8.to(device), k8.to(device), v8.to(device), cu_q, cu_k, max(lens_q),
                                              max(lens_k), q_descale=_to(scales[0], device),
                                              k_descale=_to(scales[1], device), v_descale=_to(scales[2], device),
                                              return_attn_probs=True, backend=backend, **kw)
        ref, ref_lse = fa3.flash_attn_varlen_func(qd, kd, vd, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                                  return_attn_probs=True, backend="cpu_reference", **kw)
    else:
        out, lse = fa3.flash_attn_func(q8.to(device), k8.to(device), v8.to(device), q_descale=_to(scales[0], device),
                                       k_descale=_to(scales[1], device), v_descale=_to(scales[2], device),
                                       return_attn_probs=True, backend=backend, **kw)
        ref, ref_lse = fa3.flash_attn_func(qd, kd, vd, return_attn_probs=True, backend="cpu_reference", **kw)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.double().cpu(), ref, atol=1e-4, rtol=2.0 ** -8)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.double().cpu()[finite], ref_lse.double()[finite], atol=1e-4, rtol=1e-5)


def _to(t, device):
    return None if t is None else t.to(device)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: f"{'varlen' if c[0] else 'padded'}-h{c[1][0]}x{c[1][1]}-"
                                                          f"d{c[2]}-{c[6]}")
def test_fp8_forward(case, backend):
    run_fp8(case, backend)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: f"{'varlen' if c[0] else 'padded'}-h{c[1][0]}x{c[1][1]}-"
                                                          f"d{c[2]}-{c[6]}")
def test_fp8_backward(case, backend):
    """flashattn.fp8_attention_backward against float64 autograd of the dequantised inputs (dout times do_descale
    too): bfloat16 gradients within their rounding, the backward reading the forward's bfloat16 out."""
    varlen, (hq, hkv), d, causal, window, softcap, descales = case
    g = torch.Generator().manual_seed(12)
    lens_q, lens_k = [5, 0, 9], [7, 3, 12]
    b = len(lens_q)
    shapes = ([(sum(lens_q), hq, d), (sum(lens_k), hkv, d), (sum(lens_k), hkv, d), (sum(lens_q), hq, d)] if varlen
              else [(b, 6, hq, d), (b, 11, hkv, d), (b, 11, hkv, d), (b, 6, hq, d)])
    q8, k8, v8, do8 = (torch.randn(*s, generator=g).mul(2).to(F8) for s in shapes)
    scales = {"given": [torch.rand(b, hkv, generator=g) + 0.5 for _ in range(4)],
              "expanded": [torch.tensor(1.5).expand(b, hkv) for _ in range(4)], None: [None] * 4}[descales]

    def dequantised(t, s, group, lens):
        return dequantised_fp8(t, s, group, lens if varlen else None)

    group = hq // hkv
    qd, kd, vd = (dequantised(q8, scales[0], group, lens_q).requires_grad_(),
                  dequantised(k8, scales[1], 1, lens_k).requires_grad_(),
                  dequantised(v8, scales[2], 1, lens_k).requires_grad_())
    dod = dequantised(do8, scales[3], group, lens_q)
    window_left, window_right = window
    kw = dict(causal=causal, window_left=window_left, window_right=window_right, softcap=softcap, backend=backend)
    cu_kw = {}
    if varlen:
        cu_kw = dict(cu_seqlens_q=cu(lens_q), cu_seqlens_k=cu(lens_k), max_seqlen_q=max(lens_q),
                     max_seqlen_k=max(lens_k))
    out, lse = flashattn.fp8_attention(q8, k8, v8, q_descale=scales[0], k_descale=scales[1], v_descale=scales[2],
                                       **cu_kw, **kw)
    dq, dk, dv = flashattn.fp8_attention_backward(do8, q8, k8, v8, out, lse, q_descale=scales[0],
                                                  k_descale=scales[1], v_descale=scales[2], do_descale=scales[3],
                                                  **cu_kw, **kw)
    ref, _ = flashattn.attention(qd, kd, vd, **cu_kw, causal=causal, window_left=window_left,
                                 window_right=window_right, softcap=softcap, backend="cpu_reference")
    want = torch.autograd.grad(ref, (qd, kd, vd), dod)
    for name, got, w in (("dq", dq, want[0]), ("dk", dk, want[1]), ("dv", dv, want[2])):
        assert got.dtype == torch.bfloat16 and got.shape == w.shape, name
        err = float((got.double() - w).norm() / w.norm().clamp_min(1e-30))
        assert err <= 1e-2, f"{name}: relative error {err:.2e}"


def test_fp8_varlen_seqused():
    """seqused_q / seqused_k with float8 inputs (FA3's varlen tests use them with every dtype): the same as the FP8
    call over the used rows alone, unused query rows 0 (lse -inf)."""
    g = torch.Generator().manual_seed(21)
    cu_q, cu_k = torch.tensor([0, 5, 12, 20], dtype=I32), torch.tensor([0, 9, 9, 23], dtype=I32)
    used_q, used_k = torch.tensor([3, 7, 0], dtype=I32), torch.tensor([9, 0, 10], dtype=I32)
    q8 = torch.randn(20, 4, 16, generator=g).to(F8)
    k8, v8 = (torch.randn(23, 2, 16, generator=g).to(F8) for _ in range(2))
    descales = [torch.rand(3, 2, generator=g) + 0.5 for _ in range(3)]
    out, lse = fa3.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, None, None, seqused_q=used_q, seqused_k=used_k,
                                          causal=True, q_descale=descales[0], k_descale=descales[1],
                                          v_descale=descales[2], return_attn_probs=True)
    q_rows = torch.cat([torch.arange(s, s + n) for s, n in zip(cu_q[:-1].tolist(), used_q.tolist())])
    k_rows = torch.cat([torch.arange(s, s + n) for s, n in zip(cu_k[:-1].tolist(), used_k.tolist())])
    cu = lambda n: torch.tensor([0] + n.cumsum(0).tolist(), dtype=I32)  # noqa: E731
    want, want_lse = fa3.flash_attn_varlen_func(q8[q_rows], k8[k_rows], v8[k_rows], cu(used_q), cu(used_k), None,
                                                None, causal=True, q_descale=descales[0], k_descale=descales[1],
                                                v_descale=descales[2], return_attn_probs=True)
    assert torch.equal(out[q_rows], want) and torch.equal(lse[:, q_rows], want_lse)
    unused = torch.ones(20, dtype=torch.bool)
    unused[q_rows] = False
    assert torch.all(out[unused] == 0) and torch.all(lse[:, unused] == float("-inf"))


def test_fp8_backward_errors_name_the_argument():
    q, k, v = (torch.randn(2, 3, 2, 16).to(F8) for _ in range(3))
    out, lse = flashattn.fp8_attention(q, k, v)
    with pytest.raises(TypeError, match=r"^dout: dtype torch.bfloat16"):
        flashattn.fp8_attention_backward(out, q, k, v, out, lse)
    with pytest.raises(ValueError, match=r"^do_descale: "):
        flashattn.fp8_attention_backward(q, q, k, v, out, lse, do_descale=torch.ones(3, 2))
    if torch.cuda.is_available() and flashattn.built_with_cuda():
        qc, kc, vc = (t.cuda() for t in (q, k, v))
        oc, lc = out.cuda(), lse.cuda()
        with pytest.raises(ValueError, match=r"^do_descale: "):
            flashattn.fp8_attention_backward(qc, qc, kc, vc, oc, lc, do_descale=torch.ones(3, 2, device="cuda"))
        if torch.cuda.get_device_capability() != (9, 0):  # the FP8 kernels are Hopper's
            with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
                flashattn.fp8_attention_backward(qc, qc, kc, vc, oc, lc)


# FP8 KV caches (flash_attn_with_kvcache with float8_e4m3fn q, caches and new rows): the new rows land in the cache
# byte for byte, and out is the float64 attention of the dequantised q and caches (sequence b's k / v rows scaled by
# k_descale / v_descale[b]) within bfloat16's rounding.
FP8_KV_CASES = [
    KVCase(2, 1, 1, (5, 9), heads=(4, 2), d=32, causal=True, dtype=torch.float32),
    KVCase(3, 3, 2, (0, 7, 20), page=4, heads=(2, 1), d=16, causal=True, dtype=torch.float32),
    KVCase(2, 2, 0, (6, 3), batch_idx=True, leftpad=(2, 0), heads=(2, 2), d=16, window=(3, 0),
           dtype=torch.float32),
    KVCase(2, 1, 2, (11, 4), page=16, heads=(6, 2), d=24, d_v=16, softcap=5.0, dtype=torch.float32),
    # Long caches: the CUDA decode kernel's key splits (chosen, and 3 given), its paged and 64-row plans, hd 128 / 256.
    KVCase(3, 1, 1, (2900, 1500, 37), page=16, heads=(8, 2), d=128, dtype=torch.float32),
    KVCase(2, 16, 2, (3000, 700), heads=(8, 2), d=128, causal=True, num_splits=3, dtype=torch.float32),
    KVCase(1, 1, 0, (2000,), heads=(2, 2), d=256, d_v=200, dtype=torch.float32),
    # Rotary on e4m3 rows (FA3 rotates them in its kernels): both styles, q at one position and per row, paged.
    KVCase(2, 1, 1, (5, 9), rotary=1.0, heads=(4, 2), d=32, dtype=torch.float32),
    KVCase(3, 3, 2, (0, 7, 20), page=4, rotary=0.5, interleaved=False, heads=(2, 1), d=16, causal=True,
           dtype=torch.float32),
    KVCase(2, 16, 2, (3000, 700), rotary=0.5, heads=(8, 2), d=128, causal=True, num_splits=3, dtype=torch.float32),
]
# CUDA runs them on the split-KV decode kernel (tiles widened to float16 in shared memory).
FP8_KV_BACKENDS = cpu_backends() + [pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])]


@pytest.mark.parametrize("backend", FP8_KV_BACKENDS)
@pytest.mark.parametrize("descales", ["given", None])
@pytest.mark.parametrize("case", FP8_KV_CASES, ids=str)
def test_fp8_kvcache(case, descales, backend):
    g = torch.Generator().manual_seed(17)
    inp = make_inputs(case)
    as8 = lambda t: None if t is None else t.mul(2).to(F8)  # noqa: E731
    inp8 = replace(inp, q=as8(inp.q), k_log=as8(inp.k_log), v_log=as8(inp.v_log), k_new=as8(inp.k_new),
                   v_new=as8(inp.v_new), k_phys=as8(inp.k_phys), v_phys=as8(inp.v_phys))
    if inp.block_table is not None:  # the logical caches as the pages hold them
        inp8 = replace(inp8, k_log=logical_pages(inp8.k_phys, inp.block_table),
                       v_log=logical_pages(inp8.v_phys, inp.block_table))
    if case.rotary:  # FA3 takes the tables in q's dtype
        inp8 = replace(inp8, cos=inp.cos.to(F8), sin=inp.sin.to(F8))
    b, hkv = inp.batch, case.heads[1]
    qs, ks, vs = ([torch.rand(b, hkv, generator=g) + 0.5 for _ in range(3)] if descales else [None] * 3)
    dev = "cuda" if backend == "cuda" else "cpu"
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    kc, vc = (t.clone().to(dev) for t in inp8.caches())
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        to(inp8.q), kc, vc, to(inp8.k_new), to(inp8.v_new), rotary_cos=to(inp8.cos), rotary_sin=to(inp8.sin),
        cache_seqlens=index_tensor(inp.lengths, dev), cache_batch_idx=index_tensor(inp.batch_idx, dev),
        cache_leftpad=index_tensor(inp.leftpad, dev), page_table=to(inp.block_table), q_descale=to(qs),
        k_descale=to(ks), v_descale=to(vs), causal=case.causal, window_size=case.window, softcap=case.softcap,
        rotary_interleaved=case.interleaved, num_splits=case.num_splits, return_softmax_lse=True,
        backend="auto" if dev == "cuda" else backend)
    out, lse, kc, vc = out.cpu(), lse.cpu(), kc.cpu(), vc.cpu()
    assert out.dtype == torch.bfloat16
    # The append: bytes, checked on uint8 views. Rotated k rows: the pair's math in fp32 on the widened values (as
    # for 16-bit rows), stored to the nearest e4m3 (ties to even; these values stay far below the saturation).
    bytes_of = lambda t: None if t is None else t.view(torch.uint8)  # noqa: E731
    inp_u8 = replace(inp8, k_log=bytes_of(inp8.k_log), v_log=bytes_of(inp8.v_log), k_new=bytes_of(inp8.k_new),
                     v_new=bytes_of(inp8.v_new), k_phys=bytes_of(inp8.k_phys), v_phys=bytes_of(inp8.v_phys))
    if case.rotary:
        widened = lambda t: t.view(F8).float()  # noqa: E731
        inp_f = replace(inp_u8, k_log=widened(inp_u8.k_log), v_log=widened(inp_u8.v_log),
                        k_new=widened(inp_u8.k_new), v_new=widened(inp_u8.v_new), cos=inp8.cos.float(),
                        sin=inp8.sin.float())
        k_exp, v_exp = (t.to(F8).view(torch.uint8) for t in expected_caches(inp_f, case.interleaved))
    else:
        k_exp, v_exp = expected_caches(inp_u8, True)
    check_caches(inp_u8, bytes_of(kc), bytes_of(vc), k_exp, v_exp)
    q8 = inp8.q
    if case.rotary:  # q rotated as the library does it for e4m3 rows, at the positions the reference uses
        per_row = case.causal or case.window[0] >= 0 or case.window[1] >= 0
        q8 = torch.stack([rotary_ref(q8[s].float(), inp8.cos.float(), inp8.sin.float(),
                                     inp.lengths[s] + torch.arange(case.s_q) * int(per_row),
                                     case.interleaved).to(F8).view(torch.uint8) for s in range(b)]).view(F8)
    # The oracle: dequantised q and appended caches (entry e = sequence b's rows times its descale), float64.
    k_deq, v_deq = k_exp.view(F8).double(), v_exp.view(F8).double()
    for seq in range(b):
        e = inp.entry(seq)
        if ks is not None:
            k_deq[e] *= ks[seq].double()[None, :, None]
            v_deq[e] *= vs[seq].double()[None, :, None]
    q_deq = dequantised_fp8(q8, qs, case.heads[0] // hkv)
    ref, ref_lse = reference(replace(inp, q=q_deq, cos=None, sin=None), k_deq, v_deq, causal=case.causal,
                             window=case.window, softcap=case.softcap, interleaved=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=1e-2)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("d, width", [(120, 128), (72, 80)])
def test_fp8_kvcache_rows_sliced_from_wider_ones(d, width):
    """Cache rows cut from wider ones (16-byte aligned strides, head dim not a multiple of 16): the CUDA decode
    kernel's 16-byte staging copies end in a half-filled chunk; checked against the CPU reference."""
    g = torch.Generator().manual_seed(23)
    b, s, hq, hkv = 2, 700, 8, 2
    q = torch.randn(b, 1, hq, d, generator=g).to(F8)
    k_wide, v_wide = (torch.randn(b, s, hkv, width, generator=g).to(F8) for _ in range(2))
    seqlens = torch.tensor([700, 333], dtype=torch.int32)
    descale = torch.rand(b, hkv, generator=g) + 0.5
    ref, ref_lse, *_ = fa3.flash_attn_with_kvcache(q, k_wide[..., :d], v_wide[..., :d], cache_seqlens=seqlens,
                                                   k_descale=descale, v_descale=descale, return_softmax_lse=True,
                                                   backend="cpu_reference")
    k_dev, v_dev = k_wide.cuda()[..., :d], v_wide.cuda()[..., :d]
    assert k_dev.stride(1) == hkv * width
    out, lse, *_ = fa3.flash_attn_with_kvcache(q.cuda(), k_dev, v_dev, cache_seqlens=seqlens.cuda(),
                                               k_descale=descale.cuda(), v_descale=descale.cuda(),
                                               return_softmax_lse=True)
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("backend", FP8_KV_BACKENDS)
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_fp8_kvcache_varlen_queries(backend, paged):
    """Packed queries (cu_seqlens_q) over a float8 cache: the cache stays batched while q is packed (this crashed
    the CPU path, which took both for packed). Each sequence's rows equal the same call for that sequence alone."""
    g = torch.Generator().manual_seed(23)
    dev = "cuda" if backend == "cuda" else "cpu"
    lens_q, lengths, hq, hkv, d = [3, 0, 5], [40, 7, 61], 4, 2, 32
    q8 = torch.randn(sum(lens_q), hq, d, generator=g).to(F8)
    kc, vc = (torch.randn(3, 64, hkv, d, generator=g).to(F8) for _ in range(2))
    descales = [torch.rand(3, hkv, generator=g) + 0.5 for _ in range(3)]
    table = None
    if paged:  # 16-row pages, each sequence's in reverse order
        table = torch.arange(12, dtype=I32).reshape(3, 4).flip(1)
        kc, vc = (t.view(torch.uint8).reshape(12, 16, hkv, d)[table.flatten().argsort()].view(F8) for t in (kc, vc))
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    kw = dict(page_table=to(table), causal=True, backend="auto" if dev == "cuda" else backend)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=I32)
    out, lse, *_ = fa3.flash_attn_with_kvcache(to(q8), to(kc), to(vc), cache_seqlens=to(torch.tensor(lengths, dtype=I32)),
                                               cu_seqlens_q=to(cu_q), max_seqlen_q=max(lens_q), q_descale=to(descales[0]),
                                               k_descale=to(descales[1]), v_descale=to(descales[2]),
                                               return_softmax_lse=True, **kw)
    assert out.shape == (sum(lens_q), hq, d) and lse.shape == (hq, sum(lens_q))
    for b, (lo, hi) in enumerate(zip(cu_q[:-1].tolist(), cu_q[1:].tolist())):
        if hi == lo:
            continue
        one = dict(kw, page_table=None if table is None else to(table[b:b + 1]))
        caches = (kc, vc) if paged else (kc[b:b + 1], vc[b:b + 1])
        want, want_lse, *_ = fa3.flash_attn_with_kvcache(
            to(q8[lo:hi][None]), *(to(t) for t in caches), cache_seqlens=lengths[b], q_descale=to(descales[0][b:b + 1]),
            k_descale=to(descales[1][b:b + 1]), v_descale=to(descales[2][b:b + 1]), return_softmax_lse=True, **one)
        torch.testing.assert_close(out[lo:hi].cpu(), want[0].cpu(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[:, lo:hi].cpu(), want_lse[0].cpu(), atol=1e-4, rtol=1e-5)


def logical_pages(pages: Tensor, block_table: Tensor) -> Tensor:
    """[entries, pages x page, h, d] through block_table, by byte gather (float8 has no CPU indexing kernels)."""
    return pages.view(torch.uint8)[block_table.long()].flatten(1, 2).view(F8)


def test_fp8_kvcache_refusals():
    q = torch.randn(1, 1, 2, 16).to(F8)
    k_cache, v_cache = (torch.randn(1, 8, 2, 16).to(F8) for _ in range(2))
    cos = torch.ones(8, 8)
    with pytest.raises(TypeError, match=r"^rotary_cos: dtype torch.float32 differs from q's torch.float8_e4m3fn"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, q[:, :, :2], q[:, :, :2], rotary_cos=cos, rotary_sin=cos,
                                    cache_seqlens=3)
    with pytest.raises(TypeError, match=r"^k_cache: dtype torch.bfloat16 differs from q's"):
        fa3.flash_attn_with_kvcache(q, k_cache.bfloat16(), v_cache)
    with pytest.raises(ValueError, match=r"^k_descale: expected shape \[1, 2\]"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_descale=torch.ones(2, 2))
    if torch.cuda.is_available() and flashattn.built_with_cuda():
        with pytest.raises(TypeError, match=r"^rotary_cos: dtype torch.float32 differs from q's"):
            fa3.flash_attn_with_kvcache(q.cuda(), k_cache.cuda(), v_cache.cuda(), q[:, :, :2].cuda(),
                                        q[:, :, :2].cuda(), rotary_cos=cos.cuda(), rotary_sin=cos.cuda(),
                                        cache_seqlens=3)


def test_fp8_is_forward_only_and_packed_qkv_runs():
    q, k, v = (torch.randn(2, 3, 2, 16).to(F8) for _ in range(3))
    q.requires_grad_()
    # As FA3: the forward of inputs that require grad runs (FA3's tests call it so), the backward says why not.
    out = fa3.flash_attn_func(q, k, v)
    assert out.requires_grad and torch.equal(out.detach(), fa3.flash_attn_func(q.detach(), k, v))
    with pytest.raises(NotImplementedError, match=r"^q: the backward of float8_e4m3fn"):
        out.sum().backward()
    with torch.no_grad():
        out = fa3.flash_attn_func(q, k, v)
    assert out.dtype == torch.bfloat16 and not out.requires_grad
    qkv = torch.stack([q.detach(), k, v], dim=2)
    packed = fa3.flash_attn_qkvpacked_func(qkv, q_descale=torch.ones(2, 2))
    torch.testing.assert_close(packed, fa3.flash_attn_func(q.detach(), k, v, q_descale=torch.ones(2, 2)))


def test_get_scheduler_metadata_is_none_and_accepted():
    case = KVCase(2, 1, 1, (17, 40), page=16, heads=(8, 2), causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    seqlens = index_tensor(inp.lengths, "cpu")
    metadata = fa3.get_scheduler_metadata(2, 1, inp.capacity, 8, 2, 64, seqlens, torch.float32, page_size=16,
                                          max_seqlen_k_new=1, causal=True)
    assert metadata is None
    kc, vc = (t.clone() for t in inp.caches())
    out = fa3.flash_attn_with_kvcache(inp.q, kc, vc, inp.k_new, inp.v_new, cache_seqlens=seqlens,
                                      page_table=inp.block_table, causal=True, scheduler_metadata=metadata)
    kc2, vc2 = (t.clone() for t in inp.caches())
    ref = fa3.flash_attn_with_kvcache(inp.q, kc2, vc2, inp.k_new, inp.v_new, cache_seqlens=seqlens,
                                      page_table=inp.block_table, causal=True)
    assert torch.equal(out, ref)


# ---- qv: FA3's query-value term (DeepSeek MLA's absorbed attention) ------------------------------------------------

QV_CASES = [
    # (b, s_q, s_k, heads q, heads kv, d, d_v, causal, window, softcap, dtype)
    (2, 5, 9, 4, 1, 64, 512, False, (-1, -1), 0.0, torch.bfloat16),  # MLA decode's shape class: MQA, d 64, d_v 512
    (1, 7, 7, 2, 2, 16, 32, True, (-1, -1), 3.0, torch.float16),
    (2, 6, 3, 4, 2, 8, 24, True, (1, 0), 0.0, torch.float32),        # s_q > s_k: rows without keys
]


def qv_like(q: Tensor, d_v: int, seed: int = 13) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*q.shape[:-1], d_v, generator=g).to(q.dtype).to(q.device)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", QV_CASES, ids=lambda c: f"b{c[0]}q{c[1]}k{c[2]}h{c[3]}-{c[4]}d{c[5]}-{c[6]}")
def test_qv(case, backend):
    b, s_q, s_k, hq, hkv, d, dv, causal, window, softcap, dtype = case
    q, k, v, _ = dense_inputs(b, s_q, s_k, hq, hkv, d, dv, dtype)
    qv = qv_like(q, dv)
    outs = {}
    for scale in (None, 0.3):  # None: FA3's default with qv, 1 / sqrt(d + d_v)
        out, lse = fa3.flash_attn_func(q, k, v, scale, causal, qv, window_size=window, softcap=softcap,
                                       return_attn_probs=True, backend=backend)
        kw = dict(causal=causal, window=window, softcap=softcap, scale=scale, qv=qv)
        r64, low = attention_ref(q, k, v, **kw), attention_ref(q, k, v, dtype=None, **kw)
        assert_close("out", out, r64[0], low[0], dtype)
        assert_close("lse", lse, r64[1], low[1], dtype)
        outs[scale] = out
    # the library's own entry takes it too, with the same bits
    same, _ = flashattn.attention(q, k, v, qv=qv, causal=causal, window_left=window[0], window_right=window[1],
                                  softcap=softcap, backend=backend)
    assert torch.equal(same, outs[None])


@pytest.mark.parametrize("backend", cpu_backends())
def test_qv_varlen_seqused_q(backend):
    seg_q, used_q, seg_k = (3, 5), (2, 5), (6, 4)
    hq, hkv, d, dv, dtype = 4, 2, 16, 48, torch.bfloat16
    g = torch.Generator().manual_seed(17)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    q, k, v, qv = make(8, hq, d), make(10, hkv, d), make(10, hkv, dv), make(8, hq, dv)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu(seg_q), cu(seg_k), 5, 6, index_tensor(used_q, "cpu"),
                                          causal=True, qv=qv, return_attn_probs=True, backend=backend)
    refs = [used_ref(q, k, v, cu(seg_q).tolist(), cu(seg_k).tolist(), used_q, seg_k, qv=qv, causal=True, dtype=dt)
            for dt in (torch.float64, None)]
    assert_close("out", out, refs[0][0], refs[1][0], dtype)
    assert_close("lse", lse, refs[0][1], refs[1][1], dtype)


@pytest.mark.parametrize("backend", cpu_backends())
def test_qv_paged_varlen(backend):
    case = PAGED_CASES[2]
    inp = paged_varlen_inputs(case)
    kc, vc = (t.clone() for t in inp.caches())
    qv = qv_like(inp.q, vc.shape[-1])
    out, lse = fa3.flash_attn_varlen_func(
        inp.q, kc, vc, torch.tensor(inp.cu_q, dtype=I32), None, max(case.lengths_q), None,
        seqused_k=index_tensor(case.lengths_k, "cpu"), causal=case.causal, qv=qv, window_size=case.window,
        softcap=case.softcap, return_attn_probs=True, page_table=inp.block_table, backend=backend)
    kw = dict(causal=case.causal, window=case.window, softcap=case.softcap, interleaved=True, qv=qv)
    check_outputs(out, lse, reference(inp, inp.k_log, inp.v_log, **kw),
                  reference(inp, inp.k_log, inp.v_log, dtype=None, **kw), case.dtype)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", [
    KVCase(2, 3, 2, (5, 11), page=4, rotary=0.5, interleaved=False, heads=(4, 1), d=32, d_v=64, causal=True,
           dtype=torch.bfloat16),
    KVCase(2, 1, 1, (0, 7), rotary=1.0, heads=(2, 2), d=16, d_v=40, softcap=2.0, dtype=torch.float16),
], ids=str)
def test_qv_with_kvcache(case, backend):
    inp = make_inputs(case)
    k_arg, v_arg = (t.clone() for t in inp.caches())
    qv = qv_like(inp.q, case.d_v)
    out, lse, *_ = fa3.flash_attn_with_kvcache(
        inp.q, k_arg, v_arg, inp.k_new, inp.v_new, qv, inp.cos, inp.sin, index_tensor(inp.lengths, "cpu"), None,
        None, inp.block_table, causal=case.causal, softcap=case.softcap, rotary_interleaved=case.interleaved,
        return_softmax_lse=True, backend=backend)
    check_call(inp, case, k_arg, v_arg, out, lse, qv=qv)  # the reference rotates q, not qv (FA3)


def test_qv_is_forward_only():
    q, k, v, _ = dense_inputs(1, 3, 4, 2, 2, 8, 16, torch.float32)
    qv = qv_like(q, 16)
    expected = fa3.flash_attn_func(q, k, v, qv=qv)
    for requires in ("q", "qv"):
        leaves = {n: t.clone().requires_grad_(n == requires) for n, t in dict(q=q, k=k, v=v, qv=qv).items()}
        for dispatched in (False, True):  # the eager shortcut and torch's operator (what torch.compile records)
            with OpSpy() if dispatched else contextlib.nullcontext():
                out = fa3.flash_attn_func(**leaves)
            assert out.requires_grad and torch.equal(out.detach(), expected)
            with pytest.raises(NotImplementedError, match=r"^qv: the backward of attention with qv is not"):
                out.sum().backward()


# ---- unsupported arguments and errors ------------------------------------------------------------------------------


def dense_call(**change):
    q, k, v, _ = dense_inputs(2, 3, 5, 4, 2, 16, 16, torch.float32)
    return {**dict(q=q, k=k, v=v, causal=True), **change}


def varlen_call(**change):
    g = torch.Generator().manual_seed(5)
    kw = dict(q=torch.randn(7, 4, 16, generator=g), k=torch.randn(9, 2, 16, generator=g),
              v=torch.randn(9, 2, 16, generator=g), cu_seqlens_q=torch.tensor([0, 3, 7], dtype=I32),
              cu_seqlens_k=torch.tensor([0, 4, 9], dtype=I32), max_seqlen_q=4, max_seqlen_k=5)
    kw.update(change)
    return kw


def kvcache_call(**change):
    g = torch.Generator().manual_seed(6)
    kw = dict(q=torch.randn(2, 1, 4, 16, generator=g), k_cache=torch.randn(5, 16, 2, 16, generator=g),
              v_cache=torch.randn(5, 16, 2, 16, generator=g), k=torch.randn(2, 1, 2, 16, generator=g),
              v=torch.randn(2, 1, 2, 16, generator=g), cache_seqlens=torch.tensor([3, 7], dtype=I32),
              page_table=torch.tensor([[4], [1]], dtype=I32), causal=True)
    kw.update(change)
    return kw


def scheduler_call(**change):
    return {**dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=16, num_heads_q=4, num_heads_kv=2, headdim=16,
                   cache_seqlens=torch.tensor([3, 7], dtype=I32)), **change}


def qkvpacked_call(**change):
    return {"qkv": torch.randn(2, 5, 3, 2, 16), **change}


ONE = torch.ones(1)


def _f8(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)
CALLS = {"flash_attn_func": dense_call, "flash_attn_varlen_func": varlen_call,
         "flash_attn_with_kvcache": kvcache_call, "get_scheduler_metadata": scheduler_call,
         "flash_attn_qkvpacked_func": qkvpacked_call}
UNSUPPORTED = (
    [("flash_attn_varlen_func", "cu_seqlens_q", dict(cu_seqlens_q=None)),
     ("flash_attn_varlen_func", "cu_seqlens_k", dict(cu_seqlens_k=None))]
    + [("flash_attn_with_kvcache", "scheduler_metadata", dict(scheduler_metadata=torch.zeros(3, dtype=I32)))]
    # float8 inputs with qv (FA3 neither)
    + [("flash_attn_func", "qv", dict(q=_f8(2, 3, 4, 16), k=_f8(2, 5, 2, 16), v=_f8(2, 5, 2, 16),
                                      qv=_f8(2, 3, 4, 16))),
       ("flash_attn_varlen_func", "qv", dict(q=_f8(7, 4, 16), k=_f8(9, 2, 16), v=_f8(9, 2, 16), qv=_f8(7, 4, 16))),
       ("flash_attn_with_kvcache", "qv", dict(q=_f8(2, 1, 4, 16), k_cache=_f8(5, 16, 2, 16),
                                              v_cache=_f8(5, 16, 2, 16), k=_f8(2, 1, 2, 16), v=_f8(2, 1, 2, 16),
                                              qv=_f8(2, 1, 4, 16)))]
)


@pytest.mark.parametrize("function,name,change", UNSUPPORTED, ids=[f"{u[0]}-{u[1]}" for u in UNSUPPORTED])
def test_unsupported_raises_naming_it(function, name, change):
    kw = CALLS[function](**change)
    caches = [kw[n].clone() for n in ("k_cache", "v_cache") if n in kw]
    with pytest.raises(NotImplementedError, match=rf"^{name}\b"):
        getattr(fa3, function)(**kw)
    for before, n in zip(caches, ("k_cache", "v_cache")):
        assert torch.equal(kw[n], before), f"{n} was written by a rejected call"


def _bad_cu(values):
    return torch.tensor(values, dtype=I32)


F8 = torch.float8_e4m3fn


def _fp8(t):
    return t.to(F8)


ERRORS = [
    # descales scale float8 inputs only (FA3 would ignore them); FP8 calls' own errors
    *[(f, {n: torch.ones(2, 2)}, ValueError, rf"^{n}: descale factors go with float8_e4m3fn")
      for f in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "flash_attn_qkvpacked_func")
      for n in ("q_descale", "k_descale", "v_descale")],
    ("flash_attn_func", dict(q=_fp8(torch.randn(2, 3, 4, 16))), TypeError, r"^k: dtype torch.float32, but the FP8"),
    ("flash_attn_func", dict(q=_fp8(torch.randn(2, 3, 4, 16)), k=_fp8(torch.randn(2, 5, 2, 16)),
                             v=_fp8(torch.randn(2, 5, 2, 16)), q_descale=torch.ones(2, 3)), ValueError,
     r"^q_descale: expected shape \[2, 2\]"),
    ("flash_attn_func", dict(q=_fp8(torch.randn(2, 3, 4, 16)), k=_fp8(torch.randn(2, 5, 2, 16)),
                             v=_fp8(torch.randn(2, 5, 2, 16)), k_descale=torch.ones(2, 2, dtype=torch.float64)),
     ValueError, r"^k_descale: expected dtype float32"),
    ("flash_attn_varlen_func", dict(q=_fp8(torch.randn(7, 4, 16)), k=_fp8(torch.randn(9, 2, 16)),
                                    v=_fp8(torch.randn(9, 2, 16)), page_table=torch.zeros(2, 1, dtype=I32)),
     NotImplementedError, r"^page_table: float8_e4m3fn"),
    ("flash_attn_with_kvcache", dict(q=_fp8(torch.randn(2, 1, 4, 16))), TypeError,
     r"^k_cache: dtype torch.float\d+ differs from q's torch.float8_e4m3fn"),
    ("flash_attn_func", dict(pack_gqa="yes"), TypeError, r"^pack_gqa: expected a bool"),
    # qv: like q with d_v columns, in q's dtype
    ("flash_attn_func", dict(qv=torch.randn(2, 3, 4, 8)), ValueError, r"^qv: expected shape \[2, 3, 4, 16\]"),
    ("flash_attn_func", dict(qv=torch.randn(2, 3, 4, 16, dtype=torch.float64)), TypeError,
     r"^qv: dtype torch.float64 differs from q's torch.float32"),
    ("flash_attn_func", dict(qv=[1.0]), TypeError, r"^qv: expected a torch.Tensor"),
    ("flash_attn_varlen_func", dict(qv=torch.randn(6, 4, 16)), ValueError, r"^qv: expected shape \[7, 4, 16\]"),
    ("flash_attn_varlen_func", dict(qv=torch.randn(6, 4, 16), seqused_q=_bad_cu([1, 1])), ValueError,
     r"^qv: expected 7 rows"),
    ("flash_attn_with_kvcache", dict(qv=torch.randn(2, 1, 4, 8)), ValueError,
     r"^qv: expected shape \[2, 1, 4, 16\]"),
    ("flash_attn_with_kvcache", dict(qv=torch.randn(2, 1, 4, 16).half()), TypeError, r"^qv: dtype torch.float16"),
    ("flash_attn_func", dict(sm_margin=-1), ValueError, r"^sm_margin: must be in \[0"),
    ("flash_attn_func", dict(num_splits=1.5), TypeError, r"^num_splits: expected an integer"),
    ("flash_attn_func", dict(attention_chunk=1.5), TypeError, r"^attention_chunk: expected an integer"),
    ("flash_attn_qkvpacked_func", dict(attention_chunk=-3), ValueError, r"^attention_chunk: must be >= 0"),
    ("get_scheduler_metadata", dict(attention_chunk=-1), ValueError, r"^attention_chunk: must be >= 0"),
    ("flash_attn_func", dict(return_attn_probs="no"), TypeError, r"^return_attn_probs: expected a bool"),
    ("flash_attn_func", dict(deterministic="no"), TypeError, r"^deterministic: expected a bool"),
    ("flash_attn_func", dict(window_size=(1,)), ValueError, r"^window_size: expected a pair"),
    ("flash_attn_qkvpacked_func", dict(qkv=torch.randn(2, 5, 8, 16)), ValueError, r"^num_heads_q: required"),
    ("flash_attn_qkvpacked_func", dict(qkv=torch.randn(2, 5, 8, 16), num_heads_q=3), ValueError,
     r"^num_heads_q: 3 leaves 5 of qkv's 8 heads"),
    ("flash_attn_qkvpacked_func", dict(qkv=torch.randn(2, 5, 4, 2, 16)), ValueError, r"^qkv: expected shape"),
    ("flash_attn_varlen_func", dict(seqused_q=_bad_cu([3, 5])), ValueError,
     r"^seqused_q\[1\] = 5: outside \[0, 4\], the rows of sequence 1 in cu_seqlens_q"),
    ("flash_attn_varlen_func", dict(seqused_k=_bad_cu([-1, 5])), ValueError, r"^seqused_k\[0\] = -1: outside"),
    ("flash_attn_varlen_func", dict(seqused_k=_bad_cu([1, 2, 3])), ValueError, r"^seqused_k: expected shape \[2\]"),
    ("flash_attn_varlen_func", dict(seqused_k=torch.tensor([1, 2])), TypeError, r"^seqused_k: dtype must be"),
    ("flash_attn_varlen_func", dict(seqused_q=_bad_cu([1, 1]), cu_seqlens_q=_bad_cu([1, 3, 7])), ValueError,
     r"^cu_seqlens_q: must start at 0"),
    ("flash_attn_varlen_func", dict(seqused_q=_bad_cu([1, 1]), cu_seqlens_q=_bad_cu([0, 3, 6])), ValueError,
     r"^cu_seqlens_q: last entry 6 does not match the packed row count 7"),
    ("flash_attn_varlen_func", dict(seqused_k=_bad_cu([1, 1]), cu_seqlens_k=_bad_cu([0, 9, 9, 9])), ValueError,
     r"^seqused_k: expected shape \[3\]"),
    ("flash_attn_varlen_func", dict(seqused_k=_bad_cu([1, 1]), cu_seqlens_k=_bad_cu([0, 10, 9])), ValueError,
     r"^cu_seqlens_k: must be non-decreasing"),
    ("flash_attn_varlen_func", dict(seqused_k=_bad_cu([1, 1]), max_seqlen_q=2), ValueError,
     r"^max_seqlen_q: 2 is smaller"),
    ("flash_attn_varlen_func", dict(page_table=torch.tensor([[0], [1]])), TypeError, r"^page_table: dtype must be"),
    ("flash_attn_varlen_func", dict(page_table=_bad_cu([0, 1])), ValueError, r"^page_table: expected a rank-2"),
    ("flash_attn_varlen_func", dict(k=torch.randn(2, 8, 2, 16), v=torch.randn(2, 8, 2, 16), cu_seqlens_k=None,
                                    page_table=_bad_cu([[0], [2]])), ValueError,
     r"^page_table: row 1, column 0 is page 2, outside \[0, 2\)"),
    ("flash_attn_varlen_func", dict(return_attn_probs=1.5), TypeError, r"^return_attn_probs: expected a bool"),
    ("flash_attn_with_kvcache", dict(page_table=_bad_cu([[4]])), ValueError, r"^page_table: 1 rows for a batch of 2"),
    ("flash_attn_with_kvcache", dict(page_table=torch.tensor([[4], [1]])), TypeError, r"^page_table: dtype must be"),
    ("flash_attn_with_kvcache", dict(num_splits=300), ValueError, r"^num_splits: must be in \[0, 256\]"),
    ("flash_attn_with_kvcache", dict(pack_gqa=2), TypeError, r"^pack_gqa: expected a bool"),
    ("flash_attn_with_kvcache", dict(sm_margin=-4), ValueError, r"^sm_margin: must be in \[0"),
    ("flash_attn_with_kvcache", dict(v=None), ValueError, r"^v: required when k is given"),
    ("flash_attn_with_kvcache", dict(return_softmax_lse="no"), TypeError, r"^return_softmax_lse: expected a bool"),
    ("flash_attn_with_kvcache", dict(q=torch.randn(2, 4, 16), k=None, v=None, cache_seqlens=-1,
                                     cu_seqlens_q=_bad_cu([0, 1, 2])), ValueError, r"^cache_seqlens: must be in \[0"),
    ("get_scheduler_metadata", dict(cache_seqlens=[3, 7]), TypeError, r"^cache_seqlens: expected a torch.Tensor"),
    ("get_scheduler_metadata", dict(batch_size=-1), ValueError, r"^batch_size: must be in \[0"),
    ("get_scheduler_metadata", dict(qkv_dtype="bf16"), TypeError, r"^qkv_dtype: expected a torch.dtype"),
]


@pytest.mark.parametrize("function,change,exc,pattern", ERRORS,
                         ids=[f"{e[0]}-{'-'.join(e[1])}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_name_the_argument(function, change, exc, pattern):
    kw = CALLS[function](**change)
    caches = [kw[n].clone() for n in ("k_cache", "v_cache") if n in kw]
    with pytest.raises(exc, match=pattern):
        getattr(fa3, function)(**kw)
    for before, n in zip(caches, ("k_cache", "v_cache")):
        assert torch.equal(kw[n], before), f"{n} was written by a rejected call"


# ---- flash_attn_combine --------------------------------------------------------------------------------------------


def combine_ref(out_partial: Tensor, lse_partial: Tensor):
    """The merge in float64: out (b, s, h, d), lse (b, s, h); rows without any finite lse: 0 and -inf."""
    o, l = out_partial.double(), lse_partial.double()
    lse = torch.logsumexp(l, dim=0) if l.shape[0] else l.new_full(l.shape[1:], NEG_INF)
    finite = torch.isfinite(lse)
    w = torch.where(finite, torch.exp(l - torch.where(finite, lse, torch.zeros_like(lse))), torch.zeros_like(l))
    out = torch.where(w[..., None] > 0, w[..., None] * o, torch.zeros_like(o)).sum(0)
    return out, lse


def combine_inputs(num_splits, b, s, h, d, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    out_partial = torch.randn(num_splits, b, s, h, d, generator=g)
    lse_partial = torch.randn(num_splits, b, s, h, generator=g) * 4
    if num_splits:
        lse_partial[torch.rand(lse_partial.shape, generator=g) < 0.3] = NEG_INF  # empty splits
        lse_partial[:, 0, 0] = NEG_INF  # rows where every split is empty
        lse_partial[:, -1, -1, 0] = NEG_INF
        lse_partial[0, -1, 0] = 80.0  # far apart: the others underflow to weight 0
        out_partial[lse_partial == NEG_INF] = float("nan")  # an empty split's partial output is never read
    return out_partial.to(device), lse_partial.to(device)


def check_combine(out, lse, out_partial, lse_partial, out_dtype=torch.float32):
    r_out, r_lse = combine_ref(out_partial.cpu(), lse_partial.cpu())
    assert out.dtype == out_dtype and out.shape == r_out.shape
    assert lse.dtype == torch.float32 and lse.shape == r_lse.shape
    assert lse.transpose(1, 2).is_contiguous()  # FA3's layout: (b, h, s) in memory
    out, lse = out.cpu().double(), lse.cpu().double()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    inf = torch.isinf(r_lse)
    assert torch.equal(torch.isinf(lse), inf) and (lse[inf] < 0).all()
    assert not out[inf].any()  # rows without keys: exactly 0
    eps = torch.finfo(out_dtype).eps
    torch.testing.assert_close(out, r_out, rtol=0, atol=4 * eps * max(1.0, r_out.abs().max().item()))
    torch.testing.assert_close(lse[~inf], r_lse[~inf], rtol=4 * torch.finfo(torch.float32).eps, atol=1e-6)


@pytest.mark.parametrize("num_splits,shape", [(1, (2, 3, 2, 8)), (3, (2, 5, 3, 16)), (7, (1, 4, 2, 5)),
                                              (0, (2, 2, 2, 4))])
def test_combine(num_splits, shape):
    out_partial, lse_partial = combine_inputs(num_splits, *shape)
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial)
    check_combine(out, lse, out_partial, lse_partial)
    if num_splits == 1:  # one split: its own (finite-lse) rows unchanged
        keep = torch.isfinite(lse_partial[0])
        assert torch.equal(out[keep], out_partial[0][keep]) and torch.equal(lse[keep], lse_partial[0][keep])


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_combine_out_and_out_dtype(out_dtype):
    out_partial, lse_partial = combine_inputs(4, 2, 3, 2, 8, seed=1)
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    check_combine(out, lse, out_partial, lse_partial, out_dtype)
    buffer = torch.full((2, 2, 3, 8), 9.0, dtype=out_dtype).transpose(1, 2)  # any strides
    got, lse2 = fa3.flash_attn_combine(out_partial, lse_partial, buffer, out_dtype)
    assert got is buffer and torch.equal(got, out) and torch.equal(lse2, lse)


def test_combine_of_key_splits_is_full_attention():
    """Attention over three key chunks (one of them empty), merged: full attention's out and lse."""
    q, k, v, _ = dense_inputs(2, 5, 12, 4, 2, 16, 16, torch.float32)
    parts = [fa3.flash_attn_func(q, k[:, a:b], v[:, a:b], return_attn_probs=True) for a, b in
             ((0, 5), (5, 5), (5, 12))]
    out_partial = torch.stack([o for o, _ in parts])
    lse_partial = torch.stack([lse.transpose(1, 2) for _, lse in parts])
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial)
    full, full_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, full_lse.transpose(1, 2), rtol=1e-5, atol=1e-5)


COMBINE_ERRORS = [
    (dict(out_partial=lambda o, l: o.half()), TypeError, r"^out_partial: dtype must be torch.float32"),
    (dict(lse_partial=lambda o, l: l.double()), TypeError, r"^lse_partial: dtype must be torch.float32"),
    (dict(out_partial=lambda o, l: o[0]), ValueError, r"^out_partial: expected a rank-5"),
    (dict(lse_partial=lambda o, l: l[..., None]), ValueError, r"^lse_partial: expected a rank-4"),
    (dict(lse_partial=lambda o, l: l[:, :1]), ValueError, r"^lse_partial: expected shape \[2, 2, 3, 2\]"),
    (dict(out_partial=lambda o, l: o.numpy()), TypeError, r"^out_partial: expected a torch.Tensor"),
    (dict(out_dtype=torch.float64), TypeError, r"^out_dtype: must be"),
    (dict(out=lambda o, l: torch.zeros(2, 3, 2, 8, dtype=torch.float16)), TypeError, r"^out: dtype"),
    (dict(out=lambda o, l: torch.zeros(2, 3, 2, 4)), ValueError, r"^out: expected shape \[2, 3, 2, 8\]"),
]


@pytest.mark.parametrize("change,exc,pattern", COMBINE_ERRORS, ids=[e[2][1:20] for e in COMBINE_ERRORS])
def test_combine_errors(change, exc, pattern):
    o, l = combine_inputs(2, 2, 3, 2, 8)
    kw = dict(out_partial=o, lse_partial=l)
    kw.update({n: (f(o, l) if callable(f) else f) for n, f in change.items()})
    with pytest.raises(exc, match=pattern):
        fa3.flash_attn_combine(**kw)


# ---- CUDA ----------------------------------------------------------------------------------------------------------


def _bf16(case):
    return case[:-1] + (torch.bfloat16 if case[-1] == torch.float32 else case[-1],)


@pytest.mark.parametrize("case", [_bf16(c) for c in DENSE_CASES], ids=lambda c: f"b{c[0]}q{c[1]}k{c[2]}")
@pytest.mark.cuda
@requires_cuda
def test_flash_attn_func_cuda(case):
    run_dense(case, "auto", device="cuda")


@pytest.mark.parametrize("case", [_bf16(c) for c in VARLEN_CASES], ids=lambda c: f"q{c[0]}u{c[1]}_k{c[2]}u{c[3]}")
@pytest.mark.cuda
@requires_cuda
def test_varlen_cuda(case):
    run_varlen(case, "auto", device="cuda")


@pytest.mark.parametrize("lengths_from", ["seqused_k", "cu_seqlens_k", "capacity"])
@pytest.mark.parametrize("case", [replace(c, dtype=torch.bfloat16) if c.dtype == torch.float32 else c
                                  for c in PAGED_CASES], ids=str)
@pytest.mark.cuda
@requires_cuda
def test_varlen_paged_cuda(case, lengths_from):
    run_paged(case, "auto", lengths_from, device="cuda", used_q=[2, 5] if len(case.lengths_q) == 2 else None)


@pytest.mark.parametrize("num_splits", [0, 1, 4])
@pytest.mark.parametrize("case", [replace(c, dtype=torch.bfloat16) if c.dtype == torch.float32 else c
                                  for c in KV_CASES if c.dtype != torch.float64], ids=str)
@pytest.mark.cuda
@requires_cuda
def test_with_kvcache_cuda(case, num_splits):
    run_kvcache(case, "auto", device="cuda", num_splits=num_splits)


@pytest.mark.parametrize("varlen_q", [False, True], ids=["padded_q", "varlen_q"])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.cuda
@requires_cuda
def test_with_kvcache_cu_seqlens_k_new_cuda(paged, varlen_q):
    test_with_kvcache_cu_seqlens_k_new("auto", paged, varlen_q, device="cuda", dtype=torch.bfloat16)


@pytest.mark.cuda
@requires_cuda
def test_fp8_on_cuda_runs_on_hopper_and_is_refused_elsewhere():
    # The FP8 kernel is Hopper's (tests/python/test_fp8_cuda.py checks its results); other GPUs name the reason.
    q, k, v = (torch.randn(2, 3, 2, 64, device="cuda").to(F8) for _ in range(3))
    if torch.cuda.get_device_capability() == (9, 0):
        out = fa3.flash_attn_func(q, k, v)
        assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 2, 64) and out.is_cuda
    else:
        with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
            fa3.flash_attn_func(q, k, v)


# d_v past the CUDA kernels' 256 (FA3's MLA shapes: d 64 with d_v 512): forwards over slices of V's columns
# (src/value_slices.h), on each CUDA backend; the backward declines naming d_v.
WIDE_V_CASES = [
    # (b, s_q, s_k, heads q, heads kv, d, d_v, causal, window, softcap, dtype)
    (2, 70, 300, 8, 1, 64, 512, True, (-1, -1), 0.0, torch.bfloat16),    # MQA, d 64, d_v 512: two slices of 256
    (1, 129, 200, 4, 2, 64, 320, False, (30, 5), 0.0, torch.float16),   # 160 + 160
    (2, 33, 77, 2, 2, 128, 264, False, (-1, -1), 5.0, torch.bfloat16),  # 136 + 128
]


@pytest.mark.parametrize("backend", ["auto", "cuda_sm80", "cuda_sm90"])
@pytest.mark.parametrize("case", WIDE_V_CASES, ids=lambda c: f"d{c[5]}-{c[6]}")
@pytest.mark.cuda
@requires_cuda
def test_wide_values_cuda(case, backend):
    if backend == "cuda_sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuda_sm90 runs on compute capability 9.0")
    b, s_q, s_k, hq, hkv, d, dv, causal, window, softcap, dtype = case
    q, k, v, _ = dense_inputs(b, s_q, s_k, hq, hkv, d, dv, dtype, device="cuda")
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                   return_attn_probs=True, backend=backend)
    host = [t.cpu() for t in (q, k, v)]
    kw = dict(causal=causal, window=window, softcap=softcap)
    r64, low = attention_ref(*host, **kw), attention_ref(*host, dtype=None, **kw)
    assert_close("out", out.cpu(), r64[0], low[0], dtype)
    assert_close("lse", lse.cpu(), r64[1], low[1], dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fa3.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap, backend=backend)
    with pytest.raises(NotImplementedError, match=rf"v: head dim {dv}: the CUDA backward takes d_v up to 256"):
        out.sum().backward()


@pytest.mark.cuda
@requires_cuda
def test_wide_values_varlen_cuda():
    seg_q, used_q, seg_k = (3, 40, 1), (3, 17, 1), (50, 90, 7)
    hq, hkv, d, dv, dtype = 4, 1, 64, 512, torch.bfloat16
    g = torch.Generator().manual_seed(23)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    q, k, v = make(sum(seg_q), hq, d), make(sum(seg_k), hkv, d), make(sum(seg_k), hkv, dv)
    out, lse = fa3.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu(seg_q, "cuda"), cu(seg_k, "cuda"),
                                          max(seg_q), max(seg_k), index_tensor(used_q, "cuda"), causal=True,
                                          return_attn_probs=True)
    refs = [used_ref(q, k, v, cu(seg_q).tolist(), cu(seg_k).tolist(), used_q, seg_k, causal=True, dtype=dt)
            for dt in (torch.float64, None)]
    assert_close("out", out.cpu(), refs[0][0], refs[1][0], dtype)
    assert_close("lse", lse.cpu(), refs[0][1], refs[1][1], dtype)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("case", [
    KVCase(2, 1, 1, (37, 300), page=16, heads=(16, 1), d=64, d_v=512, causal=True, dtype=torch.bfloat16),
    KVCase(2, 4, 2, (0, 130), rotary=0.5, interleaved=False, heads=(8, 2), d=64, d_v=320, dtype=torch.float16),
], ids=str)
@pytest.mark.cuda
@requires_cuda
def test_wide_values_with_kvcache_cuda(case, num_splits):
    run_kvcache(case, "auto", device="cuda", num_splits=num_splits)


@pytest.mark.cuda
@requires_cuda
def test_qv_on_cuda_is_refused_naming_it():
    q, k, v, _ = dense_inputs(1, 3, 4, 2, 2, 64, 64, torch.bfloat16, device="cuda")
    qv = qv_like(q, 64)
    with pytest.raises(NotImplementedError, match=r"^qv: .*CPU backends"):
        fa3.flash_attn_func(q, k, v, qv=qv)
    kc, vc = k.clone(), v.clone()
    with pytest.raises(NotImplementedError, match=r"^qv: .*CPU backends"):
        fa3.flash_attn_with_kvcache(q, kc, vc, k[:, :1], v[:, :1], qv, cache_seqlens=2)
    assert torch.equal(kc, k) and torch.equal(vc, v)  # nothing appended by the refused call


@pytest.mark.cuda
@requires_cuda
def test_combine_cuda():
    for num_splits, shape in ((3, (2, 5, 3, 16)), (1, (1, 4, 2, 128)), (9, (3, 7, 4, 64))):
        out_partial, lse_partial = combine_inputs(num_splits, *shape, device="cuda")
        for out_dtype in (None, torch.bfloat16):
            out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
            assert out.device.type == "cuda" and lse.device.type == "cuda"
            check_combine(out, lse, out_partial, lse_partial, out_dtype or torch.float32)
