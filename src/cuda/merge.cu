// merge_attention_states on CUDA: out = w_a · out_a + w_b · out_b and lse = log(exp(lse_a) + exp(lse_b)) per
// (row, head), the weights from common/softmax_state.h's merge_lse (the CPU path's arithmetic, fp32).
//
// Warp roles: one warp per (batch, row, head); its lanes stride the head_dim_v columns, kMergeVector elements
// per lane and step when every out-like pointer and stride allows aligned vector access, one otherwise.
// Shared memory: none. Preconditions (make_merge_params): out-like last dim contiguous, out may be out_a or out_b
// itself (each lane reads its columns before writing them), lse may be lse_a or lse_b (every lane reads the two
// LSEs before the warp's barrier, lane 0 writes after it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend.h"
#include "common/softmax_state.h"
#include "cuda/check.h"
#include "cuda/primitives.cuh"

namespace flashattn::detail {
namespace {

constexpr int kMergeWarps = 8;   // warps per block: one (row, head) each
constexpr int kMergeVector = 4;  // elements per lane and step on the vector path (16 bytes of fp32, 8 of 16-bit)

template <typename T>
__device__ __forceinline__ void load_vector(const T* p, float (&v)[kMergeVector]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    const float2 lo = cuda::unpack_pair<T>(x.x), hi = cuda::unpack_pair<T>(x.y);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
}

template <typename T>
__device__ __forceinline__ void store_vector(T* p, const float (&v)[kMergeVector]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(cuda::pack_pair<T>(v[0], v[1]), cuda::pack_pair<T>(v[2], v[3]));
  }
}

template <typename T>
__device__ __forceinline__ float load_one(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return cuda::to_float(*p);
  }
}

template <typename T>
__device__ __forceinline__ void store_one(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) {
    *p = v;
  } else {
    *p = cuda::from_float<T>(v);
  }
}

// TA: out_a's and out's element type, TB: out_b's.
template <typename TA, typename TB, bool kVector>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const __grid_constant__ MergeParams p) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t item = int64_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
  if (item >= p.batch * p.rows * p.heads) return;
  const int64_t h = item % p.heads, i = (item / p.heads) % p.rows, b = item / (p.heads * p.rows);
  const LseMerge<float> m = merge_lse(p.a.lse[b * p.a.lse_batch_stride + h * p.a.lse_head_stride + i],
                                      p.b.lse[b * p.b.lse_batch_stride + h * p.b.lse_head_stride + i]);
  const TA* oa = static_cast<const TA*>(p.a.out) + b * p.a.batch_stride + i * p.a.row_stride + h * p.a.head_stride;
  const TB* ob = static_cast<const TB*>(p.b.out) + b * p.b.batch_stride + i * p.b.row_stride + h * p.b.head_stride;
  TA* o = static_cast<TA*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
  if constexpr (kVector) {
    for (int64_t c = int64_t(lane) * kMergeVector; c < p.head_dim_v; c += 32 * kMergeVector) {
      float va[kMergeVector], vb[kMergeVector];
      load_vector(oa + c, va);
      load_vector(ob + c, vb);
#pragma unroll
      for (int e = 0; e < kMergeVector; ++e) va[e] = m.combine(va[e], vb[e]);
      store_vector(o + c, va);
    }
  } else {
    for (int64_t c = lane; c < p.head_dim_v; c += 32) store_one(o + c, m.combine(load_one(oa + c), load_one(ob + c)));
  }
  __syncwarp();
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = m.lse;
}

// Whether every out-like row start is kMergeVector-element aligned (pointer and strides).
bool vectorizable(const MergeParams& p) {
  auto aligned = [](const void* ptr, DType t, int64_t bs, int64_t rs, int64_t hs) {
    const size_t bytes = dtype_size(t) * kMergeVector;
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && bs % kMergeVector == 0 && rs % kMergeVector == 0 &&
           hs % kMergeVector == 0;
  };
  return p.head_dim_v % kMergeVector == 0 &&
         aligned(p.a.out, p.a.dtype, p.a.batch_stride, p.a.row_stride, p.a.head_stride) &&
         aligned(p.b.out, p.b.dtype, p.b.batch_stride, p.b.row_stride, p.b.head_stride) &&
         aligned(p.out, p.a.dtype, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
}

template <typename TA, typename TB>
Status launch(const MergeParams& p) {
  const int64_t items = p.batch * p.rows * p.heads;
  const dim3 grid(unsigned((items + kMergeWarps - 1) / kMergeWarps));
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (vectorizable(p)) {
    merge_kernel<TA, TB, true><<<grid, kMergeWarps * 32, 0, stream>>>(p);
  } else {
    merge_kernel<TA, TB, false><<<grid, kMergeWarps * 32, 0, stream>>>(p);
  }
  return cuda_status(cudaGetLastError(), "merge_kernel");
}

template <typename TA>
Status launch_b(const MergeParams& p) {
  switch (p.b.dtype) {
    case DType::f32: return launch<TA, float>(p);
    case DType::f16: return launch<TA, __half>(p);
    case DType::bf16: return launch<TA, __nv_bfloat16>(p);
    default: return Status::unsupported(std::string("out_b: dtype ") + dtype_name(p.b.dtype) + " is not supported");
  }
}

}  // namespace

Status cuda_merge(const MergeParams& p) {
  const int64_t items = p.batch * p.rows * p.heads;
  if (items == 0) return Status::success();
  if ((items + kMergeWarps - 1) / kMergeWarps > int64_t(INT32_MAX)) {
    return Status::unsupported("out_a: more (row, head) pairs than one launch covers");
  }
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  switch (p.a.dtype) {
    case DType::f32: return launch_b<float>(p);
    case DType::f16: return launch_b<__half>(p);
    case DType::bf16: return launch_b<__nv_bfloat16>(p);
    default: return Status::unsupported(std::string("out_a: dtype ") + dtype_name(p.a.dtype) + " is not supported");
  }
}

}  // namespace flashattn::detail
