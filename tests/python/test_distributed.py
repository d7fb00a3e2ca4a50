"""flashattn.distributed.ring_flash_attn_func and its varlen form: 2 and 4 processes (gloo) each holding a shard of
the sequence (of every sequence of a packed batch) give the output and gradients of single-process attention over
the whole sequence, in both layouts, causal or not, with GQA, softcap, an explicit scale, d_v != d and sliding
windows (padded and varlen); the deterministic mode repeats bit for bit; under torch.compile the same as eager; bad
arguments raise naming them. On a GPU the same runs with the processes sharing it (gloo, staged through host
memory)."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn
from flashattn.distributed import (_band, ring_flash_attn_func, ring_flash_attn_varlen_func, shard, shard_varlen,
                                   unshard, unshard_varlen)

# (layout, causal, heads_q, heads_kv, d, d_v, softcap, softmax_scale)
CASES = [
    ("contiguous", False, 4, 4, 32, 32, 0.0, None),
    ("contiguous", True, 4, 2, 32, 32, 0.0, None),
    ("zigzag", True, 4, 1, 32, 32, 0.0, None),
    ("zigzag", False, 2, 2, 16, 24, 5.0, 0.3),
    ("zigzag", True, 6, 2, 24, 16, 3.0, None),
]
SEQLEN, BATCH = 48, 2  # 48 tokens: 2 and 4 ranks, both layouts
# Sliding windows (padded form): (layout, causal, window_size); 4 query heads over 2 KV heads, d 32. Windows
# shorter than a shard, spanning several shards, one-sided and two-sided.
WINDOW_CASES = [
    ("zigzag", True, (7, 0)),
    ("contiguous", True, (30, -1)),
    ("contiguous", False, (5, 3)),
    ("zigzag", False, (20, -1)),
    ("zigzag", False, (-1, 6)),
    ("contiguous", False, (0, 0)),
]
# Varlen: a packed batch with an empty sequence; every length a multiple of 8 (2 and 4 ranks, both layouts).
VARLEN_LENS = [16, 40, 0, 24]
VARLEN_CASES = [
    ("contiguous", True, 4, 2, 32, 32, 0.0, None),
    ("zigzag", True, 4, 1, 16, 24, 0.0, None),
    ("zigzag", False, 2, 2, 32, 32, 4.0, 0.3),
    ("contiguous", False, 6, 3, 24, 16, 0.0, None),
]
# Varlen under sliding windows: (layout, causal, window_size) over VARLEN_CASES[0]'s problem; windows shorter than a
# sequence's part on one rank and spanning ranks, one- and two-sided (each sequence needs its own rectangles).
VARLEN_WINDOW_CASES = [
    ("zigzag", True, (7, 0)),
    ("contiguous", True, (12, -1)),
    ("contiguous", False, (3, 5)),
    ("zigzag", False, (-1, 4)),
    ("zigzag", False, (0, 0)),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem(case, device, dtype):
    layout, causal, hq, hkv, d, dv, softcap, scale = case
    gen = torch.Generator().manual_seed(CASES.index(case))  # the same on every rank
    q = torch.randn(BATCH, SEQLEN, hq, d, generator=gen)
    k = torch.randn(BATCH, SEQLEN, hkv, d, generator=gen)
    v = torch.randn(BATCH, SEQLEN, hkv, dv, generator=gen)
    dout = torch.randn(BATCH, SEQLEN, hq, dv, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, dout)]


def _varlen_problem(case, device, dtype):
    layout, causal, hq, hkv, d, dv, softcap, scale = case
    gen = torch.Generator().manual_seed(100 + VARLEN_CASES.index(case))
    total = sum(VARLEN_LENS)
    q = torch.randn(total, hq, d, generator=gen)
    k = torch.randn(total, hkv, d, generator=gen)
    v = torch.randn(total, hkv, dv, generator=gen)
    dout = torch.randn(total, hq, dv, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(VARLEN_LENS).cumsum(0).tolist()), dtype=torch.int32, device=device)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, dout)], cu


def _varlen_runs(rank, world, device, dtype):
    results = []
    for case in VARLEN_CASES:
        layout, causal, _, _, _, _, softcap, scale = case
        tensors, cu = _varlen_problem(case, device, dtype)
        local = [shard_varlen(t, cu, rank, world, layout) for t in tensors]
        (q, cu_local), (k, _), (v, _), (dout, _) = local
        max_local = max(VARLEN_LENS) // world
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        out = ring_flash_attn_varlen_func(ql, kl, vl, cu_local, max_local, causal=causal, softmax_scale=scale,
                                          softcap=softcap, layout=layout, deterministic=True)
        out.backward(dout)
        results.append([t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)])
    for layout, causal, window in VARLEN_WINDOW_CASES:
        tensors, cu = _varlen_problem(VARLEN_CASES[0], device, dtype)
        (q, cu_local), (k, _), (v, _), (dout, _) = [shard_varlen(t, cu, rank, world, layout) for t in tensors]
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        out = ring_flash_attn_varlen_func(ql, kl, vl, cu_local, max(VARLEN_LENS) // world, causal=causal,
                                          window_size=window, layout=layout)
        out.backward(dout)
        results.append([t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)])
    return results


def _varlen_errors(rank, world, device, dtype):
    (q, k, v, _), cu = _varlen_problem(VARLEN_CASES[0], device, dtype)
    q, cu_local = shard_varlen(q, cu, rank, world)
    k, _ = shard_varlen(k, cu, rank, world)
    v, _ = shard_varlen(v, cu, rank, world)
    odd = cu_local.clone()
    odd[1] += 1  # sequence 0 one row longer, sequence 1 one shorter: odd lengths
    other = cu_local.clone() if rank == 0 else cu_local.flip(0).neg().add(cu_local[-1])
    errors = {}
    for name, call in (
        ("cu_seqlens dtype", lambda: ring_flash_attn_varlen_func(q, k, v, cu_local.long(), 64)),
        ("cu_seqlens end", lambda: ring_flash_attn_varlen_func(q[:-2], k[:-2], v[:-2], cu_local, 64)),
        ("cu_seqlens odd", lambda: ring_flash_attn_varlen_func(q, k, v, odd, 64, layout="zigzag")),
        ("cu_seqlens ranks", lambda: ring_flash_attn_varlen_func(q, k, v, other, 64)),
        ("max_seqlen", lambda: ring_flash_attn_varlen_func(q, k, v, cu_local, 1)),
        ("window_size", lambda: ring_flash_attn_varlen_func(q, k, v, cu_local, 64, window_size=(2, 2, 1))),
    ):
        try:
            call()
            errors[name] = None
        except (ValueError, NotImplementedError, TypeError) as e:
            errors[name] = (type(e).__name__, str(e))
    return errors


def _worker(rank, world, port, device, dtype, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for case in CASES:
            layout, causal, _, _, _, _, softcap, scale = case
            q, k, v, dout = (shard(t, rank, world, layout) for t in _problem(case, device, dtype))
            runs = []
            for _ in range(2 if case is CASES[1] else 1):  # the deterministic mode twice
                ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
                out = ring_flash_attn_func(ql, kl, vl, causal=causal, softmax_scale=scale, softcap=softcap,
                                           layout=layout, deterministic=True)
                out.backward(dout)
                runs.append([t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)])
            results.append(runs)
        # Under torch.compile(fullgraph=True) (the padded ring is an operator: no graph break), output and gradients
        # as eager.
        case = CASES[2]
        q, k, v, dout = (shard(t, rank, world, case[0]) for t in _problem(case, device, dtype))
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        ring = lambda a, b, c: ring_flash_attn_func(a * 1.0, b, c, causal=True, layout=case[0],  # noqa: E731
                                                    deterministic=True) * 2.0
        out = torch.compile(ring, fullgraph=True)(ql, kl, vl)
        out.backward(dout)
        results.append([[t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)]])
        errors = {}
        q, k, v, _ = _problem(CASES[0], device, dtype)
        for name, call in (
            ("window_size", lambda: ring_flash_attn_func(q, k, v, window_size=(4, 0, 1))),
            ("layout", lambda: ring_flash_attn_func(q, k, v, layout="spiral")),
            ("k", lambda: ring_flash_attn_func(q, k[:, :-1], v[:, :-1])),
            ("q", lambda: ring_flash_attn_func(q[:, :-1], k[:, :-1], v[:, :-1], layout="zigzag")),
            ("float64", lambda: ring_flash_attn_func(q.double(), k.double(), v.double())),
        ):
            try:
                call()
                errors[name] = None
            except (ValueError, NotImplementedError, TypeError) as e:
                errors[name] = (type(e).__name__, str(e))
        windowed = []
        for i, (layout, causal, window) in enumerate(WINDOW_CASES):
            q, k, v, dout = (shard(t, rank, world, layout) for t in _problem(CASES[1], device, dtype))
            ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
            out = ring_flash_attn_func(ql, kl, vl, causal=causal, window_size=window, layout=layout)
            out.backward(dout)
            windowed.append([t.detach().cpu() for t in (out, ql.grad, kl.grad, vl.grad)])
        varlen = _varlen_runs(rank, world, device, dtype)
        varlen_errors = _varlen_errors(rank, world, device, dtype)
        torch.save(dict(results=results, errors=errors, windowed=windowed, varlen=varlen, varlen_errors=varlen_errors),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _relative_error(got, want):
    """‖got − want‖ / ‖want‖, the denominator floored at an RMS of 1 (that of dout, N(0, 1)): a gradient that is zero
    in exact arithmetic (window (0, 0): one key per query, so dS = 0 and dQ = dK = 0) is rounding noise on both
    sides (RMS ~1e-7 in fp32), and two noises differ by their own size."""
    floor = want.numel() ** 0.5
    return (got.double() - want.double()).norm() / max(want.double().norm().item(), floor)


def _run(world, device, dtype, tmp_path):
    mp.start_processes(_worker, args=(world, _free_port(), device, dtype, str(tmp_path)), nprocs=world,
                       join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _check(world, device, dtype, tmp_path, tol):
    per_rank = _run(world, device, dtype, tmp_path)
    for i, case in enumerate(CASES):
        layout, causal, _, _, _, _, softcap, scale = case
        q, k, v, dout = (t.requires_grad_() if j < 3 else t for j, t in enumerate(_problem(case, device, dtype)))
        want = flashattn.flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, softcap=softcap)
        want.backward(dout)
        wants = [want.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
        got = [unshard([per_rank[r]["results"][i][0][j] for r in range(world)], layout) for j in range(4)]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, wants):
            err = _relative_error(g, w)
            assert err < tol, f"{case} over {world} ranks: {name} relative error {err:.2e}"
        if len(per_rank[0]["results"][i]) == 2:
            for r in range(world):
                first, again = per_rank[r]["results"][i]
                assert all(torch.equal(a, b) for a, b in zip(first, again)), "deterministic mode differs"
    compiled = [r["results"][len(CASES)][0] for r in per_rank]
    for rank in range(world):
        eager = per_rank[rank]["results"][2][0]
        torch.testing.assert_close(compiled[rank][0], 2.0 * eager[0])
        for g_compiled, g_eager in zip(compiled[rank][1:], eager[1:]):
            torch.testing.assert_close(g_compiled, 2.0 * g_eager)
    errors = per_rank[0]["errors"]
    for name in ("float64",):
        assert errors[name] is not None and errors[name][0] == "NotImplementedError" and name in errors[name][1]
    for name in ("layout", "k", "q", "window_size"):
        assert errors[name] is not None and errors[name][0] == "ValueError" and name in errors[name][1], errors[name]
    for i, (layout, causal, window) in enumerate(WINDOW_CASES):
        q, k, v, dout = (t.requires_grad_() if j < 3 else t for j, t in enumerate(_problem(CASES[1], device, dtype)))
        want = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window)
        want.backward(dout)
        wants = [want.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
        got = [unshard([per_rank[r]["windowed"][i][j] for r in range(world)], layout) for j in range(4)]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, wants):
            err = _relative_error(g, w)
            assert err < tol, f"window {window} {layout} causal={causal} over {world} ranks: {name} error {err:.2e}"
    for i, case in enumerate(VARLEN_CASES):
        layout, causal, _, _, _, _, softcap, scale = case
        tensors, cu = _varlen_problem(case, device, dtype)
        q, k, v, dout = (t.requires_grad_() if j < 3 else t for j, t in enumerate(tensors))
        want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(VARLEN_LENS), max(VARLEN_LENS), causal=causal,
                                                softmax_scale=scale, softcap=softcap)
        want.backward(dout)
        wants = [want.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
        got = [unshard_varlen([per_rank[r]["varlen"][i][j] for r in range(world)], cu.cpu(), layout)
               for j in range(4)]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, wants):
            err = _relative_error(g, w)
            assert err < tol, f"varlen {case} over {world} ranks: {name} relative error {err:.2e}"
    for i, (layout, causal, window) in enumerate(VARLEN_WINDOW_CASES):
        tensors, cu = _varlen_problem(VARLEN_CASES[0], device, dtype)
        q, k, v, dout = (t.requires_grad_() if j < 3 else t for j, t in enumerate(tensors))
        want = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(VARLEN_LENS), max(VARLEN_LENS), causal=causal,
                                                window_size=window)
        want.backward(dout)
        wants = [want.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()]
        got = [unshard_varlen([per_rank[r]["varlen"][len(VARLEN_CASES) + i][j] for r in range(world)], cu.cpu(),
                              layout) for j in range(4)]
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, wants):
            err = _relative_error(g, w)
            assert err < tol, f"varlen window {window} {layout} causal={causal} over {world} ranks: {name} {err:.2e}"
    for r in range(world):
        errors = per_rank[r]["varlen_errors"]
        for name, kind in (("cu_seqlens dtype", "ValueError"), ("cu_seqlens end", "ValueError"),
                           ("cu_seqlens odd", "ValueError"), ("cu_seqlens ranks", "ValueError"),
                           ("max_seqlen", "ValueError"), ("window_size", "ValueError")):
            assert errors[name] is not None and errors[name][0] == kind, (name, errors[name])
            assert name.split()[0] in errors[name][1], (name, errors[name])
        assert "differs between the ranks" in errors["cu_seqlens ranks"][1]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_single_process_cpu(world, tmp_path):
    _check(world, "cpu", torch.float32, tmp_path, 2e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_single_process_cuda(world, tmp_path):
    if not (flashattn.built_with_cuda and torch.cuda.is_available()):
        pytest.skip("needs a CUDA device and a build with the CUDA kernels")
    _check(world, "cuda", torch.bfloat16, tmp_path, 2e-2)


def test_band_is_the_window_on_the_tightest_rectangle():
    """_band: the rectangle and window it gives, under the kernels' bottom-right aligned mask, see exactly the pairs
    the sliding window sees between two chunks of the whole sequence (brute force over random offsets and windows)."""
    import random
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.randint(1, 9)
        q0, k0 = rng.randint(0, 4) * n, rng.randint(0, 4) * n
        causal = rng.random() < 0.4
        left, right = (rng.choice([-1, rng.randint(0, 3 * n)]) for _ in range(2))
        r_eff = 0 if causal else right
        want = {(i, j) for i in range(n) for j in range(n)
                if (left < 0 or k0 + j >= q0 + i - left) and (r_eff < 0 or k0 + j <= q0 + i + r_eff)}
        band = _band(q0, k0, n, causal, left, right)
        got = set()
        if band is not None:
            r0, r1, c0, c1, w_left, w_right = band
            assert w_left >= -1 and w_right >= -1
            shift = (c1 - c0) - (r1 - r0)
            got = {(i + r0, j + c0) for i in range(r1 - r0) for j in range(c1 - c0)
                   if (w_left < 0 or j >= i + shift - w_left) and (w_right < 0 or j <= i + shift + w_right)}
        assert got == want, (n, q0, k0, causal, left, right, band)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_shard_and_unshard_varlen(layout):
    cu = torch.tensor([0, 12, 12, 36], dtype=torch.int32)
    x = torch.arange(36 * 2).reshape(36, 2)
    parts = [shard_varlen(x, cu, r, 3, layout) for r in range(3)]
    if layout == "zigzag":
        with pytest.raises(ValueError, match="multiple of 6"):
            shard_varlen(x, torch.tensor([0, 8, 8, 36], dtype=torch.int32), 0, 3, layout)
    for local, local_cu in parts:
        assert local_cu.tolist() == [0, 4, 4, 12] and local.shape == (12, 2)
    if layout == "zigzag":
        # Sequence 0 (rows 0-11, chunks of 2): rank 0 holds chunks 0 and 5; sequence 2 (rows 12-35, chunks of 4).
        assert parts[0][0][:4, 0].tolist() == [0, 2, 20, 22]
        assert parts[0][0][4:, 0].tolist() == [24, 26, 28, 30, 64, 66, 68, 70]
    assert torch.equal(unshard_varlen([p[0] for p in parts], cu, layout), x)
    with pytest.raises(ValueError, match="cu_seqlens ends at"):
        shard_varlen(x[:-1], cu, 0, 3, layout)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_shard_and_unshard(layout):
    x = torch.arange(2 * 24).reshape(2, 24)
    shards = [shard(x, r, 3, layout) for r in range(3)]
    assert all(s.shape == (2, 8) for s in shards)
    if layout == "zigzag":
        assert shards[0][0].tolist() == [0, 1, 2, 3, 20, 21, 22, 23]
    assert torch.equal(unshard(shards, layout), x)
    with pytest.raises(ValueError, match="multiple of"):
        shard(x[:, :23], 0, 3, layout)
    with pytest.raises(ValueError, match="rank"):
        shard(x, 3, 3, layout)


def test_needs_an_initialised_group():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_flash_attn_func(q, q, q)


def test_ring_needs_an_initialised_process_group():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        ring_flash_attn_func(q, q, q)
