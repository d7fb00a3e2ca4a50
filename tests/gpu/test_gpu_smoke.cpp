#include <gtest/gtest.h>

#include "flashattn/flashattn.h"

TEST(GpuSmoke, ReportsDevices) {
  if (flashattn::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_GE(flashattn::cuda_compute_capability(0), 80);
}
