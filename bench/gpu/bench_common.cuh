// Pieces shared by the GPU timing programs (forward_bench.cu, backward_bench.cu, bench_sm90_forward.cu): error check, random bf16
// inputs generated on the device, and contiguous [b, s, h, d] views.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "flashattn/flashattn.h"

#define CHECK(x)                                                    \
  do {                                                              \
    cudaError_t e_ = (x);                                           \
    if (e_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

// Roughly unit-normal values (centred sum of 4 hashed uniforms), generated where they are used: random data
// (never zeros, which run faster than real inputs) without a host copy of gigabytes.
__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    float acc = 0;
    for (int k = 0; k < 4; ++k) {
      h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
      acc += float(h & 0xffffff) / float(0x1000000);
    }
    p[i] = __float2bfloat16((acc - 2.f) * 1.7320508f);
  }
}

inline flashattn::TensorView view4(void* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  const int64_t shape[4] = {b, s, h, d};
  return flashattn::make_contiguous_view(data, flashattn::DType::bf16, flashattn::Device{flashattn::DeviceType::cuda, 0},
                                         4, shape);
}
