"""The FP8 forward against our bf16 forward and cuDNN's bf16 SDPA, in alternating bursts in one process
(recheck_cell.py's burst timing), with the FP8 GEMM ceiling (torch._scaled_mm, 8192^3, e4m3 in, bf16 out) measured
in the same run. B·S = 16k tokens, H·D = 2048, inputs N(0, 1) quantised to e4m3 with per-(batch, KV head) descales
(amax / 448). FLOPs: 4·b·h·s²·d, half under a causal mask.

    PYTHONPATH=<build>/python python3 bench/gpu/fp8_bench.py [--hd 64 128 256] [--seqlens 1024 4096 16384]
        [--causal 0 1] [--repeats 3] [--seconds 0.3] [--accuracy]

Prints one markdown row per cell: TFLOP/s of FP8, bf16 (ours), cuDNN bf16, FP8 / bf16 over the repeats (range),
and the share of the FP8 call spent writing V_t (the transpose kernel, from one profiled call). --accuracy adds
the relative RMSE of the FP8 and bf16 outputs against float64 attention of the unquantised inputs, on N(0, 1)
and on FA3's outlier distribution (N(0, 1) plus N(0, 100) on 0.1% of the entries), and the FP8 output's against
the attention of its dequantised inputs (the kernel's own error, without the inputs' quantisation).

--backward times flashattn.fp8_attention_backward (e4m3 q, k, v, dout with descales; the forward's out and lse)
against our bf16 backward on the same shapes (both through the operator, given out and lse), with the share of the
FP8 call spent staging the 16-bit copies; with --accuracy, the relative RMSE of dq, dk, dv (FP8 and bf16) against
float64 gradients of the unquantised inputs, and the FP8 ones against those of its dequantised inputs.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import flashattn
from flashattn import fa3, fp8

sys.path.insert(0, __file__.rsplit("/", 1)[0])
sys.path.insert(0, __file__.rsplit("/", 2)[0])
from bench_vs_torch import flops  # noqa: E402
from fp8_incoherent import reference, rel_rmse  # noqa: E402  (bench/: float64 attention, relative RMSE)
from recheck_cell import add_grid_options, burst  # noqa: E402

F8 = torch.float8_e4m3fn
quantise = fp8.quantize  # x [b, s, h, d] -> (e4m3 values, fp32 descale [b, h]): per-(batch, head) amax scaling


def gemm_ceiling(seconds):
    n = 8192
    a = torch.randn(n, n, device="cuda").to(F8)
    b = torch.randn(n, n, device="cuda").to(F8).t()
    one = torch.ones((), device="cuda")
    t = burst(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), seconds)
    return 2.0 * n ** 3 / t / 1e12


def accuracy(d, s, causal, outliers):
    b, h = 1, 4
    g = torch.Generator(device="cuda").manual_seed(3)
    x = [torch.randn(b, s, h, d, device="cuda", generator=g) for _ in range(3)]
    if outliers:
        for t in x:
            mask = torch.rand(t.shape, device="cuda", generator=g) < 1e-3
            t += mask * torch.randn(t.shape, device="cuda", generator=g) * 10.0
    ref = reference(*x, causal)
    qs = [quantise(t) for t in x]
    out8 = fa3.flash_attn_func(qs[0][0], qs[1][0], qs[2][0], causal=causal, q_descale=qs[0][1],
                               k_descale=qs[1][1], v_descale=qs[2][1])
    out16 = flashattn.flash_attn_func(*(t.bfloat16() for t in x), causal=causal)
    # The kernel's own error: against the attention of the values it was given (e4m3 times descale).
    ref_deq = reference(*(t8.double() * s.double()[:, None, :, None] for t8, s in qs), causal)
    return rel_rmse(out8, ref), rel_rmse(out16, ref), rel_rmse(out8, ref_deq)


def cell(d, s, causal, repeats, seconds):
    b, h = 16384 // s, 2048 // d
    x = [torch.randn(b, s, h, d, device="cuda") for _ in range(3)]
    q16, k16, v16 = (t.bfloat16() for t in x)
    (q8, qd), (k8, kd), (v8, vd) = (quantise(t) for t in x)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q16, k16, v16))
    fp8 = lambda: fa3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    bf16 = lambda: flashattn.flash_attn_func(q16, k16, v16, causal=causal)

    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    f = flops(b, h, s, d, causal, False)
    runs = {"fp8": [], "bf16": [], "cudnn": []}
    order = list(runs)
    for i in range(repeats):
        for name in (order if i % 2 == 0 else list(reversed(order))):
            fn = {"fp8": fp8, "bf16": bf16, "cudnn": cudnn}[name]
            runs[name].append(burst(fn, seconds))
    best = {k: f / min(v) / 1e12 for k, v in runs.items()}
    ratios = [b16 / b8 for b8, b16 in zip(runs["fp8"], runs["bf16"])]
    share = kernel_share(fp8, "fp8_v_transpose", ("fp8_v_transpose", "forward_kernel"))
    return best, (min(ratios), max(ratios)), share


def kernel_share(fn, part, whole):
    """Share of fn's device time in kernels whose names contain `part`, among those containing any of `whole`."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total = mine = 0.0
    for e in prof.key_averages():
        t = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if part in e.key:
            mine += t
        if any(w in e.key for w in whole):
            total += t
    return mine / total if total else float("nan")


def bf16_backward(dout, q, k, v, out, lse, causal):
    ints, floats = flashattn._ops.op_options(softmax_scale=q.shape[-1] ** -0.5, causal=causal)
    return torch.ops.flashattn.attention_backward(dout, q, k, v, out, lse, None, None, None, None, ints, floats,
                                                  "auto")


def backward_calls(x, causal):
    """(fp8, bf16): our FP8 backward of x = (q, k, v, dout) quantised per (batch, head), and our bf16 backward of
    x, each given its own forward's out and lse."""
    q16, k16, v16, do16 = (t.bfloat16() for t in x)
    (q8, qd), (k8, kd), (v8, vd), (do8, dod) = (quantise(t) for t in x)
    with torch.no_grad():
        out8, lse8 = flashattn.fp8_attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
        out16, lse16 = flashattn.attention(q16, k16, v16, causal=causal)
    fp8 = lambda: flashattn.fp8_attention_backward(do8, q8, k8, v8, out8, lse8, q_descale=qd, k_descale=kd,
                                                   v_descale=vd, do_descale=dod, causal=causal)
    bf16 = lambda: bf16_backward(do16, q16, k16, v16, out16, lse16, causal)
    return fp8, bf16


def backward_cell(d, s, causal, repeats, seconds):
    b, h = 16384 // s, 2048 // d
    fp8, bf16 = backward_calls([torch.randn(b, s, h, d, device="cuda") for _ in range(4)], causal)
    f = 2.5 * flops(b, h, s, d, causal, False)
    runs = {"fp8": [], "bf16": []}
    for i in range(repeats):
        for name in (("fp8", "bf16") if i % 2 == 0 else ("bf16", "fp8")):
            runs[name].append(burst(fp8 if name == "fp8" else bf16, seconds))
    best = {k: f / min(v) / 1e12 for k, v in runs.items()}
    ratios = [b8 / b16 for b8, b16 in zip(runs["fp8"], runs["bf16"])]
    share = kernel_share(fp8, "fp8_stage", ("fp8_stage", "backward", "bwd_", "dq_convert"))
    return best, (min(ratios), max(ratios)), share


def backward_accuracy(d, s, causal, outliers):
    """Relative RMSE of (dq, dk, dv): FP8 and bf16 against float64 gradients of the unquantised inputs, FP8
    against those of its dequantised inputs."""
    b, h = 1, 4
    g = torch.Generator(device="cuda").manual_seed(4)
    x = [torch.randn(b, s, h, d, device="cuda", generator=g) for _ in range(4)]
    if outliers:
        for t in x[:3]:
            mask = torch.rand(t.shape, device="cuda", generator=g) < 1e-3
            t += mask * torch.randn(t.shape, device="cuda", generator=g) * 10.0

    def grads64(q, k, v, dout):
        q, k, v = (t.double().requires_grad_() for t in (q, k, v))
        out = reference(q, k, v, causal)
        return torch.autograd.grad(out, (q, k, v), dout.double())

    ref = grads64(*x)
    ref_deq = grads64(*(t8.double() * sc.double()[:, None, :, None] for t8, sc in map(quantise, x)))
    fp8, bf16 = backward_calls(x, causal)
    g8, g16 = fp8(), bf16()
    fmt = lambda got, want: "/".join(f"{rel_rmse(a_, b_):.1e}" for a_, b_ in zip(got, want))
    return fmt(g8, ref), fmt(g16, ref), fmt(g8, ref_deq)


def main_backward(a):
    print("| hd | S | causal | FP8 bwd | bf16 bwd (ours) | FP8 / bf16 time | staging share |")
    print("|---|---|---|---|---|---|---|")
    for d in a.hd:
        for s in a.seqlens:
            for causal in a.causal:
                best, (lo, hi), share = backward_cell(d, s, bool(causal), a.repeats, a.seconds)
                print(f"| {d} | {s} | {causal} | {best['fp8']:.0f} | {best['bf16']:.0f} | {lo:.2f}-{hi:.2f} | "
                      f"{share * 100:.1f}% |", flush=True)
    if a.accuracy:
        print("\n| hd | S | causal | inputs | FP8 dq/dk/dv rel. RMSE | bf16 dq/dk/dv | FP8 vs dequantised inputs |")
        print("|---|---|---|---|---|---|---|")
        for d in a.hd:
            for causal in (0, 1):
                for outliers in (False, True):
                    e8, e16, own = backward_accuracy(d, 2048, bool(causal), outliers)
                    print(f"| {d} | 2048 | {causal} | {'outliers' if outliers else 'N(0,1)'} | {e8} | {e16} | "
                          f"{own} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    add_grid_options(ap, [64, 128, 256], [1024, 4096, 16384], 3, 0.3)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--backward", action="store_true")
    a = ap.parse_args()
    if a.backward:
        return main_backward(a)
    print(f"FP8 GEMM ceiling (torch._scaled_mm 8192^3, e4m3 -> bf16): {gemm_ceiling(a.seconds):.0f} TFLOP/s\n")
    print("| hd | S | causal | FP8 | bf16 (ours) | cuDNN bf16 | FP8 / bf16 | V_t share |")
    print("|---|---|---|---|---|---|---|---|")
    for d in a.hd:
        for s in a.seqlens:
            for causal in a.causal:
                best, (lo, hi), share = cell(d, s, bool(causal), a.repeats, a.seconds)
                print(f"| {d} | {s} | {causal} | {best['fp8']:.0f} | {best['bf16']:.0f} | {best['cudnn']:.0f} | "
                      f"{lo:.2f}-{hi:.2f} | {share * 100:.1f}% |", flush=True)
    if a.accuracy:
        print("\n| hd | S | causal | inputs | FP8 rel. RMSE | bf16 rel. RMSE | FP8 vs its dequantised inputs |")
        print("|---|---|---|---|---|---|---|")
        for d in a.hd:
            for causal in (0, 1):
                for outliers in (False, True):
                    e8, e16, kernel = accuracy(d, 2048, bool(causal), outliers)
                    print(f"| {d} | 2048 | {causal} | {'outliers' if outliers else 'N(0,1)'} | {e8:.2e} | "
                          f"{e16:.2e} | {kernel:.2e} |", flush=True)


if __name__ == "__main__":
    main()
