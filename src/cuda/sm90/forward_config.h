// Every tile-size decision of the Hopper forward, in one place.
//
// A CTA owns kBlockM = 64 * kConsumerWarpgroups query rows of one (batch, head): one consumer warpgroup per 64
// rows (the M of one wgmma) plus one producer warpgroup that only issues TMA. Keys stream through a
// kStages-deep ring of [kBlockN x head_dim] K and V tiles. Shared memory: Q + kStages * (K + V), each 16-bit.
//
// The kernel each head dim runs (KernelPlan below), chosen on the H200 from the tile sets, grids and consumer
// orderings measured in bench/results/sm90-notes.md (v3-v4, v13-v17). Every kernel issues S_n with
// P_{n+1} V_{n+1} and runs the softmax under P V, its consumer warpgroups taking turns or issuing freely
// (IssueOrder below; forward_mainloop.cuh); every plan runs on the persistent grid.
//   hd  64: 192 x 128 (three consumer warpgroups), 3 stages: 24 KB + 3 * 32 KB = 120 KB; under a mask with at
//           most 2k keys 64 x 128 (one consumer warpgroup, two CTAs per SM), 3 stages (104 KB per CTA)
//   hd 128: 128 x 176, 2 stages (32 KB + 2 * 88 KB = 208 KB) without a mask past 4k keys, 128 x 128 with 3
//           stages (32 KB + 3 * 64 KB = 224 KB) up to 4k; 128 x 128 (32 KB + 2 * 64 KB = 160 KB) under a causal
//           or window mask, where narrower key tiles waste less on the diagonal
//   hd 256: 128 x 80, 2 stages: 64 KB + 2 * 80 KB = 224 KB; under a causal or window mask 128 x 64 (64 KB +
//           2 * 64 KB = 192 KB)
// Wider key tiles spread each tile's fixed costs (barrier waits, the O rescale, the warpgroup turn) over more
// products; three consumer warpgroups at hd 64 give each warpgroup's softmax two other warpgroups' products
// to hide under.
// Registers: under __launch_bounds__(kThreads, kCtasPerSm) every thread starts at 65536 / (kThreads *
// kCtasPerSm); setmaxnreg moves them to the producer's and consumers' budgets below (1 consumer, two CTAs per SM:
// 128 * 24 + 128 * 232 = 32768 of a CTA's 32768; 2 consumers: 128 * 24 + 256 * 240 = 64512; 3 consumers:
// 128 * 32 + 384 * 160 = 65536, of 65536). ptxas compiles every instruction within the launch-bound count, so
// that count must hold a wgmma's operands (three CTAs per SM, 80 registers, do not compile: C7602).
#pragma once

#include <cstdint>

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
// Measured with two consumer warpgroups (sm90-notes.md, v17): free +2-4% at hd 128 in nearly every cell (512 to
// 16k keys, causal and not); at hd 256 turns +3-6% up to 2k keys, level beyond (free also spills 8 bytes); at hd
// 64 (128 x 128, masked, 2k keys) free +8%, which only brings it level with the one-warpgroup kernel run there.
// Three warpgroups (hd 64) keep turns: not measured without.
enum class IssueOrder { turns, free };

template <int kHeadDim_, int kBlockN_, int kConsumerWarpgroups_, int kStages_, IssueOrder kIssue_ = IssueOrder::turns>
struct ForwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerWarpgroups = kConsumerWarpgroups_;
  static constexpr int kStages = kStages_;
  // A single consumer warpgroup has no one to take turns with.
  static constexpr bool kTakeTurns = kIssue_ == IssueOrder::turns && kConsumerWarpgroups > 1;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "sm90 forward: head dim 64, 128 or 256");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "sm90 forward: kBlockN a multiple of 16 (P V's k-steps)");
  static_assert(kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3, "sm90 forward: 1 to 3 consumer warpgroups");
  static constexpr int kBlockM = kConsumerWarpgroups * kWgmmaRows;
  static constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;
  // One consumer warpgroup: two CTAs share an SM, each on its own 64-row block, so one CTA's tile boundary
  // (first S, last P V, epilogue) runs under the other's products instead of idling the tensor cores.
  static constexpr int kCtasPerSm = kConsumerWarpgroups == 1 ? 2 : 1;
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 1 ? 232 : kConsumerWarpgroups == 2 ? 240 : 160;
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters) <=
                    65536 / kCtasPerSm,
                "sm90 forward: register budgets over the CTA's share of the 64K-register file");

  static constexpr int kElemBytes = 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * kElemBytes;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * kElemBytes;
  static_assert(kKVTileBytes % 1024 == 0, "sm90 forward: every tile starts on a 1024-byte swizzle atom");
  // q_full, q_empty, k_full[], v_full[], k_empty[], v_empty[]; the tile ring's slots (4 bytes each, rounded up to
  // 8 here), tile_full[], tile_empty[].
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages) + 8 * 3 * kTileRing;
  static constexpr int kAlignSlack = 1024;                     // the dynamic window rounded up to a swizzle atom
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + kAlignSlack;
  // 228 KB per SM, of which the hardware reserves 1 KB per resident CTA.
  static_assert(kSmemBytes <= (228 / kCtasPerSm - 1) * 1024, "sm90 forward: over the shared-memory limit");
};

// What runs for a head dim, with (kMasked) or without a causal / window mask. Every plan runs on the persistent
// grid (one CTA per SM claiming tiles; the producer loads a tile's first Q and K under the previous tile): since
// the loop counters became warp-uniform it is level or ahead of one CTA per tile at every length and head dim
// (hd 128 at 512-1k +8-18%, hd 256 +0-5%; sm90-notes.md v12). Sm90Grid (forward_sm90.h) can still force one
// CTA per tile, for the tests and the benchmark.
// A plan: the tile set, and optionally a second plan (ShortKeysPlan) that runs instead when a sequence has at
// most kShortKeys keys.
template <typename Config_, typename ShortKeysPlan_ = void, int64_t kShortKeys_ = 0>
struct Plan {
  using Config = Config_;
  using ShortKeysPlan = ShortKeysPlan_;
  static constexpr int64_t kShortKeys = kShortKeys_;
};
template <int kHeadDim, bool kMasked>
struct KernelPlan;
// hd 64: three consumer warpgroups (192-row blocks: the fewest K/V bytes per product). The overlapped ordering
// against v1's serial one (wait for each product, which hd 64 ran until v16): +1-4% past 2k keys (sm90-notes.md).
template <>
struct KernelPlan<64, false> : Plan<ForwardConfig<64, 128, 3, 3>> {};
// hd 64 under a mask, up to 2k keys: 64-row blocks, one consumer warpgroup (3 stages: 8 KB + 3 * 32 KB = 104 KB)
// and two CTAs per SM. Each CTA's tile boundary (Q, the first S, the last P V, the epilogue) runs under the
// other CTA's products, and the diagonal wastes the least: against 128-row blocks with two consumer
// warpgroups in one CTA +6-11% at 512-2k causal (2k 352-366 vs 329-330 TFLOP/s); from 4k keys the three-warpgroup
// kernel is ahead (fewer K/V bytes per product: 8k causal 431-440 vs 408; sm90-notes.md, v16).
using Hd64MaskedShortKeysPlan = Plan<ForwardConfig<64, 128, 1, 3>>;
template <>
struct KernelPlan<64, true> : Plan<ForwardConfig<64, 128, 3, 3>, Hd64MaskedShortKeysPlan, 2048> {};
// hd 128 without a mask, up to 4k keys: 128-key tiles with a 3-stage ring (224 KB). Against 176-key tiles: +8% /
// +6% / +4% / +2% at 512 / 1k / 2k / 4k, level at 8k (sm90-notes.md, v14); a 176-key tile also leaves 3% of a
// 2k sequence's last tile empty.
// hd 128's two consumer warpgroups issue freely (IssueOrder above).
using Hd128ShortKeysPlan = Plan<ForwardConfig<128, 128, 2, 3, IssueOrder::free>>;
template <>
struct KernelPlan<128, false>
    : Plan<ForwardConfig<128, 176, 2, 2, IssueOrder::free>, Hd128ShortKeysPlan, 4096> {};
template <>
struct KernelPlan<128, true> : Plan<ForwardConfig<128, 128, 2, 2, IssueOrder::free>> {};
// hd 256 under a mask: 64-key tiles waste less on the diagonal than 80-key ones; causal +10% / +5% / +4.5% / +2%
// at 512 / 1k / 2k / 4k keys, level beyond (sm90-notes.md, v17).
template <>
struct KernelPlan<256, false> : Plan<ForwardConfig<256, 80, 2, 2>> {};
template <>
struct KernelPlan<256, true> : Plan<ForwardConfig<256, 64, 2, 2>> {};

}  // namespace flashattn::cuda::sm90
