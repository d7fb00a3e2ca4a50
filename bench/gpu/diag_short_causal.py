"""Where the time of one short forward call goes through the PyTorch op: torch.profiler around ten calls of
flashattn.flash_attn_func (inputs requiring grad, causal) at a few short shapes of the benchmark grid (bf16,
B*S = 16k tokens, H*D = 2048); prints per call the device time of the top events (the kernel, memsets) and their
CPU time (the op's host path). bench/results/host-overhead.md has what it found.

    PYTHONPATH=<build>/python python3 bench/gpu/diag_short_causal.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import flashattn

for d, s in ((64, 512), (128, 512), (128, 1024), (256, 512)):
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for _ in range(5):
        flashattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            flashattn.flash_attn_func(q, k, v, causal=True)
        torch.cuda.synchronize()
    print(f"== hd {d} S {s} causal")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:5]:
        n = max(e.count, 1)
        print(f"  {e.key[:70]:70s} calls {e.count:3d} dev avg {e.self_device_time_total / n:9.1f} us"
              f"  cpu avg {e.cpu_time_total / n:9.1f} us")
