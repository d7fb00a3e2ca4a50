"""flash_attn_with_kvcache and flash_attn_varlen_func(block_table=...) against a pure-torch reference written here.

The reference gathers each sequence's used key rows [cache_leftpad, cache_seqlens + s_new) from the logical cache
(dense, or paged through block_table) after the append, and attends over them in float64 (fa_reference's
attention_ref: bottom-right causal / window over those keys, softcap, GQA). The append itself is checked element
for element: v rows bitwise, k rows bitwise too against the library's documented rotary rounding,
y0 = fma(x0, c, -(x1 * s)), y1 = fma(x0, s, x1 * c) in float32 and then rounded to the dtype, which
rotary_ref below computes exactly (a correctly rounded float32 fma from float64 and its rounding error). Every other
cache row and every page outside the block table must be left as it was.

The CPU cases run on both CPU backends (cpu_reference, auto); the `cuda` ones run the same cases and a CUDA-graph
decode loop on the GPU (skipped, and counted in the skip summary, without one).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import pytest
import torch
from torch import Tensor

import flashattn
from conftest import cpu_backends, requires_cuda
from fa_reference import assert_close, attention_ref
from flashattn._ops import kvcache_options

OPS = torch.ops.flashattn

# ---- the reference ----------------------------------------------------------------------------------------------


def _fma32(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """fma(a, b, c) of float32 tensors, correctly rounded to float32 (torch has no fma).

    a * b is exact in float64 (24 + 24 bits). The float64 sum s = a*b + c is rounded; TwoSum gives its exact error
    e. Rounding s to float32 is then the correct rounding of a*b + c unless s lies exactly halfway between two
    float32 numbers, in which case the sign of e decides (and e = 0 leaves the tie to even)."""
    ab = a.double() * b.double()
    c64 = c.double()
    s = ab + c64
    bb = s - ab
    e = (ab - (s - bb)) + (c64 - bb)
    r = s.float()
    toward = torch.where(s > r.double(), torch.full_like(r, math.inf), torch.full_like(r, -math.inf))
    other = torch.nextafter(r, toward)  # the float32 neighbour on s's side of r
    tie = (s != r.double()) & ((r.double() + other.double()) * 0.5 == s)
    # at a tie, e pointing away from r (toward `other`) makes `other` the nearer one
    away = torch.sign(e) == torch.sign(s - r.double())
    return torch.where(tie & (e != 0) & away, other, r)


def rotary_ref(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, interleaved: bool) -> Tensor:
    """x [rows, heads, d] rotated at positions [rows] (cos / sin [s_ro, rotary_dim / 2]); the columns past
    rotary_dim copied. The library's rounding: the pair's math in float32, stored rounded to x's dtype."""
    rd = 2 * cos.shape[1]
    xf = x.float()
    c = cos.float()[positions][:, None, :]  # [rows, 1, rd / 2]: every head
    s = sin.float()[positions][:, None, :]
    if interleaved:
        x0, x1 = xf[..., 0:rd:2], xf[..., 1:rd:2]
    else:
        x0, x1 = xf[..., : rd // 2], xf[..., rd // 2: rd]
    y0 = _fma32(x0, c, -(x1 * s))
    y1 = _fma32(x0, s, x1 * c)
    out = xf.clone()
    if interleaved:
        out[..., 0:rd:2], out[..., 1:rd:2] = y0, y1
    else:
        out[..., : rd // 2], out[..., rd // 2: rd] = y0, y1
    return torch.cat([out[..., :rd].to(x.dtype), x[..., rd:]], dim=-1)


def test_fma32_is_a_correctly_rounded_fma():
    """The reference's fma against exact rational arithmetic, on random values and on constructed ties."""
    from fractions import Fraction
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(4000, generator=g) for _ in range(3))
    # ties: c chosen so that a*b + c lands on a float32 midpoint plus a tiny exact remainder either way
    c[:1000] = -(a[:1000] * b[:1000])  # products and their float32 roundings: remainders exactly representable
    got = _fma32(a, b, c)
    for i in list(range(0, 4000, 7)):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        r = float(got[i])
        lo, hi = (float(torch.nextafter(got[i], torch.tensor(-math.inf))),
                  float(torch.nextafter(got[i], torch.tensor(math.inf))))
        err = abs(Fraction(r) - exact)
        assert err <= abs(Fraction(lo) - exact) and err <= abs(Fraction(hi) - exact), (i, r, float(exact))


# ---- inputs --------------------------------------------------------------------------------------------------------


def _mask_name_parts(causal, window, softcap):
    """The mask's part of a case's name: causal, window edges, softcap."""
    parts = ["causal"] if causal else []
    if window != (-1, -1):
        parts.append(f"win{window[0]}_{window[1]}")
    if softcap:
        parts.append(f"cap{softcap}")
    return parts


@dataclass(frozen=True)
class KVCase:
    batch: int
    s_q: int
    s_new: int                      # rows of k / v appended (0: none given)
    lengths: Optional[Tuple[int, ...]]  # cache_seqlens before appending (None: not given: every row)
    page: Optional[int] = None      # page size (None: dense cache)
    rotary: float = 0.0             # fraction of the head dim rotated (0: no rotary)
    interleaved: bool = True
    batch_idx: bool = False         # cache_batch_idx into a cache with more entries than the batch
    leftpad: Optional[Tuple[int, ...]] = None
    heads: Tuple[int, int] = (2, 2)
    d: int = 64
    d_v: Optional[int] = None
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    num_splits: int = 0
    dtype: torch.dtype = torch.float16
    int_seqlens: bool = False       # cache_seqlens passed as an int (every length equal)
    extra_rows: int = 3             # cache rows beyond the longest sequence

    def __str__(self):
        dt = str(self.dtype).replace("torch.", "")
        parts = [f"b{self.batch}", f"q{self.s_q}", f"new{self.s_new}",
                 "all" if self.lengths is None else "len" + "-".join(map(str, self.lengths)),
                 "dense" if self.page is None else f"page{self.page}", f"h{self.heads[0]}-{self.heads[1]}",
                 f"d{self.d}" + (f"-{self.d_v}" if self.d_v else ""), dt, f"split{self.num_splits}"]
        if self.rotary:
            parts.append(f"rot{self.rotary}{'i' if self.interleaved else 'n'}")
        if self.batch_idx:
            parts.append("idx")
        if self.leftpad is not None:
            parts.append("lp" + "-".join(map(str, self.leftpad)))
        parts += _mask_name_parts(self.causal, self.window, self.softcap)
        if self.int_seqlens:
            parts.append("int")
        return ",".join(parts)


@dataclass
class KVInputs:
    """One call's tensors (on the CPU; `to` moves them), the logical caches [entries, capacity, h_kv, d] and,
    paged, the physical pages they were scattered into."""
    q: Tensor
    cu_q: Optional[List[int]]
    k_log: Tensor
    v_log: Tensor
    capacity: int
    k_phys: Optional[Tensor] = None
    v_phys: Optional[Tensor] = None
    block_table: Optional[Tensor] = None
    page: Optional[int] = None
    k_new: Optional[Tensor] = None
    v_new: Optional[Tensor] = None
    cos: Optional[Tensor] = None
    sin: Optional[Tensor] = None
    lengths: Optional[List[int]] = None
    batch_idx: Optional[List[int]] = None
    leftpad: Optional[List[int]] = None

    @property
    def batch(self) -> int:
        return len(self.cu_q) - 1 if self.cu_q is not None else self.q.shape[0]

    def entry(self, b: int) -> int:
        return self.batch_idx[b] if self.batch_idx is not None else b

    def caches(self) -> Tuple[Tensor, Tensor]:
        """The tensors passed as k_cache / v_cache (paged: the physical pages)."""
        return (self.k_log, self.v_log) if self.block_table is None else (self.k_phys, self.v_phys)


def logical(cache: Tensor, block_table: Optional[Tensor], page: Optional[int]) -> Tensor:
    """The logical [entries, capacity, h, d] view of a cache (paged: gathered through block_table)."""
    if block_table is None:
        return cache
    bt = block_table.long().cpu()
    return cache.cpu()[bt].flatten(1, 2)  # [entries, pages, page, h, d] -> [entries, pages * page, h, d]


def make_paged(k_log: Tensor, v_log: Tensor, page: int, gen: torch.Generator, wide: bool):
    """Scatter the logical caches into shuffled pages, with spare pages (random, never referenced) mixed in. `wide`:
    the block table is a column slice of a wider one (row stride > its columns)."""
    entries, capacity = k_log.shape[:2]
    pages_per_entry = capacity // page
    num_pages = entries * pages_per_entry + 3
    order = torch.randperm(num_pages, generator=gen)
    block_table = order[: entries * pages_per_entry].view(entries, pages_per_entry).to(torch.int32)
    if wide:
        padded = torch.full((entries, pages_per_entry + 2), -7, dtype=torch.int32)
        padded[:, :pages_per_entry] = block_table
        block_table = padded[:, :pages_per_entry]
    k_phys = torch.randn(num_pages, page, *k_log.shape[2:], generator=gen).to(k_log.dtype)
    v_phys = torch.randn(num_pages, page, *v_log.shape[2:], generator=gen).to(v_log.dtype)
    bt = block_table.long()
    k_phys[bt] = k_log.view(entries, pages_per_entry, page, *k_log.shape[2:])
    v_phys[bt] = v_log.view(entries, pages_per_entry, page, *v_log.shape[2:])
    return k_phys, v_phys, block_table


def rotary_tables(rows: int, rotary_dim: int, dtype, gen: torch.Generator) -> Tuple[Tensor, Tensor]:
    angle = torch.rand(rows, rotary_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def make_inputs(case: KVCase, seed: int = 0) -> KVInputs:
    g = torch.Generator().manual_seed(seed)
    hq, hkv = case.heads
    d, dv, dt, b = case.d, case.d_v or case.d, case.dtype, case.batch

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dt)

    used = [(n if n is not None else 0) + case.s_new for n in (case.lengths or [0] * b)]
    rows = max(used, default=0) + case.extra_rows
    if case.page is not None:
        rows = -(-rows // case.page) * case.page  # whole pages
    entries = b + 2 if case.batch_idx else b
    k_log, v_log = randn(entries, rows, hkv, d), randn(entries, rows, hkv, dv)
    inp = KVInputs(q=randn(b, case.s_q, hq, d), cu_q=None, k_log=k_log, v_log=v_log, capacity=rows)
    if case.page is not None:
        inp.k_phys, inp.v_phys, inp.block_table = make_paged(k_log, v_log, case.page, g, wide=case.batch_idx)
        inp.page = case.page
    if case.s_new:
        inp.k_new, inp.v_new = randn(b, case.s_new, hkv, d), randn(b, case.s_new, hkv, dv)
    if case.rotary:
        rd = max(2, 2 * int(d * case.rotary / 2))
        # positions up to cache_seqlens + s_q - 1 for q (flash_attn reads past the table otherwise)
        inp.cos, inp.sin = rotary_tables(rows + case.s_q + 5, rd, dt, g)
    inp.lengths = list(case.lengths) if case.lengths is not None else None
    if case.batch_idx:
        inp.batch_idx = torch.randperm(entries, generator=g)[:b].tolist()
    inp.leftpad = list(case.leftpad) if case.leftpad is not None else None
    return inp


def to_device(t, device):
    return None if t is None else t.to(device)


def index_tensor(values, device):
    return None if values is None else torch.tensor(values, dtype=torch.int32, device=device)


# ---- the reference over inputs -------------------------------------------------------------------------------------


def expected_caches(inp: KVInputs, interleaved: bool) -> Tuple[Tensor, Tensor]:
    """The logical caches after the append: k_new rotated at its absolute rows, v_new as it is."""
    k, v = inp.k_log.clone(), inp.v_log.clone()
    if inp.k_new is None:
        return k, v
    s_new = inp.k_new.shape[1]
    for b in range(inp.batch):
        e, start = inp.entry(b), inp.lengths[b]
        rows = torch.arange(start, start + s_new)
        kn = inp.k_new[b]
        if inp.cos is not None:
            kn = rotary_ref(kn, inp.cos, inp.sin, rows, interleaved)
        k[e, start:start + s_new] = kn
        v[e, start:start + s_new] = inp.v_new[b]
    return k, v


def reference(inp: KVInputs, k_exp: Tensor, v_exp: Tensor, *, causal, window, softcap, interleaved,
              scale=None, dtype=torch.float64, chunk=0, qv=None) -> Tuple[Tensor, Tensor]:
    """out and lse (padded: [b, s_q, h, d_v] / [b, h, s_q]; varlen: [total_q, h, d_v] / [h, total_q]) of every
    sequence attending over its used keys [leftpad, cache_seqlens + s_new) of the appended cache (chunks counted
    from leftpad). qv: FA3's query-value term, laid out like q (not rotated)."""
    s_new = 0 if inp.k_new is None else inp.k_new.shape[1]
    per_row = causal or window[0] >= 0 or window[1] >= 0 or chunk > 0
    outs, lses = [], []
    for b in range(inp.batch):
        rows = slice(inp.cu_q[b], inp.cu_q[b + 1]) if inp.cu_q is not None else b
        qb = inp.q[rows]
        qvb = None if qv is None else qv[rows][None]
        end = (inp.lengths[b] if inp.lengths is not None else inp.capacity) + s_new
        begin = inp.leftpad[b] if inp.leftpad is not None else 0
        if inp.cos is not None:
            pos = inp.lengths[b] + torch.arange(qb.shape[0]) * int(per_row)
            qb = rotary_ref(qb, inp.cos, inp.sin, pos, interleaved)
        e = inp.entry(b)
        o, l = attention_ref(qb[None], k_exp[e, begin:end][None], v_exp[e, begin:end][None], causal=causal,
                             window=window, softcap=softcap, scale=scale, dtype=dtype, chunk=chunk, qv=qvb)
        outs.append(o[0])
        lses.append(l[0])
    if inp.cu_q is not None:
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.stack(outs), torch.stack(lses)


def check_caches(inp: KVInputs, k_cache: Tensor, v_cache: Tensor, k_exp: Tensor, v_exp: Tensor):
    """The caches after the call: the appended rows as expected (bitwise), every other row and page untouched."""
    k_got, v_got = logical(k_cache, inp.block_table, inp.page).cpu(), logical(v_cache, inp.block_table, inp.page).cpu()
    for name, got, exp in (("k_cache", k_got, k_exp), ("v_cache", v_got, v_exp)):
        if not torch.equal(got, exp):
            bad = (got != exp).reshape(got.shape[0], got.shape[1], -1).any(-1).nonzero().tolist()
            diff = (got.double() - exp.double()).abs().max().item()
            raise AssertionError(f"{name}: (entry, row) pairs differ from the expected append: {bad[:8]} "
                                 f"({len(bad)} rows, max diff {diff:.3g})")
    if inp.block_table is not None:
        spare = sorted(set(range(inp.k_phys.shape[0])) - set(inp.block_table.flatten().tolist()))
        assert torch.equal(k_cache.cpu()[spare], inp.k_phys[spare]), "k_cache: a page outside block_table changed"
        assert torch.equal(v_cache.cpu()[spare], inp.v_phys[spare]), "v_cache: a page outside block_table changed"


def check_outputs(out: Tensor, lse: Tensor, r64: Tuple[Tensor, Tensor], low: Tuple[Tensor, Tensor], dtype):
    assert out.dtype == dtype and lse.dtype == torch.float32
    out, lse = out.cpu(), lse.cpu()
    assert_close("out", out, r64[0], low[0], dtype)
    assert_close("lse", lse, r64[1], low[1], torch.float32 if dtype == torch.float64 else dtype)  # lse: fp32
    # rows that see no key: out exactly 0 (and lse -inf, checked above)
    empty = torch.isinf(r64[1])  # [b, h, s_q] or [h, total_q]
    empty_rows = empty.transpose(-1, -2)  # [b, s_q, h] or [total_q, h]
    assert torch.equal(out[empty_rows], torch.zeros_like(out[empty_rows])), "out: rows without keys are not 0"


def check_call(inp: KVInputs, case: KVCase, k_arg: Tensor, v_arg: Tensor, out: Tensor, lse: Tensor, **extra):
    """A call on `case`'s inputs after the fact: the caches hold the expected append, and out / lse match the
    float64 and same-dtype references (`extra`: reference's further keywords, e.g. chunk, qv)."""
    k_exp, v_exp = expected_caches(inp, case.interleaved)
    check_caches(inp, k_arg, v_arg, k_exp, v_exp)
    kw = dict(causal=case.causal, window=case.window, softcap=case.softcap, interleaved=case.interleaved, **extra)
    check_outputs(out, lse, reference(inp, k_exp, v_exp, **kw), reference(inp, k_exp, v_exp, dtype=None, **kw),
                  case.dtype)


# ---- running a case ------------------------------------------------------------------------------------------------


def run_with_kvcache(case: KVCase, backend: str, device: str = "cpu", dtype=None, seed: int = 0):
    """flash_attn_with_kvcache on `case` against the reference: outputs, and the caches after the append."""
    if dtype is not None:
        case = replace(case, dtype=dtype)
    inp = make_inputs(case, seed)
    k_arg, v_arg = (t.clone().to(device) for t in inp.caches())
    lengths = inp.lengths
    if case.int_seqlens:
        assert len(set(lengths)) == 1
        cache_seqlens = lengths[0]
    else:
        cache_seqlens = index_tensor(lengths, device)
    out, lse = flashattn.flash_attn_with_kvcache(
        inp.q.to(device), k_arg, v_arg, to_device(inp.k_new, device), to_device(inp.v_new, device),
        to_device(inp.cos, device), to_device(inp.sin, device), cache_seqlens, index_tensor(inp.batch_idx, device),
        index_tensor(inp.leftpad, device), to_device(inp.block_table, device), causal=case.causal,
        window_size=case.window, softcap=case.softcap, rotary_interleaved=case.interleaved,
        num_splits=case.num_splits, return_softmax_lse=True, backend=backend)
    assert out.shape == (case.batch, case.s_q, case.heads[0], case.d_v or case.d)
    assert lse.shape == (case.batch, case.heads[0], case.s_q)
    assert out.device == inp.q.to(device).device and not out.requires_grad
    check_call(inp, case, k_arg, v_arg, out, lse)
    return out, lse


def _grid() -> List[KVCase]:
    """Every s_q x cache layout x rotary style, with the other axes cycling through their values (GQA / MQA, head
    dims 64 / 59, masks, num_splits, dtypes, cache_batch_idx, cache_leftpad, new rows or none, empty caches)."""
    rng = random.Random(20261202)
    heads = [(2, 2), (8, 2), (4, 1)]
    dims = [64, 59]
    masks = [dict(), dict(causal=True), dict(window=(3, 0)), dict(window=(2, 1)), dict(causal=True, softcap=3.0),
             dict(softcap=5.0), dict(causal=True, window=(4, -1)), dict(window=(0, 0))]
    splits = [1, 3, 0]
    dtypes = [torch.float16, torch.bfloat16, torch.float32]
    rotary = [(0.0, True), (0.5, True), (0.5, False), (1.0, True), (1.0, False)]
    cases, i = [], 0
    for s_q in (1, 2, 16):
        for page in (None, 1, 16, 64):
            for frac, interleaved in rotary:
                batch = rng.choice([1, 2, 3])
                with_new = frac > 0 or rng.random() < 0.6
                s_new = 0 if not with_new else (s_q if rng.random() < 0.75 else rng.choice([1, 3]))
                lengths = [0 if (i + b) % 4 == 0 else rng.randint(1, 40) for b in range(batch)]
                leftpad = None
                if rng.random() < 0.35:
                    leftpad = [rng.randint(0, n) for n in lengths]
                cases.append(KVCase(batch, s_q, s_new, tuple(lengths), page, frac, interleaved,
                                    batch_idx=rng.random() < 0.4, leftpad=None if leftpad is None else tuple(leftpad),
                                    heads=heads[i % 3], d=dims[(i // 3) % 2], num_splits=splits[(i // 2) % 3],
                                    dtype=dtypes[i % 3], **masks[i % len(masks)]))
                i += 1
    return cases


GRID = _grid()
SPECIAL = [
    # head dim 128
    KVCase(2, 1, 1, (37, 0), page=16, rotary=1.0, interleaved=False, heads=(8, 2), d=128, causal=True,
           dtype=torch.bfloat16),
    KVCase(2, 16, 16, (5, 30), rotary=0.5, heads=(4, 4), d=128, window=(8, 0), dtype=torch.float16, num_splits=3),
    KVCase(1, 2, 2, (60,), page=64, heads=(4, 1), d=128, d_v=128, softcap=4.0, dtype=torch.float32, num_splits=1),
    # head dim of v unlike q's
    KVCase(2, 2, 2, (3, 9), heads=(4, 2), d=64, d_v=32, causal=True, dtype=torch.float32),
    # rows that see no key: s_q > keys under causal, no key at all, leftpad at the end of the used rows
    KVCase(2, 16, 2, (0, 3), page=16, causal=True, heads=(4, 1), dtype=torch.bfloat16),
    KVCase(2, 2, 0, (0, 0), heads=(2, 2), dtype=torch.float16),
    KVCase(2, 2, 0, (0, 0), page=1, causal=True, heads=(2, 2), dtype=torch.float32),
    KVCase(3, 2, 0, (5, 9, 4), leftpad=(5, 2, 4), page=16, causal=True, dtype=torch.float16),
    KVCase(2, 1, 1, (7, 7), leftpad=(7, 0), rotary=1.0, dtype=torch.bfloat16),
    KVCase(2, 16, 0, (4, 20), window=(0, 0), causal=True, dtype=torch.float32),
    # cache_seqlens as an int; cache_seqlens not given (every row of the cache)
    KVCase(3, 1, 1, (12, 12, 12), rotary=0.5, int_seqlens=True, causal=True, heads=(8, 2), dtype=torch.float16),
    KVCase(2, 2, 2, (0, 0), page=16, int_seqlens=True, batch_idx=True, dtype=torch.bfloat16),
    KVCase(2, 3, 0, None, heads=(4, 2), causal=True, dtype=torch.float16),
    KVCase(2, 3, 0, None, page=16, batch_idx=True, window=(5, 1), dtype=torch.float32),
    # float64 (CPU only): the append copies exactly; rotary is a float64 fma there (not float32): left out
    KVCase(2, 2, 2, (4, 11), page=16, causal=True, dtype=torch.float64),
    # the appended rows fill the cache to its last row; a page size that does not divide the lengths
    KVCase(2, 3, 3, (61, 2), page=16, rotary=1.0, extra_rows=0, causal=True, dtype=torch.float16),
]
ALL_CASES = GRID + SPECIAL


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_with_kvcache(case, backend):
    run_with_kvcache(case, backend)


def test_grid_covers_every_axis():
    """The cases hold every value of every axis the grid is meant to cover (a refactor must not drop one)."""
    def has(pred):
        return any(pred(c) for c in ALL_CASES)
    for s_q in (1, 2, 16):
        assert has(lambda c: c.s_q == s_q)
    for page in (None, 1, 16, 64):
        assert has(lambda c: c.page == page)
    for frac in (0.0, 0.5, 1.0):
        for inter in (True, False):
            assert has(lambda c: c.rotary == frac and (frac == 0 or c.interleaved == inter))
    for hd in (64, 59, 128):
        assert has(lambda c: c.d == hd)
    for heads in ((2, 2), (8, 2), (4, 1)):
        assert has(lambda c: c.heads == heads)
    for n in (1, 3, 0):
        assert has(lambda c: c.num_splits == n)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        assert has(lambda c: c.dtype == dt)
    assert has(lambda c: c.s_new == 0) and has(lambda c: c.s_new > 0)
    assert has(lambda c: c.batch_idx) and has(lambda c: c.leftpad is not None)
    assert has(lambda c: c.lengths is not None and 0 in c.lengths)
    assert has(lambda c: c.causal) and has(lambda c: c.window != (-1, -1)) and has(lambda c: c.softcap > 0)


def test_int_cache_seqlens_equals_the_tensor():
    case = KVCase(3, 2, 2, (9, 9, 9), page=16, rotary=1.0, causal=True, dtype=torch.float32)
    a = run_with_kvcache(case, "cpu_reference")
    b = run_with_kvcache(replace(case, int_seqlens=True), "cpu_reference")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_return_values_and_strided_inputs():
    """return_softmax_lse=False returns out alone; q, k, v with other strides (a permuted q, a k slice) give the
    same result as contiguous ones."""
    case = KVCase(2, 4, 4, (3, 8), page=16, rotary=0.5, interleaved=False, causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    kc, vc = (t.clone() for t in inp.caches())
    kw = dict(rotary_cos=inp.cos, rotary_sin=inp.sin, cache_seqlens=index_tensor(inp.lengths, "cpu"),
              block_table=inp.block_table, causal=True, rotary_interleaved=False)
    out = flashattn.flash_attn_with_kvcache(inp.q, kc, vc, inp.k_new, inp.v_new, **kw)
    assert isinstance(out, Tensor)
    kc2, vc2 = (t.clone() for t in inp.caches())
    q_strided = inp.q.transpose(1, 2).contiguous().transpose(1, 2)  # [b, s, h, d] stored as [b, h, s, d]
    k_wide = torch.cat([inp.k_new, inp.k_new], dim=-1)[..., : inp.k_new.shape[-1]]  # row stride 2d
    out2 = flashattn.flash_attn_with_kvcache(q_strided, kc2, vc2, k_wide, inp.v_new, **kw)
    assert torch.equal(out, out2) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    # a non-contiguous last dimension of q / k is copied, not rejected (the caches are written: not copied)
    kc3, vc3 = (t.clone() for t in inp.caches())
    q_cols = torch.stack([inp.q, inp.q], dim=-1)[..., 0]
    out3 = flashattn.flash_attn_with_kvcache(q_cols, kc3, vc3, inp.k_new, inp.v_new, **kw)
    assert q_cols.stride(-1) == 2 and torch.equal(out, out3)


def test_inference_only_outputs_do_not_require_grad():
    """As in flash_attn: inputs that require grad still run, the outputs require no grad (no graph through the
    call, so no gradient can silently come out wrong), and the caches' version counters see the append."""
    case = KVCase(2, 1, 1, (3, 5), dtype=torch.float32)
    inp = make_inputs(case)
    q = inp.q.clone().requires_grad_()
    k_new = inp.k_new.clone().requires_grad_()
    kc, vc = inp.k_log.clone(), inp.v_log.clone()
    version = kc._version
    out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, k_new, inp.v_new, cache_seqlens=index_tensor(inp.lengths,
                                                 "cpu"), return_softmax_lse=True)
    assert not out.requires_grad and not lse.requires_grad and out.grad_fn is None
    assert kc._version > version
    with pytest.raises(RuntimeError):
        out.sum().backward()


# ---- the operator: opcheck, torch.compile, unchecked index values --------------------------------------------------


def op_args(inp: KVInputs, case: KVCase, *, check_index_values=True, backend="cpu_reference", device="cpu",
            lengths=None, batch_idx=None):
    ints, floats = kvcache_options(0, (case.d ** -0.5), case.causal, case.window[0], case.window[1], case.softcap,
                                   case.interleaved, case.num_splits, 0, check_index_values)
    k_arg, v_arg = (t.clone().to(device) for t in inp.caches())
    return (inp.q.to(device), k_arg, v_arg, to_device(inp.k_new, device), to_device(inp.v_new, device),
            to_device(inp.cos, device), to_device(inp.sin, device),
            index_tensor(inp.lengths if lengths is None else lengths, device),
            index_tensor(inp.batch_idx if batch_idx is None else batch_idx, device),
            index_tensor(inp.leftpad, device), to_device(inp.block_table, device), None, None, None, None,
            None, None, None, ints, floats, inp.q.dtype, backend)


OPCHECK_CASES = [
    KVCase(2, 1, 1, (3, 9), page=16, rotary=1.0, causal=True, heads=(4, 2), d=16, dtype=torch.float32),
    KVCase(2, 2, 0, (5, 0), batch_idx=True, leftpad=(2, 0), d=8, dtype=torch.float32),
    KVCase(1, 3, 3, (4,), rotary=0.5, interleaved=False, window=(2, 0), d=8, dtype=torch.float32),
]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=str)
def test_opcheck(case):
    # The append writes the same rows with the same values each time: opcheck's repeated calls agree.
    torch.library.opcheck(OPS.attention_with_kvcache.default, op_args(make_inputs(case), case))


def test_opcheck_varlen_queries():
    case = KVCase(2, 1, 0, (7, 12), page=16, heads=(4, 2), d=8, causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    args = list(op_args(inp, case))
    args[0] = torch.randn(5, 4, 8)
    args[11] = torch.tensor([0, 2, 5], dtype=torch.int32)
    torch.library.opcheck(OPS.attention_with_kvcache.default, tuple(args))


def decode_step(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, block_table):
    return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, cache_seqlens,
                                             block_table=block_table, causal=True, return_softmax_lse=True)


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph_mutates_the_caches(compiler):
    """torch.compile(fullgraph=True) of a decode step: no graph break, the same outputs and the same caches as in
    eager mode (the append is a declared mutation, functionalized and written back)."""
    torch._dynamo.reset()
    case = KVCase(2, 1, 1, (4, 17), page=16, rotary=1.0, causal=True, heads=(4, 2), d=32, dtype=torch.float32)
    inp = make_inputs(case)
    args = lambda: (inp.q, *(t.clone() for t in inp.caches()), inp.k_new, inp.v_new, inp.cos, inp.sin,  # noqa: E731
                    index_tensor(inp.lengths, "cpu"), inp.block_table)
    eager_args, compiled_args = args(), args()
    explanation = torch._dynamo.explain(decode_step)(*args())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    expected = decode_step(*eager_args)
    got = torch.compile(decode_step, fullgraph=True, backend=compiler)(*compiled_args)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    for e, g in zip(eager_args[1:3], compiled_args[1:3]):
        assert torch.equal(e, g), "the compiled step left other caches than eager mode"


@pytest.mark.parametrize("page", [None, 16], ids=["dense", "paged"])
def test_unchecked_index_values_are_clamped(page):
    """check_index_values=False (what the Python layer passes under CUDA-graph capture): out-of-range values are
    made harmless as params.h documents: lengths clamped to the capacity, an entry out of range is an empty
    sequence (out 0, lse -inf, nothing written), a page out of range reads as zero rows and takes no writes."""
    case = KVCase(2, 2, 0, (5, 9), page=page, d=8, causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    cap = inp.capacity
    kw = dict(causal=True, window=(-1, -1), softcap=0.0, interleaved=True)
    # lengths past the capacity attend over the whole entry
    out, lse = OPS.attention_with_kvcache(*op_args(inp, case, check_index_values=False, lengths=[cap + 40, 3]))
    r = reference(replace(inp, lengths=[cap, 3]), inp.k_log, inp.v_log, **kw)
    check_outputs(out, lse, r, r, torch.float32)
    with pytest.raises(ValueError, match=r"^(block_table|k_cache): cache_seqlens\[0\]"):  # checked: an error
        OPS.attention_with_kvcache(*op_args(inp, case, lengths=[cap + 40, 3]))

    # an entry out of range: an empty sequence, and its new rows are written nowhere
    case2 = replace(case, s_new=2)
    inp2 = make_inputs(case2)
    args = op_args(inp2, case2, check_index_values=False, batch_idx=[0, 99])
    out, lse = OPS.attention_with_kvcache(*args)
    assert torch.isinf(lse[1]).all() and not out[1].any()
    k_exp, v_exp = expected_caches(replace(inp2, batch_idx=[0, 1]), True)
    k_exp[1], v_exp[1] = inp2.k_log[1], inp2.v_log[1]  # entry 1 is not sequence 1's: left as it was
    check_caches(inp2, args[1], args[2], k_exp, v_exp)
    with pytest.raises(ValueError, match=r"^cache_batch_idx: entry 1 is 99"):
        OPS.attention_with_kvcache(*op_args(inp2, case2, batch_idx=[0, 99]))
    if page is None:
        return

    # a page out of range: its rows read as zeros, and rows appended into it are dropped
    bad = inp2.block_table.clone()
    bad[1, 0] = 1000  # sequence 1's rows 0..15: its cache rows 0..8 and the two appended at 9, 10
    inp3 = replace(inp2, block_table=bad)
    args = op_args(inp3, case2, check_index_values=False)
    out, lse = OPS.attention_with_kvcache(*args)
    k_exp, v_exp = expected_caches(inp2, True)
    k_exp[1, :16], v_exp[1, :16] = 0, 0
    r = reference(inp2, k_exp, v_exp, **kw)
    check_outputs(out, lse, r, r, torch.float32)
    k_phys, v_phys = args[1], args[2]
    for name, got, before in (("k_cache", k_phys, inp2.k_phys), ("v_cache", v_phys, inp2.v_phys)):
        changed = sorted(set((got != before).flatten(1).any(1).nonzero().flatten().tolist()))
        assert changed == [int(inp2.block_table[0, 0])], f"{name}: pages written: {changed}"  # sequence 0's only


def test_native_module_with_numpy_arrays():
    """flashattn._C.attention_with_kvcache on numpy arrays (no torch tensor): every KVCacheArgs field, caches
    written in place, the same result as the torch layer; a bad argument maps to ValueError naming it."""
    import numpy as np
    case = KVCase(2, 2, 2, (3, 10), page=16, rotary=0.5, interleaved=False, batch_idx=True, leftpad=(1, 0),
                  causal=True, dtype=torch.float32)
    inp = make_inputs(case)
    kc, vc = (t.clone() for t in inp.caches())
    idx = lambda v: np.array(v, dtype=np.int32)  # noqa: E731
    out = np.empty((2, 2, 2, 64), np.float32)
    lse = np.empty((2, 2, 2), np.float32)
    ran = flashattn._C.attention_with_kvcache(
        inp.q.numpy(), kc.numpy(), vc.numpy(), out, lse, inp.k_new.numpy(), inp.v_new.numpy(), inp.cos.numpy(),
        inp.sin.numpy(), idx(inp.lengths), idx(inp.batch_idx), idx(inp.leftpad), inp.block_table.numpy(), None, 0,
        softmax_scale=64 ** -0.5, causal=True, rotary_interleaved=False, num_splits=1, backend="cpu_reference")
    assert ran == "cpu_reference"
    kc2, vc2 = (t.clone() for t in inp.caches())
    ref_out, ref_lse = flashattn.flash_attn_with_kvcache(
        inp.q, kc2, vc2, inp.k_new, inp.v_new, inp.cos, inp.sin, index_tensor(inp.lengths, "cpu"),
        index_tensor(inp.batch_idx, "cpu"), index_tensor(inp.leftpad, "cpu"), inp.block_table, causal=True,
        rotary_interleaved=False, return_softmax_lse=True, backend="cpu_reference")
    assert torch.equal(torch.from_numpy(out), ref_out) and torch.equal(torch.from_numpy(lse), ref_lse)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    with pytest.raises(ValueError, match=r"^k_new: expected shape"):
        flashattn._C.attention_with_kvcache(inp.q.numpy(), kc.numpy(), vc.numpy(), out, None, inp.k_new.numpy()[:1],
                                            inp.v_new.numpy(), cache_seqlens=idx(inp.lengths),
                                            cache_batch_idx=idx(inp.batch_idx), block_table=inp.block_table.numpy())
    with pytest.raises(TypeError, match=r"^cache_seqlens: unsupported dtype int64"):
        flashattn._C.attention_with_kvcache(inp.q.numpy(), kc.numpy(), vc.numpy(), out,
                                            cache_seqlens=np.array(inp.lengths, dtype=np.int64))


# ---- flash_attn_varlen_func over a paged cache ---------------------------------------------------------------------


@dataclass(frozen=True)
class PagedVarlenCase:
    lengths_q: Tuple[int, ...]
    lengths_k: Tuple[int, ...]
    page: int
    heads: Tuple[int, int]
    d: int
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dtype: torch.dtype = torch.float16

    def __str__(self):
        parts = [f"q{'-'.join(map(str, self.lengths_q))}", f"k{'-'.join(map(str, self.lengths_k))}",
                 f"page{self.page}", f"h{self.heads[0]}-{self.heads[1]}", f"d{self.d}",
                 str(self.dtype).replace("torch.", "")]
        parts += _mask_name_parts(self.causal, self.window, self.softcap)
        return ",".join(parts)


PAGED_VARLEN = [
    PagedVarlenCase((1, 1, 1), (5, 0, 33), 16, (4, 1), 64, causal=True, dtype=torch.bfloat16),  # decode, MQA
    PagedVarlenCase((3, 0, 7), (10, 4, 7), 1, (8, 2), 59, causal=True, dtype=torch.float16),    # empty query seq
    PagedVarlenCase((16, 2), (40, 64), 64, (2, 2), 64, window=(3, 1), dtype=torch.float32),
    PagedVarlenCase((4, 5), (9, 20), 16, (4, 4), 128, softcap=4.0, dtype=torch.bfloat16),
    PagedVarlenCase((16, 3), (5, 0), 16, (4, 2), 64, causal=True, dtype=torch.float32),         # masked rows
]


def paged_varlen_inputs(case: PagedVarlenCase, seed: int = 0) -> KVInputs:
    g = torch.Generator().manual_seed(seed)
    hq, hkv = case.heads
    b = len(case.lengths_q)
    pages = -(-(max(case.lengths_k) + 3) // case.page)
    cap = pages * case.page
    k_log = torch.randn(b, cap, hkv, case.d, generator=g).to(case.dtype)
    v_log = torch.randn(b, cap, hkv, case.d, generator=g).to(case.dtype)
    k_phys, v_phys, bt = make_paged(k_log, v_log, case.page, g, wide=False)
    cu_q = [0] + torch.tensor(case.lengths_q).cumsum(0).tolist()
    q = torch.randn(cu_q[-1], hq, case.d, generator=g).to(case.dtype)
    return KVInputs(q=q, cu_q=cu_q, k_log=k_log, v_log=v_log, capacity=cap, k_phys=k_phys, v_phys=v_phys,
                    block_table=bt, page=case.page, lengths=list(case.lengths_k))


def run_paged_varlen(case: PagedVarlenCase, backend: str, lengths_from: str, device: str = "cpu", dtype=None):
    if dtype is not None:
        case = replace(case, dtype=dtype)
    inp = paged_varlen_inputs(case)
    kc, vc = (t.clone().to(device) for t in inp.caches())
    cu_q = torch.tensor(inp.cu_q, dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + torch.tensor(case.lengths_k).cumsum(0).tolist(), dtype=torch.int32, device=device)
    kw = dict(causal=case.causal, window_size=case.window, softcap=case.softcap, return_attn_probs=True,
              block_table=inp.block_table.to(device), backend=backend)
    with torch.no_grad():
        if lengths_from == "cu_seqlens_k":
            out, lse, probs = flashattn.flash_attn_varlen_func(inp.q.to(device), kc, vc, cu_q, cu_k,
                                                               max(case.lengths_q), max(case.lengths_k), **kw)
        else:  # vLLM's call: seqused_k, no cu_seqlens_k
            out, lse, probs = flashattn.flash_attn_varlen_func(
                inp.q.to(device), kc, vc, cu_q, None, max(case.lengths_q), max(case.lengths_k),
                seqused_k=torch.tensor(case.lengths_k, dtype=torch.int32, device=device), **kw)
    assert probs is None and out.shape == (inp.q.shape[0], case.heads[0], case.d)
    assert lse.shape == (case.heads[0], inp.q.shape[0])
    check_caches(inp, kc, vc, inp.k_log, inp.v_log)  # nothing is written
    kw = dict(causal=case.causal, window=case.window, softcap=case.softcap, interleaved=True)
    check_outputs(out, lse, reference(inp, inp.k_log, inp.v_log, **kw),
                  reference(inp, inp.k_log, inp.v_log, dtype=None, **kw), case.dtype)


@pytest.mark.parametrize("lengths_from", ["cu_seqlens_k", "seqused_k"])
@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", PAGED_VARLEN, ids=str)
def test_varlen_paged(case, backend, lengths_from):
    run_paged_varlen(case, backend, lengths_from)


def test_varlen_paged_matches_with_kvcache():
    """A decode batch through both entry points (varlen q of one row each vs padded q [b, 1, h, d]): equal."""
    case = PagedVarlenCase((1, 1, 1), (5, 0, 33), 16, (4, 1), 64, causal=True, dtype=torch.float32)
    inp = paged_varlen_inputs(case)
    cu_q = torch.arange(4, dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 5, 38], dtype=torch.int32)
    a = flashattn.flash_attn_varlen_func(inp.q, inp.k_phys, inp.v_phys, cu_q, cu_k, 1, 33, causal=True,
                                         block_table=inp.block_table)
    b = flashattn.flash_attn_with_kvcache(inp.q[:, None], inp.k_phys, inp.v_phys, cache_seqlens=torch.tensor(
        [5, 0, 33], dtype=torch.int32), block_table=inp.block_table, causal=True)
    assert torch.equal(a, b[:, 0])


def test_varlen_paged_is_inference_only():
    case = PAGED_VARLEN[0]
    inp = paged_varlen_inputs(replace(case, dtype=torch.float32))
    q = inp.q.clone().requires_grad_()
    cu_q, cu_k = torch.arange(4, dtype=torch.int32), torch.tensor([0, 5, 5, 38], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"^block_table: the paged path \(block_table\) is inference-only"):
        flashattn.flash_attn_varlen_func(q, inp.k_phys, inp.v_phys, cu_q, cu_k, 1, 33, block_table=inp.block_table)
    with torch.no_grad():  # the same call without grad mode runs
        flashattn.flash_attn_varlen_func(q, inp.k_phys, inp.v_phys, cu_q, cu_k, 1, 33, block_table=inp.block_table)
    with torch.inference_mode():
        flashattn.flash_attn_varlen_func(q, inp.k_phys, inp.v_phys, cu_q, cu_k, 1, 33, block_table=inp.block_table)


# ---- errors: each names the argument -------------------------------------------------------------------------------


def error_call(**change):
    """A valid paged decode call (b = 2, 16 rows per sequence: one page of 16), with `change` applied."""
    g = torch.Generator().manual_seed(3)
    kw = dict(q=torch.randn(2, 1, 4, 16, generator=g), k_cache=torch.randn(5, 16, 2, 16, generator=g),
              v_cache=torch.randn(5, 16, 2, 16, generator=g), k=torch.randn(2, 1, 2, 16, generator=g),
              v=torch.randn(2, 1, 2, 16, generator=g), cache_seqlens=torch.tensor([3, 7], dtype=torch.int32),
              block_table=torch.tensor([[4], [1]], dtype=torch.int32), causal=True)
    cos, sin = rotary_tables(16, 8, torch.float32, g)
    kw.update(rotary_cos=cos, rotary_sin=sin)
    for name, value in change.items():
        if value is None:
            kw.pop(name, None)
        else:
            kw[name] = value(kw) if callable(value) else value
    return kw


I32 = torch.int32
KV_ERRORS = [
    ("cache_seqlens_int64", dict(cache_seqlens=torch.tensor([3, 7])), TypeError,
     r"^cache_seqlens: dtype must be torch.int32, got torch.int64"),
    ("cache_seqlens_float", dict(cache_seqlens=2.5), TypeError, r"^cache_seqlens: expected an integer"),
    ("cache_seqlens_int_negative", dict(cache_seqlens=-1), ValueError, r"^cache_seqlens: must be in \[0"),
    ("cache_seqlens_negative", dict(cache_seqlens=torch.tensor([-1, 7], dtype=I32)), ValueError,
     r"^cache_seqlens: entry 0 is negative"),
    ("cache_seqlens_shape", dict(cache_seqlens=torch.tensor([3, 7, 1], dtype=I32)), ValueError,
     r"^cache_seqlens: expected shape \[2\]"),
    ("cache_seqlens_missing", dict(cache_seqlens=None, rotary_cos=None, rotary_sin=None), ValueError,
     r"^cache_seqlens: required when k / v are appended"),
    ("past_capacity_paged", dict(cache_seqlens=torch.tensor([3, 16], dtype=I32)), ValueError,
     r"^block_table: cache_seqlens\[1\] \(16\) \+ 1 new rows exceeds the 16 rows"),
    ("past_capacity_dense", dict(block_table=None, k_cache=lambda kw: kw["k_cache"][:2],
                                 v_cache=lambda kw: kw["v_cache"][:2],
                                 cache_seqlens=torch.tensor([16, 0], dtype=I32)), ValueError,
     r"^k_cache: cache_seqlens\[0\] \(16\) \+ 1 new rows exceeds the 16 rows the cache addresses \(k_cache's dim 1\)"),
    ("block_table_rank", dict(block_table=torch.tensor([4, 1], dtype=I32)), ValueError,
     r"^block_table: expected a rank-2"),
    ("block_table_dtype", dict(block_table=torch.tensor([[4], [1]])), TypeError, r"^block_table: dtype must be"),
    ("block_table_rows", dict(block_table=torch.tensor([[4]], dtype=I32)), ValueError,
     r"^block_table: 1 rows for a batch of 2"),
    ("page_out_of_range", dict(block_table=torch.tensor([[4], [5]], dtype=I32)), ValueError,
     r"^block_table: row 1, column 0 is page 5, outside \[0, 5\)"),
    ("page_negative", dict(block_table=torch.tensor([[-1], [1]], dtype=I32)), ValueError,
     r"^block_table: row 0, column 0 is page -1"),
    ("rotary_without_k", dict(k=None, v=None), ValueError, r"^rotary_cos: rotary embedding needs the new rows k / v"),
    ("rotary_sin_missing", dict(rotary_sin=None), ValueError, r"^rotary_sin: required when rotary_cos is given"),
    ("rotary_dtype", dict(rotary_cos=lambda kw: kw["rotary_cos"].double()), TypeError, r"^rotary_cos: dtype"),
    ("rotary_rows", dict(rotary_cos=lambda kw: kw["rotary_cos"][:8], rotary_sin=lambda kw: kw["rotary_sin"][:8]),
     ValueError, r"^rotary_cos: 8 positions, but rows are rotated at positions up to 15 \(the cache's rows\)"),
    ("rotary_dim", dict(rotary_cos=lambda kw: torch.ones(16, 9), rotary_sin=lambda kw: torch.ones(16, 9)),
     ValueError, r"^rotary_cos: rotary_dim \(2 x dim 1 = 18\) must be in \[2, head dim 16\]"),
    ("heads", dict(q=lambda kw: torch.randn(2, 1, 3, 16)), ValueError,
     r"^k_cache: query heads \(3\) must be a multiple"),
    ("k_without_v", dict(v=None, rotary_cos=None, rotary_sin=None), ValueError, r"^v: required when k is given"),
    ("k_shape", dict(k=lambda kw: kw["k"][..., :8]), ValueError, r"^k: expected shape \[2, 1, 2, 16\]"),
    ("k_heads", dict(k=lambda kw: torch.randn(2, 1, 4, 16)), ValueError, r"^k: expected shape"),
    ("k_dtype", dict(k=lambda kw: kw["k"].half()), TypeError, r"^k: dtype torch.float16 differs from q's"),
    ("k_cache_dtype", dict(k_cache=lambda kw: kw["k_cache"].double()), TypeError, r"^k_cache: dtype"),
    ("v_cache_shape", dict(v_cache=lambda kw: kw["v_cache"][:, :8]), ValueError, r"^v_cache: expected shape"),
    ("k_cache_rank", dict(k_cache=lambda kw: kw["k_cache"][0]), ValueError, r"^k_cache: expected a rank-4"),
    ("k_cache_strided", dict(k_cache=lambda kw: torch.randn(5, 16, 2, 32)[..., ::2]), ValueError,
     r"^k_cache: the last dimension must be contiguous"),
    ("q_rank", dict(q=lambda kw: kw["q"][0]), ValueError, r"^q: expected a rank-4"),
    ("batch_idx_range", dict(cache_batch_idx=torch.tensor([0, 2], dtype=I32)), ValueError,
     r"^cache_batch_idx: entry 1 is 2, outside \[0, 2\)"),
    ("batch_idx_dtype", dict(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int16)), TypeError,
     r"^cache_batch_idx: dtype must be torch.int32"),
    ("leftpad_past_end", dict(cache_leftpad=torch.tensor([0, 9], dtype=I32)), ValueError,
     r"^cache_leftpad: entry 1 is 9, outside \[0, 8\]"),
    ("leftpad_negative", dict(cache_leftpad=torch.tensor([-2, 0], dtype=I32)), ValueError, r"^cache_leftpad: entry 0"),
    ("alibi", dict(alibi_slopes=torch.ones(3, 5, 7)), ValueError, r"^alibi_slopes: expected shape"),
    ("num_splits", dict(num_splits=-1), ValueError, r"^num_splits: must be in \[0, 256\]"),
    ("num_splits_type", dict(num_splits=1.5), TypeError, r"^num_splits: expected an integer"),
    ("window", dict(window_size=(-2, 0)), None, None),  # flash_attn: any negative edge is unbounded (valid)
    ("window_type", dict(window_size=(1.5, 0)), TypeError, r"^window_size"),
    ("softmax_scale", dict(softmax_scale=float("nan")), ValueError, r"^softmax_scale"),
    ("causal", dict(causal="yes"), TypeError, r"^causal: expected a bool"),
    ("rotary_interleaved", dict(rotary_interleaved="yes"), TypeError, r"^rotary_interleaved: expected a bool"),
    ("return_softmax_lse", dict(return_softmax_lse="no"), TypeError, r"^return_softmax_lse: expected a bool"),
    ("backend", dict(backend="fastest"), ValueError, r"^backend: unknown name 'fastest'"),
    ("q_not_a_tensor", dict(q=lambda kw: kw["q"].numpy()), TypeError, r"^q: expected a torch.Tensor"),
]


@pytest.mark.parametrize("name,change,exc,pattern", KV_ERRORS, ids=[e[0] for e in KV_ERRORS])
def test_with_kvcache_errors(name, change, exc, pattern):
    kw = error_call(**change)
    before = [t.clone() for t in (kw["k_cache"], kw["v_cache"])]
    if exc is None:
        flashattn.flash_attn_with_kvcache(**kw)
        return
    with pytest.raises(exc, match=pattern):
        flashattn.flash_attn_with_kvcache(**kw)
    # a rejected call writes nothing
    assert torch.equal(kw["k_cache"], before[0]) and torch.equal(kw["v_cache"], before[1])


def paged_varlen_call(**change):
    g = torch.Generator().manual_seed(4)
    kw = dict(q=torch.randn(5, 4, 16, generator=g), k=torch.randn(6, 16, 2, 16, generator=g),
              v=torch.randn(6, 16, 2, 16, generator=g), cu_seqlens_q=torch.tensor([0, 2, 5], dtype=I32),
              cu_seqlens_k=torch.tensor([0, 9, 40], dtype=I32), max_seqlen_q=3, max_seqlen_k=31,
              block_table=torch.tensor([[0, 3], [5, 2]], dtype=I32), causal=True)
    for name, value in change.items():
        if value is None:
            kw[name] = None
        else:
            kw[name] = value(kw) if callable(value) else value
    return kw


VARLEN_ERRORS = [
    ("k_rank", dict(k=lambda kw: kw["k"][0]), ValueError, r"^k: expected a rank-4 paged cache"),
    ("v_shape", dict(v=lambda kw: kw["v"][:, :8]), ValueError, r"^v: expected shape"),
    ("past_capacity", dict(cu_seqlens_k=torch.tensor([0, 9, 42], dtype=I32)), ValueError,
     r"^block_table: cu_seqlens_k's length of sequence 1 \(33\) exceeds the 32 rows"),
    ("decreasing", dict(cu_seqlens_k=torch.tensor([0, 9, 4], dtype=I32)), ValueError,
     r"^cu_seqlens_k: must be non-decreasing, but sequence 1's length is -5"),
    ("seqused_past_capacity", dict(cu_seqlens_k=None, seqused_k=torch.tensor([9, 33], dtype=I32)), ValueError,
     r"^block_table: seqused_k\[1\] \(33\) exceeds the 32 rows"),
    ("seqused_dtype", dict(seqused_k=torch.tensor([9, 3])), TypeError, r"^seqused_k: dtype must be torch.int32"),
    ("seqused_shape", dict(cu_seqlens_k=None, seqused_k=torch.tensor([9, 3, 1], dtype=I32)), ValueError,
     r"^seqused_k: expected shape \[2\]"),
    ("no_lengths", dict(cu_seqlens_k=None), ValueError, r"^cu_seqlens_k: required with block_table"),
    ("cu_k_entries", dict(cu_seqlens_k=torch.tensor([0, 9], dtype=I32)), ValueError,
     r"^cu_seqlens_k: expected 3 entries"),
    ("cu_k_dtype", dict(cu_seqlens_k=torch.tensor([0, 9, 40])), TypeError, r"^cu_seqlens_k: dtype must be"),
    ("page", dict(block_table=torch.tensor([[0, 3], [6, 2]], dtype=I32)), ValueError,
     r"^block_table: row 1, column 0 is page 6, outside \[0, 6\) \(k's dim 0\)"),
    ("block_table_rank", dict(block_table=torch.tensor([0, 3], dtype=I32)), ValueError,
     r"^block_table: expected a rank-2"),
    ("cu_q", dict(cu_seqlens_q=torch.tensor([0, 2, 6], dtype=I32)), ValueError, r"^cu_seqlens_q: last entry 6"),
    ("max_seqlen_q", dict(max_seqlen_q=2), ValueError, r"^max_seqlen_q: 2 is smaller"),
    ("heads", dict(q=lambda kw: torch.randn(5, 3, 16)), ValueError, r"^k: query heads \(3\) must be a multiple"),
    ("k_dtype", dict(k=lambda kw: kw["k"].half()), TypeError, r"^k: dtype"),
    ("dropout", dict(dropout_p=0.1), NotImplementedError, r"^dropout_p"),
    ("alibi", dict(alibi_slopes=torch.ones(3, 5, 7)), ValueError, r"^alibi_slopes: expected shape"),
    ("seqused_without_paging", dict(block_table=None, seqused_k=torch.tensor([9, 3], dtype=I32)),
     NotImplementedError, r"^seqused_k: supported with a paged cache \(block_table\) only"),
]


@pytest.mark.parametrize("name,change,exc,pattern", VARLEN_ERRORS, ids=[e[0] for e in VARLEN_ERRORS])
def test_varlen_paged_errors(name, change, exc, pattern):
    with pytest.raises(exc, match=pattern):
        flashattn.flash_attn_varlen_func(**paged_varlen_call(**change))


def test_signatures_match_flash_attn():
    """flash_attn 2.8's positional order and defaults, plus the keyword-only extras."""
    import inspect
    sig = inspect.signature(flashattn.flash_attn_with_kvcache)
    expected = [("q", inspect.Parameter.empty), ("k_cache", inspect.Parameter.empty),
                ("v_cache", inspect.Parameter.empty), ("k", None), ("v", None), ("rotary_cos", None),
                ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None),
                ("block_table", None), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
                ("return_softmax_lse", False)]
    positional = [(p.name, p.default) for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == expected
    assert [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY] == ["backend", "num_threads",
                                                                                  "check_index_values"]
    sig = inspect.signature(flashattn.flash_attn_varlen_func)
    assert list(sig.parameters)[15] == "block_table"
    assert sig.parameters["seqused_k"].kind == inspect.Parameter.KEYWORD_ONLY


# ---- CUDA ----------------------------------------------------------------------------------------------------------


def _on_cuda(cases):
    """The cases in the CUDA kernels' dtypes (float32 ones as bfloat16; float64 ones left out)."""
    return [replace(c, dtype=torch.bfloat16 if c.dtype == torch.float32 else c.dtype) for c in cases
            if c.dtype != torch.float64]


@pytest.mark.parametrize("case", _on_cuda(ALL_CASES), ids=str)
@pytest.mark.cuda
@requires_cuda
def test_with_kvcache_cuda(case):
    run_with_kvcache(case, "auto", device="cuda")


@pytest.mark.parametrize("lengths_from", ["cu_seqlens_k", "seqused_k"])
@pytest.mark.parametrize("case", _on_cuda(PAGED_VARLEN), ids=str)
@pytest.mark.cuda
@requires_cuda
def test_varlen_paged_cuda(case, lengths_from):
    run_paged_varlen(case, "auto", lengths_from, device="cuda")


@pytest.mark.parametrize("num_splits", [0, 1, 4, 13, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.cuda
@requires_cuda
def test_long_cache_decode_cuda(dtype, num_splits):
    """Longer caches than the grid's (several key blocks and splits), paged and dense, against the reference. 4
    splits merge in a thread-block cluster on sm_90, 13 and 256 through the combine kernel (256: more splits than
    key tiles, so splits without keys, and rows of no key at all in the second case's empty sequence)."""
    for case in (KVCase(3, 1, 1, (900, 0, 2047), page=256, rotary=1.0, causal=True, heads=(16, 2), d=128,
                        num_splits=num_splits, extra_rows=1),
                 KVCase(2, 4, 4, (1500, 333), rotary=0.5, interleaved=False, heads=(8, 8), d=64, window=(700, 0),
                        num_splits=num_splits, batch_idx=True, leftpad=(100, 0)),
                 KVCase(2, 2, 0, (1200, 0), page=16, heads=(4, 2), d=59, causal=True, num_splits=num_splits),
                 KVCase(1, 3, 1, (1030,), heads=(2, 1), d=256, softcap=6.0, num_splits=num_splits)):
        run_with_kvcache(case, "auto", device="cuda", dtype=dtype)


def decode_loop(device: str, dtype, steps: int, capture: bool):
    """One decode step (append with rotary into a paged cache, then attend; GQA, causal) on static tensors,
    repeated `steps` times with new q / k / v and growing, per-sequence different cache_seqlens copied into them:
    with `capture`, captured once with torch.cuda.graph and replayed, else called on the static tensors each time.
    Each step equals the eager call on inputs of its own and a copy of the caches (bitwise: same kernels, same
    inputs), and at some steps both equal the float64 reference and the expected append."""
    b, hq, hkv, d, page, pages_per_seq = 4, 8, 2, 128, 16, 16
    cap = page * pages_per_seq
    g = torch.Generator().manual_seed(5)
    num_pages = b * pages_per_seq + 5
    block_table = torch.randperm(num_pages, generator=g)[: b * pages_per_seq].view(b, pages_per_seq).to(torch.int32)
    k_pages = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)
    v_pages = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)
    cos, sin = rotary_tables(cap, d, dtype, g)
    start = torch.tensor([0, 5, 17, 120], dtype=torch.int32)
    growth = torch.tensor([1, 2, 1, 1], dtype=torch.int32)
    assert int((start + (steps - 1) * growth).max()) < cap

    static = dict(q=torch.zeros(b, 1, hq, d, dtype=dtype, device=device),
                  k=torch.zeros(b, 1, hkv, d, dtype=dtype, device=device),
                  v=torch.zeros(b, 1, hkv, d, dtype=dtype, device=device),
                  cache_seqlens=start.clone().to(device))  # (a copy on the CPU too: it is written)
    static_k, static_v = k_pages.to(device), v_pages.to(device)
    eager_k, eager_v = static_k.clone(), static_v.clone()
    tables = dict(rotary_cos=cos.to(device), rotary_sin=sin.to(device), block_table=block_table.to(device))

    def step(k_cache, v_cache, q, k, v, cache_seqlens):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, causal=True,
                                                 return_softmax_lse=True, **tables)

    def new_inputs(i):
        gi = torch.Generator().manual_seed(1000 + i)
        return dict(q=torch.randn(b, 1, hq, d, generator=gi).to(dtype),
                    k=torch.randn(b, 1, hkv, d, generator=gi).to(dtype),
                    v=torch.randn(b, 1, hkv, d, generator=gi).to(dtype), cache_seqlens=start + i * growth)

    if capture:
        # warm up on a side stream, as torch requires, on throwaway caches (the real ones stay as they are)
        scratch_k, scratch_v = static_k.clone(), static_v.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(scratch_k, scratch_v, **static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out, static_lse = step(static_k, static_v, **static)
        assert torch.equal(static_k, eager_k), "capturing ran the append"

    for i in range(steps):
        inputs = new_inputs(i)
        check = i in (0, 1) or i % 25 == 24 or i == steps - 1
        if check:  # the caches before this step's append, for the reference
            before_k, before_v = logical(static_k, block_table, page), logical(static_v, block_table, page)
        for name, t in inputs.items():
            static[name].copy_(t)
        if capture:
            graph.replay()
        else:
            static_out, static_lse = step(static_k, static_v, **static)
        out, lse = step(eager_k, eager_v, **{n: t.to(device) for n, t in inputs.items()})
        torch.testing.assert_close(static_out, out, rtol=0, atol=0)
        torch.testing.assert_close(static_lse, lse, rtol=0, atol=0)
        if check:
            inp = KVInputs(q=inputs["q"], cu_q=None, k_log=before_k, v_log=before_v, capacity=cap,
                           k_new=inputs["k"], v_new=inputs["v"], cos=cos, sin=sin,
                           lengths=inputs["cache_seqlens"].tolist())
            k_exp, v_exp = expected_caches(inp, True)
            assert torch.equal(logical(static_k, block_table, page), k_exp), f"step {i}: k_cache"
            assert torch.equal(logical(static_v, block_table, page), v_exp), f"step {i}: v_cache"
            kw = dict(causal=True, window=(-1, -1), softcap=0.0, interleaved=True)
            check_outputs(static_out, static_lse, reference(inp, k_exp, v_exp, **kw),
                          reference(inp, k_exp, v_exp, dtype=None, **kw), dtype)
    assert torch.equal(static_k, eager_k) and torch.equal(static_v, eager_v)


def test_decode_loop_on_static_tensors():
    """The CUDA-graph test's loop without the graph, on the CPU: static tensors updated in place between steps."""
    decode_loop("cpu", torch.bfloat16, steps=6, capture=False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.cuda
@requires_cuda
def test_cuda_graph_decode_loop(dtype):
    """A decode step captured with torch.cuda.graph and replayed 100 times (see decode_loop). Under capture the
    index values are not copied to the host (no synchronisation inside the capture); the kernels clamp instead."""
    decode_loop("cuda", dtype, steps=100, capture=True)


@pytest.mark.cuda
@requires_cuda
def test_compile_fullgraph_cuda():
    torch._dynamo.reset()
    case = KVCase(2, 1, 1, (40, 300), page=64, rotary=1.0, causal=True, heads=(8, 2), d=128, dtype=torch.bfloat16)
    inp = make_inputs(case)
    cuda = lambda t: t.to("cuda")  # noqa: E731
    args = lambda: (cuda(inp.q), *(cuda(t) for t in inp.caches()), cuda(inp.k_new), cuda(inp.v_new),  # noqa: E731
                    cuda(inp.cos), cuda(inp.sin), index_tensor(inp.lengths, "cuda"), cuda(inp.block_table))
    eager_args, compiled_args = args(), args()
    expected = decode_step(*eager_args)
    got = torch.compile(decode_step, fullgraph=True)(*compiled_args)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert torch.equal(eager_args[1], compiled_args[1]) and torch.equal(eager_args[2], compiled_args[2])
