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
into fp32 accumulators, one fused kernel per block (flashattn.merge_attention_states_). Under a causal mask, blocks
that are fully masked are skipped and fully visible ones run without a mask (a zigzag step is one unmasked product
of half the queries or half the keys, or the rank's own causal block).
Backward: the same ring again with each block's dK / dV accumulators travelling beside it (one hop more than K / V,
which brings them home); dQ stays local; every block's gradients come from flashattn's backward with the saved
global LSE and output, so they are exact. The order of additions is fixed: deterministic where the single-device
backward is (deterministic=True). Memory per rank is O(s/P).

Varlen (ring_flash_attn_varlen_func, shard_varlen / unshard_varlen): a packed batch whose every sequence is sharded
as above (zigzag: each sequence's two chunks), [total/P, h, d] per rank with the parts' cu_seqlens; a zigzag chunk
of every sequence is gathered by index into one varlen call.

Sliding windows (window_size): each pair of chunks that sees anything runs over the rows and keys that do, with
the window the kernels' bottom-right aligned mask needs there. Varlen: that rectangle and window depend on each
sequence's length, so the sequences are grouped by the window they need, one varlen call per group and chunk pair.

Not supported yet (NotImplementedError): dropout, ALiBi, float64.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ._ops import (INT32_MAX, check_flag, check_integer, check_softcap, merge_attention_states_, op_options,
                   resolve_scale)
from .flash_attn_interface import _window

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "shard", "unshard", "shard_varlen",
           "unshard_varlen", "LAYOUTS"]

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


def _check_global_cu(cu_seqlens, parts: int, layout: str) -> List[int]:
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens: expected a rank-1 tensor of batch + 1 >= 1 cumulative lengths")
    cu = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if cu[0] != 0 or any(n < 0 for n in lengths):
        raise ValueError("cu_seqlens: must start at 0 and be non-decreasing")
    if any(n % parts for n in lengths):
        raise ValueError(f"cu_seqlens: every sequence's length must be a multiple of {parts} for the {layout} layout, "
                         f"got {lengths[:8]}{'...' if len(lengths) > 8 else ''}")
    return cu


def shard_varlen(x: Tensor, cu_seqlens: Tensor, rank: int, world: int, layout: str = "contiguous",
                 dim: int = 0) -> Tuple[Tensor, Tensor]:
    """Rank `rank`'s part of the packed batch x (the sequences of cu_seqlens along `dim`), each sequence sharded as
    shard() shards one, and the cumulative lengths of the parts (int32, on cu_seqlens' device): a copy."""
    _check_layout(layout)
    if not 0 <= rank < world:
        raise ValueError(f"rank: must be in [0, {world}), got {rank}")
    cu = _check_global_cu(cu_seqlens, 2 * world if layout == "zigzag" else world, layout)
    if cu[-1] != x.shape[dim]:
        raise ValueError(f"x: {x.shape[dim]} rows along dim {dim}, cu_seqlens ends at {cu[-1]}")
    parts = [shard(x.narrow(dim, a, b - a), rank, world, layout, dim) for a, b in zip(cu[:-1], cu[1:])]
    local = torch.tensor([n // world for n in cu], dtype=torch.int32, device=cu_seqlens.device)
    return (torch.cat(parts, dim=dim) if parts else x.narrow(dim, 0, 0).clone()), local


def unshard_varlen(shards: Sequence[Tensor], cu_seqlens: Tensor, layout: str = "contiguous", dim: int = 0) -> Tensor:
    """The packed batch from every rank's shard_varlen part (in rank order), cu_seqlens the whole sequences'
    cumulative lengths: the inverse of shard_varlen."""
    _check_layout(layout)
    world = len(shards)
    cu = _check_global_cu(cu_seqlens, 2 * world if layout == "zigzag" else world, layout)
    local = [n // world for n in cu]
    seqs = [unshard([s.narrow(dim, a, b - a) for s in shards], layout, dim) for a, b in zip(local[:-1], local[1:])]
    return torch.cat(seqs, dim=dim) if seqs else shards[0].narrow(dim, 0, 0).clone()


Piece = Tuple[object, object, bool, int, int]  # (query part, key part, causal, window_left, window_right)


def _pieces(layout: str, causal: bool, rank: int, src: int) -> List[Piece]:
    """The products of this rank's queries with the K/V block of rank `src` without a window: (query part, key
    part, causal, -1, -1), each part "all" of the shard's rows or the "first" / "second" of its two zigzag chunks;
    empty when the block is invisible."""
    if not causal:
        return [("all", "all", False, -1, -1)]
    if src == rank:
        return [("all", "all", True, -1, -1)]  # within a shard global order is local order, in both layouts
    if layout == "contiguous":
        return [("all", "all", False, -1, -1)] if src < rank else []
    # zigzag: shards hold chunks (r, 2P-1-r). An earlier src's first chunk precedes both of ours and its second
    # follows both; a later src's chunks both lie between our two.
    if src < rank:
        return [("all", "first", False, -1, -1)]
    return [("second", "all", False, -1, -1)]


def _chunks(layout: str, rank: int, world: int, rows: int) -> List[Tuple[int, int, int]]:
    """The whole-sequence chunks a shard of `rows` tokens holds: (first token in the sequence, first local row,
    length)."""
    if layout == "contiguous":
        return [(rank * rows, 0, rows)]
    half = rows // 2
    return [(rank * half, 0, half), ((2 * world - 1 - rank) * half, half, half)]


def _band(q_start: int, k_start: int, n: int, causal: bool, left: int, right: int):
    """Queries q_start + i against keys k_start + j (i, j < n) under a sliding window (left, right; -1 unbounded;
    causal: right at most 0): the tightest rows [r0, r1) and keys [c0, c1) holding every visible pair, and the
    window that the kernels' bottom-right aligned mask needs on that rectangle to see exactly those pairs; None
    when no pair is visible. The rectangle's last row sees its last key, so the kernels' diagonal lies inside the
    band and both edges are >= 0 (or unbounded)."""
    right = 0 if causal else right
    delta = q_start - k_start  # row i sees keys j in [i + delta - left, i + delta + right]
    r0 = 0 if right < 0 else max(0, -delta - right)
    r1 = n if left < 0 else min(n, n - delta + left)
    if r0 >= r1:
        return None
    c0 = 0 if left < 0 else max(0, r0 + delta - left)
    c1 = n if right < 0 else min(n, r1 + delta + right)
    if c0 >= c1:
        return None
    rows, keys = r1 - r0, c1 - c0
    shift, offset = keys - rows, delta + r0 - c0
    w_left = -1 if left < 0 or shift - offset + left >= keys - 1 else shift - offset + left
    w_right = -1 if right < 0 or offset + right - shift >= rows - 1 else offset + right - shift
    return r0, r1, c0, c1, w_left, w_right


def _window_pieces(layout: str, causal: bool, window: Tuple[int, int], rank: int, src: int, world: int,
                   rows: int) -> List[Piece]:
    """_pieces under a sliding window (padded shards): one product per pair of chunks that sees anything, over the
    rows and keys that do, with the window the kernels need there (_band)."""
    pieces = []
    for q_start, q_row, n in _chunks(layout, rank, world, rows):
        for k_start, k_row, _ in _chunks(layout, src, world, rows):
            band = _band(q_start, k_start, n, causal, *window)
            if band is not None:
                r0, r1, c0, c1, w_left, w_right = band
                pieces.append((slice(q_row + r0, q_row + r1), slice(k_row + c0, k_row + c1), False, w_left, w_right))
    return pieces


class _Part:
    """Rows of a varlen shard gathered by index, with the cu_seqlens and max_seqlen of the runs they hold."""

    def __init__(self, runs: Sequence[Tuple[int, int]], device):
        lengths = [hi - lo for lo, hi in runs]
        self.rows = torch.cat([torch.arange(lo, hi) for lo, hi in runs]).to(device)
        self.cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
        self.max_seqlen = max(lengths)


def _varlen_window_pieces(geo: "_Geometry", layout: str, causal: bool, window: Tuple[int, int], rank: int, src: int,
                          world: int) -> List[Piece]:
    """_window_pieces for a varlen shard: every sequence's chunk pairs get their rectangle and window (_band);
    sequences that need the same window in the same chunk pair share one varlen call."""
    groups = {}
    for a, b in zip(geo.host_cu[:-1], geo.host_cu[1:]):
        if b == a:
            continue
        for ci, (q_start, q_row, n) in enumerate(_chunks(layout, rank, world, b - a)):
            for cj, (k_start, k_row, _) in enumerate(_chunks(layout, src, world, b - a)):
                band = _band(q_start, k_start, n, causal, *window)
                if band is None:
                    continue
                r0, r1, c0, c1, w_left, w_right = band
                q_runs, k_runs = groups.setdefault((ci, cj, w_left, w_right), ([], []))
                q_runs.append((a + q_row + r0, a + q_row + r1))
                k_runs.append((a + k_row + c0, a + k_row + c1))
    return [(_Part(q_runs, geo.device), _Part(k_runs, geo.device), False, w_left, w_right)
            for (_, _, w_left, w_right), (q_runs, k_runs) in groups.items()]


class _Geometry:
    """Where a shard's parts lie in its tensors. Padded [b, s/P, h, d]: the token dimension is 1 and a part is a
    slice of it. Varlen [total/P, h, d] (every sequence sharded alike): the token dimension is 0, and a zigzag
    chunk of every sequence is an index over the packed rows, with its own cu_seqlens (half of the shard's) and
    max_seqlen. The LSE's token dimension is the last in both ([b, h, s/P], [h, total/P])."""

    def __init__(self, rows: int, cu_seqlens: Optional[Tensor] = None, host_cu: Optional[List[int]] = None,
                 max_seqlen: int = 0, zigzag: bool = False):
        self.dim = 0 if cu_seqlens is not None else 1
        self.rows = rows
        self.host_cu = host_cu  # varlen: cu_seqlens on the host
        self.device = None if cu_seqlens is None else cu_seqlens.device
        self.parts = {"all": (slice(0, rows), cu_seqlens, max_seqlen)}
        if cu_seqlens is None:
            self.parts["first"] = (slice(0, rows // 2), None, 0)
            self.parts["second"] = (slice(rows // 2, rows), None, 0)
        elif zigzag:  # each sequence's two chunks
            device = cu_seqlens.device
            bounds = list(zip(host_cu[:-1], host_cu[1:]))
            first = [torch.arange(a, (a + b) // 2) for a, b in bounds]
            second = [torch.arange((a + b) // 2, b) for a, b in bounds]
            half_cu = torch.div(cu_seqlens, 2, rounding_mode="floor")
            for name, idx in (("first", first), ("second", second)):
                rows_idx = torch.cat(idx).to(device) if idx else torch.zeros(0, dtype=torch.long, device=device)
                self.parts[name] = (rows_idx, half_cu, max_seqlen // 2)

    def _rows(self, part):
        if isinstance(part, (slice, _Part)):
            return part if isinstance(part, slice) else part.rows
        return self.parts[part][0]

    def is_view(self, part) -> bool:
        """Whether take() gives a view of the part (a slice) rather than a gathered copy."""
        return isinstance(self._rows(part), slice)

    def take(self, t: Tensor, part, dim: Optional[int] = None) -> Tensor:
        rows = self._rows(part)
        dim = self.dim if dim is None else dim
        if isinstance(rows, slice):
            return t.narrow(dim, rows.start, rows.stop - rows.start)
        return t.index_select(dim, rows)

    def put(self, t: Tensor, part, value: Tensor, dim: Optional[int] = None, add: bool = False) -> None:
        rows = self._rows(part)
        dim = self.dim if dim is None else dim
        if isinstance(rows, slice):
            view = t.narrow(dim, rows.start, rows.stop - rows.start)
            view.add_(value) if add else view.copy_(value)
        elif add:
            t.index_add_(dim, rows, value)
        else:
            t.index_copy_(dim, rows, value)

    def options(self, piece: Piece, scale: float, softcap: float, deterministic: bool):
        """The block product's (cu_seqlens_q, cu_seqlens_k, int_options, float_options). A part given as a slice
        (padded shards under a window) has no cu_seqlens; a _Part (varlen under a window) carries its own."""
        q_part, k_part, causal, left, right = piece

        def seqlens(part):
            if isinstance(part, slice):
                return None, None, 0
            return (None, part.cu, part.max_seqlen) if isinstance(part, _Part) else self.parts[part]

        _, cu_q, max_q = seqlens(q_part)
        _, cu_k, max_k = seqlens(k_part)
        return (cu_q, cu_k) + op_options(max_q, max_k, scale, causal, left, right, softcap, deterministic)


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


def _block_pieces(geo: _Geometry, layout: str, causal: bool, window: Tuple[int, int], ring: _Ring,
                  src: int) -> List[Piece]:
    if window == (-1, -1):
        return _pieces(layout, causal, ring.rank, src)
    if geo.dim == 0:
        return _varlen_window_pieces(geo, layout, causal, window, ring.rank, src, ring.world)
    return _window_pieces(layout, causal, window, ring.rank, src, ring.world, geo.rows)


def _merge(geo: _Geometry, part, out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """The rows `part` of out_acc / lse_acc (fp32) become the attention over both key sets, in one fused merge
    (merge_attention_states_): in place where the part is a slice, through a gathered copy where it is an index."""
    acc_out, acc_lse = geo.take(out_acc, part), geo.take(lse_acc, part, dim=-1)
    merge_attention_states_(acc_out, acc_lse, out, lse)
    if not geo.is_view(part):
        geo.put(out_acc, part, acc_out)
        geo.put(lse_acc, part, acc_lse, dim=-1)


def _ring_forward(q, k, v, geo, scale, causal, window, softcap, layout, group, deterministic, backend):
    """This rank's rows of the output and their (global) LSE."""
    ring = _Ring(group)
    out_acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if geo.dim == 0 else (q.shape[0], q.shape[2], q.shape[1])
    lse_acc = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)
    kv = [k, v]
    for step in range(ring.world):
        pending = ring.start(kv) if step < ring.world - 1 else None
        src = (ring.rank - step) % ring.world
        for piece in _block_pieces(geo, layout, causal, window, ring, src):
            qp, kp = piece[:2]
            cu_q, cu_k, int_options, float_options = geo.options(piece, scale, softcap, deterministic)
            out, lse = torch.ops.flashattn.attention_forward(
                geo.take(q, qp), geo.take(kv[0], kp), geo.take(kv[1], kp), cu_q, cu_k, None, None, int_options,
                float_options, backend)
            _merge(geo, qp, out_acc, lse_acc, out, lse)
        if pending is not None:
            kv = ring.finish(pending)
    return out_acc.to(q.dtype), lse_acc


def _ring_backward(dout, q, k, v, out, lse, geo, scale, causal, window, softcap, layout, group, deterministic,
                   backend):
    """dq, dk, dv of this rank's shard."""
    ring = _Ring(group)
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
        for piece in _block_pieces(geo, layout, causal, window, ring, src):
            qp, kp = piece[:2]
            cu_q, cu_k, int_options, float_options = geo.options(piece, scale, softcap, deterministic)
            bq, bk, bv = torch.ops.flashattn.attention_backward(
                geo.take(dout, qp), geo.take(q, qp), geo.take(kv[0], kp), geo.take(kv[1], kp),
                geo.take(out, qp), geo.take(lse, qp, dim=-1).contiguous(), cu_q, cu_k, None, None, int_options,
                float_options, backend)
            geo.put(dq, qp, bq.float(), add=True)
            block_grads.append((kp, bk, bv))
        # The block's accumulators travel while its gradients are computed: they arrive now, take this rank's
        # part and move on (one hop more than K / V after the last step: home).
        if pending_dkv is not None:
            dkv = ring.finish(pending_dkv)
        for kp, bk, bv in block_grads:
            geo.put(dkv[0], kp, bk.float(), add=True)
            geo.put(dkv[1], kp, bv.float(), add=True)
        pending_dkv = ring.start(dkv) if ring.world > 1 else None
        if pending_kv is not None:
            kv = ring.finish(pending_kv)
    if pending_dkv is not None:
        dkv = ring.finish(pending_dkv)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """The varlen ring (its geometry holds host-side offsets, so it stays out of torch.compile's graphs)."""

    @staticmethod
    def forward(ctx, q, k, v, geo, scale, causal, window, softcap, layout, group, deterministic, backend):
        out, lse = _ring_forward(q, k, v, geo, scale, causal, window, softcap, layout, group, deterministic, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (geo, scale, causal, window, softcap, layout, group, deterministic, backend)
        return out

    @staticmethod
    def backward(ctx, dout):
        grads = _ring_backward(dout, *ctx.saved_tensors, *ctx.settings)
        return grads + (None,) * 9


# ---- the padded ring as operators: torch.compile keeps it in its graph (fullgraph=True works) ----
# The process group travels by name (ProcessGroup.group_name, resolved as torch's functional collectives do); the
# geometry of a padded shard is its length alone.


def _group_of(name: str):
    return dist.distributed_c10d._resolve_process_group(name)


def _ring_op_forward(q: Tensor, k: Tensor, v: Tensor, group_name: str, scale: float, causal: bool, window_left: int,
                     window_right: int, softcap: float, layout: str, deterministic: bool,
                     backend: str) -> Tuple[Tensor, Tensor]:
    return _ring_forward(q, k, v, _Geometry(q.shape[1]), scale, causal, (window_left, window_right), softcap, layout,
                         _group_of(group_name), deterministic, backend)


ring_attention_op = torch.library.custom_op("flashattn::ring_attention", mutates_args=())(_ring_op_forward)


@ring_attention_op.register_fake
def _ring_op_forward_fake(q, k, v, group_name, scale, causal, window_left, window_right, softcap, layout,
                          deterministic, backend):
    return (q.new_empty(*q.shape[:-1], v.shape[-1]),
            q.new_empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32))


def _ring_op_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, group_name: str,
                      scale: float, causal: bool, window_left: int, window_right: int, softcap: float, layout: str,
                      deterministic: bool, backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    return _ring_backward(dout, q, k, v, out, lse, _Geometry(q.shape[1]), scale, causal, (window_left, window_right),
                          softcap, layout, _group_of(group_name), deterministic, backend)


ring_attention_backward_op = torch.library.custom_op("flashattn::ring_attention_backward", mutates_args=())(
    _ring_op_backward)


@ring_attention_backward_op.register_fake
def _ring_op_backward_fake(dout, q, k, v, out, lse, group_name, scale, causal, window_left, window_right, softcap,
                           layout, deterministic, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _ring_op_setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.settings = inputs[3:]
    ctx.mark_non_differentiable(lse)


def _ring_op_autograd(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.ring_attention_backward(dout, q, k, v, out, lse, *ctx.settings)
    return (dq, dk, dv) + (None,) * 9


ring_attention_op.register_autograd(_ring_op_autograd, setup_context=_ring_op_setup_context)


def _check_common(q, k, v, rank_dims: int, shape_name: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (init_process_group first)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank_dims:
            raise ValueError(f"{name}: expected {shape_name}, got shape {list(t.shape)}")
    tokens = rank_dims - 3
    if k.shape[:tokens + 2] != v.shape[:tokens + 2] or k.shape[:tokens + 1] != q.shape[:tokens + 1]:
        raise ValueError(f"k, v: every rank holds as many keys as queries of the same batch: q {list(q.shape)}, "
                         f"k {list(k.shape)}, v {list(v.shape)}")
    if q.shape[-2] % k.shape[-2]:
        raise ValueError(f"k: query heads ({q.shape[-2]}) must be a multiple of KV heads ({k.shape[-2]})")
    if q.dtype == torch.float64:
        # The CPU backends' fp64 backward recomputes each row's LSE from the keys it is given (the stored LSE is
        # fp32), so a block's gradients would not use the global LSE.
        raise NotImplementedError("q: float64 ring attention is not supported (fp16, bf16 and fp32 are)")


def ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, softmax_scale: Optional[float] = None,
                         window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, layout: str = "contiguous",
                         group=None, *, deterministic: bool = False, backend: str = "auto") -> Tensor:
    """Attention over the sequence whose shards the ranks of `group` (default: the world) hold; returns this rank's
    rows of the output, [b, s/P, h_q, d_v]. Arguments as flash_attn_func's; layout "contiguous" or "zigzag"."""
    _check_common(q, k, v, 4, "[batch, seqlen / ranks, heads, head_dim]")
    window = _window(window_size)
    layout = _check_layout(layout)
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"q: a zigzag shard holds two equal chunks, so its length must be even, got {q.shape[1]}")
    if q.shape[1] > INT32_MAX:
        raise ValueError(f"q: shard length {q.shape[1]} past 2^31")
    causal = check_flag("causal", causal)
    deterministic = check_flag("deterministic", deterministic)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    softcap = check_softcap(softcap)
    group = group if group is not None else dist.group.WORLD
    out, _ = torch.ops.flashattn.ring_attention(q, k, v, group.group_name, scale, causal, window[0], window[1],
                                                softcap, layout, deterministic, str(backend))
    return out


@torch.compiler.disable
def ring_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                                causal: bool = False, softmax_scale: Optional[float] = None,
                                window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                layout: str = "contiguous", group=None, *, deterministic: bool = False,
                                backend: str = "auto") -> Tensor:
    """The varlen form: a packed batch of sequences, each sharded across the ranks of `group` alike (shard_varlen:
    rank r holds part r (contiguous) or chunks r and 2P−1−r (zigzag) of every sequence). q [total/P, h_q, d],
    k, v [total/P, h_kv, d(_v)]: this rank's rows; cu_seqlens int32 (batch + 1,), the cumulative lengths of this
    rank's parts (the same on every rank: checked), max_seqlen their maximum. Returns this rank's rows of the
    output, [total/P, h_q, d_v]. Reads cu_seqlens on the host (one synchronisation per call)."""
    _check_common(q, k, v, 3, "[total / ranks, heads, head_dim]")
    window = _window(window_size)
    layout = _check_layout(layout)
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or \
            cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens: expected an int32 tensor of batch + 1 >= 1 entries")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens: on {cu_seqlens.device}, q on {q.device}")
    cu = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if cu[0] != 0 or any(n < 0 for n in lengths) or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens: must start at 0, be non-decreasing and end at q's {q.shape[0]} rows, got "
                         f"{cu[:8]}{'...' if len(cu) > 8 else ''}")
    if layout == "zigzag" and any(n % 2 for n in lengths):
        raise ValueError("cu_seqlens: a zigzag shard holds two equal chunks of every sequence, so every length "
                         f"must be even, got {lengths[:8]}{'...' if len(lengths) > 8 else ''}")
    max_seqlen = check_integer("max_seqlen", max_seqlen, max(lengths, default=0), INT32_MAX)
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, cu, group=group)
    if any(other != cu for other in every):
        raise ValueError("cu_seqlens: differs between the ranks; every rank must hold the same share of every "
                         "sequence (shard_varlen)")
    causal = check_flag("causal", causal)
    deterministic = check_flag("deterministic", deterministic)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    softcap = check_softcap(softcap)
    geo = _Geometry(q.shape[0], cu_seqlens, cu, max_seqlen, zigzag=layout == "zigzag")
    return _RingAttention.apply(q, k, v, geo, scale, causal, window, softcap, layout, group, deterministic,
                                str(backend))
