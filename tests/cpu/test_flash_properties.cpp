// Properties of the CPU flash path beyond matching the reference: determinism (bitwise, run to run and across
// thread counts), the optional LSE, exact zeros for rows and keys that see nothing, and dropout's: a fixed seed
// repeats bitwise, another offset draws another mask, a (sequence, head)'s mask does not depend on the batch size
// or head count, and the mean over many seeds is the output without dropout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "cpu/attention_problem.h"

namespace flashattn::test {
namespace {

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Shapes that take each path of the backward's work split: a single (batch, KV head) split into key chunks,
// grouped heads split into head parts, enough units for no split, and varlen.
std::vector<AttnCase> determinism_cases() {
  std::vector<AttnCase> cases;
  AttnCase c;
  c.dtype = DType::f32, c.batch = 1, c.s_q = 300, c.s_k = 400, c.h_q = 1, c.h_kv = 1, c.d = 64, c.dv = 64;
  c.causal = true;
  cases.push_back(c);  // key chunks
  c.h_q = 8, c.h_kv = 2, c.window_left = 50, c.causal = false, c.dtype = DType::bf16;
  cases.push_back(c);  // head parts
  c.batch = 4, c.h_q = 8, c.h_kv = 4, c.s_q = 100, c.s_k = 100, c.dtype = DType::f16, c.softcap = 10;
  cases.push_back(c);  // no split
  c.batch = 1, c.h_q = 4, c.h_kv = 4, c.s_q = 1100, c.s_k = 700, c.d = 16, c.dv = 16, c.dtype = DType::f32;
  cases.push_back(c);  // the forward's tallest query blocks
  AttnCase v;
  v.dtype = DType::f32, v.h_q = 2, v.h_kv = 1, v.d = 32, v.dv = 32, v.causal = true;
  v.lens_q = {130, 0, 70}, v.lens_k = {200, 5, 64};
  cases.push_back(v);  // varlen with per-batch chunking
  return cases;
}

TEST(FlashProperties, BackwardIsBitwiseDeterministicAcrossRunsAndThreadCounts) {
  for (const AttnCase& c : determinism_cases()) {
    const AttnProblem pb(c, 11);
    const AttnResult first = run_attention(pb, Backend::cpu_flash, true, 0);
    // Every thread count, then the default one again and again: a sum whose order depended on scheduling would
    // show up as a run that differs, and two runs are not enough to see it.
    for (int threads : {0, 1, 2, 3, 5, 0, 0, 0, 0, 0, 0, 0, 0}) {
      const AttnResult again = run_attention(pb, Backend::cpu_flash, true, threads);
      EXPECT_TRUE(bitwise_equal(first.o, again.o)) << c.name() << " O, threads " << threads;
      EXPECT_TRUE(bitwise_equal(first.lse, again.lse)) << c.name() << " LSE, threads " << threads;
      EXPECT_TRUE(bitwise_equal(first.dq, again.dq)) << c.name() << " dQ, threads " << threads;
      EXPECT_TRUE(bitwise_equal(first.dk, again.dk)) << c.name() << " dK, threads " << threads;
      EXPECT_TRUE(bitwise_equal(first.dv, again.dv)) << c.name() << " dV, threads " << threads;
    }
  }
}

TEST(FlashProperties, DropoutRepeatsWithItsSeedAndChangesWithTheOffset) {
  AttnCase c;
  c.batch = 2, c.s_q = 70, c.s_k = 90, c.h_q = 4, c.h_kv = 2, c.d = 32, c.dv = 32, c.causal = true;
  c.dropout_p = 0.25;
  const AttnProblem pb(c, 21);
  const AttnResult first = run_attention(pb, Backend::cpu_flash, true);
  for (int threads : {1, 2, 3, 0}) {
    const AttnResult again = run_attention(pb, Backend::cpu_flash, true, threads);
    EXPECT_TRUE(bitwise_equal(first.o, again.o) && bitwise_equal(first.dq, again.dq) &&
                bitwise_equal(first.dk, again.dk) && bitwise_equal(first.dv, again.dv))
        << "threads " << threads;
  }
  AttnCase next = c;
  next.dropout_offset = c.dropout_offset + 1;
  const AttnResult other = run_attention(AttnProblem(next, 21), Backend::cpu_flash, true);
  EXPECT_FALSE(bitwise_equal(first.o, other.o));
  EXPECT_TRUE(bitwise_equal(first.lse, other.lse)) << "the LSE is that of the undropped scores";
}

TEST(FlashProperties, DropoutFromAGeneratorStateTensorDrawsTheOptionsMask) {
  // dropout_rng = {seed, offset} gives bitwise the outputs of the same seed and offset as options (the case
  // alters the options' seed, so a backend that ignored the tensor would draw another mask), on both backends.
  AttnCase c;
  c.batch = 2, c.s_q = 40, c.s_k = 75, c.h_q = 4, c.h_kv = 2, c.d = 16, c.dv = 16, c.causal = true;
  c.dropout_p = 0.3, c.dropout_seed = 0x1234567890abcdefull, c.dropout_offset = 8;
  AttnCase with_tensor = c;
  with_tensor.dropout_rng_tensor = true;
  for (Backend backend : {Backend::cpu_reference, Backend::cpu_flash}) {
    const AttnResult want = run_attention(AttnProblem(c, 5), backend, true);
    const AttnResult got = run_attention(AttnProblem(with_tensor, 5), backend, true);
    EXPECT_TRUE(bitwise_equal(want.o, got.o) && bitwise_equal(want.lse, got.lse) && bitwise_equal(want.dq, got.dq) &&
                bitwise_equal(want.dk, got.dk) && bitwise_equal(want.dv, got.dv))
        << backend_name(backend);
  }
}

TEST(FlashProperties, DropoutMaskOfASequenceHeadIgnoresBatchAndHeadCounts) {
  // Sequence 0, heads 0 and 1 of a 1 x 2-head problem and of a 3 x 4-head problem with the same data there: the
  // reference (one fp64 row at a time) must give the same bits.
  AttnCase small;
  small.s_q = 20, small.s_k = 33, small.h_q = small.h_kv = 2, small.d = small.dv = 8, small.dropout_p = 0.5;
  AttnCase big = small;
  big.batch = 3, big.h_q = big.h_kv = 4;
  const AttnProblem ps(small, 3), pbig(big, 4);
  // Copy the small problem's q, k, v into the big one's (sequence 0, heads 0-1).
  HostTensor q = pbig.q(), k = pbig.k(), v = pbig.v();
  auto embed = [](const HostTensor& from, HostTensor& to) {
    const auto& s = from.shape();
    for (int64_t i = 0; i < s[1]; ++i)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t c = 0; c < s[3]; ++c) to.set(to.offset({0, i, h, c}), from.get(from.offset({0, i, h, c})));
  };
  embed(ps.q(), q), embed(ps.k(), k), embed(ps.v(), v);
  HostTensor out_s = ps.alloc_out(small.dtype), out_b = pbig.alloc_out(big.dtype);
  ASSERT_TRUE(attention_forward(ps.forward_args(ps.q(), ps.k(), ps.v(), out_s, nullptr), small.options(Backend::cpu_reference)).ok());
  ASSERT_TRUE(attention_forward(pbig.forward_args(q, k, v, out_b, nullptr), big.options(Backend::cpu_reference)).ok());
  for (int64_t i = 0; i < small.s_q; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < small.dv; ++c)
        ASSERT_EQ(out_s.get(out_s.offset({0, i, h, c})), out_b.get(out_b.offset({0, i, h, c}))) << i << " " << h;
}

TEST(FlashProperties, DropoutAveragesToTheOutputWithout) {
  AttnCase c;
  c.s_q = 12, c.s_k = 20, c.h_q = c.h_kv = 1, c.d = c.dv = 8, c.dropout_p = 0.4;
  AttnCase plain_case = c;
  plain_case.dropout_p = 0;
  const AttnProblem plain_pb(plain_case, 9);
  const std::vector<double> plain = run_attention(plain_pb, Backend::cpu_flash, false).o;
  constexpr int kSeeds = 400;
  std::vector<double> sum(plain.size(), 0.0), sum_sq(plain.size(), 0.0);
  for (int s = 0; s < kSeeds; ++s) {
    c.dropout_seed = uint64_t(1000 + s);
    const std::vector<double> o = run_attention(AttnProblem(c, 9), Backend::cpu_flash, false).o;
    for (size_t e = 0; e < o.size(); ++e) sum[e] += o[e], sum_sq[e] += o[e] * o[e];
  }
  int64_t outside = 0;
  for (size_t e = 0; e < plain.size(); ++e) {
    const double mean = sum[e] / kSeeds, var = std::max(sum_sq[e] / kSeeds - mean * mean, 0.0);
    // 5 standard errors, plus fp32 rounding.
    if (std::fabs(mean - plain[e]) > 5 * std::sqrt(var / kSeeds) + 1e-5) ++outside;
  }
  EXPECT_EQ(outside, 0) << "of " << plain.size() << " elements";
}

TEST(FlashProperties, ForwardWithoutLse) {
  AttnCase c;
  c.s_q = 70, c.s_k = 90, c.h_q = 2, c.h_kv = 1, c.d = 48, c.dv = 48, c.causal = true;
  const AttnProblem pb(c, 5);
  HostTensor with = pb.alloc_out(c.dtype), without = pb.alloc_out(c.dtype), lse = pb.alloc_lse();
  with.poison(), without.poison();
  ASSERT_TRUE(attention_forward(pb.forward_args(pb.q(), pb.k(), pb.v(), with, &lse), c.options(Backend::cpu_flash)).ok());
  ASSERT_TRUE(attention_forward(pb.forward_args(pb.q(), pb.k(), pb.v(), without, nullptr), c.options(Backend::cpu_flash)).ok());
  EXPECT_TRUE(bitwise_equal(with.values(), without.values()));
}

// Causal with a zero-width left window: query i sees only key i + s_k - s_q. With s_q > s_k the first
// s_q - s_k rows see nothing (O = 0, LSE = -inf, dQ = 0); with s_q < s_k the first s_k - s_q keys are seen by
// nobody (dK = dV = 0). Every other row sees exactly one key: its probability is 1 whatever the score, so dS = 0
// and dQ, dK are exactly 0 everywhere (D = rowsum(dO ∘ O) must equal dP bitwise there, not up to the rounding of
// two summation orders).
TEST(FlashProperties, RowsAndKeysThatSeeNothingGiveExactZeros) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (bool more_queries : {true, false}) {
      AttnCase c;
      c.dtype = dt, c.batch = 2, c.h_q = 4, c.h_kv = 2, c.d = 32, c.dv = 16;
      c.s_q = more_queries ? 90 : 20, c.s_k = more_queries ? 40 : 70;
      c.causal = true, c.window_left = 0;
      const AttnProblem pb(c, 9);
      const AttnResult r = run_attention(pb, Backend::cpu_flash, true);
      const RowIndex rq = pb.rows(true, c.h_q, c.d), ro = pb.rows(true, c.h_q, c.dv);
      const RowIndex rk = pb.rows(false, c.h_kv, c.d), rv = pb.rows(false, c.h_kv, c.dv);
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t h = 0; h < c.h_q; ++h)
          for (int64_t i = 0; i < c.s_q; ++i) {
            const double lse = r.lse[size_t(pb.lse_index(rq, b, h, i))];
            for (int64_t x = 0; x < c.d; ++x) EXPECT_EQ(r.dq[size_t(rq.at(b, i, h, x))], 0.0) << dtype_name(dt);
            if (i + c.s_k - c.s_q >= 0) {
              EXPECT_TRUE(std::isfinite(lse));
              continue;
            }
            EXPECT_EQ(lse, -INFINITY) << dtype_name(dt);
            for (int64_t x = 0; x < c.dv; ++x) EXPECT_EQ(r.o[size_t(ro.at(b, i, h, x))], 0.0);
          }
        for (int64_t h = 0; h < c.h_kv; ++h)
          for (int64_t j = 0; j < c.s_k; ++j) {
            for (int64_t x = 0; x < c.d; ++x) EXPECT_EQ(r.dk[size_t(rk.at(b, j, h, x))], 0.0) << dtype_name(dt);
            if (j >= c.s_k - c.s_q) continue;
            for (int64_t x = 0; x < c.dv; ++x) EXPECT_EQ(r.dv[size_t(rv.at(b, j, h, x))], 0.0);
          }
      }
    }
  }
}

TEST(FlashProperties, EmptyProblems) {
  for (int64_t sq : {0, 3})
    for (int64_t sk : {0, 3}) {
      if (sq > 0 && sk > 0) continue;
      AttnCase c;
      c.batch = 2, c.s_q = sq, c.s_k = sk, c.h_q = 2, c.h_kv = 1, c.d = 8, c.dv = 8;
      const AttnProblem pb(c, 1);
      const AttnResult r = run_attention(pb, Backend::cpu_flash, true);
      for (double x : r.o) EXPECT_EQ(x, 0.0);  // s_k = 0: every row sees nothing
      for (double x : r.lse) EXPECT_EQ(x, -INFINITY);
      for (double x : r.dq) EXPECT_EQ(x, 0.0);
      for (double x : r.dk) EXPECT_EQ(x, 0.0);  // s_q = 0: no query sees any key
      for (double x : r.dv) EXPECT_EQ(x, 0.0);
    }
}

}  // namespace
}  // namespace flashattn::test
