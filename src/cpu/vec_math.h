// Element functions of the CPU flash path written so that loops calling them vectorise: no branches (selects
// only), no library calls, bit casts through memcpy. fp32 gets polynomial approximations accurate to about
// 2 ulp (the kernels accumulate in fp32, so this is below their rounding noise); fp64 uses <cmath>, since the
// fp64 path exists for accuracy, not speed.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/half.h"
#include "cpu/tile_config.h"

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

constexpr double kLog2e = 1.4426950408889634074;  // log2(e): exp(x) = exp2(x * log2e)
constexpr double kLn2 = 0.6931471805599453094;

// 2^x for scores already in log2 units. Below -126.5 (the normal range, -inf included) the result is exactly 0,
// which is what a masked score must contribute; NaN stays NaN.
inline float exp2_approx(float x) {
  const float lo = x > -127.f ? x : -127.f;  // also maps NaN to a finite value so that the int conversion is defined
  const float xc = lo < 127.f ? lo : 127.f;
  const float kRoundMagic = 0x1.8p23f;  // adding then subtracting it rounds to the nearest integer
  const float n = (xc + kRoundMagic) - kRoundMagic;
  const float f = xc - n;  // in [-0.5, 0.5]
  // 2^f on [-0.5, 0.5]: a degree-6 fit minimising relative error (max 2e-9, far below fp32 rounding).
  float p = 0.00015353361815311802f;
  p = p * f + 0.0013398874445466728f;
  p = p * f + 0.009618437358297292f;
  p = p * f + 0.055503324710266845f;
  p = p * f + 0.24022647913619652f;
  p = p * f + 0.6931472028551295f;
  p = p * f + 1.f;
  // 2^n from its exponent bits; n = -127 (x below -126.5) gives the bit pattern 0, i.e. exactly 0.
  const float scale = bits_to_float(uint32_t(int32_t(n) + 127) << 23);
  const float r = p * scale;
  return x != x ? x : r;
}

inline double exp2_approx(double x) { return std::exp2(x); }

// tanh for the softcap. Near 0, an odd polynomial (1 - e)/(1 + e) would lose relative accuracy to cancellation;
// elsewhere tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|), which saturates to exactly +-1 for large |x|.
inline float tanh_approx(float x) {
  const float ax = std::fabs(x);
  const float x2 = x * x;
  // tanh(x) / x - 1 on [0, 0.4] as a polynomial in x^2 (relative error 2e-9).
  float q = 0.018744062623468654f;
  q = q * x2 - 0.05356193707223088f;
  q = q * x2 + 0.13331214166973052f;
  q = q * x2 - 0.33333298712753967f;
  const float small = x + x * x2 * q;
  const float e = exp2_approx(float(-2.0 * kLog2e) * ax);
  const float big = (1.f - e) / (1.f + e);
  const float big_signed = x < 0.f ? -big : big;
  return ax < 0.4f ? small : big_signed;
}

inline double tanh_approx(double x) { return std::tanh(x); }

// Storage type -> accumulation type, branch-free (so tile conversions vectorise).
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
inline float widen(bfloat16_t h) { return bits_to_float(uint32_t(h.bits) << 16); }
inline float widen(half_t h) {
  const uint32_t bits = h.bits;
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t em = bits & 0x7fffu;  // exponent and mantissa
  // Shifted into fp32 position, the half's fields read as a float 2^-112 times too small, subnormals included
  // (they land on fp32 subnormals with the right mantissa); one exact multiply rebiases both cases.
  const float finite = bits_to_float(em << 13) * 0x1p112f;
  const float special = bits_to_float((em << 13) | 0x7f800000u);  // inf / NaN keep their payload
  const float mag = em >= 0x7c00u ? special : finite;
  return bits_to_float(float_to_bits(mag) | sign);
}

// fp32 -> bf16, round to nearest even, NaN kept a (quiet) NaN; branch-free, same results as to_bfloat16.
inline bfloat16_t narrow_bf16(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return {uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// fp32 -> fp16, round to nearest even (overflow to inf, subnormals exact), NaN -> quiet NaN; branch-free, same
// results as to_half. Normal results: rebias the exponent and round on the 13 dropped bits with integer adds.
// Subnormal results: adding 0.5f lines the value's bits up with the fp16 subnormal's, and the fp32 adder rounds.
inline half_t narrow_half(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t special = a > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN, or inf / too large
  const uint32_t sub = float_to_bits(bits_to_float(a) + 0.5f) - 0x3f000000u;
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // 0xc8000000: exponent 127 -> 15
  const uint32_t mag = a >= 0x47800000u ? special : (a < 0x38800000u ? sub : normal);
  return {uint16_t(sign | mag)};
}

// Accumulation type -> storage type, branch-free so that output rows vectorise.
template <typename T, typename Acc>
inline T narrow(Acc x) {
  if constexpr (std::is_same_v<T, half_t>) {
    return narrow_half(float(x));
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return narrow_bf16(float(x));
  } else {
    return T(x);
  }
}

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
