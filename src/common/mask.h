// Mask semantics and block ranges, written once for every backend (CPU reference, CPU flash, CUDA kernels).
//
// Query row i of a sequence with s_q queries and s_k keys sits on diagonal diag = i + s_k - s_q (bottom-right
// alignment, as flash-attn >= 2.1). Key j is visible iff
//   (!causal || j <= diag) && (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right).
// Causal is the window's right edge at 0, so the two combine by taking the tighter right edge.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn {

template <typename Index>
struct BasicMaskSpec {
  Index seqlen_q = 0;
  Index seqlen_k = 0;
  Index left = -1;   // -1 = unbounded
  Index right = -1;  // -1 = unbounded; causal folds into right = min(right, 0)

  FA_HD static BasicMaskSpec make(Index sq, Index sk, bool causal, Index window_left, Index window_right) {
    BasicMaskSpec m;
    m.seqlen_q = sq;
    m.seqlen_k = sk;
    m.left = window_left;
    // Any window_right >= 0 is at least as loose as causal's 0, so causal wins.
    m.right = causal ? 0 : window_right;
    return m;
  }

  FA_HD bool has_mask() const { return left >= 0 || right >= 0; }

  // The same window for every row of the sequence with edges no wider than needed: a left edge of seqlen_k or
  // more reaches every key of every row (diag - left < 0), a right edge of seqlen_q or more past every key (diag +
  // right >= seqlen_k). -1 stays unbounded. Kernels with 32-bit window arguments take these (sequence lengths
  // below 2^31); rows past the end, which they compute but never write, may see other keys.
  FA_HD static Index narrowest_left(Index window_left, Index sk) { return window_left < sk ? window_left : sk; }
  FA_HD static Index narrowest_right(Index window_right, Index sq) {
    return window_right < sq ? window_right : sq;
  }

  // Half-open range [lo, hi) of visible keys of query row i; empty (lo >= hi) when the row sees nothing.
  FA_HD void key_range(Index i, Index* lo, Index* hi) const {
    const Index diag = i + seqlen_k - seqlen_q;
    Index a = 0, b = seqlen_k;
    if (left >= 0 && diag - left > a) a = diag - left;
    if (right >= 0 && diag + right + 1 < b) b = diag + right + 1;
    *lo = a;
    *hi = b < a ? a : b;
  }

  FA_HD bool visible(Index i, Index j) const {
    const Index diag = i + seqlen_k - seqlen_q;
    if (j < 0 || j >= seqlen_k) return false;
    if (left >= 0 && j < diag - left) return false;
    if (right >= 0 && j > diag + right) return false;
    return true;
  }

  // Keys visible to any row in [row_begin, row_end): the union of the rows' ranges, half-open.
  FA_HD void key_range_for_rows(Index row_begin, Index row_end, Index* lo, Index* hi) const {
    Index lo_first, hi_first, lo_last, hi_last;
    key_range(row_begin, &lo_first, &hi_first);
    key_range(row_end - 1, &lo_last, &hi_last);
    // Both edges move monotonically with the row, so the first and last rows bound the union.
    *lo = lo_first;
    *hi = hi_last;
    if (*hi < *lo) *hi = *lo;
  }

  // Queries that see any key in [key_begin, key_end): half-open, used by the backward's key-major loop.
  FA_HD void query_range_for_keys(Index key_begin, Index key_end, Index* lo, Index* hi) const {
    const Index shift = seqlen_k - seqlen_q;  // diag = i + shift
    Index a = 0, b = seqlen_q;
    // right edge: j <= diag + right  <=>  i >= j - shift - right; the smallest j of the block is the loosest.
    if (right >= 0 && key_begin - shift - right > a) a = key_begin - shift - right;
    // left edge: j >= diag - left  <=>  i <= j - shift + left; the largest j of the block is the loosest.
    if (left >= 0 && (key_end - 1) - shift + left + 1 < b) b = (key_end - 1) - shift + left + 1;
    *lo = a;
    *hi = b < a ? a : b;
  }

  // True when every (row, key) of the tile is visible, so the kernel may skip per-element masking.
  FA_HD bool tile_fully_visible(Index row_begin, Index row_end, Index key_begin, Index key_end) const {
    const Index shift = seqlen_k - seqlen_q;
    if (right >= 0 && key_end - 1 > row_begin + shift + right) return false;
    if (left >= 0 && key_begin < (row_end - 1) + shift - left) return false;
    return true;
  }
};

// The mask in 64-bit arithmetic: every backend's host code, the CPU paths and the kernels that take 64-bit lengths.
using MaskSpec = BasicMaskSpec<int64_t>;
// In 32-bit arithmetic, half the registers: for kernels whose sequence lengths add up to below 2^31 minus a
// tile, with window edges narrowed to the lengths (narrowest_left / narrowest_right), so that no diagonal, edge
// or range of a row inside the sequence or in its last tile overflows.
using MaskSpec32 = BasicMaskSpec<int32_t>;

}  // namespace flashattn
