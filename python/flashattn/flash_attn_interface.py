"""The flash_attn 2 API over flashattn: same function names, argument order, defaults and return values.

Switching is one import line::

    from flashattn import flash_attn_func            # was: from flash_attn import flash_attn_func

Layout [batch, seqlen, heads, dim] (varlen: [total, heads, dim] with int32 cu_seqlens). Causal masks and sliding
windows are aligned to the bottom-right corner of the score matrix, as in flash_attn >= 2.1: query i sees keys j
with i + s_k - s_q - window_size[0] <= j <= i + s_k - s_q + window_size[1] (and j <= i + s_k - s_q if causal);
a row that sees no key gives zeros. Multi-/grouped-query attention: k and v may have fewer heads than q.

Differences, all explicit: dropout_p > 0, alibi_slopes and block_table (paged KV) raise NotImplementedError;
return_attn_probs=True returns (out, softmax_lse, None) since the probabilities are never materialised; float32
and float64 inputs work too (not only float16 / bfloat16). Keyword-only extras: `backend` (force a backend by
name, "auto" dispatches) and `num_threads` (CPU backends, 0 = all cores).
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence, Tuple

from torch import Tensor

from ._ops import attention, check_flag, check_real

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


def check_dropout(dropout_p) -> None:
    if dropout_p is None:
        raise ValueError("dropout_p: must be in [0, 1), got None")
    p = check_real("dropout_p", dropout_p)
    if not 0.0 <= p < 1.0:  # NaN fails this too
        raise ValueError(f"dropout_p: must be in [0, 1), got {dropout_p}")
    if p > 0:
        raise NotImplementedError(
            f"dropout_p={dropout_p}: attention dropout is not supported by flashattn yet; pass dropout_p=0.0")


def _reject_unsupported(dropout_p, alibi_slopes, block_table=None) -> None:
    check_dropout(dropout_p)
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi biases are not supported by flashattn yet; pass None")
    if block_table is not None:
        raise NotImplementedError("block_table: paged KV caches are not supported by flashattn yet; pass None")


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
         window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads,
         block_table=None):
    _reject_unsupported(dropout_p, alibi_slopes, block_table)
    left, right = _window(window_size)
    out, lse = attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal, window_left=left,
                         window_right=right, softcap=_softcap(softcap), deterministic=deterministic,
                         backend=backend, num_threads=num_threads)
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
):
    """Attention over q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim[_v]).

    Returns out (batch, seqlen_q, nheads, headdim_v); with return_attn_probs=True, (out, softmax_lse, None) where
    softmax_lse (batch, nheads, seqlen_q) is the fp32 natural-log log-sum-exp of each row of scaled scores.
    softmax_scale defaults to 1 / sqrt(headdim); softcap > 0 applies softcap * tanh(scores / softcap).
    """
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads)


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
):
    """flash_attn_func with qkv packed as (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = _split("qkv", qkv, 2, 3, "batch, seqlen, 3, nheads, headdim")
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads)


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
):
    """flash_attn_func with q (batch, seqlen_q, nheads, headdim) and kv packed as (batch, seqlen_k, 2, nheads_k,
    headdim)."""
    k, v = _split("kv", kv, 2, 2, "batch, seqlen, 2, nheads_k, headdim")
    return _run(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                deterministic, return_attn_probs, backend, num_threads)


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
    backend: str = "auto",
    num_threads: int = 0,
):
    """Attention over packed sequences: q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim[_v]),
    cu_seqlens_q / cu_seqlens_k int32 (batch + 1,) cumulative lengths, max_seqlen_q / max_seqlen_k bounds.

    Returns out (total_q, nheads, headdim_v); with return_attn_probs=True, (out, softmax_lse, None) where
    softmax_lse is (nheads, total_q). Masks are aligned bottom-right per sequence.
    """
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads,
                block_table)


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
):
    """flash_attn_varlen_func with qkv packed as (total, 3, nheads, headdim); one cu_seqlens and max_seqlen."""
    q, k, v = _split("qkv", qkv, 1, 3, "total, 3, nheads, headdim")
    return _run(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads)


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
):
    """flash_attn_varlen_func with kv packed as (total_k, 2, nheads_k, headdim)."""
    k, v = _split("kv", kv, 1, 2, "total_k, 2, nheads_k, headdim")
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs, backend, num_threads)
