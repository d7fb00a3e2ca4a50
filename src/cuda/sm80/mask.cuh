// Score transforms and masking of the sm80 forward on S tiles held as mma C fragments, built on MaskSpec
// (common/mask.h), which decides which keys a row sees for every backend.
//
// Per-element work only where it changes something: the kernel asks tile_needs_mask once per tile (uniform
// over the block), and only tiles on a mask edge or past the last key pay for apply_mask.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/primitives.cuh"

namespace flashattn::cuda::sm80 {

// True when some (row, key) of the tile rows [row_begin, row_end) x keys [key_begin, key_begin + block_n)
// is hidden: a mask edge crosses it, or it runs past the last key. Mask: a 64-bit BasicMaskSpec, with or without
// chunks.
template <typename Mask>
__device__ __forceinline__ bool tile_needs_mask(const Mask& mask, int row_begin, int row_end, int key_begin,
                                                int block_n) {
  return int64_t(key_begin) + block_n > mask.seqlen_k ||
         !mask.tile_fully_visible(row_begin, row_end, key_begin, int64_t(key_begin) + block_n);
}

// Sets hidden scores to -inf. `row0` is the sequence row of the warp's first row, `key0` the tile's first key;
// fragment element (mt, nt, e) sits at row row0 + 16 mt + g + 8 (e / 2), key key0 + 8 nt + 2 q + (e % 2).
template <int kMTiles, int kNTiles, typename Mask>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], const Mask& mask, int row0, int key0,
                                           int lane) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t lo, hi;  // visible keys of this row: [lo, hi), already clipped to [0, seqlen_k)
      mask.key_range(row0 + mt * 16 + g + 8 * r, &lo, &hi);
      const int lo_t = int(max(int64_t(-1), min(lo - key0, int64_t(1) << 30)));
      const int hi_t = int(max(int64_t(-1), min(hi - key0, int64_t(1) << 30)));
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = nt * 8 + 2 * q + e;  // key offset inside the tile
          if (j < lo_t || j >= hi_t) s[mt][nt][2 * r + e] = -INFINITY;
        }
      }
    }
  }
}

// ALiBi (common/alibi.h): s -= slope_u · |row + s_k - s_q - key| on every element, slope_u being the slope in
// score units. Row (mt, r) of the thread (fragment layout as apply_mask) passes its slope and `base`, its diagonal
// (row + s_k - s_q) minus the key of its first column (tile's first key + 2 q). Two instructions per score: the
// distance's add and an FFMA with an absolute-value operand.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_alibi_rows(float (&s)[kMTiles][kNTiles][4], const float (&slope_u)[kMTiles][2],
                                                 const float (&base)[kMTiles][2]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[mt][nt][2 * r + e] = fmaf(-slope_u[mt][r], fabsf(base[mt][r] - float(nt * 8 + e)), s[mt][nt][2 * r + e]);
      }
    }
  }
}

// The same with one slope for every row: `diag0` = the warp's first row + s_k - s_q - the tile's first key.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_alibi(float (&s)[kMTiles][kNTiles][4], float slope_u, int64_t diag0, int lane) {
  const int g = lane >> 2, q = lane & 3;
  float slopes[kMTiles][2], base[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) slopes[mt][r] = slope_u, base[mt][r] = float(diag0 + mt * 16 + g + 8 * r - 2 * q);
  apply_alibi_rows(s, slopes, base);
}

// Dropout (common/dropout.h) on a P tile of probabilities: dropped entries set to 0 (the caller scales the kept ones
// by 1 / (1 - p)). Fragment layout as apply_mask; `key0`, the tile's first key, a multiple of 32, so that lane q's
// keys of each 32-key span (2q, 2q + 1 of each of its four 8-key n-tiles) are exactly one Philox group: one call
// per (row, span).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_dropout(float (&s)[kMTiles][kNTiles][4], const DropoutSpec& d, int row0,
                                              int key0, int lane) {
  static_assert(kNTiles % 4 == 0, "whole 32-key spans per warp tile");
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + g + 8 * r;
#pragma unroll
      for (int span = 0; span < kNTiles / 4; ++span) {
        uint32_t w[4];
        d.draws(row, DropoutSpec::group_of(key0 + span * 32 + 2 * q), w);
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (!d.kept(w, 2 * c + e)) s[mt][span * 4 + c][2 * r + e] = 0.f;
      }
    }
  }
}

// Softcap: x = tanh(q·k · pre) with pre = softmax_scale / softcap; the natural score is softcap · x, which the
// softmax folds into its unit scale.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_softcap(float (&s)[kMTiles][kNTiles][4], float pre) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = scaled_tanh(tanh_parts(s[mt][nt][e] * (pre * kTanhExp2)), 1.f);
    }
  }
}

}  // namespace flashattn::cuda::sm80
