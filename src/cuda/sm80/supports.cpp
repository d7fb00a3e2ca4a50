// Which calls the sm80 (mma.sync) kernels can run. Dispatch asks this before launching anything.
#include <string>

#include "backend.h"

namespace flashattn::detail {

Status cuda_sm80_supports(const FwdParams& p, bool /*backward*/) {
  // float8_e4m3fn KV caches run the decode kernel (its own check below); other float8 calls are Hopper's.
  const bool fp8_cache = p.dtype == DType::e4m3 && p.has_kv_cache();
  if (p.dtype != DType::f16 && p.dtype != DType::bf16 && !fp8_cache) {
    return Status::unsupported(std::string("cuda_sm80: runs float16 and bfloat16 (float8_e4m3fn in KV-cache calls); "
                                           "got ") + dtype_name(p.dtype) + " (use CPU tensors or cast)");
  }
  const int cc = cuda_compute_capability_impl(p.device.index);
  if (cc == 0) return Status::unsupported("cuda_sm80: CUDA device " + std::to_string(p.device.index) + " not found");
  if (cc < 80) {
    return Status::unsupported("cuda_sm80: needs compute capability >= 8.0, device " + std::to_string(p.device.index) +
                               " has " + std::to_string(cc / 10) + "." + std::to_string(cc % 10));
  }
  if (p.head_dim > 256 || p.head_dim_v > 256) return Status::unsupported("cuda_sm80: head dims above 256");
  if (p.has_kv_cache()) return cuda_decode_supports(p);
  return Status::success();
}

}  // namespace flashattn::detail
