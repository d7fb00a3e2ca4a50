"""Side-by-side GPU benchmark: flashattn vs PyTorch SDPA's backends (flash, cuDNN, efficient), one process.

Grid as in the FlashAttention papers and shared/ANCHORS.md: B*S = 16k tokens, H*D = 2048, bf16, head dims
64/128/256, causal and not, S = 512 ... 16k. Timing: median of triton.testing.do_bench (25 ms warm-up,
100 ms of repeats). FLOPs: forward 4*B*H*S^2*D, half for causal; backward 2.5x the forward.

    python3 bench/gpu/bench_vs_torch.py --out bench/results/data/gpu-vs-sdpa-YYYY-MM-DD-COMMIT  [--quick]

Writes OUT.json, OUT.md (tables of TFLOP/s and our ratio to each backend) and OUT.png (chart).
"""
import argparse
import datetime
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn

TORCH_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def bench(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def flops(b, h, s, d, causal, backward):
    f = 4.0 * b * h * s * s * d
    if causal:
        f /= 2
    return f * (2.5 if backward else 1.0)


def time_ours(q, k, v, causal):
    # flash_attn layout: [b, s, h, d]
    qb, kb, vb = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    fwd = lambda: flashattn.flash_attn_func(qb, kb, vb, causal=causal)
    out = fwd()
    dout = torch.randn_like(out)
    t_fwd = bench(fwd)
    out = fwd()
    t_bwd = bench(lambda: torch.autograd.grad(out, (qb, kb, vb), dout, retain_graph=True))
    return t_fwd, t_bwd


def time_torch(q, k, v, causal, backend):
    qb, kb, vb = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([TORCH_BACKENDS[backend]]):
        fwd = lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
        try:
            out = fwd()
        except RuntimeError as e:  # a backend that cannot run this shape
            return None, None, str(e).splitlines()[0]
        dout = torch.randn_like(out)
        t_fwd = bench(fwd)
        out = fwd()
        t_bwd = bench(lambda: torch.autograd.grad(out, (qb, kb, vb), dout, retain_graph=True))
    return t_fwd, t_bwd, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="output path prefix (no extension)")
    ap.add_argument("--quick", action="store_true", help="S in {2k, 16k} only")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--backends", default="flash,cudnn,efficient")
    args = ap.parse_args()

    torch.manual_seed(0)
    seqlens = [2048, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    head_dims = [int(x) for x in args.head_dims.split(",")]
    backends = [b for b in args.backends.split(",") if b]
    rows = []
    for d in head_dims:
        h = 2048 // d
        for causal in (False, True):
            for s in seqlens:
                b = 16384 // s
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                row = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h}
                t_f, t_b = time_ours(q, k, v, causal)
                row["ours_fwd"] = flops(b, h, s, d, causal, False) / t_f * 1e-12
                row["ours_bwd"] = flops(b, h, s, d, causal, True) / t_b * 1e-12
                for name in backends:
                    t_f, t_b, err = time_torch(q, k, v, causal, name)
                    row[f"{name}_fwd"] = None if t_f is None else flops(b, h, s, d, causal, False) / t_f * 1e-12
                    row[f"{name}_bwd"] = None if t_b is None else flops(b, h, s, d, causal, True) / t_b * 1e-12
                    if err:
                        row[f"{name}_error"] = err
                rows.append(row)
                print(json.dumps(row), flush=True)
                del q, k, v
                torch.cuda.empty_cache()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not commit:  # an exported tree (no .git) records its commit in COMMIT
        try:
            with open("COMMIT") as f:
                commit = f.read().strip()
        except OSError:
            pass
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit or "unknown",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "command": " ".join(["python3"] + sys.argv),
    }
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)

    fmt = lambda x: "-" if x is None else f"{x:.0f}"
    ratio = lambda a, b: "-" if (a is None or b is None) else f"{a / b:.2f}"
    lines = [f"# GPU benchmark {meta['date']}", "", *(f"- {k}: {v}" for k, v in meta.items()), ""]
    for pass_ in ("fwd", "bwd"):
        for d in head_dims:
            lines += [f"## {pass_}, head dim {d} (H = {2048 // d}), TFLOP/s", ""]
            hdr = "| S | causal | ours | " + " | ".join(backends) + " | " + " | ".join(f"ours/{b}" for b in backends) + " |"
            lines += [hdr, "|" + "---|" * (3 + 2 * len(backends))]
            for r in rows:
                if r["head_dim"] != d:
                    continue
                ours = r[f"ours_{pass_}"]
                cells = [str(r["seqlen"]), "yes" if r["causal"] else "no", fmt(ours)]
                cells += [fmt(r.get(f"{b}_{pass_}")) for b in backends]
                cells += [ratio(ours, r.get(f"{b}_{pass_}")) for b in backends]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 2 * len(head_dims), figsize=(5 * len(head_dims) * 2, 8), squeeze=False)
        for pi, pass_ in enumerate(("fwd", "bwd")):
            col = 0
            for d in head_dims:
                for causal in (False, True):
                    ax = axes[pi][col]
                    sel = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
                    xs = [r["seqlen"] for r in sel]
                    for name in ["ours"] + backends:
                        ys = [r.get(f"{name}_{pass_}") for r in sel]
                        if any(y is not None for y in ys):
                            ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o", label=name)
                    ax.set_xscale("log", base=2)
                    ax.set_title(f"{pass_} hd{d}{' causal' if causal else ''}")
                    ax.set_xlabel("S")
                    ax.set_ylabel("TFLOP/s")
                    ax.grid(True, alpha=0.3)
                    col += 1
        axes[0][0].legend()
        fig.suptitle(f"flashattn vs PyTorch SDPA, {meta['gpu']}, bf16, B*S=16k, H*D=2048 ({meta['date']}, {meta['commit']})")
        fig.tight_layout()
        fig.savefig(args.out + ".png", dpi=80)
    except Exception as e:  # the chart is a convenience; the tables are the record
        print(f"chart not drawn: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
