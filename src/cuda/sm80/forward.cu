// Entry point of the sm80 forward: the checks that the kernel's preconditions hold (or unsupported, with the
// reason), the trivial cases, and the typed dispatch dtype x head-dim bucket. The kernel: forward_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <string>

#include "backend.h"
#include "cuda/sm80/forward_config.h"
#include "cuda/sm80/forward_entry.h"
#include "flashattn/params.h"

namespace flashattn::cuda::sm80 {
template <typename T, int kD>
Status launch_forward(const FwdParams& p, int smem_limit);  // forward_launch.cuh, instantiated in forward_hd*.cu
}  // namespace flashattn::cuda::sm80

namespace flashattn::detail {
namespace {

template <typename T>
Status forward_by_bucket(const FwdParams& p, int bucket, int smem_limit) {
  using namespace flashattn::cuda::sm80;
  switch (bucket) {
    case 64: return launch_forward<T, 64>(p, smem_limit);
    case 128: return launch_forward<T, 128>(p, smem_limit);
    case 256: return launch_forward<T, 256>(p, smem_limit);
    default:
      return Status::unsupported("cuda_sm80: no forward kernel for head dims " + std::to_string(p.head_dim) + " / " +
                                 std::to_string(p.head_dim_v));
  }
}

bool aligned2(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 1u) == 0; }

}  // namespace

Status cuda_sm80_forward(const FwdParams& p) {
  return cuda_decode_runs(p) ? cuda_decode_forward(p) : cuda_sm80_forward_limited(p, 0);
}

Status cuda_sm80_forward_limited(const FwdParams& p, int smem_limit) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return Status::unsupported(std::string("cuda_sm80: the forward runs float16 and bfloat16; got ") +
                               dtype_name(p.dtype));
  }
  const int bucket = cuda::sm80::forward_head_dim_bucket(std::max(p.head_dim, p.head_dim_v));
  if (bucket == 0) {
    return Status::unsupported("cuda_sm80: head dims must be in [1, 256], got " + std::to_string(p.head_dim) + " / " +
                               std::to_string(p.head_dim_v));
  }
  // Nothing to compute: no query rows anywhere (a batch of empty sequences included).
  const int64_t rows_q = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;
  if (p.batch == 0 || p.heads_q == 0 || rows_q == 0 || p.seqlen_q == 0) return Status::success();

  // Grid: x = query blocks, y = query heads, z = batch entries; rows are indexed with 32-bit ints.
  if (p.heads_q > 65535) return Status::unsupported("cuda_sm80: more than 65535 query heads");
  if (p.batch > 65535) return Status::unsupported("cuda_sm80: batch larger than 65535");
  if (p.seqlen_q > INT_MAX - 1024 || p.seqlen_k > INT_MAX - 1024) {
    return Status::unsupported("cuda_sm80: sequences longer than 2^31 - 1024 rows");
  }
  // 2-byte elements need 2-byte aligned tensors; 16-byte alignment is optional (slower element-wise copies).
  if (!aligned2(p.q) || !aligned2(p.k) || !aligned2(p.v) || !aligned2(p.o) ||
      (p.lse != nullptr && (reinterpret_cast<uintptr_t>(p.lse) & 3u) != 0)) {
    return Status::unsupported("cuda_sm80: a tensor's data pointer is not aligned to its element size");
  }
  return p.dtype == DType::f16 ? forward_by_bucket<__half>(p, bucket, smem_limit)
                               : forward_by_bucket<__nv_bfloat16>(p, bucket, smem_limit);
}

}  // namespace flashattn::detail
