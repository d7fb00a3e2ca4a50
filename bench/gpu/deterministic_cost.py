"""The deterministic backward's cost: bursts of the backward with deterministic=False and =True, alternating, per
cell of the benchmark grid (B·S = 16k tokens, H·D = 2048, bf16); prints TFLOP/s of each and their ratio.

    PYTHONPATH=<build>/python python3 bench/gpu/deterministic_cost.py [--hd 64 128] [--seqlens 2048 16384]
        [--causal 0 1] [--repeats 2] [--seconds 0.5]
"""
import argparse
import sys

import torch

import flashattn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import flops  # noqa: E402
from recheck_cell import add_grid_options, burst  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    add_grid_options(ap, hd=[64, 128], seqlens=[2048, 16384], repeats=2, seconds=0.5)
    args = ap.parse_args()
    print(f"backward TFLOP/s, bursts of ~{args.seconds:g} s, {args.repeats} alternating repeats "
          f"({torch.cuda.get_device_name()})")
    print("| hd | S | causal | default | deterministic | deterministic / default |")
    print("|---|---|---|---|---|---|")
    for d in args.hd:
        for causal in map(bool, args.causal):
            for s in args.seqlens:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                outs = {det: flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=det)
                        for det in (False, True)}
                f = flops(b, h, s, d, causal, backward=True) * 1e-12

                def run(det):
                    return f / burst(lambda: torch.autograd.grad(outs[det], (q, k, v), dout, retain_graph=True),
                                     args.seconds)

                readings = []
                for i in range(args.repeats):
                    pair = (run(True), run(False))[::-1] if i % 2 else (run(False), run(True))
                    readings.append(pair)
                plain, det = [r[0] for r in readings], [r[1] for r in readings]
                ratios = [r[1] / r[0] for r in readings]
                print(f"| {d} | {s} | {'yes' if causal else 'no'} | {min(plain):.0f}-{max(plain):.0f} | "
                      f"{min(det):.0f}-{max(det):.0f} | {min(ratios):.2f}-{max(ratios):.2f} |", flush=True)


if __name__ == "__main__":
    main()
