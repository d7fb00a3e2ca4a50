"""Every argument of the flash_attn API non-default somewhere, against the float64 pure-torch reference
(fa_reference.py, which shares no code with the kernels): the packed forms with window, softcap and scale, forward
and gradients; the varlen functions' softmax_scale, deterministic and num_threads; flash_attn_func's
deterministic and num_threads; SDPA's scale with its top-left causal mask."""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import cpu_backends
from fa_reference import assert_close, attention_ref, varlen_ref
from test_attention import Case, check_against_reference, make_inputs
from test_sdpa import compare as compare_sdpa
from test_varlen import VARLEN_CASES, cu, run_case

# (causal, window_size, softcap, softmax_scale): every option of the packed forms away from its default. The
# scales keep the logits moderate (|scale * q.k| up to ~10 at d = 16): the flash backward recomputes P from the
# stored fp32 lse, so its fp32 gradient error grows with the logits' size (about 4x the same-dtype math's at
# logits ~30), beyond assert_close's 2x bound, while no bug is involved.
PACKED_OPTIONS = [
    (False, (3, 1), 0.0, 0.3),
    (True, (-1, -1), 2.5, 0.6),
    (True, (4, -1), 4.0, None),
    (False, (-1, -1), 0.0, 0.45),
]


def _option_id(o):
    causal, window, softcap, scale = o
    return f"causal{int(causal)}_win{window[0]},{window[1]}_cap{softcap:g}_scale{scale}"


def _packed_reference(fn_ref, packed_inputs, dout, dtype, **kwargs):
    """Runs fn_ref on float64 copies (the oracle) and on same-dtype copies of the packed inputs; returns
    {float64: (out, lse, grads...), None: (...)} with the gradients of the packed inputs."""
    results = {}
    for ref_dtype in (torch.float64, None):
        leaves = [t.detach().to(ref_dtype or dtype).requires_grad_() for t in packed_inputs]
        out, lse = fn_ref(*leaves, dtype=ref_dtype, **kwargs)
        out.backward(dout.to(out.dtype))
        results[ref_dtype] = (out, lse) + tuple(t.grad for t in leaves)
    return results


def _packed_grid(test):
    """The packed forms' grid: every backend, the option combinations, fp32 and bf16."""
    for mark in (pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str),
                 pytest.mark.parametrize("options", PACKED_OPTIONS, ids=_option_id),
                 pytest.mark.parametrize("backend", cpu_backends())):
        test = mark(test)
    return test


def _packed_kwargs(options):
    """(the packed function's keyword arguments, the reference's) for one option combination."""
    causal, window, softcap, scale = options
    return (dict(softmax_scale=scale, causal=causal, window_size=window, softcap=softcap),
            dict(causal=causal, window=window, softcap=softcap, scale=scale))


def _compare(names, ours, refs, dtype):
    for name, o, r64, low in zip(names, ours, refs[torch.float64], refs[None]):
        assert_close(name, o, r64, low, torch.float32 if name == "lse" and dtype == torch.float64 else dtype)


@_packed_grid
def test_qkvpacked_and_kvpacked(options, dtype, backend, device="cpu"):
    kw, ref_kw = _packed_kwargs(options)
    b, s, h, d = 2, 11, 4, 16

    qkv = torch.randn(b, s, 3, h, d, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(b, s, h, d, dtype=dtype, device=device)
    out, lse, _ = flashattn.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, backend=backend, **kw)
    out.backward(dout)
    refs = _packed_reference(lambda p, **k: attention_ref(*p.unbind(2), **k), [qkv], dout, dtype, **ref_kw)
    _compare(("out", "lse", "dqkv"), (out, lse, qkv.grad), refs, dtype)

    # kvpacked: GQA (4 query heads on 2), s_q < s_k, d_v = d (packed k and v share a head dim)
    q = torch.randn(b, s - 4, h, d, dtype=dtype, device=device, requires_grad=True)
    kv = torch.randn(b, s, 2, h // 2, d, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(b, s - 4, h, d, dtype=dtype, device=device)
    out, lse, _ = flashattn.flash_attn_kvpacked_func(q, kv, return_attn_probs=True, backend=backend, **kw)
    out.backward(dout)
    refs = _packed_reference(lambda q_, kv_, **k: attention_ref(q_, *kv_.unbind(2), **k), [q, kv], dout, dtype,
                             **ref_kw)
    _compare(("out", "lse", "dq", "dkv"), (out, lse, q.grad, kv.grad), refs, dtype)


@_packed_grid
def test_varlen_qkvpacked_and_kvpacked(options, dtype, backend, device="cpu"):
    kw, ref_kw = _packed_kwargs(options)
    h, d = 4, 16

    lengths = [5, 0, 12, 1]
    cu_seqlens = cu(lengths).to(device)
    total = int(cu_seqlens[-1])
    qkv = torch.randn(total, 3, h, d, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(total, h, d, dtype=dtype, device=device)
    out, lse, _ = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max(lengths), return_attn_probs=True,
                                                             backend=backend, **kw)
    out.backward(dout)
    cl = cu_seqlens.tolist()
    refs = _packed_reference(lambda p, **k: varlen_ref(*p.unbind(1), cl, cl, **k), [qkv], dout, dtype, **ref_kw)
    _compare(("out", "lse", "dqkv"), (out, lse, qkv.grad), refs, dtype)

    # kvpacked: GQA, per-sequence s_q != s_k (both ways), an empty key sequence
    lengths_q, lengths_k = [3, 7, 2], [6, 0, 9]
    cu_q, cu_k = cu(lengths_q).to(device), cu(lengths_k).to(device)
    q = torch.randn(int(cu_q[-1]), h, d, dtype=dtype, device=device, requires_grad=True)
    kv = torch.randn(int(cu_k[-1]), 2, 1, d, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(int(cu_q[-1]), h, d, dtype=dtype, device=device)
    out, lse, _ = flashattn.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                            return_attn_probs=True, backend=backend, **kw)
    out.backward(dout)
    clq, clk = cu_q.tolist(), cu_k.tolist()
    refs = _packed_reference(lambda q_, kv_, **k: varlen_ref(q_, *kv_.unbind(1), clq, clk, **k), [q, kv], dout,
                             dtype, **ref_kw)
    _compare(("out", "lse", "dq", "dkv"), (out, lse, q.grad, kv.grad), refs, dtype)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("extra", [
    {"softmax_scale": 0.3},
    {"softmax_scale": 0.6, "deterministic": True},
    {"deterministic": True, "num_threads": 1},
    {"num_threads": 2, "softmax_scale": 0.05},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("case", [VARLEN_CASES[1], VARLEN_CASES[3]], ids=["gqa_empty_seq", "softcap"])
def test_varlen_scale_deterministic_threads(case, extra, backend):
    run_case(*case, dtype=torch.float32, backend=backend, **extra)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("extra", [
    {"deterministic": True, "num_threads": 1, "softmax_scale": 0.2},
    {"deterministic": True, "num_threads": 3},
    {"num_threads": 1},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_flash_attn_func_deterministic_threads(extra, backend):
    c = Case(2, 70, 90, 4, 2, 16, 16, causal=True, window=(40, -1), softcap=3.0)  # two key blocks and more
    check_against_reference(c, torch.float32, backend, *make_inputs(c, torch.float32), **extra)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("seq_q,seq_k", [(9, 4), (4, 9), (6, 6)])
def test_sdpa_scale_with_causal(seq_q, seq_k, backend):
    compare_sdpa((2, 3, seq_q, 16), (2, 3, seq_k, 16), (2, 3, seq_k, 8), backend, is_causal=True, scale=0.9)
