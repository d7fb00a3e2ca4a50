// Entry point of the split-KV decode kernel for KV-cache calls and plain forwards of few query rows (both CUDA
// backends): which calls it runs, and the typed dispatch dtype x head-dim bucket. The kernel: decode_kernel.cuh;
// the launch: decode_launch.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <string>

#include "backend.h"
#include "cuda/sm80/decode_config.h"
#include "cuda/sm80/forward_config.h"
#include "flashattn/params.h"

namespace flashattn::cuda::sm80 {
template <typename T, int kD, bool kFp8>
Status launch_decode(const FwdParams& p, int smem_limit);  // decode_launch.cuh, instantiated in decode_hd*.cu
}  // namespace flashattn::cuda::sm80

namespace flashattn::detail {
namespace {

bool aligned2(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 1u) == 0; }

template <typename T, bool kFp8>
Status decode_by_bucket(const FwdParams& p, int bucket, int smem_limit) {
  using namespace flashattn::cuda::sm80;
  switch (bucket) {
    case 64: return launch_decode<T, 64, kFp8>(p, smem_limit);
    case 128: return launch_decode<T, 128, kFp8>(p, smem_limit);
    case 256: return launch_decode<T, 256, kFp8>(p, smem_limit);
    default: return Status::unsupported("cuda decode: no kernel for head dims " + std::to_string(p.head_dim));
  }
}

// Plain forwards (no cache) whose query rows per sequence and KV head, packed with the GQA group (s_q x group),
// fit the decode kernel's 16-row tile: one decoding step through flash_attn_func, as transformers' integration
// calls it. The kernel reads dense K / V as a cache whose every row is used, and splits the keys to fill the GPU;
// the forward kernels would give each (sequence, head) one block of 64- or 128-row query tiles, nearly all padding,
// and no more blocks than that (an H100 at GQA 32 / 8, d 128, s_q = 1, µs per call: b = 1, 1k keys 16.3 -> 7.9,
// 16k keys 178.5 -> 30.2; b = 8, 16k 350.6 -> 175.9; bench/results/decode.md). 16-bit only (the float8 forward
// has its own scaling rules), no dropout (the decode kernel draws none), no varlen (packed K has no cache layout).
bool cuda_decode_takes_plain_forward(const FwdParams& p) {
  if (p.has_kv_cache() || p.is_varlen() || p.dropout_p != 0.f || p.qv != nullptr || p.heads_kv <= 0) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if (p.seqlen_q * (p.heads_q / p.heads_kv) > cuda::sm80::kDecodeRowsShort) return false;
  return cuda_decode_supports(p).ok();
}

Status decode_typed(const FwdParams& p, int smem_limit) {
  const int bucket = cuda::sm80::forward_head_dim_bucket(std::max(p.head_dim, p.head_dim_v));
  if (p.dtype == DType::e4m3) {
    return p.out_dtype == DType::f16 ? decode_by_bucket<__half, true>(p, bucket, smem_limit)
                                     : decode_by_bucket<__nv_bfloat16, true>(p, bucket, smem_limit);
  }
  return p.dtype == DType::f16 ? decode_by_bucket<__half, false>(p, bucket, smem_limit)
                               : decode_by_bucket<__nv_bfloat16, false>(p, bucket, smem_limit);
}

}  // namespace

bool cuda_decode_runs(const FwdParams& p) { return p.has_kv_cache() || cuda_decode_takes_plain_forward(p); }

Status cuda_decode_supports(const FwdParams& p) {
  const bool fp8 = p.dtype == DType::e4m3;
  if (!fp8 && p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return Status::unsupported(std::string("cuda decode: runs float16, bfloat16 and float8_e4m3fn caches; got ") +
                               dtype_name(p.dtype));
  }
  if (fp8 && p.out_dtype != DType::f16 && p.out_dtype != DType::bf16) {
    return Status::unsupported(std::string("cuda decode: float8_e4m3fn caches write float16 or bfloat16; out is ") +
                               dtype_name(p.out_dtype));
  }
  if (cuda::sm80::forward_head_dim_bucket(std::max(p.head_dim, p.head_dim_v)) == 0) {
    return Status::unsupported("cuda decode: head dims must be in [1, 256]");
  }
  if (p.seqlen_k > INT_MAX - 1024 || p.seqlen_q * (p.heads_q / p.heads_kv) > INT_MAX - 1024) {
    return Status::unsupported("cuda decode: caches or packed query rows beyond 2^31 - 1024 rows");
  }
  // The kernel's mask is 32-bit (MaskSpec32): a row's diagonal and narrowed edges stay below 2^31.
  if (p.seqlen_q + p.seqlen_k > INT_MAX - 1024) {
    return Status::unsupported("cuda decode: seqlen_q + the cache's rows beyond 2^31 - 1024 (32-bit mask arithmetic)");
  }
  if (p.is_paged() && p.page_size > INT_MAX) return Status::unsupported("cuda decode: pages above 2^31 rows");
  if (p.num_splits > cuda::sm80::kMaxDecodeSplits) {
    return Status::unsupported("num_splits: at most " + std::to_string(cuda::sm80::kMaxDecodeSplits));
  }
  if ((!fp8 && (!aligned2(p.q) || !aligned2(p.k) || !aligned2(p.v))) || !aligned2(p.o) ||
      (p.lse != nullptr && (reinterpret_cast<uintptr_t>(p.lse) & 3u) != 0)) {
    return Status::unsupported("cuda decode: a tensor's data pointer is not aligned to its element size");
  }
  return Status::success();
}

Status cuda_decode_forward(const FwdParams& p, int smem_limit) {
  Status st = cuda_decode_supports(p);
  if (!st.ok()) return st;
  const int64_t rows_q = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;
  if (p.batch == 0 || rows_q == 0 || p.seqlen_q == 0) return Status::success();
  if (p.has_kv_cache()) return decode_typed(p, smem_limit);
  FwdParams cache = p;  // a plain forward: K / V are a cache of `batch` entries, every row used
  cache.cache_entries = p.batch;
  return decode_typed(cache, smem_limit);
}

}  // namespace flashattn::detail
