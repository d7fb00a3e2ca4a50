// ALiBi (attention with linear biases), written once for every backend: query row i of a sequence with s_q
// queries and s_k keys gains, on its score for key j, the bias
//   -slope · |i + s_k - s_q - j|
// after the scale and the softcap, i.e. a linear penalty on the distance from the row's diagonal (the same
// bottom-right alignment as the mask, common/mask.h). slope = slopes[b · batch_stride + h] for query head h of
// sequence b (batch_stride 0: one slope per head). The bias is the same with or without a causal mask, so the LSE
// is that of the biased scores (flash_attn 2's causal kernels add slope · j instead, which shifts their LSE by a
// per-row constant; outputs and gradients agree). The slopes are constants: they get no gradient.
//
// Kernels keep scores in their own units (raw Q·K, or log2 units): they take `slope_in(units)` and add
// -slope_u · |distance| where the mask is applied, on every tile (a tile the mask skips stays skipped).
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn {

template <typename Index>
struct BasicAlibi {
  float slope = 0.f;  // in natural-log score units; 0: no bias
  Index shift = 0;    // s_k - s_q: row i's diagonal is key i + shift

  FA_HD static BasicAlibi make(const float* slopes, int64_t batch_stride, int64_t b, int64_t h, Index sq, Index sk) {
    BasicAlibi a;
    a.slope = slopes == nullptr ? 0.f : slopes[b * batch_stride + h];
    a.shift = sk - sq;
    return a;
  }

  FA_HD bool active() const { return slope != 0.f; }

  // |i + s_k - s_q - j|: how far key j lies from row i's diagonal.
  FA_HD Index distance(Index i, Index j) const {
    const Index t = i + shift - j;
    return t < 0 ? -t : t;
  }

  // The bias in natural-log units, in double (the reference backends).
  FA_HD double bias(Index i, Index j) const { return -double(slope) * double(distance(i, j)); }

  // The slope in a kernel's score units, for a unit worth `unit` natural-log units: softmax_scale for raw Q·K
  // products, ln 2 for log2 units (scores pre-multiplied by log2 e), 1 for softcapped natural units.
  FA_HD float slope_in(float unit) const { return slope / unit; }
  // The slope in log2 units (scores pre-multiplied by log2 e, so that exp is one exp2).
  FA_HD float slope_log2() const { return slope * 1.4426950408889634f; }
};

using Alibi = BasicAlibi<int64_t>;
using Alibi32 = BasicAlibi<int32_t>;

}  // namespace flashattn
