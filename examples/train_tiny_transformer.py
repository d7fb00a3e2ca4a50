"""Train a tiny causal transformer on the CPU twice from the same initialisation and data: once with flashattn's
flash_attn_func, once with PyTorch's scaled_dot_product_attention. The two loss curves must agree.

    python examples/train_tiny_transformer.py                  # 40 steps, automatic backend
    python examples/train_tiny_transformer.py --steps 10 --backend cpu_reference

The task is periodic copying (each sequence repeats a random block of --period tokens), which only attention to an
earlier position can solve, so the loss falls quickly and a wrong attention gradient shows up as a diverging curve. Exit status 1 if the curves
differ by more than --tolerance (relative) at any step.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import flashattn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, impl: str, backend: str):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.impl, self.backend = impl, backend
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        if self.impl == "flashattn":  # [batch, seq, heads, dim], GQA built in
            o = flashattn.flash_attn_func(q, k, v, causal=True, backend=self.backend)
        else:  # torch SDPA: [batch, heads, seq, dim], key/value heads repeated for the query groups
            group = self.heads // self.kv_heads
            k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        return self.out(o.reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, impl, backend):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, impl, backend)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=16, dim=64, heads=4, kv_heads=2, layers=2, max_len=64, impl="flashattn",
                 backend="auto"):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, impl, backend) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def set_attention(self, impl: str):
        for blk in self.blocks:
            blk.attn.impl = impl

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def periodic_batch(gen: torch.Generator, batch: int, seq: int, period: int, vocab: int) -> torch.Tensor:
    block = torch.randint(0, vocab, (batch, period), generator=gen)
    return block.repeat(1, (seq + period - 1) // period)[:, :seq]


def train(model: TinyTransformer, steps: int, batch: int, seq: int, period: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    vocab = model.head.out_features
    losses = []
    for _ in range(steps):
        tokens = periodic_batch(gen, batch, seq, period, vocab)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32, help="sequence length (at most 64)")
    p.add_argument("--period", type=int, default=5, help="length of the repeated block")
    p.add_argument("--backend", default="auto", help="flashattn backend (auto, cpu_flash, cpu_reference, ...)")
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest allowed relative loss difference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    ours = TinyTransformer(impl="flashattn", backend=args.backend)
    theirs = copy.deepcopy(ours)  # same initial weights
    theirs.set_attention("sdpa")

    curves = {}
    for name, model in (("flashattn", ours), ("torch_sdpa", theirs)):
        t0 = time.perf_counter()
        curves[name] = train(model, args.steps, args.batch, args.seq, args.period, args.seed)
        print(f"{name:>10}: {args.steps} steps in {time.perf_counter() - t0:.2f} s")

    worst = 0.0
    print(f"{'step':>5} {'flashattn':>12} {'torch_sdpa':>12} {'rel. diff':>10}")
    for step, (a, b) in enumerate(zip(curves["flashattn"], curves["torch_sdpa"])):
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel)
        if step < 5 or step % 10 == 9 or step == args.steps - 1:
            print(f"{step:>5} {a:>12.6f} {b:>12.6f} {rel:>10.2e}")
    first, last = curves["flashattn"][0], curves["flashattn"][-1]
    print(f"loss {first:.4f} -> {last:.4f}; largest relative difference between the curves: {worst:.2e} "
          f"(tolerance {args.tolerance:.0e})")
    if worst > args.tolerance:
        print("FAIL: the loss curves differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
