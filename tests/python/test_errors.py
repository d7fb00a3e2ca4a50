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
    (lambda q, k, v: (q, k, v.repeat(1, 1, 1, 65)), ValueError, r"^v: head dim must be in \[1, 512\]"),
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
    ({"dropout_p": -0.1}, ValueError, "dropout_p"),
    ({"dropout_p": 1.5}, ValueError, "dropout_p"),
    ({"alibi_slopes": torch.ones(3)}, ValueError, "^alibi_slopes: expected shape"),
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
    # with block_table, k and v are paged caches (test_kvcache.py covers that path)
    with pytest.raises(ValueError, match=r"^k: expected a rank-4 paged cache \[num_pages, page_size"):
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


def _hd0(b=1, s=4, h=2):
    return torch.randn(b, s, h, 0)


CU = torch.tensor([0, 4], dtype=torch.int32)
HEAD_DIM_0_CALLS = {
    "flash_attn_func": lambda: flash_attn_func(_hd0(), _hd0(), _hd0()),
    "flash_attn_qkvpacked_func": lambda: flashattn.flash_attn_qkvpacked_func(torch.randn(1, 4, 3, 2, 0)),
    "flash_attn_kvpacked_func": lambda: flashattn.flash_attn_kvpacked_func(_hd0(), torch.randn(1, 4, 2, 2, 0)),
    "flash_attn_varlen_func": lambda: flash_attn_varlen_func(_hd0()[0], _hd0()[0], _hd0()[0], CU, CU, 4, 4),
    "flash_attn_varlen_qkvpacked_func": lambda: flashattn.flash_attn_varlen_qkvpacked_func(
        torch.randn(4, 3, 2, 0), CU, 4),
    "flash_attn_varlen_kvpacked_func": lambda: flashattn.flash_attn_varlen_kvpacked_func(
        _hd0()[0], torch.randn(4, 2, 2, 0), CU, CU, 4, 4),
    "attention": lambda: flashattn.attention(_hd0(), _hd0(), _hd0()),
    "choose_backend": lambda: flashattn.choose_backend(_hd0(), _hd0(), _hd0()),
    "scaled_dot_product_attention": lambda: flashattn.scaled_dot_product_attention(_hd0(), _hd0(), _hd0()),
}


@pytest.mark.parametrize("name", HEAD_DIM_0_CALLS)
def test_head_dim_zero_names_the_tensor(name):
    """A head dim of 0 with the default scale: a ValueError naming the tensor, not a ZeroDivisionError from
    1/sqrt(0)."""
    with pytest.raises(ValueError, match=r"^(q|query): head dim must be >= 1, got 0"):
        HEAD_DIM_0_CALLS[name]()


@pytest.mark.parametrize("kwargs,exc,pattern", [
    ({"softmax_scale": "0.5"}, TypeError, "^softmax_scale: expected a number"),
    ({"softmax_scale": 1e39}, ValueError, "^softmax_scale: must be finite"),   # inf once carried as float32
    ({"softcap": None}, TypeError, "^softcap: expected a number"),
    ({"softcap": float("nan")}, ValueError, "^softcap"),                        # was silently "off"
    ({"softcap": 1e39}, ValueError, "^softcap"),                                # was NaN output
    ({"dropout_p": float("nan")}, ValueError, "^dropout_p"),                    # was silently 0
    ({"dropout_p": "0"}, TypeError, "^dropout_p: expected a number"),
    ({"window_size": (None, 0)}, TypeError, "^window_size: expected a pair of integers"),
    ({"window_size": (1.5, 0)}, TypeError, "^window_size: expected a pair of integers"),  # was truncated to 1
    ({"window_size": (1, 2, 3)}, ValueError, "^window_size: expected a pair"),
    ({"causal": "no"}, TypeError, "^causal: expected a bool"),                  # was True
    ({"causal": None}, TypeError, "^causal: expected a bool"),
    ({"deterministic": "yes"}, TypeError, "^deterministic: expected a bool"),
    ({"return_attn_probs": "no"}, TypeError, "^return_attn_probs: expected a bool"),
    ({"num_threads": None}, TypeError, "^num_threads: expected an integer"),
    ({"num_threads": 2.0}, TypeError, "^num_threads: expected an integer"),
    ({"num_threads": 2**40}, ValueError, r"^num_threads: must be in \[0, 2147483647\]"),
    ({"backend": None}, ValueError, "^backend: unknown name 'None'"),
], ids=lambda x: repr(x) if isinstance(x, dict) else "")
def test_bad_option_types_name_the_option(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        flash_attn_func(*qkv(), **kwargs)


def test_varlen_and_sdpa_option_types_name_the_option():
    q = torch.randn(4, 2, 8)
    with pytest.raises(TypeError, match="^max_seqlen_q: expected an integer"):
        flash_attn_varlen_func(q, q, q, CU, CU, None, 4)
    with pytest.raises(TypeError, match="^max_seqlen_k: expected an integer"):
        flash_attn_varlen_func(q, q, q, CU, CU, 4, 4.0)
    with pytest.raises(ValueError, match="^max_seqlen_q: must be >= 0"):
        flash_attn_varlen_func(q, q, q, CU, CU, -1, 4)
    x = torch.randn(1, 2, 4, 8)
    sdpa = flashattn.scaled_dot_product_attention
    with pytest.raises(TypeError, match="^scale: expected a number"):
        sdpa(x, x, x, scale="0.1")
    with pytest.raises(NotImplementedError, match="^scale: only positive"):
        sdpa(x, x, x, scale=-0.1)
    with pytest.raises(TypeError, match="^is_causal: expected a bool"):
        sdpa(x, x, x, is_causal=None)
    with pytest.raises(TypeError, match="^enable_gqa: expected a bool"):
        sdpa(x, x, x, enable_gqa="no")
    with pytest.raises(ValueError, match="^dropout_p"):
        sdpa(x, x, x, dropout_p=float("nan"))
    with pytest.raises(ValueError, match="^window_left: must be >= -1"):
        flashattn.attention(x, x, x, window_left=-2)
    with pytest.raises(ValueError, match="^softcap"):
        flashattn.attention(x, x, x, softcap=-1.0)  # the library's own API: 0 = off, negative is an error
    with pytest.raises(TypeError, match="^backward: expected a bool"):
        flashattn.choose_backend(x, x, x, backward="yes")


def test_flags_accept_bool_like_values():
    q, k, v = qkv()
    base = flash_attn_func(q, k, v, causal=True, backend="cpu_reference")
    np = pytest.importorskip("numpy")
    for flag in (1, np.True_):
        torch.testing.assert_close(flash_attn_func(q, k, v, causal=flag, backend="cpu_reference"), base,
                                   rtol=0, atol=0)


def test_windows_beyond_every_sequence_are_unbounded():
    """sys.maxsize (or more) as a window edge means unbounded: the same result as -1 (near 2^63 the native
    edge arithmetic once overflowed and returned zeros; past 2^63 the library cannot take the edge at all)."""
    import sys
    for sq, sk in ((5, 5), (2, 5), (5, 2)):
        q, k, v = qkv(sq=sq, sk=sk)
        for backend in ("cpu_reference", "auto"):
            base = flash_attn_func(q, k, v, window_size=(-1, 0), backend=backend)
            for big in (2**40, sys.maxsize, 2**70):
                torch.testing.assert_close(flash_attn_func(q, k, v, window_size=(big, 0), backend=backend), base,
                                           rtol=0, atol=0, msg=f"{backend} s_q={sq} s_k={sk} window {big}")
            full = flash_attn_func(q, k, v, backend=backend)
            torch.testing.assert_close(flash_attn_func(q, k, v, window_size=(sys.maxsize, sys.maxsize),
                                                       backend=backend), full, rtol=0, atol=0)
