// Every tile-size decision of the Hopper backward, in one place.
//
// A CTA owns kBlockN = 128 keys of one (batch, KV head): two consumer warpgroups of 64 keys each (the M of one
// wgmma) hold their keys' dK and dV in registers for the CTA's lifetime, while kBlockM = 64-row blocks of Q, dO
// (128 at hd 64) and their LSE and D stream through a kStages-deep ring for every query head of the KV group.
//   hd  64: K, V 16 KB each; Q, dO 2 stages x 16 KB each (128 rows); dSᵀ 2 x 32 KB; LSE, D 2 KB; dQ stages
//           2 x 16 KB: 195 KB.
//   hd 128: K, V 32 KB each; Q, dO 2 x 16 KB each; dSᵀ 2 x 16 KB; LSE, D 1 KB; dQ stages 2 x 16 KB: 193 KB.
// dQ = dS K (64 x hd per query block) is split between the consumer warpgroups by columns: each takes hd / 2
// columns over all 128 keys (both warpgroups' dSᵀ needed, one named barrier), so each dQ element gets one
// addition per key block. Splitting by keys instead (each warpgroup its own 64 keys, no exchange) was measured
// at hd 64 first: twice the additions, 258 TFLOP/s at 16k (bench/results/hopper-backward.md, d1057f5).
// dQ through shared memory: each warpgroup stores its dQ piece into a shared-memory stage in its register
// fragments' order (16-byte stores, no bank conflicts), and a warp of the producer warpgroup adds the stage to
// global memory with one bulk reduce-add (TMA), instead of each consumer thread sending 8-32 small vector
// atomics per block; dq_accum keeps the same fragment order, tile by tile (dq_convert_fragments_kernel undoes
// it). At hd 256 a warpgroup's 64 x 128 piece goes through a 64-column stage in two hand-offs.
// kBlockM = 128 at hd 64 in the order that overlaps dS with dV (kScoresBeforeDv false) did not fit: Sᵀ, dPᵀ and
// their fragments beside dK and dV made ptxas serialise the wgmmas and spill 136 bytes.
// Registers per consumer thread at hd 128: dK and dV 64 each, Sᵀ and dPᵀ 32 each, dQ 32: 224 of the 240 a
// consumer gets (2 consumers: 128 * 24 + 256 * 240 = 64512 of 65536).
// hd 256 (kColumnSplit): dK and dV of 64 keys at 256 columns would take 256 registers per thread of one
// warpgroup, so the CTA owns kBlockN = 64 keys and the two consumer warpgroups split dK, dV and dQ by columns
// (128 each). The scores are split by queries instead: each warpgroup computes Sᵀ, dPᵀ, Pᵀ and dSᵀ of its
// kScoreQueries = 32 of the block's 64 queries over the whole head dim (wgmma N = 32) and stores Pᵀ and dSᵀ
// into shared tiles; after one barrier both read the whole tiles for dV += Pᵀ dO, dK += dSᵀ Q and dQ = dS K
// (shared-memory A operands). Computing every score in both warpgroups instead (no exchange) cost 7 units of
// tensor work for 5 useful (bench/results/hopper-backward.md). dO has a ring of one stage (kDoStages, its own
// barriers, released once dV has landed) so that the dQ stages fit. Shared memory: K, V 32 KB each; Q 2 x 32 KB;
// dO 32 KB; Pᵀ and dSᵀ 2 buffers x 8 KB each; LSE, D 1 KB; dQ stages 2 x 16 KB: 226 KB of 227.
// kExtras: ALiBi compiled in; kDropout (with kExtras): dropout too, ALiBi where the call has slopes. Dropout's keep
// bits of a query block take a double buffer (kMaskBytes each: one or two 32-bit words per consumer thread, which
// the consumers draw for the next block, backward_sm90.cu's draw_keep_bits): hd 64 +4 KB, hd 128 +2 KB, hd 256
// +2 KB, which at hd 256 needs the dQ stages halved (4 hand-offs of 32 columns per warpgroup and block, 2 x 8 KB:
// -16 KB). Only the dropout kernel pays for that: with it in the ALiBi kernel too, ALiBi's backward cost at hd 256
// went from 2-7% to 11-21%.
// kDescaled: float8_e4m3fn inputs (backward_sm90_fp8.cu): the scores' scale times per-(batch, KV head) descales,
// read once per CTA. A kernel of its own: the run-time factor in every kernel moved the 16-bit kernels' spills
// (hd 64 68 -> 96 bytes, its dropout kernel 556 -> 972).
// Head dims between the buckets (kProductCols below): d, d_v <= 96 run the 128 bucket's layout with 96-column
// products (wgmma N = 96 reads half of the second 64-column panel; Sᵀ, dPᵀ 6 k-steps; dK, dV 48 registers each)
// and dQ split 64 / 32 between the warpgroups (each warpgroup its own copy of the consumer); d <= 192 beside
// d_v <= 128 runs the 192 bucket (below); other d, d_v <= 192 run the 256 bucket with the scores' k-steps stopping
// at 192 and the second warpgroup computing only the columns past 128; d_v <= 64 beside d <= 128 runs 64 columns of
// dV and dPᵀ. Measured on an H100 (bench/results/head-dims.md, 2026-12-06): backward hd 80 / 96 +8-12% over the
// buckets' whole products, hd 192 +23-29%, 128 / 64 +11%.
// The 192 bucket (d 129..192 beside d_v <= 128, DeepSeek's MLA; the plain kernels only): the 128 bucket's CTA of
// 128 keys, each consumer warpgroup its own 64 keys, with tiles as wide as the products (Q, K 192 columns; V, dO
// 128), where the 256 bucket's column split owns 64 keys per CTA and reads and reduces a query block's Q, dO and dQ
// once per 64 keys. dK (96 registers) and dV (64) of 64 keys leave 80 of 240 for the rest: with Sᵀ and dPᵀ of the
// whole block (64) or a 128-column dQ (64) beside them ptxas serialised every wgmma. So Sᵀ and dPᵀ are computed for
// 32 queries at a time (kScorePasses), each pass's dV and dK taking its Pᵀ and dSᵀ from registers before the next
// pass's scores, and dQ's columns, split 128 / 64 (a warpgroup's first column starts a 64-column panel of K, the
// N-major operand), are computed a panel at a time (kDqPanelProducts). Shared memory: K 48 KB, V 32 KB; Q 2 x 24 KB,
// dO 2 x 16 KB; dSᵀ 2 x 16 KB; LSE, D 1 KB; dQ stages 2 x 16 KB. On the H200 (2026-12-07) MLA 192 / 128 causal at
// 8k: 319 -> 431 TFLOP/s (0.73 -> 0.98x cuDNN); the same plan with Pᵀ and dSᵀ through shared tiles ran 354.
#pragma once

#include "cuda/sm90/forward_config.h"

namespace flashattn::cuda::sm90 {

// kProductCols_, kProductColsV_: the columns of d and of d_v that the products compute, at most the bucket's
// kHeadDim; the tiles keep the bucket's layout and TMA's zeros past the true head dims (support_checks.h), so the
// products skip only zeros. They bound the scores' k-steps (Sᵀ over d, dPᵀ over d_v) and the gradients' columns:
// without kColumnSplit every warpgroup's dK (kOutCols) and dV (kOutColsV) and dQ's split; under it the last
// warpgroup's dK, dQ (d) and dV (d_v) columns, none at all for dV where d_v <= 128 (MLA). A last warpgroup with
// fewer columns than the others runs a consumer copy of its own (kNarrowLast). The plain kernels only
// (launch_head_dim).
template <int kHeadDim_, bool kExtras_ = false, bool kDropout_ = false, bool kDescaled_ = false,
          int kProductCols_ = kHeadDim_, int kProductColsV_ = kProductCols_>
struct BackwardConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kProductCols = kProductCols_;
  static constexpr int kProductColsV = kProductColsV_;
  static constexpr bool kExtras = kExtras_;
  static constexpr bool kDropout = kDropout_;
  static constexpr bool kDescaled = kDescaled_;
  static_assert(kExtras || !kDropout, "sm90 backward: dropout comes with the extras (ALiBi) code");
  static_assert(!(kDescaled && kExtras), "sm90 backward: float8 inputs' descales without ALiBi or dropout");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                "sm90 backward: head dim 64, 128, 192 or 256");
  static_assert(kHeadDim != 192 || (!kExtras && !kDescaled && kProductCols == 192 && kProductColsV % kPanelCols == 0),
                "sm90 backward: the 192 bucket is a plain kernel with 192 product columns and whole panels of V");
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kLastWarpgroup = kConsumerWarpgroups - 1;
  // The warpgroups share the CTA's keys and split the gradients' columns (hd 256), or own 64 keys each.
  static constexpr bool kColumnSplit = kHeadDim == 256;
  // The columns of the V and dO tiles: the 192 bucket's are its dPᵀ product columns (shared memory), the others'
  // the bucket's.
  static constexpr int kHeadDimV = kHeadDim == 192 ? kProductColsV : kHeadDim;
  static constexpr int kBlockN = kColumnSplit ? kWgmmaRows : kConsumerWarpgroups * kWgmmaRows;  // keys per CTA
  // dK's (and under kColumnSplit dV's) columns per warpgroup; dV's without the column split.
  static constexpr int kOutCols = kColumnSplit ? kHeadDim / kConsumerWarpgroups : kProductCols;
  static constexpr int kOutColsV = kColumnSplit ? kOutCols : kProductColsV;
  static_assert(kProductCols % kWgmmaK == 0 && kProductColsV % kWgmmaK == 0 && kProductCols <= kHeadDim &&
                    kProductColsV <= kHeadDim,
                "sm90 backward: product columns in whole k-steps within the bucket");
  // Queries per streamed block: 128 at hd 64, where a 64-row block's Sᵀ and dPᵀ (wgmma N = 64, 4 k-steps)
  // leave the tensor pipe idle between barriers; 64 elsewhere (registers).
  static constexpr int kBlockM = kHeadDim == 64 ? kConsumerWarpgroups * kWgmmaRows : kWgmmaRows;
  // The order of one query block's steps. false: dV is issued as soon as Pᵀ is in registers and dSᵀ is computed
  // while it runs. true (FlashAttention-3's order): Pᵀ and dSᵀ are both finished before dV and dK are issued, so
  // the fp32 scores are dead when dV's operands go in; 128-row blocks fit in registers only this way (Sᵀ, dPᵀ
  // 64 each, dK, dV 32 each at hd 64: 192 at the peak instead of 256).
  static constexpr bool kScoresBeforeDv = kBlockM > kWgmmaRows;
  // The queries of a block whose Sᵀ and dPᵀ one warpgroup computes (the wgmma N of those products).
  // The 192 bucket computes them in kScorePasses passes of half the block each (registers: dK and dV take 160).
  static constexpr int kScorePasses = kHeadDim == 192 ? 2 : 1;
  static constexpr int kScoreQueries = kColumnSplit ? kBlockM / kConsumerWarpgroups : kBlockM / kScorePasses;
  // Descriptor steps as one 64-bit add (desc_advance_whole) rather than desc_advance's 32-bit one: hd 256's loop
  // 670 -> 584 instructions per block, hd 64's about 17 fewer, hd 128's 705 -> 666, without new spills; but hd
  // 128's dQ product stepped so kept more descriptor pairs live and the plain kernel spilled 60 / 132 bytes (was 4 /
  // 4), so there the dQ product keeps the 32-bit step (offline SASS, bf16).
  static constexpr bool kWholeDqDescriptorSteps = kHeadDim != 128;
  static constexpr int kStages = 2;
  // dO's ring: Q's stages (one ring, one set of barriers), or at hd 256 one stage with barriers of its own.
  static constexpr int kDoStages = kColumnSplit ? 1 : kStages;
  static constexpr bool kSeparateDoRing = kDoStages != kStages;
  static constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  // setmaxnreg redistributes what the launch gave the CTA: kThreads x the per-thread count of
  // __launch_bounds__(kThreads, 1), 65536 / kThreads rounded down to a multiple of 8.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters) <=
                    kLaunchRegisters * kThreads,
                "sm90 backward: register budgets over what the launch allocates");

  // dQ's split (above): each consumer warpgroup's kDqTileCols columns in one accumulator (at hd 256, 64 x 128:
  // beside P's and dS's fragments it made ptxas serialise every wgmma, and two 64 x 64 pieces were computed one
  // after the other; with the scores through shared memory it fits, at the same speed).
  // With 128-row blocks (kDqSplitRows) the split is by query rows instead: each warpgroup kWgmmaRows rows, every
  // column (N = 64 at hd 64 rather than two products of N = 32), reading only its own half of dSᵀ.
  static constexpr bool kDqSplitRows = kBlockM == kConsumerWarpgroups * kWgmmaRows;
  // Split by columns, a warpgroup's first dQ column starts a 64-column panel of K (the N-major operand): half the
  // head dim rounded up to a whole panel (the 192 bucket: 128 and 64).
  static constexpr int kDqTileCols =
      kDqSplitRows ? kHeadDim : (kHeadDim / kConsumerWarpgroups + kPanelCols - 1) / kPanelCols * kPanelCols;
  // A warpgroup's piece reaches the writer in kDqStagePieces hand-offs of kDqStageCols columns (one stage each
  // warpgroup, kWgmmaRows x kDqStageCols floats).
  static constexpr int kDqStagePieces = kColumnSplit ? (kDropout ? 4 : 2) : kHeadDim == 192 ? 2 : 1;
  static constexpr int kDqStageCols = kDqTileCols / kDqStagePieces;
  // Hand-offs of kDqStageCols columns for every warpgroup, a narrower last one taking fewer of them (the column
  // split, the 192 bucket), or kDqStagePieces hand-offs of each warpgroup's share.
  static constexpr bool kDqPiecesOfOneWidth = kColumnSplit || kHeadDim == 192;
  // A warpgroup's dQ columns as products of one 64-column panel each, one after another, each handed over before
  // the next is issued (the 192 bucket), or as one product.
  static constexpr bool kDqPanelProducts = kHeadDim == 192;
  // dq_accum's row: the product columns (the bucket's with 128-row blocks), of which the last consumer warpgroup
  // takes what the others leave (hd 96's kernel: 64 and 32; hd 192's: 128 and 64). A narrower last warpgroup
  // computes and hands over only its columns: fewer products, and less dq_accum to zero, add into and convert.
  static constexpr int kDqRowCols = kDqSplitRows ? kHeadDim : kProductCols;
  static constexpr int kDqTileColsLast = kDqSplitRows ? kDqTileCols : kDqRowCols - kLastWarpgroup * kDqTileCols;
  // Warpgroup wg's dQ columns, its columns per hand-off (narrower pieces, or under kColumnSplit fewer of them, for a
  // narrower last warpgroup), its hand-offs per block, and where its piece `piece` starts in a dq_accum tile
  // (floats): the warpgroups' pieces one after another, every warpgroup but the last a full kDqTileCols wide.
  static constexpr int dq_tile_cols(int wg) { return wg == kLastWarpgroup ? kDqTileColsLast : kDqTileCols; }
  static constexpr int dq_stage_cols(int wg) {
    return kDqPiecesOfOneWidth ? kDqStageCols : dq_tile_cols(wg) / kDqStagePieces;
  }
  static constexpr int dq_pieces(int wg) { return dq_tile_cols(wg) / dq_stage_cols(wg); }
  static constexpr int dq_piece_offset(int wg, int piece) {
    return wg * kWgmmaRows * kDqTileCols + piece * kWgmmaRows * dq_stage_cols(wg);
  }
  // Whether (wg, piece) is a block's last hand-off in the writer's order (pieces, then warpgroups).
  static constexpr bool dq_last_handoff(int wg, int piece) {
    for (int p = piece; p < kDqStagePieces; ++p)
      for (int g = p == piece ? wg + 1 : 0; g < kConsumerWarpgroups; ++g)
        if (p < dq_pieces(g)) return false;
    return piece < dq_pieces(wg);
  }
  static_assert(kDqTileColsLast > 0 && kDqTileColsLast <= kDqTileCols &&
                    dq_stage_cols(kLastWarpgroup) % 16 == 0 &&
                    dq_pieces(kLastWarpgroup) * dq_stage_cols(kLastWarpgroup) == kDqTileColsLast,
                "sm90 backward: the last warpgroup's dQ in whole pieces, each in pairs of float4s");
  // Warpgroup wg's dK and dV columns: under kColumnSplit the last one's are the product columns past the others'
  // (dV's may be none); and whether the last warpgroup, with fewer, needs a consumer copy of its own.
  static constexpr int dk_cols(int wg) {
    return kColumnSplit && wg == kLastWarpgroup ? kProductCols - wg * kOutCols : kOutCols;
  }
  static constexpr int dv_cols(int wg) {
    return kColumnSplit && wg == kLastWarpgroup ? kProductColsV - wg * kOutCols : kOutColsV;
  }
  static_assert(dk_cols(kLastWarpgroup) > 0 && dk_cols(kLastWarpgroup) <= kOutCols && dv_cols(kLastWarpgroup) >= 0 &&
                    dv_cols(kLastWarpgroup) <= kOutColsV,
                "sm90 backward: the last warpgroup's dK columns past the others', and dV's at most as many");
  static constexpr bool kNarrowLast = dq_tile_cols(kLastWarpgroup) != dq_tile_cols(0) ||
                                      dk_cols(kLastWarpgroup) != dk_cols(0) || dv_cols(kLastWarpgroup) != dv_cols(0);
  static constexpr int kDqStageBytes = kWgmmaRows * kDqStageCols * 4;
  // Rows of the workspace arrays at which every sequence starts: a whole query block for the fragment-ordered
  // tiles of dq_accum (a multiple of 4, as TMA's 16-byte aligned boxes of LSE and D need).
  static constexpr int kWsAlign = kBlockM;
  static_assert((kWsAlign & (kWsAlign - 1)) == 0, "sm80::ws_sequence_start rounds with a mask");

  static constexpr int kElemBytes = 2;
  static constexpr int kKBytes = kBlockN * kHeadDim * kElemBytes;
  static constexpr int kVBytes = kBlockN * kHeadDimV * kElemBytes;
  static constexpr int kQBytes = kBlockM * kHeadDim * kElemBytes;    // one stage of Q
  static constexpr int kDoBytes = kBlockM * kHeadDimV * kElemBytes;  // one stage of dO
  static constexpr int kDsBytes = kBlockN * kBlockM * kElemBytes;    // one dSᵀ tile
  // Shared score tiles per buffer: dSᵀ, and under kColumnSplit Pᵀ beside it; two buffers.
  static constexpr int kDsTiles = kColumnSplit ? 2 : 1;
  static constexpr int kRowValueBytes = kBlockM * 4;                 // one stage of LSE or D (fp32)
  // One buffer of dropout's keep bits (kDropout): kKeepWords 32-bit words per consumer thread, a bit for each of
  // its Sᵀ elements (draw_keep_bits).
  static constexpr int kKeySpans = kBlockN / 32;
  static constexpr int kKeepWords = (kScoreQueries / 2 + 31) / 32;
  static constexpr int kMaskBytes = kDropout ? kConsumerWarpgroups * kWarpgroupThreads * kKeepWords * 4 : 0;
  // What one stage's TMA delivers (Q, LSE, D, and dO unless it has a ring of its own).
  static constexpr int kStageTxBytes = kQBytes + (kSeparateDoRing ? 0 : kDoBytes) + 2 * kRowValueBytes;
  static_assert(kQBytes % 1024 == 0 && kDoBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0 &&
                    kDsBytes % 1024 == 0,
                "sm90 backward: every tile starts on a 1024-byte swizzle atom");
  // kv_full, full[], empty[] (and do_full[], do_empty[]).
  static constexpr int kBarrierBytes = 8 * (1 + 2 * kStages + (kSeparateDoRing ? 2 * kDoStages : 0));
  static constexpr int kAlignSlack = 1024;
  static constexpr int kSmemBytes = kKBytes + kVBytes + kStages * kQBytes + kDoStages * kDoBytes +
                                    2 * kDsTiles * kDsBytes + 2 * kStages * kRowValueBytes +
                                    kStages * kMaskBytes +
                                    kConsumerWarpgroups * kDqStageBytes +
                                    kBarrierBytes + kAlignSlack;
  static_assert(kSmemBytes <= 227 * 1024, "sm90 backward: over the 227 KB shared-memory limit");
};

}  // namespace flashattn::cuda::sm90
