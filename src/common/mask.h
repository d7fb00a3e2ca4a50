// Mask semantics and block ranges, written once for every backend (CPU reference, CPU flash, CUDA kernels).
//
// Query row i of a sequence with s_q queries and s_k keys sits on diagonal diag = i + s_k - s_q (bottom-right
// alignment, as flash-attn >= 2.1). Key j is visible iff
//   (!causal || j <= diag) && (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right)
//   && (chunk == 0 || j lies in diag's chunk [floor(diag / chunk) * chunk, floor(diag / chunk) * chunk + chunk)).
// Causal is the window's right edge at 0, so the two combine by taking the tighter right edge. Chunked attention
// (FlashAttention-3's attention_chunk, Llama 4's local layers) cuts the keys into chunks of `chunk` and lets a row
// see only its own diagonal's chunk; a row with diag < 0 then sees nothing. Every edge moves monotonically with
// the row (a chunk's start and end never decrease), which the block ranges below rely on.
//
// kChunks: whether the mask takes a chunk. A kernel that takes none uses the masks without (WindowMaskSpec): no
// chunk field and no chunk arithmetic, not even a test of it, where a mask is held per tile or per row.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/hd.h"

namespace flashattn {

namespace mask_detail {
template <typename Index, bool kChunks>
struct ChunkField {
  Index chunk = 0;  // 0 = none; else the keys are cut into chunks of this many and a row sees its own
};
template <typename Index>
struct ChunkField<Index, false> {
  static constexpr Index chunk = 0;
};
}  // namespace mask_detail

template <typename Index, bool kChunks>
struct BasicMaskSpec : mask_detail::ChunkField<Index, kChunks> {
  using mask_detail::ChunkField<Index, kChunks>::chunk;
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
  template <bool kTakesChunk = kChunks, std::enable_if_t<kTakesChunk, int> = 0>
  FA_HD static BasicMaskSpec make(Index sq, Index sk, bool causal, Index window_left, Index window_right,
                                  Index attention_chunk) {
    BasicMaskSpec m = make(sq, sk, causal, window_left, window_right);
    m.chunk = attention_chunk;
    return m;
  }

  FA_HD bool has_mask() const {
    if constexpr (kChunks) {
      if (chunk > 0) return true;
    }
    return left >= 0 || right >= 0;
  }

  // Where diagonal `diag` sits inside its chunk, in [0, chunk): its chunk is [diag - offset, diag - offset + chunk).
  // Floor semantics for negative diagonals (rows above the first key when s_q > s_k). Edges are kept as distances
  // from the diagonal so that nothing overflows when the chunk is as long as the sequence.
  FA_HD Index offset_in_chunk(Index diag) const {
    const Index r = diag % chunk;
    return r < 0 ? r + chunk : r;
  }

  // The same window for every row of the sequence with edges no wider than needed: a left edge of seqlen_k or
  // more reaches every key of every row (diag - left < 0), a right edge of seqlen_q or more past every key (diag +
  // right >= seqlen_k). -1 stays unbounded. Kernels with 32-bit window arguments take these (sequence lengths
  // below 2^31); rows past the end, which they compute but never write, may see other keys.
  FA_HD static Index narrowest_left(Index window_left, Index sk) { return window_left < sk ? window_left : sk; }
  FA_HD static Index narrowest_right(Index window_right, Index sq) {
    return window_right < sq ? window_right : sq;
  }
  // A chunk of seqlen_k keys or more puts every key in the chunk of every row with diag >= 0 (and rows with
  // diag < 0 see nothing either way), so such a chunk is the chunk of seqlen_k keys (1 when there are none).
  FA_HD static Index narrowest_chunk(Index attention_chunk, Index sk) {
    if (attention_chunk <= sk) return attention_chunk;
    return sk > 0 ? sk : 1;
  }

  // Half-open range [lo, hi) of visible keys of query row i; empty (lo >= hi) when the row sees nothing.
  FA_HD void key_range(Index i, Index* lo, Index* hi) const {
    const Index diag = i + seqlen_k - seqlen_q;
    Index a = 0, b = seqlen_k;
    if (left >= 0 && diag - left > a) a = diag - left;
    if (right >= 0 && diag + right + 1 < b) b = diag + right + 1;
    if constexpr (kChunks) {
      if (chunk > 0) {
        const Index offset = offset_in_chunk(diag);
        if (diag - offset > a) a = diag - offset;
        if (chunk - offset < b - diag) b = diag + (chunk - offset);
      }
    }
    *lo = a;
    *hi = b < a ? a : b;
  }

  FA_HD bool visible(Index i, Index j) const {
    const Index diag = i + seqlen_k - seqlen_q;
    if (j < 0 || j >= seqlen_k) return false;
    if (left >= 0 && j < diag - left) return false;
    if (right >= 0 && j > diag + right) return false;
    if constexpr (kChunks) {
      if (chunk > 0) {
        const Index offset = offset_in_chunk(diag);
        if (j < diag - offset || j - diag >= chunk - offset) return false;
      }
    }
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
    // chunk: the rows whose diagonal lies in the chunks from key_begin's to key_end - 1's.
    if constexpr (kChunks) {
      if (chunk > 0 && key_end > key_begin) {
        const Index first_chunk = key_begin - offset_in_chunk(key_begin);
        if (first_chunk - shift > a) a = first_chunk - shift;
        const Index last = key_end - 1, past_last_chunk = chunk - offset_in_chunk(last);  // last + this: its end
        if (past_last_chunk < b - (last - shift)) b = (last - shift) + past_last_chunk;
      }
    }
    *lo = a;
    *hi = b < a ? a : b;
  }

  // Rows that see every key of [key_begin, key_end) (a non-empty range): half-open [*lo, *hi), empty when none does.
  // With both edges monotonic in the row they are one run of rows, so a kernel walking blocks of rows against one
  // block of keys can tell the blocks that need no mask by two compares (tile_fully_visible for each block is the
  // same answer).
  FA_HD void rows_seeing_all_keys(Index key_begin, Index key_end, Index* lo, Index* hi) const {
    const Index shift = seqlen_k - seqlen_q;  // diag = i + shift
    Index a = 0, b = seqlen_q;
    // right edge: key_end - 1 <= diag + right  <=>  i >= key_end - 1 - shift - right
    if (right >= 0 && key_end - 1 - shift - right > a) a = key_end - 1 - shift - right;
    // left edge: key_begin >= diag - left  <=>  i <= key_begin - shift + left
    if (left >= 0 && key_begin - shift + left + 1 < b) b = key_begin - shift + left + 1;
    if (key_begin < 0 || key_end > seqlen_k) b = a;  // keys outside the sequence: nobody sees them
    if constexpr (kChunks) {
      if (chunk > 0) {
        // Only the rows whose diagonal lies in the chunk of key_begin, and only if key_end - 1 is in it too.
        const Index first = key_begin - offset_in_chunk(key_begin);
        if (key_end - 1 - first >= chunk) b = a;
        if (first - shift > a) a = first - shift;
        if (chunk < b - (first - shift)) b = (first - shift) + chunk;
      }
    }
    *lo = a;
    *hi = b < a ? a : b;
  }

  // True when every (row, key) of the tile is visible, so the kernel may skip per-element masking.
  FA_HD bool tile_fully_visible(Index row_begin, Index row_end, Index key_begin, Index key_end) const {
    const Index shift = seqlen_k - seqlen_q;
    if (right >= 0 && key_end - 1 > row_begin + shift + right) return false;
    if (left >= 0 && key_begin < (row_end - 1) + shift - left) return false;
    if constexpr (kChunks) {
      if (chunk > 0) {
        // The last row's chunk starts last, the first row's ends first.
        const Index diag_first = row_begin + shift, diag_last = (row_end - 1) + shift;
        if (key_begin < diag_last - offset_in_chunk(diag_last)) return false;
        if (key_end - diag_first > chunk - offset_in_chunk(diag_first)) return false;
      }
    }
    return true;
  }
};

// The mask of a kernel variant with chunks (kChunks) or without: a variant without is launched only for calls with
// no chunk (attention_chunk == 0), which its mask then does not hold.
template <typename Index, bool kChunks>
FA_HD BasicMaskSpec<Index, kChunks> make_mask(Index sq, Index sk, bool causal, Index window_left, Index window_right,
                                              Index attention_chunk) {
  if constexpr (kChunks) {
    return BasicMaskSpec<Index, true>::make(sq, sk, causal, window_left, window_right, attention_chunk);
  } else {
    return BasicMaskSpec<Index, false>::make(sq, sk, causal, window_left, window_right);
  }
}

// The mask in 64-bit arithmetic, chunks included: host code and the CPU paths.
using MaskSpec = BasicMaskSpec<int64_t, true>;
// The same without a chunk, for the kernel variants that take none (causal and windows only).
using WindowMaskSpec = BasicMaskSpec<int64_t, false>;
// In 32-bit arithmetic, half the registers: for kernels whose sequence lengths add up to below 2^31 minus a
// tile, with window edges and chunks narrowed to the lengths (narrowest_left / narrowest_right /
// narrowest_chunk), so that no diagonal, edge or range of a row inside the sequence or in its last tile overflows.
using MaskSpec32 = BasicMaskSpec<int32_t, true>;
using WindowMaskSpec32 = BasicMaskSpec<int32_t, false>;

}  // namespace flashattn
