"""PyTorch's FlashAttention-2 SDPA backend, backward only, on the shapes of backward_bench.cu, for a side-by-side
table from the same machine and clocks: B*S = 16k tokens, H*D = 2048, bf16; FLOPs 2.5 x 4*B*H*S^2*D, half for
causal; median of triton's do_bench over out.backward(dout).

    python3 bench/gpu/torch_flash_bwd.py [S ...]
    python3 bench/gpu/torch_flash_bwd.py --one D S    one non-causal backward call, nothing timed (for ncu)
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

if sys.argv[1:2] == ["--one"]:
    d, s = int(sys.argv[2]), int(sys.argv[3])
    b, h = 16384 // s, 2048 // d
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    torch.cuda.synchronize()
    sys.exit(0)

seqs = [int(a) for a in sys.argv[1:]] or [1024, 4096, 16384]
print("| S | B | H | D | causal | ms | TFLOP/s (torch flash bwd) |\n|---|---|---|---|---|---|---|")
for d in (64, 128, 256):
    for s in seqs:
        for causal in (False, True):
            b, h = 16384 // s, 2048 // d
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), warmup=25,
                              rep=100, return_mode="median")
            flops = 2.5 * 4.0 * b * h * s * s * d / (2 if causal else 1)
            print(f"| {s} | {b} | {h} | {d} | {int(causal)} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |",
                  flush=True)
            del q, k, v, dout, out
