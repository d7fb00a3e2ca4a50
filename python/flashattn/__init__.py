"""flashattn: exact FlashAttention (CPU and CUDA) with a PyTorch drop-in for flash_attn.

    from flashattn import flash_attn_func                    # the flash_attn 2 API, same signatures
    from flashattn import scaled_dot_product_attention       # torch.nn.functional's signature

`flashattn._C` is the framework-neutral native module (DLPack tensors from torch, numpy, JAX, CuPy; CPU or CUDA;
caller-allocated outputs; the CUDA stream passed as an integer). The PyTorch layer needs torch; without it only
the native module and the build queries below are available.
"""

from . import _C

__version__ = _C.version()
built_with_cuda = _C.built_with_cuda
cuda_device_count = _C.cuda_device_count
release_cached_memory = _C.release_cached_memory
cpu_isa = _C.cpu_isa

__all__ = ["__version__", "built_with_cuda", "cpu_isa", "cuda_device_count", "release_cached_memory"]

try:
    import torch as _torch  # noqa: F401
except ImportError:  # the native module alone still works
    _torch = None

if _torch is not None:
    from ._ops import (BackendChoice, attention, choose_backend, fp8_attention, fp8_attention_backward,
                       merge_attention_states, merge_attention_states_)
    from .flash_attn_interface import (
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
        flash_attn_with_kvcache,
    )
    from .sdpa import scaled_dot_product_attention
    from . import fp8  # quantising q, k, v for the FP8 paths (flashattn.fp8.quantize_qkv)
    from .integrations.transformers import register_when_imported as _register_with_transformers

    # attn_implementation="fattn" in transformers (flashattn.integrations.transformers), registered when (or
    # once) transformers is imported.
    _register_with_transformers()

    __all__ += [
        "attention",
        "choose_backend",
        "BackendChoice",
        "flash_attn_func",
        "flash_attn_kvpacked_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_with_kvcache",
        "fp8",
        "fp8_attention",
        "fp8_attention_backward",
        "merge_attention_states",
        "merge_attention_states_",
        "scaled_dot_product_attention",
    ]
