"""Forward and backward of the flash_attn API against the float64 math reference: shapes, masks, softcap, GQA,
head dims, dtypes, non-contiguous inputs, packed layouts, options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import pytest
import torch

import flashattn
from conftest import cpu_backends
from fa_reference import assert_close, attention_ref


@dataclass(frozen=True)
class Case:
    batch: int
    seq_q: int
    seq_k: int
    heads_q: int
    heads_kv: int
    dim: int
    dim_v: int
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0

    def __str__(self):
        s = f"b{self.batch}_q{self.seq_q}_k{self.seq_k}_h{self.heads_q}x{self.heads_kv}_d{self.dim}x{self.dim_v}"
        s += "_causal" if self.causal else ""
        s += f"_win{self.window[0]},{self.window[1]}" if self.window != (-1, -1) else ""
        return s + (f"_cap{self.softcap:g}" if self.softcap else "")


CASES = [
    Case(1, 1, 1, 1, 1, 8, 8),
    Case(2, 17, 17, 4, 4, 16, 16, causal=True),
    Case(2, 13, 29, 4, 2, 32, 16, causal=True),                 # s_q < s_k, GQA, d != d_v
    Case(1, 29, 13, 6, 2, 24, 40, causal=True),                 # s_q > s_k: the top rows see no key
    Case(2, 16, 16, 2, 2, 8, 8, window=(3, 0)),                 # sliding window
    Case(1, 12, 20, 4, 1, 16, 16, window=(2, 5)),               # MQA, two-sided window
    Case(2, 10, 10, 2, 2, 64, 64, causal=True, window=(4, -1)),  # causal + left window
    Case(1, 9, 33, 2, 2, 16, 16, softcap=5.0),
    Case(1, 11, 11, 2, 1, 16, 16, causal=True, softcap=2.0),
    Case(1, 12, 5, 2, 2, 8, 8, window=(1, 0)),                  # empty rows and keys no query sees
    Case(1, 20, 20, 3, 3, 128, 128),
    Case(1, 8, 8, 1, 1, 256, 256),                              # the largest head dim
    Case(1, 7, 11, 2, 2, 3, 5),                                 # odd head dims
    Case(3, 5, 6, 2, 2, 1, 1, causal=True),                     # head dim 1
]
LOW_PRECISION_CASES = CASES[:6] + CASES[7:10]


def make_inputs(c: Case, dtype, device="cpu"):
    q = torch.randn(c.batch, c.seq_q, c.heads_q, c.dim, dtype=dtype, device=device)
    k = torch.randn(c.batch, c.seq_k, c.heads_kv, c.dim, dtype=dtype, device=device)
    v = torch.randn(c.batch, c.seq_k, c.heads_kv, c.dim_v, dtype=dtype, device=device)
    dout = torch.randn(c.batch, c.seq_q, c.heads_q, c.dim_v, dtype=dtype, device=device)
    return q, k, v, dout


def check_against_reference(c: Case, dtype, backend, q, k, v, dout, **extra):
    """Runs flash_attn_func forward and backward on (q, k, v) and compares out, lse, dq, dk, dv."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, probs = flashattn.flash_attn_func(*leaves, causal=c.causal, window_size=c.window, softcap=c.softcap,
                                                return_attn_probs=True, backend=backend, **extra)
    assert probs is None
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert lse.shape == (c.batch, c.heads_q, c.seq_q)
    out.backward(dout)

    results = {}
    for ref_dtype in (torch.float64, None):  # the oracle, then the same math in the test dtype
        ref_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        r_out, r_lse = attention_ref(*ref_leaves, causal=c.causal, window=c.window, softcap=c.softcap,
                                     scale=extra.get("softmax_scale"), dtype=ref_dtype)
        r_out.backward(dout.to(r_out.dtype))
        results[ref_dtype] = (r_out, r_lse) + tuple(t.grad for t in ref_leaves)
    names = ("out", "lse", "dq", "dk", "dv")
    ours = (out, lse) + tuple(t.grad for t in leaves)
    for name, o, r64, low in zip(names, ours, results[torch.float64], results[None]):
        # lse is float32 whatever the input dtype
        assert_close(name, o, r64, low, torch.float32 if name == "lse" and dtype == torch.float64 else dtype)


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("case", CASES, ids=str)
def test_float32(case, backend):
    check_against_reference(case, torch.float32, backend, *make_inputs(case, torch.float32))


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", LOW_PRECISION_CASES, ids=str)
def test_low_precision(case, dtype, backend):
    check_against_reference(case, dtype, backend, *make_inputs(case, dtype))


@pytest.mark.parametrize("backend", cpu_backends())
def test_float64(backend):
    c = Case(2, 9, 14, 4, 2, 16, 8, causal=True, softcap=3.0)
    check_against_reference(c, torch.float64, backend, *make_inputs(c, torch.float64))


@pytest.mark.parametrize("backend", cpu_backends())
def test_softmax_scale(backend):
    c = Case(1, 6, 9, 2, 2, 16, 16, causal=True)
    check_against_reference(c, torch.float32, backend, *make_inputs(c, torch.float32), softmax_scale=0.37)


@pytest.mark.parametrize("backend", cpu_backends())
def test_non_contiguous_inputs(backend):
    """[b, h, s, d] storage seen as [b, s, h, d], a sliced key tensor, a value with a strided last dimension and a
    transposed output gradient: all strides are honoured (the last one through a copy)."""
    c = Case(2, 7, 10, 4, 2, 16, 8, causal=True)
    q = torch.randn(c.batch, c.heads_q, c.seq_q, c.dim).transpose(1, 2)
    k = torch.randn(c.batch, c.seq_k + 3, c.heads_kv + 1, c.dim + 4)[:, 2:-1, 1:, :c.dim]
    v = torch.randn(c.batch, c.seq_k, c.heads_kv, 2 * c.dim_v)[..., ::2]
    dout = torch.randn(c.batch, c.heads_q, c.seq_q, c.dim_v).transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous() and v.stride(-1) == 2 and not dout.is_contiguous()
    check_against_reference(c, torch.float32, backend, q, k, v, dout)


@pytest.mark.parametrize("backend", cpu_backends())
def test_packed_layouts_match_unpacked(backend):
    b, s, h, d = 2, 9, 4, 16
    qkv = torch.randn(b, s, 3, h, d, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, backend=backend)
    (g,) = torch.autograd.grad(out, qkv, torch.ones_like(out))

    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref = flashattn.flash_attn_func(q, k, v, causal=True, backend=backend)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(g, torch.stack([q.grad, k.grad, v.grad], 2), rtol=0, atol=0)

    q2 = torch.randn(b, s + 2, h, d, requires_grad=True)
    kv = torch.randn(b, s, 2, h // 2, d, requires_grad=True)
    out = flashattn.flash_attn_kvpacked_func(q2, kv, softcap=4.0, backend=backend)
    k, v = (t.detach().clone().requires_grad_() for t in kv.unbind(2))
    ref = flashattn.flash_attn_func(q2, k, v, softcap=4.0, backend=backend)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_flash_attn_semantics_of_arguments():
    """flash_attn conventions: any negative window size is unbounded, softcap <= 0 is off, defaults match."""
    q, k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 7, 2, 8), torch.randn(1, 7, 2, 8)
    base = flashattn.flash_attn_func(q, k, v, backend="cpu_reference")
    for kwargs in ({"window_size": (-5, -2)}, {"window_size": [-1, -1]}, {"softcap": -1.0}, {"softcap": 0.0},
                   {"softmax_scale": 8 ** -0.5}, {"dropout_p": 0.0}, {"alibi_slopes": None},
                   {"deterministic": True}):
        torch.testing.assert_close(flashattn.flash_attn_func(q, k, v, backend="cpu_reference", **kwargs), base,
                                   rtol=0, atol=0, msg=str(kwargs))
    # positional order of flash_attn 2: dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, ...
    a = flashattn.flash_attn_func(q, k, v, 0.0, 0.5, True, (2, 0), 3.0, None, False, False, backend="cpu_reference")
    b = flashattn.flash_attn_func(q, k, v, softmax_scale=0.5, causal=True, window_size=(2, 0), softcap=3.0,
                                  backend="cpu_reference")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_default_path_is_automatic_dispatch():
    q = torch.randn(1, 4, 2, 8)
    choice = flashattn.choose_backend(q, q, q)
    assert choice.backend == "cpu_flash" and choice.supported, choice
    assert "CPU" in choice.reason
    forced = flashattn.choose_backend(q, q, q, backend="cpu_reference", backward=True)
    assert forced.backend == "cpu_reference" and forced.supported
    deterministic = flashattn.choose_backend(q, q, q, backward=True, deterministic=True)
    assert deterministic.backend == "cpu_flash" and deterministic.supported, deterministic
    cuda = flashattn.choose_backend(q, q, q, backend="cuda_sm80")
    assert not cuda.supported and "CPU" in cuda.reason


# Runs of the deterministic tests: ten, cycling through thread counts (0 = all cores, 3 oversubscribes two cores).
DETERMINISM_THREADS = (0, 1, 2, 3, 0, 1, 2, 3, 0, 1)


def deterministic_runs(call, leaves, dout, thread_counts=DETERMINISM_THREADS):
    """call(num_threads) -> out, run once per entry of thread_counts; returns [(out, *grads of leaves)]."""
    runs = []
    for threads in thread_counts:
        out = call(threads)
        runs.append((out.detach(),) + torch.autograd.grad(out, leaves, dout))
    return runs


def assert_bitwise_equal_runs(runs, names=("out", "dq", "dk", "dv"), labels=DETERMINISM_THREADS):
    for i, run in enumerate(runs[1:], 1):
        for name, a, b in zip(names, runs[0], run):
            assert torch.equal(a, b), (f"{name} of run {i} (num_threads={labels[i]}) differs bitwise from run 0 "
                                       f"(num_threads={labels[0]}): max difference {(a - b).abs().max().item():.3g}")


@pytest.mark.parametrize("backend", cpu_backends())
def test_deterministic_backward_is_bitwise_repeatable(backend):
    """deterministic=True: dq, dk, dv (and out) bitwise identical over ten runs and across thread counts. The shape
    has several query and key blocks (64 rows each), GQA and one batch, so the backward splits each (batch, KV head)
    unit over query heads and key chunks, where an unordered dQ sum would show. The first run is checked against
    the reference too, so that the runs cannot agree on a wrong answer."""
    c = Case(1, 150, 170, 4, 2, 32, 32, causal=True, softcap=3.0)
    q, k, v, dout = make_inputs(c, torch.float32)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    call = lambda threads: flashattn.flash_attn_func(*leaves, causal=True, softcap=3.0, deterministic=True,  # noqa
                                                     backend=backend, num_threads=threads)
    runs = deterministic_runs(call, leaves, dout)
    assert_bitwise_equal_runs(runs)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    r_out, _ = attention_ref(*ref, causal=True, softcap=3.0)
    r_grads = torch.autograd.grad(r_out, ref, dout.double())
    for name, ours, r in zip(("out", "dq", "dk", "dv"), runs[0], (r_out,) + r_grads):
        torch.testing.assert_close(ours.double(), r, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", cpu_backends())
def test_deterministic_varlen_backward_is_bitwise_repeatable(backend):
    """The same for varlen: sequences of several blocks, an empty one, GQA, a window."""
    lengths = [130, 0, 70, 5]
    cu_seqlens = torch.tensor([0, 130, 130, 200, 205], dtype=torch.int32)
    q = torch.randn(205, 4, 16, requires_grad=True)
    k, v = (torch.randn(205, 1, 16, requires_grad=True) for _ in range(2))
    dout = torch.randn(205, 4, 16)
    call = lambda threads: flashattn.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), window_size=(50, 3), deterministic=True,
        backend=backend, num_threads=threads)
    assert_bitwise_equal_runs(deterministic_runs(call, (q, k, v), dout))


@pytest.mark.parametrize("backend", cpu_backends())
def test_forward_is_bitwise_independent_of_threads(backend):
    """The forward cuts a call into a fixed number of tasks (not one per thread): the output and lse are bitwise
    the same for any thread count."""
    q, k, v = (torch.randn(2, 300, 2, 16) for _ in range(3))
    results = [flashattn.flash_attn_func(q, k, v, causal=True, backend=backend, num_threads=t, return_attn_probs=True)
               for t in (1, 2, 3, 0)]
    for out, lse, _ in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


@pytest.mark.parametrize("backend", cpu_backends())
@pytest.mark.parametrize("shape", [(0, 4, 4), (2, 0, 4), (2, 4, 0)], ids=["batch0", "seq_q0", "seq_k0"])
def test_empty_sizes(shape, backend):
    b, sq, sk = shape
    q = torch.randn(b, sq, 2, 8, requires_grad=True)
    k = torch.randn(b, sk, 2, 8, requires_grad=True)
    v = torch.randn(b, sk, 2, 8, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True, backend=backend)
    assert out.shape == (b, sq, 2, 8) and lse.shape == (b, 2, sq)
    if sk == 0 and out.numel():
        assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    out.sum().backward()
    if sq == 0:  # no query: the keys and values get zero gradients
        assert torch.all(k.grad == 0) and torch.all(v.grad == 0)


@pytest.mark.parametrize("backend", cpu_backends())
def test_empty_inputs_with_a_strided_head_dim_keep_their_gradients(backend):
    """An empty input whose last stride is not 1 is copied to a fresh layout; the copy stays in the autograd graph
    (it was a new tensor, so out did not require grad and backward() failed)."""
    base = torch.randn(2, 0, 2, 16, requires_grad=True)
    q = base[..., ::2]
    out = flashattn.flash_attn_func(q, q, q, backend=backend)
    assert out.requires_grad
    out.sum().backward()
    assert base.grad.shape == base.shape
    packed = torch.randn(0, 5, 3, 2, 16, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(packed[..., ::2], backend=backend)
    out.sum().backward()
    assert packed.grad.shape == packed.shape and not packed.grad.any()
