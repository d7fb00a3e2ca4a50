// Row-wise pieces of the backward's preprocess that both backends' kernels use (sm80's bwd_preprocess_kernel,
// the Hopper backward's bwd_prepare_tiles_kernel): D = Σ dO·O over 16-byte chunks, and the LSE as the workspace
// holds it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/primitives.cuh"

namespace flashattn::cuda::sm80 {

constexpr float kLog2e = 1.4426950408889634f;

// The row-wise kernels move kRowChunk consecutive elements (16 bytes of T) per thread and access where the
// launcher found every base and stride 16-byte aligned and the row length a multiple of it (vec_rows), else one
// element per thread and access.
constexpr int kRowChunk = 8;

// Σ x·y over 8 elements of T packed in 16 bytes each.
template <typename T>
__device__ __forceinline__ float dot_chunk(const uint4& x, const uint4& y) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 a = unpack_pair<T>(xs[k]), b = unpack_pair<T>(ys[k]);
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
  return acc;
}

// The LSE in log2 units as the workspace holds it: a row that saw no key (LSE = -inf) is stored as +inf, which
// makes every exp2(s - lse) exactly 0 (no NaN from -inf - -inf).
__device__ __forceinline__ float workspace_lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

}  // namespace flashattn::cuda::sm80
