"""Re-times one cell of bench_vs_torch.py's grid several times in a row (ours and cuDNN, forward), to tell a
one-off reading from a reproducible one. Same inputs and timing as bench_vs_torch.py.

    PYTHONPATH=<build>/python python3 bench/gpu/recheck_cell.py HEAD_DIM SEQLEN CAUSAL(0|1) [REPEATS]
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_vs_torch import flops, time_ours, time_torch  # noqa: E402

d, s, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 5
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
f = flops(b, h, s, d, causal, backward=False)
print(f"hd {d} S {s} causal {int(causal)}: forward TFLOP/s, ours / cuDNN")
# Odd repeats time cuDNN first, so that neither library always runs on the card as the other left it.
for i in range(repeats):
    if i % 2:
        cudnn, _, _ = time_torch(q, k, v, causal, "cudnn")
        ours, _ = time_ours(q, k, v, causal)
    else:
        ours, _ = time_ours(q, k, v, causal)
        cudnn, _, _ = time_torch(q, k, v, causal, "cudnn")
    print(f"  {i}: {f / ours * 1e-12:6.0f} / {f / cudnn * 1e-12:6.0f}", flush=True)
