// Every tile-size decision of the split-KV decode kernel (decode_kernel.cuh), in one constexpr place.
//
// Compile-time axes: dtype x head-dim bucket (the forward's buckets, forward_config.h). Page size, lengths,
// GQA ratio, causal / window / softcap and the split count are runtime.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm80 {

struct DecodeTile {
  int block_m;  // packed query rows per thread block: (query row, query head of the KV group) pairs
  int block_n;  // keys per K/V tile
  int warps;    // block_m / 16 row groups (one m16 tile each) x key warps (block_n split between them)
  int stages;   // K/V tiles in flight
  int min_blocks_sm;  // __launch_bounds__ occupancy target (registers capped at 65536 / (threads * this))
  constexpr int row_warps() const { return block_m / 16; }
  constexpr int key_warps() const { return warps / row_warps(); }
};

// Packed-row plans: a call whose seqlen_q x group fits one m16 tile runs kDecodeRowsShort; taller ones run
// kDecodeRowsTall (the 16-row plan re-reads the whole K/V once per 16 packed rows) where the 16-row plan would
// read at least this many key rows (batch x heads_kv x capacity x its row blocks), else its more blocks win
// (decode_launch.cuh decode_tall_rows).
constexpr int kDecodeRowsShort = 16;
constexpr int kDecodeRowsTall = 64;
constexpr int64_t kDecodeTallRowsRead = int64_t(1) << 20;
constexpr int64_t kDecodeTallPagedRowsRead = int64_t(1) << 18;

// Why these numbers (H100/H200, 2-byte elements): decode is a stream of K/V through shared memory with a few
// query rows against it, so the tile is sized for bytes in flight, not for FLOPs.
// - block_m 16: one m16 mma tile. A GQA group of 4-8 query heads at s_q = 1 fills 4-8 of its rows; a 64-row
//   tile (the forward's) would spend 8-16x the tensor work on padding. Its 4 warps split each K/V tile by keys
//   (16 keys each) and keep their own online softmax; they merge once at the end through shared memory.
// - block_m 64 (speculative decoding, chunked prefill, GQA groups above 16 rows): each warp owns 16 rows and
//   every key of the tile, so K/V are read once per 64 packed rows; the merge is then a plain copy.
// - stages: as many 64-key tiles in flight as keep two blocks per SM: d 64: 4 x 16 KB, d 128: 3 x 32 KB
//   (the 64-row Q tile adds 16 KB: 2 x 113 KB still fit 228 KB), d 256: 2 x 64 KB (one block per SM there).
constexpr DecodeTile decode_tile(int bucket, int block_m) {
  return DecodeTile{block_m, 64, 4, bucket == 64 ? 4 : bucket == 128 ? 3 : 2, 1};
}

// Dynamic shared memory: Q tile + stages x (K + V), 2-byte elements; the warps' merge reuses the K/V buffers.
constexpr int decode_smem_bytes(int bucket, int block_m) {
  const DecodeTile t = decode_tile(bucket, block_m);
  const int pipeline = (t.block_m + 2 * t.stages * t.block_n) * bucket * 2;
  // per key warp and row: O (fp32) + max and sum
  const int merge = t.key_warps() * t.block_m * (bucket + 2) * 4;
  return pipeline > merge ? pipeline : merge;
}

// The largest split count the combine kernel reads (FA3's limit).
constexpr int kMaxDecodeSplits = 256;

}  // namespace flashattn::cuda::sm80
