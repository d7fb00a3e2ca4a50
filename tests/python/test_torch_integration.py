"""The torch.library integration: gradcheck in float64, opcheck of both operators, torch.compile(fullgraph=True)
of a small attention block (forward and backward, no graph break)."""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import cpu_backends
from flashattn._ops import op_options

OPS = torch.ops.flashattn


def fwd_args(q, k, v, cu_q=None, cu_k=None, max_q=0, max_k=0, scale=0.3, causal=False, wl=-1, wr=-1, softcap=0.0,
             deterministic=False, backend="cpu_reference", num_threads=0, alibi=None, dropout_p=0.0, rng=None):
    ints, floats = op_options(max_q, max_k, scale, causal, wl, wr, softcap, deterministic, num_threads, dropout_p)
    return (q, k, v, cu_q, cu_k, alibi, rng, ints, floats, backend)


def bwd_args(dout, out, lse, fwd):
    """attention_backward's arguments for a forward called with `fwd` (fwd_args) that returned out, lse."""
    q, k, v, cu_q, cu_k, alibi, rng, ints, floats, backend = fwd
    return (dout, q, k, v, out, lse, cu_q, cu_k, alibi, rng, ints, floats, backend)


# ---- gradcheck -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("kwargs", [
    {},
    {"causal": True},
    {"causal": True, "softcap": 1.5},
    {"window_size": (1, 0)},
], ids=["plain", "causal", "causal_softcap", "window"])
def test_gradcheck(kwargs, backend):
    q = torch.randn(1, 4, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 5, 1, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 1, 2, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, backend=backend, **kwargs)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", cpu_backends())
def test_gradcheck_varlen(backend):
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    q = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, causal=True,  # noqa: E731
                                                          backend=backend)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_sdpa_top_left_causal():
    q = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                                backend="cpu_reference")
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_lse_is_not_differentiable():
    q = torch.randn(1, 3, 1, 4, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True, backend="cpu_reference")
    assert out.requires_grad and not lse.requires_grad


# ---- opcheck -------------------------------------------------------------------------------------------------------


def opcheck_cases(device="cpu", dtype=torch.float32, head_dim=8, backend="cpu_reference"):
    d = head_dim

    def t(*shape, grad=True):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)

    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=device)
    return [
        fwd_args(t(2, 5, 4, d), t(2, 7, 2, d), t(2, 7, 2, d // 2), causal=True, backend=backend),
        fwd_args(t(1, 6, 2, 2 * d), t(1, 6, 2, 2 * d), t(1, 6, 2, 2 * d), wl=2, wr=1, softcap=2.0, backend=backend),
        fwd_args(t(7, 2, d), t(7, 2, d), t(7, 2, d), cu, cu, 4, 4, causal=True, backend=backend),
        fwd_args(t(2, 5, 4, d, grad=False), t(2, 7, 2, d, grad=False), t(2, 7, 2, d, grad=False), backend=backend),
        fwd_args(t(2, 5, 4, d), t(2, 7, 2, d), t(2, 7, 2, d), causal=True, backend=backend,
                 alibi=torch.rand(2, 4, device=device) * 0.5),
        # Dropout keyed by a generator-state tensor (the CUDA-graph-safe form).
        fwd_args(t(2, 5, 4, d), t(2, 7, 2, d), t(2, 7, 2, d), backend=backend, dropout_p=0.3,
                 rng=torch.tensor([12345, 8], dtype=torch.int64, device=device)),
    ]


@pytest.mark.parametrize("case", range(6))
def test_opcheck_forward(case):
    args = opcheck_cases()[case]
    torch.library.opcheck(OPS.attention_forward.default, args)


def test_opcheck_backward():
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 7, 2, 8), torch.randn(2, 7, 2, 8)
    fwd = fwd_args(q, k, v, causal=True)
    out, lse = OPS.attention_forward(*fwd)
    torch.library.opcheck(OPS.attention_backward.default, bwd_args(torch.randn_like(out), out, lse, fwd))


# ---- torch.compile -------------------------------------------------------------------------------------------------


class AttentionBlock(torch.nn.Module):
    """Pre-norm self-attention with GQA, the shape people compile."""

    def __init__(self, dim=32, heads=4, kv_heads=2, backend="auto"):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.backend = heads, kv_heads, dim // heads, backend
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.norm(x))
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim)
        k = k.view(b, s, self.kv_heads, self.head_dim)
        v = v.view(b, s, self.kv_heads, self.head_dim)
        o = flashattn.flash_attn_func(q, k, v, causal=True, backend=self.backend)
        return x + self.proj(o.reshape(b, s, -1))


@pytest.mark.parametrize("backend", cpu_backends())
def test_compile_fullgraph_forward_backward(backend):
    torch._dynamo.reset()
    block = AttentionBlock(backend=backend)
    x = torch.randn(2, 9, 32, requires_grad=True)
    eager_out = block(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), [x] + list(block.parameters()))

    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), [x] + list(block.parameters()))
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_compile_sdpa_and_varlen_without_graph_breaks():
    torch._dynamo.reset()

    def f(q, k, v, cu):
        a = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, backend="cpu_reference")
        b = flashattn.flash_attn_varlen_func(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu,
                                             cu, 4, 4, causal=True, backend="cpu_reference")
        return a.sum() + b.sum()

    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    explanation = torch._dynamo.explain(f)(q, k, v, cu)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v, cu)
    out.backward()
    torch.testing.assert_close(out, f(q, k, v, cu))


# ---- eager calls without the dispatcher --------------------------------------------------------------------------
# Eager calls on plain tensors skip torch's operator dispatch (flashattn._ops._dispatch_free); anything that has to
# see the operators (modes, tracing, torch.compile) must still see them.


def _calls_through_ops(fn):
    """The flashattn operators that dispatch while fn runs (through a dispatch mode of our own)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "flashattn":
                seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def test_direct_eager_forward_backward_matches_the_operators():
    from flashattn import _ops

    q, k, v = (torch.randn(2, 5, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 5, 2, 8, dtype=torch.float64)
    assert _ops._dispatch_free(q, k, v)
    results = []
    for direct in (True, False):
        if not direct:
            saved, _ops._dispatch_free = _ops._dispatch_free, lambda *a: False
        try:
            out = flashattn.flash_attn_func(q, k, v, causal=True, backend="cpu_reference")
            assert out.requires_grad and out.grad_fn is not None
            results.append((out.detach(), *torch.autograd.grad(out, (q, k, v), dout)))
        finally:
            if not direct:
                _ops._dispatch_free = saved
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Without grad the direct forward records nothing.
    with torch.no_grad():
        assert flashattn.flash_attn_func(q, k, v, backend="cpu_reference").grad_fn is None


def test_direct_eager_gradcheck():
    q, k, v = (torch.randn(1, 4, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, backend="cpu_reference")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_direct_eager_double_backward_raises():
    q, k, v = (torch.randn(1, 4, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, backend="cpu_reference")
    (dq,) = torch.autograd.grad(out.sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        dq.sum().backward()


def test_modes_still_see_the_operators():
    q, k, v = (torch.randn(1, 4, 2, 8) for _ in range(3))
    seen = _calls_through_ops(lambda: flashattn.flash_attn_func(q, k, v, backend="cpu_reference"))
    assert "attention_forward" in seen
    kc, vc = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    seen = _calls_through_ops(lambda: flashattn.flash_attn_with_kvcache(q[:, :1], kc, vc, k=k[:, :1], v=v[:, :1],
                                                                          cache_seqlens=3))
    assert "attention_with_kvcache" in seen
    # FakeTensorMode: shapes only, from the operators' fake implementations.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out = flashattn.flash_attn_func(fq, fk, fv, backend="cpu_reference")
        assert out.shape == q.shape and type(out).__name__ == "FakeTensor"


def test_direct_kvcache_append_moves_the_caches_version():
    kc, vc = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    q, k, v = (torch.randn(1, 1, 2, 8) for _ in range(3))
    versions = kc._version, vc._version
    out = flashattn.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=3, backend="cpu_reference")
    assert kc._version > versions[0] and vc._version > versions[1]
    torch.testing.assert_close(kc[:, 3], k[:, 0], rtol=0, atol=0)
    assert out.shape == q.shape and not out.requires_grad
    # Inference tensors have no version counter: the direct path must not trip over that.
    with torch.inference_mode():
        kc2, vc2 = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
        flashattn.flash_attn_with_kvcache(q, kc2, vc2, k=k, v=v, cache_seqlens=3, backend="cpu_reference")
    torch.testing.assert_close(vc2[:, 3], v[:, 0], rtol=0, atol=0)
