// Round to nearest, ties to even, into the 16-bit storage types, from the formats' definitions (bf16: 8
// significant bits and float's exponent range; fp16: 11 significant bits, exponents down to 2^-14, subnormals
// below, largest finite 65504), not from the library's conversions: what every store of a backend is checked
// against. And the floats that probe a conversion at every boundary of a format.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "flashattn/types.h"

namespace flashattn::test {

inline double round_to_storage(DType t, double x) {
  if (t == DType::f64 || !std::isfinite(x) || x == 0) return x;
  if (t == DType::f32) return double(float(x));
  const bool bf16 = t == DType::bf16;
  const int significant_bits = bf16 ? 8 : 11;
  const int min_exponent = bf16 ? -126 : -14;
  const double largest = bf16 ? 0x1.fep127 : 65504.0;
  const int exponent = std::max(std::ilogb(x), min_exponent);
  const double quantum = std::ldexp(1.0, exponent - (significant_bits - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // the default rounding mode: to nearest even
  return std::fabs(r) > largest ? std::copysign(INFINITY, x) : r;
}

// The value of a 16-bit pattern of the format, decoded from its fields.
inline double value_of_bits(DType t, uint16_t bits) {
  if (t == DType::bf16) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

// Floats around every boundary of a 16-bit format: each finite value, the midpoints to its neighbours (ties), one
// float step on either side of them and the quarter points, both signs; random floats across the range; the
// overflow threshold and infinities.
inline std::vector<float> rounding_probes(DType t) {
  std::vector<float> xs;
  const uint16_t largest = t == DType::bf16 ? 0x7f7f : 0x7bff;
  for (uint16_t b = 0; b <= largest; ++b) {
    const double x = value_of_bits(t, b), next = value_of_bits(t, uint16_t(b + 1));
    const float mid = float((x + next) / 2);  // exact: one bit more than the format
    for (float f : {float(x), mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY), float(x + (next - x) / 4),
                    float(x + 3 * (next - x) / 4)})
      if (std::isfinite(f)) xs.push_back(f), xs.push_back(-f);
  }
  std::mt19937 rng(7);
  for (int n = 0; n < 200000; ++n) {
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (std::isfinite(f)) xs.push_back(f);
  }
  for (float f : {INFINITY, -INFINITY, 65519.996f, 65520.f, 0x1.fep127f, 0x1.ffp127f, 1e-45f, 3e-8f}) xs.push_back(f);
  return xs;
}

}  // namespace flashattn::test
