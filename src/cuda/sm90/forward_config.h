// Every tile-size decision of the Hopper forward, in one place.
//
// A CTA owns kBlockM = 128 query rows of one (batch, head): two consumer warpgroups of 64 rows each (the M of
// one wgmma) plus one producer warpgroup that only issues TMA. Keys stream through a kStages-deep ring of
// [kBlockN x head_dim] K and V tiles. Shared memory: Q + kStages * (K + V), each 16-bit:
//   hd  64: kBlockN 128, 3 stages: 16 KB + 3 * 32 KB = 112 KB
//   hd 128: kBlockN 128, 2 stages: 32 KB + 2 * 64 KB = 160 KB
//   hd 256: kBlockN  64, 2 stages: 64 KB + 2 * 64 KB = 192 KB   (S 64x64 keeps O's 128 fp32 registers + S in budget)
// Registers: 384 threads under __launch_bounds__(384, 1) start at 168 each; setmaxnreg moves them to
// 24 (producer) and 240 (consumers): 128 * 24 + 256 * 240 = 64512 of 65536.
#pragma once

namespace flashattn::cuda::sm90 {

constexpr int kWarpgroupThreads = 128;
constexpr int kWgmmaRows = 64;  // M of one wgmma: the rows of one consumer warpgroup
constexpr int kWgmmaK = 16;     // K of one wgmma for 16-bit inputs
// Named barriers of the consumer ping-pong (one per consumer warpgroup); 0 is __syncthreads'.
constexpr int kPingPongBarrier0 = 1;

template <int kHeadDim>
struct ForwardConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "sm90 forward: head dim 64, 128 or 256");
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kBlockM = kConsumerWarpgroups * kWgmmaRows;
  static constexpr int kBlockN = kHeadDim == 256 ? 64 : 128;
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;
  static constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  static constexpr int kElemBytes = 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * kElemBytes;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * kElemBytes;
  static constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);  // q_full, k_full[], v_full[], empty[], empty_v[]
  static constexpr int kAlignSlack = 1024;                     // the dynamic window rounded up to a swizzle atom
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + kAlignSlack;
  static_assert(kSmemBytes <= 227 * 1024, "sm90 forward: over the 227 KB shared-memory limit");
};

}  // namespace flashattn::cuda::sm90
