"""PyTorch operators over the native module: ``flashattn::attention_forward`` / ``attention_backward``.

Both are ``torch.library.custom_op`` operators with no mutated arguments: the outputs are allocated here by torch
on the inputs' device (the same allocation code runs under FakeTensor for ``register_fake``, so real and fake
outputs agree on shape, dtype and strides). Autograd goes through ``register_autograd``: the forward saves
q, k, v, out and lse, the backward calls ``attention_backward``. Both work in eager mode, under autograd and in
``torch.compile(fullgraph=True)`` without graph breaks.

CUDA: the kernels run on torch's current stream of the inputs' device, passed to the native module as an
integer. Tensors are exported with ``to_dlpack`` (no cross-stream synchronisation) and the padded path performs
no host synchronisation, so CUDA graph capture works. The varlen path validates cu_seqlens on the
host, which copies them from the device (not capturable).
"""

from __future__ import annotations

import operator
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C

__all__ = ["attention", "choose_backend", "BackendChoice"]


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


def _forward_outputs(q: Tensor, v: Tensor, varlen: bool) -> Tuple[Tensor, Tensor]:
    _check_rank("q", q, varlen)
    _check_rank("v", v, varlen)
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    if varlen:
        lse_shape = (q.shape[1], q.shape[0])  # [heads_q, total_q]
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])  # [batch, heads_q, seqlen_q]
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return out, lse


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
INT_OPTIONS = ("max_seqlen_q", "max_seqlen_k", "causal", "window_left", "window_right", "deterministic", "num_threads")
FLOAT_OPTIONS = ("softmax_scale", "softcap")


def op_options(max_seqlen_q: int = 0, max_seqlen_k: int = 0, softmax_scale: float = 1.0, causal: bool = False,
               window_left: int = -1, window_right: int = -1, softcap: float = 0.0, deterministic: bool = False,
               num_threads: int = 0) -> Tuple[List[int], List[float]]:
    """The operators' (int_options, float_options), in the orders INT_OPTIONS and FLOAT_OPTIONS name."""
    return ([int(max_seqlen_q), int(max_seqlen_k), int(bool(causal)), int(window_left), int(window_right),
             int(bool(deterministic)), int(num_threads)], [float(softmax_scale), float(softcap)])


def _native_options(int_options: List[int], float_options: List[float]) -> dict:
    if len(int_options) != len(INT_OPTIONS) or len(float_options) != len(FLOAT_OPTIONS):
        raise ValueError(f"int_options, float_options: expected {len(INT_OPTIONS)} ints {INT_OPTIONS} and "
                         f"{len(FLOAT_OPTIONS)} floats {FLOAT_OPTIONS}, got {len(int_options)} and {len(float_options)}")
    o = dict(zip(INT_OPTIONS, int_options))
    o.update(zip(FLOAT_OPTIONS, float_options))
    o["causal"] = bool(o["causal"])
    o["deterministic"] = bool(o["deterministic"])
    return o


@torch.library.custom_op("flashattn::attention_forward", mutates_args=())
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    backend: str,
) -> Tuple[Tensor, Tensor]:
    """out [.., heads_q, d_v] and lse (fp32) of softmax(q kᵀ · scale) v; options as op_options() builds them.
    `deterministic` only travels to the backward (the forward is always deterministic)."""
    o = _native_options(int_options, float_options)
    del o["deterministic"]
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    out, lse = _forward_outputs(q, v, cu_seqlens_q is not None)
    # The native module makes q's device current for the launch itself.
    _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"),
               o.pop("max_seqlen_k"), backend=backend, stream=_stream(q), **o)
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, int_options, float_options, backend):
    return _forward_outputs(q, v, cu_seqlens_q is not None)


@torch.library.custom_op("flashattn::attention_backward", mutates_args=())
def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    int_options: List[int],
    float_options: List[float],
    backend: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of attention_forward given dout and the forward's out and lse; the forward's options."""
    o = _native_options(int_options, float_options)
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    dq, dk, dv = _backward_outputs(q, k, v)
    _C.backward(_dl(dout), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dq), _dl(dk), _dl(dv),
                _dl(cu_seqlens_q), _dl(cu_seqlens_k), o.pop("max_seqlen_q"), o.pop("max_seqlen_k"), backend=backend,
                stream=_stream(q), **o)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, int_options, float_options,
                             backend):
    return _backward_outputs(q, k, v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = inputs[5:]  # int_options, float_options, backend: the backward op takes them as they are
    # The log-sum-exp is an auxiliary output (as in flash_attn): no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                        *ctx.options)
    return (dq, dk, dv) + (None,) * 5


attention_forward.register_autograd(_backward, setup_context=_setup_context)


# ---- Python entry points ------------------------------------------------------------------------------------------


def _check_tensor(name: str, t, *, floating: bool = True) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if floating and t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    _check_tensor("q", q)
    _check_tensor("k", k)
    _check_tensor("v", v)
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
    deterministic: bool = False,
    backend: str = "auto",
    num_threads: int = 0,
) -> Tuple[Tensor, Tensor]:
    """Exact attention in the library's own terms; returns (out, lse).

    Padded: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v] -> out [b, s_q, h_q, d_v],
    lse [b, h_q, s_q]. Varlen (cu_seqlens_q/k int32 [b + 1]): [total, h, d] -> out [total_q, h_q, d_v],
    lse [h_q, total_q]. Causal and the window are aligned bottom-right (flash_attn >= 2.1); -1 = unbounded.
    `backend` forces one backend by name ("auto" dispatches); num_threads bounds the CPU backends (0 = all).
    """
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: cu_seqlens_q and cu_seqlens_k must be given together")
    scale = resolve_scale(softmax_scale, q.shape[-1])
    max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic = _check_options(
        q, k, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic)
    num_threads = check_integer("num_threads", num_threads, 0, INT32_MAX)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    ints, floats = op_options(max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap,
                              deterministic, num_threads)
    return torch.ops.flashattn.attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, ints, floats, str(backend))


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
    backward: bool = False,
    deterministic: bool = False,
    backend: str = "auto",
) -> BackendChoice:
    """Which backend `attention` would run for these arguments (backward=True: for the backward, with
    `deterministic` as given to `attention`), and why."""
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic = _check_options(
        q, k, max_seqlen_q, max_seqlen_k, causal, window_left, window_right, softcap, deterministic)
    backward = check_flag("backward", backward)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    name, ok, reason = _C.choose_backend(
        _dl(q), _dl(k), _dl(v), None, _dl(cu_seqlens_q), _dl(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
        softmax_scale=scale, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
        backward=backward, deterministic=deterministic, backend=str(backend), stream=_stream(q))
    return BackendChoice(name, ok, reason)
