// Launchers of the test kernels in store_kernels.cu: the 16-bit narrowing every CUDA kernel stores with
// (src/cuda/primitives.cuh, pack_pair), run on the device. Pointers are device pointers; each launcher
// synchronises and returns the first CUDA error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashattn::test::stores {

// out[i] = pack_pair<T>(in[2i], in[2i + 1]) for i < pairs, T = bf16 or fp16.
cudaError_t pack_pairs(bool bf16, const float* in, uint32_t* out, int pairs);

}  // namespace flashattn::test::stores
