"""The warm-card comparison with cuDNN over a grid of cells in one process: for each (head dim, S, causal), REPEATS
alternating bursts of back-to-back forward launches per library (recheck_cell.py's burst timing; odd repeats
time cuDNN first). Prints one markdown row per cell: each library's TFLOP/s range and the lowest and highest
per-repeat ratio ours / cuDNN. With --backward: bursts of the backward (autograd over a saved forward) and of the
forward, per library, and per cell the backward's TFLOP/s, the backward / forward time ratio of each library and
the ratio of the training step's attention time (forward + backward), cuDNN's over ours.

    PYTHONPATH=<build>/python python3 bench/gpu/burst_grid.py [--hd 64 128 256] [--seqlens 2048 ...]
        [--causal 0 1] [--repeats 3] [--seconds 1] [--backward]
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import flashattn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import TORCH_BACKENDS, flops  # noqa: E402
from recheck_cell import add_grid_options, burst  # noqa: E402


def backward_cell(d, s, causal, repeats, seconds):
    """Per repeat: (ours fwd, ours bwd, cuDNN fwd, cuDNN bwd) seconds per launch."""
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qb, kb, vb = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    out_ours = flashattn.flash_attn_func(qb, kb, vb, causal=causal)
    dout_ours = dout.transpose(1, 2).contiguous()
    with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
        out_cudnn = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours():
        fwd = burst(lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal), seconds)
        bwd = burst(lambda: torch.autograd.grad(out_ours, (qb, kb, vb), dout_ours, retain_graph=True), seconds)
        return fwd, bwd

    def cudnn():
        with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
            fwd = burst(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), seconds)
            bwd = burst(lambda: torch.autograd.grad(out_cudnn, (q, k, v), dout, retain_graph=True), seconds)
        return fwd, bwd

    readings = []
    for i in range(repeats):
        if i % 2:
            c, o = cudnn(), ours()
        else:
            o, c = ours(), cudnn()
        readings.append((*o, *c))
    return b, h, readings


def print_backward_grid(args):
    print(f"backward TFLOP/s (2.5x the forward's FLOPs), bursts of ~{args.seconds:g} s, {args.repeats} alternating "
          f"repeats per cell ({torch.cuda.get_device_name()})")
    print("| hd | S | causal | ours bwd | cuDNN bwd | ours/cuDNN bwd | bwd/fwd time ours | bwd/fwd cuDNN | "
          "fwd+bwd time cuDNN/ours |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.hd:
        for causal in args.causal:
            for s in args.seqlens:
                b, h, r = backward_cell(d, s, bool(causal), args.repeats, args.seconds)
                f = flops(b, h, s, d, bool(causal), backward=True) * 1e-12
                ours, cud = [f / x[1] for x in r], [f / x[3] for x in r]
                ratios = [x[3] / x[1] for x in r]
                ratio_ours = [x[1] / x[0] for x in r]
                ratio_cudnn = [x[3] / x[2] for x in r]
                step = [(x[2] + x[3]) / (x[0] + x[1]) for x in r]
                rng = lambda xs, fmt: f"{min(xs):{fmt}}-{max(xs):{fmt}}"  # noqa: E731
                print(f"| {d} | {s} | {'yes' if causal else 'no'} | {rng(ours, '.0f')} | {rng(cud, '.0f')} | "
                      f"{rng(ratios, '.2f')} | {rng(ratio_ours, '.2f')} | {rng(ratio_cudnn, '.2f')} | "
                      f"{rng(step, '.2f')} |", flush=True)


def cell(d, s, causal, repeats, seconds):
    b, h = 16384 // s, 2048 // d  # the benchmark grid's shapes: B·S = 16k tokens, H·D = 2048
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # flash_attn layout [b, s, h, d]

    def ours():
        return burst(lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal), seconds)

    def cudnn():
        with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
            return burst(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), seconds)

    f = flops(b, h, s, d, causal, backward=False) * 1e-12
    readings = []
    for i in range(repeats):
        pair = (cudnn(), ours())[::-1] if i % 2 else (ours(), cudnn())
        readings.append((f / pair[0], f / pair[1]))
    return readings


def main():
    ap = argparse.ArgumentParser()
    add_grid_options(ap, hd=[64, 128, 256], seqlens=[2048, 4096, 8192, 16384], repeats=3, seconds=1.0)
    ap.add_argument("--backward", action="store_true", help="time the backward (and the forward beside it)")
    args = ap.parse_args()
    if args.backward:
        print_backward_grid(args)
        return
    print(f"forward TFLOP/s, bursts of ~{args.seconds:g} s, {args.repeats} alternating repeats per cell "
          f"({torch.cuda.get_device_name()})")
    print("| hd | S | causal | ours | cuDNN | ours/cuDNN (lowest-highest) |")
    print("|---|---|---|---|---|---|")
    for d in args.hd:
        for causal in args.causal:
            for s in args.seqlens:
                r = cell(d, s, bool(causal), args.repeats, args.seconds)
                ours, cud = [x[0] for x in r], [x[1] for x in r]
                ratios = [o / c for o, c in r]
                print(f"| {d} | {s} | {'yes' if causal else 'no'} | {min(ours):.0f}-{max(ours):.0f} | "
                      f"{min(cud):.0f}-{max(cud):.0f} | {min(ratios):.2f}-{max(ratios):.2f} |", flush=True)


if __name__ == "__main__":
    main()
