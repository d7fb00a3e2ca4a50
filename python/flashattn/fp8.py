"""Quantising 16- or 32-bit q, k, v (and dout) to float8_e4m3fn for the FP8 paths, with optional incoherent
processing (FlashAttention-3's Hadamard rotation of Q and K).

    x = flashattn.fp8.quantize_qkv(q, k, v, hadamard=True)
    out, lse = flashattn.fp8_attention(x.q, x.k, x.v, **x.descales)

Scales: one per (sequence, KV head), the granularity of FA3's descale tensors (batch, nheads_k); the query heads of
a KV group share theirs. Each slice is divided by amax / 448 (448: e4m3's largest value) so that its largest entry
lands on e4m3's top, and the descale returned is that factor (fp32): dequantised = e4m3 value x descale. A slice
that is all zeros gets descale 1; a slice holding inf or NaN gets a NaN descale (its values come out NaN, not
silently finite).

Incoherent processing: Q·Kᵀ = (Q R)(K R)ᵀ for any orthogonal R along the head dim, so q and k may be rotated
before quantisation without changing the attention. With R = diag(±1) · H / sqrt(n) (H a Hadamard matrix, random
signs from `seed`), an outlier coordinate's energy spreads over all coordinates, whose quantisation errors then
average out instead of landing on the few products that dominate the scores. Measured in bench/results/fp8.md: on
N(0, 1) inputs with 0.1% of entries plus N(0, 100) (the FA3 paper's outlier distribution) the output's error
against the unquantised attention falls to 0.42-0.66x (more at larger head dims); on plain N(0, 1) inputs nothing
changes. v is not rotated
(rotating it does not help: its error enters the output linearly). Head dims that are not a power of two rotate in
blocks of the largest power of two dividing them (block-diagonal H).

Gradients: fp8_attention_backward of rotated inputs returns dq, dk with respect to the rotated q and k;
`QuantizedQKV.rotate_back` turns them into the gradients of the inputs (dq = dq_rot Rᵀ). dout quantises with
`quantize(dout, heads_kv)`, its descale passed as do_descale.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["QuantizedQKV", "hadamard_rotation", "quantize", "quantize_qkv"]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
_SOURCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LAYOUTS = {4: "rank 4 [batch, seq, heads, d]", 3: "rank 3 [total, heads, d] (with cu_seqlens)"}


def hadamard_rotation(head_dim: int, *, seed: int = 0, device=None) -> Tensor:
    """The (head_dim, head_dim) fp32 orthogonal matrix diag(s) · H / sqrt(n): s random signs drawn from `seed`
    (a CPU generator: the same matrix on every device), H the Sylvester Hadamard matrix of order n, the largest
    power of two dividing head_dim (block-diagonal: head_dim / n blocks). A new tensor each call (built on the CPU
    once per (head_dim, seed), then copied to `device`): inside CUDA-graph capture, make it beforehand and pass it
    to quantize(..., rotation=)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim: expected a positive int, got {head_dim!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    return _rotation_on_cpu(head_dim, seed).to(device=device, dtype=torch.float32)


@functools.lru_cache(maxsize=32)
def _rotation_on_cpu(head_dim: int, seed: int) -> Tensor:
    """hadamard_rotation's matrix in float64 on the CPU (callers get converted copies, never this tensor)."""
    n = head_dim & -head_dim
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    blocks = torch.block_diag(*([h / n ** 0.5] * (head_dim // n)))
    signs = torch.randint(0, 2, (head_dim,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return signs.to(torch.float64)[:, None] * blocks


def _check_source(name: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _SOURCE_DTYPES:
        raise TypeError(f"{name}: expected float16, bfloat16, float32 or float64 to quantise, got {x.dtype}")


def _sequence_ids(name: str, cu_seqlens: Tensor, rows: int) -> Tuple[Tensor, int]:
    """The sequence of each of `rows` packed rows (cu_seqlens' offsets, without a host read), and the count."""
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 \
            or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}: expected an int32 tensor (batch + 1,) of sequence offsets")
    batch = cu_seqlens.numel() - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    ids = torch.repeat_interleave(torch.arange(batch, device=cu_seqlens.device), lengths, output_size=rows)
    return ids, batch


@torch.no_grad()
def quantize(x: Tensor, heads_kv: Optional[int] = None, *, cu_seqlens: Optional[Tensor] = None,
             rotation: Optional[Tensor] = None, name: str = "x") -> Tuple[Tensor, Tensor]:
    """x [batch, seq, heads, d] (or packed [total, heads, d] with cu_seqlens) -> (e4m3 tensor of x's shape, fp32
    descale [batch, heads_kv]), scaled per (sequence, KV head) as the module describes; heads_kv defaults to x's
    heads and must divide them. `rotation` (d, d) multiplies x along d first (hadamard_rotation)."""
    _check_source(name, x)
    varlen = cu_seqlens is not None
    if x.dim() != (3 if varlen else 4):
        raise ValueError(f"{name}: expected {_LAYOUTS[3 if varlen else 4]}, got shape {list(x.shape)}")
    heads, d = x.shape[-2], x.shape[-1]
    heads_kv = heads if heads_kv is None else heads_kv
    if isinstance(heads_kv, bool) or not isinstance(heads_kv, int) or heads_kv < 1 or heads % heads_kv:
        raise ValueError(f"heads_kv: expected a positive int dividing {name}'s {heads} heads, got {heads_kv!r}")
    xf = x.to(torch.float32)
    if rotation is not None:
        if not isinstance(rotation, Tensor) or rotation.shape != (d, d):
            raise ValueError(f"rotation: expected a ({d}, {d}) tensor (hadamard_rotation({d}))")
        xf = xf @ rotation.to(device=x.device, dtype=torch.float32)
    rows_shape = xf.shape[:-2]
    per_row = xf.abs().amax(dim=-1).reshape(*rows_shape, heads_kv, heads // heads_kv).amax(dim=-1)
    if varlen:
        ids, batch = _sequence_ids("cu_seqlens", cu_seqlens, x.shape[0])
        amax = torch.zeros(batch, heads_kv, dtype=torch.float32, device=x.device)
        amax = amax.scatter_reduce(0, ids[:, None].expand_as(per_row), per_row, "amax")
    else:
        amax = per_row.amax(dim=1) if x.shape[1] else torch.zeros(x.shape[0], heads_kv, device=x.device)
    # NaN in a slice makes amax NaN (amax propagates it); inf makes it inf: both give a NaN descale.
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    descale = torch.where(torch.isfinite(amax), descale, torch.full_like(amax, float("nan")))
    per_slice = descale[ids] if varlen else descale[:, None]  # [total, hkv] or [batch, 1, hkv]
    scaled = xf.reshape(*rows_shape, heads_kv, heads // heads_kv, d) / per_slice[..., None, None]
    return scaled.reshape(x.shape).to(E4M3), descale


class QuantizedQKV(NamedTuple):
    """quantize_qkv's result: e4m3 q, k, v, their fp32 descales [batch, heads_kv], and the rotation applied to q
    and k (None without incoherent processing)."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_descale: Tensor
    k_descale: Tensor
    v_descale: Tensor
    rotation: Optional[Tensor]

    @property
    def descales(self) -> dict:
        """{"q_descale": ..., "k_descale": ..., "v_descale": ...}: keyword arguments of the FP8 entry points."""
        return {"q_descale": self.q_descale, "k_descale": self.k_descale, "v_descale": self.v_descale}

    def rotate_back(self, grad: Tensor) -> Tensor:
        """The gradient of an input (q or k) from the gradient of its rotated copy: grad Rᵀ (identity without a
        rotation), in grad's dtype."""
        if self.rotation is None:
            return grad
        return (grad.to(torch.float32) @ self.rotation.to(grad.device).t()).to(grad.dtype)


def quantize_qkv(q: Tensor, k: Tensor, v: Tensor, *, hadamard: bool = False, seed: int = 0,
                 cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None) -> QuantizedQKV:
    """q [batch, seq_q, heads_q, d], k [batch, seq_k, heads_kv, d], v [batch, seq_k, heads_kv, d_v] (or packed
    with cu_seqlens_q / cu_seqlens_k) -> QuantizedQKV, every descale [batch, heads_kv] (q's per KV group).
    hadamard=True rotates q and k by hadamard_rotation(d, seed=seed) first (incoherent processing)."""
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard: expected a bool, got {type(hadamard).__name__}")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q, cu_seqlens_k: give both (packed sequences) or neither")
    rank = 4 if cu_seqlens_q is None else 3
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_source(name, t)
        if t.dim() != rank:
            raise ValueError(f"{name}: expected {_LAYOUTS[rank]}, got shape {list(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: head dim {k.shape[-1]} differs from q's {q.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"v: shape {list(v.shape)} does not match k's {list(k.shape)} but for the head dim")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"k: its {k.shape[-2]} heads must divide q's {q.shape[-2]}")
    if rank == 4 and q.shape[0] != k.shape[0]:
        raise ValueError(f"k: batch {k.shape[0]} differs from q's {q.shape[0]}")
    if rank == 3 and (not isinstance(cu_seqlens_k, Tensor) or not isinstance(cu_seqlens_q, Tensor)
                      or cu_seqlens_k.numel() != cu_seqlens_q.numel()):
        raise ValueError("cu_seqlens_k: expected a tensor with as many offsets as cu_seqlens_q")
    rotation = hadamard_rotation(q.shape[-1], seed=seed, device=q.device) if hadamard else None
    q8, q_descale = quantize(q, k.shape[-2], cu_seqlens=cu_seqlens_q, rotation=rotation, name="q")
    k8, k_descale = quantize(k, cu_seqlens=cu_seqlens_k, rotation=rotation, name="k")
    v8, v_descale = quantize(v, cu_seqlens=cu_seqlens_k, name="v")
    return QuantizedQKV(q8, k8, v8, q_descale, k_descale, v_descale, rotation)
