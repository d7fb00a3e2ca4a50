"""flashattn.merge_attention_states / merge_attention_states_: attention over two disjoint key sets from each one's
(out, lse), on the CPU and (when present) on CUDA, against float64 attention over the union and the float64 formula."""

from __future__ import annotations

import math

import pytest
import torch

import flashattn
from flashattn import merge_attention_states, merge_attention_states_
from conftest import CUDA_AVAILABLE, CUDA_SKIP_REASON

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA_AVAILABLE, reason=CUDA_SKIP_REASON or ""))]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def attention64(q, k, v, scale):
    """Float64 attention with its LSE: q [b, s, h, d], k / v [b, t, h, d] -> out [b, s, h, d_v], lse [b, h, s]."""
    s = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) * scale
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.einsum("bhst,bthd->bshd", p, v.double()), lse


def formula64(out_a, lse_a, out_b, lse_b):
    """The merge in float64, with a -inf side weighing 0 (its out not read)."""
    lse = torch.logaddexp(lse_a.double(), lse_b.double())
    finite = torch.isfinite(lse)

    def weighted(o, l):
        w = torch.where(finite, torch.exp(l.double() - lse), 0.0).transpose(-1, -2).unsqueeze(-1)
        return torch.where(w > 0, w * o.double(), 0.0)

    return weighted(out_a, lse_a) + weighted(out_b, lse_b), lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype_a", DTYPES)
@pytest.mark.parametrize("dtype_b", DTYPES)
def test_merging_two_key_sets_is_attention_over_their_union(device, dtype_a, dtype_b):
    b, s, h, d, dv, t1, t2 = 2, 37, 3, 16, 24, 29, 50
    q = torch.randn(b, s, h, d, device=device)
    k = torch.randn(b, t1 + t2, h, d, device=device) * 2
    v = torch.randn(b, t1 + t2, h, dv, device=device)
    scale = 1 / math.sqrt(d)
    out_a, lse_a = attention64(q, k[:, :t1], v[:, :t1], scale)
    out_b, lse_b = attention64(q, k[:, t1:], v[:, t1:], scale)
    want, want_lse = attention64(q, k, v, scale)
    out, lse = merge_attention_states(out_a.to(dtype_a), lse_a.float(), out_b.to(dtype_b), lse_b.float())
    assert out.dtype == dtype_a and lse.dtype == torch.float32 and out.shape == want.shape
    tol = max(TOLERANCE[dtype_a], TOLERANCE[dtype_b])
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim_v", [1, 3, 64, 130])
def test_varlen_layout_and_any_head_dim(device, head_dim_v):
    total, h = 45, 4
    out_a, out_b = (torch.randn(total, h, head_dim_v, device=device) for _ in range(2))
    lse_a, lse_b = (torch.randn(h, total, device=device) * 3 for _ in range(2))
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    want, want_lse = formula64(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_without_keys_and_nans(device):
    b, s, h, d = 1, 5, 2, 8
    out_a, out_b = torch.randn(b, s, h, d, device=device), torch.randn(b, s, h, d, device=device)
    lse_a, lse_b = torch.randn(b, h, s, device=device), torch.randn(b, h, s, device=device)
    inf = float("inf")
    lse_a[0, 0, 0] = -inf  # side a saw no key: b's row as it is; a's out (NaN here) is not read
    out_a[0, 0, 0] = float("nan")
    lse_b[0, 1, 1] = -inf  # side b saw no key
    lse_a[0, 0, 2] = lse_b[0, 0, 2] = -inf  # neither: out 0, lse -inf
    lse_a[0, 1, 3] = float("nan")  # a NaN LSE makes the row NaN
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out[0, 0, 0], out_b[0, 0, 0])
    assert lse[0, 0, 0] == lse_b[0, 0, 0]
    torch.testing.assert_close(out[0, 1, 1], out_a[0, 1, 1])
    assert lse[0, 1, 1] == lse_a[0, 1, 1]
    assert torch.equal(out[0, 2, 0], torch.zeros(d, device=device)) and lse[0, 0, 2] == -inf
    assert torch.isnan(out[0, 3, 1]).all() and torch.isnan(lse[0, 1, 3])
    keep = torch.ones(b, s, h, dtype=torch.bool, device=device)
    for i, j in ((0, 0), (1, 1), (2, 0), (3, 1)):
        keep[0, i, j] = False
    want, _ = formula64(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out.double()[keep], want[keep], atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype_b", [torch.float32, torch.bfloat16])
def test_in_place_accumulation_into_a_slice(device, dtype_b):
    """merge_attention_states_ into rows 3..11 of an accumulator (strided views), the ring's use; rows outside the
    slice are untouched, and accumulating two blocks equals attention over both."""
    b, s, h, d = 2, 16, 3, 32
    q = torch.randn(b, 8, h, d, device=device)
    k, v = torch.randn(b, 40, h, d, device=device), torch.randn(b, 40, h, d, device=device)
    acc = torch.randn(b, s, h, d, device=device)
    acc_lse = torch.randn(b, h, s, device=device)
    before, before_lse = acc.clone(), acc_lse.clone()
    rows = slice(3, 11)
    acc[:, rows] = 0
    acc_lse[..., rows] = float("-inf")
    for block in (slice(0, 25), slice(25, 40)):
        o, l = attention64(q, k[:, block], v[:, block], 1.0)
        merge_attention_states_(acc[:, rows], acc_lse[..., rows], o.to(dtype_b), l.float())
    want, want_lse = attention64(q, k, v, 1.0)
    tol = TOLERANCE[dtype_b]
    torch.testing.assert_close(acc[:, rows].double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(acc_lse[..., rows].double(), want_lse, atol=1e-5, rtol=1e-6)
    outside = torch.ones(s, dtype=torch.bool)
    outside[rows] = False
    assert torch.equal(acc[:, outside], before[:, outside])
    assert torch.equal(acc_lse[..., outside], before_lse[..., outside])


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_views_take_the_scalar_path(device):
    """An out_b whose rows start off the vector alignment (a view one column in) merges like its copy."""
    big = torch.randn(2, 6, 3, 33, device=device, dtype=torch.bfloat16)
    out_b = big[..., 1:]
    out_a = torch.randn(2, 6, 3, 32, device=device)
    lse_a, lse_b = torch.randn(2, 3, 6, device=device), torch.randn(2, 3, 6, device=device)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    want, _ = merge_attention_states(out_a, lse_a, out_b.contiguous(), lse_b)
    assert torch.equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_autograd_through_the_formula(device):
    b, s, h, d = 2, 7, 2, 12
    leaves = [torch.randn(b, s, h, d, device=device), torch.randn(b, h, s, device=device),
              torch.randn(b, s, h, d, device=device), torch.randn(b, h, s, device=device)]
    leaves[1][0, 0, 0] = float("-inf")
    mine = [t.clone().requires_grad_() for t in leaves]
    ref = [t.double().requires_grad_() for t in leaves]
    out, lse = merge_attention_states(*mine)
    lse_r = torch.logaddexp(ref[1], ref[3])
    out_r = sum(torch.exp(l - lse_r).transpose(-1, -2).unsqueeze(-1) * o for o, l in ((ref[0], ref[1]), (ref[2], ref[3])))
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    ((out_r * dout.double()).sum() + (lse_r * dlse.double()).sum()).backward()
    for m, r in zip(mine, ref):
        torch.testing.assert_close(m.grad.double(), torch.nan_to_num(r.grad, nan=0.0), atol=1e-5, rtol=1e-5)


def test_torch_compile_fullgraph():
    args = [torch.randn(1, 9, 2, 8), torch.randn(1, 2, 9), torch.randn(1, 9, 2, 8), torch.randn(1, 2, 9)]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(oa, la, ob, lb):
        out, lse = merge_attention_states(oa, la, ob, lb)
        return out * 2, lse

    out, lse = f(*args)
    want, want_lse = merge_attention_states(*args)
    assert torch.equal(out, want * 2) and torch.equal(lse, want_lse)


def test_bad_arguments_are_named():
    oa, la = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="out_b"):
        merge_attention_states(oa, la, torch.randn(1, 4, 2, 7), la)
    with pytest.raises(ValueError, match="lse_b"):
        merge_attention_states(oa, la, oa, torch.randn(1, 4, 2))
    with pytest.raises(TypeError, match="lse_a"):
        merge_attention_states(oa, la.double(), oa, la)
    with pytest.raises(TypeError, match="out_b"):
        merge_attention_states(oa, la, oa.double(), la)
    with pytest.raises(TypeError, match="out_a"):
        merge_attention_states([1.0], la, oa, la)
    with pytest.raises(ValueError, match="out_a"):
        merge_attention_states(torch.randn(4, 8), la, oa, la)
    acc = torch.randn(1, 5, 2, 8)
    with pytest.raises(ValueError, match="out: overlaps out_b"):  # an output sharing memory with an input, shifted
        flashattn._C.merge_attention_states(oa, la, acc[:, 1:], la, acc[:, :4], None)
    if CUDA_AVAILABLE:
        with pytest.raises(ValueError, match="out_b: on cpu but out_a is on cuda"):
            merge_attention_states(oa.cuda(), la.cuda(), oa, la.cuda())


def test_c_api_rejects_before_writing():
    out = torch.full((1, 4, 2, 8), 7.0)
    oa, la = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="lse: expected shape"):
        flashattn._C.merge_attention_states(oa, la, oa, la, out, torch.empty(1, 4, 2))
    assert (out == 7).all()
