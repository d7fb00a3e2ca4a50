"""Decode bandwidth: flashattn's KV-cache path against PyTorch SDPA's cuDNN backend, side by side in one process.

Bandwidth = bytes of K and V read (2 x b x context x h_kv x d x 2 bytes) / time per call. Every call is captured in
a CUDA graph of `--calls` calls and the graphs are replayed round-robin (one library after the other, `--rounds`
rounds), so launch overhead counts as a serving engine sees it and the card's clock is shared fairly; the table
gives each library's best round (median of `--reps` replays per round). Ours runs dense and paged (pages of 16
and 256 rows, pages in shuffled order over the same memory) through flashattn.flash_attn_with_kvcache; cuDNN reads
the dense cache through `enable_gqa`. `--fp8` adds our float8_e4m3fn caches (dense and paged, q in e4m3 too,
through flashattn.fa3.flash_attn_with_kvcache; their bandwidth counts their own bytes, 1 per element). `--eager`
adds our eager call time (validation and its host read of cache_seqlens included, and with
check_index_values=False). No mask: every query row sees the whole context (SDPA's causal is top-left aligned, ours
bottom-right, so only the unmasked call means the same in both).

    python3 bench/gpu/decode_bench.py --out decode.json [--md decode.md]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn import fa3

H_Q, H_KV, D = 32, 8, 128
PEAK_TBS = 4.8


def graph_of(fn, calls):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def time_graph(g, calls, reps):
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)  # µs per call
    return statistics.median(times)


def time_eager(fn, calls, reps):
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def cell(b, ctx, s_q, args, gen):
    dt = torch.bfloat16
    k = torch.randn(b, ctx, H_KV, D, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    q = torch.randn(b, s_q, H_Q, D, device="cuda", dtype=dt)
    seqlens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    fns = {}
    fns["ours dense"] = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    if args.whole_cache:
        fns["ours dense, no seqlens"] = lambda: flashattn.flash_attn_with_kvcache(q, k, v)
    if args.varlen:
        cu_q = torch.arange(0, (b + 1) * s_q, s_q, device="cuda", dtype=torch.int32)
        cu_k = torch.arange(0, (b + 1) * ctx, ctx, device="cuda", dtype=torch.int32)
        qp, kp, vp = q.reshape(b * s_q, H_Q, D), k.reshape(b * ctx, H_KV, D), v.reshape(b * ctx, H_KV, D)
        fns["ours varlen"] = lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, s_q, ctx)
    for splits in args.splits:
        fns[f"ours dense, {splits} splits"] = (lambda splits=splits: flashattn.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=seqlens, num_splits=splits))

    def paged(kc, vc):
        """(page, k pages, v pages, block table) for every page size that divides the context: the same memory as
        the dense cache, its pages in shuffled order."""
        for page in args.pages:
            if ctx % page == 0:
                pages = b * ctx // page
                table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(b, ctx // page)
                yield page, kc.view(pages, page, H_KV, D), vc.view(pages, page, H_KV, D), table

    for page, kp, vp, table in paged(k, v):
        fns[f"ours paged {page}"] = (lambda kp=kp, vp=vp, table=table: flashattn.flash_attn_with_kvcache(
            q, kp, vp, cache_seqlens=seqlens, block_table=table))
        for splits in args.paged_splits:
            fns[f"ours paged {page}, {splits} splits"] = (
                lambda kp=kp, vp=vp, table=table, splits=splits: flashattn.flash_attn_with_kvcache(
                    q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=splits))
    if args.fp8:
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = q.to(f8), k.to(f8), v.to(f8)
        fns["ours fp8 dense"] = lambda: fa3.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=seqlens)
        for page, kp, vp, table in paged(k8, v8):
            fns[f"ours fp8 paged {page}"] = (lambda kp=kp, vp=vp, table=table: fa3.flash_attn_with_kvcache(
                q8, kp, vp, cache_seqlens=seqlens, page_table=table))
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    fns["cuDNN"] = cudnn
    graphs = {name: graph_of(fn, args.calls) for name, fn in fns.items()}
    best = {name: float("inf") for name in fns}
    for _ in range(args.rounds):
        for name, g in graphs.items():
            best[name] = min(best[name], time_graph(g, args.calls, args.reps))
    if args.eager:
        best["ours dense, eager"] = time_eager(fns["ours dense"], args.calls, args.reps)
        unchecked = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, check_index_values=False)
        best["ours dense, eager unchecked"] = time_eager(unchecked, args.calls, args.reps)
    bytes_kv = 2 * b * ctx * H_KV * D * 2
    out = {name: {"us": t, "tbs": bytes_kv / (2 if "fp8" in name else 1) / (t * 1e-6) / 1e12}
           for name, t in best.items()}
    # Correctness of what was timed: ours against cuDNN's output on this cell.
    ref = cudnn().transpose(1, 2)
    for name, fn in fns.items():
        if name.startswith("ours"):
            err = (fn().float().reshape(ref.shape) - ref.float()).abs().max().item()
            out[name]["max_abs_diff_vs_cudnn"] = err
    del graphs
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 128])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 131072])
    ap.add_argument("--s-q", type=int, nargs="+", default=[1])
    ap.add_argument("--pages", type=int, nargs="*", default=[16, 256])
    ap.add_argument("--splits", type=int, nargs="*", default=[],
                    help="also time the dense cache with these fixed split counts (default: our heuristic only)")
    ap.add_argument("--paged-splits", type=int, nargs="*", default=[],
                    help="also time the paged caches with these fixed split counts")
    ap.add_argument("--max-kv-gb", type=float, default=40.0, help="skip cells whose K+V exceed this")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--varlen", action="store_true",
                    help="also flash_attn_varlen_func over the same K / V packed (b sequences of the context each)")
    ap.add_argument("--whole-cache", action="store_true",
                    help="also our dense call without cache_seqlens (the whole cache, as cuDNN is given it): no "
                         "lengths to read on the device before the first K/V load")
    ap.add_argument("--fp8", action="store_true", help="also our float8_e4m3fn caches")
    ap.add_argument("--out", default="decode.json")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for s_q in args.s_q:
        for b in args.batches:
            for ctx in args.contexts:
                if 2 * b * ctx * H_KV * D * 2 / 1e9 > args.max_kv_gb:
                    continue
                res = cell(b, ctx, s_q, args, gen)
                rows.append({"s_q": s_q, "b": b, "ctx": ctx, **{k: v for k, v in res.items()}})
                line = " | ".join(f"{k} {v['tbs']:.2f} TB/s {v['us']:.1f} us" for k, v in res.items())
                print(f"s_q {s_q} b {b} ctx {ctx}: {line}", flush=True)
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version(), "rows": rows}, f, indent=1)
    if args.md:
        names = [k for k in rows[0] if k not in ("s_q", "b", "ctx")]
        with open(args.md, "w") as f:
            f.write("| s_q | b | context | " + " | ".join(names) + " |\n")
            f.write("|---" * (3 + len(names)) + "|\n")
            for r in rows:
                f.write(f"| {r['s_q']} | {r['b']} | {r['ctx']} | " +
                        " | ".join(f"{r[n]['tbs']:.2f} / {r[n]['us']:.1f}" for n in names) + " |\n")
            f.write(f"\nTB/s / µs per call; rated peak {PEAK_TBS} TB/s.\n")


if __name__ == "__main__":
    main()
