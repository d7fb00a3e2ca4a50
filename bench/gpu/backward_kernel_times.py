"""The kernels one attention backward launches and how long each takes, for flashattn, a PyTorch SDPA backend or
FlashAttention-4's Hopper kernels (`--lib fa4`, where `flash_attn.cute` is installed).

Run under Nsight Compute, which times only the profiled range (one backward after warm-up ones):
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
      python3 bench/gpu/backward_kernel_times.py --lib ours --hd 128 --seqlen 2048 > times.csv
  python3 bench/gpu/backward_kernel_times.py --summarize times.csv
The shapes follow the benchmark grid: bf16, batch · seqlen = --tokens, heads · head dim = --hidden.
"""
import argparse
import csv
import sys
from collections import OrderedDict


def run(args):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, batch = args.hidden // args.hd, max(args.tokens // args.seqlen, 1)
    shape = (batch, args.seqlen, heads, args.hd)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if args.lib == "ours":
        import flashattn

        out = flashattn.flash_attn_func(q, k, v, causal=args.causal)
    elif args.lib == "fa4":  # FlashAttention-4's Hopper kernels (shared/tools/fa4-anchor), returns (out, lse)
        from flash_attn.cute import flash_attn_func

        out = flash_attn_func(q, k, v, causal=args.causal)[0]
    else:
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[args.lib]
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=args.causal).transpose(1, 2)
    grad = torch.randn_like(out)
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def summarize(path):
    """One line per kernel of the profiled call, in launch order: microseconds and the share of the call."""
    times = OrderedDict()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0][:90]
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(row.get("Metric Unit", "nsecond"), 1e-3)
        times.setdefault(name, []).append(float(row["Metric Value"].replace(",", "")) * scale)
    total = sum(sum(v) for v in times.values())
    for name, values in times.items():
        print(f"{sum(values):9.1f} us {100 * sum(values) / max(total, 1e-9):5.1f}%  x{len(values)}  {name}")
    print(f"{total:9.1f} us total")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", choices=["ours", "cudnn", "flash", "fa4"], default="ours")
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--summarize", metavar="CSV", help="print the per-kernel table of an ncu CSV and exit")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
