// Every tile-size decision of the sm80 backward, in one place.
//
// Compile-time axes are dtype x head-dim bucket only. A call with head dims d, d_v runs the smallest bucket
// >= max(d, d_v); columns past d (or d_v) are zero-filled on load and never stored.
//
// Per bucket (M = query rows per tile, N = keys per thread block, all 8 warps; compact tiles for 99 KB GPUs below):
//   bucket  M    N    S/dP warps (M x N)   dK/dV warps (N x d)   dQ warps (M x d)
//     64   128  128        2 x 4                  4 x 2                4 x 2
//    128    64  128        2 x 4                  4 x 2                2 x 4
//    256    64   64        4 x 2                  2 x 4                2 x 4
// These follow the FlashAttention-2 sm80 choices: the dK and dV accumulators (N x d fp32 each, held in
// registers for the whole key block) plus one S and one dP tile must fit in 255 registers per thread.
// (FA2 splits hd64's S/dP 4 x 2; 2 x 4 measured up to 3% faster here: H200, 2026-11-29.)
//
// kDqBesideDv: the main kernel's dQ reductions share a block of straight-line code with the dV product, so they
// interleave with its mma.sync (measured 1-4.5% faster at hd64/128 on the H200). At hd256 the 64 dQ
// accumulators per thread cannot stay live into the dV product without heavy spilling (a 144-byte stack), and
// keeping the two apart measured 2-3% faster there.
#pragma once

namespace flashattn::cuda::sm80 {

constexpr int kBwdWarps = 8;
constexpr int kBwdThreads = kBwdWarps * 32;
// One 16-byte chunk of padding per shared-memory row: consecutive rows then start 16 bytes apart modulo 128,
// so the 8 row addresses of every ldmatrix (and every 16-byte cp.async row) hit distinct banks.
constexpr int kSmemPad = 8;

// kCompact: the tiles for GPUs that give a block at most 99 KB of shared memory (compute capability 8.6 / 8.9:
// RTX 30/40, A10, L4, L40), where even one pipeline stage of the regular tiles (141-154 KB) does not fit.
template <int kHeadDim, bool kCompact = false>
struct BwdTiles;

template <>
struct BwdTiles<64> {
  static constexpr int kM = 128, kN = 128;
  static constexpr int kSdPWarpsM = 2, kdKVWarpsN = 4, kdQWarpsM = 4;
  static constexpr bool kDqBesideDv = true;
};
template <>
struct BwdTiles<128> {
  static constexpr int kM = 64, kN = 128;
  static constexpr int kSdPWarpsM = 2, kdKVWarpsN = 4, kdQWarpsM = 2;
  static constexpr bool kDqBesideDv = true;
};
template <>
struct BwdTiles<256> {
  static constexpr int kM = 64, kN = 64;
  static constexpr int kSdPWarpsM = 4, kdKVWarpsN = 2, kdQWarpsM = 2;
  static constexpr bool kDqBesideDv = false;
};
// Compact (99 KB): half the query rows at hd64 (88 KB), half the keys at hd128 (87 KB), both one stage. hd256
// has none: K and V alone take 66 KB at 64 keys, and the Q/dO and P/dS staging does not fit beside them (FA2
// keeps V in registers there); it reports unsupported on such GPUs.
template <>
struct BwdTiles<64, true> {
  static constexpr int kM = 64, kN = 128;
  static constexpr int kSdPWarpsM = 2, kdKVWarpsN = 4, kdQWarpsM = 4;
  static constexpr bool kDqBesideDv = true;
};
template <>
struct BwdTiles<128, true> {
  static constexpr int kM = 64, kN = 64;
  static constexpr int kSdPWarpsM = 2, kdKVWarpsN = 4, kdQWarpsM = 2;
  static constexpr bool kDqBesideDv = true;
};
template <int kHeadDim>
constexpr bool kBwdHasCompactTiles = kHeadDim != 256;

// Everything derived from the bucket: warp tiles, mma counts per warp, shared-memory layout (in elements).
template <int kHeadDim_, bool kCompact_ = false>
struct BwdConfig : BwdTiles<kHeadDim_, kCompact_> {
  using Tiles = BwdTiles<kHeadDim_, kCompact_>;
  static constexpr bool kCompact = kCompact_;
  static constexpr int kD = kHeadDim_;
  static constexpr int kM = Tiles::kM, kN = Tiles::kN;

  // S = Q Kᵀ and dP = dO Vᵀ: an M x N tile over kSdPWarpsM x kSdPWarpsN warps.
  static constexpr int kSdPWarpsN = kBwdWarps / Tiles::kSdPWarpsM;
  static constexpr int kSdPWarpM = kM / Tiles::kSdPWarpsM, kSdPWarpN = kN / kSdPWarpsN;
  // dV += Pᵀ dO and dK += dSᵀ Q: an N x D tile.
  static constexpr int kdKVWarpsD = kBwdWarps / Tiles::kdKVWarpsN;
  static constexpr int kdKVWarpN = kN / Tiles::kdKVWarpsN, kdKVWarpD = kD / kdKVWarpsD;
  // dQ = dS K: an M x D tile.
  static constexpr int kdQWarpsD = kBwdWarps / Tiles::kdQWarpsM;
  static constexpr int kdQWarpM = kM / Tiles::kdQWarpsM, kdQWarpD = kD / kdQWarpsD;

  // Row pitches (elements): head-dim rows (Q, dO, K, V) and key rows (P, dS).
  static constexpr int kLdD = kD + kSmemPad;
  static constexpr int kLdN = kN + kSmemPad;

  // Pipeline depth (runtime, 1 or 2): the launcher takes 2 stages where the device's shared memory allows
  // (Hopper: every bucket) and 1 otherwise (A100's 163 KB), where each tile is loaded and waited for in turn.
  static constexpr int kMaxStages = 2;
  // Main kernel (one key block per thread block): K, V resident; Q, dO and their rows' LSE, D (fp32) staged
  // `stages` deep; P, dS staging.
  static constexpr int main_smem_bytes(int stages) {
    return (2 * kN * kLdD + 2 * stages * kM * kLdD + 2 * kM * kLdN) * 2 + 2 * stages * kM * 4;
  }
  // Deterministic dQ kernel (one query block per thread block): Q, dO resident; K, V staged; dS.
  static constexpr int dq_smem_bytes(int stages) { return (2 * kM * kLdD + 2 * stages * kN * kLdD + kM * kLdN) * 2; }

  static_assert(kSdPWarpM % 16 == 0 && kSdPWarpN % 16 == 0, "S/dP warp tile must be whole 16x16 mma pairs");
  static_assert(kdKVWarpN % 16 == 0 && kdKVWarpD % 16 == 0, "dK/dV warp tile must be whole 16x16 mma pairs");
  static_assert(kdQWarpM % 16 == 0 && kdQWarpD % 16 == 0, "dQ warp tile must be whole 16x16 mma pairs");
  static_assert(kM % 16 == 0 && kN % 16 == 0 && kD % 16 == 0, "mma k-steps are 16 wide");
};

// The buckets, smallest first; a call uses the first one >= max(d, d_v).
constexpr int kBwdHeadDimBuckets[] = {64, 128, 256};

}  // namespace flashattn::cuda::sm80
