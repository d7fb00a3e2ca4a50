// GPU test helpers: a device copy of a HostTensor (same strides, padding included) and the skip rule.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/host_tensor.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {

inline bool have_gpu() { return flashattn::cuda_device_count() > 0; }

// Head dims the Hopper kernels take (written from the README's feature table, not from the support check):
// d and d_v multiples of 8, the larger at most 256, the deterministic backward included.
inline bool sm90_takes_head_dims(int64_t d, int64_t dv) {
  const int64_t larger = d > dv ? d : dv;
  return d % 8 == 0 && dv % 8 == 0 && d > 0 && dv > 0 && larger <= 256;
}

#define FA_REQUIRE_GPU() \
  if (!::flashattn::test::have_gpu()) GTEST_SKIP() << "no CUDA device"

#define FA_CUDA_CHECK(expr)                                                                          \
  do {                                                                                               \
    cudaError_t fa_err_ = (expr);                                                                    \
    ASSERT_EQ(fa_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(fa_err_);                 \
  } while (0)

// Owns device storage mirroring a HostTensor's storage (so strided/padded layouts carry over exactly).
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host) : host_shape_(&host) {
    bytes_ = host.bytes();
    if (cudaMalloc(&data_, bytes_ ? bytes_ : 1) != cudaSuccess) data_ = nullptr;
    upload(host);
  }
  ~DeviceTensor() {
    if (data_) cudaFree(data_);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept { *this = std::move(o); }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(host_shape_, o.host_shape_);
    return *this;
  }

  void upload(const HostTensor& host) {
    if (data_ && bytes_) cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice);
  }
  void download(HostTensor& host) const {
    if (data_ && bytes_) cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost);
  }
  // A view with the host tensor's shape and strides, pointing at device memory.
  TensorView view(const HostTensor& host, int device_index = 0) const {
    return host.view(Device{DeviceType::cuda, device_index}, data_);
  }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  const HostTensor* host_shape_ = nullptr;
};

}  // namespace flashattn::test
