// merge_attention_states on CUDA: out = w_a · out_a + w_b · out_b and lse = log(exp(lse_a) + exp(lse_b)) per
// (row, head), the weights from common/softmax_state.h's merge_lse (the CPU path's arithmetic, fp32).
//
// Warp roles: each (batch, row, head) is one group of lanes within a warp (32 / group items per warp), the
// group's lanes striding the head_dim_v columns: 16 bytes of the wider side per lane and step (4 fp32 or 8 16-bit
// elements) when every out-like pointer and stride allows aligned vector access, one element otherwise; the
// group is the smallest power of two of lanes that covers a row in one step (at most 32), so short rows do not
// leave lanes idle. Shared memory: none. Preconditions (make_merge_params): out-like last dim contiguous, out may
// be out_a or out_b itself (each lane reads its columns before writing them), lse may be lse_a or lse_b (every
// lane of the group reads the two LSEs before the warp's barrier, the group's first lane writes after it).
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

constexpr int kMergeWarps = 8;          // warps per block
constexpr int kMergeVectorBytes = 16;   // per lane and step on the vector path, on the wider side

// Elements per lane and step on the vector path: 16 bytes of the wider of the two sides.
template <typename TA, typename TB>
constexpr int merge_vector() {
  return kMergeVectorBytes / int(sizeof(TA) > sizeof(TB) ? sizeof(TA) : sizeof(TB));
}

// kN elements (a multiple of 4) from p, aligned to kN elements of T.
template <int kN, typename T>
__device__ __forceinline__ void load_vector(const T* p, float (&v)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; i += 4) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 x = *reinterpret_cast<const float4*>(p + i);
      v[i] = x.x, v[i + 1] = x.y, v[i + 2] = x.z, v[i + 3] = x.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(p + i);
      const float2 lo = cuda::unpack_pair<T>(x.x), hi = cuda::unpack_pair<T>(x.y);
      v[i] = lo.x, v[i + 1] = lo.y, v[i + 2] = hi.x, v[i + 3] = hi.y;
    }
  }
}

template <int kN, typename T>
__device__ __forceinline__ void store_vector(T* p, const float (&v)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; i += 4) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    } else {
      *reinterpret_cast<uint2*>(p + i) =
          make_uint2(cuda::pack_pair<T>(v[i], v[i + 1]), cuda::pack_pair<T>(v[i + 2], v[i + 3]));
    }
  }
}

// TA: out_a's and out's element type, TB: out_b's; 2^group_shift lanes per (row, head). Lanes past the last item
// stay to the warp barrier (the group size does not divide the item count).
template <typename TA, typename TB, bool kVector>
__global__ void __launch_bounds__(kMergeWarps * 32)
    merge_kernel(const __grid_constant__ MergeParams p, int group_shift) {
  constexpr int kVec = kVector ? merge_vector<TA, TB>() : 1;
  const int group = 1 << group_shift, lane = int(threadIdx.x) & 31, member = lane & (group - 1);
  const int64_t item =
      ((int64_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5)) << (5 - group_shift)) + (lane >> group_shift);
  const int64_t items = p.batch * p.rows * p.heads;
  const bool valid = item < items;
  // (b, i, h) of the item: 32-bit division where the items allow it (a 64-bit one is a long software sequence,
  // and this kernel's threads do little else).
  int64_t h, i, b;
  if (items <= int64_t(UINT32_MAX)) {
    const uint32_t it = uint32_t(item), heads = uint32_t(p.heads), rows = uint32_t(p.rows);
    const uint32_t row_item = it / heads;
    h = it - row_item * heads, i = row_item % rows, b = row_item / rows;
  } else {
    h = item % p.heads, i = (item / p.heads) % p.rows, b = item / (p.heads * p.rows);
  }
  LseMerge<float> m{};
  if (valid) {
    m = merge_lse(p.a.lse[b * p.a.lse_batch_stride + h * p.a.lse_head_stride + i],
                  p.b.lse[b * p.b.lse_batch_stride + h * p.b.lse_head_stride + i]);
    const TA* oa = static_cast<const TA*>(p.a.out) + b * p.a.batch_stride + i * p.a.row_stride + h * p.a.head_stride;
    const TB* ob = static_cast<const TB*>(p.b.out) + b * p.b.batch_stride + i * p.b.row_stride + h * p.b.head_stride;
    TA* o = static_cast<TA*>(p.out) + b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    for (int64_t c = int64_t(member) * kVec; c < p.head_dim_v; c += int64_t(group) * kVec) {
      if constexpr (kVector) {
        float va[kVec], vb[kVec];
        load_vector(oa + c, va);
        load_vector(ob + c, vb);
#pragma unroll
        for (int e = 0; e < kVec; ++e) va[e] = m.combine(va[e], vb[e]);
        store_vector(o + c, va);
      } else {
        o[c] = cuda::from_float<TA>(m.combine(cuda::to_float(oa[c]), cuda::to_float(ob[c])));
      }
    }
  }
  __syncwarp();
  if (valid && member == 0 && p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = m.lse;
}

// Whether every out-like row start is aligned to `vec` elements (pointer and strides).
bool vectorizable(const MergeParams& p, int vec) {
  auto aligned = [vec](const void* ptr, DType t, int64_t bs, int64_t rs, int64_t hs) {
    const size_t bytes = dtype_size(t) * size_t(vec);
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && bs % vec == 0 && rs % vec == 0 && hs % vec == 0;
  };
  return p.head_dim_v % vec == 0 && aligned(p.a.out, p.a.dtype, p.a.batch_stride, p.a.row_stride, p.a.head_stride) &&
         aligned(p.b.out, p.b.dtype, p.b.batch_stride, p.b.row_stride, p.b.head_stride) &&
         aligned(p.out, p.a.dtype, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
}

// Lanes per (row, head), as a shift: the smallest power of two whose steps of `vec` cover head_dim_v, at most a
// warp.
int merge_group_shift(int64_t head_dim_v, int vec) {
  int shift = 0;
  while (shift < 5 && (int64_t(vec) << shift) < head_dim_v) ++shift;
  return shift;
}

template <typename TA, typename TB>
Status launch(const MergeParams& p) {
  constexpr int kVec = merge_vector<TA, TB>();
  const bool vector = vectorizable(p, kVec);
  const int group_shift = merge_group_shift(p.head_dim_v, vector ? kVec : 1);
  const int64_t items = p.batch * p.rows * p.heads, items_per_block = int64_t(kMergeWarps) << (5 - group_shift);
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  if (blocks > int64_t(INT32_MAX)) return Status::unsupported("out_a: more (row, head) pairs than one launch covers");
  const dim3 grid(static_cast<unsigned>(blocks));
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (vector) {
    merge_kernel<TA, TB, true><<<grid, kMergeWarps * 32, 0, stream>>>(p, group_shift);
  } else {
    merge_kernel<TA, TB, false><<<grid, kMergeWarps * 32, 0, stream>>>(p, group_shift);
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
