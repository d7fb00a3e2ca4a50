// Reading an attribute of the current device in a launcher.
#pragma once

#include <cuda_runtime.h>

namespace flashattn::detail {

// An attribute of the current device (launchers run under DeviceGuard), or `fallback` if it cannot be read.
inline int device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, value = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess || value <= 0)
    return fallback;
  return value;
}

}  // namespace flashattn::detail
