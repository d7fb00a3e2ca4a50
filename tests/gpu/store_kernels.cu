// The narrowing of the CUDA kernels' stores (pack_pair, src/cuda/primitives.cuh) as a kernel of its own, so that
// tests/gpu/test_gpu_stores.cpp can check it against the round-to-nearest-even of every probe value.
#include "gpu/store_kernels.h"

#include "cuda/primitives.cuh"

namespace flashattn::test::stores {
namespace {

template <typename T>
__global__ void pack_pairs_kernel(const float* in, uint32_t* out, int pairs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < pairs) out[i] = cuda::pack_pair<T>(in[2 * i], in[2 * i + 1]);
}

}  // namespace

cudaError_t pack_pairs(bool bf16, const float* in, uint32_t* out, int pairs) {
  constexpr int kThreads = 256;
  const int blocks = (pairs + kThreads - 1) / kThreads;
  if (blocks == 0) return cudaSuccess;
  if (bf16)
    pack_pairs_kernel<__nv_bfloat16><<<blocks, kThreads>>>(in, out, pairs);
  else
    pack_pairs_kernel<__half><<<blocks, kThreads>>>(in, out, pairs);
  const cudaError_t launched = cudaGetLastError();
  return launched != cudaSuccess ? launched : cudaDeviceSynchronize();
}

}  // namespace flashattn::test::stores
