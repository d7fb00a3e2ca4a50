// Internal interface between dispatch (src/dispatch.cpp) and the backends. Each backend says whether it can
// run a call (`*_supports`: ok, or unsupported with the reason) and runs validated params.
#pragma once

#include "flashattn/flashattn.h"

namespace flashattn::detail {

Status cpu_reference_forward(const FwdParams& p);
Status cpu_reference_backward(const BwdParams& p);

// The level's kernels chosen at run time (src/cpu/isa.cpp); cpu_flash_level() names it.
Status cpu_flash_forward(const FwdParams& p);
Status cpu_flash_backward(const BwdParams& p);
const char* cpu_flash_level();
// Whether that level runs bf16 on pair dot products, and so rounds the backward's P and dS to bf16
// (flash_backward.cpp).
bool cpu_flash_bf16_pair_products();

// CUDA backends. In a build without CUDA these report that (src/cuda_unavailable.cpp).
Status cuda_sm80_supports(const FwdParams& p, bool backward);
Status cuda_sm80_forward(const FwdParams& p);
Status cuda_sm80_backward(const BwdParams& p);

// The forward's support, and the backward's with everything the backward knows (dout's layout, deterministic mode).
Status cuda_sm90_supports(const FwdParams& p);
Status cuda_sm90_backward_supports(const BwdParams& p);
Status cuda_sm90_forward(const FwdParams& p);
Status cuda_sm90_backward(const BwdParams& p);

// The KV-cache path on CUDA (src/cuda/kv_cache.cu): append + rotary kernels, then `forward` (a CUDA backend's
// forward, which runs cache params on the split-KV decode kernel) over the cache.
using ForwardFn = Status (*)(const FwdParams&);
Status cuda_kvcache(const KVCacheParams& kp, ForwardFn forward);
// The split-KV decode kernel (src/cuda/sm80/decode.cu), which both CUDA backends run for cache params. smem_limit:
// the shared memory per block its plans may take (0: the device's; tests pass a smaller GPU's).
Status cuda_decode_supports(const FwdParams& p);
Status cuda_decode_forward(const FwdParams& p, int smem_limit = 0);
// Whether the CUDA backends run `p` on the decode kernel: every KV-cache call, and the plain forwards of few query
// rows (cuda_decode_takes_plain_forward, decode.cu).
bool cuda_decode_runs(const FwdParams& p);

// merge_attention_states on validated params (cpu/merge.cpp, cuda/merge.cu).
Status cpu_merge(const MergeParams& p);
Status cuda_merge(const MergeParams& p);

// Runtime queries and the small host<->device copies validation needs (varlen offsets).
int cuda_device_count_impl();
int cuda_compute_capability_impl(int device_index);
Status cuda_copy_to_host(void* dst, const void* src, size_t bytes, int device_index, void* stream);
Status release_cached_memory_impl();  // the workspace pools' unused memory back to the driver

}  // namespace flashattn::detail
