#!/usr/bin/env python3
"""The Python package on the CPU as users run it: flashattn.flash_attn_func against PyTorch's CPU
scaled_dot_product_attention in one process, on the same tensors' shapes, fp32 and bf16, forward (no_grad) and
backward (autograd), at each thread count given. Reports the CPU kernels' level (flashattn.cpu_isa(), capped by
FLASHATTN_CPU_ISA) and the machine's fp32 GEMM rate (torch.matmul) at each thread count, and writes JSON + a markdown table.

    PYTHONPATH=<build>/python python3 bench/cpu/package_vs_torch.py --out cpu-package.json --md cpu-package.md

Timing: shape by shape the two libraries alternate for --rounds rounds; each number is the fastest call of a round
(compare_torch.best_time: one warm-up, then calls until --min-time has passed), the best round kept. Layouts: PyTorch gets [b, h, s, d],
flashattn [b, s, h, d] (flash_attn's layout), each its native one.
"""
import argparse
import json

import torch
import torch.nn.functional as F

import flashattn
from compare_torch import best_time  # the CPU benchmarks' one timing rule (this script's folder is on sys.path)


def cell(s, d, causal, dtype, threads, args):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(s + d)
    b, h = args.batch, args.heads
    q, k, v = (torch.randn(b, s, h, d, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    out_ours = flashattn.flash_attn_func(q, k, v, causal=causal)
    out_torch = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    g = torch.randn_like(out_ours)
    gt = g.transpose(1, 2).contiguous()

    def ours_fwd():
        with torch.no_grad():
            flashattn.flash_attn_func(q, k, v, causal=causal)

    def torch_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    def ours_bwd():
        torch.autograd.grad(out_ours, (q, k, v), g, retain_graph=True)

    def torch_bwd():
        torch.autograd.grad(out_torch, (qt, kt, vt), gt, retain_graph=True)

    best = {"ours_fwd": float("inf"), "torch_fwd": float("inf"), "ours_bwd": float("inf"), "torch_bwd": float("inf")}
    for _ in range(args.rounds):
        for name, fn in (("ours_fwd", ours_fwd), ("torch_fwd", torch_fwd), ("ours_bwd", ours_bwd),
                         ("torch_bwd", torch_bwd)):
            best[name] = min(best[name], best_time(fn, args.min_time))
    err = (out_ours.float() - out_torch.transpose(1, 2).float()).abs().max().item()
    return {**best, "max_abs_diff": err}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--shapes", nargs="+", default=["1024x64", "2048x64", "4096x64c", "4096x128"],
                    help="SxD, with a trailing c for causal")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="cpu-package.json")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    n = 2048
    a, bm = torch.randn(n, n), torch.randn(n, n)
    gemm = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        gemm[threads] = 2.0 * n ** 3 / best_time(lambda: torch.matmul(a, bm), args.min_time)
    rows = []
    for threads in args.threads:
        for dtype in args.dtypes:
            for shape in args.shapes:
                causal = shape.endswith("c")
                s, d = (int(x) for x in shape.rstrip("c").split("x"))
                r = cell(s, d, causal, getattr(torch, dtype), threads, args)
                flops = 4.0 * args.batch * args.heads * s * s * d * (0.5 if causal else 1.0)
                r.update(threads=threads, dtype=dtype, s=s, d=d, causal=causal,
                         fwd_gemm_fraction=flops / r["ours_fwd"] / gemm[threads] if dtype == "float32" else None)
                rows.append(r)
                print(f"{threads} thr {dtype} s {s} d {d}{' causal' if causal else ''}: fwd {r['ours_fwd']*1e3:.0f} "
                      f"vs {r['torch_fwd']*1e3:.0f} ms ({r['torch_fwd']/r['ours_fwd']:.2f}x), bwd "
                      f"{r['ours_bwd']*1e3:.0f} vs {r['torch_bwd']*1e3:.0f} ms ({r['torch_bwd']/r['ours_bwd']:.2f}x)",
                      flush=True)
    meta = {"cpu_isa": flashattn.cpu_isa(), "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "gemm_fp32_flops_by_threads": gemm}
    with open(args.out, "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"flashattn CPU kernels: {meta['cpu_isa']}; torch {meta['torch']} "
                    f"({meta['torch_cpu_capability']}); fp32 GEMM (torch.matmul) GFLOP/s by threads: "
                    + ", ".join(f"{t}: {g / 1e9:.0f}" for t, g in gemm.items()) + "\n\n")
            f.write("| threads | dtype | s | d | causal | fwd ours / torch ms | speed-up | bwd ours / torch ms | speed-up |\n")
            f.write("|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write(f"| {r['threads']} | {r['dtype']} | {r['s']} | {r['d']} | {'yes' if r['causal'] else ''} | "
                        f"{r['ours_fwd']*1e3:.0f} / {r['torch_fwd']*1e3:.0f} | {r['torch_fwd']/r['ours_fwd']:.2f} | "
                        f"{r['ours_bwd']*1e3:.0f} / {r['torch_bwd']*1e3:.0f} | {r['torch_bwd']/r['ours_bwd']:.2f} |\n")


if __name__ == "__main__":
    main()
