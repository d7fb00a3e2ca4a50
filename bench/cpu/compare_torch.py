#!/usr/bin/env python3
"""CPU benchmark of issue 2: flashattn's CPU flash path against PyTorch's
torch.nn.functional.scaled_dot_product_attention on the CPU, on the same shapes and thread count, plus the
naive reference and the machine's fp32 GEMM rate (torch.matmul). Writes a markdown table and the raw numbers
as JSON under bench/results/data/ (cpu-vs-torch-YYYY-MM-DD-COMMIT.md / .json; bench/results/cpu.md shows the
latest table).

    python3 bench/cpu/compare_torch.py [--build-dir build-cpu] [--threads N] [--min-time 0.5]

Timing: every number is the fastest of repeated calls (one warm-up, then until --min-time has passed; a first
call of a second or more counts as it is), the same rule in both programs, and the best of --rounds rounds; a
shared machine only ever makes a call slower. Shape by shape, flashattn runs and PyTorch right after it, round
after round, so that both see the same machine state.
Layouts: PyTorch gets its native [b, h, s, d]; flashattn gets [b, s, h, d] (flash-attn's), which costs it
strided K/V rows.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def best_time(fn, min_time):
    """Fastest call of fn; the first is a warm-up unless it took a second or more (then it is the only one)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first >= max(min_time, 1.0):
        return first
    best, start, calls = float("inf"), time.perf_counter(), 0
    while True:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        calls += 1
        if time.perf_counter() - start >= min_time or calls >= 50:
            return best


def gemm_rate(min_time, n=2048):
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n ** 3 / best_time(lambda: torch.matmul(a, b), min_time)


def torch_times(batch, heads, s, d, causal, min_time):
    gen = torch.Generator().manual_seed(s * 131 + d)
    q, k, v = (torch.randn(batch, heads, s, d, generator=gen, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        fwd = best_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_time)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    g = torch.randn_like(out)
    bwd = best_time(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), min_time)
    return fwd, bwd


def run_ours(exe, batch, heads, s, d, causal, threads, min_time, naive):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [exe, "--batch", str(batch), "--heads", str(heads), "--seqlens", str(s), "--dims", str(d),
           "--causal", str(int(causal)), "--threads", str(threads), "--min-time", str(min_time),
           "--naive", str(int(naive)), "--json", path]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    with open(path) as f:
        rows = json.load(f)["rows"]
    os.unlink(path)
    return rows[0]


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "logical_cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "os": platform.platform()}


def git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src", "bench/cpu", "include"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("COMMIT", "unknown")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build-cpu"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlens-d64", default="256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--seqlens-d128", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--naive-max-seconds", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results", "data"))
    ap.add_argument("--name", default=None, help="file name without extension (default cpu-vs-torch-DATE-COMMIT)")
    args = ap.parse_args()
    if args.name is None:
        args.name = f"cpu-vs-torch-{datetime.date.today().isoformat()}-{git_commit()[:7]}"

    exe = os.path.join(args.build_dir, "bench", "cpu", "flashattn_bench_cpu")
    if not os.path.exists(exe):
        sys.exit(f"{exe} not found: build it first (cmake --build {args.build_dir})")
    torch.set_num_threads(args.threads)
    gemm = gemm_rate(args.min_time)

    rows = []
    for d, seqlens in ((64, args.seqlens_d64), (128, args.seqlens_d128)):
        seqlens = [int(x) for x in seqlens.split(",") if x]
        for causal in (False, True):
            naive_per_s2 = 0.0  # seconds per s² of the last naive run: predicts the next one
            for s in seqlens:
                naive = naive_per_s2 == 0 or naive_per_s2 * s * s <= args.naive_max_seconds
                best = None
                for rnd in range(args.rounds):
                    r = run_ours(exe, args.batch, args.heads, s, d, causal, args.threads, args.min_time,
                                 naive and rnd == 0)
                    tf, tb = torch_times(args.batch, args.heads, s, d, causal, args.min_time)
                    if best is None:
                        best = r
                        best["torch_forward_s"], best["torch_backward_s"] = tf, tb
                    else:
                        for key in ("flash_forward_s", "flash_backward_s"):
                            best[key] = min(best[key], r[key])
                        best["torch_forward_s"] = min(best["torch_forward_s"], tf)
                        best["torch_backward_s"] = min(best["torch_backward_s"], tb)
                if "naive_forward_s" in best:
                    naive_per_s2 = (best["naive_forward_s"] + best["naive_backward_s"]) / (s * s)
                # What materialising the fp32 score and probability matrices of every head would take.
                best["materialised_sp_bytes"] = 2 * 4 * args.batch * args.heads * s ** 2
                rows.append(best)
                print(f"s={s} d={d} causal={causal}: flash fwd {best['flash_forward_s'] * 1e3:.2f} ms "
                      f"(torch {best['torch_forward_s'] * 1e3:.2f}), bwd {best['flash_backward_s'] * 1e3:.2f} ms "
                      f"(torch {best['torch_backward_s'] * 1e3:.2f})", file=sys.stderr)
    gemm = max(gemm, gemm_rate(args.min_time))  # the best of two measurements, before and after

    when = datetime.datetime.now(datetime.timezone.utc)
    print(f"fp32 GEMM rate (torch.matmul 2048^3, {args.threads} threads): {gemm / 1e9:.1f} GFLOP/s", file=sys.stderr)
    meta = {"date": when.isoformat(timespec="seconds"), "commit": git_commit(), "machine": machine(),
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "threads": args.threads,
            "dtype": "float32", "batch": args.batch, "heads": args.heads, "gemm_fp32_flops": gemm, "rounds": args.rounds,
            "flop_count": "forward 4*b*h*s*s*d (half for causal), backward 2.5x the forward"}
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, args.name + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)

    ms = lambda x: f"{x * 1e3:.2f}" if x is not None else "-"
    mib = lambda x: f"{x / 2 ** 20:.1f}" if x is not None else "-"
    lines = [
        f"# CPU attention benchmark, {when.date().isoformat()}",
        "",
        f"- commit: `{meta['commit']}`",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['logical_cpus']} logical CPUs; "
        f"PyTorch {meta['machine']['torch']} ({meta['machine']['torch_cpu_capability']})",
        f"- command: `python3 {meta['command']}`",
        f"- float32, batch {args.batch}, {args.heads} heads, {args.threads} threads for both; flashattn in "
        f"[b, s, h, d], PyTorch SDPA in its native [b, h, s, d]",
        f"- fp32 GEMM rate of this machine (torch.matmul, 2048³): **{gemm / 1e9:.1f} GFLOP/s**; "
        f"\"% GEMM\" = achieved FLOP/s over it (FLOPs: {meta['flop_count']})",
        f"- times: fastest of repeated calls, best of {args.rounds} interleaved rounds; speedup = PyTorch time / "
        "flashattn time (> 1: flashattn faster)",
        "- memory: peak heap bytes the call allocated (flashattn's counting allocator); naive = Backend::cpu_reference "
        "(row by row in fp64, so O(s) too), run while it takes under a few seconds; the last column is what "
        "materialising fp32 S and P for every head would need",
        "",
        "| s | d | causal | flash fwd ms | torch fwd ms | fwd speedup | flash bwd ms | torch bwd ms | bwd speedup "
        "| flash fwd % GEMM | flash bwd % GEMM | naive fwd ms | naive bwd ms | flash fwd/bwd MiB | naive MiB | S+P MiB |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ff, fb = r["flops_forward"] / r["flash_forward_s"], r["flops_backward"] / r["flash_backward_s"]
        naive_mem = max(r.get("naive_forward_peak_bytes", 0), r.get("naive_backward_peak_bytes", 0)) if "naive_forward_s" in r else None
        lines.append(
            f"| {r['seqlen']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} "
            f"| {ms(r['flash_forward_s'])} | {ms(r['torch_forward_s'])} | {r['torch_forward_s'] / r['flash_forward_s']:.2f} "
            f"| {ms(r['flash_backward_s'])} | {ms(r['torch_backward_s'])} | {r['torch_backward_s'] / r['flash_backward_s']:.2f} "
            f"| {100 * ff / gemm:.0f}% | {100 * fb / gemm:.0f}% "
            f"| {ms(r.get('naive_forward_s'))} | {ms(r.get('naive_backward_s'))} "
            f"| {mib(r['flash_forward_peak_bytes'])} / {mib(r['flash_backward_peak_bytes'])} | {mib(naive_mem)} "
            f"| {mib(r['materialised_sp_bytes'])} |")
    at_1k = [r for r in rows if r["seqlen"] >= 1024]
    slow_f = [r for r in at_1k if r["flash_forward_s"] > r["torch_forward_s"]]
    slow_b = [r for r in at_1k if r["flash_backward_s"] > r["torch_backward_s"]]
    lines += ["", f"At s >= 1024: flashattn is faster than PyTorch SDPA in {len(at_1k) - len(slow_f)}/{len(at_1k)} "
              f"forward and {len(at_1k) - len(slow_b)}/{len(at_1k)} backward shapes."]
    for kind, slow in (("forward", slow_f), ("backward", slow_b)):
        for r in slow:
            lines.append(f"- slower: {kind} s={r['seqlen']} d={r['head_dim']} causal={r['causal']}")
    with open(os.path.join(args.out_dir, args.name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
