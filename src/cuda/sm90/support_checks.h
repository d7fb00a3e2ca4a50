// The checks every Hopper kernel's support test starts with (forward_sm90.cu, backward_sm90.cu): element type,
// device, equal head dims, sequence lengths in 32 bits, and the layout rules of TMA. Host code.
#pragma once

#include <cstdint>
#include <string>

#include "backend.h"
#include "flashattn/params.h"

namespace flashattn::detail::sm90_checks {

// TMA's stride unit is 16 bytes: 8 elements of 16 bits.
inline bool tma_stride_ok(int64_t elements) { return elements % 8 == 0; }
inline bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// What the forward and the backward both need, in the order a user would fix it.
inline Status common(const FwdParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return Status::unsupported(std::string("cuda_sm90: runs float16 and bfloat16; got ") + dtype_name(p.dtype));
  const int cc = cuda_compute_capability_impl(p.device.index);
  if (cc != 90)
    return Status::unsupported("cuda_sm90: needs compute capability 9.0 (sm_90a code), device " +
                               std::to_string(p.device.index) + " has " + std::to_string(cc / 10) + "." +
                               std::to_string(cc % 10));
  if (p.head_dim != p.head_dim_v)
    return Status::unsupported("cuda_sm90: head_dim_v != head_dim is not implemented (cuda_sm80 runs it)");
  const int64_t kInt32Max = 2147483647;
  if (p.seqlen_q > kInt32Max || p.seqlen_k > kInt32Max || p.total_q > kInt32Max || p.total_k > kInt32Max)
    return Status::unsupported("cuda_sm90: sequence lengths past 2^31");
  return Status::success();
}

}  // namespace flashattn::detail::sm90_checks
