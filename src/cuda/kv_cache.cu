// The KV-cache path on CUDA: the appending kernel (new K rotated, new V copied into the cache at cache_seqlens),
// the rotation of Q into scratch, then the backend's forward over the cache (the split-KV decode kernel).
// Both kernels are elementwise: one thread per column of a (row, head); they read the index tensors on the
// device, so the whole call is CUDA-graph capturable. Rows whose cache row or page is out of range are skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend.h"
#include "common/kv_cache.h"
#include "cuda/check.h"
#include "cuda/primitives.cuh"
#include "cuda/workspace.h"

namespace flashattn::detail {
namespace {

struct RotaryArgs {
  const void* cos;  // null: no rotation
  const void* sin;
  int rotary_dim;
  int rotary_rows;
  bool interleaved;
};

// Column c of `row` rotated by position pos (or copied when c is past the rotary prefix), as cpu/kv_cache.cpp.
template <typename T>
__device__ __forceinline__ T rotated(const T* row, int c, const RotaryArgs& r, int64_t pos) {
  if (r.cos == nullptr || c >= r.rotary_dim) return row[c];
  int64_t partner, freq;
  bool first;
  rotary_pair_of(c, r.rotary_dim, r.interleaved, &partner, &first, &freq);
  pos = pos < 0 ? 0 : (pos >= r.rotary_rows ? r.rotary_rows - 1 : pos);
  const int64_t at = pos * (r.rotary_dim / 2) + freq;
  const float cs = cuda::to_float(static_cast<const T*>(r.cos)[at]);
  const float sn = cuda::to_float(static_cast<const T*>(r.sin)[at]);
  const float x0 = cuda::to_float(row[first ? c : partner]), x1 = cuda::to_float(row[first ? partner : c]);
  float y0, y1;
  rotate_pair(x0, x1, cs, sn, &y0, &y1);
  return cuda::from_float<T>(first ? y0 : y1);
}

struct AppendArgs {
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  int64_t kn_batch_stride, kn_row_stride, kn_head_stride;
  int64_t vn_batch_stride, vn_row_stride, vn_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  const int32_t* cache_seqlens;
  const int32_t* rotary_seqlens;  // null: positions from cache_seqlens
  KVCacheLayout cache;  // cache.cu_seqlens_k_new set: new rows packed (kn/vn batch strides unused)
  int seqlen_new, batch, heads_kv, head_dim, head_dim_v;
  RotaryArgs rotary;
};

// Grid: x = new row (padded: row i of sequence z; varlen: packed row, its sequence found by bisection), y = KV
// head, z = sequence (padded) or 0; threads over columns.
template <typename T>
__global__ void append_kernel(const __grid_constant__ AppendArgs a) {
  const int hk = int(blockIdx.y);
  const bool varlen = a.cache.cu_seqlens_k_new != nullptr;
  const int64_t packed = blockIdx.x;
  const int b = varlen ? varlen_sequence_of(a.cache.cu_seqlens_k_new, a.batch, packed) : int(blockIdx.z);
  const int64_t i = varlen ? packed - a.cache.cu_seqlens_k_new[b] : packed;
  if (i < 0 || i >= a.cache.appended(b)) return;  // past its sequence's rows (unchecked offsets)
  const int64_t e = a.cache.entry(b);
  const int64_t row = int64_t(a.cache_seqlens[b]) + i;
  if (e < 0 || row < 0 || row >= a.cache.capacity) return;
  const int64_t k_off = a.cache.row_offset(e, row, a.k_batch_stride, a.k_row_stride);
  const int64_t v_off = a.cache.row_offset(e, row, a.v_batch_stride, a.v_row_stride);
  if (k_off < 0 || v_off < 0) return;
  const int64_t kn_row = new_row_offset(a.cache.cu_seqlens_k_new, b, i, a.kn_batch_stride, a.kn_row_stride);
  const int64_t vn_row = new_row_offset(a.cache.cu_seqlens_k_new, b, i, a.vn_batch_stride, a.vn_row_stride);
  const T* kn = static_cast<const T*>(a.k_new) + kn_row + hk * a.kn_head_stride;
  const T* vn = static_cast<const T*>(a.v_new) + vn_row + hk * a.vn_head_stride;
  T* kc = static_cast<T*>(a.k_cache) + k_off + hk * a.k_head_stride;
  T* vc = static_cast<T*>(a.v_cache) + v_off + hk * a.v_head_stride;
  const int64_t pos = rotary_base(a.rotary_seqlens, a.cache_seqlens, b) + i;
  for (int c = int(threadIdx.x); c < a.head_dim; c += int(blockDim.x)) kc[c] = rotated(kn, c, a.rotary, pos);
  for (int c = int(threadIdx.x); c < a.head_dim_v; c += int(blockDim.x)) vc[c] = vn[c];
}

struct RotateQueryArgs {
  const void* q;
  void* out;  // [rows, heads_q, head_dim] contiguous
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  const int32_t* cu_seqlens_q;
  const int32_t* cache_seqlens;
  const int32_t* rotary_seqlens;  // null: positions from cache_seqlens
  int batch, seqlen_q, heads_q, head_dim;
  bool per_row;
  RotaryArgs rotary;
};

// Grid: x = query row (padded: b * seqlen_q + i; varlen: packed), y = head; threads over columns.
template <typename T>
__global__ void rotate_queries_kernel(const __grid_constant__ RotateQueryArgs a) {
  const int64_t row = blockIdx.x;
  const int h = int(blockIdx.y);
  int b, i;
  if (a.cu_seqlens_q == nullptr) {
    b = int(row / a.seqlen_q);
    i = int(row % a.seqlen_q);
  } else {
    b = varlen_sequence_of(a.cu_seqlens_q, a.batch, row);
    i = int(row - a.cu_seqlens_q[b]);
  }
  const T* src = static_cast<const T*>(a.q) + (a.cu_seqlens_q == nullptr ? b * a.q_batch_stride + i * a.q_row_stride
                                                                          : row * a.q_row_stride) +
                 h * a.q_head_stride;
  T* dst = static_cast<T*>(a.out) + (row * a.heads_q + h) * a.head_dim;
  const int64_t pos = rotary_base(a.rotary_seqlens, a.cache_seqlens, b) + (a.per_row ? i : 0);
  for (int c = int(threadIdx.x); c < a.head_dim; c += int(blockDim.x)) dst[c] = rotated(src, c, a.rotary, pos);
}

int column_threads(int64_t cols) { return int(std::min<int64_t>(256, (cols + 31) / 32 * 32)); }

// Q rotated by `rot` into scratch, then `forward` over the cache with it.
template <typename T>
Status rotate_queries_and_run(const KVCacheParams& kp, const RotaryArgs& rot, ForwardFn forward,
                              cudaStream_t stream) {
  const FwdParams& p = kp.attn;
  const int64_t rows = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;
  if (rows == 0) return forward(p);
  if (rows > INT32_MAX || p.heads_q > 65535) return Status::unsupported("cuda: rotary over 2^31 query rows or 65535 heads");
  void* scratch = nullptr;
  Status st = workspace_alloc(&scratch, size_t(rows * p.heads_q * p.head_dim) * sizeof(T), p.device.index, stream);
  if (!st.ok()) return st;
  RotateQueryArgs r{};
  r.q = p.q, r.out = scratch;
  r.q_batch_stride = p.q_batch_stride, r.q_row_stride = p.q_row_stride, r.q_head_stride = p.q_head_stride;
  r.cu_seqlens_q = p.cu_seqlens_q, r.cache_seqlens = p.seqused_k, r.rotary_seqlens = kp.rotary_seqlens;
  r.batch = int(p.batch), r.seqlen_q = int(p.seqlen_q), r.heads_q = int(p.heads_q), r.head_dim = int(p.head_dim);
  r.per_row = kp.rotary_per_row;
  r.rotary = rot;
  rotate_queries_kernel<T><<<dim3(unsigned(rows), unsigned(p.heads_q)), column_threads(p.head_dim), 0, stream>>>(r);
  st = cuda_status(cudaGetLastError(), "rotate_queries_kernel");
  if (st.ok()) {
    FwdParams f = p;
    f.q = scratch;
    f.q_head_stride = p.head_dim;
    f.q_row_stride = p.heads_q * p.head_dim;
    f.q_batch_stride = p.is_varlen() ? 0 : p.seqlen_q * f.q_row_stride;
    st = forward(f);
  }
  const Status freed = workspace_free(scratch, stream);
  return st.ok() ? freed : st;
}

template <typename T>
Status kvcache_typed(const KVCacheParams& kp, ForwardFn forward) {
  const FwdParams& p = kp.attn;
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  auto stream = static_cast<cudaStream_t>(p.stream);
  RotaryArgs rot{kp.rotary_cos, kp.rotary_sin, int(kp.rotary_dim), int(kp.rotary_rows), kp.rotary_interleaved};
  if (kp.k_new && kp.seqlen_new > 0 && p.batch > 0) {
    if (kp.seqlen_new > INT32_MAX || p.heads_kv > 65535 || p.batch > 65535)
      return Status::unsupported("cuda: appending more than 2^31 rows, 65535 heads or 65535 sequences");
    AppendArgs a{};
    a.k_new = kp.k_new, a.v_new = kp.v_new, a.k_cache = kp.k_cache, a.v_cache = kp.v_cache;
    a.kn_batch_stride = kp.k_new_batch_stride, a.kn_row_stride = kp.k_new_row_stride;
    a.kn_head_stride = kp.k_new_head_stride;
    a.vn_batch_stride = kp.v_new_batch_stride, a.vn_row_stride = kp.v_new_row_stride;
    a.vn_head_stride = kp.v_new_head_stride;
    a.k_batch_stride = p.k_batch_stride, a.k_row_stride = p.k_row_stride, a.k_head_stride = p.k_head_stride;
    a.v_batch_stride = p.v_batch_stride, a.v_row_stride = p.v_row_stride, a.v_head_stride = p.v_head_stride;
    a.cache_seqlens = p.seqused_k;
    a.rotary_seqlens = kp.rotary_seqlens;
    a.cache = KVCacheLayout::of(p);
    a.seqlen_new = int(kp.seqlen_new), a.batch = int(p.batch), a.heads_kv = int(p.heads_kv);
    a.head_dim = int(p.head_dim), a.head_dim_v = int(p.head_dim_v);
    a.rotary = rot;
    const bool varlen_new = p.cu_seqlens_k_new != nullptr;
    const dim3 grid(unsigned(kp.seqlen_new), unsigned(p.heads_kv), varlen_new ? 1u : unsigned(p.batch));
    append_kernel<T><<<grid, column_threads(std::max(p.head_dim, p.head_dim_v)), 0, stream>>>(a);
    FA_CUDA_TRY(cudaGetLastError());
  }
  if (!kp.rotary_cos) return forward(p);
  return rotate_queries_and_run<T>(kp, rot, forward, stream);
}

}  // namespace

Status cuda_kvcache(const KVCacheParams& kp, ForwardFn forward) {
  switch (kp.attn.dtype) {
    case DType::f16: return kvcache_typed<__half>(kp, forward);
    case DType::bf16: return kvcache_typed<__nv_bfloat16>(kp, forward);
    case DType::e4m3: return kvcache_typed<uint8_t>(kp, forward);
    default:
      return Status::unsupported(std::string("cuda: the KV-cache path runs float16, bfloat16 and float8_e4m3fn; got ") +
                                 dtype_name(kp.attn.dtype));
  }
}

}  // namespace flashattn::detail
