"""The flash_attn 2 API over flashattn: same function names, argument order, defaults and return values.

Switching is one import line::

    from flashattn import flash_attn_func            # was: from flash_attn import flash_attn_func

Layout [batch, seqlen, heads, dim] (varlen: [total, heads, dim] with int32 cu_seqlens). Causal masks and sliding
windows are aligned to the bottom-right corner of the score matrix, as in flash_attn >= 2.1: query i sees keys j
with i + s_k - s_q - window_size[0] <= j <= i + s_k - s_q + window_size[1] (and j <= i + s_k - s_q if causal);
a row that sees no key gives zeros. Multi-/grouped-query attention: k and v may have fewer heads than q.

KV cache: flash_attn_with_kvcache (dense or paged caches of any page size, cache_seqlens, new k / v appended in
place with rotary, cache_batch_idx, cache_leftpad, GQA, causal / window / softcap, num_splits, the lse), and
flash_attn_varlen_func(..., block_table=...) over a paged cache (vLLM style: the key lengths from cu_seqlens_k, or
from the keyword `seqused_k`, vLLM's, when cu_seqlens_k is None). Both are inference only, as in flash_attn: the
paged varlen call raises NotImplementedError when an input requires grad (with grad mode on) instead of returning
an output without gradients; flash_attn_with_kvcache returns outputs that do not require grad, like flash_attn's.

ALiBi: alibi_slopes (float32, (nheads,) or (batch, nheads)) adds -slope * |i + s_k - s_q - j| to query i's score for
key j, with or without causal / window / softcap, varlen and KV caches, forward and backward (no gradient for the
slopes). Under causal, flash_attn's kernels add slope * j instead, the same softmax (a per-row constant), so outputs
and gradients agree, but their softmax_lse is shifted by that constant; ours is the log-sum-exp of the scores as
defined here.

Dropout: dropout_p in [0, 1) drops probabilities before P V and scales the kept ones by 1 / (1 - dropout_p), as
flash_attn; the backward regenerates the forward's mask (never stored) from a counter-based generator (Philox
4x32-10) keyed by a seed drawn from torch's default generator of the inputs' device, or from the keyword-only
`generator`, so torch.manual_seed(s) makes a call reproducible and every call draws a fresh mask. On CUDA it runs
on the same kernels as a call without dropout (cuda_sm90 on Hopper, cuda_sm80 elsewhere). Inside CUDA-graph capture
and torch.compile (fullgraph=True included) the seed is drawn on the device by torch.randint from the same generator
into a small tensor the kernels read, so every graph replay draws a fresh mask and its backward the same one. The
mask is flashattn's own (not flash_attn's bit pattern); return_attn_probs gives no S_dmask.

Differences, all explicit: return_attn_probs=True returns
(out, softmax_lse, None) since the probabilities are never materialised; float32 and float64 inputs work too (not
only float16 / bfloat16); the paged block size may be anything (flash_attn needs a multiple of 256 with
flash_attn_with_kvcache); rotary_dim needs to be even only (flash_attn: a multiple of 16); an int cache_seqlens
gives one length per sequence of q's batch, on q's device (flash_attn: k_cache's dim 0); seqused_k without
block_table raises NotImplementedError. Keyword-only extras: `backend` (force a backend by name, "auto"
dispatches) and `num_threads` (CPU backends, 0 = all cores).
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._ops import (INT64_MAX, _check_index, _check_tensor, attention, check_flag, check_integer, check_real,
                   kvcache_attention)

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]


def check_dropout(dropout_p) -> float:
    if dropout_p is None:
        raise ValueError("dropout_p: must be in [0, 1), got None")
    p = check_real("dropout_p", dropout_p)
    if not 0.0 <= p < 1.0:  # NaN fails this too
        raise ValueError(f"dropout_p: must be in [0, 1), got {dropout_p}")
    return p


def _window(window_size: Sequence[int]) -> Tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair (left, right), got {window_size!r}") from None
    try:
        left, right = operator.index(left), operator.index(right)
    except TypeError:
        raise TypeError(f"window_size: expected a pair of integers, got {window_size!r}") from None
    # flash_attn treats every negative size as unbounded.
    return (-1 if left < 0 else left), (-1 if right < 0 else right)


def _softcap(softcap: float) -> float:
    cap = check_real("softcap", softcap)
    if cap != cap:
        raise ValueError(f"softcap: must be a number, got {softcap}")
    # flash_attn: anything <= 0 turns soft-capping off.
    return cap if cap > 0 else 0.0


def _result(out: Tensor, lse: Tensor, return_attn_probs: bool):
    return (out, lse, None) if check_flag("return_attn_probs", return_attn_probs) else out


def _split(name: str, packed: Tensor, dim: int, count: int, layout: str):
    if not isinstance(packed, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != len(layout.split(",")) or packed.shape[dim] != count:
        raise ValueError(f"{name}: expected shape [{layout}], got {list(packed.shape)}")
    # Views, no copy; autograd stacks the gradients back into the packed layout.
    return packed.unbind(dim)


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
         window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads, generator=None,
         attention_chunk=0, qv=None):
    dropout_p = check_dropout(dropout_p)
    left, right = _window(window_size)
    out, lse = attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal, window_left=left,
                         window_right=right, softcap=_softcap(softcap), alibi_slopes=alibi_slopes,
                         dropout_p=dropout_p, generator=generator, deterministic=deterministic, backend=backend,
                         num_threads=num_threads, attention_chunk=attention_chunk, qv=qv)
    return _result(out, lse, return_attn_probs)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """Attention over q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim[_v]).

    Returns out (batch, seqlen_q, nheads, headdim_v); with return_attn_probs=True, (out, softmax_lse, None) where
    softmax_lse (batch, nheads, seqlen_q) is the fp32 natural-log log-sum-exp of each row of scaled scores.
    softmax_scale defaults to 1 / sqrt(headdim); softcap > 0 applies softcap * tanh(scores / softcap);
    alibi_slopes (float32 (nheads,) or (batch, nheads)) adds -slope * |i + seqlen_k - seqlen_q - j|.
    """
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads, generator)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """flash_attn_func with qkv packed as (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _split("qkv", qkv, 2, 3, "batch, seqlen, 3, nheads, headdim")
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads, generator)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """flash_attn_func with q (batch, seqlen_q, nheads, headdim) and kv packed as (batch, seqlen_k, 2, nheads_k,
    headdim)."""
    k, v = _split("kv", kv, 2, 2, "batch, seqlen, 2, nheads_k, headdim")
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads, generator)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_k=None,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """Attention over packed sequences: q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim[_v]),
    cu_seqlens_q / cu_seqlens_k int32 (batch + 1,) cumulative lengths, max_seqlen_q / max_seqlen_k bounds.

    Paged KV cache (block_table int32 (batch, max_pages_per_seq) given): k and v are the caches (num_pages,
    page_size, nheads_k, headdim[_v]), sequence b's keys are the first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows
    of its pages (or seqused_k[b] rows: vLLM's keyword, int32 (batch,), with which cu_seqlens_k may be None);
    inference only (NotImplementedError if an input requires grad in grad mode). max_seqlen_k is not needed then.

    Returns out (total_q, nheads, headdim_v); with return_attn_probs=True, (out, softmax_lse, None) where
    softmax_lse is (nheads, total_q). Masks are aligned bottom-right per sequence.
    """
    if block_table is None and seqused_k is None:
        return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                    causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend,
                    num_threads, generator)
    return _run_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                      seqused_k, backend, num_threads)


def _paged_names(lengths_name: str) -> dict:
    """The KV-cache operator's argument names as flash_attn_varlen_func's caller knows them."""
    names = {"k_cache": "k", "v_cache": "v"}
    if lengths_name == "cu_seqlens_k":  # the lengths are its differences
        names = {r"cache_seqlens: entry (\d+) is negative \((-?\d+)\)":
                 r"cu_seqlens_k: must be non-decreasing, but sequence \1's length is \2",
                 r"cache_seqlens\[(\d+)\]": r"cu_seqlens_k's length of sequence \1", **names}
    names["cache_seqlens"] = lengths_name
    return names


def _run_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
               window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table, seqused_k, backend,
               num_threads, attention_chunk=0, qv=None):
    """flash_attn_varlen_func over a paged cache: the KV-cache operator with varlen queries (qv: FA3's)."""
    if check_dropout(dropout_p) > 0:
        raise NotImplementedError("dropout_p: the paged path (block_table) is inference-only: it takes no dropout")
    if block_table is None:
        raise NotImplementedError("seqused_k: supported with a paged cache (block_table) only; without block_table "
                                  "pass the used keys' lengths in cu_seqlens_k")
    _check_tensor("q", q)
    for name, t in (("k", k), ("v", v)):
        _check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a rank-4 paged cache [num_pages, page_size, nheads_k, headdim] "
                             f"(block_table given), got shape {list(t.shape)}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, qv)):
        raise NotImplementedError(
            "block_table: the paged path (block_table) is inference-only: it has no backward, and an input requires "
            "grad; call it under torch.no_grad() / torch.inference_mode(), or pass detached tensors")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        _check_index(name, t)
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q: required (int32 (batch + 1,))")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1:
        raise ValueError(f"cu_seqlens_q: expected a rank-1 tensor of batch + 1 >= 1 entries, got shape "
                         f"{list(cu_seqlens_q.shape)}")
    entries = cu_seqlens_q.shape[0]
    if seqused_k is not None:
        lengths, lengths_name = seqused_k, "seqused_k"  # (cu_seqlens_k, if given, is not read)
    elif cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k: required with block_table unless seqused_k gives the key lengths")
    else:
        if cu_seqlens_k.dim() != 1 or cu_seqlens_k.shape[0] != entries:
            raise ValueError(f"cu_seqlens_k: expected {entries} entries (like cu_seqlens_q), got shape "
                             f"{list(cu_seqlens_k.shape)}")
        # The key lengths, on the device: no host synchronisation.
        lengths, lengths_name = cu_seqlens_k[1:] - cu_seqlens_k[:-1], "cu_seqlens_k"
    check_integer("max_seqlen_k", max_seqlen_k, 0, INT64_MAX)  # a bound flash_attn needs; not needed here
    check_flag("deterministic", deterministic)
    left, right = _window(window_size)
    out, lse = kvcache_attention(
        q, k, v, cache_seqlens=lengths, block_table=block_table, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        softmax_scale=softmax_scale, causal=causal, window_left=left, window_right=right, softcap=_softcap(softcap),
        alibi_slopes=alibi_slopes, backend=backend, num_threads=num_threads,
        names=_paged_names(lengths_name), attention_chunk=attention_chunk, qv=qv)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """flash_attn_varlen_func with qkv packed as (total, 3, nheads, headdim); one cu_seqlens and max_seqlen."""
    q, k, v = _split("qkv", qkv, 1, 3, "total, 3, nheads, headdim")
    return _run(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads, generator)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    generator: Optional[torch.Generator] = None,
):
    """flash_attn_varlen_func with kv packed as (total_k, 2, nheads_k, headdim)."""
    k, v = _split("kv", kv, 1, 2, "total_k, 2, nheads_k, headdim")
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads, generator)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
    check_index_values: bool = True,
):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache, appending k / v to it first.

    k_cache / v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or with block_table (int32 (batch,
    max_pages_per_seq)) paged (num_pages, page_size, nheads_k, headdim[_v]) with any page size. k / v (batch,
    seqlen_new, nheads_k, headdim[_v]), if given, are written into the caches *in place* at rows cache_seqlens[b]
    ... cache_seqlens[b] + seqlen_new - 1 (which must fit), then attended too. rotary_cos / rotary_sin
    (seqlen_ro >= the cache's rows, rotary_dim / 2), with k: k is rotated at its positions cache_seqlens + i, and q
    at cache_seqlens + i when causal or windowed, else at cache_seqlens; rotary_interleaved pairs dims (0, 1),
    (2, 3), ... (else GPT-NeoX: (0, rotary_dim / 2), ...). cache_seqlens: int32 (batch,) or an int, the rows in
    use before appending (None: every row); cache_batch_idx: int32 (batch,), the cache entry of each sequence;
    cache_leftpad: int32 (batch,), the first used row (keys before it are ignored). Causal / window masks are
    aligned bottom-right over the used keys. num_splits: key splits on CUDA (0 = chosen from the shape).

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with return_softmax_lse=True,
    softmax_lse (batch, nheads, seqlen_q) fp32. No backward (as in flash_attn): the outputs do not require grad.

    Keyword-only extras: backend, num_threads, and check_index_values (default True): cache_seqlens (+ the new rows)
    past the cache's capacity, a cache_leftpad past the used rows or a cache_batch_idx out of range raise ValueError
    naming the argument before anything is written. On CUDA that reads them on the host (a synchronisation per
    call); check_index_values=False skips it (as is done anyway under CUDA-graph capture) and the kernels clamp
    such values instead: nothing outside the tensors is read or written. Page indices out of range in block_table
    are checked on the host for CPU tensors; on CUDA their rows read as zeros and are never written.
    """
    return_softmax_lse = check_flag("return_softmax_lse", return_softmax_lse)  # before the caches are written
    left, right = _window(window_size)
    out, lse = kvcache_attention(
        q, k_cache, v_cache, k_new=k, v_new=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        block_table=block_table, softmax_scale=softmax_scale, causal=causal, window_left=left, window_right=right,
        softcap=_softcap(softcap), rotary_interleaved=rotary_interleaved, num_splits=num_splits,
        alibi_slopes=alibi_slopes, backend=backend, num_threads=num_threads, check_index_values=check_index_values,
        names={"k_new": "k", "v_new": "v"})
    return (out, lse) if return_softmax_lse else out
