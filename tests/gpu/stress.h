// The stress tests' loop: many back-to-back launches of one call must give bitwise the outputs of the first (a
// race shows up rarely, as a hang or a wrong tile). Host code over sm90::count_differing_words, which compares on
// the device so that launches stay back to back.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "gpu/sm90_primitive_kernels.h"

namespace flashattn::test {

// A shape of the benchmark grid (B·S tokens, H·D model width, bf16) and how many times to launch it.
struct StressShape {
  int64_t head_dim, seqlen;
  bool causal;
  int launches;
  std::string name() const {
    return "hd " + std::to_string(head_dim) + " seqlen " + std::to_string(seqlen) + (causal ? " causal" : "");
  }
};

struct DeviceRegion {
  void* data;
  size_t bytes;  // a multiple of 4
};

// Runs `launch` `launches` times; expects every launch to succeed and the 32-bit words of `outputs` after each
// to equal those after the first.
inline void expect_identical_over_launches(int launches, const std::function<Status()>& launch,
                                           const std::vector<DeviceRegion>& outputs, const std::string& what) {
  Status st = launch();
  ASSERT_TRUE(st.ok()) << st.message;
  std::vector<std::unique_ptr<void, cudaError_t (*)(void*)>> firsts;
  for (const DeviceRegion& r : outputs) {
    void* copy = nullptr;
    ASSERT_EQ(cudaMalloc(&copy, r.bytes), cudaSuccess);
    firsts.emplace_back(copy, cudaFree);
    ASSERT_EQ(cudaMemcpy(copy, r.data, r.bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
  }
  unsigned* differing = nullptr;
  ASSERT_EQ(cudaMalloc(&differing, sizeof(unsigned)), cudaSuccess);
  const std::unique_ptr<void, cudaError_t (*)(void*)> differing_owner(differing, cudaFree);
  ASSERT_EQ(cudaMemset(differing, 0, sizeof(unsigned)), cudaSuccess);
  cudaError_t compared = cudaSuccess;
  for (int i = 1; i < launches && st.ok() && compared == cudaSuccess; ++i) {
    st = launch();
    for (size_t r = 0; r < outputs.size() && st.ok() && compared == cudaSuccess; ++r)
      compared = sm90::count_differing_words(outputs[r].data, firsts[r].get(), outputs[r].bytes, differing);
  }
  unsigned total = 0;
  const cudaError_t synced = cudaMemcpy(&total, differing, sizeof total, cudaMemcpyDeviceToHost);
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(compared, cudaSuccess) << cudaGetErrorString(compared);
  ASSERT_EQ(synced, cudaSuccess) << cudaGetErrorString(synced);
  EXPECT_EQ(total, 0u) << "32-bit words of " << what << " that differed from the first launch's, over "
                       << launches - 1 << " launches";
}

}  // namespace flashattn::test
