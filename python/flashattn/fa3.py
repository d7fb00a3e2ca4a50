"""FlashAttention-3's Python API over flashattn: the functions of FA3's ``flash_attn_interface`` module with the
same names, positional order, defaults and return values, so that code written for FA3 moves with one import::

    from flashattn.fa3 import flash_attn_func       # was: from flash_attn_interface import flash_attn_func

Written against Dao-AILab/flash-attention commit 0251105a2fb19d2957484b7f023cd8c115286ced (2026-08-15),
hopper/flash_attn_interface.py (package flash_attn_3 3.0.0). The semantics are those of flashattn's flash_attn 2
API (``flashattn.flash_attn_interface``), which FA3 shares: layouts [batch, seqlen, heads, dim] or, varlen,
[total, heads, dim] with int32 cu_seqlens; causal masks and windows aligned bottom-right; a row that sees no key
gives zeros (lse -inf); GQA / MQA; softcap > 0 applies softcap * tanh(s / softcap); softmax_scale defaults to
1 / sqrt(headdim).

Return values, as in that FA3 version: flash_attn_func / flash_attn_varlen_func / flash_attn_qkvpacked_func return
out, or (out, softmax_lse) with return_attn_probs=True (softmax_lse (batch, nheads, seqlen_q), varlen (nheads,
total_q), fp32, natural log). flash_attn_with_kvcache returns out, or with return_softmax_lse=True the 4-tuple
(out, softmax_lse, out_accum, softmax_lse_accum) of FA3's forward; out_accum and softmax_lse_accum are FA3's
split-KV scratch buffers and here are always empty fp32 tensors (what FA3 returns when it does not split): the
partials of flashattn's split kernel stay internal, and out / softmax_lse are already combined.
flash_attn_combine returns (out, softmax_lse) with softmax_lse (batch, seqlen, nheads).

Arguments, supported or not (nothing that could change a result is ever ignored):

* Raise NotImplementedError naming the argument unless left at the default: ``scheduler_metadata`` (None only;
  get_scheduler_metadata returns None, see there). In flash_attn_varlen_func a None ``cu_seqlens_q`` (batched
  queries), and a None ``cu_seqlens_k`` without page_table, raise too.
* ``qv`` (DeepSeek MLA's absorbed attention: (batch, seqlen_q, nheads, headdim_v), varlen (total_q, nheads,
  headdim_v), q's dtype): each score becomes softmax_scale * (q . k + qv . v), softmax_scale defaulting to
  1 / sqrt(headdim + headdim_v), as in FA3; in flash_attn_with_kvcache qv is not rotated. On the CPU backends so far
  (CUDA tensors raise NotImplementedError naming qv), forward only as in FA3 (a backward through autograd raises
  NotImplementedError), not with float8_e4m3fn inputs (FA3 neither).
* ``attention_chunk`` > 0 (chunked local attention, as in Llama 4): the keys are cut into chunks of that many
  ([0, c), [c, 2c), ..., counted from the first key; in flash_attn_with_kvcache from cache_leftpad) and a query row
  sees only the keys of the chunk holding its bottom-right aligned diagonal, within causal and the window when
  given (FA3's semantics). Forward (FP8 too) and backward (which FA3 lacks) on every backend.
* FP8: float8_e4m3fn q, k, v in flash_attn_func / flash_attn_qkvpacked_func / flash_attn_varlen_func run the FP8
  forward, each scaled by its optional fp32 ``q_descale`` / ``k_descale`` / ``v_descale`` (batch, nheads_k), out
  in bfloat16; forward only: CUDA tensors run the Hopper FP8 kernel (compute capability 9.0; other GPUs report it
  unsupported), CPU tensors the CPU backends. Inputs that require grad run the forward too (as in FA3); the
  backward through autograd raises NotImplementedError naming flashattn.fp8_attention_backward, which gives 16-bit
  gradients. flash_attn_varlen_func takes seqused_q / seqused_k with them. Descales with other dtypes raise
  ValueError (FA3 ignores them there). FP8 KV caches (flash_attn_with_kvcache) run on the CPU backends and on the
  CUDA decode kernel, with rotary too (e4m3 tables; rows rotated in fp32 and stored back in e4m3 as FA3's kernels
  do).
* Scheduling hints, validated and then not used, because they cannot change flashattn's results: ``pack_gqa``
  (None / True / False; flashattn's decode kernel always packs a KV head's query heads into the rows of one tile,
  the other kernels choose their own tiling), ``sm_margin`` (an int >= 0: FA3 leaves that many SMs idle for
  concurrent kernels; flashattn's launches do not depend on it, so the results are bitwise those of sm_margin=0;
  only the overlap with other kernels may differ) and, in flash_attn_func / flash_attn_varlen_func and the paged
  varlen path, ``num_splits`` (flashattn's regular forward has no key splits and its paged varlen path chooses
  them itself: every value gives the same bits). flash_attn_with_kvcache passes ``num_splits`` to the decode
  kernel (<= 0: chosen from the shape, as in FA3; at most 256).
* ``deterministic`` goes to the backward. flash_attn_func, flash_attn_qkvpacked_func and flash_attn_varlen_func
  without page_table support autograd (dq, dk, dv); flash_attn_with_kvcache and the paged path are inference only,
  as in FA3.
* ``seqused_q`` / ``seqused_k`` (flash_attn_varlen_func): sequence b uses the first seqused[b] rows of its packed
  segment [cu_seqlens[b], cu_seqlens[b + 1]), which must hold them (FA3 does not check). The used rows are gathered
  into a compact packing (a copy, differentiable), attended, and the output scattered back: rows past seqused_q
  give out 0 and lse -inf (FA3 leaves them unwritten) and get zero gradients. This reads cu_seqlens and seqused on
  the host, a synchronisation on CUDA (the varlen path validates cu_seqlens on the host anyway).

Extensions, keyword-only: ``page_table`` in flash_attn_varlen_func (a paged KV cache as in flash_attn_with_kvcache:
k / v (num_pages, page_size, nheads_k, headdim), key lengths from seqused_k, else cu_seqlens_k, else the table's
whole capacity; FA3's hopper interface has no such argument); ``backend`` and ``num_threads`` everywhere (as in
flashattn's flash_attn 2 API) and ``check_index_values`` in flash_attn_with_kvcache. As in that API, float32 and
float64 inputs work too, and the page size may be anything.
"""

from __future__ import annotations

import operator
from typing import Optional, Union

import torch
from torch import Tensor

from ._ops import (INT32_MAX, _check_index, _check_rank, _check_tensor, _renamed, check_chunk, check_flag,
                   check_integer, fp8_attention, kvcache_attention)
from .flash_attn_interface import _run, _run_paged, _softcap, _split, _window

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "flash_attn_combine",
    "get_scheduler_metadata",
]

# The library's argument names in error messages, as an FA3 caller knows them.
_FA3_NAMES = {"k_new": "k", "v_new": "v", "block_table": "page_table"}


# ---- arguments -----------------------------------------------------------------------------------------------------


def _require_none(name: str, value, what: str) -> None:
    if value is not None:
        raise NotImplementedError(f"{name}: {what} is not supported by flashattn; pass None")


def _scheduling_hints(num_splits, pack_gqa, sm_margin) -> int:
    """Validates the hints that do not change results; returns num_splits in flashattn's terms (0 = automatic)."""
    try:
        splits = operator.index(num_splits)
    except TypeError:
        raise TypeError(f"num_splits: expected an integer, got {type(num_splits).__name__} {num_splits!r}") from None
    if pack_gqa is not None:
        check_flag("pack_gqa", pack_gqa)
    check_integer("sm_margin", sm_margin, 0, INT32_MAX)
    return max(splits, 0)  # FA3: num_splits <= 0 picks the count from the shape


def _max_seqlen(value):
    return 0 if value is None else value  # 0: read off cu_seqlens


def _lse_result(out: Tensor, lse: Tensor, return_lse: bool):
    return (out, lse) if return_lse else out


# ---- FP8 -----------------------------------------------------------------------------------------------------------


def _is_fp8(*tensors) -> bool:
    return any(isinstance(t, Tensor) and t.dtype == torch.float8_e4m3fn for t in tensors)


def _no_descales(q, q_descale, k_descale, v_descale) -> None:
    """Descales scale float8 inputs only; with any other dtype they would be ignored (as FA3 ignores them), so
    they are refused."""
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            dtype = q.dtype if isinstance(q, Tensor) else type(q).__name__
            raise ValueError(f"{name}: descale factors go with float8_e4m3fn q, k, v; q is {dtype}")


def _fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale, v_descale,
         softmax_scale, causal, window_size, softcap, backend, num_threads, attention_chunk):
    """FA3's FP8 forward: float8_e4m3fn q, k, v with their descales; out in bfloat16 (FA3's output dtype)."""
    left, right = _window(window_size)
    return fp8_attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, q_descale=q_descale,
                         k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
                         window_left=left, window_right=right, softcap=_softcap(softcap), backend=backend,
                         num_threads=num_threads, attention_chunk=attention_chunk)


# ---- flash_attn_func, flash_attn_qkvpacked_func --------------------------------------------------------------------


def _no_fp8_qv(qv) -> None:
    _require_none("qv", qv, "qv with float8_e4m3fn inputs (as in FA3)")


def _dense(q, k, v, softmax_scale, causal, window_size, attention_chunk, softcap, deterministic, return_attn_probs,
           backend, num_threads, descales=(None, None, None), qv=None):
    return_attn_probs = check_flag("return_attn_probs", return_attn_probs)
    if _is_fp8(q, k, v):
        _no_fp8_qv(qv)
        out, lse = _fp8(q, k, v, None, None, 0, 0, *descales, softmax_scale, causal, window_size, softcap, backend,
                        num_threads, attention_chunk)
        return _lse_result(out, lse, return_attn_probs)
    _no_descales(q, *descales)
    out, lse, _ = _run(q, k, v, None, None, 0, 0, 0.0, softmax_scale, causal, window_size, softcap, None,
                       deterministic, True, backend, num_threads, attention_chunk=attention_chunk, qv=qv)
    return _lse_result(out, lse, return_attn_probs)


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
):
    """Attention over q (batch, seqlen_q, nheads, headdim), k / v (batch, seqlen_k, nheads_k, headdim[_v]).

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse (batch, nheads, seqlen_q)) with
    return_attn_probs=True. Differentiable in q, k, v. float8_e4m3fn q, k, v (all three) run FA3's FP8 forward:
    each scaled by its optional fp32 descale (batch, nheads_k), out in bfloat16, forward only (module docstring).
    num_splits, pack_gqa and sm_margin are hints that do not change the result (module docstring). qv (batch,
    seqlen_q, nheads, headdim_v): scores softmax_scale * (q . k + qv . v), forward only, CPU backends (module
    docstring). attention_chunk > 0: chunked attention (module docstring).
    """
    _scheduling_hints(num_splits, pack_gqa, sm_margin)
    return _dense(q, k, v, softmax_scale, causal, window_size, attention_chunk, softcap, deterministic,
                  return_attn_probs, backend, num_threads, (q_descale, k_descale, v_descale), qv)


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
):
    """flash_attn_func with qkv packed as (batch, seqlen, 3, nheads, headdim), or as (batch, seqlen, num_heads_q +
    2 * nheads_k, headdim) with num_heads_q given (q's heads first, then k's, then v's: GQA / MQA)."""
    _scheduling_hints(1, None, sm_margin)
    if isinstance(qkv, Tensor) and qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError("num_heads_q: required when qkv is rank 4 (batch, seqlen, nheads_q + 2 * nheads_k, "
                             "headdim)")
        heads_q = check_integer("num_heads_q", num_heads_q, 1, INT32_MAX)
        heads_k, odd = divmod(qkv.shape[2] - heads_q, 2)
        if heads_k < 1 or odd:
            raise ValueError(f"num_heads_q: {heads_q} leaves {qkv.shape[2] - heads_q} of qkv's {qkv.shape[2]} "
                             "heads (dim 2) for k and v, which needs a positive even number")
        q, k, v = qkv.split([heads_q, heads_k, heads_k], dim=2)
    else:
        q, k, v = _split("qkv", qkv, 2, 3, "batch, seqlen, 3, nheads, headdim")
    return _dense(q, k, v, softmax_scale, causal, window_size, attention_chunk, softcap, deterministic,
                  return_attn_probs, backend, num_threads, (q_descale, k_descale, v_descale))


# ---- flash_attn_varlen_func ----------------------------------------------------------------------------------------


def _used_rows(cu_name: str, cu_seqlens, used_name: str, seqused, rows: int, device):
    """The packed rows that seqused selects: (their indices, int64, and the cu_seqlens of their compact packing,
    int32), both on `device`. cu_seqlens and seqused are read on the host and checked there."""
    for name, t in ((cu_name, cu_seqlens), (used_name, seqused)):
        _check_index(name, t)
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, expected q's device {device}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"{cu_name}: expected a rank-1 tensor of batch + 1 >= 1 entries, got shape "
                         f"{list(cu_seqlens.shape)}")
    batch = cu_seqlens.shape[0] - 1
    if tuple(seqused.shape) != (batch,):
        raise ValueError(f"{used_name}: expected shape [{batch}] (one length per sequence of {cu_name}), got "
                         f"{list(seqused.shape)}")
    cu, used = cu_seqlens.tolist(), seqused.tolist()
    if cu[0] != 0:
        raise ValueError(f"{cu_name}: must start at 0, got {cu[0]}")
    if cu[-1] != rows:
        raise ValueError(f"{cu_name}: last entry {cu[-1]} does not match the packed row count {rows}")
    for b in range(batch):
        length = cu[b + 1] - cu[b]
        if length < 0:
            raise ValueError(f"{cu_name}: must be non-decreasing, but entry {b + 1} ({cu[b + 1]}) < entry {b} "
                             f"({cu[b]})")
        if not 0 <= used[b] <= length:
            raise ValueError(f"{used_name}[{b}] = {used[b]}: outside [0, {length}], the rows of sequence {b} in "
                             f"{cu_name}")
    lengths = torch.tensor(used, dtype=torch.int64)
    compact = torch.zeros(batch + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=compact[1:])
    # row i of sequence b (compact offset compact[b]) sits at cu[b] + i of the packing
    shift = torch.repeat_interleave(torch.tensor(cu[:-1], dtype=torch.int64) - compact[:-1], lengths)
    index = torch.arange(int(compact[-1]), dtype=torch.int64) + shift
    return index.to(device), compact.to(torch.int32).to(device)


def _select_rows(t: Tensor, rows: Tensor) -> Tensor:
    """t's packed rows `rows` (a differentiable copy); float8 tensors through their bytes, which every device's
    index_select takes."""
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).index_select(0, rows).view(t.dtype)
    return t.index_select(0, rows)


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, page_table,
                  softmax_scale, causal, window_size, attention_chunk, softcap, deterministic, backend, num_threads,
                  qv=None):
    """The paged path of flashattn's flash_attn_varlen_func, with FA3's names and its default key lengths."""
    _check_index("page_table", page_table)
    if page_table.dim() != 2:
        raise ValueError(f"page_table: expected a rank-2 int32 tensor [batch, max_pages_per_seq], got shape "
                         f"{list(page_table.shape)}")
    _check_index("cu_seqlens_q", cu_seqlens_q)
    if seqused_k is None and cu_seqlens_k is None and cu_seqlens_q.dim() == 1 and cu_seqlens_q.shape[0] >= 1 \
            and isinstance(k, Tensor) and k.dim() == 4:
        # FA3: without seqused_k / cu_seqlens_k every sequence uses its table's whole capacity
        seqused_k = torch.full((cu_seqlens_q.shape[0] - 1,), page_table.shape[1] * k.shape[1], dtype=torch.int32,
                               device=page_table.device)
    try:
        out, lse, _ = _run_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                 softmax_scale, causal, window_size, softcap, None, deterministic, True, page_table,
                                 seqused_k, backend, num_threads, attention_chunk=attention_chunk, qv=qv)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise _renamed(e, _FA3_NAMES) from None
    return out, lse


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    *,
    page_table=None,
    backend: str = "auto",
    num_threads: int = 0,
):
    """Attention over packed sequences: q (total_q, nheads, headdim), k / v (total_k, nheads_k, headdim[_v]),
    cu_seqlens_q / cu_seqlens_k int32 (batch + 1,), max_seqlen_q / max_seqlen_k bounds (None: read off cu_seqlens).

    seqused_q / seqused_k, int32 (batch,): the rows of each segment in use (module docstring). page_table
    (keyword-only extension, inference only): k / v are a paged cache (num_pages, page_size, nheads_k,
    headdim[_v]), sequence b's keys the first seqused_k[b] (else cu_seqlens_k[b + 1] - cu_seqlens_k[b], else
    max_pages_per_seq * page_size) rows of its pages.

    Returns out (total_q, nheads, headdim_v), or (out, softmax_lse (nheads, total_q)) with return_attn_probs=True.
    Differentiable in q, k, v without page_table and qv. qv (total_q, nheads, headdim_v): module docstring.
    """
    _scheduling_hints(num_splits, pack_gqa, sm_margin)
    return_attn_probs = check_flag("return_attn_probs", return_attn_probs)
    fp8 = _is_fp8(q, k, v)
    if fp8:
        _no_fp8_qv(qv)
        _require_none("page_table", page_table, "float8_e4m3fn inputs with page_table")
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise NotImplementedError("cu_seqlens_q: float8_e4m3fn varlen inputs need cu_seqlens_q and cu_seqlens_k")
    else:
        _no_descales(q, q_descale, k_descale, v_descale)
    if cu_seqlens_q is None:
        raise NotImplementedError("cu_seqlens_q: None (batched queries (batch, seqlen_q, nheads, headdim)) is not "
                                  "supported by flashattn's flash_attn_varlen_func; pass cu_seqlens_q, or use "
                                  "flash_attn_func / flash_attn_with_kvcache")
    if cu_seqlens_k is None and page_table is None:
        raise NotImplementedError("cu_seqlens_k: None (batched keys (batch, seqlen_k, nheads_k, headdim)) is not "
                                  "supported by flashattn without page_table; pass cu_seqlens_k")
    max_seqlen_q, max_seqlen_k = _max_seqlen(max_seqlen_q), _max_seqlen(max_seqlen_k)
    q_rows = None
    if seqused_q is not None:
        _check_tensor("q", q, floating=not fp8)
        _check_rank("q", q, True)
        q_rows, cu_seqlens_q = _used_rows("cu_seqlens_q", cu_seqlens_q, "seqused_q", seqused_q, q.shape[0],
                                          q.device)
        q_all, q = q, _select_rows(q, q_rows)
        if qv is not None:
            _check_tensor("qv", qv)
            _check_rank("qv", qv, True)
            if qv.shape[0] != q_all.shape[0]:
                raise ValueError(f"qv: expected {q_all.shape[0]} rows (dim 0) like q, got shape {list(qv.shape)}")
            qv = _select_rows(qv, q_rows)
    if page_table is not None:
        out, lse = _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                 page_table, softmax_scale, causal, window_size, attention_chunk, softcap,
                                 deterministic, backend, num_threads, qv)
    else:
        if seqused_k is not None:
            for name, t in (("q", q), ("k", k), ("v", v)):
                _check_tensor(name, t, floating=not fp8)
                _check_rank(name, t, True)
            k_rows, cu_seqlens_k = _used_rows("cu_seqlens_k", cu_seqlens_k, "seqused_k", seqused_k, k.shape[0],
                                              q.device)
            k, v = _select_rows(k, k_rows), _select_rows(v, k_rows)
        if fp8:
            out, lse = _fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale, k_descale,
                            v_descale, softmax_scale, causal, window_size, softcap, backend, num_threads,
                            attention_chunk)
        else:
            out, lse, _ = _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, softmax_scale,
                               causal, window_size, softcap, None, deterministic, True, backend, num_threads,
                               attention_chunk=attention_chunk, qv=qv)
    if q_rows is not None:  # back to the caller's packing: unused rows give 0 (lse -inf), and no gradient
        rows = q_all.shape[0]
        out = out.new_zeros((rows, *out.shape[1:])).index_copy(0, q_rows, out)
        lse = lse.new_full((lse.shape[0], rows), float("-inf")).index_copy(1, q_rows, lse)
    return _lse_result(out, lse, return_attn_probs)


# ---- flash_attn_with_kvcache ---------------------------------------------------------------------------------------


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    check_index_values: bool = True,
):
    """Attention of q over a KV cache, appending k / v to it in place first (flashattn's flash_attn_with_kvcache
    semantics: dense or paged caches of any page size, rotary on the appended keys and on q, cache_batch_idx,
    cache_leftpad, causal / window / softcap, GQA).

    q (batch, seqlen_q, nheads, headdim), or varlen (total_q, nheads, headdim) with cu_seqlens_q int32 (batch + 1,)
    and max_seqlen_q (None: read off cu_seqlens_q). k_cache / v_cache (batch_cache, seqlen_cache, nheads_k,
    headdim[_v]), or with page_table int32 (batch, max_pages_per_seq) (num_pages, page_size, nheads_k, headdim[_v]).
    cache_seqlens: int32 (batch,) or an int (one length for every sequence), the rows in use before appending
    (None: all of them). k / v (batch, seqlen_new, nheads_k, headdim[_v]) are appended at cache_seqlens, or, with
    cu_seqlens_k_new int32 (batch + 1,), k / v (total_new, nheads_k, headdim[_v]) hold each sequence's new rows
    packed. rotary_seqlens int32 (batch,): the rotary positions' base (q row i at base + i when causal or
    windowed, else base; new row i at base + i) instead of cache_seqlens.

    Returns out (batch, seqlen_q, nheads, headdim_v) (varlen: (total_q, nheads, headdim_v)), or with
    return_softmax_lse=True (out, softmax_lse, out_accum, softmax_lse_accum): softmax_lse (batch, nheads,
    seqlen_q) (varlen: (nheads, total_q)) fp32, the last two empty fp32 tensors (module docstring). Inference only:
    the outputs do not require grad. scheduler_metadata raises NotImplementedError. qv (batch, seqlen_q, nheads,
    headdim_v) (varlen: (total_q, nheads, headdim_v)), not rotated: module docstring. attention_chunk > 0:
    chunked attention over the cache's keys (counted from cache_leftpad), q rotated per row as under a window.
    FP8: float8_e4m3fn q, k_cache, v_cache (and k, v) with q_descale / k_descale / v_descale fp32 (batch, nheads_k)
    give a bfloat16 out; the CPU backends and the CUDA decode kernel run it, rotary too (e4m3 tables). The descales
    with any other dtype raise ValueError.
    check_index_values: as in flashattn.flash_attn_with_kvcache.
    """
    fp8 = _is_fp8(q)
    if fp8:
        _no_fp8_qv(qv)
    else:
        _no_descales(q, q_descale, k_descale, v_descale)
    _require_none("scheduler_metadata", scheduler_metadata, "a precomputed FA3 schedule (scheduler_metadata)")
    splits = _scheduling_hints(num_splits, pack_gqa, sm_margin)
    return_softmax_lse = check_flag("return_softmax_lse", return_softmax_lse)  # before the caches are written
    left, right = _window(window_size)
    out, lse = kvcache_attention(
        q, k_cache, v_cache, k_new=k, v_new=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        block_table=page_table, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=_max_seqlen(max_seqlen_q),
        softmax_scale=softmax_scale, causal=causal, window_left=left, window_right=right, softcap=_softcap(softcap),
        rotary_interleaved=rotary_interleaved, num_splits=splits, cu_seqlens_k_new=cu_seqlens_k_new,
        rotary_seqlens=rotary_seqlens, backend=backend, num_threads=num_threads,
        check_index_values=check_index_values, names=_FA3_NAMES, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, out_dtype=torch.bfloat16 if fp8 else None, attention_chunk=attention_chunk, qv=qv)
    if not return_softmax_lse:
        return out
    out_accum, lse_accum = (torch.empty(0, dtype=torch.float32, device=out.device) for _ in range(2))
    return out, lse, out_accum, lse_accum


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3 precomputes its split-KV schedule here for flash_attn_with_kvcache(scheduler_metadata=...). flashattn's
    decode kernel plans its own launch on every call, so there is nothing to precompute: this returns None, which
    flash_attn_with_kvcache accepts as scheduler_metadata (FA3's own default), so FA3 code passing this function's
    result along runs unchanged with the same results. The arguments are checked."""
    check_chunk(attention_chunk)
    _scheduling_hints(num_splits, pack_gqa, sm_margin)
    for name, value in (("batch_size", batch_size), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k),
                        ("num_heads_q", num_heads_q), ("num_heads_kv", num_heads_kv), ("headdim", headdim),
                        ("max_seqlen_k_new", max_seqlen_k_new)):
        check_integer(name, value, 0, INT32_MAX)
    if not isinstance(cache_seqlens, Tensor):
        raise TypeError(f"cache_seqlens: expected a torch.Tensor, got {type(cache_seqlens).__name__}")
    for name, t in (("cache_seqlens", cache_seqlens), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k_new", cu_seqlens_k_new), ("cache_leftpad", cache_leftpad)):
        _check_index(name, t)
    if not isinstance(qkv_dtype, torch.dtype):
        raise TypeError(f"qkv_dtype: expected a torch.dtype, got {type(qkv_dtype).__name__} {qkv_dtype!r}")
    for name, value in (("headdim_v", headdim_v), ("page_size", page_size)):
        if value is not None:
            check_integer(name, value, 1, INT32_MAX)
    _window(window_size)
    check_flag("causal", causal)
    check_flag("has_softcap", has_softcap)
    return None


# ---- flash_attn_combine --------------------------------------------------------------------------------------------

_COMBINE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merges split-KV partial results: out_partial (num_splits, batch, seqlen, nheads, headdim) fp32 and
    lse_partial (num_splits, batch, seqlen, nheads) fp32 (each split's output normalised over its own keys, and
    their log-sum-exp). softmax_lse = log(sum_s exp(lse_s)) and out = sum_s exp(lse_s - softmax_lse) * out_s, in
    fp32; a split whose weight is 0 (lse -inf) contributes nothing, whatever its out_partial holds; a row where
    every split's lse is -inf gives out 0 and softmax_lse -inf.

    Returns (out, softmax_lse): out (batch, seqlen, nheads, headdim) in out_dtype (None: fp32; fp16 / bf16 too),
    written into `out` when given (same shape and dtype; any strides) and returned; softmax_lse (batch, seqlen,
    nheads) fp32 (a transposed view of a (batch, nheads, seqlen) tensor, as in FA3). Computed with torch ops on the
    inputs' device, for any number of splits (FA3's kernel: at most 256); num_splits = 0 gives 0 / -inf.
    """
    for name, t, rank, layout in (("out_partial", out_partial, 5, "num_splits, batch, seqlen, nheads, headdim"),
                                  ("lse_partial", lse_partial, 4, "num_splits, batch, seqlen, nheads")):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: dtype must be torch.float32, got {t.dtype}")
        if t.dim() != rank:
            raise ValueError(f"{name}: expected a rank-{rank} tensor [{layout}], got shape {list(t.shape)}")
    if lse_partial.shape != out_partial.shape[:4]:
        raise ValueError(f"lse_partial: expected shape {list(out_partial.shape[:4])} (out_partial's first four "
                         f"dims), got {list(lse_partial.shape)}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial: on {lse_partial.device}, out_partial on {out_partial.device}")
    if out_dtype is None:
        out_dtype = out_partial.dtype
    elif out_dtype not in _COMBINE_OUT_DTYPES:
        raise TypeError(f"out_dtype: must be torch.float32, torch.float16 or torch.bfloat16, got {out_dtype!r}")
    if out is not None:
        if not isinstance(out, Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        if out.dtype != out_dtype:
            raise TypeError(f"out: dtype {out.dtype} differs from out_dtype {out_dtype}")
        if out.shape != out_partial.shape[1:]:
            raise ValueError(f"out: expected shape {list(out_partial.shape[1:])}, got {list(out.shape)}")
        if out.device != out_partial.device:
            raise ValueError(f"out: on {out.device}, out_partial on {out_partial.device}")
    num_splits, batch, seqlen, heads = lse_partial.shape
    if num_splits == 0:
        lse_max = lse_partial.new_full((batch, seqlen, heads), float("-inf"))
    else:
        lse_max = lse_partial.amax(dim=0)
    # A finite reference point (0 for rows with no finite lse, whose weights are all 0 then), so that no
    # inf - inf appears.
    shift = torch.where(torch.isfinite(lse_max), lse_max, torch.zeros_like(lse_max))
    scale = torch.exp(lse_partial - shift)  # [splits, b, s, h]
    total = scale.sum(dim=0)
    lse = torch.log(total) + shift  # log(0) = -inf for rows without keys
    weight = torch.where(total > 0, scale / torch.where(total > 0, total, torch.ones_like(total)),
                         torch.zeros_like(scale))
    w = weight.unsqueeze(-1)
    merged = torch.where(w > 0, w * out_partial, torch.zeros_like(out_partial)).sum(dim=0)
    if out is None:
        out = merged.to(out_dtype)
    else:
        out.copy_(merged)
    # FA3's layout: (batch, nheads, seqlen) in memory, seen as (batch, seqlen, nheads)
    softmax_lse = lse.permute(0, 2, 1).contiguous().transpose(1, 2)
    return out, softmax_lse
