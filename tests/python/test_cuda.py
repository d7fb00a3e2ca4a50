"""CUDA: the default (automatic) path against the float64 reference, varlen, torch's current stream, CUDA graph
capture, opcheck, torch.compile, device checks. Every test is skipped cleanly without a GPU or without the CUDA
kernels in the build."""

from __future__ import annotations

import pytest
import torch

import flashattn
from conftest import CUDA_AVAILABLE, _backend_problem, requires_cuda
from fa_reference import attention_ref
from test_api_fuzz import SEED, run_trials
import test_arguments  # its test functions called with device="cuda" (not imported: pytest would collect them here)
from test_dispatch import OPTION_SETS, check_choice_is_what_runs, supported_shape_problems
from test_attention import (CASES, Case, assert_bitwise_equal_runs, check_against_reference, deterministic_runs,
                            make_inputs)
from test_torch_integration import AttentionBlock, bwd_args, fwd_args, opcheck_cases
from test_varlen import VARLEN_CASES, run_case

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=str)
def dtype(request):
    # Never a skip: if automatic dispatch cannot run a dtype the kernels support, its tests fail (and the probes
    # below say which shape).
    return request.param


def test_automatic_cuda_path_probe(dtype):
    problem = _backend_problem("auto", "cuda", dtype, head_dim=64)
    assert problem is None, f"automatic CUDA dispatch declined its probe shape ({dtype}, hd 64): {problem}"


def test_automatic_cuda_path_runs_every_supported_shape(dtype):
    problems = supported_shape_problems("cuda", dtype)
    assert not problems, "automatic CUDA dispatch cannot run supported shapes:\n" + "\n".join(problems)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_backward(case, dtype):
    check_against_reference(case, dtype, "auto", *make_inputs(case, dtype, "cuda"))


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: f"q{c[0]}_k{c[1]}")
def test_varlen(case, dtype):
    run_case(*case, dtype=dtype, backend="auto", device="cuda")


def test_current_stream_is_honoured(dtype):
    """q is written on a side stream after a long spin; the attention launched on that stream must see it. A kernel
    on any other stream would race the copy."""
    src = torch.randn(2, 512, 8, 64, dtype=dtype, device="cuda")
    k, v = torch.randn_like(src), torch.randn_like(src)
    expected = flashattn.flash_attn_func(src, k, v, causal=True)
    q = torch.zeros_like(src)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the side stream
        q.copy_(src)
        out = flashattn.flash_attn_func(q, k, v, causal=True)
    side.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_workspace_pool_reuse_and_release(dtype):
    """The backward's workspace comes from the library's pool: repeated calls (some after release_cached_memory)
    give bitwise the same outputs and deterministic gradients."""
    # 32 heads x 2 x 4 query blocks of hd 64: more tiles than an H200 has SMs, so the forward claims tiles.
    q, k, v = (torch.randn(2, 700, 32, 64, dtype=dtype, device="cuda", requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 700, 32, 64, dtype=dtype, device="cuda")
    grads = []
    for release in (False, False, True, False):
        out = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append((out.detach().clone(),) + torch.autograd.grad(out, (q, k, v), dout))
        if release:
            flashattn.release_cached_memory()
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cuda_graph_capture(dtype):
    q, k, v = (torch.randn(2, 80, 4, 64, dtype=dtype, device="cuda", requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 80, 4, 64, dtype=dtype, device="cuda")

    def step():
        out = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(16, 0))
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch requires
        step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        eager = step()
        for s, e in zip(static, eager):
            torch.testing.assert_close(s, e, rtol=0, atol=0)


@pytest.mark.parametrize("case", range(len(opcheck_cases("cpu"))))
def test_opcheck(case, dtype):
    torch.library.opcheck(torch.ops.flashattn.attention_forward.default,
                          opcheck_cases("cuda", dtype, head_dim=64, backend="auto")[case])


def test_compile_fullgraph(dtype):
    torch._dynamo.reset()
    block = AttentionBlock(dim=64, heads=4, kv_heads=2).to("cuda", dtype)
    x = torch.randn(2, 33, 64, device="cuda", dtype=dtype, requires_grad=True)
    eager = block(x)
    eager_grads = torch.autograd.grad(eager.float().square().sum(), [x] + list(block.parameters()))
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x)
    grads = torch.autograd.grad(out.float().square().sum(), [x] + list(block.parameters()))
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out, eager, **tol)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, **tol)


def test_sdpa_matches_torch(dtype):
    q = torch.randn(2, 4, 40, 64, dtype=dtype, device="cuda")
    k = torch.randn(2, 2, 70, 64, dtype=dtype, device="cuda")
    v = torch.randn(2, 2, 70, 64, dtype=dtype, device="cuda")
    ours = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                                           enable_gqa=True)
    torch.testing.assert_close(ours.double(), ref, rtol=2e-2, atol=2e-2)


def test_device_mismatch_names_the_argument():
    q = torch.randn(1, 4, 2, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="^k: on cpu but q is on cuda"):
        flashattn.flash_attn_func(q, q.cpu(), q)


@pytest.mark.skipif(not CUDA_AVAILABLE or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs compute capability 9.0")
def test_backward_dispatch_on_hopper():
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16, device="cuda")
    choice = flashattn.choose_backend(q, q, q, backward=True)
    assert choice.backend == "cuda_sm90" and choice.supported, choice
    # The deterministic mode (dQ summed in an order fixed per tile) runs on the Hopper kernel at every head dim.
    for d in (128, 256):
        qd = torch.randn(1, 64, 2, d, dtype=torch.bfloat16, device="cuda")
        choice = flashattn.choose_backend(qd, qd, qd, backward=True, deterministic=True)
        assert choice.backend == "cuda_sm90" and choice.supported, choice


# One decoding step through flash_attn_func: s_q x the GQA group within 16 packed rows runs the split-KV decode kernel
# (its keys split across the GPU), with masks, softcap, and d 64 / 128 / 256; the backward runs on the O and LSE it
# wrote. 20 packed rows run the forward kernels.
FEW_ROW_CASES = [
    Case(2, 1, 3000, 8, 2, 128, 128, causal=True),
    Case(1, 4, 1500, 8, 2, 64, 64, window=(700, 0)),
    Case(3, 1, 777, 4, 4, 256, 256, softcap=4.0),
    Case(1, 16, 40, 2, 2, 32, 48, causal=True),  # s_q 16 without GQA: all 16 rows of the tile, d != d_v
]


@pytest.mark.parametrize("case", FEW_ROW_CASES, ids=str)
def test_few_query_rows_run_the_decode_kernel(case, dtype):
    q, k, v, dout = make_inputs(case, dtype, "cuda")
    choice = flashattn.choose_backend(q, k, v, causal=case.causal, window_left=case.window[0],
                                      window_right=case.window[1], softcap=case.softcap)
    assert choice.supported and "few query rows: the split-KV decode kernel" in choice.reason, choice
    check_against_reference(case, dtype, "auto", q, k, v, dout)


def test_twenty_packed_rows_run_the_forward_kernels():
    q = torch.randn(1, 5, 8, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 100, 2, 64, dtype=torch.bfloat16, device="cuda")
    choice = flashattn.choose_backend(q, k, k)
    assert choice.supported and "decode" not in choice.reason, choice
    # Dropout is a forward-kernel feature: a one-row call with it runs there too.
    choice = flashattn.choose_backend(q[:, :1], k, k, dropout_p=0.1)
    assert choice.supported and "decode" not in choice.reason, choice


def test_cpu_backend_on_cuda_tensors_is_unsupported():
    q = torch.randn(1, 4, 2, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="cpu_reference runs on CPU tensors"):
        flashattn.flash_attn_func(q, q, q, backend="cpu_reference")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device(dtype):
    c = Case(1, 33, 47, 4, 2, 64, 64, causal=True)
    with torch.cuda.device(0):
        check_against_reference(c, dtype, "auto", *make_inputs(c, dtype, "cuda:1"))


def test_reference_runs_on_gpu_inputs_too():
    """The float64 math reference itself is device-agnostic (sanity check of the harness)."""
    q = torch.randn(1, 3, 1, 8, device="cuda", dtype=torch.float64)
    out, lse = attention_ref(q, q, q, causal=True)
    assert out.device.type == "cuda" and torch.isfinite(lse).all()


def test_opcheck_backward(dtype):
    q, k, v = (torch.randn(2, 37, 4, 64, dtype=dtype, device="cuda") for _ in range(3))
    fwd = fwd_args(q, k, v, scale=0.125, causal=True, backend="auto")
    out, lse = torch.ops.flashattn.attention_forward(*fwd)
    torch.library.opcheck(torch.ops.flashattn.attention_backward.default,
                          bwd_args(torch.randn_like(out), out, lse, fwd))


def test_cupy_arrays_on_an_explicit_stream(dtype):
    """The native module with CuPy arrays (no torch tensor involved) and a CuPy stream passed as an integer."""
    cp = pytest.importorskip("cupy")
    if dtype != torch.float16:
        pytest.skip("CuPy has no bfloat16")
    rng = cp.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 64, 4, 64), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    out, lse = cp.empty_like(q), cp.empty((2, 4, 64), cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ran = flashattn._C.forward(q, k, v, out, lse, causal=True, stream=stream.ptr)
    stream.synchronize()
    assert ran.startswith("cuda_")
    expected = flashattn.flash_attn_func(*(torch.from_dlpack(t) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(torch.from_dlpack(out), expected, rtol=0, atol=0)


# ---- every argument non-default, determinism, choose_backend, random calls (the CPU suite's checks on CUDA) ---------


@pytest.mark.parametrize("options", test_arguments.PACKED_OPTIONS, ids=test_arguments._option_id)
def test_packed_forms_window_softcap_scale_and_gradients(options, dtype):
    test_arguments.test_qkvpacked_and_kvpacked(options, dtype, "auto", device="cuda")
    test_arguments.test_varlen_qkvpacked_and_kvpacked(options, dtype, "auto", device="cuda")


@pytest.mark.parametrize("extra", [{"softmax_scale": 0.3}, {"softmax_scale": 0.6, "deterministic": True},
                                   {"deterministic": True}], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("case", [VARLEN_CASES[1], VARLEN_CASES[3]], ids=["gqa_empty_seq", "softcap"])
def test_varlen_scale_and_deterministic(case, extra, dtype):
    run_case(*case, dtype=dtype, backend="auto", device="cuda", **extra)


def test_deterministic_backward_is_bitwise_repeatable(dtype):
    """deterministic=True: dq, dk, dv (and out) bitwise identical over ten runs, padded (several query and key
    tiles, GQA) and varlen."""
    q = torch.randn(2, 333, 8, 128, dtype=dtype, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 400, 2, 128, dtype=dtype, device="cuda", requires_grad=True) for _ in range(2))
    dout = torch.randn(2, 333, 8, 128, dtype=dtype, device="cuda")
    runs = deterministic_runs(lambda _: flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True),
                              (q, k, v), dout, thread_counts=(0,) * 10)
    assert_bitwise_equal_runs(runs, labels=(0,) * 10)

    cu_seqlens = torch.tensor([0, 300, 300, 470, 475], dtype=torch.int32, device="cuda")
    q = torch.randn(475, 8, 64, dtype=dtype, device="cuda", requires_grad=True)
    k, v = (torch.randn(475, 2, 64, dtype=dtype, device="cuda", requires_grad=True) for _ in range(2))
    dout = torch.randn(475, 8, 64, dtype=dtype, device="cuda")
    runs = deterministic_runs(lambda _: flashattn.flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, 300, 300, window_size=(100, 7), softcap=5.0, deterministic=True),
        (q, k, v), dout, thread_counts=(0,) * 10)
    assert_bitwise_equal_runs(runs, labels=(0,) * 10)


@pytest.mark.parametrize("varlen", [False, True], ids=["padded", "varlen"])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_choose_backend_with_varlen_window_softcap(options, varlen, dtype):
    """choose_backend's answer (forward, backward, deterministic backward) is a supported CUDA backend, and the one
    the native calls then run."""
    for deterministic in (False, True):
        fwd, bwd = check_choice_is_what_runs("cuda", dtype, options, varlen, deterministic)
        for c in (fwd, bwd):
            assert c.backend.startswith("cuda_") and c.reason, c


def test_random_calls_of_every_entry_point():
    """test_api_fuzz on CUDA tensors (float16 / bfloat16, automatic dispatch; a tensor moved to the CPU and the
    CPU backends are among the breaks). Last in this file: a kernel fault would end the process."""
    counts = run_trials("cuda", 120, seed=SEED + 1)
    assert counts["valid"] > 30 and counts["broken"] > 30, counts
