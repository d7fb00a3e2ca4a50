"""flashattn.fp8: quantising q, k, v to float8_e4m3fn per (sequence, KV head), and incoherent processing (the
Hadamard rotation of q and k), on the CPU backends (the FP8 oracle) and on CUDA where present.

Bounds: e4m3 keeps 3 mantissa bits, so a dequantised value is within 2^-4 of its input relative to it (round to
nearest), or within half the smallest subnormal step (2^-10 x descale) near zero. The end-to-end errors of the
attention (quantised inputs against the unquantised float64 attention) are those measured in bench/results/fp8.md
with some margin; a wrong scale, rotation or descale layout gives errors of order 1.
"""
from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import requires_cuda
from fa_reference import attention_ref, dequantised_fp8
from flashattn import fp8

F8 = torch.float8_e4m3fn


def rel_rmse(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def outliers(shape, g, scale=10.0, fraction=1e-3):
    """The FA3 paper's outlier distribution: N(0, 1), plus N(0, scale^2) on `fraction` of the entries."""
    x = torch.randn(shape, generator=g)
    return x + torch.randn(shape, generator=g) * scale * (torch.rand(shape, generator=g) < fraction)


def test_hadamard_rotation_is_orthogonal_seeded_and_block_diagonal():
    for d in (1, 8, 64, 128, 256, 96, 72, 59):
        r = fp8.hadamard_rotation(d, seed=3)
        assert r.shape == (d, d) and r.dtype == torch.float32
        r = r.double()
        torch.testing.assert_close(r @ r.t(), torch.eye(d, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(fp8.hadamard_rotation(128, seed=3), fp8.hadamard_rotation(128, seed=3))
    fp8.hadamard_rotation(128, seed=3).zero_()  # each call's tensor is the caller's own
    assert bool(fp8.hadamard_rotation(128, seed=3).abs().gt(0).all())
    assert not torch.equal(fp8.hadamard_rotation(128, seed=3), fp8.hadamard_rotation(128, seed=4))
    # 96 = 3 blocks of 32: no coupling between the blocks; every entry of a block is +-1/sqrt(32).
    r = fp8.hadamard_rotation(96)
    assert torch.count_nonzero(r[:32, 32:]) == 0 and torch.count_nonzero(r[32:64, 64:]) == 0
    torch.testing.assert_close(r[:32, :32].abs(), torch.full((32, 32), 32 ** -0.5))
    # 59 is odd: blocks of 1, i.e. random signs on the diagonal.
    torch.testing.assert_close(fp8.hadamard_rotation(59).abs(), torch.eye(59))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_scales_each_sequence_and_kv_head(dtype):
    g = torch.Generator().manual_seed(0)
    b, s, h, hkv, d = 3, 37, 8, 2, 64
    x = (torch.randn(b, s, h, d, generator=g) * torch.rand(b, 1, h, 1, generator=g).mul(20)).to(dtype)
    x[1, :, 4:] = 0  # one (sequence, KV head) slice all zeros
    x8, descale = fp8.quantize(x, hkv)
    assert x8.dtype == F8 and x8.shape == x.shape and descale.dtype == torch.float32 and descale.shape == (b, hkv)
    amax = x.float().abs().reshape(b, s, hkv, h // hkv, d).amax(dim=(1, 3, 4))
    want = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    torch.testing.assert_close(descale, want)
    assert descale[1, 1] == 1
    back = dequantised_fp8(x8, descale, h // hkv)
    err = (back - x.double()).abs()
    step = descale.double().repeat_interleave(h // hkv, 1)[:, None, :, None] * 2.0 ** -10
    assert bool((err <= x.double().abs() * 2.0 ** -4 + step).all())
    # Each slice's largest entry lands on e4m3's top.
    assert float(x8.float().abs().amax()) == 448.0


def test_quantize_packed_sequences_match_the_padded_ones():
    g = torch.Generator().manual_seed(1)
    lens = [5, 0, 12]
    h, d = 4, 32
    seqs = [torch.randn(n, h, d, generator=g) * (i + 1) for i, n in enumerate(lens)]
    packed = torch.cat(seqs)
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    x8, descale = fp8.quantize(packed, 2, cu_seqlens=cu)
    assert descale.shape == (3, 2) and bool((descale[1] == 1).all())  # the empty sequence
    for i, (seq, start) in enumerate(zip(seqs, (0, 5, 5))):
        if seq.shape[0] == 0:
            continue
        one8, one_descale = fp8.quantize(seq[None], 2)
        torch.testing.assert_close(descale[i], one_descale[0])
        assert torch.equal(x8[start:start + seq.shape[0]].view(torch.uint8), one8[0].view(torch.uint8))


def test_quantize_non_finite_slices_give_nan_not_finite_values():
    x = torch.ones(2, 4, 2, 8)
    x[0, 1, 1, 3] = float("inf")
    x[1, 2, 0, 0] = float("nan")
    x8, descale = fp8.quantize(x)
    assert torch.isnan(descale[0, 1]) and torch.isnan(descale[1, 0])
    assert torch.isfinite(descale[0, 0]) and torch.isfinite(descale[1, 1])
    assert bool(torch.isnan(x8[0, :, 1].float()).all()) and bool(torch.isnan(x8[1, :, 0].float()).all())
    assert bool((x8[0, :, 0].float() == 448).all())


def test_quantize_qkv_with_hadamard_computes_the_same_attention():
    """Q K^T = (Q R)(K R)^T: the FP8 attention of the rotated, quantised inputs matches the float64 attention of
    the originals within FP8's error, and equals the attention of its own dequantised inputs."""
    g = torch.Generator().manual_seed(2)
    b, s, hq, hkv, d = 2, 96, 4, 2, 64
    q, k, v = (torch.randn(b, s, h, d, generator=g) for h in (hq, hkv, hkv))
    ref, _ = attention_ref(q, k, v, causal=True)
    x = fp8.quantize_qkv(q, k, v, hadamard=True, seed=5)
    assert x.rotation is not None and x.q_descale.shape == (b, hkv)
    out, lse = flashattn.fp8_attention(x.q, x.k, x.v, causal=True, **x.descales)
    assert rel_rmse(out, ref) < 6e-2
    deq = [dequantised_fp8(t, ds, gr) for t, ds, gr in ((x.q, x.q_descale, hq // hkv), (x.k, x.k_descale, 1),
                                                         (x.v, x.v_descale, 1))]
    exact, exact_lse = attention_ref(*deq, causal=True)
    torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), exact_lse, atol=1e-4, rtol=1e-5)
    # The rotation is what the module says it is.
    torch.testing.assert_close(deq[0].float(), (q @ x.rotation), atol=0.2, rtol=2 ** -4)


def test_hadamard_cuts_the_error_on_outliers_and_keeps_it_on_normal_inputs():
    """The measurement behind the flag (bench/results/fp8.md), as a check: on the FA3 paper's outlier
    distribution the rotated inputs' error is clearly lower; on N(0, 1) inputs it is the same."""
    g = torch.Generator().manual_seed(4)
    b, s, h, d = 1, 512, 2, 128
    errors = {}
    for dist in ("normal", "outliers"):
        q, k, v = (outliers((b, s, h, d), g) if dist == "outliers" else torch.randn(b, s, h, d, generator=g)
                   for _ in range(3))
        ref, _ = attention_ref(q, k, v)
        for hadamard in (False, True):
            x = fp8.quantize_qkv(q, k, v, hadamard=hadamard)
            out, _ = flashattn.fp8_attention(x.q, x.k, x.v, out_dtype=torch.float16, **x.descales)
            errors[dist, hadamard] = rel_rmse(out, ref)
    assert errors["outliers", True] < 0.8 * errors["outliers", False], errors
    assert errors["normal", True] < 1.1 * errors["normal", False], errors
    assert max(errors.values()) < 0.1, errors


def test_rotate_back_gives_the_gradients_of_the_inputs():
    g = torch.Generator().manual_seed(6)
    b, s, h, d = 1, 64, 2, 64
    q, k, v, dout = (torch.randn(b, s, h, d, generator=g) for _ in range(4))
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_ref(qr, kr, vr)
    ref.backward(dout.double())
    x = fp8.quantize_qkv(q, k, v, hadamard=True)
    do8, do_descale = fp8.quantize(dout, h)
    out, lse = flashattn.fp8_attention(x.q, x.k, x.v, **x.descales)
    dq, dk, dv = flashattn.fp8_attention_backward(do8, x.q, x.k, x.v, out, lse, do_descale=do_descale,
                                                  **x.descales)
    for got, want in ((x.rotate_back(dq), qr.grad), (x.rotate_back(dk), kr.grad), (dv, vr.grad)):
        assert got.dtype == torch.bfloat16
        assert rel_rmse(got, want) < 0.1
    plain = fp8.quantize_qkv(q, k, v)
    assert plain.rotation is None and plain.rotate_back(dq) is dq


def test_bad_arguments_name_the_argument():
    q = torch.randn(1, 4, 4, 16)
    k = torch.randn(1, 4, 2, 16)
    with pytest.raises(TypeError, match=r"^hadamard: expected a bool"):
        fp8.quantize_qkv(q, k, k, hadamard=1)
    with pytest.raises(TypeError, match=r"^q: expected float16, bfloat16, float32 or float64"):
        fp8.quantize_qkv(q.to(torch.int32), k, k)
    with pytest.raises(TypeError, match=r"^v: expected a torch.Tensor"):
        fp8.quantize_qkv(q, k, None)
    with pytest.raises(ValueError, match=r"^k: head dim 8 differs from q's 16"):
        fp8.quantize_qkv(q, k[..., :8], k[..., :8])
    with pytest.raises(ValueError, match=r"^k: its 3 heads must divide q's 4"):
        fp8.quantize_qkv(q, torch.randn(1, 4, 3, 16), torch.randn(1, 4, 3, 16))
    with pytest.raises(ValueError, match=r"^k: batch 2 differs from q's 1"):
        fp8.quantize_qkv(q, torch.randn(2, 4, 2, 16), torch.randn(2, 4, 2, 16))
    with pytest.raises(ValueError, match=r"^q: expected rank 4"):
        fp8.quantize_qkv(q[0], k, k)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q, cu_seqlens_k: give both"):
        fp8.quantize_qkv(q, k, k, cu_seqlens_q=torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^heads_kv: expected a positive int dividing x's 4 heads"):
        fp8.quantize(q, 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected an int32 tensor"):
        fp8.quantize(q[0], cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"^rotation: expected a \(16, 16\) tensor"):
        fp8.quantize(q, rotation=torch.eye(8))
    with pytest.raises(ValueError, match=r"^head_dim: expected a positive int"):
        fp8.hadamard_rotation(0)
    with pytest.raises(TypeError, match=r"^seed: expected an int"):
        fp8.hadamard_rotation(8, seed=1.5)


def test_quantize_does_not_track_gradients():
    q = torch.randn(1, 4, 2, 16, requires_grad=True)
    x = fp8.quantize_qkv(q, q, q, hadamard=True)
    assert not any(t.requires_grad for t in (x.q, x.k, x.v, x.q_descale))


@pytest.mark.cuda
@requires_cuda
def test_quantize_on_cuda_matches_cpu():
    g = torch.Generator().manual_seed(8)
    q, k, v = (outliers((2, 40, h, 128), g) for h in (8, 2, 2))
    cu = torch.tensor([0, 30, 80], dtype=torch.int32)
    for kwargs in ({}, {"cu_seqlens_q": cu, "cu_seqlens_k": cu}):
        args = [t.flatten(0, 1) if kwargs else t for t in (q, k, v)]
        cpu = fp8.quantize_qkv(*args, hadamard=True, **kwargs)
        dev = fp8.quantize_qkv(*(t.cuda() for t in args), hadamard=True,
                               **{n: t.cuda() for n, t in kwargs.items()})
        for a, b in zip(cpu[:6], dev[:6]):
            assert b.device.type == "cuda"
            if a.dtype == F8:  # the fp32 rotation may round differently on the GPU: one e4m3 step at most
                torch.testing.assert_close(b.cpu().float(), a.float(), atol=2 ** -6, rtol=2 ** -3)
            else:
                torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=0)
