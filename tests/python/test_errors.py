"""Bad input raises the right exception type, and the message names the argument. Nothing is silently ignored."""

from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import flash_attn_func, flash_attn_varlen_func


def qkv(b=1, sq=4, sk=5, hq=2, hkv=2, d=8, dv=8, dtype=torch.float32):
    return (torch.randn(b, sq, hq, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, dv, dtype=dtype))


@pytest.mark.parametrize("mutate,exc,pattern", [
    (lambda q, k, v: (q.to(torch.float16), k, v), TypeError, r"^k: dtype"),
    (lambda q, k, v: (q, k, v.double()), TypeError, r"^v: dtype"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, r"^q: dtype must be"),
    (lambda q, k, v: (q[0], k, v), ValueError, r"^q: expected a rank-4"),
    (lambda q, k, v: (q, k[:, :3], v), ValueError, r"^v: expected shape"),
    (lambda q, k, v: (q, k[..., :4], v), ValueError, r"^k: expected shape"),
    (lambda q, k, v: (q.repeat(1, 1, 3, 1)[:, :, :3], k, v), ValueError, r"^k: query heads \(3\) must be a multiple"),
    (lambda q, k, v: (q.repeat(1, 1, 1, 40), k.repeat(1, 1, 1, 40), v), ValueError, r"^q: head dim must be in"),
    (lambda q, k, v: (q, k, v.repeat(1, 1, 1, 40)), ValueError, r"^v: head dim must be in"),
    (lambda q, k, v: (q, k[:1].expand(2, -1, -1, -1), v), ValueError, r"^q: expected shape|^k: expected shape"),
], ids=["k_dtype", "v_dtype", "int", "rank", "v_seqlen", "k_dim", "heads", "head_dim", "head_dim_v", "batch"])
def test_bad_tensors(mutate, exc, pattern):
    with pytest.raises(exc, match=pattern):
        flash_attn_func(*mutate(*qkv()))


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="^q: expected a torch.Tensor"):
        flash_attn_func(q.numpy(), k, v)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    ({"dropout_p": 0.1}, NotImplementedError, "dropout_p"),
    ({"dropout_p": 1.5}, ValueError, "dropout_p"),
    ({"alibi_slopes": torch.ones(2)}, NotImplementedError, "alibi_slopes"),
    ({"window_size": 3}, ValueError, "window_size"),
    ({"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    ({"softmax_scale": -1.0}, NotImplementedError, "softmax_scale"),
    ({"softcap": float("inf")}, ValueError, "softcap"),
    ({"backend": "fastest"}, ValueError, "backend: unknown name 'fastest'"),
    ({"backend": "cuda_sm80"}, NotImplementedError, "cuda_sm80"),
    ({"num_threads": -2}, ValueError, "num_threads"),
], ids=["dropout", "dropout_range", "alibi", "window", "scale_nan", "scale_negative", "softcap", "backend",
        "backend_unsupported", "num_threads"])
def test_bad_options(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        flash_attn_func(*qkv(), **kwargs)


def test_varlen_errors():
    q, k, v = torch.randn(7, 2, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(TypeError, match="^cu_seqlens_q: dtype must be torch.int32"):
        flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, 4, 5)
    with pytest.raises(ValueError, match="^cu_seqlens_q: must be non-decreasing"):
        flash_attn_varlen_func(q, k, v, torch.tensor([0, 5, 4, 7], dtype=torch.int32),
                               torch.tensor([0, 4, 4, 9], dtype=torch.int32), 5, 5)
    with pytest.raises(ValueError, match="^cu_seqlens_k: last entry 8 does not match"):
        flash_attn_varlen_func(q, k, v, cu_q, torch.tensor([0, 4, 8], dtype=torch.int32), 4, 5)
    with pytest.raises(ValueError, match="^max_seqlen_q: 2 is smaller than the longest sequence"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 5)
    with pytest.raises(ValueError, match="^cu_seqlens_k: expected 3 entries"):
        flash_attn_varlen_func(q, k, v, cu_q, torch.tensor([0, 9], dtype=torch.int32), 4, 9)
    with pytest.raises(ValueError, match="^q: expected a rank-3"):
        flash_attn_varlen_func(q[None], k, v, cu_q, cu_k, 4, 5)
    with pytest.raises(NotImplementedError, match="block_table"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, block_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="^cu_seqlens_k: cu_seqlens_q and cu_seqlens_k must be given together"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q)


def test_packed_shape_errors():
    with pytest.raises(ValueError, match=r"^qkv: expected shape \[batch, seqlen, 3"):
        flashattn.flash_attn_qkvpacked_func(torch.randn(1, 4, 2, 2, 8))
    with pytest.raises(ValueError, match=r"^kv: expected shape \[total_k, 2"):
        flashattn.flash_attn_varlen_kvpacked_func(torch.randn(4, 2, 8), torch.randn(4, 3, 2, 8),
                                                  torch.tensor([0, 4], dtype=torch.int32),
                                                  torch.tensor([0, 4], dtype=torch.int32), 4, 4)


def test_failed_call_leaves_no_partial_state():
    """A rejected call raises before computing; the next good call is unaffected."""
    q, k, v = qkv()
    with pytest.raises(ValueError):
        flash_attn_func(q, k[:, :2], v)
    out = flash_attn_func(q, k, v, backend="cpu_reference")
    assert torch.isfinite(out).all()
