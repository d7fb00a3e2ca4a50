"""flashattn as an attention backend of Hugging Face transformers (its AttentionInterface and mask interface).

    import flashattn                                   # registers the backend once transformers is imported
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")
    model.set_attn_implementation("fattn")             # or switch a loaded model

The name is "fattn", not "flashattn": transformers routes every implementation whose name contains "flash" to its
own flash_attn / hub-kernel loader (utils.generic.is_flash_attention_requested), which refuses a name it cannot
load, so a registered "flashattn" never reaches our function.

What it runs: the model's causal or bidirectional attention with GQA, the softmax scale, the sliding window
(`sliding_window`, Mistral and Gemma 2/3's local layers) and softcap (Gemma 2) the model passes, dropout in
training, through flashattn's custom ops (CPU or CUDA, autograd and torch.compile). Padded batches (a 2-D
attention mask) are unpadded into the varlen path and padded back; packed sequences (position_ids restarting
within one row, or transformers' cu_seq_lens_* / max_length_* keywords) run varlen too; generate() works with
transformers' caches (the keys arrive with the cache prepended; causal masks align to the last key).
What it cannot do raises NotImplementedError naming it: a 4-D (arbitrary) attention mask, mask patterns other than
causal / bidirectional / sliding window / padding / packing (chunked attention, image-token blocks, custom mask
functions), attention sinks (s_aux), position biases, the paged continuous-batching cache.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Optional

import torch

from ..flash_attn_interface import flash_attn_func, flash_attn_varlen_func

NAME = "fattn"

__all__ = ["NAME", "attention_forward", "attention_mask", "register"]


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"flashattn transformers backend ({NAME!r}): {what} is not supported")


# ---- the mask interface: which patterns our kernels express ----

def _closure_values(fn) -> list:
    return [c.cell_contents for c in (fn.__closure__ or ())]


def _mask_parts(fn, parts: set) -> None:
    """Adds to `parts` the kinds of the mask function's pieces; raises for a piece we cannot express."""
    qualname = getattr(fn, "__qualname__", repr(fn))
    top = qualname.split(".<locals>.")[0]
    if top in ("and_masks", "or_masks"):
        if top == "or_masks":  # a union widens the pattern beyond one band per row
            raise _unsupported(f"the mask function {qualname} (a union of mask patterns)")
        for value in _closure_values(fn):
            for part in value if isinstance(value, tuple) else (value,):
                if callable(part):
                    _mask_parts(part, parts)
        return
    known = {
        "causal_mask_function": "causal",
        "bidirectional_mask_function": "bidirectional",
        "sliding_window_overlay": "sliding_window",
        "sliding_window_bidirectional_overlay": "sliding_window",
        "padding_mask_function": "padding",
        "packed_sequence_mask_function": "packing",
    }
    if top == "remap_positions_for_packed_sequence":  # positions renumbered per packed sequence: varlen
        parts.add("packing")
        for value in _closure_values(fn):
            if callable(value):
                _mask_parts(value, parts)
        return
    if top not in known:
        raise _unsupported(f"the mask function {qualname}")
    parts.add(known[top])


def attention_mask(batch_size: int, *sizes, kv_length: Optional[int] = None, mask_function=None,
                   attention_mask: Optional[torch.Tensor] = None, **kwargs):
    """The mask interface's function: the 2-D padding mask (sliced to the keys) or None, as for flash_attn.

    transformers calls it with keywords; positionally its second size is kv_length in every version since 5.0
    ((q_length | cache_position), kv_length, ...). The causal / window structure comes from the attention
    module's arguments; this only checks that the model's mask pattern is one of those (anything else raises
    NotImplementedError naming the mask function)."""
    if kv_length is None:
        kv_length = sizes[1]
    if mask_function is not None:
        _mask_parts(mask_function, set())
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            attention_mask = None
    return attention_mask


# ---- the attention interface ----

def _window(sliding_window: Optional[int], causal: bool) -> tuple:
    if sliding_window is None:
        return (-1, -1)
    sliding_window = int(sliding_window)
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    # transformers' masks: causal layers see keys j with i - j < W (sliding_window_overlay), bidirectional ones
    # |i - j| <= W (sliding_window_bidirectional_overlay).
    return (sliding_window - 1, 0) if causal else (sliding_window, sliding_window)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _packed_lengths(position_ids: Optional[torch.Tensor], batch: int) -> Optional[torch.Tensor]:
    """Sequence lengths of one row packing several sequences (positions restart at their minimum), else None."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    bounds = torch.cat([starts, torch.tensor([pos.numel()], device=starts.device)])
    return bounds.diff().to(torch.int32)


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **kw)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None, **kwargs):
    """transformers' attention function signature: query [b, h_q, s_q, d], key / value [b, h_kv, s_k, d(_v)];
    returns (output [b, s_q, h_q, d_v], None)."""
    if s_aux is not None:
        raise _unsupported("s_aux (attention sinks)")
    if kwargs.get("position_bias") is not None:
        raise _unsupported("position_bias (an additive score bias)")
    if kwargs.get("block_table") is not None:
        raise _unsupported("block_table (the paged continuous-batching cache)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise _unsupported(f"an attention_mask of {attention_mask.dim()} dims (an arbitrary mask; 2-D padding "
                           "masks are supported)")
    # transformers passes is_causal where the layer's mask differs from the module's default (config.is_causal
    # False switches a decoder to bidirectional masks, and passes is_causal=False).
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    batch, _, s_q, _ = query.shape
    s_k = key.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
        q, k, v = (t.to(dtype) for t in (q, k, v))
    kw = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling, causal=causal,
              window_size=_window(sliding_window, causal), softcap=float(softcap or 0.0))
    heads, dv = q.shape[2], v.shape[-1]

    if attention_mask is not None:
        keys_kept = attention_mask[:, -s_k:].to(torch.bool)
        lens_k = keys_kept.sum(-1, dtype=torch.int32)
        idx_k = keys_kept.reshape(-1).nonzero().reshape(-1)
        if s_q == s_k:
            idx_q, lens_q = idx_k, lens_k
        elif s_q == 1:  # one new token per sequence (decoding): always a real one
            idx_q = torch.arange(batch, device=q.device)
            lens_q = torch.ones(batch, dtype=torch.int32, device=q.device)
        else:
            queries_kept = keys_kept[:, -s_q:]
            lens_q = queries_kept.sum(-1, dtype=torch.int32)
            idx_q = queries_kept.reshape(-1).nonzero().reshape(-1)
        out = _varlen(q.reshape(batch * s_q, heads, -1)[idx_q], k.reshape(batch * s_k, k.shape[2], -1)[idx_k],
                      v.reshape(batch * s_k, v.shape[2], -1)[idx_k], _cu_seqlens(lens_q), _cu_seqlens(lens_k),
                      lens_q.max(), lens_k.max(), **kw)
        padded = out.new_zeros(batch * s_q, heads, dv).index_copy(0, idx_q, out)
        return padded.view(batch, s_q, heads, dv), None

    # Rows packing several sequences: transformers' cu_seq_lens_* / max_length_* keywords, or position_ids that
    # restart within the row.
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = cu_q.diff().max() if max_q is None else max_q
        max_k = cu_k.diff().max() if max_k is None else max_k
        cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    else:
        cu_q = None
        lens = _packed_lengths(kwargs.get("position_ids"), batch) if s_q == s_k else None
        if lens is not None:
            cu_q = cu_k = _cu_seqlens(lens)
            max_q = max_k = lens.max()
    if cu_q is not None:
        out = _varlen(q.reshape(-1, heads, q.shape[-1]), k.reshape(-1, k.shape[2], k.shape[-1]),
                      v.reshape(-1, v.shape[2], dv), cu_q, cu_k, max_q, max_k, **kw)
        return out.view(batch, -1, heads, dv), None

    return flash_attn_func(q, k, v, **kw), None


# ---- registration ----

def register() -> None:
    """Registers NAME in transformers' AttentionInterface and AttentionMaskInterface (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, attention_mask)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs register() right after transformers.modeling_utils executes, so that `import flashattn` before
    `import transformers` is enough (importing transformers eagerly would cost every user its import time)."""

    _module = "transformers.modeling_utils"

    def find_spec(self, fullname, path, target=None):
        if fullname != self._module:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                register()
            except Exception as e:  # an unexpected transformers must not break its own import
                import warnings

                warnings.warn(f"flashattn: could not register the {NAME!r} attention backend with transformers: {e}")

        loader.exec_module = exec_module
        return spec


def register_when_imported() -> None:
    if _RegisterAfterImport._module in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
