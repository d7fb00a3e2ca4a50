"""PyTorch's FlashAttention-2 SDPA backend on the shapes of forward_bench.cu, for a side-by-side table from
the same machine and clocks: B*S = 16k tokens, H*D = 2048, bf16; median of triton's do_bench.

    python3 bench/gpu/torch_flash_fwd.py [S ...]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

seqs = [int(a) for a in sys.argv[1:]] or [1024, 4096, 16384]
print("| S | B | H | D | causal | ms | TFLOP/s (torch flash) |\n|---|---|---|---|---|---|---|")
for d in (64, 96, 128, 256):
    for s in seqs:
        for causal in (False, True):
            b, h = 16384 // s, 2048 // d
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100,
                              return_mode="median")
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
            print(f"| {s} | {b} | {h} | {d} | {int(causal)} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |", flush=True)
