"""cuDNN attention (PyTorch SDPA's cuDNN backend) on the grid bench_sm90_forward times, for side-by-side numbers
in one device call: B*S = 16k tokens, H*D = 2048, bf16, hd 64/128/256, S = 2k/4k/8k/16k, causal and not.
Median of CUDA-event timings after warm-up. Prints CSV: hd,seqlen,causal,ms,tflops."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    iters = 20
    print("hd,seqlen,causal,ms,tflops")
    for hd in (64, 128, 256):
        for s in (2048, 4096, 8192, 16384):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // hd
                q, k, v = (torch.randn(b, h, s, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                try:
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        for _ in range(3):
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        torch.cuda.synchronize()
                        times = []
                        for _ in range(iters):
                            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            e0.record()
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            e1.record()
                            e1.synchronize()
                            times.append(e0.elapsed_time(e1))
                except RuntimeError as e:
                    print(f"{hd},{s},{int(causal)},nan,nan  # {str(e).splitlines()[0]}")
                    continue
                times.sort()
                ms = times[len(times) // 2]
                flops = 4.0 * b * h * s * s * hd / (2 if causal else 1)
                print(f"{hd},{s},{int(causal)},{ms:.4f},{flops / (ms * 1e-3) / 1e12:.1f}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
