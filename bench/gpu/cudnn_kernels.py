"""Runs PyTorch SDPA's cuDNN backend on a few shapes of the benchmark grid (bf16, B*S = 16k tokens, H*D = 2048),
twice each, so that a profiler wrapped around it (ncu --section LaunchStats ...) reports which kernel cuDNN launches
there: its name (tile shape), grid, block, registers and shared memory.

    ncu -k regex:'sdpa|fprop|fort' --section LaunchStats python3 bench/gpu/cudnn_kernels.py [S] [D,CAUSAL]

D,CAUSAL (e.g. 64,1) runs only that head dim and mask.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

s = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
cells = ((64, False), (128, False), (128, True), (256, False))
if len(sys.argv) > 2:
    d, c = sys.argv[2].split(",")
    cells = ((int(d), c == "1"),)
for d, causal in cells:
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(2):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    print(f"hd {d} causal {causal} S {s}: done", flush=True)
