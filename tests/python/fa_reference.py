"""Plain PyTorch math reference for the Python tests, and the error bound every comparison uses.

The reference materialises the score matrix. Run in float64 it is the oracle; run in the test's own dtype it
measures how much error that dtype's ordinary math makes, and ours may make at most twice that plus a few ulps
(the FlashAttention-3 test rule). Mask semantics are the library's: bottom-right aligned causal mask and window,
-1 = unbounded, chunked attention (FA3's attention_chunk: a row sees the keys of the chunk of `chunk` keys that
holds its diagonal), a row without visible keys gives out = 0 and lse = -inf.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor


def f32(x: float) -> float:
    """`x` rounded to float32: the library carries softmax_scale and softcap as float."""
    return float(torch.tensor(x, dtype=torch.float32))


def visible(seq_q: int, seq_k: int, causal: bool, window: Sequence[int], device=None, chunk: int = 0) -> Tensor:
    """Boolean [seq_q, seq_k]: may query i see key j (diag = i + seq_k - seq_q)."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    diag = i + seq_k - seq_q
    vis = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        vis &= j <= diag
    if window[0] >= 0:
        vis &= j >= diag - window[0]
    if window[1] >= 0:
        vis &= j <= diag + window[1]
    if chunk > 0:
        start = diag - diag % chunk  # the diagonal's chunk (torch's % of a negative diagonal is >= 0, as Python's)
        vis &= (j >= start) & (j < start + chunk)
    return vis


def attention_ref(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, window: Sequence[int] = (-1, -1),
                  softcap: float = 0.0, scale: Optional[float] = None, alibi: Optional[Tensor] = None,
                  dtype: Optional[torch.dtype] = torch.float64, chunk: int = 0, qv: Optional[Tensor] = None
                  ) -> Tuple[Tensor, Tensor]:
    """out [b, s_q, h_q, d_v] and lse [b, h_q, s_q] computed in `dtype` (None: the inputs' dtype). Differentiable.
    alibi: slopes [h_q] or [b, h_q]; score (i, j) gains -slope * |i + s_k - s_q - j| after the softcap.
    qv [b, s_q, h_q, d_v] (FA3's): the score adds qv_i · v_j to q_i · k_j before the scale, which defaults to
    1 / sqrt(d + d_v) then."""
    dtype = dtype or q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    seq_q, seq_k, heads_q, heads_kv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    score_dim = q.shape[-1] + (v.shape[-1] if qv is not None else 0)
    scale = f32(score_dim ** -0.5 if scale is None else scale)
    group = heads_q // heads_kv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k)
    if qv is not None:
        s = s + torch.einsum("bihd,bjhd->bhij", qv.to(dtype), v)
    s = s * scale
    if softcap > 0:
        cap = f32(softcap)
        s = cap * torch.tanh(s / cap)
    if alibi is not None:
        slopes = alibi.to(dtype).reshape(-1 if alibi.dim() == 2 else 1, heads_q).to(q.device)
        i = torch.arange(seq_q, device=q.device)[:, None]
        j = torch.arange(seq_k, device=q.device)[None, :]
        s = s - slopes[:, :, None, None] * (i + seq_k - seq_q - j).abs().to(dtype)
    vis = visible(seq_q, seq_k, causal, window, q.device, chunk)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s.detach(), dim=-1) if s.shape[-1] else torch.full(s.shape[:-1], float("-inf"), dtype=dtype, device=q.device)
    # Rows with no visible key: softmax over zeros (finite), then zeroed: out = 0 and no gradient, never NaN.
    row_any = vis.any(dim=-1)[:, None]
    p = torch.softmax(torch.where(row_any, s, torch.zeros_like(s)), dim=-1) * row_any
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def varlen_ref(q: Tensor, k: Tensor, v: Tensor, cu_q: Sequence[int], cu_k: Sequence[int],
               **kwargs) -> Tuple[Tensor, Tensor]:
    """Packed [total, h, d] inputs: each sequence through attention_ref. Returns out [total_q, h_q, d_v],
    lse [h_q, total_q]."""
    if len(cu_q) < 2:  # no sequence: empty results that still depend on the inputs (for backward)
        dtype = kwargs.get("dtype", torch.float64) or q.dtype
        zero = sum(t.to(dtype).sum() for t in (q, k, v)) * 0
        return (torch.zeros(0, q.shape[1], v.shape[2], dtype=dtype, device=q.device) + zero,
                torch.zeros(q.shape[1], 0, dtype=dtype, device=q.device))
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qs, ks, vs = (t[lo:hi].unsqueeze(0) for t, lo, hi in
                      ((q, cu_q[b], cu_q[b + 1]), (k, cu_k[b], cu_k[b + 1]), (v, cu_k[b], cu_k[b + 1])))
        alibi = kwargs.get("alibi")
        per_seq = dict(kwargs, alibi=alibi[b:b + 1] if alibi is not None and alibi.dim() == 2 else alibi)
        o, l = attention_ref(qs, ks, vs, **per_seq)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def assert_close(name: str, ours: Tensor, ref64: Tensor, low: Tensor, dtype: torch.dtype, ulps: float = 8.0):
    """err(ours) <= 2 * err(low) + ulps * eps(dtype) * max(1, max|ref|), all against the float64 reference.

    Infinite entries (lse of empty rows) must match exactly."""
    assert ours.shape == ref64.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref64.shape)}"
    ours, ref64, low = ours.double(), ref64.double(), low.double()
    inf = torch.isinf(ref64)
    assert torch.equal(torch.isinf(ours), inf), f"{name}: infinities differ from the reference"
    assert torch.equal(ours[inf], ref64[inf]), f"{name}: infinities differ in sign"
    assert not torch.isnan(ours).any(), f"{name}: NaN in the result"
    if ours.numel() == 0 or bool(inf.all()):
        return
    fin = ~inf
    err = (ours[fin] - ref64[fin]).abs().max().item()
    base = (low[fin] - ref64[fin]).abs().max().item()
    mag = max(1.0, ref64[fin].abs().max().item())
    bound = 2 * base + ulps * eps(dtype) * mag
    assert err <= bound, f"{name}: max error {err:.3g} above the bound {bound:.3g} (same-dtype math: {base:.3g})"


def dequantised_fp8(t8: Tensor, descale: Optional[Tensor], group: int, varlen_lens: Optional[Sequence[int]] = None
                    ) -> Tensor:
    """float8 values as float64 times their (sequence, KV head)'s descale ([b, heads_kv]; None: 1), query heads
    `group` to a KV head: [b, s, h, d], or varlen [total, h, d] with the sequences' lengths."""
    x = t8.double()
    if descale is None:
        return x
    per_head = descale.double().repeat_interleave(group, 1)  # [b, heads]
    if varlen_lens is not None:  # [total, heads]
        return x * per_head.repeat_interleave(torch.tensor(varlen_lens, device=x.device), 0)[:, :, None]
    return x * per_head[:, None, :, None]
