// A forward whose values are wider than a backend's kernels take, run as forwards over slices of V's and O's
// columns (FA3's MLA shapes: d 64 with d_v 512 on the CUDA kernels, which take d_v up to 256).
//
// Why it is exact: every column of O = softmax(scale · Q Kᵀ) V depends on V's column alone, so a forward over V's
// columns [c, c + w) with O's columns [c, c + w) writes exactly those columns of the whole forward; the scores, the
// softmax and the LSE do not depend on V at all, so every slice writes the same LSE (and draws the same dropout
// mask: it is keyed by row and key, never by column). The cost is Q Kᵀ once per slice: with d 64 and d_v 512, two
// slices do 2 · 64 + 512 = 640 columns of products where one kernel would do 576.
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// Slice starts stay 16-byte aligned (8 16-bit values, 16 float8 ones), so that a slice's V and O keep the whole
// tensor's alignment for vector loads and TMA.
constexpr int64_t kValueSliceAlignBytes = 16;

// The widest slice: as few slices as cover d_v, of equal width rounded up to `align` columns (the last takes what
// remains); d_v itself when it fits in max_width (a multiple of align).
inline int64_t value_slice_width(int64_t head_dim_v, int64_t max_width, int64_t align) {
  if (head_dim_v <= max_width) return head_dim_v;
  const int64_t slices = (head_dim_v + max_width - 1) / max_width;
  const int64_t even = (head_dim_v + slices - 1) / slices;
  return std::min(max_width, (even + align - 1) / align * align);
}

// Bytes per element of V and of O (float8 inputs write the 16-bit out_dtype).
inline int64_t value_element_bytes(const FwdParams& p) { return int64_t(dtype_size(p.dtype)); }
inline int64_t out_element_bytes(const FwdParams& p) {
  return int64_t(dtype_size(p.dtype == DType::e4m3 ? p.out_dtype : p.dtype));
}

// The widest slice of p's value columns: V's and O's slice starts 16-byte aligned for their element sizes.
inline int64_t value_slice_width(const FwdParams& p, int64_t max_width) {
  const int64_t v_size = value_element_bytes(p), o_size = out_element_bytes(p);
  const int64_t align = std::max<int64_t>(1, kValueSliceAlignBytes / std::max<int64_t>(1, std::min(v_size, o_size)));
  return value_slice_width(p.head_dim_v, max_width, align);
}

// How many forwards p runs as (1: unsliced).
inline int64_t value_slice_count(const FwdParams& p, int64_t max_width) {
  const int64_t width = value_slice_width(p, max_width);
  return width > 0 ? (p.head_dim_v + width - 1) / width : 1;
}

// Calls fn(slice) for each slice of p's value columns, in order, stopping at the first failure. A slice is p with
// head_dim_v its width and v / o moved to its first column (strides unchanged). Callers check every slice's support
// first (a failure after the first slice would leave O partly written).
template <typename Fn>
Status for_each_value_slice(const FwdParams& p, int64_t max_width, Fn&& fn) {
  const int64_t width = value_slice_width(p, max_width);
  if (width == p.head_dim_v || width <= 0) return fn(p);
  // qv's scores read every column of V: no slice has them all.
  if (p.qv) return Status::unsupported("qv: a forward with qv cannot run in slices of V's columns");
  const int64_t v_size = value_element_bytes(p), o_size = out_element_bytes(p);
  for (int64_t c = 0; c < p.head_dim_v; c += width) {
    FwdParams slice = p;
    slice.head_dim_v = std::min(width, p.head_dim_v - c);
    slice.v = static_cast<const char*>(p.v) + c * v_size;
    slice.o = static_cast<char*>(p.o) + c * o_size;
    const Status st = fn(static_cast<const FwdParams&>(slice));
    if (!st.ok()) return st;
  }
  return Status::success();
}

}  // namespace flashattn::detail
