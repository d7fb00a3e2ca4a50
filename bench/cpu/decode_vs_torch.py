#!/usr/bin/env python3
"""CPU decode steps as serving code calls them: flashattn.flash_attn_with_kvcache (one query row per sequence over
a dense cache) against PyTorch's CPU scaled_dot_product_attention with enable_gqa, in one process, on the same
values (GQA 32 / 8 query / KV heads, d 128 unless given); `--page N`: ours on a paged cache holding the same rows in
shuffled pages (PyTorch on the dense one). Each library's layout is its native one (ours [b, s, h, d], PyTorch
[b, h, s, d] as views). Prints a markdown table: ms per call (compare_torch.best_time), PyTorch's time over
ours, and the largest difference between the two outputs.

    PYTHONPATH=<build>/python python3 bench/cpu/decode_vs_torch.py [--threads 2] [--cells 1x1024 1x4096 8x4096]
"""
import argparse

import torch
import torch.nn.functional as F

import flashattn
from compare_torch import best_time  # the CPU benchmarks' one timing rule (this script's folder is on sys.path)


def cell(batch, keys, dtype, args):
    gen = torch.Generator().manual_seed(batch * 7919 + keys)
    k = torch.randn(batch, keys, args.heads_kv, args.head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, keys, args.heads_kv, args.head_dim, generator=gen).to(dtype)
    q = torch.randn(batch, 1, args.heads_q, args.head_dim, generator=gen).to(dtype)
    lengths = torch.full((batch,), keys, dtype=torch.int32)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    kw = {}
    kc, vc = k, v
    if args.page:  # the same rows in pages of args.page, in shuffled order
        pages = batch * keys // args.page
        order = torch.randperm(pages, generator=gen)
        kc = torch.empty(pages, args.page, args.heads_kv, args.head_dim, dtype=dtype)
        vc = torch.empty_like(kc)
        kc[order] = k.reshape(pages, args.page, args.heads_kv, args.head_dim)
        vc[order] = v.reshape(pages, args.page, args.heads_kv, args.head_dim)
        kw["block_table"] = order.to(torch.int32).view(batch, keys // args.page)

    def ours():
        return flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lengths, **kw)

    def theirs():
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    diff = (ours().float() - theirs().transpose(1, 2).float()).abs().max().item()
    best_ours = best_theirs = float("inf")
    for _ in range(args.rounds):
        best_ours = min(best_ours, best_time(ours, args.min_time))
        best_theirs = min(best_theirs, best_time(theirs, args.min_time))
    return best_ours * 1e3, best_theirs * 1e3, diff


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--cells", nargs="+", default=["1x1024", "1x4096", "1x16384", "8x4096"],
                    help="batch x keys per sequence")
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=0, help="ours on a paged cache of this page size (0: dense)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"flashattn CPU level {flashattn.cpu_isa()}, PyTorch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), {args.threads} threads, "
          f"GQA {args.heads_q} / {args.heads_kv}, d {args.head_dim}, "
          f"{'pages of %d' % args.page if args.page else 'dense cache'}\n")
    print("| dtype | b | keys | ours ms | PyTorch ms | PyTorch / ours | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for name in args.dtypes:
        for spec in args.cells:
            batch, keys = (int(x) for x in spec.split("x"))
            ours, theirs, diff = cell(batch, keys, getattr(torch, name), args)
            print(f"| {name} | {batch} | {keys} | {ours:.3f} | {theirs:.3f} | {theirs / ours:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
