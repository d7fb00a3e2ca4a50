"""Context parallelism: one sequence split across the ranks of a process group, exact attention through a ring.

    from flashattn.distributed import ring_flash_attn_func, shard, unshard

    q_local = shard(q, rank, world, layout="zigzag")          # [b, s / P, h, d]: this rank's tokens
    out_local = ring_flash_attn_func(q_local, k_local, v_local, causal=True, layout="zigzag")

Each rank holds its shard of the sequence, [b, s/P, h, d] for Q and [b, s/P, h_kv, d(_v)] for K and V (GQA: only
the KV heads travel). "contiguous": rank r holds tokens [r·s/P, (r+1)·s/P); "zigzag": rank r holds chunks r and
2P−1−r of 2P (under a causal mask every rank then does the same work). The output (and, through autograd, the
gradients) equal single-device attention over the whole sequence, to rounding: out is this rank's rows.

Forward: at step t rank r attends its queries to the K/V block of rank (r − t) mod P while the block of step t + 1
is already travelling (torch.distributed isend / irecv to the next rank, from the previous one: NCCL on GPUs, gloo
on CPUs; a CUDA tensor over gloo is staged through host memory). Partial results merge through their log-sum-exp
in fp32. Under a causal mask, blocks that are fully masked are skipped and fully visible ones run without a mask
(a zigzag step is one unmasked product of half the queries or half the keys, or the rank's own causal block).
Backward: the same ring again with each block's dK / dV accumulators travelling beside it (one hop more than K / V,
which brings them home); dQ stays local; every block's gradients come from flashattn's backward with the saved
global LSE and output, so they are exact. The order of additions is fixed: deterministic where the single-device
backward is (deterministic=True). Memory per rank is O(s/P).

Not supported yet (NotImplementedError): window_size other than (-1, -1), a varlen form, dropout, ALiBi, float64.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ._ops import INT32_MAX, check_flag, check_softcap, op_options, resolve_scale

__all__ = ["ring_flash_attn_func", "shard", "unshard", "LAYOUTS"]

LAYOUTS = ("contiguous", "zigzag")


# ---- layouts ----

def _check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
    return layout


def shard(x: Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = 1) -> Tensor:
    """Rank `rank`'s part of the whole-sequence tensor x (sequence along `dim`) in `layout`: a copy."""
    _check_layout(layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank: must be in [0, {world}), got {rank}")
    parts = 2 * world if layout == "zigzag" else world
    if x.shape[dim] % parts:
        raise ValueError(f"x: the sequence length ({x.shape[dim]}) must be a multiple of {parts} for the {layout} "
                         f"layout over {world} ranks")
    chunks = x.chunk(parts, dim=dim)
    picked = [chunks[rank], chunks[parts - 1 - rank]] if layout == "zigzag" else [chunks[rank]]
    return torch.cat(picked, dim=dim)


def unshard(shards: Sequence[Tensor], layout: str = "contiguous", dim: int = 1) -> Tensor:
    """The whole-sequence tensor from every rank's shard (in rank order): the inverse of shard."""
    _check_layout(layout)
    if layout == "contiguous":
        return torch.cat(list(shards), dim=dim)
    world = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))], dim=dim)


def _pieces(layout: str, causal: bool, rank: int, src: int, rows: int) -> List[Tuple[slice, slice, bool]]:
    """The products of this rank's queries with the K/V block of rank `src`: (query rows, key rows, causal), empty
    when the block is invisible."""
    everything = slice(0, rows)
    if not causal:
        return [(everything, everything, False)]
    if src == rank:
        return [(everything, everything, True)]  # within a shard global order is local order, in both layouts
    if layout == "contiguous":
        return [(everything, everything, False)] if src < rank else []
    half = rows // 2
    # zigzag: shards hold chunks (r, 2P-1-r). An earlier src's first chunk precedes both of ours and its second
    # follows both; a later src's chunks both lie between our two.
    if src < rank:
        return [(everything, slice(0, half), False)]
    return [(slice(half, rows), everything, False)]


# ---- the ring ----

class _Ring:
    """Point-to-point exchange with the next and previous rank of a process group."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = to_global((self.rank + 1) % self.world)
        self.prev = to_global((self.rank - 1) % self.world)
        self.staged = dist.get_backend(group) == "gloo"  # gloo moves host tensors only

    def start(self, tensors: Sequence[Tensor]):
        """Sends `tensors` to the next rank and receives as many like them from the previous one; returns a handle
        for finish()."""
        sends = [t.detach().contiguous() for t in tensors]
        if self.staged:
            sends = [t.cpu() for t in sends]
        recvs = [torch.empty_like(t) for t in sends]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recvs]
        return dist.batch_isend_irecv(ops), recvs, [t.device for t in tensors]

    @staticmethod
    def finish(handle) -> List[Tensor]:
        works, recvs, devices = handle
        for w in works:
            w.wait()
        return [t.to(d, non_blocking=True) for t, d in zip(recvs, devices)]


def _merge(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """out_acc / lse_acc (fp32, [b, n, h, d] / [b, h, n] views) become the attention over both key sets: the
    partial results weighted by exp(lse - lse_new). Rows that saw no key on one side (lse -inf) take the other."""
    new = torch.logaddexp(lse_acc, lse)
    finite = torch.isfinite(new)
    w_acc = torch.where(finite, torch.exp(lse_acc - new), 0.0).transpose(1, 2).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(lse - new), 0.0).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(out.float() * w_new)
    lse_acc.copy_(new)


def _block_options(scale: float, softcap: float, deterministic: bool) -> dict:
    """The operators' (int_options, float_options) of a block product, by whether it is causal."""
    return {c: op_options(0, 0, scale, c, -1, -1, softcap, deterministic) for c in (False, True)}


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, softcap, layout, group, deterministic, backend):
        ring = _Ring(group)
        rows = q.shape[1]
        options = _block_options(scale, softcap, deterministic)
        out_acc = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32, device=q.device)
        lse_acc = torch.full((q.shape[0], q.shape[2], rows), float("-inf"), dtype=torch.float32, device=q.device)
        kv = [k, v]
        for step in range(ring.world):
            pending = ring.start(kv) if step < ring.world - 1 else None
            src = (ring.rank - step) % ring.world
            for qs, ks, block_causal in _pieces(layout, causal, ring.rank, src, rows):
                out, lse = torch.ops.flashattn.attention_forward(q[:, qs], kv[0][:, ks], kv[1][:, ks], None, None,
                                                                 None, *options[block_causal], backend)
                _merge(out_acc[:, qs], lse_acc[:, :, qs], out, lse)
            if pending is not None:
                kv = ring.finish(pending)
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc)
        ctx.settings = (scale, causal, softcap, layout, group, deterministic, backend)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, softcap, layout, group, deterministic, backend = ctx.settings
        ring = _Ring(group)
        rows = q.shape[1]
        options = _block_options(scale, softcap, deterministic)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
        pending_dkv = None
        for step in range(ring.world):
            pending_kv = ring.start(kv) if step < ring.world - 1 else None
            src = (ring.rank - step) % ring.world
            block_grads = []
            for qs, ks, block_causal in _pieces(layout, causal, ring.rank, src, rows):
                bq, bk, bv = torch.ops.flashattn.attention_backward(
                    dout[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], out[:, qs], lse[:, :, qs].contiguous(),
                    None, None, None, *options[block_causal], backend)
                dq[:, qs] += bq
                block_grads.append((ks, bk, bv))
            # The block's accumulators travel while its gradients are computed: they arrive now, take this rank's
            # part and move on (one hop more than K / V after the last step: home).
            if pending_dkv is not None:
                dkv = ring.finish(pending_dkv)
            for ks, bk, bv in block_grads:
                dkv[0][:, ks] += bk
                dkv[1][:, ks] += bv
            pending_dkv = ring.start(dkv) if ring.world > 1 else None
            if pending_kv is not None:
                kv = ring.finish(pending_kv)
        if pending_dkv is not None:
            dkv = ring.finish(pending_dkv)
        return (dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)) + (None,) * 7


@torch.compiler.disable
def ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: Optional[float] = None,
                         window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, layout: str = "contiguous",
                         group=None, *, deterministic: bool = False, backend: str = "auto") -> Tensor:
    """Attention over the sequence whose shards the ranks of `group` (default: the world) hold; returns this rank's
    rows of the output, [b, s/P, h_q, d_v]. Arguments as flash_attn_func's; layout "contiguous" or "zigzag"."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (init_process_group first)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [batch, seqlen / ranks, heads, head_dim], got shape {list(t.shape)}")
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1]:
        raise ValueError(f"k, v: every rank holds as many keys as queries of the same batch: q {list(q.shape)}, "
                         f"k {list(k.shape)}, v {list(v.shape)}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"k: query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})")
    if q.dtype == torch.float64:
        # The CPU backends' fp64 backward recomputes each row's LSE from the keys it is given (the stored LSE is
        # fp32), so a block's gradients would not use the global LSE.
        raise NotImplementedError("q: float64 ring attention is not supported (fp16, bf16 and fp32 are)")
    layout = _check_layout(layout)
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"q: a zigzag shard holds two equal chunks, so its length must be even, got {q.shape[1]}")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("window_size: ring attention with a sliding window is not supported yet")
    if q.shape[1] > INT32_MAX:
        raise ValueError(f"q: shard length {q.shape[1]} past 2^31")
    causal = check_flag("causal", causal)
    deterministic = check_flag("deterministic", deterministic)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    softcap = check_softcap(softcap)
    return _RingAttention.apply(q, k, v, scale, causal, softcap, layout, group, deterministic, str(backend))
