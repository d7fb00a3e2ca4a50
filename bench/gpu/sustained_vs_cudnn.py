"""Forward of one cell, ours against cuDNN through PyTorch, under sustained load: each reading times a burst of
back-to-back launches lasting about SECONDS (CUDA events around the burst), alternating the two libraries
(cuDNN first in odd rounds), so both are read on a card at the clock its power draw allows. Short timings
(bench_vs_torch.py, recheck_cell.py) read ours highest on a cool card (sm90-notes.md, v18).

    PYTHONPATH=<build>/python python3 bench/gpu/sustained_vs_cudnn.py HEAD_DIM SEQLEN CAUSAL(0|1) [ROUNDS] [SECONDS]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import flashattn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import TORCH_BACKENDS, flops  # noqa: E402


def burst(fn, seconds):
    """Seconds per launch, averaged over a burst of about `seconds` (its length set from 10 probe launches)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(10):
        fn()
    stop.record()
    stop.synchronize()
    launches = max(10, int(seconds / (start.elapsed_time(stop) * 1e-3 / 10)))
    start.record()
    for _ in range(launches):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e-3 / launches


def main():
    d, s, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # flash_attn layout [b, s, h, d]
    ours = lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal)
    cudnn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def burst_cudnn():
        with sdpa_kernel([TORCH_BACKENDS["cudnn"]]):
            return burst(cudnn, seconds)

    f = flops(b, h, s, d, causal, backward=False)
    print(f"hd {d} S {s} causal {int(causal)}: forward TFLOP/s over ~{seconds:g} s bursts, ours / cuDNN")
    for i in range(rounds):
        if i % 2:
            t_cudnn = burst_cudnn()
            t_ours = burst(ours, seconds)
        else:
            t_ours = burst(ours, seconds)
            t_cudnn = burst_cudnn()
        print(f"  {i}: {f / t_ours * 1e-12:6.0f} / {f / t_cudnn * 1e-12:6.0f}  ({t_cudnn / t_ours:.3f})", flush=True)


if __name__ == "__main__":
    main()
