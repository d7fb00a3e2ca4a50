"""What merging two partial attentions costs: flashattn.merge_attention_states_ (one fused kernel) against the
chain of PyTorch operations that does the same (logaddexp, isfinite, two exp, two where, multiply-adds: what the
ring merged with before), and the functional merge_attention_states, in alternating bursts in one process.

Cells: the ring's use (an fp32 accumulator [1, s, h, d] updated in place by a bf16 partial, and the fp32 LSEs) and
a cascade / prefix use (two bf16 partials into a new bf16 output). Reported: microseconds per call and the bytes
each call must move (read both sides, write the output and its LSE) per second, against the H200's 4.24 TB/s copy
rate.

    PYTHONPATH=<build>/python python3 bench/gpu/merge_bench.py [--tokens 4096 16384 65536] [--heads 16]
        [--hd 128] [--repeats 3] [--seconds 0.2]
"""
import argparse

import torch

import flashattn
from flashattn.bench import burst

COPY_RATE_TBS = 4.24  # H200 device-to-device copy, read + write (bench/results/README.md)


def torch_merge_(acc, acc_lse, out, lse):
    new = torch.logaddexp(acc_lse, lse)
    finite = torch.isfinite(new)
    w_acc = torch.where(finite, torch.exp(acc_lse - new), 0.0).transpose(-1, -2).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(lse - new), 0.0).transpose(-1, -2).unsqueeze(-1)
    acc.copy_(acc * w_acc + out.float() * w_new)
    acc_lse.copy_(new)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.2)
    a = ap.parse_args()
    print(f"merge of two partial attentions, h = {a.heads}, d = {a.hd}, bursts of ~{a.seconds:g} s, {a.repeats} "
          f"alternating repeats ({torch.cuda.get_device_name()})")
    print("| use | tokens | flashattn µs | TB/s (share of copy) | PyTorch ops µs | PyTorch / flashattn |")
    print("|---|---|---|---|---|---|")
    for s in a.tokens:
        h, d = a.heads, a.hd
        lse_a, lse_b = (torch.randn(1, h, s, device="cuda") for _ in range(2))
        part = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16)
        acc = torch.randn(1, s, h, d, device="cuda")
        other = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16)
        lse_bytes = 3 * h * s * 4
        cells = [
            ("ring: fp32 acc += bf16, in place", acc.numel() * (4 + 2 + 4) + lse_bytes,
             lambda: flashattn.merge_attention_states_(acc, lse_a, part, lse_b),
             lambda: torch_merge_(acc, lse_a, part, lse_b)),
            ("cascade: bf16 + bf16 -> bf16", part.numel() * 6 + lse_bytes,
             lambda: flashattn.merge_attention_states(other, lse_a, part, lse_b),
             lambda: torch_merge_(other.float(), lse_a.clone(), part, lse_b)),
        ]
        for name, nbytes, ours, theirs in cells:
            ratios, best_ours, best_theirs = [], float("inf"), float("inf")
            for r in range(a.repeats):
                order = [ours, theirs] if r % 2 == 0 else [theirs, ours]
                t = {fn: burst(fn, a.seconds, "cuda") for fn in order}
                best_ours, best_theirs = min(best_ours, t[ours]), min(best_theirs, t[theirs])
                ratios.append(t[theirs] / t[ours])
            rate = nbytes / best_ours / 1e12
            print(f"| {name} | {s} | {best_ours * 1e6:.1f} | {rate:.2f} ({rate / COPY_RATE_TBS:.0%}) | "
                  f"{best_theirs * 1e6:.1f} | {min(ratios):.2f}-{max(ratios):.2f} |", flush=True)
            # The accumulator's values run away under repeated merging; keep them finite.
            lse_a.normal_()
            acc.normal_()


if __name__ == "__main__":
    main()
