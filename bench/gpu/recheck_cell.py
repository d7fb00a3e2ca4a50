"""Re-times one cell of bench_vs_torch.py's grid several times in a row (ours and cuDNN, forward), to tell a
one-off reading from a reproducible one. Same inputs and timing as bench_vs_torch.py, or with BURST_SECONDS > 0
each reading is the mean of a burst of back-to-back forward launches lasting about that long (CUDA events around
the burst): both libraries are then read on a card at the clock its power draw allows, where the short timing
reads ours highest on a cool card (bench/results/hopper-forward.md, "Timing on this card").

    PYTHONPATH=<build>/python python3 bench/gpu/recheck_cell.py HEAD_DIM SEQLEN CAUSAL(0|1) [REPEATS] [BURST_SECONDS]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import flashattn
import flashattn.bench

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import TORCH_BACKENDS, flops, time_ours, time_torch  # noqa: E402


def burst(fn, seconds):
    """Seconds per launch, averaged over a burst of about `seconds` (flashattn.bench's timing rule)."""
    return flashattn.bench.burst(fn, seconds, "cuda")


def add_grid_options(ap, hd, seqlens, repeats, seconds):
    """The options every burst benchmark shares: head dims, lengths, masks, alternating repeats, burst length."""
    ap.add_argument("--hd", type=int, nargs="+", default=hd)
    ap.add_argument("--seqlens", type=int, nargs="+", default=seqlens)
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--seconds", type=float, default=seconds)


def main():
    d, s, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if seconds > 0:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # flash_attn layout [b, s, h, d]
        time_ours_fwd = lambda: burst(lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal), seconds)

        def time_cudnn_fwd():
            with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
                return burst(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), seconds)
    else:
        time_ours_fwd = lambda: time_ours(q, k, v, causal)[0]
        time_cudnn_fwd = lambda: time_torch(q, k, v, causal, "cudnn")[0]
    f = flops(b, h, s, d, causal, backward=False)
    how = f"bursts of ~{seconds:g} s" if seconds > 0 else "bench_vs_torch's timing"
    print(f"hd {d} S {s} causal {int(causal)}: forward TFLOP/s ({how}), ours / cuDNN")
    # Odd repeats time cuDNN first, so that neither library always runs on the card as the other left it.
    for i in range(repeats):
        if i % 2:
            cudnn = time_cudnn_fwd()
            ours = time_ours_fwd()
        else:
            ours = time_ours_fwd()
            cudnn = time_cudnn_fwd()
        print(f"  {i}: {f / ours * 1e-12:6.0f} / {f / cudnn * 1e-12:6.0f}", flush=True)


if __name__ == "__main__":
    main()
