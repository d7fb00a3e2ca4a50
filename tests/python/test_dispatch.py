"""The automatic path runs every supported shape (a shape it declines fails here, it never turns tests into
skips), and choose_backend's answer with varlen, window, softcap and scale arguments is the backend that runs."""

from __future__ import annotations

from typing import List

import pytest
import torch

import flashattn
from flashattn import _C
from flashattn._ops import _dl, _stream
from conftest import _backend_problem

CPU_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
PROBE_HEAD_DIMS = (1, 3, 64, 256)  # the smallest, an odd one, a common one, the largest


def supported_shape_problems(device: str, dtype: torch.dtype, head_dims=PROBE_HEAD_DIMS) -> List[str]:
    """Runs the automatic path forward and backward (deterministic too) on small padded and varlen calls with GQA,
    a causal window and softcap at each head dim; returns what failed, each naming its shape (empty: all ran)."""
    problems = []
    cu = torch.tensor([0, 3, 10], dtype=torch.int32, device=device)
    for d in head_dims:
        for varlen in (False, True):
            shape_q, shape_kv = ((10, 4, d), (10, 2, d)) if varlen else ((2, 9, 4, d), (2, 11, 2, d))
            q, k, v = (torch.randn(s, dtype=dtype, device=device, requires_grad=True)
                       for s in (shape_q, shape_kv, shape_kv))
            extra = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7, max_seqlen_k=7) if varlen else {}
            label = f"{dtype} {'varlen' if varlen else 'padded'} d={d}"
            for deterministic in (False, True):
                try:
                    for backward in (False, True):
                        c = flashattn.choose_backend(q, k, v, causal=True, window_left=4, softcap=3.0,
                                                     backward=backward, deterministic=deterministic, **extra)
                        if not c.supported:
                            problems.append(f"{label} backward={backward} deterministic={deterministic}: "
                                            f"choose_backend says {c}")
                    out, _ = flashattn.attention(q, k, v, causal=True, window_left=4, softcap=3.0,
                                                 deterministic=deterministic, **extra)
                    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
                    if not all(torch.isfinite(t).all() for t in (out,) + grads):
                        problems.append(f"{label} deterministic={deterministic}: non-finite result")
                except NotImplementedError as e:
                    problems.append(f"{label} deterministic={deterministic}: {e}")
    return problems


def test_automatic_cpu_path_probe():
    """The probe the suite used to skip on: the automatic CPU path must run it."""
    problem = _backend_problem("auto")
    assert problem is None, f"the automatic CPU path declined its probe shape: {problem}"


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_automatic_cpu_path_runs_every_supported_shape(dtype):
    problems = supported_shape_problems("cpu", dtype)
    assert not problems, "the automatic CPU path cannot run supported shapes:\n" + "\n".join(problems)


# ---- choose_backend's answer and reason, and that it is what runs ---------------------------------------------------


def varlen_problem(device="cpu", dtype=torch.float32):
    lengths_q, lengths_k = [5, 0, 9], [7, 3, 9]
    cu_q = torch.tensor([0, 5, 5, 14], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 7, 10, 19], dtype=torch.int32, device=device)
    q = torch.randn(14, 4, 64, dtype=dtype, device=device)
    k = torch.randn(19, 2, 64, dtype=dtype, device=device)
    v = torch.randn(19, 2, 64, dtype=dtype, device=device)
    return q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k)


OPTION_SETS = [
    dict(causal=True),
    dict(window_left=3, window_right=1),
    dict(window_left=2, causal=True, softcap=4.0),
    dict(softcap=2.5, softmax_scale=0.2),
]


def ran_backends(q, k, v, cu_q, cu_k, max_q, max_k, backend="auto", deterministic=False, **options):
    """The native forward and backward on these arguments; returns the names of the backends that ran."""
    options = dict(options)
    scale = options.pop("softmax_scale", 0.0)  # native: <= 0 means 1/sqrt(d)
    kw = dict(softmax_scale=scale, causal=options.get("causal", False), window_left=options.get("window_left", -1),
              window_right=options.get("window_right", -1), softcap=options.get("softcap", 0.0), backend=backend,
              stream=_stream(q))
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if cu_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    fwd = _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(cu_q), _dl(cu_k), max_q, max_k, **kw)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bwd = _C.backward(_dl(torch.ones_like(out)), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dq), _dl(dk),
                      _dl(dv), _dl(cu_q), _dl(cu_k), max_q, max_k, deterministic=deterministic, **kw)
    return fwd, bwd


def check_choice_is_what_runs(device, dtype, options, varlen, deterministic=False):
    """choose_backend (forward and backward) names the backend that the native calls then run; returns the
    forward's and the backward's choices."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_problem(device, dtype)
    if not varlen:
        q, k, v = q[:10].reshape(2, 5, 4, 64), k[:18].reshape(2, 9, 2, 64), v[:18].reshape(2, 9, 2, 64)
        cu_q = cu_k = None
        max_q = max_k = 0
    extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    fwd = flashattn.choose_backend(q, k, v, **extra, **options)
    bwd = flashattn.choose_backend(q, k, v, **extra, **options, backward=True, deterministic=deterministic)
    assert fwd.supported and bwd.supported, (fwd, bwd)
    ran = ran_backends(q, k, v, cu_q, cu_k, max_q, max_k, deterministic=deterministic, **options)
    assert ran == (fwd.backend, bwd.backend), f"choose_backend said {fwd.backend}/{bwd.backend}, ran {ran}"
    return fwd, bwd


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_choose_backend_cpu_with_varlen_window_softcap(options, varlen):
    for deterministic in (False, True):
        fwd, bwd = check_choice_is_what_runs("cpu", torch.float32, options, varlen, deterministic)
        for c in (fwd, bwd):
            assert c.backend == "cpu_flash" and "CPU" in c.reason, c


def test_choose_backend_forced_and_unsupported_with_varlen():
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_problem()
    extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, window_left=2,
                 softcap=1.5, softmax_scale=0.3)
    forced = flashattn.choose_backend(q, k, v, backend="cpu_reference", backward=True, **extra)
    assert forced == ("cpu_reference", True, "requested explicitly")
    assert ran_backends(q, k, v, cu_q, cu_k, max_q, max_k, backend="cpu_reference", window_left=2, softcap=1.5,
                        softmax_scale=0.3) == ("cpu_reference", "cpu_reference")
    for name in ("cuda_sm80", "cuda_sm90"):
        c = flashattn.choose_backend(q, k, v, backend=name, **extra)
        assert c.backend == name and not c.supported and "CPU" in c.reason, c
        with pytest.raises(NotImplementedError, match=name):
            ran_backends(q, k, v, cu_q, cu_k, max_q, max_k, backend=name)


def test_choose_backend_validates_like_the_forward():
    """Bad arguments raise the errors the forward raises, naming the argument; nothing is answered for them."""
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_problem()
    good = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    cases = [
        (dict(good, cu_seqlens_k=torch.tensor([0, 7, 10, 18], dtype=torch.int32)), ValueError, "^cu_seqlens_k"),
        (dict(good, cu_seqlens_k=None), ValueError, "^cu_seqlens_k"),
        (dict(good, max_seqlen_q=2), ValueError, "^max_seqlen_q"),
        (dict(good, window_left=-2), ValueError, "^window_left"),
        (dict(good, softcap=-1.0), ValueError, "^softcap"),
        (dict(good, softmax_scale=float("inf")), ValueError, "^softmax_scale"),
        (dict(good, backend="fastest"), ValueError, "^backend"),
    ]
    for kwargs, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            flashattn.choose_backend(q, k, v, **kwargs)
        if kwargs.get("cu_seqlens_k") is not None:  # the same call through the forward raises the same
            with pytest.raises(exc, match=pattern):
                flashattn.attention(q, k, v, **kwargs)


def test_value_head_dim_past_256_runs_on_the_cpu_and_cuda_says_why_not():
    """d_v up to 512 (FA3's MLA shape: d 64, d_v 512) runs on the CPU backends, forward and backward, against
    float64 attention; on CUDA (kernels up to 256) the forward runs in slices of V's columns (test_fa3.py checks
    its values) and the backward's automatic choice declines naming d_v."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 9, 4, 64, generator=g, dtype=torch.float64)
    k = torch.randn(2, 13, 2, 64, generator=g, dtype=torch.float64)
    v = torch.randn(2, 13, 2, 512, generator=g, dtype=torch.float64)
    dout = torch.randn(2, 9, 4, 512, generator=g, dtype=torch.float64)
    for backend in ("cpu_reference", "cpu_flash"):
        args = [t.float().requires_grad_() for t in (q, k, v)]
        out, _ = flashattn.attention(*args, causal=True, backend=backend)
        grads = torch.autograd.grad(out, args, dout.float())
        ref_args = [t.clone().requires_grad_() for t in (q, k, v)]
        kr, vr = (t.repeat_interleave(2, dim=2) for t in ref_args[1:])
        s = torch.einsum("bqhd,bkhd->bhqk", ref_args[0], kr) / 8.0
        s = s.masked_fill(~torch.ones(9, 13, dtype=torch.bool).tril(13 - 9), float("-inf"))
        ref = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vr)
        ref_grads = torch.autograd.grad(ref, ref_args, dout)
        for name, got, want in zip(("out", "dq", "dk", "dv"), (out,) + grads, (ref,) + ref_grads):
            err = float((got.detach().double() - want.detach()).norm() / want.detach().norm())
            assert got.shape == want.shape and err < 1e-5, f"{backend} {name}: relative error {err:.2e}"
    with pytest.raises(ValueError, match=r"^v: head dim must be in \[1, 512\], got 513"):
        flashattn.attention(q.float(), k.float(), torch.zeros(2, 13, 2, 513))
    if torch.cuda.is_available() and flashattn.built_with_cuda():
        qc, kc, vc = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
        c = flashattn.choose_backend(qc, kc, vc)
        assert c.supported and c.backend.startswith("cuda") and "d_v 512 as 2 forwards over slices" in c.reason, c
        c = flashattn.choose_backend(qc, kc, vc, backward=True)
        assert not c.supported and c.reason.startswith("v: head dim 512: the CUDA backward"), c
