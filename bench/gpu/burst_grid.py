"""The warm-card comparison with cuDNN (and FlashAttention-4's Hopper kernels, `flash_attn.cute`, where that package
is installed: shared/tools/fa4-anchor) over a grid of cells in one process: for each (head dim, S, causal),
REPEATS rounds of bursts of back-to-back launches, one burst per library, the libraries' order rotating from round
to round (recheck_cell.py's burst timing). Prints one markdown row per cell: each library's TFLOP/s range and the
lowest and highest per-round ratio ours / peer. With --backward: bursts of the backward (autograd over a saved
forward) and of the forward, per library, and per cell the backward's TFLOP/s, the backward / forward time ratio of
each library and the ratio of the training step's attention time (forward + backward), peer's over ours.

    PYTHONPATH=<build>/python python3 bench/gpu/burst_grid.py [--hd 64 128 256] [--seqlens 2048 ...]
        [--causal 0 1] [--repeats 3] [--seconds 1] [--backward] [--no-fa4]
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


def fa4_forward():
    """FlashAttention-4's forward ([b, s, h, d] tensors; returns the output alone), or None if not installed."""
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        return None

    def run(q, k, v, causal):
        r = flash_attn_func(q, k, v, causal=causal)
        return r[0] if isinstance(r, tuple) else r
    return run


def libraries(use_fa4):
    """name -> forward(q, k, v, causal) over [b, h, s, d] tensors made by the caller in that library's layout."""
    def cudnn(q, k, v, causal):
        with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    libs = {"ours": lambda q, k, v, causal: flashattn.flash_attn_func(q, k, v, causal=causal), "cuDNN": cudnn}
    fa4 = fa4_forward() if use_fa4 else None
    if fa4 is not None:
        libs["FA4"] = fa4
    return libs


# Layout each library takes: cuDNN's SDPA [b, h, s, d], the flash_attn-style ones [b, s, h, d].
def _layout(name, t):
    return t if name == "cuDNN" else t.transpose(1, 2).contiguous()


def timed_cells(libs, d, s, causal, repeats, seconds, backward):
    """Per library, per round: (forward seconds, backward seconds or None) per launch."""
    b, h = 16384 // s, 2048 // d  # the benchmark grid's shapes: B·S = 16k tokens, H·D = 2048
    base = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    runners = {}
    for name, fwd in libs.items():
        q, k, v = (_layout(name, t).requires_grad_(backward) for t in base)
        # With --backward the forward is timed as training runs it (inputs that require grad: LSE saved).
        fwd_only = lambda fwd=fwd, q=q, k=k, v=v: fwd(q, k, v, causal)
        bwd = None
        try:
            fwd_only()
            if backward:
                out = fwd(q, k, v, causal)
                g = _layout(name, dout)
                bwd = lambda out=out, q=q, k=k, v=v, g=g: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
                bwd()
        except Exception as e:  # a peer that cannot run the cell: reported, left out of it
            if name == "ours":
                raise
            print(f"<!-- {name} skipped at hd {d} S {s} causal {causal}: {type(e).__name__}: {e} -->", flush=True)
            continue
        runners[name] = (fwd_only, bwd)
    names = list(runners)
    readings = {n: [] for n in names}  # only the libraries that ran the cell
    for i in range(repeats):
        for n in names[i % len(names):] + names[:i % len(names)]:
            fwd_only, bwd = runners[n]
            f = burst(fwd_only, seconds)
            readings[n].append((f, burst(bwd, seconds) if bwd else None))
    return b, h, readings


def rng(xs, fmt):
    return f"{min(xs):{fmt}}-{max(xs):{fmt}}"


def print_grid(args):
    libs = libraries(not args.no_fa4)
    peers = [n for n in libs if n != "ours"]
    kind = "backward TFLOP/s (2.5x the forward's FLOPs)" if args.backward else "forward TFLOP/s"
    print(f"{kind}, bursts of ~{args.seconds:g} s, {args.repeats} rotating rounds per cell, libraries: "
          f"{', '.join(libs)} ({torch.cuda.get_device_name()})")
    cols = [f"{n}" for n in libs] + [f"ours/{p}" for p in peers]
    if args.backward:
        cols += [f"bwd/fwd {n}" for n in libs] + [f"fwd+bwd {p}/ours" for p in peers]
    print("| hd | S | causal | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for d in args.hd:
        for causal in args.causal:
            for s in args.seqlens:
                b, h, r = timed_cells(libs, d, s, bool(causal), args.repeats, args.seconds, args.backward)
                f = flops(b, h, s, d, bool(causal), backward=args.backward) * 1e-12
                which = 1 if args.backward else 0
                na = "n/a"
                cells = [rng([f / x[which] for x in r[n]], ".0f") if n in r else na for n in libs]
                cells += [rng([r[p][i][which] / r["ours"][i][which] for i in range(args.repeats)], ".2f")
                          if p in r else na for p in peers]
                if args.backward:
                    cells += [rng([x[1] / x[0] for x in r[n]], ".2f") if n in r else na for n in libs]
                    cells += [rng([sum(r[p][i]) / sum(r["ours"][i]) for i in range(args.repeats)], ".2f")
                              if p in r else na for p in peers]
                print(f"| {d} | {s} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    add_grid_options(ap, hd=[64, 128, 256], seqlens=[2048, 4096, 8192, 16384], repeats=3, seconds=1.0)
    ap.add_argument("--backward", action="store_true", help="time the backward (and the forward beside it)")
    ap.add_argument("--no-fa4", action="store_true", help="leave FlashAttention-4 out even where it is installed")
    print_grid(ap.parse_args())


if __name__ == "__main__":
    main()
