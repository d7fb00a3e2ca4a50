// The order in which the backward's CTAs start. The hardware starts CTAs in the order of their linear index, x
// fastest. The backward's grid is (key block, KV head, batch entry), and under a causal mask a head's first key
// block sees the most queries, its last the fewest: in that order the heaviest CTAs of the last heads start in
// the last wave, with nothing left to fill in around them (a greedy schedule of causal 2k's CTAs on 132 SMs ends
// 3-7% after the average SM's work). Starting every key block in x-slowest order instead, the largest first across
// the whole grid, ran the H100's backward 1.5-2.2x slower at 2k: each head's CTAs then run far apart in time, and
// its Q and dO, which the CTAs of one head stream in step and find in L2, came from HBM once per key block.
// So only the last `tail` (head, batch) pairs, about one wave of CTAs, start x-slowest: those CTAs run together
// in the last waves either way, and their largest pieces now start first (the greedy schedule: 1-2% past the
// average). Within one (y, z), x still starts in increasing order.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn::cuda {

struct GridPlace {
  uint32_t x, y, z;
};

// The place of the CTA that starts `linear`-th (0-based) in a grid of nx * ny * nz: the first ny * nz - tail
// (y, z) pairs x fastest, then the last tail pairs x slowest.
FA_HD GridPlace tail_x_slowest_place(uint64_t linear, uint32_t nx, uint32_t ny, uint32_t nz, uint32_t tail) {
  const uint64_t pairs = uint64_t(ny) * nz;
  const uint64_t t = tail < pairs ? tail : pairs;
  const uint64_t head_part = (pairs - t) * nx;
  uint64_t pair, x;
  if (linear < head_part) {
    pair = linear / nx;
    x = linear - pair * nx;
  } else {
    const uint64_t rest = linear - head_part;
    x = rest / t;
    pair = pairs - t + (rest - x * t);
  }
  return GridPlace{uint32_t(x), uint32_t(pair % ny), uint32_t(pair / ny)};
}

// The (y, z) pairs to start x-slowest: enough for `wave` CTAs (the resident ones across the GPU).
FA_HD uint32_t tail_pairs_for_wave(uint32_t nx, int wave) {
  return nx == 0 ? 1u : uint32_t((uint64_t(wave > 0 ? wave : 1) + nx - 1) / nx);
}

#ifdef __CUDACC__
// This CTA's place (tail_x_slowest_place of its linear index in the launch's grid).
__device__ __forceinline__ GridPlace tail_x_slowest_block(uint32_t tail) {
  const uint64_t linear = blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  return tail_x_slowest_place(linear, gridDim.x, gridDim.y, gridDim.z, tail);
}
#endif

}  // namespace flashattn::cuda
