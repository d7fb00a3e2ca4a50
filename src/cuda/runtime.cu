// CUDA runtime queries and the host copies validation needs. Kernels live in sm80/ and sm90/.
#include <cuda_runtime.h>

#include <string>

#include "backend.h"
#include "cuda/check.h"

namespace flashattn::detail {

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return 0;
  }
  return n;
}

int cuda_compute_capability_impl(int device_index) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

Status cuda_copy_to_host(void* dst, const void* src, size_t bytes, int device_index, void* stream) {
  DeviceGuard guard(device_index);
  FA_CUDA_TRY(guard.status());
  auto s = static_cast<cudaStream_t>(stream);
  FA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FA_CUDA_TRY(cudaStreamSynchronize(s));
  return Status::success();
}

}  // namespace flashattn::detail
