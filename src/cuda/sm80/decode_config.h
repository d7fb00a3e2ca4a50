// Every tile-size decision of the split-KV decode kernel (decode_kernel.cuh), in one constexpr place.
//
// Compile-time axes: dtype x head-dim bucket (the forward's buckets, forward_config.h) x plan (DecodePlan). Page
// size, lengths, GQA ratio, causal / window / softcap and the split count are runtime.
#pragma once

#include <algorithm>
#include <cmath>
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

// The kernel's plans (a template axis of decode_kernel, chosen per call in decode_launch.cuh launch_decode):
// - rows16: one m16 tile of packed rows, 64-key tiles over 4 warps;
// - rows16_wide: the same rows, 128-key tiles over 8 warps (head dims up to kDecodeWideMaxBucket), for grids
//   smaller than the GPU;
// - rows16_wide_lean: rows16_wide with a stage less, for GPUs whose blocks cannot hold rows16_wide's shared memory
//   (A100: 163 KB against 196 at d 128); compiled only where rows16_wide needs more than kDecodeLeanSmemBytes;
// - rows64: 64 packed rows, 64-key tiles over 4 warps.
// A call whose seqlen_q x group fits one m16 tile runs a 16-row plan; taller ones run rows64 (the 16-row plans
// re-read the whole K/V once per 16 packed rows) where a 16-row plan would read at least this many key rows
// (batch x heads_kv x capacity x its row blocks), else its more blocks win (decode_launch.cuh decode_tall_rows).
enum class DecodePlan { rows16, rows16_wide, rows16_wide_lean, rows64 };
constexpr int kDecodeRowsShort = 16;
constexpr int kDecodeRowsTall = 64;
constexpr int64_t kDecodeTallRowsRead = int64_t(1) << 20;
constexpr int64_t kDecodeTallPagedRowsRead = int64_t(1) << 18;
constexpr int kDecodeWideMaxBucket = 128;
// The shared memory per block that A100s allow (the smallest of the GPUs that run rows16_wide's 2-stage form).
constexpr int kDecodeLeanSmemBytes = 163 * 1024;

// Why these numbers (H100/H200, 2-byte elements): decode is a stream of K/V through shared memory with a few
// query rows against it, so the tile is sized for bytes in flight, not for FLOPs.
// - block_m 16: one m16 mma tile. A GQA group of 4-8 query heads at s_q = 1 fills 4-8 of its rows; a 64-row
//   tile (the forward's) would spend 8-16x the tensor work on padding. Its warps split each K/V tile by keys
//   (16 keys each) and keep their own online softmax; they merge once at the end through shared memory.
// - block_m 64 (speculative decoding, chunked prefill, GQA groups above 16 rows): each warp owns 16 rows and
//   every key of the tile, so K/V are read once per 64 packed rows; the merge is then a plain copy.
// - stages: as many 64-key tiles in flight as keep two blocks per SM: d 64: 4 x 16 KB, d 128: 3 x 32 KB
//   (the 64-row Q tile adds 16 KB: 2 x 113 KB still fit 228 KB), d 256: 2 x 64 KB (one block per SM there).
// - rows16_wide: where the grid is smaller than the GPU (b = 1 or 8 with GQA 32 / 8: 8 or 64 row blocks, split by
//   keys to fill it), a block's time goes by its warps' latency per key tile (one warp per scheduler, about 0.2
//   instructions a cycle; bench/results/decode.md), not by bytes: twice the warps take a split's keys in half the
//   passes. On an H100 against rows16: b = 8, 1k keys 14.5 -> 12.5 us, b = 1, 1k 8.5 -> 7.9. 3 stages of 128 keys
//   (d 128: 196 KB, one block per SM; d 64: 98 KB) against 2 on the H200 (2026-12-07, bench/results/decode.md):
//   paged 16 at b = 8, 16k 157 -> 138 us, 4k 44.7 -> 41.9, b = 1, 4k 13.2 -> 12.6; dense b = 1, 16k 26.1 -> 24.9;
//   within 0.2 us elsewhere (b = 1, 4k dense 11.2 -> 11.4). The lean form keeps 2 stages (d 128: 132 KB) for
//   the A100.
//   Where the rows16 grid fills the GPU without splits (b = 64: 512 row blocks), rows16 stays 3-7% faster (its
//   second block per SM starts while the first drains).
constexpr DecodeTile decode_tile(int bucket, DecodePlan plan) {
  if (plan == DecodePlan::rows16_wide) return DecodeTile{kDecodeRowsShort, 128, 8, 3, 1};
  if (plan == DecodePlan::rows16_wide_lean) return DecodeTile{kDecodeRowsShort, 128, 8, 2, 1};
  const int block_m = plan == DecodePlan::rows64 ? kDecodeRowsTall : kDecodeRowsShort;
  return DecodeTile{block_m, 64, 4, bucket == 64 ? 4 : bucket == 128 ? 3 : 2, 1};
}
// The key unit of the split heuristic (decode_num_splits): 64 keys whatever the plan's tile, so that one rule
// serves both tile widths; the kernel splits its own tiles evenly between the splits it is given.
constexpr int kDecodeSplitUnit = 64;

// float8_e4m3fn caches (decode_kernel.cuh kFp8): K / V tiles stay e4m3 in shared memory, half a 16-bit tile each, so
// the 16-bit plan's shared memory holds twice the stages (rows16 d 64: 8, d 128: 6, d 256: 4).
constexpr int decode_fp8_stages(int bucket, DecodePlan plan) { return 2 * decode_tile(bucket, plan).stages; }

// Dynamic shared memory: Q tile + stages x (K + V), 2-byte elements; the warps' merge reuses the K/V buffers, and
// behind it the block's partial (O and LSE in fp32) waits for the other splits of its cluster (cluster combine).
constexpr int decode_merge_bytes(int bucket, DecodePlan plan) {
  const DecodeTile t = decode_tile(bucket, plan);
  return t.key_warps() * t.block_m * (bucket + 2) * 4;  // per key warp and row: O (fp32) + max and sum
}
constexpr int decode_smem_bytes(int bucket, DecodePlan plan) {
  const DecodeTile t = decode_tile(bucket, plan);
  const int pipeline = (t.block_m + 2 * t.stages * t.block_n) * bucket * 2;
  const int merge_and_partial = decode_merge_bytes(bucket, plan) + t.block_m * (bucket + 1) * 4;
  return pipeline > merge_and_partial ? pipeline : merge_and_partial;
}

// The largest split count the combine kernel reads (FA3's limit).
constexpr int kMaxDecodeSplits = 256;
// Splits merged inside the decode kernel (sm_90 and later): the splits of one row block form a thread-block cluster
// and read each other's partials from shared memory, so no combine kernel and no fp32 workspace: the b = 1 decode
// step is one launch. The portable cluster size: larger split counts take the combine kernel.
constexpr int kMaxClusterSplits = 8;
// The split count the heuristic keeps to unless one block per SM takes more (decode_num_splits below).
constexpr int kDecodeCombineSplits = 16;
// The most key tiles more per split for which the heuristic takes kMaxClusterSplits clustered splits over more
// splits through the combine kernel (decode_num_splits below).
constexpr int kClusterExtraTiles = 2;

// Whether a grid of `tiles` blocks (row blocks x KV heads x batch) leaves the GPU's block slots (sms x per_sm) short
// enough that the keys are split (decode_num_splits' first step): below 80% of them.
constexpr bool decode_grid_below_gpu(int64_t tiles, int sms, int per_sm) {
  return tiles < int64_t(std::max(sms, 1)) * std::max(per_sm, 1) * 8 / 10;
}

// Key splits per sequence when the caller leaves it to us (num_splits = 0). `tiles` = blocks of one split,
// `key_blocks` = kDecodeSplitUnit-key units of the longest possible sequence (the capacity: lengths live on the
// device), the "tiles" below (those of rows16); the device
// has `sms` SMs of `per_sm` blocks each; cluster_fits(s) says whether s splits would merge in clusters
// (decode_launch.cuh launch_decode_plan). Each step measured on the H200 (bench/results/decode.md, 2026-12-02):
// 1. FA2's wave rule over the block slots: among the split counts that keep at least two key tiles per split, the
//    smallest whose wave efficiency (blocks / (waves x slots)) reaches 85% of the best.
// 2. Rounded up to an even share of the key tiles (16 tiles: 8 splits of 2, not 7 of up to 3: 13.5 vs 15.0 µs).
// 3. Dense caches: at most kDecodeCombineSplits, or one block per SM if that is more: the combine kernel's warp walks
//    a row's splits one after the other, so past that count its latency outgrows what a second block per SM adds
//    (b = 1, 128k keys: 16 splits 135 µs, the wave rule's 33 splits 153 µs; at b = 8, 4 and 8 splits run level).
//    Paged caches may fill every block slot: their blocks spend longer per tile on addresses, so the second block
//    per SM pays (b = 1, 128k keys, pages of 16: the wave rule's 33 splits 165.7 µs on 2026-12-02, 16 splits
//    219.9 µs on 2026-12-05).
// 4. kMaxClusterSplits instead where those merge in clusters and each reads at most kClusterExtraTiles tiles more
//    than the splits above would: the one launch saves about that much. Measured on an H100 with the combine kernel
//    of 2026-12-05 (one block per row, launched as a programmatic dependent): b = 1, 4k keys, 8 splits in clusters
//    (4 tiles more each) 13.1 µs, 16 through the combine kernel 12.0; 1k keys, 8 in clusters 8.5, 16 forced 9.4.
//    (Against the one-warp-per-row combine before it, clusters won up to 12 tiles more: 4k keys 14.2 against 19.9.)
template <typename ClusterFits>
int decode_num_splits(int64_t tiles, int64_t key_blocks, int sms, int per_sm, bool paged, ClusterFits cluster_fits) {
  sms = std::max(sms, 1);
  const int slots = sms * std::max(per_sm, 1);
  if (tiles <= 0 || !decode_grid_below_gpu(tiles, sms, per_sm)) return 1;
  const int most = int(std::min<int64_t>({int64_t(kMaxDecodeSplits), key_blocks / 2, int64_t(slots)}));
  if (most <= 1) return 1;
  auto efficiency = [&](int s) {
    const double blocks = double(tiles) * s, waves = std::ceil(blocks / slots);
    return blocks / (waves * slots);
  };
  double best = 0;
  for (int s = 1; s <= most; ++s) best = std::max(best, efficiency(s));
  int splits = 1;
  for (int s = 1; s <= most; ++s) {
    if (efficiency(s) >= 0.85 * best) {
      splits = s;
      break;
    }
  }
  splits = int(std::min<int64_t>(most, (key_blocks + key_blocks / splits - 1) / (key_blocks / splits)));
  splits = int(std::min<int64_t>(splits, std::max<int64_t>(kDecodeCombineSplits, (paged ? slots : sms) / tiles)));
  const int64_t extra_tiles = (key_blocks + kMaxClusterSplits - 1) / kMaxClusterSplits -
                              (key_blocks + splits - 1) / splits;  // per split, in clusters
  if (splits > kMaxClusterSplits && extra_tiles <= kClusterExtraTiles && cluster_fits(kMaxClusterSplits)) {
    splits = kMaxClusterSplits;
  }
  return splits;
}

}  // namespace flashattn::cuda::sm80
