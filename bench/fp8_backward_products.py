#!/usr/bin/env python3
"""Which of the attention backward's five matrix products could run in FP8 (e4m3) without breaking accuracy.
CPU only (torch), no build needed:

    python3 bench/fp8_backward_products.py

Inputs Q, K, V, dO are quantised to float8_e4m3fn with one per-tensor power-of-two scale each; the gradients
wanted are those of the dequantised inputs, so the oracle is the float64 backward of attention on the dequantised
Q, K, V and dO. Per (batch, head), with P and dS the probabilities and score gradients:

    S = scale * Q K^T        (product 1, recomputed)    P = exp(S - LSE)    O = P V    D = rowsum(dO * O)
    dP = dO V^T              (product 2)                dS = P * (dP - D)
    dV = P^T dO              (product 3)    dQ = scale * dS K    (product 4)    dK = scale * dS^T Q    (product 5)

Every product is emulated as a kernel with fp32 accumulation would compute it: an fp32 matmul of operands rounded
the way the kernel would round them, either to bfloat16 (what our bf16 backward does: P and dS rounded to bf16, O
read back as the bf16 the forward stored) or to e4m3 with a scale the kernel could use (P * 2^8 or P * 2^6; dS with
one scale per row of a block tile, one per tile, or one per tensor, each 448 / amax). O and LSE are the oracle's,
rounded to bf16 and fp32 as the forward stores them. Prints a markdown table of the relative RMSE
(||x - ref|| / ||ref|| over the whole tensor) of dQ, dK, dV for each variant (all-bf16; each product alone in
FP8; {1, 2}; {1, 2, 3}; all five), and a conclusion computed from the numbers.
"""
import math
import time
from collections import namedtuple

import torch

# ---- setting --------------------------------------------------------------------------------------------------
BASE_SEED = 20261203
THREADS = 2
BATCH, HEADS = 1, 4
SEQLENS = (1024, 2048)
HEAD_DIMS = (64, 128)
CAUSAL = (False, True)
# FA3's outlier distribution: N(0, 1) everywhere plus N(0, 10^2) (std 10, variance 100) on 0.1% of the entries.
OUTLIER_FRACTION = 1e-3
OUTLIER_STD = 10.0
DISTRIBUTIONS = ("N(0,1)", "outliers")

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY_AMAX = 1e-30  # an all-zero row or tile (masked) quantises to zeros instead of dividing by zero

# Tiles of our Hopper backward (src/cuda/sm90/backward_config.h): a CTA owns KEY_BLOCK keys and streams query
# blocks of 64 rows (128 at hd 64).
KEY_BLOCK = 128
QUERY_BLOCKS = (64, 128)

# P <= 1, so P * 2^8 <= 256 < 448 keeps e4m3's range and lifts small probabilities out of its subnormals; our
# FP8 forward uses 2^6 (it leaves 2^2 of headroom for a stale running max), tried here too.
P_SCALE_LOG2 = (8, 6)

ORACLE_TOLERANCE = 1e-12  # float64 hand-written backward against autograd
ERROR_RATIO_LIMIT = 1.5   # "within 1.5x the bf16 baseline's error"
CANDIDATE_BOUND = 2.5e-2  # the bound the GPU tests put on the FP8 forward's own error

# ---- operand modes ---------------------------------------------------------------------------------------------
BF16 = "bf16"
FP8 = "e4m3"
P_MODES = {BF16: None, **{f"e4m3 P*2^{k}": 2.0 ** k for k in P_SCALE_LOG2}}
# dS scalings: (granularity, query rows of the tile). "row": one scale per row of each product's left operand
# within the tile, i.e. per query over the tile's KEY_BLOCK keys for dQ = dS K and per key over the tile's query
# rows for dK = dS^T Q, so that the scale is one per output row and comes out of the tile's sum; "tile": one scale
# per (query block x KEY_BLOCK) tile, shared by both products; "tensor": one per (batch, head) from dS's amax.
DS_MODES = {BF16: None,
            **{f"e4m3 row/{m}": ("row", m) for m in QUERY_BLOCKS},
            f"e4m3 tile/{QUERY_BLOCKS[0]}": ("tile", QUERY_BLOCKS[0]),
            "e4m3 tensor": ("tensor", None)}

Variant = namedtuple("Variant", "name qk dov p ds_dq ds_dk")
ALL_FIVE = "FP8 {1..5}"


def variants():
    """The variants to report: baseline, each product alone in FP8, then the sets {1, 2}, {1, 2, 3}, {1..5}."""
    out = [Variant("all bf16", BF16, BF16, BF16, BF16, BF16),
           Variant("FP8 {1} S=QK^T", FP8, BF16, BF16, BF16, BF16),
           Variant("FP8 {2} dP=dO V^T", BF16, FP8, BF16, BF16, BF16)]
    out += [Variant(f"FP8 {{3}} dV, {p}", BF16, BF16, p, BF16, BF16) for p in P_MODES if p != BF16]
    # dQ's row scale spans the tile's keys only, so row/64 and row/128 are the same for product 4.
    out += [Variant(f"FP8 {{4}} dQ, {s}", BF16, BF16, BF16, s, BF16)
            for s in DS_MODES if s not in (BF16, f"e4m3 row/{QUERY_BLOCKS[1]}")]
    out += [Variant(f"FP8 {{5}} dK, {s}", BF16, BF16, BF16, BF16, s) for s in DS_MODES if s != BF16]
    # In the backward P <= 1 exactly (the LSE is final, no stale maximum), so the sets take the full 2^8.
    sets_p = f"e4m3 P*2^{P_SCALE_LOG2[0]}"
    out += [Variant("FP8 {1,2}", FP8, FP8, BF16, BF16, BF16),
            Variant(f"FP8 {{1,2,3}}, {sets_p}", FP8, FP8, sets_p, BF16, BF16)]
    out += [Variant(f"{ALL_FIVE}, {sets_p}, dS {s}", FP8, FP8, sets_p, s, s) for s in DS_MODES if s != BF16]
    return out


# ---- inputs ----------------------------------------------------------------------------------------------------
def make_inputs(distribution, seqlen, head_dim, seed):
    """Q, K, V, dO as [batch, heads, seqlen, head_dim] float32 draws, fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    shape = (BATCH, HEADS, seqlen, head_dim)
    tensors = []
    for _ in range(4):
        x = torch.randn(shape, generator=gen)
        if distribution == "outliers":
            hit = torch.rand(shape, generator=gen) < OUTLIER_FRACTION
            x += hit * torch.randn(shape, generator=gen) * OUTLIER_STD
        tensors.append(x)
    return tensors


def quantise_input(x):
    """x -> (dequantised values in float64, e4m3 codes as float32, descale). The scale is the power of two
    2^floor(log2(448 / amax)), so x * scale lands in (224, 448] at the amax and the descale is exact: the
    dequantised values are e4m3 values times 2^-k, exactly representable in bf16 and fp32, so the bf16 baseline and
    the FP8 products see the same operand values and differ only where a kernel would round P or dS."""
    amax = float(x.abs().max())
    scale = 2.0 ** math.floor(math.log2(E4M3_MAX / amax))
    codes = (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float()
    descale = 1.0 / scale
    deq = codes * descale
    assert torch.equal(deq.bfloat16().float(), deq), "dequantised inputs must be exact in bf16"
    return deq.double(), codes, descale


# ---- float64 oracle --------------------------------------------------------------------------------------------
def causal_mask(seqlen):
    return torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1)


def oracle_head(q, k, v, do, causal):
    """Float64 forward and backward of one (batch, head); q, k, v, do [seqlen, head_dim] float64."""
    scale = q.shape[-1] ** -0.5
    s = (q @ k.T) * scale
    if causal:
        s.masked_fill_(causal_mask(s.shape[0]), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[:, None])
    o = p @ v
    d = (do * o).sum(-1)
    dp = do @ v.T
    ds = p * (dp - d[:, None])
    return {"o": o, "lse": lse, "dq": (ds @ k) * scale, "dk": (ds.T @ q) * scale, "dv": p.T @ do}


def check_oracle_against_autograd():
    """The oracle's hand-written backward against torch.autograd in float64 on a small causal case."""
    seqlen, head_dim = 256, 64  # small: autograd keeps the whole graph
    gen = torch.Generator().manual_seed(BASE_SEED)
    q, k, v, do = (torch.randn(seqlen, head_dim, generator=gen, dtype=torch.float64) for _ in range(4))
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    s = (qa @ ka.T) * head_dim ** -0.5
    s = s.masked_fill(causal_mask(seqlen), float("-inf"))
    (s.softmax(-1) @ va).backward(do)
    ref = oracle_head(q, k, v, do, True)
    for name, t in (("dq", qa), ("dk", ka), ("dv", va)):
        err = float((ref[name] - t.grad).norm() / t.grad.norm())
        assert err < ORACLE_TOLERANCE, f"oracle {name} disagrees with autograd: {err:.1e}"


# ---- emulated kernel rounding ----------------------------------------------------------------------------------
def to_bf16(x):
    return x.bfloat16().float()


def to_e4m3(x, scale):
    """Round x * scale to e4m3 and take the scale back off (the kernel folds 1 / scale into the fp32 result).
    scale broadcasts against x; clamping guards an fp32 product that rounds a hair above 448."""
    return (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() / scale


def amax_scale(amax):
    return E4M3_MAX / amax.clamp_min(TINY_AMAX)


def round_p(p, mode):
    if mode == BF16:
        return to_bf16(p)
    return to_e4m3(p, P_MODES[mode])


def round_ds(ds, mode, product):
    """dS [queries, keys] rounded as the operand of product "dq" (dS K) or "dk" (dS^T Q)."""
    if mode == BF16:
        return to_bf16(ds)
    granularity, query_block = DS_MODES[mode]
    nq, nk = ds.shape
    if granularity == "tensor":
        return to_e4m3(ds, amax_scale(ds.abs().amax()))
    if granularity == "row" and product == "dq":
        # one scale per query over each KEY_BLOCK keys: [nq, key blocks, KEY_BLOCK]
        tiles = ds.view(nq, nk // KEY_BLOCK, KEY_BLOCK)
        return to_e4m3(tiles, amax_scale(tiles.abs().amax(-1, keepdim=True))).view(nq, nk)
    # [query blocks, query_block, key blocks, KEY_BLOCK]
    tiles = ds.view(nq // query_block, query_block, nk // KEY_BLOCK, KEY_BLOCK)
    if granularity == "row":  # product "dk": one scale per key over the tile's query rows
        amax = tiles.abs().amax(1, keepdim=True)
    else:                     # "tile": one scale per tile
        amax = tiles.abs().amax((1, 3), keepdim=True)
    return to_e4m3(tiles, amax_scale(amax)).view(nq, nk)


def emulate_head(inputs, ref, causal, variant_list, sums):
    """Runs every variant's backward for one (batch, head) and adds its squared errors to sums[variant][grad].
    inputs: per tensor (dequantised float64, e4m3 codes, descale). Intermediate results are cached by the modes
    they depend on, so a product shared by several variants is computed once. Returns the largest differences
    between the FP8 and bf16 forms of products 1 and 2 (S and dP)."""
    (q64, q8, q_ds), (k64, k8, k_ds), (v64, v8, v_ds), (do64, do8, do_ds) = inputs
    q, k, v, do = (t.float() for t in (q64, k64, v64, do64))
    scale = q.shape[-1] ** -0.5
    o_stored = to_bf16(ref["o"].float())  # the forward's bf16 output
    lse = ref["lse"].float()              # the forward's fp32 LSE
    # D is a row sum, no matrix product: the same for every variant.
    d = (do * o_stored).sum(-1)
    mask = causal_mask(q.shape[0]) if causal else None

    # Products 1 and 2. bf16: operands are the bf16 values (== dequantised, see quantise_input). FP8: operands are
    # the e4m3 codes, the descales applied to the fp32 result, as an FP8 kernel would.
    scores = {BF16: (to_bf16(q) @ to_bf16(k).T) * scale, FP8: (q8 @ k8.T) * (scale * q_ds * k_ds)}
    dps = {BF16: to_bf16(do) @ to_bf16(v).T, FP8: (do8 @ v8.T) * (do_ds * v_ds)}
    diff = {"S": float((scores[FP8] - scores[BF16]).abs().max()), "dP": float((dps[FP8] - dps[BF16]).abs().max())}

    probs, dss, cache = {}, {}, {}

    def prob(qk):
        if qk not in probs:
            s = scores[qk]
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            probs[qk] = torch.exp(s - lse[:, None])
        return probs[qk]

    def score_grad(qk, dov):
        if (qk, dov) not in dss:
            dss[(qk, dov)] = prob(qk) * (dps[dov] - d[:, None])
        return dss[(qk, dov)]

    def cached(key, fn):
        if key not in cache:
            cache[key] = fn()
        return cache[key]

    for var in variant_list:
        # dO, K, Q as operands of products 3-5: bf16 and e4m3 forms hold the same values (exact), so one tensor.
        grads = {
            "dv": cached(("dv", var.qk, var.p), lambda: round_p(prob(var.qk), var.p).T @ do),
            "dq": cached(("dq", var.qk, var.dov, var.ds_dq),
                         lambda: (round_ds(score_grad(var.qk, var.dov), var.ds_dq, "dq") @ k) * scale),
            "dk": cached(("dk", var.qk, var.dov, var.ds_dk),
                         lambda: (round_ds(score_grad(var.qk, var.dov), var.ds_dk, "dk").T @ q) * scale),
        }
        for name, got in grads.items():
            err2 = float((got.double() - ref[name]).pow(2).sum())
            sums[var.name][name][0] += err2
    for name in ("dq", "dk", "dv"):
        norm2 = float(ref[name].pow(2).sum())
        for var in variant_list:
            sums[var.name][name][1] += norm2
    return diff


def run_config(distribution, seqlen, head_dim, causal, seed, variant_list):
    x = make_inputs(distribution, seqlen, head_dim, seed)
    quantised = [quantise_input(t) for t in x]
    sums = {var.name: {g: [0.0, 0.0] for g in ("dq", "dk", "dv")} for var in variant_list}
    worst = {"S": 0.0, "dP": 0.0}
    for b in range(BATCH):
        for h in range(HEADS):
            per_head = [(deq[b, h], codes[b, h], descale) for deq, codes, descale in quantised]
            ref = oracle_head(*(t[0] for t in per_head), causal)
            diff = emulate_head(per_head, ref, causal, variant_list, sums)
            worst = {key: max(worst[key], diff[key]) for key in worst}
    errors = {name: {g: math.sqrt(e / n) for g, (e, n) in per.items()} for name, per in sums.items()}
    return errors, worst


# ---- report ----------------------------------------------------------------------------------------------------
def conclusion(results, variant_list):
    """Text computed from the numbers: per variant, the worst ratio to the baseline and the worst error."""
    base = variant_list[0].name
    stats = {}
    for var in variant_list:
        ratio = {g: 0.0 for g in ("dq", "dk", "dv")}
        worst = {g: 0.0 for g in ("dq", "dk", "dv")}
        for errors, _ in results.values():
            for g in ratio:
                ratio[g] = max(ratio[g], errors[var.name][g] / errors[base][g])
                worst[g] = max(worst[g], errors[var.name][g])
        stats[var.name] = (ratio, worst)

    lines = ["", "## Conclusion (computed from the table)", ""]
    max_s = max(w["S"] for _, w in results.values())
    max_dp = max(w["dP"] for _, w in results.values())
    lines.append(f"- Products 1 and 2 (operands already e4m3, fp32 accumulation): largest |S_fp8 - S_bf16| = "
                 f"{max_s:.1e}, largest |dP_fp8 - dP_bf16| = {max_dp:.1e} over every configuration; the gradient "
                 f"errors of FP8 {{1}}, {{2}} and {{1,2}} over the baseline's: worst ratio "
                 + ", ".join(f"{n.split(' ')[1]} {max(stats[n][0].values()):.3f}" for n in
                             ("FP8 {1} S=QK^T", "FP8 {2} dP=dO V^T", "FP8 {1,2}")) + ".")
    base_worst = stats[base][1]
    lines.append(f"- Baseline (all bf16) errors reach dQ {base_worst['dq']:.2e}, dK {base_worst['dk']:.2e}, "
                 f"dV {base_worst['dv']:.2e}.")
    within, beyond = [], []
    for var in variant_list[1:]:
        ratio, worst = stats[var.name]
        text = (f"{var.name}: worst ratio dQ {ratio['dq']:.2f}x, dK {ratio['dk']:.2f}x, dV {ratio['dv']:.2f}x; "
                f"worst error {max(worst.values()):.2e}"
                f" ({'below' if max(worst.values()) <= CANDIDATE_BOUND else 'ABOVE'} {CANDIDATE_BOUND:.1e})")
        (within if max(ratio.values()) <= ERROR_RATIO_LIMIT else beyond).append(text)
    lines.append(f"- Within {ERROR_RATIO_LIMIT}x the baseline on every gradient and configuration:")
    lines += [f"  - {t}" for t in within] or ["  - none"]
    lines.append(f"- Beyond {ERROR_RATIO_LIMIT}x the baseline somewhere:")
    lines += [f"  - {t}" for t in beyond] or ["  - none"]
    best = best_all_five(stats, variant_list)
    lines.append(f"- Best dS scaling with all five products in FP8 (lowest worst dQ, dK error; the table's "
                 f"{{1..5}} row): {best}: worst dQ {stats[best][1]['dq']:.2e}, dK {stats[best][1]['dk']:.2e}, "
                 f"dV {stats[best][1]['dv']:.2e}.")
    return "\n".join(lines), best


def best_all_five(stats, variant_list):
    """The all-FP8 variant whose dS scaling gives the lowest worst error on dQ and dK (dV does not use dS)."""
    all_five = [v.name for v in variant_list if v.name.startswith(ALL_FIVE)]
    return min(all_five, key=lambda n: max(stats[n][1]["dq"], stats[n][1]["dk"]))


def main():
    torch.set_num_threads(THREADS)
    start = time.time()
    check_oracle_against_autograd()
    variant_list = variants()
    results = {}
    seed = BASE_SEED
    for distribution in DISTRIBUTIONS:
        for seqlen in SEQLENS:
            for head_dim in HEAD_DIMS:
                seed += 1  # one draw per (distribution, seqlen, head_dim), shared by causal and not
                for causal in CAUSAL:
                    results[(distribution, seqlen, head_dim, causal)] = run_config(
                        distribution, seqlen, head_dim, causal, seed, variant_list)

    text, best = conclusion(results, variant_list)
    # The table shows the all-FP8 set with the best dS scaling only; the conclusion lists every scaling.
    shown = [v for v in variant_list if not v.name.startswith(ALL_FIVE) or v.name == best]
    base = variant_list[0].name
    print(f"Relative RMSE against the float64 backward of the dequantised inputs; batch {BATCH}, heads {HEADS}, "
          f"seeds {BASE_SEED + 1}..{seed}. worst/bf16: the largest of the three gradients' error over the "
          f"all-bf16 baseline's.")
    for seqlen in SEQLENS:
        print(f"\n### S = {seqlen}\n")
        print("| inputs | d | causal | variant | dQ | dK | dV | worst/bf16 |")
        print("|---|---|---|---|---|---|---|---|")
        for (distribution, s, head_dim, causal), (errors, _) in results.items():
            if s != seqlen:
                continue
            for var in shown:
                e = errors[var.name]
                ratio = max(e[g] / errors[base][g] for g in e)
                print(f"| {distribution} | {head_dim} | {int(causal)} | {var.name} | {e['dq']:.2e} | "
                      f"{e['dk']:.2e} | {e['dv']:.2e} | {ratio:.2f} |")
    print(text)
    print(f"\n(ran in {time.time() - start:.0f} s on {THREADS} threads)")


if __name__ == "__main__":
    main()
