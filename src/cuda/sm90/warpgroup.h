// Shapes the Hopper hardware fixes for every sm90 kernel: a warpgroup is four consecutive warps, and one
// wgmma computes 64 rows (one warpgroup's) with a K step of 16 for 16-bit inputs.
#pragma once

namespace flashattn::cuda::sm90 {

constexpr int kWarpgroupThreads = 128;
constexpr int kWgmmaRows = 64;  // M of one wgmma: the rows of one consumer warpgroup
constexpr int kWgmmaK = 16;     // K of one wgmma for 16-bit inputs

}  // namespace flashattn::cuda::sm90
