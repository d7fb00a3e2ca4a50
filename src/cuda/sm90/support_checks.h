// The checks every Hopper kernel's support test starts with (forward_sm90.cu, backward_sm90.cu): element type,
// device, head dims, sequence lengths in 32 bits, and the layout rules of TMA. Host code.
#pragma once

#include <cstdint>
#include <string>

#include "backend.h"
#include "flashattn/params.h"

namespace flashattn::detail::sm90_checks {

// TMA's stride unit is 16 bytes: 8 elements of 16 bits.
inline bool tma_stride_ok(int64_t elements) { return elements % 8 == 0; }
inline bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// Head dims run in compiled buckets (the kernels' kHeadDim: 64, 128, 192 (forward only), 256), d and d_v each up
// to the bucket of the larger: the tensor maps' inner extents are the true d (Q, K) and d_v (V, dO), so TMA fills
// the columns past them with zeros, the products see zeros there, and the stores stop at d / d_v. A multiple of 8
// keeps every 16-byte store run whole. 0: no bucket.
constexpr int kHeadDimUnit = 8;
enum class Pass { forward, backward };
inline int head_dim_bucket(int64_t head_dim, int64_t head_dim_v, Pass pass = Pass::forward) {
  const int64_t d = head_dim > head_dim_v ? head_dim : head_dim_v;
  if (head_dim % kHeadDimUnit != 0 || head_dim_v % kHeadDimUnit != 0 || d < 1) return 0;
  if (d <= 64) return 64;
  if (d <= 128) return 128;
  if (d <= 192 && pass == Pass::forward) return 192;
  return d <= 256 ? 256 : 0;
}
inline std::string head_dims_named(const FwdParams& p) {
  return p.head_dim == p.head_dim_v ? "head dim " + std::to_string(p.head_dim)
                                    : "head dims " + std::to_string(p.head_dim) + " / " + std::to_string(p.head_dim_v);
}

// e4m3 (the forward only): head dims in buckets of 64, 128 and 256, whole 64- or 128-byte rows of Q and K
// (forward_config.h; 192 runs as 256).
inline int fp8_head_dim_bucket(int64_t head_dim, int64_t head_dim_v) {
  const int bucket = head_dim_bucket(head_dim, head_dim_v);
  return bucket == 0 ? 0 : bucket <= 128 ? bucket : 256;
}

// What the forward and the backward both need, in the order a user would fix it.
inline Status common(const FwdParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16 && p.dtype != DType::e4m3)
    return Status::unsupported(std::string("cuda_sm90: runs float16, bfloat16 and float8_e4m3fn; got ") +
                               dtype_name(p.dtype));
  const int cc = cuda_compute_capability_impl(p.device.index);
  if (cc != 90)
    return Status::unsupported("cuda_sm90: needs compute capability 9.0 (sm_90a code), device " +
                               std::to_string(p.device.index) + " has " + std::to_string(cc / 10) + "." +
                               std::to_string(cc % 10));
  if (head_dim_bucket(p.head_dim, p.head_dim_v) == 0)
    return Status::unsupported("cuda_sm90: " + head_dims_named(p) +
                               " (runs head_dim and head_dim_v that are multiples of 8 up to 256; cuda_sm80 runs the "
                               "others)");
  const int64_t kInt32Max = 2147483647;
  if (p.seqlen_q > kInt32Max || p.seqlen_k > kInt32Max || p.total_q > kInt32Max || p.total_k > kInt32Max)
    return Status::unsupported("cuda_sm90: sequence lengths past 2^31");
  return Status::success();
}

}  // namespace flashattn::detail::sm90_checks
