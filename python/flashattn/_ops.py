"""PyTorch operators over the native module: ``flashattn::attention_forward`` / ``attention_backward`` and
``flashattn::attention_with_kvcache``.

``attention_forward`` and ``attention_backward`` are ``torch.library.custom_op`` operators with no mutated arguments:
the outputs are allocated here by torch on the inputs' device (the same allocation code runs under FakeTensor for
``register_fake``, so real and fake outputs agree on shape, dtype and strides). Autograd goes through
``register_autograd``: the forward saves q, k, v, out and lse, the backward calls ``attention_backward``. Both work in
eager mode, under autograd and in ``torch.compile(fullgraph=True)`` without graph breaks.

``attention_with_kvcache`` (flash_attn_with_kvcache, and flash_attn_varlen_func over a paged cache) declares
k_cache and v_cache as mutated (new rows are appended to them in place) and returns (out, lse). It is inference
only, with no backward (as in flash_attn): kvcache_attention calls it on detached tensors, so its outputs never
require grad; called directly with inputs that require grad, a backward reaching it raises.

CUDA: the kernels run on torch's current stream of the inputs' device, passed to the native module as an
integer. Tensors are exported with ``to_dlpack`` (no cross-stream synchronisation) and the padded path performs
no host synchronisation, so CUDA graph capture works (ALiBi slopes on CUDA are checked to be finite with one
synchronising reduction per call, skipped under capture). The varlen path validates cu_seqlens on the
host, which copies them from the device (not capturable). The KV-cache operator copies its index tensors
(cache_seqlens, cache_batch_idx, cache_leftpad, block_table) to the host to check their values, except while the
current stream is being captured into a CUDA graph: then nothing is copied and the kernels clamp out-of-range
values instead (decode steps with padded queries are capturable; varlen queries are not).
"""

from __future__ import annotations

import operator
import re
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C

__all__ = ["attention", "choose_backend", "BackendChoice", "merge_attention_states", "merge_attention_states_"]


# ---- talking to the native module -------------------------------------------------------------------------------


def _dl(t: Optional[Tensor]):
    """A DLPack capsule of `t` for the native module (None stays None).

    torch.utils.dlpack.to_dlpack exports without any stream synchronisation (the kernel runs on the caller's
    current stream, passed explicitly; an export-time event record/wait would also break CUDA graph capture), and
    at a fraction of Tensor.__dlpack__'s cost. It does not look at requires_grad: autograd lives above this layer.
    """
    return None if t is None else _to_dlpack(t)


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.device.type == "cuda" else 0


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The kernels need stride 1 along the head dimension only; every other stride is free.
    if t.stride(-1) == 1 or t.size(-1) <= 1:
        return t
    if t.numel() == 0:  # contiguous() keeps an empty tensor's strides as they are; copy_ keeps the autograd graph
        return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)
    return t.contiguous()


# ---- output allocation (shared by the real and the fake implementations) -----------------------------------------


def _check_rank(name: str, t: Tensor, varlen: bool) -> None:
    rank = 3 if varlen else 4
    if t.dim() != rank:
        layout = "[total, heads, dim] (varlen)" if varlen else "[batch, seqlen, heads, dim]"
        raise ValueError(f"{name}: expected a rank-{rank} tensor {layout}, got shape {list(t.shape)}")


def _outputs_like(q: Tensor, head_dim_v: int, varlen: bool, dtype: Optional[torch.dtype] = None
                  ) -> Tuple[Tensor, Tensor]:
    """out laid out like q with head dim d_v (in q's dtype unless given), and the fp32 lse: [batch, heads_q,
    seqlen_q] or [heads_q, total_q]."""
    out = torch.empty((*q.shape[:-1], head_dim_v), dtype=q.dtype if dtype is None else dtype, device=q.device)
    if varlen:
        lse_shape = (q.shape[1], q.shape[0])  # [heads_q, total_q]
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])  # [batch, heads_q, seqlen_q]
    return out, torch.empty(lse_shape, dtype=torch.float32, device=q.device)


def _forward_outputs(q: Tensor, v: Tensor, varlen: bool) -> Tuple[Tensor, Tensor]:
    _check_rank("q", q, varlen)
    _check_rank("v", v, varlen)
    return _outputs_like(q, v.shape[-1], varlen)


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    # Fresh contiguous gradients: the backends write every element (never accumulate into them).
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


# ---- the operators ------------------------------------------------------------------------------------------------
# The scalar options travel as two lists, not one operator argument each: torch's custom-op autograd path rebuilds
# the schema's argument list for every argument on every call (torch._library.utils.fill_defaults), a cost that
# grows with the square of the argument count. With the fifteen arguments of one each it was 70 of a 167 µs
# forward call on the host, which at short sequences is more than the kernel
# (bench/results/host-overhead.md).
INT_OPTIONS = ("max_seqlen_q", "max_seqlen_k", "causal", "window_left", "window_right", "deterministic", "num_threads",
               "dropout_seed", "dropout_offset", "attention_chunk")
FLOAT_OPTIONS = ("softmax_scale", "softcap", "dropout_p")


def op_options(max_seqlen_q: int = 0, max_seqlen_k: int = 0, softmax_scale: float = 1.0, causal: bool = False,
               window_left: int = -1, window_right: int = -1, softcap: float = 0.0, deterministic: bool = False,
               num_threads: int = 0, dropout_p: float = 0.0, dropout_seed: int = 0,
               dropout_offset: int = 0, *, attention_chunk: int = 0) -> Tuple[List[int], List[float]]:
    """The operators' (int_options, float_options), in the orders INT_OPTIONS and FLOAT_OPTIONS name. The dropout
    seed and offset travel with the forward's options to its backward, which so regenerates the same mask."""
    return ([int(max_seqlen_q), int(max_seqlen_k), int(bool(causal)), int(window_left), int(window_right),
             int(bool(deterministic)), int(num_threads), int(dropout_seed), int(dropout_offset), int(attention_chunk)],
            [float(softmax_scale), float(softcap), float(dropout_p)])


def _native_options(int_options: List[int], float_options: List[float]) -> dict:
    if len(int_options) != len(INT_OPTIONS) or len(float_options) != len(FLOAT_OPTIONS):
        raise ValueError(f"int_options, float_options: expected {len(INT_OPTIONS)} ints {INT_OPTIONS} and "
                         f"{len(FLOAT_OPTIONS)} floats {FLOAT_OPTIONS}, got {len(int_options)} and {len(float_options)}")
    o = dict(zip(INT_OPTIONS, int_options))
    o.update(zip(FLOAT_OPTIONS, float_options))
    o["causal"] = bool(o["causal"])
    o["deterministic"] = bool(o["deterministic"])
    return o


def _attention_forward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    dropout_rng: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    backend: str,
    qv: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """out [.., heads_q, d_v] and lse (fp32) of softmax(q kᵀ · scale + ALiBi bias) v; options as op_options()
    builds them. `deterministic` only travels to the backward (the forward is always deterministic). dropout_rng:
    None, or int64 [2] {seed, offset} on q's device that the kernels read in place of the options' seed and offset
    (the CUDA-graph-safe form, _dropout_key). qv (FA3's, like q with d_v; last, with a default, so that callers
    without it keep their positions): scores scale · (q kᵀ + qv vᵀ); no backward."""
    o = _native_options(int_options, float_options)
    del o["deterministic"]
    if o["dropout_seed"] < 0 or o["dropout_offset"] < 0:
        raise ValueError("int_options: the dropout seed and offset must be >= 0")
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    qv = None if qv is None else _last_dim_contiguous(qv)
    alibi_slopes = _checked_slopes(alibi_slopes)
    out, lse = _forward_outputs(q, v, cu_seqlens_q is not None)
    # The native module makes q's device current for the launch itself.
    _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"),
               o.pop("max_seqlen_k"), alibi_slopes=_dl(alibi_slopes), dropout_rng=_dl(dropout_rng), backend=backend,
               stream=_stream(q), qv=_dl(qv), **o)
    return out, lse


attention_forward = torch.library.custom_op("flashattn::attention_forward", mutates_args=())(_attention_forward_impl)


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng, int_options, float_options,
                            backend, qv=None):
    return _forward_outputs(q, v, cu_seqlens_q is not None)


FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)


def _attention_forward_fp8_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    out_dtype: torch.dtype,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    """attention_forward of float8_e4m3fn q, k, v, each scaled by its optional fp32 [batch, heads_kv] descale
    factors (FA3's): out in out_dtype (bfloat16 or float16) and lse (fp32). Forward only (no backward)."""
    o = _native_options(int_options, float_options)
    for name in ("deterministic", "dropout_p", "dropout_seed", "dropout_offset"):
        o.pop(name)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, lse = _fp8_outputs(q, v, cu_seqlens_q is not None, out_dtype)
    _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"),
               o.pop("max_seqlen_k"), q_descale=_dl(q_descale), k_descale=_dl(k_descale), v_descale=_dl(v_descale),
               backend=backend, stream=_stream(q), **o)
    return out, lse


class _Fp8ForwardOnly(torch.autograd.Function):
    """The FP8 forward of inputs that require grad. PyTorch would give float8 inputs float8 gradients, so the
    backward through autograd raises, naming the explicit call that gives 16-bit ones."""

    @staticmethod
    def forward(ctx, *args):
        out, lse = torch.ops.flashattn.attention_forward_fp8(*args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("q: the backward of float8_e4m3fn inputs does not run through autograd (PyTorch "
                                  "would make their gradients float8): get 16-bit gradients from "
                                  "flashattn.fp8_attention_backward")


def _fp8_outputs(q, v, varlen, out_dtype):
    if out_dtype not in FP8_OUT_DTYPES:
        raise ValueError(f"out_dtype: float8_e4m3fn inputs write bfloat16 or float16, got {out_dtype}")
    _check_rank("q", q, varlen)
    _check_rank("v", v, varlen)
    return _outputs_like(q, v.shape[-1], varlen, out_dtype)


attention_forward_fp8 = torch.library.custom_op("flashattn::attention_forward_fp8", mutates_args=())(
    _attention_forward_fp8_impl)


@attention_forward_fp8.register_fake
def _attention_forward_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale, v_descale, int_options,
                                float_options, out_dtype, backend):
    return _fp8_outputs(q, v, cu_seqlens_q is not None, out_dtype)


def _attention_backward_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    dropout_rng: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    backend: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention_forward given dout and the forward's out and lse; the forward's options and slopes
    (the slopes get no gradient: they are constants, as in flash_attn)."""
    o = _native_options(int_options, float_options)
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    alibi_slopes = None if alibi_slopes is None else _last_dim_contiguous(alibi_slopes)
    dq, dk, dv = _backward_outputs(q, k, v)
    _C.backward(_dl(dout), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dq), _dl(dk), _dl(dv),
                _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"), o.pop("max_seqlen_k"),
                alibi_slopes=_dl(alibi_slopes), dropout_rng=_dl(dropout_rng), backend=backend, stream=_stream(q),
                **o)
    return dq, dk, dv


attention_backward = torch.library.custom_op("flashattn::attention_backward", mutates_args=())(
    _attention_backward_impl)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng,
                             int_options, float_options, backend):
    return _backward_outputs(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng = inputs[:7]
    out, lse = output
    # dropout_rng is saved, not copied: under a CUDA graph its memory holds this step's state when the captured
    # backward reads it (the forward's random op rewrites it on every replay).
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng)
    ctx.options = inputs[7:10]  # int_options, float_options, backend: the backward op takes them as they are
    ctx.with_qv = len(inputs) > 10 and inputs[10] is not None
    ctx.input_count = len(inputs)
    # The log-sum-exp is an auxiliary output (as in flash_attn): no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _refuse_qv_backward(ctx) -> None:
    if ctx.with_qv:
        raise NotImplementedError("qv: the backward of attention with qv is not supported (forward only, as in "
                                  "FlashAttention-3); run it under torch.no_grad() or pass tensors that do not "
                                  "require grad")


def _backward(ctx, dout, _dlse):
    _refuse_qv_backward(ctx)
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                        alibi_slopes, dropout_rng, *ctx.options)
    return (dq, dk, dv) + (None,) * (ctx.input_count - 3)


attention_forward.register_autograd(_backward, setup_context=_setup_context)


# ---- eager calls without torch's operator dispatch -----------------------------------------------------------------
# An eager call through a custom op pays for torch's dispatcher and, with autograd, for the custom-op autograd
# wrapper: ~40-60 µs of host time per call on top of the ~5 µs the native call takes (bench/results/host-overhead.md),
# more than a decode step's kernel. Where nothing can observe the difference (plain tensors, no torch.compile or
# tracing, no dispatch or function mode such as FakeTensorMode or FlopCounterMode, no functorch transform), the
# entry points call the operators' implementations directly, with a torch.autograd.Function for the backward.
# Everywhere else they go through the operators, which is what makes torch.compile, export and the modes work.
_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


def _dispatch_free(*tensors: Optional[Tensor]) -> bool:
    """Whether the call may skip the operators (see above)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TENSOR_TYPES:
            return False
    try:
        return (torch._C._len_torch_dispatch_stack() == 0 and not torch._C._is_torch_function_mode_enabled()
                and torch._C._functorch.peek_interpreter_stack() is None)
    except AttributeError:  # a torch without these introspection hooks: always dispatch
        return False


class _DirectAttention(torch.autograd.Function):
    """attention_forward with its backward, as the operator's autograd registration does it, for eager calls."""

    @staticmethod
    def forward(ctx, *args):
        out, lse = _attention_forward_impl(*args)
        _setup_context(ctx, args, (out, lse))
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        _refuse_qv_backward(ctx)
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng = ctx.saved_tensors
        dq, dk, dv = _attention_backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                              dropout_rng, *ctx.options)
        return (dq, dk, dv) + (None,) * (ctx.input_count - 3)


def _call_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng, int_options, float_options,
                  backend, qv=None):
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng, int_options, float_options, backend)
    if qv is not None:  # the operator's last argument, only when given: calls without it keep their schema form
        args += (qv,)
    if not _dispatch_free(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_rng, qv):
        return torch.ops.flashattn.attention_forward(*args)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, qv)):
        return _DirectAttention.apply(*args)
    return _attention_forward_impl(*args)


# ---- merging partial attentions through their LSEs ---------------------------------------------------------------


def _check_merge_inputs(out_a, lse_a, out_b, lse_b) -> None:
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        _check_tensor(name, t)
    for name, t in (("out_a", out_a), ("out_b", out_b)):
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name}: dtype must be float16, bfloat16 or float32, got {t.dtype}")
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: dtype must be torch.float32, got {t.dtype}")
    if out_a.dim() not in (3, 4):
        raise ValueError(f"out_a: expected [batch, seqlen, heads, head_dim_v] or [total, heads, head_dim_v], got "
                         f"shape {list(out_a.shape)}")


def _merge_run(out_a, lse_a, out_b, lse_b, out, lse) -> None:
    _C.merge_attention_states(_dl(out_a), _dl(lse_a), _dl(out_b), _dl(lse_b), _dl(out), _dl(lse),
                              stream=_stream(out_a))


def _merge_impl(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    _check_merge_inputs(out_a, lse_a, out_b, lse_b)
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    _merge_run(_last_dim_contiguous(out_a), _last_dim_contiguous(lse_a), _last_dim_contiguous(out_b),
               _last_dim_contiguous(lse_b), out, lse)
    return out, lse


merge_attention_states_op = torch.library.custom_op("flashattn::merge_attention_states", mutates_args=())(
    _merge_impl)


@merge_attention_states_op.register_fake
def _merge_fake(out_a, lse_a, out_b, lse_b):
    _check_merge_inputs(out_a, lse_a, out_b, lse_b)
    return (torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device),
            torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device))


def _merge_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _merge_backward(ctx, dout, dlse):
    """out = w_a·out_a + w_b·out_b with w_x = exp(lse_x - lse), lse = logaddexp(lse_a, lse_b):
    d out_x = w_x·dout and d lse_x = w_x·(dlse + Σ_c dout·(out_x - out)). A side of weight 0 gets 0. (Autograd
    hands both incoming gradients in, zeros for an output that took none.)"""
    out_a, lse_a, out_b, lse_b, out, lse = ctx.saved_tensors
    dout = dout.float()
    grads = []
    for o, l in ((out_a, lse_a), (out_b, lse_b)):
        w = torch.where(torch.isfinite(lse), torch.exp(l - lse), 0.0)
        w_rows = w.transpose(-1, -2).unsqueeze(-1)  # [b, h, s] -> [b, s, h, 1] ([h, t] -> [t, h, 1])
        d_lse = dlse.float() + (dout * (o.float() - out.float())).sum(-1).transpose(-1, -2)
        grads += [torch.where(w_rows > 0, dout * w_rows, 0.0).to(o.dtype), torch.where(w > 0, w * d_lse, 0.0)]
    return tuple(grads)


merge_attention_states_op.register_autograd(_merge_backward, setup_context=_merge_setup_context)


def _merge_inplace_impl(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    _check_merge_inputs(out_a, lse_a, out_b, lse_b)
    _merge_run(out_a, lse_a, _last_dim_contiguous(out_b), _last_dim_contiguous(lse_b), out_a, lse_a)


merge_attention_states_inplace_op = torch.library.custom_op(
    "flashattn::merge_attention_states_", mutates_args=("out_a", "lse_a"))(_merge_inplace_impl)


@merge_attention_states_inplace_op.register_fake
def _merge_inplace_fake(out_a, lse_a, out_b, lse_b):
    _check_merge_inputs(out_a, lse_a, out_b, lse_b)


def merge_attention_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets from the attention over each: (out_a, lse_a) over keys A,
    (out_b, lse_b) over keys B (e.g. a shared prefix and each sequence's suffix, or the splits of a long cache)
    give (out, lse) over A and B:

        lse = logaddexp(lse_a, lse_b),   out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b

    out_a / out_b: [batch, seqlen, heads, head_dim_v] (or varlen [total, heads, head_dim_v]) in float16,
    bfloat16 or float32 (any mix); lse_a / lse_b: float32 [batch, heads, seqlen] ([heads, total]), the layout
    flashattn's and flash_attn's forwards return. out has out_a's dtype. A side whose lse is -inf (no key) weighs 0
    and its out is not read; rows neither side saw give out 0 and lse -inf. One fused kernel (fp32 arithmetic) on
    CUDA; differentiable (out_a, out_b, lse_a, lse_b all get gradients)."""
    args = (out_a, lse_a, out_b, lse_b)
    _check_merge_inputs(*args)
    if _dispatch_free(*args) and not (torch.is_grad_enabled() and any(t.requires_grad for t in args)):
        return _merge_impl(*args)
    return torch.ops.flashattn.merge_attention_states(*args)


def merge_attention_states_(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """merge_attention_states accumulating into out_a and lse_a in place (no autograd): out_a and lse_a (any
    strides with the last dimension contiguous, e.g. a slice of a larger accumulator) become the merged out and
    lse."""
    args = (out_a, lse_a, out_b, lse_b)
    _check_merge_inputs(*args)
    if _dispatch_free(*args):
        _merge_inplace_impl(*args)
    else:
        torch.ops.flashattn.merge_attention_states_(*args)


# ---- the KV-cache operator (forward only) -----------------------------------------------------------------------
KV_INT_OPTIONS = ("max_seqlen_q", "causal", "window_left", "window_right", "rotary_interleaved", "num_splits",
                  "num_threads", "check_index_values", "attention_chunk")
KV_FLOAT_OPTIONS = ("softmax_scale", "softcap")


def kvcache_options(max_seqlen_q: int = 0, softmax_scale: float = 1.0, causal: bool = False, window_left: int = -1,
                    window_right: int = -1, softcap: float = 0.0, rotary_interleaved: bool = True,
                    num_splits: int = 0, num_threads: int = 0, check_index_values: bool = True, *,
                    attention_chunk: int = 0) -> Tuple[List[int], List[float]]:
    """attention_with_kvcache's (int_options, float_options), in the orders KV_INT_OPTIONS and KV_FLOAT_OPTIONS
    name. check_index_values=False skips the host-side check of the index values (it is skipped anyway while a CUDA
    graph is being captured)."""
    return ([int(max_seqlen_q), int(bool(causal)), int(window_left), int(window_right), int(bool(rotary_interleaved)),
             int(num_splits), int(num_threads), int(bool(check_index_values)), int(attention_chunk)],
            [float(softmax_scale), float(softcap)])


def _kvcache_native_options(int_options: List[int], float_options: List[float]) -> dict:
    if len(int_options) != len(KV_INT_OPTIONS) or len(float_options) != len(KV_FLOAT_OPTIONS):
        raise ValueError(f"int_options, float_options: expected {len(KV_INT_OPTIONS)} ints {KV_INT_OPTIONS} and "
                         f"{len(KV_FLOAT_OPTIONS)} floats {KV_FLOAT_OPTIONS}, got {len(int_options)} and "
                         f"{len(float_options)}")
    o = dict(zip(KV_INT_OPTIONS, int_options))
    o.update(zip(KV_FLOAT_OPTIONS, float_options))
    for flag in ("causal", "rotary_interleaved", "check_index_values"):
        o[flag] = bool(o[flag])
    return o


def _kvcache_outputs(q: Tensor, v_cache: Tensor, varlen: bool, out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    _check_rank("q", q, varlen)
    if v_cache.dim() != 4:
        raise ValueError(f"v_cache: expected a rank-4 tensor [batch_cache, seqlen_cache, heads_kv, dim] or, paged, "
                         f"[num_pages, page_size, heads_kv, dim], got shape {list(v_cache.shape)}")
    return _outputs_like(q, v_cache.shape[-1], varlen, out_dtype)


def _checked_slopes(alibi_slopes: Optional[Tensor]) -> Optional[Tensor]:
    """The ALiBi slopes with a contiguous last dim; CUDA slopes checked to be finite here (the library reads CPU
    slopes itself), which synchronises once per call, except under CUDA-graph capture, where it cannot."""
    if alibi_slopes is None:
        return None
    alibi_slopes = _last_dim_contiguous(alibi_slopes)
    if (alibi_slopes.is_cuda and alibi_slopes.dtype == torch.float32 and not _capturing(alibi_slopes)
            and not bool(torch.isfinite(alibi_slopes).all())):
        bad = alibi_slopes[~torch.isfinite(alibi_slopes)][0].item()
        raise ValueError(f"alibi_slopes: must be finite, got {bad}")
    return alibi_slopes


def _capturing(t: Tensor) -> bool:
    """Whether torch's current stream of t's device is being captured into a CUDA graph."""
    if t.device.type != "cuda":
        return False
    if t.device.index is None or t.device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(t.device):
        return torch.cuda.is_current_stream_capturing()


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _attention_with_kvcache_impl(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Optional[Tensor],
    v_new: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    block_table: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    cu_seqlens_k_new: Optional[Tensor],
    rotary_seqlens: Optional[Tensor],
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    out_dtype: torch.dtype,
    backend: str,
    qv: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Appends k_new / v_new to the caches in place (k_new rotated when rotary_cos / rotary_sin are given; packed
    [total_new, heads_kv, d] with cu_seqlens_k_new) and attends q over them: out [.., heads_q, d_v] in out_dtype
    (q's dtype, or 16 bits for float8_e4m3fn caches, scaled by the descales) and lse (fp32).
    Options as kvcache_options() builds them. qv: FA3's query-value term (attention's; not rotated), last with a
    default so that callers without it keep their positions.
    Inference only (no backward). The caches are written, never copied: their last dimension must be contiguous."""
    o = _kvcache_native_options(int_options, float_options)
    if _capturing(q):
        if cu_seqlens_q is not None and o["max_seqlen_q"] <= 0:
            raise ValueError(
                "max_seqlen_q: required (> 0) to capture varlen queries over a KV cache in a CUDA graph (without it "
                "the longest sequence is read off cu_seqlens_q on the host)")
        o["check_index_values"] = False  # no device-to-host copy inside a capture; the kernels clamp instead
    q, k_new, v_new, qv = (None if t is None else _last_dim_contiguous(t) for t in (q, k_new, v_new, qv))
    (rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, cu_seqlens_q,
     cu_seqlens_k_new, rotary_seqlens) = (
        _contiguous(t) for t in (rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens))
    alibi_slopes = _checked_slopes(alibi_slopes)
    out, lse = _kvcache_outputs(q, v_cache, cu_seqlens_q is not None, out_dtype)
    # The native module makes q's device current for the launch itself.
    _C.attention_with_kvcache(_dl(q), _dl(k_cache), _dl(v_cache), _dl(out), _dl(lse), _dl(k_new), _dl(v_new),
                              _dl(rotary_cos), _dl(rotary_sin), _dl(cache_seqlens), _dl(cache_batch_idx),
                              _dl(cache_leftpad), _dl(block_table), _dl(cu_seqlens_q), o.pop("max_seqlen_q"),
                              alibi_slopes=_dl(alibi_slopes), cu_seqlens_k_new=_dl(cu_seqlens_k_new),
                              rotary_seqlens=_dl(rotary_seqlens), backend=backend, stream=_stream(q),
                              q_descale=_dl(q_descale), k_descale=_dl(k_descale), v_descale=_dl(v_descale),
                              qv=_dl(qv), **o)
    return out, lse


attention_with_kvcache = torch.library.custom_op("flashattn::attention_with_kvcache",
                                                mutates_args=("k_cache", "v_cache"))(_attention_with_kvcache_impl)


@attention_with_kvcache.register_fake
def _attention_with_kvcache_fake(q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens,
                                 cache_batch_idx, cache_leftpad, block_table, cu_seqlens_q, alibi_slopes,
                                 cu_seqlens_k_new, rotary_seqlens, q_descale, k_descale, v_descale, int_options,
                                 float_options, out_dtype, backend, qv=None):
    return _kvcache_outputs(q, v_cache, cu_seqlens_q is not None, out_dtype)


# ---- Python entry points ------------------------------------------------------------------------------------------


def _check_tensor(name: str, t, *, floating: bool = True) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if floating and t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, paired: bool = False, fp8: bool = False) -> None:
    """q, k, v of one dtype (fp8: float8_e4m3fn, else a 16- to 64-bit float) and ranks, the cu_seqlens int32
    (paired: both or neither)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not fp8:
            _check_tensor(name, t)
        elif not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        elif t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name}: dtype {t.dtype}, but the FP8 path takes float8_e4m3fn q, k and v together")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    for name, t in (("q", q), ("k", k), ("v", v)):  # before anything reads the head dim off a shape
        _check_rank(name, t, varlen)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t is not None:
            _check_tensor(name, t, floating=False)
            if t.dtype != torch.int32:
                raise TypeError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    if paired and (cu_seqlens_q is None) != (cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: cu_seqlens_q and cu_seqlens_k must be given together")


FLOAT32_MAX = 3.4028234663852886e38  # the library carries softmax_scale and softcap as float
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def check_flag(name: str, value) -> bool:
    """A boolean option: True / False (0 / 1 and numpy booleans too). Anything else is a TypeError naming it, not
    a truthiness test: causal="no" or None would otherwise silently mean True or False."""
    if value is True or value is False:
        return value
    if not isinstance(value, (str, bytes, Tensor)):
        try:
            if value == 0 or value == 1:
                return bool(value)
        except Exception:  # noqa: BLE001 - whatever it is, it is not a flag
            pass
    raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")


def check_integer(name: str, value, lo: int, hi: int) -> int:
    """An integer option in [lo, hi] (Python ints and anything with __index__, not floats)."""
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None
    if not lo <= value <= hi:
        bound = f">= {lo}" if hi == INT64_MAX else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def check_real(name: str, value) -> float:
    """A real-valued option as a Python float; NaN and infinities are left to the caller's range checks."""
    if type(value) is float:
        return value
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}") from None


def resolve_scale(softmax_scale: Optional[float], head_dim: int, name: str = "softmax_scale",
                  tensor_name: str = "q") -> float:
    """softmax_scale, or 1/sqrt(head_dim) when None. `name` / `tensor_name` are the caller's names for the scale
    and for the tensor whose last dimension is the head dim (SDPA: "scale", "query")."""
    if softmax_scale is None:
        if head_dim < 1:
            raise ValueError(f"{tensor_name}: head dim must be >= 1, got {head_dim}")
        return head_dim ** -0.5
    scale = check_real(name, softmax_scale)
    if scale != scale or abs(scale) > FLOAT32_MAX:
        raise ValueError(f"{name}: must be finite (and within float32 range), got {softmax_scale}")
    if scale <= 0:
        raise NotImplementedError(f"{name}: only positive scales are supported, got {softmax_scale}")
    return scale


def check_softcap(softcap) -> float:
    """The library's softcap: 0 = off, else a finite positive float32 value."""
    cap = check_real("softcap", softcap)
    if not 0.0 <= cap <= FLOAT32_MAX:  # NaN fails this too
        raise ValueError(f"softcap: must be finite (and within float32 range) and >= 0, got {softcap}")
    return cap


def window_edge(name: str, value, q: Tensor, k: Tensor) -> int:
    """A window edge: -1 = unbounded, else the number of keys beyond the diagonal. An edge of at least every
    sequence length is unbounded; such edges above int32 are passed as -1, so that they run the unmasked kernels
    and edges beyond int64 (which the library cannot take) are not an error."""
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None
    # (dim -3 is the row dimension of both layouts, [b, s, h, d] and [total, h, d]; the shapes are read only here
    # so that torch.compile does not guard on them for ordinary windows)
    if value > INT32_MAX and q.dim() >= 3 and k.dim() >= 3 and value >= max(q.shape[-3], k.shape[-3]):
        return -1
    if not -1 <= value <= INT64_MAX:
        raise ValueError(f"{name}: must be >= -1 (-1 = unbounded), got {value}")
    return value


def check_chunk(attention_chunk) -> int:
    """attention_chunk: 0 = off, else the keys are cut into chunks of that many and a query row sees only the chunk
    holding its (bottom-right aligned) diagonal. A chunk past int64 is as wide as int64's largest (both hold every
    key of any sequence)."""
    if type(attention_chunk) is not int:
        try:
            attention_chunk = operator.index(attention_chunk)
        except TypeError:
            raise TypeError(f"attention_chunk: expected an integer, got {type(attention_chunk).__name__} "
                            f"{attention_chunk!r}") from None
    if attention_chunk < 0:
        raise ValueError(f"attention_chunk: must be >= 0 (0 = off), got {attention_chunk}")
    return min(attention_chunk, INT64_MAX)


def _check_options(q: Tensor, k: Tensor, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap,
                   deterministic):
    """The options shared by attention and choose_backend, checked and normalised (one error naming each)."""
    return (check_integer("max_seqlen_q", max_seqlen_q, 0, INT64_MAX),
            check_integer("max_seqlen_k", max_seqlen_k, 0, INT64_MAX), check_flag("causal", causal),
            window_edge("window_left", window_left, q, k), window_edge("window_right", window_right, q, k),
            check_softcap(softcap), check_flag("deterministic", deterministic))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    generator: Optional[torch.Generator] = None,
    deterministic: bool = False,
    backend: str = "auto",
    num_threads: int = 0,
    attention_chunk: int = 0,
    qv: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Exact attention in the library's own terms; returns (out, lse).

    Padded: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v] -> out [b, s_q, h_q, d_v],
    lse [b, h_q, s_q]. Varlen (cu_seqlens_q/k int32 [b + 1]): [total, h, d] -> out [total_q, h_q, d_v],
    lse [h_q, total_q]. Causal and the window are aligned bottom-right (flash_attn >= 2.1); -1 = unbounded.
    alibi_slopes: fp32 [h_q] or [b, h_q] on q's device: query i's score for key j gains
    -slope · |i + s_k - s_q - j| (flash_attn's ALiBi; the slopes get no gradient). dropout_p in [0, 1): attention
    dropout with a seed drawn from `generator` (default: torch's default generator of q's device). `backend` forces
    one backend by name ("auto" dispatches); num_threads bounds the CPU backends (0 = all). attention_chunk > 0:
    chunked attention (FA3's attention_chunk; check_chunk). qv (FA3's; like q with d_v columns, q's dtype): each
    score becomes scale · (q·k + qv·v), scale defaulting to 1/sqrt(d + d_v) (DeepSeek MLA's absorbed form); CPU
    backends, forward only (a backward through it raises NotImplementedError).
    """
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, paired=True)
    if qv is not None:
        _check_qv(qv, q)
    max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap, deterministic, num_threads = (
        _call_options(q, k, softmax_scale, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap,
                      deterministic, num_threads, qv_dim=0 if qv is None else v.shape[-1]))
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    dropout_p = _check_dropout_p(dropout_p)
    seed, offset, rng = _dropout_key(q, generator) if dropout_p > 0 else (0, 0, None)
    ints, floats = op_options(max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap,
                              deterministic, num_threads, dropout_p, seed, offset,
                              attention_chunk=check_chunk(attention_chunk))
    _check_slopes_type(alibi_slopes)
    return _call_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng, ints, floats, str(backend), qv)


def _check_qv(qv, q: Tensor) -> None:
    """FA3's qv: a tensor in q's dtype (its shape and device are the library's to check). float8 q: left to the
    library, which says that the combination is not supported."""
    _check_tensor("qv", qv, floating=q.dtype != torch.float8_e4m3fn)
    if qv.dtype != q.dtype:
        raise TypeError(f"qv: dtype {qv.dtype} differs from q's {q.dtype}")


def _check_descale_types(**descales: Optional[Tensor]) -> None:
    for name, t in descales.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor (float32, (batch, nheads_k)) or None, got "
                            f"{type(t).__name__}")


def fp8_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
    num_threads: int = 0,
    attention_chunk: int = 0,
) -> Tuple[Tensor, Tensor]:
    """attention() of float8_e4m3fn q, k, v (FA3's FP8 forward): each scaled by its optional fp32 descale factors
    [batch, heads_kv] (query head h of sequence b by q_descale[b, h // (heads_q // heads_kv)]); out in out_dtype
    (bfloat16 or float16), lse fp32. Forward only: CPU tensors on the CPU backends, CUDA tensors on the Hopper
    kernel (cuda_sm90, compute capability 9.0; other GPUs report it unsupported, with the reason)."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, paired=True, fp8=True)
    _check_descale_types(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if out_dtype not in FP8_OUT_DTYPES:
        raise ValueError(f"out_dtype: float8_e4m3fn inputs write bfloat16 or float16, got {out_dtype}")
    options = _call_options(q, k, softmax_scale, max_seqlen_q, max_seqlen_k, causal, window_left, window_right,
                            softcap, False, num_threads)
    ints, floats = op_options(*options, attention_chunk=check_chunk(attention_chunk))
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale, v_descale, ints, floats, out_dtype,
            str(backend))
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale, v_descale)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        # As FA3's forward: it runs; out requires grad, and its backward says why there is none.
        return _Fp8ForwardOnly.apply(*args)
    if _dispatch_free(*tensors):
        return _attention_forward_fp8_impl(*args)
    return torch.ops.flashattn.attention_forward_fp8(*args)


def fp8_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    do_descale: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    deterministic: bool = False,
    backend: str = "auto",
    num_threads: int = 0,
    attention_chunk: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward of fp8_attention: float8_e4m3fn dout (scaled by do_descale, fp32 [batch, heads_kv] like
    q_descale) with the forward's float8 q, k, v, their descales, out and lse. Returns dq, dk, dv in out's dtype:
    the gradients of the dequantised inputs (each e4m3 value times its descale). An explicit call, not autograd:
    PyTorch gives a float8 tensor float8 gradients. CPU tensors run on the CPU backends, CUDA tensors on Hopper
    (cuda_sm90: 16-bit copies of the inputs, Q's and K's descales applied to the scores, then the 16-bit backward
    kernel; other GPUs report it unsupported). Not with ALiBi or dropout on CUDA."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, paired=True, fp8=True)
    for name, t in (("dout", dout), ("out", out), ("lse", lse)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dout.dtype != torch.float8_e4m3fn:
        raise TypeError(f"dout: dtype {dout.dtype}, but the FP8 backward takes float8_e4m3fn dout with q, k, v")
    if out.dtype not in FP8_OUT_DTYPES:
        raise TypeError(f"out: float8_e4m3fn inputs' output is bfloat16 or float16, got {out.dtype}")
    _check_descale_types(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, do_descale=do_descale)
    options = _call_options(q, k, softmax_scale, max_seqlen_q, max_seqlen_k, causal, window_left, window_right,
                            softcap, deterministic, num_threads)
    o = _native_options(*op_options(*options, attention_chunk=check_chunk(attention_chunk)))
    for name in ("dropout_p", "dropout_seed", "dropout_offset"):
        o.pop(name)
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    dq, dk, dv = (torch.empty(t.shape, dtype=out.dtype, device=t.device) for t in (q, k, v))
    _C.backward(_dl(dout), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dq), _dl(dk), _dl(dv),
                _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"), o.pop("max_seqlen_k"),
                q_descale=_dl(q_descale), k_descale=_dl(k_descale), v_descale=_dl(v_descale),
                do_descale=_dl(do_descale), backend=str(backend), stream=_stream(q), **o)
    return dq, dk, dv


def _call_options(q, k, softmax_scale, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap,
                  deterministic, num_threads, qv_dim: int = 0):
    """(scale, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic,
    num_threads), checked: op_options' leading arguments. qv_dim: qv's columns, which the default scale counts."""
    scale = resolve_scale(softmax_scale, q.shape[-1] + qv_dim)
    checked = _check_options(q, k, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap,
                             deterministic)
    max_q, max_k, causal, left, right, softcap, deterministic = checked
    return (max_q, max_k, scale, causal, left, right, softcap, deterministic,
            check_integer("num_threads", num_threads, 0, INT32_MAX))


def _check_dropout_p(dropout_p) -> float:
    p = check_real("dropout_p", dropout_p)
    if not 0.0 <= p < 1.0:  # NaN fails this too
        raise ValueError(f"dropout_p: must be in [0, 1), got {dropout_p}")
    return p


def _dropout_key(q: Tensor, generator: Optional[torch.Generator]) -> Tuple[int, int, Optional[Tensor]]:
    """(seed, offset, rng) of one call's dropout mask, from `generator` (or torch's default generator of q's
    device), which it advances: torch.manual_seed makes calls reproducible, and each call draws a fresh mask.
    Eager: a CPU generator gives a 63-bit seed drawn from it (offset 0); a CUDA generator its seed and Philox offset,
    which is advanced by 4 as PyTorch's own kernels do (no device synchronisation); rng is None. Inside CUDA-graph
    capture and torch.compile the host cannot read the generator (each replay must draw afresh, a compiled graph
    must not bake a seed in): there rng is int64 [2] {seed, offset} drawn on q's device by torch.randint from the
    same generator (graph-safe: every replay draws new values into it), which the kernels read instead."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    cpu = q.device.type == "cpu"
    index = 0 if cpu else q.device.index if q.device.index is not None else torch.cuda.current_device()
    if generator is not None and (generator.device.type != q.device.type or
                                  (not cpu and (generator.device.index or 0) != index)):
        raise ValueError(f"generator: on {generator.device}, but q is on {q.device}")
    if torch.compiler.is_compiling() or (not cpu and _capturing(q)):
        # Both words random (the mask is keyed by their sum): 62 bits each, so the sum stays below 2^63.
        return 0, 0, torch.randint(0, 2**62, (2,), generator=generator, dtype=torch.int64, device=q.device)
    if cpu:
        return int(torch.randint(0, 2**63 - 1, (1,), generator=generator, dtype=torch.int64).item()), 0, None
    gen = generator if generator is not None else torch.cuda.default_generators[index]
    offset = gen.get_offset()
    gen.set_offset(offset + 4)
    return gen.initial_seed() & (2**63 - 1), offset, None


def _check_slopes_type(alibi_slopes) -> None:
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, Tensor):
        raise TypeError(f"alibi_slopes: expected a torch.Tensor (float32, (nheads,) or (batch, nheads)) or None, "
                        f"got {type(alibi_slopes).__name__}")
    if alibi_slopes.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError("alibi_slopes: gradients with respect to the slopes are not supported (they are "
                                  "constants, as in flash_attn); pass a tensor that does not require grad "
                                  "(alibi_slopes.detach())")


def _check_index(name: str, t) -> None:
    """An optional int32 index tensor (cache_seqlens, cu_seqlens_q, block_table, ...)."""
    if t is not None:
        _check_tensor(name, t, floating=False)
        if t.dtype != torch.int32:
            raise TypeError(f"{name}: dtype must be torch.int32, got {t.dtype}")


def _cache_window_edge(name: str, value, rows: Optional[int]) -> int:
    """A window edge of a KV-cache call: -1 = unbounded. An edge of at least max(query rows, cache capacity)
    cannot mask any key, so it is passed as -1 (as flash_attn does with edges past the cache), which also keeps
    edges beyond int64 from being an error."""
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None
    if value < -1:
        raise ValueError(f"{name}: must be >= -1 (-1 = unbounded), got {value}")
    if rows is not None and value >= rows:
        return -1
    return min(value, INT64_MAX)


def _renamed(e: Exception, names: dict) -> Exception:
    """e with the library's argument names replaced by the caller's (k_new -> k). Keys are regular expressions
    matched at word boundaries, replaced in order (so more specific phrasings may come first)."""
    message = str(e)
    for ours, theirs in names.items():
        message = re.sub(rf"\b{ours}(?![A-Za-z0-9_])", theirs, message)
    return type(e)(message)


def kvcache_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    k_new: Optional[Tensor] = None,
    v_new: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    num_splits: int = 0,
    alibi_slopes: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    rotary_seqlens: Optional[Tensor] = None,
    backend: str = "auto",
    num_threads: int = 0,
    check_index_values: bool = True,
    names: Optional[dict] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    attention_chunk: int = 0,
    qv: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Attention over a KV cache in the library's own terms (flash_attn_with_kvcache's semantics); returns (out, lse).

    k_cache / v_cache: dense [b_cache, s_cache, h_kv, d] or, with block_table (int32 [entries, max_pages]), paged
    [num_pages, page_size, h_kv, d]. k_new / v_new [b, s_new, h_kv, d] are written into the caches in place at rows
    cache_seqlens[b] ... (k_new rotated by rotary_cos / rotary_sin [s_ro, rotary_dim / 2], and q too: at
    r + i when causal or windowed, else at r, r = rotary_seqlens[b] if given, else cache_seqlens[b]; new row i at
    r + i). With cu_seqlens_k_new (int32 [b + 1]) k_new / v_new are packed [total_new, h_kv, d], sequence b's rows
    being cu_seqlens_k_new[b] ... cu_seqlens_k_new[b + 1] - 1. cache_seqlens: int32 [b] or an int;
    cache_batch_idx, cache_leftpad, rotary_seqlens: int32 [b]. q [b, s_q, h_q, d] -> out [b, s_q, h_q, d_v], lse
    [b, h_q, s_q]; varlen q [total_q, h_q, d] with cu_seqlens_q -> lse [h_q, total_q]. Inference only.
    check_index_values=False skips reading cache_seqlens / cache_leftpad / cache_batch_idx / cu_seqlens_k_new /
    rotary_seqlens (and cu_seqlens_q when max_seqlen_q > 0) on the host, a device synchronisation each on CUDA: the
    kernels then clamp out-of-range values (nothing outside the tensors is read or written) instead of raising.
    It is off anyway under CUDA-graph capture.
    `names` maps the library's argument names to the caller's, for error messages (see _renamed).
    float8_e4m3fn q, caches and new rows (FA3's FP8 KV cache): q_descale / k_descale / v_descale fp32 [b, h_kv] as
    in fp8_attention (k / v descales for every row of sequence b's cache), out in out_dtype (bfloat16 by default, or
    float16). With rotary_cos / rotary_sin (e4m3 tables, as FA3 takes them) the e4m3 k_new rows and q are rotated in
    fp32 and stored back in e4m3 (to nearest even, saturating at +-448, as FA3's kernels do). Other dtypes: out in
    q's dtype.
    attention_chunk > 0: chunked attention over the cache's keys (after cache_leftpad; q rotated per row as with a
    window). qv: like q with d_v columns, as in `attention` (scale defaulting to 1/sqrt(d + d_v); not rotated).
    """
    names = names or {}
    name = lambda n: names.get(n, n)  # noqa: E731
    fp8 = isinstance(q, Tensor) and q.dtype == torch.float8_e4m3fn
    _check_tensor(name("q"), q, floating=not fp8)
    for n, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new),
                 ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if t is None and n not in ("k_cache", "v_cache"):
            continue
        _check_tensor(name(n), t, floating=not fp8)
        if t.dtype != q.dtype:
            raise TypeError(f"{name(n)}: dtype {t.dtype} differs from q's {q.dtype}")
    _check_descale_types(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if fp8:
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if out_dtype not in FP8_OUT_DTYPES:
            raise ValueError(f"out_dtype: float8_e4m3fn caches write bfloat16 or float16, got {out_dtype}")
    elif out_dtype is not None and out_dtype != q.dtype:
        raise ValueError(f"out_dtype: only float8_e4m3fn caches take one (out is q's dtype), got {out_dtype}")
    else:
        out_dtype = q.dtype
    if isinstance(cache_seqlens, Tensor) or cache_seqlens is None:
        _check_index(name("cache_seqlens"), cache_seqlens)
    else:
        # flash_attn: an int is every sequence's length. Filled on the device, no host synchronisation.
        length = check_integer(name("cache_seqlens"), cache_seqlens, 0, INT32_MAX)
        # One length per sequence: the batch is q's first dim, or cu_seqlens_q's entries - 1 for varlen queries.
        if isinstance(cu_seqlens_q, Tensor) and cu_seqlens_q.dim() == 1:
            batch = max(cu_seqlens_q.shape[0] - 1, 0)
        else:
            batch = q.shape[0] if q.dim() else 0
        cache_seqlens = torch.full((batch,), length, dtype=torch.int32, device=q.device)
    for n, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                 ("block_table", block_table), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k_new", cu_seqlens_k_new),
                 ("rotary_seqlens", rotary_seqlens)):
        _check_index(name(n), t)
    if qv is not None:
        _check_qv(qv, q)
    score_dim = (q.shape[-1] if q.dim() else 0) + (v_cache.shape[-1] if qv is not None and v_cache.dim() else 0)
    scale = resolve_scale(softmax_scale, score_dim)
    # Rows that bound every mask edge: the query rows and the cache's capacity (dense rows, or pages x page size).
    rows = None
    if q.dim() >= 3 and k_cache.dim() == 4 and (block_table is None or block_table.dim() == 2):
        capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
        rows = max(q.shape[-3], capacity)
    ints, floats = kvcache_options(
        check_integer("max_seqlen_q", max_seqlen_q, 0, INT64_MAX), scale, check_flag("causal", causal),
        _cache_window_edge("window_left", window_left, rows), _cache_window_edge("window_right", window_right, rows),
        check_softcap(softcap), check_flag("rotary_interleaved", rotary_interleaved),
        check_integer("num_splits", num_splits, 0, 256), check_integer("num_threads", num_threads, 0, INT32_MAX),
        check_flag("check_index_values", check_index_values), attention_chunk=check_chunk(attention_chunk))
    # Inference only, as in flash_attn: the outputs never require grad (no graph is recorded through the call; the
    # detached caches share their storage and version counter, so the in-place append stays visible to autograd).
    q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, qv = (
        t.detach() if t is not None and t.requires_grad else t
        for t in (q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, qv))
    _check_slopes_type(alibi_slopes)
    args = (q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, cu_seqlens_q, alibi_slopes, cu_seqlens_k_new, rotary_seqlens, q_descale, k_descale, v_descale,
            ints, floats, out_dtype, str(backend))
    if qv is not None:  # the operator's last argument, only when given (as in _call_forward)
        args += (qv,)
    call = _direct_kvcache if _dispatch_free(*args[:18], qv) else torch.ops.flashattn.attention_with_kvcache
    if not names or torch.compiler.is_compiling():
        return call(*args)
    try:
        return call(*args)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise _renamed(e, names) from None


def _direct_kvcache(*args):
    """attention_with_kvcache without the dispatcher (_dispatch_free): the caches' version counters move as the
    operator's declared mutation moves them, so autograd still sees the in-place append."""
    out = _attention_with_kvcache_impl(*args)
    torch.autograd.graph.increment_version(args[1])
    torch.autograd.graph.increment_version(args[2])
    return out


class BackendChoice(NamedTuple):
    backend: str     # the backend the dispatcher picks (or the requested one)
    supported: bool  # False: nothing can run this call; `reason` says why
    reason: str


def choose_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    backward: bool = False,
    deterministic: bool = False,
    backend: str = "auto",
    attention_chunk: int = 0,
) -> BackendChoice:
    """Which backend `attention` would run for these arguments (backward=True: for the backward, with
    `deterministic` as given to `attention`), and why. float8_e4m3fn q, k, v: `fp8_attention`'s choice."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, fp8=isinstance(q, Tensor) and q.dtype == torch.float8_e4m3fn)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic = _check_options(
        q, k, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic)
    backward = check_flag("backward", backward)
    dropout_p = _check_dropout_p(dropout_p)
    _check_slopes_type(alibi_slopes)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    alibi_slopes = None if alibi_slopes is None else _last_dim_contiguous(alibi_slopes)
    name, ok, reason = _C.choose_backend(
        _dl(q), _dl(k), _dl(v), None, _dl(cu_seqlens_q), _dl(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
        softmax_scale=scale, causal=causal, window_left=window_left, window_right=window_right,
        attention_chunk=check_chunk(attention_chunk), softcap=softcap, backward=backward, deterministic=deterministic,
        alibi_slopes=_dl(alibi_slopes), dropout_p=dropout_p, backend=str(backend), stream=_stream(q))
    return BackendChoice(name, ok, reason)
