// Host-side fp16 / bf16 <-> fp32 conversions (round to nearest even), for the CPU backends and tests.
// The CUDA kernels use the hardware conversions in cuda_fp16.h / cuda_bf16.h instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashattn {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float to_float(bfloat16_t h) { return bits_to_float(uint32_t(h.bits) << 16); }

// float8_e4m3fn (types.h) to float: exact (every e4m3 value is a float).
inline float e4m3_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return bits_to_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // subnormal: mant / 8 * 2^-6, exact in float
    const float magnitude = float(mant) * (1.0f / 512.0f);
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exp + 127 - 7) << 23) | (mant << 20));
}

inline bfloat16_t to_bfloat16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return {uint16_t(u >> 16)};
}

inline float to_float(half_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: normalise the mantissa.
    exp = 127 - 15 + 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3ffu;
    return bits_to_float(sign | (exp << 23) | (mant << 13));
  }
  return bits_to_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

inline half_t to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                                     // below the smallest normal half: subnormal
    if (abs < 0x33000000u) return {sign};                      // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) + ... : puts the value in units of 2^-24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half_ulp = 1u << (shift - 1);
    if (rem > half_ulp || (rem == half_ulp && (q & 1u))) ++q;
    return {uint16_t(sign | q)};
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return {uint16_t(sign | (r >> 13))};
}

// float to float8_e4m3fn, to nearest even, saturating at +-448 (the hardware's cvt.rn.satfinite, with which FA3's
// kernels store rows they rotate); NaN stays NaN. For rows the library itself writes in e4m3 (rotated cache rows).
inline uint8_t to_e4m3(float f) {
  const uint8_t sign = uint8_t((float_to_bits(f) >> 24) & 0x80u);
  const float a = std::fabs(f);
  if (std::isnan(a)) return uint8_t(sign | 0x7fu);
  if (a >= 448.0f) return uint8_t(sign | 0x7eu);
  // Below the smallest normal (2^-6) the values are multiples of 2^-9; a result of 8 is the smallest normal's code.
  if (a < 0x1p-6f) return uint8_t(sign | uint32_t(std::nearbyint(a * 0x1p9f)));
  int e;
  const float m = std::frexp(a, &e);                             // a = m 2^e, m in [0.5, 1)
  uint32_t eighths = uint32_t(std::nearbyint((2 * m - 1) * 8));  // exact products: one rounding, to even
  uint32_t exp = uint32_t(e - 1 + 7);
  if (eighths == 8) eighths = 0, ++exp;
  return uint8_t(sign | (exp << 3) | eighths);  // a < 448 keeps (exp, eighths) below S.1111.111 (NaN)
}

// Uniform access for templates over the storage type.
inline float to_float(float f) { return f; }
inline double to_float(double f) { return f; }
// Stores a computed value in the storage type T (double in, so fp64 storage loses nothing).
template <typename T>
T from_double(double x);
template <>
inline float from_double<float>(double x) { return float(x); }
template <>
inline double from_double<double>(double x) { return x; }
template <>
inline half_t from_double<half_t>(double x) { return to_half(float(x)); }
template <>
inline bfloat16_t from_double<bfloat16_t>(double x) { return to_bfloat16(float(x)); }

}  // namespace flashattn
