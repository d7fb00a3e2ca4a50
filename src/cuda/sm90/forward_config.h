// Every tile-size decision of the Hopper forward, in one place.
//
// A block is kBlockM = 64 * kConsumerWarpgroups query rows of one (batch, head): one consumer warpgroup per 64
// rows (the M of one wgmma), fed by a producer that only issues TMA. Keys stream through a kStages-deep ring of
// [kBlockN x head_dim] K and V tiles. Shared memory: Q + kStages * (K + V), each 16-bit, per pipeline: a CTA
// runs kPipelines independent ones (producer warp, consumer warpgroups, buffers, tile sequence), usually one.
//
// The kernel each head dim runs (KernelPlan below), chosen on the H200 from the tile sets, grids and consumer
// orderings measured in bench/results/hopper-forward.md (941cb61 to d6a87b5). Every kernel issues S_n with
// P_{n+1} V_{n+1} and runs the softmax under P V, its consumer warpgroups taking turns or issuing freely
// (IssueOrder below; forward_mainloop.cuh); every plan runs on the persistent grid.
//   hd  64: 192 x 128 (three consumer warpgroups), 3 stages: 24 KB + 3 * 32 KB = 120 KB; up to 2k keys (4k
//           under a mask) three pipelines of 64 x 128 (one consumer warpgroup each), 2 stages (3 * 72 KB)
//   hd 128: 128 x 176, 2 stages (32 KB + 2 * 88 KB = 208 KB) without a mask past 4k keys, 128 x 128 with 3
//           stages (32 KB + 3 * 64 KB = 224 KB) up to 4k; 128 x 128 (32 KB + 2 * 64 KB = 160 KB) under a causal
//           or window mask, where narrower key tiles waste less on the diagonal
//   hd 192: 128 x 80, 2 stages: 48 KB + 2 * 60 KB = 168 KB; under a causal or window mask 128 x 64 (48 KB +
//           2 * 48 KB = 144 KB); with d_v <= 128 (MLA) 128 x 128, V and O 128 columns wide: 48 KB + 2 * (48 +
//           32) KB = 208 KB
//   d_v <= 64 beside d in 65..128: hd 128's tiles but for the 4k-key plan, V and O 64 columns wide (164 / 128 KB)
//   hd 256: 128 x 80, 2 stages: 64 KB + 2 * 80 KB = 224 KB; under a causal or window mask 128 x 64 (64 KB +
//           2 * 64 KB = 192 KB)
// Wider key tiles spread each tile's fixed costs (barrier waits, the O rescale, the warpgroup turn) over more
// products; three consumer warpgroups at hd 64 give each warpgroup's softmax two other warpgroups' products
// to hide under.
// Registers: under __launch_bounds__(kThreads, kCtasPerSm) every thread starts at 65536 / (kThreads *
// kCtasPerSm); setmaxnreg moves them to the producer's and consumers' budgets below, by the CTA's consumer
// warpgroups (1, two CTAs per SM: 128 * 24 + 128 * 232 = 32768 of a CTA's 32768; 2: 128 * 24 + 256 * 240 =
// 64512; 3, of one block or of three pipelines: 128 * 32 + 384 * 160 = 65536, of 65536). ptxas compiles every
// instruction within the launch-bound count, so that count must hold a wgmma's operands (three CTAs per SM, 80
// registers, do not compile: C7602).
#pragma once

#include <cstdint>

#include "cuda/sm90/fp8_v_layout.h"
#include "cuda/sm90/swizzle.h"
#include "cuda/sm90/warpgroup.h"

namespace flashattn::cuda::sm90 {

// Named barriers of the consumer warpgroups' turns (one per consumer warpgroup); 0 is __syncthreads'.
constexpr int kTurnBarrier0 = 1;
// How far (log2 of P's units) a tile's row maximum may exceed the running one before the running maximum, and
// with it O and the row sum, is rescaled (Consumer::softmax): P then stays below 2^8, exact in fp16 and bf16.
constexpr float kStaleMaxLog2 = 8.f;
// Depth of the shared-memory ring through which a persistent CTA's producer hands claimed tile numbers to the
// consumers: two lets the producer claim the next tile while the consumers still read the current number.
constexpr int kTileRing = 2;

// How the consumer warpgroups of a CTA issue their matrix products (forward_mainloop.cuh, wait_turn).
//   turns: round robin on named barriers, so that one warpgroup's softmax runs under the others' products.
//   free:  each warpgroup issues as soon as its operands are ready; the tensor cores interleave the groups.
// Measured with two consumer warpgroups (bench/results/hopper-forward.md, 58d37b2): free +2-4% at hd 128 in nearly
// every cell (512 to 16k keys, causal and not); at hd 256 turns +3-6% up to 2k keys, level beyond (free also spills 8
// bytes); at hd 64 (128 x 128, masked, 2k keys) free +8%, which only brings it level with the one-warpgroup kernel run
// there.
// Three warpgroups (hd 64) keep turns: not measured without.
enum class IssueOrder { turns, free };

// kPipelines_: independent pipelines in one CTA, each with its own producer warp, consumer warpgroup, Q buffer,
// K/V ring, barriers and tile sequence (SharedStorage's pipeline, TileSequence); they share the SM and
// setmaxnreg's split of its registers. Three one-warpgroup pipelines put three consumer warps on each scheduler on
// 64-row blocks (two CTAs of one pipeline: two warps), within the register file (3 x 160 + 32, as three
// warpgroups of one block) where three CTAs per SM are not (C7602 above).
// kClusterCtas_: CTAs per thread-block cluster (1 or 2). With 2, pipeline p of the two CTAs runs the two 64 *
// kConsumerWarpgroups-row blocks of one tile of 2 * kBlockM rows (block_work), over the same key tiles (the pair's
// union: a causal pair starting on an even block needs no more), and each CTA loads one half of every K and V tile
// into both CTAs' shared memory (TMA multicast): the L2 reads per product halve. The halves' slots are freed by
// both CTAs' consumers, and the pair's tile numbers come from rank 0's producer (TileSequence).
// kElemBytes_: 2 for fp16 / bf16, 1 for e4m3, whose V tiles are V_t's (fp8_v_layout.h): kHeadDim rows of kBlockN keys.
// kFp8StaleLog2_ (e4m3): how far (log2 of P's units) the running maximum may lag before it is raised (the 16-bit
// kernels' kStaleMaxLog2; e4m3 has less range to spare: forward_mainloop.cuh, Consumer).
// kHeadDimV_: V's and O's columns (P V's N, O's accumulator, the V tiles), where a plan keeps them narrower than Q's
// and K's kHeadDim (DeepSeek's MLA, 192 / 128); 0: kHeadDim.
template <int kHeadDim_, int kBlockN_, int kConsumerWarpgroups_, int kStages_, IssueOrder kIssue_ = IssueOrder::turns,
          int kPipelines_ = 1, int kClusterCtas_ = 1, int kElemBytes_ = 2, int kFp8StaleLog2_ = 0, int kHeadDimV_ = 0>
struct ForwardConfig {
  static constexpr int kFp8StaleLog2 = kFp8StaleLog2_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_ == 0 ? kHeadDim_ : kHeadDimV_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
  static constexpr int kStages = kStages_;
  // A single consumer warpgroup has no one to take turns with.
  static constexpr bool kTakeTurns = kIssue_ == IssueOrder::turns && kConsumerWarpgroups > 1;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "sm90 forward: head dim 64, 128, 192 or 256");
  // V's columns in whole 64-column panels (N-major V), at most Q's; e4m3's V_t tiles are laid out by kHeadDim.
  static_assert(kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim && (kElemBytes_ == 2 || kHeadDimV == kHeadDim),
                "sm90 forward: d_v in whole 64-column panels up to the head dim (16-bit only when narrower)");
  static_assert(kBlockN % (32 / kElemBytes_) == 0 && kBlockN <= 256,
                "sm90 forward: kBlockN a multiple of one wgmma's K (P V's k-steps)");
  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3, "sm90 forward: 1 to 3 consumer warpgroups");
  static constexpr int kPipelines = kPipelines_;
  // The turns' named barriers are numbered per consumer warpgroup of one pipeline; one producer warp each.
  static_assert(kPipelines == 1 || (kConsumerWarpgroups == 1 && kPipelines <= kWarpgroupThreads / 32),
                "sm90 forward: several pipelines per CTA only with one consumer warpgroup each");
  static constexpr int kBlockM = kConsumerWarpgroups * kWgmmaRows;
  static constexpr int kClusterCtas = kClusterCtas_;
  static_assert(kClusterCtas == 1 || kClusterCtas == 2, "sm90 forward: clusters of one or two CTAs");
  // Query rows per tile (one block per CTA of the cluster) and key rows each CTA loads of a K / V tile.
  static constexpr int kTileRows = kBlockM * kClusterCtas;
  static constexpr int kKVPartRows = kBlockN_ / kClusterCtas;
  static_assert(kKVPartRows % 8 == 0, "sm90 forward: each CTA's part of a K/V tile whole 8-row swizzle atoms");
  // Consumer warpgroups of the whole CTA (every pipeline); the producer warpgroup comes first.
  static constexpr int kCtaConsumerWarpgroups = kPipelines * kConsumerWarpgroups;
  static constexpr int kThreads = (1 + kCtaConsumerWarpgroups) * kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;  // of one pipeline
  // Arrivals that free a K / V slot: every consumer warp of the pipeline in every CTA of the cluster.
  static constexpr int kKVReleases = kConsumerWarps * kClusterCtas;
  // Arrivals that free a tile-ring slot of rank 0 (whose producer posts the tile numbers): every consumer warp of
  // the pipeline in every CTA, and the other CTAs' producers.
  static constexpr int kTileReleases = kConsumerWarps * kClusterCtas + kClusterCtas - 1;
  // One consumer warpgroup: two CTAs share an SM, each on its own 64-row block, so one CTA's tile boundary
  // (first S, last P V, epilogue) runs under the other's products instead of idling the tensor cores.
  static constexpr int kCtasPerSm = kCtaConsumerWarpgroups == 1 ? 2 : 1;
  static constexpr int kProducerRegisters = kCtaConsumerWarpgroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters =
      kCtaConsumerWarpgroups == 1 ? 232 : kCtaConsumerWarpgroups == 2 ? 240 : 160;
  static_assert(kCtaConsumerWarpgroups <= 3, "sm90 forward: at most 3 consumer warpgroups per CTA");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kCtaConsumerWarpgroups * kConsumerRegisters) <=
                    65536 / kCtasPerSm,
                "sm90 forward: register budgets over the CTA's share of the 64K-register file");

  static constexpr int kElemBytes = kElemBytes_;
  static_assert(kElemBytes == 1 || kElemBytes == 2, "sm90 forward: 16-bit or e4m3 elements");
  // Elements of one 128-byte swizzled row (a panel's columns; V_t's keys).
  static constexpr int kPanelElems = kSwizzleBytes / kElemBytes;
  // Q and K rows are cut into panels of kQKPanelBytes: 128, or 64 where a row has only 64 bytes (e4m3 at hd 64,
  // swizzled by 64 bytes: make_desc_k_major_rows).
  static constexpr int kQKPanelBytes = kHeadDim * kElemBytes < kSwizzleBytes ? kHeadDim * kElemBytes : kSwizzleBytes;
  static constexpr int kQKPanelElems = kQKPanelBytes / kElemBytes;
  static_assert((kQKPanelBytes == 128 || kQKPanelBytes == 64) && kHeadDim % kQKPanelElems == 0,
                "sm90 forward: Q and K rows in whole 128- or 64-byte panels");
  // e4m3: V_t's key tiles are whole 128-byte panels of keys and end inside a sequence's spans (fp8_v_layout.h),
  // and each CTA loads whole tiles (no clusters).
  static_assert(kElemBytes == 2 || (kBlockN % kPanelElems == 0 && kFp8KeyPad % kBlockN == 0 && kClusterCtas_ == 1),
                "sm90 forward: e4m3 key tiles of 128 keys dividing kFp8KeyPad, one CTA per cluster");
  static constexpr int kQBytes = kBlockM * kHeadDim * kElemBytes;
  static constexpr int kKTileBytes = kBlockN * kHeadDim * kElemBytes;
  static constexpr int kVTileBytes = kBlockN * kHeadDimV * kElemBytes;
  static_assert(kKTileBytes % 1024 == 0 && kVTileBytes % 1024 == 0,
                "sm90 forward: every tile starts on a 1024-byte swizzle atom");
  // q_full, q_empty, k_full[], v_full[], k_empty[], v_empty[]; the tile ring's slots (4 bytes each, rounded up to
  // 8 here), tile_full[], tile_empty[].
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages) + 8 * 3 * kTileRing;
  static constexpr int kAlignSlack = 1024;                     // the dynamic window rounded up to a swizzle atom
  static constexpr int kPipelineBytes = kQBytes + kStages * (kKTileBytes + kVTileBytes) + kBarrierBytes;
  // Each pipeline's region starts on a swizzle atom (its Q tile first).
  static constexpr int kPipelineStride = (kPipelineBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = (kPipelines - 1) * kPipelineStride + kPipelineBytes + kAlignSlack;
  // 228 KB per SM, of which the hardware reserves 1 KB per resident CTA.
  static_assert(kSmemBytes <= (228 / kCtasPerSm - 1) * 1024, "sm90 forward: over the shared-memory limit");
};

// What runs for a head dim, with (kMasked) or without a causal / window mask. Every plan runs on the persistent
// grid (one CTA per SM claiming tiles; the producer loads a tile's first Q and K under the previous tile): since
// the loop counters became warp-uniform it is level or ahead of one CTA per tile at every length and head dim
// (hd 128 at 512-1k +8-18%, hd 256 +0-5%; bench/results/hopper-forward.md, 9ffdec3). Sm90Grid (forward_sm90.h) can
// still force one CTA per tile, for the tests and the benchmark.
// A plan: the tile set, and optionally a second plan (ShortKeysPlan) that runs instead when a sequence has at
// most kShortKeys keys.
template <typename Config_, typename ShortKeysPlan_ = void, int64_t kShortKeys_ = 0>
struct Plan {
  using Config = Config_;
  using ShortKeysPlan = ShortKeysPlan_;
  static constexpr int64_t kShortKeys = kShortKeys_;
};
// kHeadDimV: the V / O bucket where a plan of its own keeps it narrower than kHeadDim (below: 128 / 64, 192 / 128).
template <int kHeadDim, bool kMasked, int kHeadDimV = kHeadDim>
struct KernelPlan;
// hd 64: three consumer warpgroups (192-row blocks: the fewest K/V bytes per product). The overlapped ordering
// against the first kernel's serial one (ce3e0eb: wait for each product, which hd 64 ran until 44259c8): +1-4% past 2k
// keys (bench/results/hopper-forward.md, 44259c8).
// hd 64 on short sequences (up to 2k keys, 4k under a mask): three pipelines per CTA (kPipelines), each running
// 64-row blocks with one consumer warpgroup and a 2-stage ring (8 KB + 2 * 32 KB = 72 KB each, 219 KB in all).
// A block's boundary (Q, the first S, the last P V, the epilogue) runs under the other pipelines' products, the
// diagonal wastes the least, and each scheduler has three consumer warps where the two CTAs of one warpgroup
// each (the plan before) gave it two: +11-15% at 512-1k causal, +7-14% at 2k causal (371-394 vs 345 TFLOP/s),
// +9% at 512-1k without a mask, level at 2k without and 4k with one (bench/results/hopper-forward.md, 0a77eda).
// Past that three warpgroups share each K/V tile over 192-row blocks (a third of the K/V bytes per product):
// pipelines at 4k without a mask -3 to -5%, at 8k -3 to -8%.
// The pipelines run in clusters of two CTAs sharing each K/V tile (kClusterCtas): in sustained timing +2% at 2k
// causal (368-372 vs 363), +3% at 2k without a mask and at 4k causal, +1% at 1k without
// (bench/results/hopper-forward.md, c508eed / 018c957). Clusters did not pay for the 192-row kernel (-2 to -7%) nor for
// pipelines past these lengths (-2%); 64- or 80-key tiles with deeper rings here lose 9-14%
// (bench/results/hopper-forward.md, 7d15d21).
using Hd64ShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 2, IssueOrder::free, 3, 2>>;
template <>
struct KernelPlan<64, false> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64ShortKeysPlan, 2048> {};
template <>
struct KernelPlan<64, true> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64ShortKeysPlan, 4096> {};
// hd 128 without a mask, up to 4k keys: 128-key tiles with a 3-stage ring (224 KB). Against 176-key tiles: +8% /
// +6% / +4% / +2% at 512 / 1k / 2k / 4k, level at 8k (bench/results/hopper-forward.md, 461d0b2, 9396921); a 176-key
// tile also leaves 3% of a 2k sequence's last tile empty.
// hd 128's two consumer warpgroups issue freely (IssueOrder above).
using Hd128ShortKeysPlan = Plan<ForwardConfig<128, 128, 2, 3, IssueOrder::free>>;
template <>
struct KernelPlan<128, false>
    : Plan<ForwardConfig<128, 176, 2, 2, IssueOrder::free>, Hd128ShortKeysPlan, 4096> {};
template <>
struct KernelPlan<128, true> : Plan<ForwardConfig<128, 128, 2, 2, IssueOrder::free>> {};
// hd 192 (d or d_v in 129..192: DeepSeek's MLA 192 / 128 among them; support_checks.h): hd 256's tile set at
// three quarters of its columns, which the 256 kernel spent on zeros (bench/results/head-dims.md).
template <>
struct KernelPlan<192, false> : Plan<ForwardConfig<192, 80, 2, 2>> {};
template <>
struct KernelPlan<192, true> : Plan<ForwardConfig<192, 64, 2, 2>> {};
// d in 65..128 beside d_v <= 64: V and O at 64 columns, half of P V's products and of O's registers; hd 128's tiles
// (128 x 176 without a mask: 32 KB + 2 * (44 + 22) KB = 164 KB; 128 x 128 under one). ALiBi, dropout and chunked
// attention keep the 128 plan (forward_sm90.cu).
template <>
struct KernelPlan<128, false, 64> : Plan<ForwardConfig<128, 176, 2, 2, IssueOrder::free, 1, 1, 2, 0, 64>> {};
template <>
struct KernelPlan<128, true, 64> : Plan<ForwardConfig<128, 128, 2, 2, IssueOrder::free, 1, 1, 2, 0, 64>> {};
// d in 129..192 beside d_v <= 128 (DeepSeek's MLA prefill, 192 / 128): V and O at 128 columns instead of 192, so
// P V does two thirds of the 192 plan's products and O takes 64 registers instead of 96, which leaves room for
// 128-key tiles (S 64 registers; FA3 and FA4 run this shape on 128 x 128 tiles too): 48 KB + 2 * (48 + 32) KB =
// 208 KB. Calls with ALiBi, dropout or chunked attention run the 192 plan (forward_sm90.cu). Its warpgroups issue
// freely: against turns on the H200 (2026-12-07, bench/results/head-dims.md) +1-2% without a mask, +3-5% causal at
// 8k / 16k, level at 2k; ptxas spills 36 bytes in the per-tile setup, none in the key loop.
template <bool kMasked>
struct KernelPlan<192, kMasked, 128> : Plan<ForwardConfig<192, 128, 2, 2, IssueOrder::free, 1, 1, 2, 0, 128>> {};
// hd 256 under a mask: 64-key tiles waste less on the diagonal than 80-key ones; causal +10% / +5% / +4.5% / +2%
// at 512 / 1k / 2k / 4k keys, level beyond (bench/results/hopper-forward.md, d6a87b5).
template <>
struct KernelPlan<256, false> : Plan<ForwardConfig<256, 80, 2, 2>> {};
template <>
struct KernelPlan<256, true> : Plan<ForwardConfig<256, 64, 2, 2>> {};

// e4m3 inputs (Fp8KernelPlan; head dims in buckets of 64, 128, 256: fp8_head_dim_bucket): 128-key tiles (V_t's
// panels), K and V_t tiles half the bytes of 16-bit ones. hd 64: 192-row blocks as in 16 bits, 12 KB + 3 * 16 KB =
// 60 KB; hd 128: 16 KB + 3 * 32 KB = 112 KB; hd 256: 32 KB + 2 * 64 KB = 160 KB.
template <int kHeadDim, bool kMasked>
struct Fp8KernelPlan;
// The running maximum lags by up to 2^2 (P quantised as P · 2^6): against never lagging (P · 2^8), +1-5% in 9 of
// 12 cells of hd 64 / 128 / 256 at 4k / 16k, -2% in one (bench/results/fp8.md).
constexpr int kFp8StaleLog2 = 2;
template <bool kMasked>
struct Fp8KernelPlan<64, kMasked> : Plan<ForwardConfig<64, 128, 3, 3, IssueOrder::turns, 1, 1, 1, kFp8StaleLog2>> {};
template <bool kMasked>
struct Fp8KernelPlan<128, kMasked> : Plan<ForwardConfig<128, 128, 2, 3, IssueOrder::free, 1, 1, 1, kFp8StaleLog2>> {};
template <bool kMasked>
struct Fp8KernelPlan<256, kMasked> : Plan<ForwardConfig<256, 128, 2, 2, IssueOrder::free, 1, 1, 1, kFp8StaleLog2>> {};

}  // namespace flashattn::cuda::sm90
