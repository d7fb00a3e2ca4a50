// CUDA error handling for launchers: every runtime call's result becomes a Status naming the call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashattn/types.h"

namespace flashattn::detail {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::success();
  return Status::device(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Makes `index` the current device for the guard's lifetime and restores the caller's afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    err_ = cudaGetDevice(&previous_);
    if (err_ == cudaSuccess && previous_ != index) err_ = cudaSetDevice(index);
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_ && previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return err_; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace flashattn::detail

#define FA_CUDA_TRY(expr)                                                             \
  do {                                                                                \
    ::flashattn::Status fa_st_ = ::flashattn::detail::cuda_status((expr), #expr);     \
    if (!fa_st_.ok()) return fa_st_;                                                  \
  } while (0)
