// One test per building block of the CPU flash path: the vectorisable exp2 / tanh / fp16 widening, the
// register-blocked product with every tail and mode, tile masking, and the online-softmax helpers it uses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/half.h"
#include "common/mask.h"
#include "common/softmax_state.h"
#include "cpu/attention_tile.h"
#include "cpu/micro_gemm.h"
#include "cpu/tile_io.h"
#include "cpu/vec_math.h"

namespace flashattn::detail {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(CpuPrimitives, Exp2IsAccurateAndExactAtTheEdges) {
  double worst = 0;
  for (int i = -1260000; i <= 1260000; ++i) {
    const float x = float(i) * 1e-4f;  // [-126, 126]
    const double want = std::exp2(double(x));
    worst = std::max(worst, std::fabs(double(exp2_approx(x)) - want) / want);
  }
  EXPECT_LE(worst, 3 * 0x1p-24) << "relative error in units of fp32 unit roundoff: " << worst / 0x1p-24;
  EXPECT_EQ(exp2_approx(0.f), 1.f);
  EXPECT_EQ(exp2_approx(-kInf), 0.f);  // a masked score contributes exactly nothing
  EXPECT_EQ(exp2_approx(-200.f), 0.f);
  EXPECT_TRUE(std::isnan(exp2_approx(std::nanf(""))));
  EXPECT_EQ(exp2_approx(-1.0), 0.5);  // fp64 goes through <cmath>
}

TEST(CpuPrimitives, TanhIsAccurateAndSaturates) {
  double worst_abs = 0, worst_rel_small = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = float(i) * 1e-4f;  // [-20, 20]
    const double want = std::tanh(double(x));
    const double got = tanh_approx(x);
    worst_abs = std::max(worst_abs, std::fabs(got - want));
    if (x != 0) worst_rel_small = std::max(worst_rel_small, std::fabs(got - want) / std::fabs(want));
  }
  EXPECT_LE(worst_abs, 4 * 0x1p-24);
  EXPECT_LE(worst_rel_small, 8 * 0x1p-24);  // no cancellation near 0
  EXPECT_EQ(tanh_approx(0.f), 0.f);
  EXPECT_EQ(tanh_approx(60.f), 1.f);
  EXPECT_EQ(tanh_approx(-kInf), -1.f);
  EXPECT_TRUE(std::isnan(tanh_approx(std::nanf(""))));
}

TEST(CpuPrimitives, WidenMatchesScalarConversionsForEveryBitPattern) {
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const half_t h{uint16_t(bits)};
    const bfloat16_t b{uint16_t(bits)};
    const float want_h = to_float(h), got_h = widen(h);
    if (std::isnan(want_h)) {
      EXPECT_TRUE(std::isnan(got_h)) << bits;
    } else {
      EXPECT_EQ(float_to_bits(got_h), float_to_bits(want_h)) << "half bits " << bits;
    }
    EXPECT_EQ(float_to_bits(widen(b)), float_to_bits(to_float(b))) << "bf16 bits " << bits;
  }
}

TEST(CpuPrimitives, NarrowMatchesScalarConversions) {
  std::vector<uint32_t> bits;
  // Every exponent with the mantissas that matter for rounding (ties, just-above, just-below), both signs.
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t m : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u,
                       0x7fe000u, 0x7ff000u, 0x7fffffu, 0x400000u, 0x3ff000u})
      for (uint32_t sgn : {0u, 0x80000000u}) bits.push_back(sgn | (e << 23) | m);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000000; ++i) bits.push_back(uint32_t(rng()));
  for (uint32_t b : bits) {
    const float x = bits_to_float(b);
    const half_t h = narrow_half(x), hw = to_half(x);
    const bfloat16_t f = narrow_bf16(x), fw = to_bfloat16(x);
    ASSERT_EQ(h.bits, hw.bits) << "fp16 of bits " << std::hex << b;
    ASSERT_EQ(f.bits, fw.bits) << "bf16 of bits " << std::hex << b;
  }
}

template <typename T>
void check_gemm_all_shapes() {
  constexpr int kVec = CpuTiles<T>::kVec;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  // Every row tail (M mod kMicroRows) and column tail (N / kVec mod kMicroVecs), short and long K, strided A
  // both ways, all three modes.
  for (int64_t M : {1, 5, 6, 7, 13, 64}) {
    for (int64_t N : {int64_t(kVec), int64_t(3 * kVec), int64_t(5 * kVec), int64_t(64)}) {
      for (int64_t K : {1, 3, 64, 130}) {
        for (bool a_transposed : {false, true}) {
          const int64_t lda = a_transposed ? M + 3 : K + 2, ldb = N + kVec, ldc = N + 2 * kVec;
          std::vector<T> a(size_t(a_transposed ? K * lda : M * lda)), b(size_t(K * ldb)), c0(size_t(M * ldc));
          std::vector<T> scale(static_cast<size_t>(M));
          for (auto* v : {&a, &b, &c0, &scale})
            for (T& x : *v) x = T(nd(rng));
          const int64_t a_rs = a_transposed ? 1 : lda, a_ks = a_transposed ? lda : 1;
          for (GemmMode mode : {GemmMode::overwrite, GemmMode::add, GemmMode::scale_add}) {
            std::vector<T> c = c0;
            gemm<T>(M, N, K, a.data(), a_rs, a_ks, b.data(), ldb, c.data(), ldc, mode, scale.data());
            for (int64_t r = 0; r < M; ++r) {
              for (int64_t n = 0; n < ldc; ++n) {
                const size_t at = size_t(r * ldc + n);
                if (n >= N) {
                  ASSERT_EQ(c[at], c0[at]) << "wrote outside the N columns";
                  continue;
                }
                double want = mode == GemmMode::overwrite ? 0.0 : double(c0[at]) * (mode == GemmMode::scale_add ? double(scale[size_t(r)]) : 1.0);
                double mag = std::fabs(want);
                for (int64_t k = 0; k < K; ++k) {
                  const double p = double(a[size_t(r * a_rs + k * a_ks)]) * double(b[size_t(k * ldb + n)]);
                  want += p;
                  mag += std::fabs(p);
                }
                const double u = std::numeric_limits<T>::epsilon() / 2;
                ASSERT_NEAR(double(c[at]), want, 2 * (K + 2) * u * mag) << "M=" << M << " N=" << N << " K=" << K;
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuPrimitives, GemmFp32EveryTailAndMode) { check_gemm_all_shapes<float>(); }
TEST(CpuPrimitives, GemmFp64EveryTailAndMode) { check_gemm_all_shapes<double>(); }

// The bf16 pair operands the avx512_bf16 backward builds from fp32 values (its P and dS): rounded to nearest even,
// NaN kept, the first element of a pair in the low half, a missing partner 0.
TEST(CpuPrimitives, PairPackingRoundsToBf16InPairOrder) {
  EXPECT_EQ(to_bfloat16(1.0f + 0x1p-8f).bits, 0x3f80);      // halfway: to the even 1.0
  EXPECT_EQ(to_bfloat16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);  // halfway: to the even 1 + 2^-6
  constexpr int64_t kRows = 3, kCols = 5, kLd = 7;
  std::vector<float> src(size_t(kRows * kLd), -1.f);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) src[size_t(r * kLd + c)] = nd(rng);
  src[size_t(kLd + 2)] = std::numeric_limits<float>::quiet_NaN();
  auto bits = [&](int64_t r, int64_t c) { return uint32_t(to_bfloat16(src[size_t(r * kLd + c)]).bits); };
  std::vector<uint32_t> rows((kRows + 1) / 2 * kCols, 0xdeadbeefu);
  pack_row_pairs(src.data(), kLd, kRows, kCols, rows.data());
  for (int64_t r2 = 0; r2 < (kRows + 1) / 2; ++r2)
    for (int64_t c = 0; c < kCols; ++c) {
      const uint32_t want = bits(2 * r2, c) | (2 * r2 + 1 < kRows ? bits(2 * r2 + 1, c) << 16 : 0u);
      EXPECT_EQ(rows[size_t(r2 * kCols + c)], want) << "row pair " << r2 << " column " << c;
    }
  EXPECT_TRUE(std::isnan(to_float(bfloat16_t{uint16_t(rows[2] >> 16)})));  // row 1, column 2
  std::vector<uint32_t> adjacent((kCols + 1) / 2, 0xdeadbeefu);
  pack_adjacent_pairs(src.data(), kCols, adjacent.data());
  for (int64_t c2 = 0; c2 < (kCols + 1) / 2; ++c2)
    EXPECT_EQ(adjacent[size_t(c2)], bits(0, 2 * c2) | (2 * c2 + 1 < kCols ? bits(0, 2 * c2 + 1) << 16 : 0u)) << c2;
}

TEST(CpuPrimitives, TileMasksAgreeWithMaskSpec) {
  const int64_t shapes[][2] = {{40, 70}, {70, 40}, {64, 64}};
  // {causal, window left, window right, attention chunk}
  const int64_t windows[][4] = {{1, -1, -1, 0}, {0, 5, 3, 0}, {1, 9, -1, 0}, {0, 0, 0, 0}, {0, -1, 2, 0},
                                {0, 4, -1, 0},  {1, -1, -1, 7}, {0, -1, -1, 16}, {0, 6, 2, 5}, {1, 3, -1, 1}};
  for (const auto& sh : shapes) {
    for (const auto& w : windows) {
      const MaskSpec mask = MaskSpec::make(sh[0], sh[1], w[0] != 0, w[1], w[2], w[3]);
      const int64_t i0 = 13, j0 = 9, nq = 20, nk = 24, ld = 32;
      std::vector<float> key_major(size_t(nk * ld), 1.f), query_major(size_t(nq * ld), 1.f);
      mask_key_major(mask, key_major.data(), ld, j0, nk, i0, nq);
      mask_query_major(mask, query_major.data(), ld, i0, nq, j0, nk);
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t j = 0; j < nk; ++j) {
          const float want = mask.visible(i0 + i, j0 + j) ? 1.f : -kInf;
          ASSERT_EQ(key_major[size_t(j * ld + i)], want) << i << "," << j;
          ASSERT_EQ(query_major[size_t(i * ld + j)], want) << i << "," << j;
        }
      }
    }
  }
}

// The narrowest window edges and chunk (what the 32-bit kernel arguments carry) let every row of the sequence see
// exactly the keys the given ones do, for windows and chunks just inside, at and past the lengths and past 2^31,
// causal or not.
TEST(CpuPrimitives, NarrowestWindowEdgesMeanTheSame) {
  const int64_t shapes[][2] = {{40, 70}, {70, 40}, {64, 64}, {1, 90}, {90, 1}};
  const int64_t huge = (int64_t(1) << 32) + 5;
  for (const auto& sh : shapes) {
    const int64_t sq = sh[0], sk = sh[1];
    const int64_t edges[] = {-1, 0, 3, sq - 1, sq, sq + 1, sk - 1, sk, sk + 1, sq + sk, huge};
    const int64_t chunks[] = {0, 1, 7, sk - 1, sk, sk + 1, sq + sk, huge};
    for (int causal = 0; causal < 2; ++causal)
      for (int64_t chunk : chunks)
        for (int64_t left : edges)
          for (int64_t right : edges) {
            if (left < -1 || right < -1 || chunk < 0) continue;
            if (chunk > 0 && left != -1 && left != 3 && left != huge) continue;  // a chunk with a few windows
            const MaskSpec given = MaskSpec::make(sq, sk, causal != 0, left, right, chunk);
            const int64_t narrow_left = MaskSpec::narrowest_left(left, sk);
            const int64_t narrow_right = MaskSpec::narrowest_right(right, sq);
            const MaskSpec narrow =
                MaskSpec::make(sq, sk, causal != 0, narrow_left, narrow_right, MaskSpec::narrowest_chunk(chunk, sk));
            for (int64_t i = 0; i < sq; ++i) {
              int64_t lo_given, hi_given, lo_narrow, hi_narrow;
              given.key_range(i, &lo_given, &hi_given);
              narrow.key_range(i, &lo_narrow, &hi_narrow);
              const int64_t seen_given = hi_given > lo_given ? hi_given - lo_given : 0;
              const int64_t seen_narrow = hi_narrow > lo_narrow ? hi_narrow - lo_narrow : 0;
              ASSERT_EQ(seen_given, seen_narrow) << sq << "x" << sk << " causal " << causal << " window (" << left << ", "
                                                 << right << ") row " << i;
              if (seen_given > 0) ASSERT_EQ(lo_given, lo_narrow) << sq << "x" << sk << " row " << i;
              for (int64_t j = -1; j <= sk; ++j) ASSERT_EQ(given.visible(i, j), narrow.visible(i, j)) << i << "," << j;
            }
          }
  }
}

TEST(CpuPrimitives, SoftmaxStateHelpersMatchTheScalarState) {
  using S = SoftmaxState<double>;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(S::exp_offset(-inf), 0.0);
  EXPECT_EQ(S::exp_offset(3.5), 3.5);
  // exp(old - exp_offset(new)) reproduces rescale_factor, the all-masked case included.
  for (double old_m : {-inf, -2.0, 1.0})
    for (double new_m : {-inf, -1.0, 4.0}) {
      if (new_m < old_m) continue;
      EXPECT_EQ(std::exp(old_m - S::exp_offset(new_m)), S::rescale_factor(old_m, new_m)) << old_m << " " << new_m;
    }
  // lse_from_log2 is lse() with m and d kept in log2 units.
  S st;
  for (double s : {0.3, -1.2, 2.5}) {
    const double f = st.update_max(s);
    (void)f;
    st.d += st.prob(s);
  }
  EXPECT_NEAR(S::lse_from_log2(st.m * kLog2e, st.d), st.lse(), 1e-14);
  EXPECT_EQ(S::lse_from_log2(-inf, 0.0), -inf);
}

}  // namespace
}  // namespace flashattn::detail
