"""What ALiBi (or dropout, or softcap) costs: flashattn's forward and backward with alibi_slopes (--feature dropout:
dropout_p = 0.1; --feature softcap: softcap = 30, Grok's and about Gemma 2's) against the same calls without, in
alternating bursts in one process (recheck_cell.py's burst timing), and PyTorch SDPA with the equivalent (a
materialised [1, h, s, s] bias as attn_mask, the efficient backend; or dropout_p, its flash backend; SDPA has no
softcap) for reference. bf16, B·S = 16k tokens, H·D = 2048, slopes
2^(-8 (h + 1) / H) (the ALiBi paper's).

    PYTHONPATH=<build>/python python3 bench/gpu/alibi_bench.py [--feature alibi|dropout|softcap] [--hd 64 128 256]
        [--seqlens 2048 8192] [--causal 0 1] [--repeats 3] [--seconds 0.3] [--sdpa-max 4096]

Prints one markdown row per cell: TFLOP/s of each (forward, backward), and the ranges over the repeats of the
time with the feature over the time without (forward, backward).
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import flashattn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import flops  # noqa: E402
from recheck_cell import add_grid_options, burst  # noqa: E402


def alibi_slopes(heads):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")


def sdpa_bias(slopes, s, causal):
    i = torch.arange(s, device="cuda")[:, None]
    j = torch.arange(s, device="cuda")[None, :]
    bias = -slopes[:, None, None] * (i - j).abs()[None].float()
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias[None].to(torch.bfloat16)


# The keyword arguments that turn each feature on (slopes: the ALiBi slopes of the call's heads).
FEATURES = {
    "alibi": lambda slopes: dict(alibi_slopes=slopes),
    "dropout": lambda slopes: dict(dropout_p=0.1),
    "softcap": lambda slopes: dict(softcap=30.0),
}


def cell(d, s, causal, repeats, seconds, sdpa_max, feature):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    slopes = alibi_slopes(h)

    def timed(on):
        kw = dict(causal=causal)
        if on:
            kw.update(FEATURES[feature](slopes))
        out = flashattn.flash_attn_func(q, k, v, **kw)
        fwd = burst(lambda: flashattn.flash_attn_func(q, k, v, **kw), seconds)
        bwd = burst(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), seconds)
        return fwd, bwd

    readings = []
    for i in range(repeats):
        plain, biased = (timed(False), timed(True)) if i % 2 == 0 else tuple(reversed((timed(True), timed(False))))
        readings.append((plain, biased))
    sdpa = None
    if s <= sdpa_max and feature != "softcap":
        qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        kw = dict(attn_mask=sdpa_bias(slopes, s, causal)) if feature == "alibi" else dict(dropout_p=0.1, is_causal=causal)
        out = F.scaled_dot_product_attention(qt, kt, vt, **kw)
        dt = dout.transpose(1, 2).contiguous()
        sdpa = (burst(lambda: F.scaled_dot_product_attention(qt, kt, vt, **kw), seconds),
                burst(lambda: torch.autograd.grad(out, (qt, kt, vt), dt, retain_graph=True), seconds))
    return b, h, readings, sdpa


def main():
    ap = argparse.ArgumentParser()
    add_grid_options(ap, hd=[64, 128, 256], seqlens=[2048, 8192], repeats=3, seconds=0.3)
    ap.add_argument("--sdpa-max", type=int, default=4096)
    ap.add_argument("--feature", choices=sorted(FEATURES), default="alibi")
    a = ap.parse_args()
    name = {"alibi": "ALiBi", "dropout": "dropout 0.1", "softcap": "softcap 30"}[a.feature]
    print(f"{name} cost, bf16, bursts of ~{a.seconds:g} s, {a.repeats} alternating repeats ({torch.cuda.get_device_name()})")
    print(f"| hd | S | causal | fwd TFLOP/s plain / {name} | bwd TFLOP/s plain / {name} | fwd time {name}/plain | "
          f"bwd time {name}/plain | SDPA with it fwd / bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for d in a.hd:
        for causal in a.causal:
            for s in a.seqlens:
                b, h, r, sdpa = cell(d, s, bool(causal), a.repeats, a.seconds, a.sdpa_max, a.feature)
                ff = flops(b, h, s, d, bool(causal), backward=False) * 1e-12
                fb = flops(b, h, s, d, bool(causal), backward=True) * 1e-12
                best = lambda xs: min(xs)  # noqa: E731
                fwd_plain, fwd_alibi = best([x[0][0] for x in r]), best([x[1][0] for x in r])
                bwd_plain, bwd_alibi = best([x[0][1] for x in r]), best([x[1][1] for x in r])
                rf = [x[1][0] / x[0][0] for x in r]
                rb = [x[1][1] / x[0][1] for x in r]
                sd = f"{ff / sdpa[0]:.0f} / {fb / sdpa[1]:.0f}" if sdpa else "-"
                print(f"| {d} | {s} | {'yes' if causal else 'no'} | {ff / fwd_plain:.0f} / {ff / fwd_alibi:.0f} | "
                      f"{fb / bwd_plain:.0f} / {fb / bwd_alibi:.0f} | {min(rf):.3f}-{max(rf):.3f} | "
                      f"{min(rb):.3f}-{max(rb):.3f} | {sd} |", flush=True)


if __name__ == "__main__":
    main()
