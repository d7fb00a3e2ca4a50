// CUDA runtime queries, the host copies validation needs, and the workspace pools (workspace.h). Kernels live
// in sm80/ and sm90/.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "backend.h"
#include "cuda/check.h"
#include "cuda/workspace.h"

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

namespace {

constexpr int kMaxPoolDevices = 64;
std::atomic<cudaMemPool_t> g_pools[kMaxPoolDevices];
std::mutex g_pool_creation;

// The library's pool on `device`, created on first use; null where the device has no memory pools (the
// caller then uses the default stream-ordered allocator).
Status pool_for(int device, cudaMemPool_t* out) {
  *out = nullptr;
  if (device < 0 || device >= kMaxPoolDevices) return Status::success();
  cudaMemPool_t pool = g_pools[device].load(std::memory_order_acquire);
  if (!pool) {
    std::lock_guard<std::mutex> lock(g_pool_creation);
    pool = g_pools[device].load(std::memory_order_relaxed);
    if (!pool) {
      int supported = 0;
      FA_CUDA_TRY(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
      if (!supported) return Status::success();
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      FA_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
      uint64_t keep_all = UINT64_MAX;
      FA_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
      g_pools[device].store(pool, std::memory_order_release);
    }
  }
  *out = pool;
  return Status::success();
}

}  // namespace

Status workspace_alloc(void** ptr, size_t bytes, int device, cudaStream_t stream) {
  cudaMemPool_t pool = nullptr;
  Status st = pool_for(device, &pool);
  if (!st.ok()) return st;
  if (pool) return cuda_status(cudaMallocFromPoolAsync(ptr, bytes, pool, stream), "cudaMallocFromPoolAsync(workspace)");
  return cuda_status(cudaMallocAsync(ptr, bytes, stream), "cudaMallocAsync(workspace)");
}

Status workspace_free(void* ptr, cudaStream_t stream) {
  return cuda_status(cudaFreeAsync(ptr, stream), "cudaFreeAsync(workspace)");
}

Status release_cached_memory_impl() {
  for (int d = 0; d < kMaxPoolDevices; ++d) {
    cudaMemPool_t pool = g_pools[d].load(std::memory_order_acquire);
    if (!pool) continue;
    DeviceGuard guard(d);
    FA_CUDA_TRY(guard.status());
    // Frees still pending on a stream are not trimmed; finishing the device's work first makes them count.
    FA_CUDA_TRY(cudaDeviceSynchronize());
    FA_CUDA_TRY(cudaMemPoolTrimTo(pool, 0));
  }
  return Status::success();
}

}  // namespace flashattn::detail
