// Every tile-size decision of the split-KV decode kernel (decode_kernel.cuh), in one constexpr place.
//
// Compile-time axes: dtype x head-dim bucket (the forward's buckets, forward_config.h). Page size, lengths,
// GQA ratio, causal / window / softcap and the split count are runtime.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm80 {

struct DecodeTile {
  int block_m;  // packed query rows per thread block: (query row, query head of the KV group) pairs
  int block_n;  // keys per K/V tile; each warp takes block_n / warps of them
  int warps;
  int stages;   // K/V tiles in flight
  int min_blocks_sm;  // __launch_bounds__ occupancy target (registers capped at 65536 / (threads * this))
};

// Why these numbers (H100/H200, 2-byte elements): decode is a stream of K/V through shared memory with a few
// query rows against it, so the tile is sized for bytes in flight, not for FLOPs.
// - block_m 16: one m16 mma tile. A GQA group of 4-8 query heads at s_q = 1 fills 4-8 of its rows; a 64-row
//   tile (the forward's) would spend 8-16x the tensor work on padding.
// - the 4 warps split each K/V tile by keys (16 keys each) and keep their own online softmax; they merge once
//   at the end through shared memory.
// - stages: as many 64-key tiles in flight as keep two blocks per SM: d 64: 4 x 16 KB, d 128: 3 x 32 KB,
//   d 256: 2 x 64 KB (one block per SM there).
constexpr DecodeTile decode_tile(int bucket) {
  return bucket == 64 ? DecodeTile{16, 64, 4, 4, 1} : bucket == 128 ? DecodeTile{16, 64, 4, 3, 1} : DecodeTile{16, 64, 4, 2, 1};
}

// Dynamic shared memory: Q tile + stages x (K + V), 2-byte elements; the warps' merge reuses the K/V buffers.
constexpr int decode_smem_bytes(int bucket) {
  const DecodeTile t = decode_tile(bucket);
  const int pipeline = (t.block_m + 2 * t.stages * t.block_n) * bucket * 2;
  const int merge = t.warps * t.block_m * (bucket + 2) * 4;  // per warp: O rows (fp32) + max and sum per row
  return pipeline > merge ? pipeline : merge;
}

// The largest split count the combine kernel reads (FA3's limit).
constexpr int kMaxDecodeSplits = 256;

}  // namespace flashattn::cuda::sm80
