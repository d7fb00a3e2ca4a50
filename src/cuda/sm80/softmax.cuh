// Online softmax of the sm80 forward, on S tiles held as mma C fragments. Scope: one warp; every row lives in
// one quad (4 lanes), each lane holding 2 columns of every 8-column n-tile, so row reductions are a quad
// shuffle. Same semantics as common/softmax_state.h (the CPU paths), in base 2:
//
//   scores are kept in "score units" x (the raw q·k, or tanh(q·k·scale/softcap) with softcap); the natural
//   score is x · unit_scale (softmax_scale, or softcap). With scale_log2 = unit_scale · log2(e),
//   exp(score − max) = exp2(x · scale_log2 − max_x · scale_log2): one FFMA and one MUFU.EX2 per element.
//
// -inf handling: masked scores are -inf and give p = 0. A row whose maximum is still -inf (nothing visible
// yet) uses 0 as its subtracted maximum, so no -inf − -inf = NaN arises; its rescale factor is exp2(-inf) = 0.
// A row that never saw a key finishes with sum 0: output 0, LSE -inf.
#pragma once

#include <cmath>

#include "cuda/primitives.cuh"

namespace flashattn::cuda::sm80 {

template <int kMTiles>
struct OnlineSoftmax {
  // Per m-tile, rows g (index 0) and g + 8 (index 1) of the lane's quad group g.
  float row_max[kMTiles][2];  // running maximum, score units
  float row_sum[kMTiles][2];  // this lane's partial sum of p (its columns only; reduced in finalize)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_max[mt][r] = -INFINITY;
        row_sum[mt][r] = 0.f;
      }
    }
  }

  // Verb 1+2: raises each row's maximum by the tile's, turns the tile into p = exp2(x·scale_log2 − max·scale_log2)
  // in place, adds p to the row sums, and returns in `factor` how much the row's earlier output must shrink.
  template <int kNTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                         float (&factor)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        tile_max = quad_max(tile_max);
        const float old_max = row_max[mt][r];
        const float new_max = fmaxf(old_max, tile_max);
        const float sub = new_max == -INFINITY ? 0.f : new_max * scale_log2;
        factor[mt][r] = fast_exp2(old_max * scale_log2 - sub);
        row_max[mt][r] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * r + e], scale_log2, -sub));
            s[mt][nt][2 * r + e] = p;
            sum += p;
          }
        }
        row_sum[mt][r] = fmaf(row_sum[mt][r], factor[mt][r], sum);
      }
    }
  }

  // Verb 3: O rows *= factor (before the tile's P·V is added).
  template <int kDTiles>
  __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4], const float (&factor)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        o[mt][dt][0] *= factor[mt][0];
        o[mt][dt][1] *= factor[mt][0];
        o[mt][dt][2] *= factor[mt][1];
        o[mt][dt][3] *= factor[mt][1];
      }
    }
  }

  // Verb 4: reduces the row sums over the quad; returns each row's 1/sum (0 for a row that saw nothing) and its
  // natural-log LSE (-inf for such a row).
  __device__ __forceinline__ void finalize(float unit_scale, float (&inv_sum)[kMTiles][2],
                                           float (&lse)[kMTiles][2]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = quad_sum(row_sum[mt][r]);
        inv_sum[mt][r] = sum > 0.f ? 1.f / sum : 0.f;
        lse[mt][r] = sum > 0.f ? row_max[mt][r] * unit_scale + logf(sum) : -INFINITY;
      }
    }
  }
};

}  // namespace flashattn::cuda::sm80
