"""Weak scaling of ring attention (flashattn.distributed.ring_flash_attn_func) over the GPUs of one host: every
rank holds --tokens-per-gpu tokens of one sequence, forward + backward in bursts of --iters steps (after warm-up),
against PyTorch's context_parallel (torch.distributed.tensor.experimental, SDPA on the same shards) where it runs.

Per-GPU rate = the whole sequence's attention FLOPs (forward 4·h·S²·d, half under causal, backward 2.5x) / P / time;
efficiency = that rate / the single-GPU rate of flashattn on one GPU's share of the work at the same head count
(rank 0 alone, a sequence of --tokens-per-gpu tokens). Target (the context-parallelism issue): >= 90% at 8 GPUs,
hd 128 causal, 128k tokens per GPU, and a 1M-token sequence training (forward + backward) on 8 H200s.

    torchrun --nproc-per-node 8 bench/gpu/ring_bench.py [--tokens-per-gpu 131072] [--heads 16] [--hd 128]
        [--layout zigzag] [--no-causal] [--iters 5] [--json out.json] [--torch-cp]
    (CPU smoke test: torchrun --nproc-per-node 2 bench/gpu/ring_bench.py --device cpu --tokens-per-gpu 256 --heads 2
     --hd 32 --iters 1)
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import flashattn
from flashattn.distributed import ring_flash_attn_func


def attention_flops(s, h, d, causal):
    f = 4.0 * h * s * s * d / (2 if causal else 1)
    return f * 3.5  # forward + backward (2.5x)


def timed(fn, iters, device):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tokens-per-gpu", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=0, help="0: --heads")
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--layout", choices=["contiguous", "zigzag"], default="zigzag")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--torch-cp", action="store_true", help="also time PyTorch's context_parallel")
    args = ap.parse_args()
    causal = not args.no_causal
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    L, h, hkv, d = args.tokens_per_gpu, args.heads, args.heads_kv or args.heads, args.hd
    S = L * world
    gen = torch.Generator().manual_seed(rank)
    q, k, v, dout = (torch.randn(1, L, n, d, generator=gen).to(device=device, dtype=dtype)
                     for n in (h, hkv, hkv, h))
    for t in (q, k, v):
        t.requires_grad_()

    def ring_step():
        out = ring_flash_attn_func(q, k, v, causal=causal, layout=args.layout)
        torch.autograd.grad(out, (q, k, v), dout)

    result = dict(world=world, tokens_per_gpu=L, sequence=S, heads=h, heads_kv=hkv, hd=d, causal=causal,
                  layout=args.layout, device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  flashattn=flashattn.__version__, torch=torch.__version__)
    t_ring = timed(ring_step, args.iters, device)
    result["ring_seconds"] = t_ring
    result["ring_tflops_per_gpu"] = attention_flops(S, h, d, causal) / world / t_ring / 1e12
    if args.torch_cp:
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel

            mesh = init_device_mesh(device, (world,))
            # Whole-sequence buffers [1, h, S, d] that context_parallel shards in place (SDPA's layout; K/V with
            # every query head: its ring does not take GQA), entered once around the timing.
            qf, kf, vf, dfull = (torch.randn(1, h, S, d, device=device, dtype=dtype) for _ in range(4))
            with context_parallel(mesh, buffers=[qf, kf, vf, dfull], buffer_seq_dims=[2, 2, 2, 2]):
                def cp_step():
                    ql, kl, vl = (t.detach().requires_grad_() for t in (qf, kf, vf))
                    out = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
                    torch.autograd.grad(out, (ql, kl, vl), dfull)

                t_cp = timed(cp_step, args.iters, device)
            result["torch_cp_seconds"] = t_cp
            result["torch_cp_tflops_per_gpu"] = attention_flops(S, h, d, causal) / world / t_cp / 1e12
        except Exception as e:  # reported, not fatal: the comparison is optional
            result["torch_cp_error"] = f"{type(e).__name__}: {e}"
    if rank == 0:
        # One GPU's share alone: a sequence of L tokens (the same FLOPs per GPU only at P = 1; the rate is what counts).
        def single():
            out = flashattn.flash_attn_func(q, k, v, causal=causal)
            torch.autograd.grad(out, (q, k, v), dout)

        single()
        start = time.perf_counter()
        for _ in range(args.iters):
            single()
        if device == "cuda":
            torch.cuda.synchronize()
        t1 = (time.perf_counter() - start) / args.iters
        result["single_tflops"] = attention_flops(L, h, d, causal) / t1 / 1e12
        result["efficiency"] = result["ring_tflops_per_gpu"] / result["single_tflops"]
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
