"""Head dims between the Hopper buckets and d_v != d (issue: every head dim on Hopper): forward and backward
TFLOP/s of ours (automatic dispatch), ours with the sm80 kernels forced (what ran these shapes before), and
PyTorch SDPA's cuDNN backend, in alternating bursts per cell (recheck_cell.burst; odd repeats start with cuDNN).
FLOPs: forward 2·b·h·s_q·s_k·(d + d_v), half under a causal mask, backward 2.5x. Prints markdown rows: the best
reading of each library over the repeats, and the lowest / highest per-repeat ratio ours / cuDNN.

    PYTHONPATH=<build>/python python3 bench/gpu/head_dims_bench.py [--models] [--grid] [--repeats 2] [--seconds 0.25]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import flashattn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import TORCH_BACKENDS  # noqa: E402
from recheck_cell import add_grid_options, burst  # noqa: E402

# (label, batch, heads, seqlen, d, d_v, causal): the shapes the issue names.
MODEL_SHAPES = [
    ("Phi-3-mini hd 96", 4, 32, 4096, 96, 96, True),
    ("Phi-2 / ViT-H hd 80", 4, 32, 4096, 80, 80, True),
    ("DeepSeek-V3 MLA 192/128", 1, 128, 8192, 192, 128, True),
    ("asymmetric 128/64", 2, 16, 8192, 128, 64, True),
    ("d_v > d 64/128", 2, 16, 8192, 64, 128, True),
]


def flops(b, h, s, d, dv, causal, backward):
    f = 2.0 * b * h * s * s * (d + dv) / (2 if causal else 1)
    return f * (2.5 if backward else 1.0)


def time_cell(b, h, s, d, dv, causal, repeats, seconds, with_sm80):
    """Per library: list over repeats of (forward seconds, backward seconds)."""
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    qb, kb, vb = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dout = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16)
    dout_b = dout.transpose(1, 2).contiguous()

    def ours(backend):
        fwd = lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal, backend=backend)
        out = fwd()
        return burst(fwd, seconds), burst(lambda: torch.autograd.grad(out, (qb, kb, vb), dout_b, retain_graph=True),
                                          seconds)

    def cudnn():
        with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out = fwd()
            return burst(fwd, seconds), burst(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                              seconds)

    libs = {"ours": lambda: ours("auto"), "cudnn": cudnn}
    if with_sm80:
        libs["sm80"] = lambda: ours("cuda_sm80")
    readings = {name: [] for name in libs}
    order = list(libs)
    for i in range(repeats):
        for name in (order if i % 2 == 0 else order[::-1]):
            readings[name].append(libs[name]())
    return readings


def row(label, b, h, s, d, dv, causal, readings):
    cells = [label, f"{b}x{h}x{s}", f"{d}/{dv}", "yes" if causal else "no"]
    for phase in (0, 1):
        f = flops(b, h, s, d, dv, causal, phase == 1)
        best = {name: f / min(r[phase] for r in rs) / 1e12 for name, rs in readings.items()}
        per = [c[phase] / o[phase] for o, c in zip(readings["ours"], readings["cudnn"])]
        cells += [f"{best['ours']:.0f}", f"{best['sm80']:.0f}" if "sm80" in best else "", f"{best['cudnn']:.0f}",
                  f"{min(per):.2f}-{max(per):.2f}"]
    return "| " + " | ".join(cells) + " |"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", action="store_true", help="the issue's model shapes (with the sm80 column)")
    ap.add_argument("--grid", action="store_true", help="d = d_v in --hd over --seqlens, B·S = 16k, H·D = 2048")
    ap.add_argument("--match", nargs="+", default=[], help="with --models: only the shapes whose label has one of these")
    ap.add_argument("--dv", type=int, default=0, help="with --grid: d_v for every cell (default: d_v = d)")
    add_grid_options(ap, hd=[80, 96, 192], seqlens=[2048, 4096, 8192, 16384], repeats=2, seconds=0.25)
    args = ap.parse_args()
    print(f"bf16 TFLOP/s, best of {args.repeats} alternating bursts of ~{args.seconds:g} s "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()})")
    print("| shape | b x h x s | d / d_v | causal | fwd ours | fwd sm80 | fwd cuDNN | fwd ours/cuDNN | "
          "bwd ours | bwd sm80 | bwd cuDNN | bwd ours/cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    if args.models:
        for label, b, h, s, d, dv, causal in MODEL_SHAPES:
            if args.match and not any(m in label for m in args.match):
                continue
            print(row(label, b, h, s, d, dv, causal, time_cell(b, h, s, d, dv, causal, args.repeats, args.seconds,
                                                               True)), flush=True)
            torch.cuda.empty_cache()
    if args.grid:
        for d in args.hd:
            for causal in args.causal:
                for s in args.seqlens:
                    b, h = 16384 // s, max(1, 2048 // d)
                    dv = args.dv or d
                    print(row(f"grid hd {d}" if dv == d else f"grid hd {d} / {dv}", b, h, s, d, dv, bool(causal),
                              time_cell(b, h, s, d, dv, bool(causal), args.repeats, args.seconds, False)), flush=True)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
