// Every tile-size decision of the sm80 forward kernel, in one constexpr place.
//
// Compile-time axes are dtype x head-dim bucket only: a call with head dims d, d_v runs the kernel of the
// smallest bucket holding max(d, d_v); the columns past d (or d_v) are zero-filled in shared memory, so
// they add nothing to QKᵀ and produce output columns that are never stored. Causal, window, softcap, GQA,
// varlen, lengths and strides are runtime.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm80 {

// The compiled head-dim buckets. A bucket must be a multiple of 64: the shared-memory swizzle permutes
// 16-byte chunks within groups of 8 (128 bytes), and the QK / PV loops step 16 columns at a time.
constexpr int kForwardBuckets[] = {64, 128, 256};

// Smallest bucket holding `head_dim` (0 if none does).
constexpr int forward_head_dim_bucket(int64_t head_dim) {
  return head_dim <= 0 ? 0 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 0;
}

struct ForwardTile {
  int block_m;        // query rows per thread block
  int block_n;        // keys per K/V tile
  int warps;          // each warp owns block_m / warps consecutive query rows (a multiple of 16)
  int stages;         // K/V shared-memory buffers each (1 = K and V alternate, FA2 style; 2 = one tile ahead)
  int min_blocks_sm;  // __launch_bounds__ occupancy target, so ptxas keeps registers at 65536 / (threads * this)
};

// Why these numbers (H100/H200 and A100, 2-byte elements):
// - 32 query rows per warp (two m16 tiles) for d <= 128: each K/V fragment read from shared memory feeds two
//   mma, which halves shared-memory traffic per FLOP against 16 rows per warp; the O accumulator
//   (32 x d fp32) and the S tile (32 x block_n fp32) still fit in 255 registers.
// - d = 256: O alone is 16 x 256 fp32 = 128 registers per thread, so 16 rows per warp and 8 warps.
// - block_n: 128 for d = 64 (S = 128 registers), 64 above, so that S + O stay near 192 registers.
// - stages: 2 when Q + 2 x (K + V) still lets two blocks share an SM (80 KB, 96 KB); d = 256 would need
//   192 KB, more than an A100's 163 KB, so it alternates single K and V buffers (128 KB).
// Compact tiles: GPUs of compute capability 8.6 / 8.9 (RTX 30/40, A10, L4, L40) give a block at most 99 KB.
// The d = 64 and d = 128 tiles fit (80 KB, 96 KB); d = 256 gets 64 query rows over 4 warps (16 rows each, as
// in its regular tile) with 64-key tiles: 32 KB + 64 KB = 96 KB. The launcher takes the regular tile where it
// fits and the compact one otherwise.
constexpr ForwardTile forward_tile(int bucket, bool compact = false) {
  return bucket == 64    ? ForwardTile{128, 128, 4, 2, 2}
         : bucket == 128 ? ForwardTile{128, 64, 4, 2, 2}
         : compact       ? ForwardTile{64, 64, 4, 1, 1}
                         : ForwardTile{128, 64, 8, 1, 1};
}

// Dynamic shared memory of one block: Q (reused for O) + stages x (K + V), 2-byte elements.
constexpr int forward_smem_bytes(int bucket, bool compact = false) {
  const ForwardTile t = forward_tile(bucket, compact);
  return (t.block_m + 2 * t.stages * t.block_n) * bucket * 2;
}

// Whether a bucket's compact tile differs from its regular one (only then is a second kernel compiled).
constexpr bool forward_has_compact_tile(int bucket) {
  const ForwardTile a = forward_tile(bucket, false), b = forward_tile(bucket, true);
  return a.block_m != b.block_m || a.block_n != b.block_n || a.warps != b.warps || a.stages != b.stages ||
         a.min_blocks_sm != b.min_blocks_sm;
}

}  // namespace flashattn::cuda::sm80
