// Every store of the CUDA kernels rounds to nearest even: the narrowing they all store with (pack_pair) over
// every boundary of both 16-bit formats, ties included; and, end to end, outputs whose exact value is known (the
// construction of tests/cpu/test_oracle.cpp, BackendsStoreTheRoundedExactValue) on whatever dispatch picks (the
// Hopper kernels on an H200, where they run the shape) and on the sm80 kernels:
// - forward: four keys with the same K row give every query probabilities of 1/4, so O is the mean of four rows
//   of V. The kernels' exp2(s · scale · log2e − m · scale · log2e) leaves a residue of the order of fp32's
//   rounding (an FMA against the rounded product), so O is exact only to about 1e-7 relative: V is chosen so that
//   each mean lies a quarter or three quarters of a unit in the last place between two 16-bit values, where that
//   residue cannot change the rounding but truncation would (ties are pack_pair's test above);
// - backward: one key and Q = 0 give P = 1 and LSE = 0 exactly, so dV is the plain sum of dO's rows and dK = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/rounding.h"
#include "gpu/device_tensor.h"
#include "gpu/store_kernels.h"

namespace flashattn::test {
namespace {

TEST(GpuStores, PackPairRoundsToNearestEven) {
  FA_REQUIRE_GPU();
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<float> xs = rounding_probes(t);
    if (xs.size() % 2) xs.push_back(1.f);
    const int pairs = int(xs.size() / 2);
    float* in = nullptr;
    uint32_t* out = nullptr;
    FA_CUDA_CHECK(cudaMalloc(&in, xs.size() * sizeof(float)));
    FA_CUDA_CHECK(cudaMalloc(&out, size_t(pairs) * sizeof(uint32_t)));
    FA_CUDA_CHECK(cudaMemcpy(in, xs.data(), xs.size() * sizeof(float), cudaMemcpyHostToDevice));
    FA_CUDA_CHECK(stores::pack_pairs(t == DType::bf16, in, out, pairs));
    std::vector<uint32_t> words(static_cast<size_t>(pairs));
    FA_CUDA_CHECK(cudaMemcpy(words.data(), out, words.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaFree(in);
    cudaFree(out);
    int64_t wrong = 0;
    std::string first;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint16_t bits = uint16_t(i % 2 ? words[i / 2] >> 16 : words[i / 2] & 0xffffu);
      const double got = value_of_bits(t, bits), want = round_to_storage(t, xs[i]);
      if (got != want || std::signbit(got) != std::signbit(want))
        if (wrong++ == 0) first = std::to_string(xs[i]) + " gave " + std::to_string(got) + ", want " + std::to_string(want);
    }
    EXPECT_EQ(wrong, 0) << dtype_name(t) << ": first " << first;
  }
}

// One shape on one backend: O of the forward and dV, dK of the backward against the rounded exact values.
void expect_exact_stores(DType dt, int64_t d, Backend backend) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " d " + std::to_string(d) + " " + backend_name(backend));
  std::mt19937_64 rng(uint64_t(d) * 3 + int(dt));
  std::uniform_real_distribution<double> unit(1.0, 2.0);
  auto signed_unit = [&] { return (rng() % 2 ? 1 : -1) * unit(rng); };
  AttentionOptions opt;
  opt.backend = backend;

  // Forward: 2 heads of 150 queries (a partial query tile), 4 keys sharing one K row.
  const int64_t sq = 150, sk = 4, heads = 2;
  HostTensor q(dt, {1, sq, heads, d}), k(dt, {1, sk, heads, d}), v(dt, {1, sk, heads, d}), o(dt, {1, sq, heads, d});
  q.fill_normal(rng);
  k.fill_normal(rng);
  for (int64_t j = 1; j < sk; ++j)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t x = 0; x < d; ++x) k.set(k.offset({0, j, h, x}), k.get(k.offset({0, 0, h, x})));
  // Per column: three rows x0 and one x0 + n·ulp (n = 1 or 3), so the mean is x0 + n·ulp / 4; x0 in [1, 2).
  const int mantissa_steps = dt == DType::bf16 ? 128 : 1024;
  const double ulp = 1.0 / mantissa_steps;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t x = 0; x < d; ++x) {
      const double sign = rng() % 2 ? 1 : -1, x0 = 1 + double(rng() % uint64_t(mantissa_steps - 4)) * ulp;
      const double quarters = rng() % 2 ? 1 : 3;
      for (int64_t j = 0; j < sk; ++j) v.set(v.offset({0, j, h, x}), sign * (j + 1 < sk ? x0 : x0 + quarters * ulp));
    }
  o.poison();
  {
    DeviceTensor dq(q), dk(k), dv(v), dout(o);
    ForwardArgs a;
    a.q = dq.view(q), a.k = dk.view(k), a.v = dv.view(v), a.out = dout.view(o);
    const Status st = attention_forward(a, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    dout.download(o);
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t x = 0; x < d; ++x) {
        double sum = 0;
        for (int64_t j = 0; j < sk; ++j) sum += v.get(v.offset({0, j, h, x}));
        wrong += o.get(o.offset({0, i, h, x})) != round_to_storage(dt, sum / 4);
      }
  EXPECT_EQ(wrong, 0) << "O elements that are not the rounded mean of V";

  // Backward: 70 queries of 2 heads, one key (of one KV head), Q = 0.
  const int64_t rows = 70;
  HostTensor q0(dt, {1, rows, heads, d}), k1(dt, {1, 1, 1, d}), v1(dt, {1, 1, 1, d}), o1(dt, {1, rows, heads, d});
  HostTensor lse(DType::f32, {1, heads, rows}), dout(dt, {1, rows, heads, d});
  HostTensor dq(dt, {1, rows, heads, d}), dk(dt, {1, 1, 1, d}), dv(dt, {1, 1, 1, d});
  q0.for_each([&](int64_t off) { q0.set(off, 0.0); });
  k1.fill_normal(rng);
  v1.fill_normal(rng);
  dout.for_each([&](int64_t off) { dout.set(off, signed_unit()); });
  dk.poison(), dv.poison();
  {
    DeviceTensor t_q(q0), t_k(k1), t_v(v1), t_o(o1), t_lse(lse), t_do(dout), t_dq(dq), t_dk(dk), t_dv(dv);
    BackwardArgs a;
    a.q = t_q.view(q0), a.k = t_k.view(k1), a.v = t_v.view(v1), a.out = t_o.view(o1), a.lse = t_lse.view(lse);
    a.dout = t_do.view(dout), a.dq = t_dq.view(dq), a.dk = t_dk.view(dk), a.dv = t_dv.view(dv);
    Status st = attention_forward(a, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    st = attention_backward(a, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    t_dk.download(dk), t_dv.download(dv);
  }
  wrong = 0;
  for (int64_t x = 0; x < d; ++x) {
    double sum = 0;  // both query heads share the one KV head
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t h = 0; h < heads; ++h) sum += dout.get(dout.offset({0, i, h, x}));
    wrong += dv.get(dv.offset({0, 0, 0, x})) != round_to_storage(dt, sum);
    EXPECT_EQ(dk.get(dk.offset({0, 0, 0, x})), 0.0);
  }
  EXPECT_EQ(wrong, 0) << "dV elements that are not the rounded sum of dO";
}

TEST(GpuStores, OutputsAreTheRoundedExactValue) {
  FA_REQUIRE_GPU();
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256, 96})
      for (Backend backend : {Backend::automatic, Backend::cuda_sm80}) expect_exact_stores(dt, d, backend);
}

}  // namespace
}  // namespace flashattn::test
