"""Does incoherent processing pay? The FP8 forward's error against the float64 attention of the unquantised
inputs, with q, k, v quantised per (batch, KV head) by flashattn.fp8.quantize_qkv, without and with the Hadamard
rotation of q and k (hadamard=True), on N(0, 1) inputs and on the FA3 paper's outlier distribution (N(0, 1) plus
N(0, 100) on 0.1% of the entries). Also the bf16 attention's error, for scale.

    PYTHONPATH=<build>/python python3 bench/fp8_incoherent.py [--device cpu|cuda] [--hd 64 128 256] [--seq 2048]
        [--seeds 3]

On the CPU the FP8 call is the CPU backends' (dequantise, then attention in fp32: the inputs' quantisation error
alone); on CUDA it is the Hopper FP8 kernel (P rounded to e4m3 as well). Prints one markdown row per (hd, causal,
inputs): relative RMSE (||out - ref|| / ||ref||) as the range over the seeds.
"""
import argparse
import math

import torch

import flashattn
from flashattn import fp8


def reference(q, k, v, causal):
    """float64 attention, [b, s, h, d], equal head counts."""
    q, k, v = (t.double() for t in (q, k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


def rel_rmse(got, want):
    return float((got.double() - want).norm() / want.norm())


def errors(d, s, causal, outliers, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = []
    for _ in range(3):
        t = torch.randn(1, s, 4, d, generator=g)
        if outliers:
            t += (torch.rand(t.shape, generator=g) < 1e-3) * torch.randn(t.shape, generator=g) * 10.0
        x.append(t.to(device))
    ref = reference(*x, causal)
    out = {}
    for hadamard in (False, True):
        qkv = fp8.quantize_qkv(*x, hadamard=hadamard, seed=seed)
        o, _ = flashattn.fp8_attention(qkv.q, qkv.k, qkv.v, causal=causal, **qkv.descales)
        out["hadamard" if hadamard else "fp8"] = rel_rmse(o, ref)
    o = flashattn.flash_attn_func(*(t.bfloat16() for t in x), causal=causal)
    out["bf16"] = rel_rmse(o, ref)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hd", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    span = lambda xs: f"{min(xs):.2e}" if max(xs) - min(xs) < 5e-5 else f"{min(xs):.2e}-{max(xs):.2e}"  # noqa: E731
    print(f"device {a.device}, S = {a.seq}, 4 heads, {a.seeds} seeds")
    print("| hd | causal | inputs | FP8 | FP8 + Hadamard | Hadamard / FP8 | bf16 |")
    print("|---|---|---|---|---|---|---|")
    for d in a.hd:
        for causal in (False, True):
            for outliers in (False, True):
                runs = [errors(d, a.seq, causal, outliers, seed, a.device) for seed in range(a.seeds)]
                col = {k: [r[k] for r in runs] for k in runs[0]}
                ratio = [r["hadamard"] / r["fp8"] for r in runs]
                print(f"| {d} | {int(causal)} | {'outliers' if outliers else 'N(0,1)'} | {span(col['fp8'])} | "
                      f"{span(col['hadamard'])} | {min(ratio):.2f}-{max(ratio):.2f} | {span(col['bf16'])} |",
                      flush=True)


if __name__ == "__main__":
    main()
