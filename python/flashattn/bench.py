"""The side-by-side benchmark: flashattn against PyTorch's scaled_dot_product_attention backends, in one process.

    python -m flashattn.bench                         # the papers' grid on the GPU (or a CPU grid without one)
    python -m flashattn.bench --shape 4,4096,32,128 --causal yes --pass forward backward
    python -m flashattn.bench --pass decode --json decode.json --png decode.png
    flashattn bench ...                               # the command line runs this module

On a GPU, ours (automatic dispatch) against SDPA's cuDNN and flash backends (--against adds efficient, math); on
the CPU against PyTorch's CPU SDPA. Passes: forward (no autograd), backward (autograd over a saved forward),
decode (one query row per sequence over a KV cache: ours through flash_attn_with_kvcache, SDPA on the dense
cache with enable_gqa). Timing: for each cell every library runs --repeats bursts of back-to-back calls lasting
about --seconds each, the libraries alternating and odd repeats in reverse order, so that all of them see the
same card: an H200's clock follows its power draw, and short timings read whichever library ran first on a
cool card highest. Each library's best burst is reported, and ours / theirs per repeat as a range.

Grids: "paper" (B·S = 16k tokens, H·D = 2048, S = 512 ... 16k, head dims 64, 128, 256: the FlashAttention
papers'), "quick" (two lengths, two head dims), "cpu" (B·S = 2k tokens, H·D = 512, S = 512 ... 2k), "tiny" (for
tests). FLOPs: forward 2·b·h·s²·(d + d_v), half under a causal mask, backward 2.5x that; decode reports the K/V
bytes read per second, and a table of its own: microseconds per call and the bandwidth as a share of the memory's
peak (--peak-gbs; known for the H200, 4.8 TB/s). These are eager calls, host time included; serving engines
capture decode steps in CUDA graphs (bench/gpu/decode_bench.py times those). Output: tables on the terminal,
and optionally JSON (every reading) and a PNG chart (needs matplotlib).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import flashattn

GRIDS = {
    "paper": dict(tokens=16384, width=2048, seqlens=[512, 1024, 2048, 4096, 8192, 16384], head_dims=[64, 128, 256]),
    "quick": dict(tokens=16384, width=2048, seqlens=[1024, 4096], head_dims=[64, 128]),
    "cpu": dict(tokens=2048, width=512, seqlens=[512, 1024, 2048], head_dims=[64, 128]),
    "tiny": dict(tokens=128, width=64, seqlens=[32, 64], head_dims=[16, 32]),
}
# Decode cells per grid: (batch, context) with 32 query heads over 8 KV heads of head dim 128 (tiny: 4 over 2 of 16).
DECODE = {
    "paper": dict(cells=[(1, 1024), (1, 16384), (16, 4096), (64, 8192), (8, 131072)], heads_q=32, heads_kv=8, d=128),
    "quick": dict(cells=[(1, 4096), (32, 8192)], heads_q=32, heads_kv=8, d=128),
    "cpu": dict(cells=[(1, 4096), (8, 4096)], heads_q=32, heads_kv=8, d=128),
    "tiny": dict(cells=[(2, 64)], heads_q=4, heads_kv=2, d=16),
}
GPU_LIBRARIES = ("cudnn", "flash", "efficient", "math")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OURS = "flashattn"


# ---- timing ----

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def burst(fn: Callable[[], object], seconds: float, device: str) -> float:
    """Seconds per call over a burst of back-to-back calls lasting about `seconds` (its length set from a probe)."""
    fn()
    _sync(device)
    start = time.perf_counter()
    probes = 3
    for _ in range(probes):
        fn()
    _sync(device)
    per_call = max((time.perf_counter() - start) / probes, 1e-7)
    calls = max(probes, int(seconds / per_call))
    if device == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e-3 / calls
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


# ---- what each library runs ----

def library_context(lib: str):
    """A fresh context manager selecting `lib`'s SDPA backend (entered around a whole burst, so that choosing the
    backend is not part of each call); ours and PyTorch's own choice ("sdpa") need none."""
    import contextlib

    if lib in (OURS, "sdpa"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([backends[lib]])


def _attention_call(lib, cell, dtype, device):
    """What one library runs for one attention cell (its pass: the forward, or the backward over a saved forward);
    raises if it cannot run it."""
    b, h, s, d, dv, causal = cell["b"], cell["h"], cell["s"], cell["d"], cell["dv"], cell["causal"]
    gen = torch.Generator(device="cpu").manual_seed(s * 7 + d)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    if lib == OURS:  # flash_attn's layout [b, s, h, d]
        q, k, v = make(b, s, h, d), make(b, s, h, d), make(b, s, h, dv)
        run = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        dout = make(b, s, h, dv)
    else:  # SDPA's layout [b, h, s, d]
        q, k, v = make(b, h, s, d), make(b, h, s, d), make(b, h, s, dv)
        run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        dout = make(b, h, s, dv)

    def forward():
        with torch.no_grad():
            return run()

    forward()  # fails here for a shape the library does not run
    if cell["pass"] != "backward":
        return forward
    for t in (q, k, v):
        t.requires_grad_()
    out = run()
    backward = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    backward()
    return backward


def _decode_call(lib, cell, dtype, device):
    b, ctx, hq, hkv, d = cell["b"], cell["s"], cell["h"], cell["h_kv"], cell["d"]
    gen = torch.Generator(device="cpu").manual_seed(ctx + b)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    if lib == OURS:
        q, k, v = make(b, 1, hq, d), make(b, ctx, hkv, d), make(b, ctx, hkv, d)
        lengths = torch.full((b,), ctx, dtype=torch.int32, device=device)
        fn = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lengths)  # noqa: E731
    else:
        q, k, v = make(b, hq, 1, d), make(b, hkv, ctx, d), make(b, hkv, ctx, d)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731

    with torch.no_grad():
        fn()
    return fn


# ---- the grid ----

def _parse_shape(text: str) -> dict:
    parts = text.split(",")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) not in (4, 5) or any(x < 1 for x in values):
        raise argparse.ArgumentTypeError(f"--shape wants B,S,H,D or B,S,H,D,D_V (positive integers), got {text!r}")
    b, s, h, d = values[:4]
    return dict(b=b, s=s, h=h, d=d, dv=values[4] if len(values) == 5 else d)


def cells_of(args) -> List[dict]:
    causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    out = []
    for p in args.passes:
        if p == "decode":
            dec = DECODE[args.grid]
            for b, ctx in dec["cells"]:
                out.append(dict(pass_="decode", b=b, s=ctx, h=dec["heads_q"], h_kv=dec["heads_kv"], d=dec["d"],
                                dv=dec["d"], causal=False))
            continue
        shapes = list(args.shape or [])
        if not shapes:
            g = GRIDS[args.grid]
            shapes = [dict(b=max(1, g["tokens"] // s), s=s, h=max(1, g["width"] // d), d=d, dv=d)
                      for d in g["head_dims"] for s in g["seqlens"]]
        for shape in shapes:
            for c in causal:
                out.append(dict(pass_=p, causal=c, **shape))
    for c in out:
        c["pass"] = c.pop("pass_")
    return out


def work_of(cell: dict, dtype: torch.dtype) -> float:
    """FLOPs of an attention cell, or bytes of K and V read by a decode cell."""
    if cell["pass"] == "decode":
        return cell["b"] * cell["s"] * cell["h_kv"] * (cell["d"] + cell["dv"]) * torch.finfo(dtype).bits / 8
    f = 2.0 * cell["b"] * cell["h"] * cell["s"] ** 2 * (cell["d"] + cell["dv"]) / (2 if cell["causal"] else 1)
    return f * (2.5 if cell["pass"] == "backward" else 1.0)


def run_cell(cell, libraries, dtype, device, repeats, seconds) -> dict:
    calls: Dict[str, Callable] = {}
    skipped: Dict[str, str] = {}
    for lib in libraries:
        try:
            with library_context(lib):
                call = _decode_call if cell["pass"] == "decode" else _attention_call
                calls[lib] = call(lib, cell, dtype, device)
        except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
            skipped[lib] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    readings: Dict[str, List[float]] = {lib: [] for lib in calls}
    order = list(calls)
    for r in range(repeats):
        for lib in order if r % 2 == 0 else order[::-1]:
            with library_context(lib):
                readings[lib].append(burst(calls[lib], seconds, device))
    calls.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    work = work_of(cell, dtype)
    result = dict(cell, device=device, dtype=str(dtype).replace("torch.", ""))
    result["libraries"] = {lib: dict(seconds=t, best_seconds=min(t), rate=work / min(t)) for lib, t in readings.items()}
    result["unsupported"] = skipped
    if OURS in readings:
        result["ratios"] = {lib: [theirs / ours for ours, theirs in zip(readings[OURS], t)]
                            for lib, t in readings.items() if lib != OURS}
    return result


# ---- output ----

def _unit(cell) -> tuple:
    """The rate's unit and scale: decode in GB/s, attention in TFLOP/s on a GPU and GFLOP/s on the CPU."""
    if cell["pass"] == "decode":
        return "GB/s", 1e9
    return ("TFLOP/s", 1e12) if cell["device"] == "cuda" else ("GFLOP/s", 1e9)


def _rate_text(cell, lib) -> str:
    entry = cell["libraries"].get(lib)
    if entry is None:
        return "n/a"
    return f"{entry['rate'] / _unit(cell)[1]:.3g}"


def table(results: List[dict], libraries: List[str]) -> str:
    others = [lib for lib in libraries if lib != OURS]
    head = ["pass", "b", "s", "h", "d/dv", "causal", "unit", OURS] + others + [f"{OURS}/{lib}" for lib in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in results:
        row = [c["pass"], str(c["b"]), str(c["s"]), str(c["h"]) + (f"/{c['h_kv']}" if "h_kv" in c else ""),
               f"{c['d']}/{c['dv']}", "yes" if c["causal"] else "no", _unit(c)[0], _rate_text(c, OURS)]
        row += [_rate_text(c, lib) for lib in others]
        for lib in others:
            r = c.get("ratios", {}).get(lib)
            row.append(f"{min(r):.2f}-{max(r):.2f}" if r else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    skipped = sorted({f"{lib}: {why}" for c in results for lib, why in c["unsupported"].items()})
    if skipped:
        lines.append("")
        lines += [f"n/a: {s}" for s in skipped[:12]]
    return "\n".join(lines)


# Rated memory bandwidth (GB/s) of the GPUs this project has measured on, for the decode table's share of peak.
PEAK_GBS = {"NVIDIA H200": 4800.0}


def decode_table(results: List[dict], libraries: List[str], peak_gbs: Optional[float]) -> str:
    """The decode cells: per library µs per call (best burst) and GB/s, ours also as a share of peak_gbs."""
    cells = [c for c in results if c["pass"] == "decode"]
    if not cells:
        return ""
    head = ["b", "context", "h/h_kv", "d", f"{OURS} µs", f"{OURS} GB/s", "% of peak"]
    for lib in libraries[1:]:
        head += [f"{lib} µs", f"{lib} GB/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [str(c["b"]), str(c["s"]), f"{c['h']}/{c['h_kv']}", str(c["d"])]
        for i, lib in enumerate(libraries):
            entry = c["libraries"].get(lib)
            gbs = entry["rate"] / 1e9 if entry else None
            row += [f"{entry['best_seconds'] * 1e6:.1f}" if entry else "n/a", f"{gbs:.3g}" if entry else "n/a"]
            if i == 0:
                row.append(f"{100 * gbs / peak_gbs:.0f}%" if entry and peak_gbs else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def chart(results: List[dict], libraries: List[str], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"flashattn.bench: --png needs matplotlib ({e})") from e
    passes = list(dict.fromkeys(c["pass"] for c in results))
    fig, axes = plt.subplots(len(passes), 1, figsize=(max(8, 0.6 * len(results)), 3.5 * len(passes)), squeeze=False)
    for ax, p in zip(axes[:, 0], passes):
        cells = [c for c in results if c["pass"] == p]
        width = 0.8 / len(libraries)
        unit, scale = _unit(cells[0])
        for i, lib in enumerate(libraries):
            values = [c["libraries"][lib]["rate"] / scale if lib in c["libraries"] else 0 for c in cells]
            ax.bar([x + i * width for x in range(len(cells))], values, width, label=lib)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cells))])
        labels = [f"b{c['b']} ctx{c['s']}" if p == "decode" else f"d{c['d']} s{c['s']}{' c' if c['causal'] else ''}"
                  for c in cells]
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
        ax.set_ylabel(unit)
        ax.set_title(f"{p}: {title}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.start = total, 0, enabled, time.perf_counter()

    def step(self, what: str) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta_text = f"{eta:4.0f}s left" if math.isfinite(eta) else "  ..."
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {eta_text} {what:40.40}")
        sys.stderr.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


# ---- entry point ----

def parse_args(argv: Optional[List[str]]):
    ap = argparse.ArgumentParser(prog="python -m flashattn.bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="auto: the GPU when this build has CUDA and one is present, else the CPU")
    ap.add_argument("--grid", choices=sorted(GRIDS), help="default: paper on the GPU, cpu on the CPU")
    ap.add_argument("--shape", type=_parse_shape, action="append",
                    help="B,S,H,D[,D_V] instead of the grid (repeatable)")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--pass", dest="passes", nargs="+", choices=["forward", "backward", "decode"],
                    default=["forward", "backward"])
    ap.add_argument("--against", nargs="+", choices=list(GPU_LIBRARIES) + ["sdpa"],
                    help="SDPA backends to compare with (default: cudnn flash on the GPU, sdpa on the CPU)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on the GPU, fp32 on the CPU")
    ap.add_argument("--repeats", type=int, default=3, help="bursts per library and cell (alternating)")
    ap.add_argument("--seconds", type=float, help="length of a burst (default: 0.5 on the GPU, 0.2 on the CPU)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--peak-gbs", type=float, help="memory bandwidth peak for the decode table's share (GB/s; "
                                                   "default: the device's rated one where known)")
    ap.add_argument("--json", help="write every reading here")
    ap.add_argument("--png", help="write a chart here (needs matplotlib)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.seconds is not None and not args.seconds > 0:
        ap.error(f"--seconds must be > 0, got {args.seconds}")
    if args.threads < 0:
        ap.error(f"--threads must be >= 0, got {args.threads}")
    if args.peak_gbs is not None and not args.peak_gbs > 0:
        ap.error(f"--peak-gbs must be > 0, got {args.peak_gbs}")
    gpu = flashattn.built_with_cuda and torch.cuda.is_available()
    if args.device == "cuda" and not gpu:
        ap.error("--device cuda: no CUDA device, or this build of flashattn has no CUDA kernels")
    args.device = ("cuda" if gpu else "cpu") if args.device == "auto" else args.device
    on_gpu = args.device == "cuda"
    args.grid = args.grid or ("paper" if on_gpu else "cpu")
    args.dtype_name = args.dtype or ("bf16" if on_gpu else "fp32")
    if on_gpu and args.dtype_name == "fp32":
        ap.error("--dtype fp32: flashattn's CUDA kernels run fp16 and bf16")
    args.seconds = args.seconds if args.seconds is not None else (0.5 if on_gpu else 0.2)
    against = args.against or (["cudnn", "flash"] if on_gpu else ["sdpa"])
    if not on_gpu and any(lib in GPU_LIBRARIES[:3] for lib in against):
        ap.error(f"--against {' '.join(against)}: cudnn, flash and efficient are GPU backends (the CPU has sdpa, math)")
    args.libraries = [OURS] + list(dict.fromkeys(against))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype_name]
    cells = cells_of(args)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    title = (f"{device_name}, {args.dtype_name}, torch {torch.__version__}, flashattn {flashattn.__version__}"
             + (f", cuDNN {torch.backends.cudnn.version()}" if args.device == "cuda" else
                f", {torch.get_num_threads()} threads, CPU level {flashattn.cpu_isa()}"))
    print(f"flashattn.bench: {title}; best of {args.repeats} alternating bursts of ~{args.seconds:g} s per library")
    progress = Progress(len(cells), not args.no_progress and sys.stderr.isatty())
    results = []
    for cell in cells:
        progress.step(f"{cell['pass']} b{cell['b']} s{cell['s']} d{cell['d']}{' causal' if cell['causal'] else ''}")
        results.append(run_cell(cell, args.libraries, dtype, args.device, args.repeats, args.seconds))
    progress.close()
    print(table(results, args.libraries))
    peak = args.peak_gbs if args.peak_gbs is not None else PEAK_GBS.get(device_name)
    decode = decode_table(results, args.libraries, peak)
    if decode:
        of = f"{peak:g} GB/s" if peak else "peak (unknown: --peak-gbs)"
        print(f"\nDecode: µs per call, GB/s and ours as a share of {of}")
        print(decode)
    if args.json:
        meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), device=device_name,
                    dtype=args.dtype_name, torch=torch.__version__, flashattn=flashattn.__version__,
                    repeats=args.repeats, seconds=args.seconds, grid=args.grid, libraries=args.libraries,
                    peak_gbs=peak,
                    argv=sys.argv[1:] if argv is None else list(argv))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, cells=results), f, indent=1)
    if args.png:
        chart(results, args.libraries, args.png, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
