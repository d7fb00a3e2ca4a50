"""The framework-neutral native module flashattn._C on its own: numpy arrays through DLPack / the buffer protocol,
caller-allocated outputs, error mapping, build queries, and the GIL released during compute."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

import flashattn
from flashattn import _C
from fa_reference import assert_close, attention_ref


def np_inputs(b=2, sq=5, sk=7, hq=4, hkv=2, d=8, dv=6, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, dv)).astype(dtype)
    return q, k, v


def test_build_queries():
    assert _C.version() == flashattn.__version__ == _C.__version__
    assert isinstance(_C.built_with_cuda(), bool)
    assert _C.cuda_device_count() >= 0
    if not _C.built_with_cuda():
        assert _C.cuda_device_count() == 0
    elif torch.cuda.is_available():  # a CUDA build must see the GPUs torch sees (else the CUDA tests would skip)
        assert _C.cuda_device_count() == torch.cuda.device_count()
    assert _C.release_cached_memory() is None  # nothing to release is not an error
    assert flashattn.release_cached_memory is _C.release_cached_memory


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_numpy_forward_backward(dtype):
    q, k, v = np_inputs(dtype=dtype)
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    ran = _C.forward(q, k, v, out, lse, causal=True, backend="cpu_reference")
    assert ran == "cpu_reference"
    r_out, r_lse = attention_ref(*(torch.from_numpy(t) for t in (q, k, v)), causal=True)
    low_out, low_lse = attention_ref(*(torch.from_numpy(t) for t in (q, k, v)), causal=True, dtype=None)
    assert_close("out", torch.from_numpy(out), r_out, low_out, torch.from_numpy(out).dtype)
    assert_close("lse", torch.from_numpy(lse), r_lse, low_lse, torch.float32 if dtype == np.float64 else
                 torch.from_numpy(out).dtype)

    dout = np.ones_like(out)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    assert _C.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True, backend="cpu_reference") == "cpu_reference"
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    tq, tk, tv = (torch.from_numpy(t).double().requires_grad_() for t in (q, k, v))
    o, _ = attention_ref(tq, tk, tv, causal=True)
    o.backward(torch.ones_like(o))
    tol = {np.float64: 1e-10, np.float32: 1e-5, np.float16: 2e-2}[dtype]
    for ours, ref in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
        np.testing.assert_allclose(ours.astype(np.float64), ref.numpy(), rtol=tol, atol=tol)


def test_numpy_read_only_inputs_and_strided_views():
    q, k, v = np_inputs()
    q_bhsd = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # [b, h, s, d] storage
    q_view = q_bhsd.transpose(0, 2, 1, 3)                    # seen as [b, s, h, d]
    for t in (q_view, k, v):
        t.flags.writeable = False
    out = np.empty(q.shape[:-1] + (v.shape[-1],), np.float32)
    _C.forward(q_view, k, v, out, backend="cpu_reference")
    ref = np.empty_like(out)
    _C.forward(q, k, v, ref, backend="cpu_reference")
    np.testing.assert_array_equal(out, ref)


def test_numpy_varlen():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((7, 2, 8)).astype(np.float32)
    k = rng.standard_normal((9, 2, 8)).astype(np.float32)
    v = rng.standard_normal((9, 2, 8)).astype(np.float32)
    cu_q, cu_k = np.array([0, 3, 7], np.int32), np.array([0, 4, 9], np.int32)
    out, lse = np.empty_like(q), np.empty((2, 7), np.float32)
    _C.forward(q, k, v, out, lse, cu_q, cu_k, 0, 0, causal=True, backend="cpu_reference")  # 0: derive the max
    for b in range(2):
        ref = np.empty((1, cu_q[b + 1] - cu_q[b], 2, 8), np.float32)
        _C.forward(q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b + 1]], v[None, cu_k[b]:cu_k[b + 1]], ref,
                   causal=True, backend="cpu_reference")
        np.testing.assert_allclose(out[cu_q[b]:cu_q[b + 1]], ref[0], rtol=1e-6, atol=1e-6)


def test_jax_inputs():
    """Read-only JAX arrays (CPU) as inputs through DLPack, a numpy output."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # keep JAX off the GPU the torch tests use
    jax = pytest.importorskip("jax")
    q, k, v = np_inputs()
    cpu = jax.devices("cpu")[0]
    jq, jk, jv = (jax.device_put(t, cpu) for t in (q, k, v))
    out, ref = (np.empty(q.shape[:-1] + (v.shape[-1],), np.float32) for _ in range(2))
    _C.forward(jq, jk, jv, out, causal=True, backend="cpu_reference")
    _C.forward(q, k, v, ref, causal=True, backend="cpu_reference")
    np.testing.assert_array_equal(out, ref)


def test_choose_backend_reports_reason():
    q, k, v = np_inputs()
    name, ok, reason = _C.choose_backend(q, k, v)
    assert (name, ok) == ("cpu_flash", True) and reason
    name, ok, reason = _C.choose_backend(q, k, v, backend="cuda_sm90", backward=True)
    assert name == "cuda_sm90" and not ok and "CPU" in reason


def test_error_mapping():
    q, k, v = np_inputs()
    out = np.empty(q.shape[:-1] + (v.shape[-1],), np.float32)
    with pytest.raises(TypeError, match="^q: unsupported dtype complex64"):
        _C.forward(q.astype(np.complex64), k, v, out)
    with pytest.raises(TypeError, match="^k: unsupported dtype int64"):
        _C.forward(q, k.astype(np.int64), v, out)
    with pytest.raises(ValueError, match="^out: expected shape"):
        _C.forward(q, k, v, out[:, :2])
    with pytest.raises(ValueError, match="^v: expected dtype float32, got float64"):
        _C.forward(q, k, v.astype(np.float64), out)
    with pytest.raises(ValueError, match="^lse: required by the backward"):
        _C.backward(out, q, k, v, out, None, np.empty_like(q), np.empty_like(k), np.empty_like(v))
    with pytest.raises(ValueError, match="^q: rank 5 is above the maximum"):
        _C.forward(q[None], k, v, out)
    with pytest.raises(NotImplementedError, match="cuda_sm80"):
        _C.forward(q, k, v, out, backend="cuda_sm80")
    with pytest.raises(TypeError):  # not an array at all: nanobind's own argument error
        _C.forward("q", k, v, out)


def test_output_untouched_on_rejection():
    q, k, v = np_inputs()
    out = np.full(q.shape[:-1] + (v.shape[-1],), 7.0, np.float32)
    lse = np.full((2, 3, 5), 7.0, np.float32)  # wrong shape: rejected before anything is written
    with pytest.raises(ValueError, match="^lse: expected shape"):
        _C.forward(q, k, v, out, lse, backend="cpu_reference")
    assert (out == 7.0).all()


def test_gil_released_during_compute():
    """Two threads each run a long forward; with the GIL held the second could not start until the first ended.
    Checked by a Python counter thread making progress while the native call runs."""
    q, k, v = np_inputs(b=4, sq=256, sk=256, hq=4, hkv=4, d=64, dv=64)
    out = np.empty(q.shape[:-1] + (v.shape[-1],), np.float32)
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        before = len(ticks)
        _C.forward(q, k, v, out, backend="cpu_reference", num_threads=1)
        during = len(ticks) - before
    finally:
        done.set()
        t.join()
    assert during > 3, "the counter thread did not run while the native call computed"
