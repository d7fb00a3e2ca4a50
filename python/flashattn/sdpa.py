"""`scaled_dot_product_attention` with torch.nn.functional's signature and semantics, for code coming from SDPA.

Layout (N..., heads, L, E) as in PyTorch; the [batch, heads, seq, dim] storage is handed to the kernels as a
permuted [batch, seq, heads, dim] view (no copy) and the result comes back the same way.

`is_causal` is PyTorch's top-left aligned mask: query i sees key j iff j <= i, whatever L and S are. The library's
causal mask is bottom-right aligned (j <= i + S - L), so it is mapped:
  * L == S: the two alignments coincide: causal.
  * L >  S: not causal, window_right = L - S: the bottom-right diagonal shifted right by L - S is j <= i.
  * L <  S: keys j >= L are visible to no query, so they are sliced off (a view) and the square remainder is
    causal; their gradients are zero, as in PyTorch.

float8_e4m3fn query, key and value (all three) run the FP8 forward (flashattn.fa3's; no descales: SDPA has none)
and return bfloat16; forward only (CUDA tensors: the Hopper FP8 kernel, compute capability 9.0).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ._ops import _check_tensor, attention, check_flag, fp8_attention, resolve_scale
from .flash_attn_interface import check_dropout

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    backend: str = "auto",
    num_threads: int = 0,
) -> Tensor:
    """softmax(query keyᵀ · scale) value for query (N..., Hq, L, E), key (N..., H, S, E), value (N..., H, S, Ev).

    Returns (N..., Hq, L, Ev). scale defaults to 1 / sqrt(E). With enable_gqa=True, Hq may be a multiple of H
    (query head h uses key/value head h // (Hq // H)). attn_mask raises NotImplementedError. dropout_p > 0 drops
    probabilities as flash_attn_func does (seed from torch's default generator; flashattn's own mask, not PyTorch's).
    Rank 3 inputs (N, L, E) are one head; leading dimensions beyond (N, H) are flattened into the batch.
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask: arbitrary attention masks are not supported by flashattn; use is_causal, or the window "
            "and varlen arguments of flashattn.flash_attn_func / flash_attn_varlen_func")
    dropout_p = check_dropout(dropout_p)
    is_causal = check_flag("is_causal", is_causal)
    enable_gqa = check_flag("enable_gqa", enable_gqa)
    fp8 = isinstance(query, Tensor) and query.dtype == torch.float8_e4m3fn
    if fp8 and dropout_p > 0:
        raise NotImplementedError("dropout_p: the FP8 forward takes no dropout")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not fp8:
            _check_tensor(name, t)
        elif not isinstance(t, Tensor) or t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name}: float8_e4m3fn query needs float8_e4m3fn key and value, got "
                            f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(f"{name}: expected (N..., heads, seq, dim) or (N, seq, dim), got shape {list(t.shape)}")
    if not (query.dim() == key.dim() == value.dim()):
        raise ValueError(f"key, value: expected the rank of query ({query.dim()}), got {key.dim()} and {value.dim()}")
    lead = query.shape[:-3] if query.dim() > 3 else query.shape[:-2]
    for name, t in (("key", key), ("value", value)):
        t_lead = t.shape[:-3] if t.dim() > 3 else t.shape[:-2]
        if t_lead != lead:
            raise ValueError(f"{name}: batch dimensions {list(t_lead)} differ from query's {list(lead)} "
                             "(broadcasting is not supported)")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"value: sequence length {value.shape[-2]} differs from key's {key.shape[-2]}")
    if query.dim() > 3 and not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(f"key: {key.shape[-3]} heads differ from query's {query.shape[-3]}; grouped-query attention "
                         "needs enable_gqa=True")

    def to_bshd(t: Tensor) -> Tensor:
        if t.dim() == 3:
            t = t.unsqueeze(-3)
        elif t.dim() > 4:  # (not -1: ambiguous for an empty tensor)
            t = t.reshape(math.prod(t.shape[:-3]), *t.shape[-3:])
        return t.transpose(1, 2)  # [b, h, s, d] storage as a [b, s, h, d] view

    q, k, v = to_bshd(query), to_bshd(key), to_bshd(value)
    seq_q, seq_k = q.shape[1], k.shape[1]
    causal, window_right = False, -1
    if is_causal:
        if seq_q > seq_k:
            window_right = seq_q - seq_k
        else:
            causal = True
            if seq_q < seq_k:
                k, v = k[:, :seq_q], v[:, :seq_q]
    softmax_scale = resolve_scale(scale, query.shape[-1], name="scale", tensor_name="query")
    if fp8:
        out, _ = fp8_attention(q, k, v, softmax_scale=softmax_scale, causal=causal, window_right=window_right,
                               backend=backend, num_threads=num_threads)
    else:
        out, _ = attention(q, k, v, softmax_scale=softmax_scale, causal=causal, window_right=window_right,
                           dropout_p=dropout_p, backend=backend, num_threads=num_threads)
    out = out.transpose(1, 2)  # [b, h, s_q, d_v] view of the [b, s_q, h, d_v] result
    if query.dim() == 3:
        return out.squeeze(-3)
    return out.reshape(*lead, *out.shape[-3:]) if query.dim() > 4 else out
