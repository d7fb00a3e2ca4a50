// Hopper backward: dQ, dK, dV of O = softmax(Q Kᵀ · scale) V from the forward's LSE, fp16/bf16 in, fp32
// accumulation, for head dims d and d_v that are multiples of 8 up to 256, in buckets of 64, 128 and 256, and
// (plain kernels) 192 for d <= 192 beside d_v <= 128 (support_checks.h: columns past d / d_v are TMA's zeros and
// never written; the plain kernels skip the products of those columns past 96 and 192: backward_config.h,
// kProductCols), with causal / sliding-window masks,
// softcap, ALiBi, dropout, GQA, varlen and arbitrary tails. P is recomputed from the LSE tile by tile and never reaches
// global memory.
//
// Launch sequence on the call's stream (the row-wise preprocess is the sm80 backward's, backward_rows.cu):
//   memset of the workspace (but dq_accum in the deterministic mode); bwd_preprocess_kernel (D = rowsum(dO∘O),
//   LSE·log2e); backward_kernel (below); dq_convert_fragments_kernel (dQ = dq_accum · scale as the dtype, from
//   fragment-ordered tiles). In the workspace every sequence starts at a multiple of BackwardConfig::kWsAlign rows
//   (sm80::ws_sequence_start): a query block, where dq_accum's tiles start (and a multiple of 4, as TMA boxes of LSE
//   and D need).
//
// backward_kernel: one CTA per (block of kBlockN = 128 keys (64 at hd 256), KV head, batch entry); key blocks with
// the most visible queries (the first, under a causal mask) are launched first, in the last wave's heads key
// block by key block (key_block_work, grid_order.h), except in the deterministic mode under a mask with a right
// edge, or without a mask over few key blocks (dq_turn). It loops over the query heads of its KV group and, for
// each, over the query blocks of kBlockM rows (64; 128 at hd 64) that see any of its keys
// (MaskSpec::query_range_for_keys; from a block of its own under rotate_sweeps), so dK and dV of a KV head sum over
// its query heads in registers, without atomics.
// Warp roles (384 threads):
//   warpgroup 0  producer: gives registers away (setmaxnreg); one thread loads K and V once, then streams each
//                query block's Q, dO (128-byte swizzled panels) and LSE·log2e, D (fp32 rows) through a
//                kStages-deep ring with TMA (full/empty mbarriers; at hd 256 dO in a one-stage ring of its
//                own). Its warp 1 adds each consumer warpgroup's dQ stage to dq_accum with one bulk reduce-add
//                per hand-off (named barriers dq full / dq empty per warpgroup); under deterministic in a fixed
//                order (dq_turn; a turn counter per tile in the workspace), the first turn storing.
//   warpgroups 1, 2  consumers, 64 keys each (setmaxnreg; at hd 256 the same 64 keys, half of dK/dV/dQ's columns
//                and half of the block's queries in Sᵀ, dPᵀ each: backward_config.h, kColumnSplit). Per query
//                block, in the transposed orientation so that the 64 keys are the wgmma's M and P, dS land in
//                the A-operand register layout:
//                  Sᵀ = K Qᵀ, dPᵀ = V dOᵀ          (wgmma SS, both issued before either is waited for)
//                  Pᵀ = exp2(Sᵀ·scale·log2e + B − LSE·log2e), 0 where masked (under dPᵀ's wgmma; B:
//                                                    ALiBi's bias in log2 units, softcap and ALiBi template flags)
//                  dV += Pᵀ dO                      (wgmma RS: Pᵀ from registers, dO N-major from the ring)
//                  dSᵀ = Pᵀ∘(dPᵀ − D) [∘(1 − tanh²) with softcap] -> registers and shared memory (swizzled)
//                                                   (while dV runs; at hd 64, kScoresBeforeDv, before dV is issued)
//                  named barrier: both warpgroups' dSᵀ are in shared memory (stmatrix)
//                  dQ piece = dS K                  (wgmma SS, dS read M-major from dSᵀ; each warpgroup half of
//                                                    the columns, or at hd 64 (128-row blocks) half of the rows)
//                  dK += dSᵀ Q                      (wgmma RS; issued after dQ, so dQ goes to the warpgroup's dQ
//                                                    stage in shared memory while dK runs; at hd 256 in two
//                                                    hand-offs of 64 columns)
//                At hd 256 Pᵀ and dSᵀ of the warpgroup's 32 queries go to shared tiles instead, and dV, dK and
//                dQ (each warpgroup half of the columns) read the whole tiles after the barrier. The 192 bucket
//                (MLA) computes Sᵀ and dPᵀ for 32 queries at a time (two passes), each pass's dV and dK from
//                its Pᵀ and dSᵀ in registers, and its dQ columns a 64-column product at a time
//                (backward_config.h).
//                dSᵀ is double-buffered, so one barrier per query block orders its writes and reads. The block's
//                Q/dO stage goes back to the producer once dK has landed (at hd 256 dO's as soon as dV has).
//                Epilogue: dK · scale and dV written as the dtype from registers.
//                Dropout (the kDropout kernel): the consumers draw the next block's keep bits under Sᵀ and dPᵀ into a
//                shared double buffer in their own layout (draw_keep_bits), dV's operand is Pᵀ∘keep (dV scaled by
//                1 / (1 - p) in the epilogue) and dSᵀ = Pᵀ∘(Z∘dPᵀ − D).
// Shared memory and register budgets: backward_config.h (193-226 KB; 240 registers per consumer thread).
// float8_e4m3fn inputs reach this kernel as 16-bit copies (backward_sm90_fp8.cu); the kDescaled kernels scale the
// scores by their (batch, KV head)'s q_descale · k_descale and dK by q_descale (ScoreDescales).
// Preconditions (sm90_backward_supports): compute capability 9.0, fp16/bf16, d and d_v multiples of 8 up to 256,
// Q, K, V, dO strides multiples of 8 elements with 16-byte aligned bases (TMA), dK/dV with even strides and
// 4-byte aligned bases.
// Rows past a sequence's end are loaded (zeros past the tensor, the next sequence's rows in varlen) but masked
// (P = 0) and never written.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend.h"
#include "common/alibi.h"
#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/check.h"
#include "cuda/device_attribute.h"
#include "cuda/grid_order.h"
#include "cuda/primitives.cuh"
#include "cuda/sm80/backward_launch.cuh"
#include "cuda/sm90/backward_config.h"
#include "cuda/sm90/backward_sm90_fp8.h"
#include "cuda/sm90/backward_sm90.h"
#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/support_checks.h"
#include "cuda/sm90/swizzle.h"
#include "cuda/sm90/tensor_map.h"
#include "cuda/workspace.h"

namespace flashattn::cuda::sm90 {
namespace {

// Named barrier on which both consumer warpgroups meet once their dSᵀ (and under kColumnSplit Pᵀ) of a query block
// is in shared memory.
constexpr int kDsReadyBarrier = 1;
// Consumer warpgroup wg and the dQ writer warp meet on kDqFullBarrier + wg once wg's dQ stage holds a piece of a
// block's dQ, and on kDqEmptyBarrier + wg once the writer's bulk reduce has read it.
constexpr int kDqFullBarrier = 3;
constexpr int kDqEmptyBarrier = 5;
constexpr int kDqWriterWarp = 1;  // of the producer warpgroup (warp 0's first thread issues the loads)
constexpr int kDqHandoffThreads = kWarpgroupThreads + 32;

// Both consumer warpgroups meet on kDsReadyBarrier. Where each runs a consumer copy of its own (kNarrowLast), they
// reach it from different instructions, which bar.sync does not allow (compute-sanitizer's synccheck).
template <typename Cfg>
__device__ __forceinline__ void consumers_meet() {
  constexpr int kThreads = Cfg::kConsumerWarpgroups * kWarpgroupThreads;
  if constexpr (Cfg::kNarrowLast)
    named_barrier_sync_unaligned(kDsReadyBarrier, kThreads);
  else
    named_barrier_sync(kDsReadyBarrier, kThreads);
}

// What the kernel reads besides the tensor maps; lengths and strides in elements.
struct BackwardKernelArgs {
  void* dk;
  void* dv;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  // dK's and dV's columns (at most the config's head dim, multiples of 8): past them the gradients are those of
  // the tensor maps' zero-filled columns, and not written.
  int head_dim, head_dim_v;
  float* dq_accum;         // [heads_q][ws_head_stride][BackwardConfig::kDqRowCols]
  int64_t ws_head_stride;  // rows per head of the workspace arrays (a multiple of BackwardConfig::kWsAlign)
  // Deterministic mode: a turn counter per dq_accum tile (one per query head and workspace query block), zeroed; the
  // key blocks write a tile one after another, each when the counter says it is its turn (dq_turn), the first
  // storing (dq_accum is then not zeroed). Null otherwise: additions in any order into a zeroed dq_accum.
  int* dq_turns;           // [heads_q][ws_head_stride / kBlockM], or null
  // Deterministic mode under a mask with a right edge (causal, window_right >= 0): key blocks launch from the last
  // to the first and add into a tile in that order (dq_turn).
  bool last_key_block_first;
  // Deterministic mode without a mask, each KV head's key blocks at most half the GPU's CTA slots: each key block
  // starts its sweep at its own query block (KeyBlockWork::m_begin) and the grid starts x fastest (dq_turn).
  bool rotate_sweeps;
  uint32_t tail_pairs;  // the last (KV head, batch entry) pairs whose CTAs start key block by key block
  int ws_seq_align;        // sequences start at multiples of this in the workspace (sm80::ws_sequence_start)
  const int32_t* cu_seqlens_q;  // null: padded batch
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // padded batch only
  int heads_per_kv;        // GQA group size
  float scale;             // softmax_scale: dK's factor (dQ's is applied by the conversion)
  float scale_log2;        // softmax_scale · log2(e)
  float softcap;           // 0 = off
  float tanh_scale;        // softmax_scale / softcap
  float softcap_log2;      // softcap · log2(e)
  bool causal;
  int window_left, window_right;
  // ALiBi runs only in the kernels with Cfg::kExtras, dropout only in the one with Cfg::kDropout.
  const float* alibi_slopes;  // null: no ALiBi (common/alibi.h)
  int64_t alibi_batch_stride;
  float dropout_p;
  DropoutRng dropout_rng;
  float keep_scale;           // 1 / (1 - dropout_p): dV's and dS's factor for kept probabilities
};

// float8_e4m3fn inputs (backward_sm90_fp8.cu; the kernels with Cfg::kDescaled): Q and K arrive as their exact e4m3
// values, and these fp32 [batch, KV head] descales scale the scores (softmax_scale · q_descale · k_descale, as the
// FP8 forward that made the LSE did) and dK by q_descale (dQ's k_descale is the conversion's); null: 1. The kernel's
// last parameter, so that the other kernels' parameter offsets (and code) stay as they were.
struct ScoreDescales {
  const float* q;
  const float* k;
  int64_t q_strides[2], k_strides[2];
};

// The descale of (sequence, KV head) from an fp32 [batch, heads_kv] view; 1 without one.
__device__ __forceinline__ float descale_of(const float* descale, const int64_t* strides, int batch, int kv_head) {
  return descale != nullptr ? descale[batch * strides[0] + kv_head * strides[1]] : 1.f;
}

// One base pointer; every region a constant offset from it (backward_config.h has the sizes).
template <typename Cfg>
struct BackwardSmem {
  uint8_t* base;

  // Stepped from `raw` by pointer arithmetic (not rebuilt from an integer), so that the compiler still knows it
  // points into shared memory: the LSE / D loads and the dSᵀ and dQ stores are then LDS / STS, not generic.
  // Not with 128-row blocks (hd 64): there the shared-memory addressing makes ptxas serialise the wgmmas (C7512).
  __device__ explicit BackwardSmem(uint8_t* raw) {
    if constexpr (Cfg::kScoresBeforeDv) {
      base = align_to_swizzle_atom(raw);
    } else {
      base = raw + (kSwizzleAtomBytes - smem_address(raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
    }
  }
  static constexpr int kVOffset = Cfg::kKBytes;
  static constexpr int kQOffset = Cfg::kKBytes + Cfg::kVBytes;
  static constexpr int kDoOffset = kQOffset + Cfg::kStages * Cfg::kQBytes;
  static constexpr int kDsOffset = kDoOffset + Cfg::kDoStages * Cfg::kDoBytes;
  static constexpr int kLseOffset = kDsOffset + 2 * Cfg::kDsTiles * Cfg::kDsBytes;
  static constexpr int kDsumOffset = kLseOffset + Cfg::kStages * Cfg::kRowValueBytes;
  static constexpr int kMaskOffset = kDsumOffset + Cfg::kStages * Cfg::kRowValueBytes;
  static constexpr int kDqOffset = kMaskOffset + Cfg::kStages * Cfg::kMaskBytes;
  static constexpr int kBarrierOffset = kDqOffset + Cfg::kConsumerWarpgroups * Cfg::kDqStageBytes;

  __device__ uint8_t* k() const { return base; }
  __device__ uint8_t* v() const { return base + kVOffset; }
  __device__ uint8_t* q(int stage) const { return base + kQOffset + stage * Cfg::kQBytes; }
  __device__ uint8_t* dout(int stage) const { return base + kDoOffset + stage * Cfg::kDoBytes; }
  // The dSᵀ and (kColumnSplit) Pᵀ tiles of double-buffer slot `buffer`, both warpgroups' rows or queries.
  __device__ uint8_t* ds(int buffer) const { return base + kDsOffset + buffer * Cfg::kDsTiles * Cfg::kDsBytes; }
  __device__ uint8_t* pt(int buffer) const {
    static_assert(Cfg::kColumnSplit, "Pᵀ goes through shared memory only under kColumnSplit");
    return ds(buffer) + Cfg::kDsBytes;
  }
  __device__ float* lse_log2(int stage) const {
    return reinterpret_cast<float*>(base + kLseOffset + stage * Cfg::kRowValueBytes);
  }
  __device__ float* dsum(int stage) const {
    return reinterpret_cast<float*>(base + kDsumOffset + stage * Cfg::kRowValueBytes);
  }
  // Dropout's keep bits, buffer `buffer` (Cfg::kDropout; backward_config.h).
  __device__ uint32_t* keep_mask(int buffer) const {
    return reinterpret_cast<uint32_t*>(base + kMaskOffset + buffer * Cfg::kMaskBytes);
  }
  // Consumer warpgroup wg's dQ stage: 64 x kDqStageCols floats of its piece in fragment order.
  __device__ float* dq_stage(int wg) const {
    return reinterpret_cast<float*>(base + kDqOffset + wg * Cfg::kDqStageBytes);
  }
  __device__ uint64_t* kv_full() const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset); }
  __device__ uint64_t* full() const { return kv_full() + 1; }
  __device__ uint64_t* empty() const { return full() + Cfg::kStages; }
  // dO's own ring (kSeparateDoRing).
  __device__ uint64_t* do_full() const { return empty() + Cfg::kStages; }
  __device__ uint64_t* do_empty() const { return do_full() + Cfg::kDoStages; }
};

// The (batch, KV head, key block) of a CTA and the query blocks that see any of its keys.
struct KeyBlockWork {
  int batch, kv_head, key0;  // key0: first key of the block, relative to the sequence
  int q_row0, k_row0;        // first row of this sequence in the Q / K tensors' row dimension
  int ws_row0;               // first row of this sequence in the workspace arrays
  int batch_coord;           // TMA batch coordinate (0 in varlen)
  int seqlen_q, seqlen_k;
  // The sweep: query blocks [m_begin, m_end) in order; under rotate_sweeps, key block n of N starts at block
  // n · M / N of the sequence's M and the range runs past its last block, wrapping around (sweep_block).
  int m_begin, m_end;
  WindowMaskSpec mask;
};

template <typename Cfg>
__device__ KeyBlockWork key_block_work(const BackwardKernelArgs& a) {
  KeyBlockWork w;
  // The last (KV head, batch entry) pairs, about a wave of CTAs, start key block by key block (grid_order.h).
  const GridPlace place = tail_x_slowest_block(a.tail_pairs);
  const bool reversed = a.last_key_block_first;
  w.key0 = int(reversed ? gridDim.x - 1 - place.x : place.x) * Cfg::kBlockN;
  w.kv_head = int(place.y);
  w.batch = int(place.z);
  if (a.cu_seqlens_q) {
    w.q_row0 = a.cu_seqlens_q[w.batch];
    w.k_row0 = a.cu_seqlens_k[w.batch];
    w.seqlen_q = a.cu_seqlens_q[w.batch + 1] - w.q_row0;
    w.seqlen_k = a.cu_seqlens_k[w.batch + 1] - w.k_row0;
    w.ws_row0 = int(sm80::ws_sequence_start(w.q_row0, w.batch, a.ws_seq_align));
    w.batch_coord = 0;
  } else {
    w.q_row0 = w.k_row0 = 0;
    w.seqlen_q = a.seqlen_q;
    w.seqlen_k = a.seqlen_k;
    w.ws_row0 = int(sm80::ws_sequence_start(int64_t(w.batch) * a.seqlen_q, w.batch, a.ws_seq_align));
    w.batch_coord = w.batch;
  }
  w.mask = WindowMaskSpec::make(w.seqlen_q, w.seqlen_k, a.causal, a.window_left, a.window_right);
  w.m_begin = w.m_end = 0;
  if (w.key0 < w.seqlen_k && w.seqlen_q > 0) {
    int64_t lo, hi;
    w.mask.query_range_for_keys(w.key0, min(w.key0 + Cfg::kBlockN, w.seqlen_k), &lo, &hi);
    if (hi > lo) {
      w.m_begin = int(lo / Cfg::kBlockM);
      w.m_end = int((hi + Cfg::kBlockM - 1) / Cfg::kBlockM);
    }
  }
  if (a.rotate_sweeps) {  // no mask: [m_begin, m_end) = [0, M)
    const int64_t key_blocks = (w.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
    const int shift = int(int64_t(w.key0 / Cfg::kBlockN) * w.m_end / key_blocks);
    w.m_begin += shift, w.m_end += shift;
  }
  return w;
}

// The query block at sweep position m (KeyBlockWork::m_begin): m itself, or past the sequence's last block under
// rotate_sweeps, from its first again. No state beyond the range: the producer and writer warps run on 24
// registers (kProducerRegisters), and a third bound made them spill.
template <typename Cfg>
__device__ __forceinline__ int sweep_block(const KeyBlockWork& w, int m) {
  return m * Cfg::kBlockM < w.seqlen_q ? m : m - (w.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
}

// The query blocks a CTA visits, in the order every role walks them: each query head of the KV group, then its
// sweep [m_begin, m_end).
template <typename Cfg>
struct QueryBlockOrder {
  int blocks_per_head, blocks;
  __device__ QueryBlockOrder(const KeyBlockWork& w, int heads_per_kv)
      : blocks_per_head(w.m_end - w.m_begin), blocks(heads_per_kv * (w.m_end - w.m_begin)) {}
  __device__ int head(const KeyBlockWork& w, int heads_per_kv, int i) const {
    return w.kv_head * heads_per_kv + i / blocks_per_head;
  }
  __device__ int block(const KeyBlockWork& w, int i) const {
    return sweep_block<Cfg>(w, w.m_begin + i % blocks_per_head);
  }
};

// ---- producer: one thread loads K and V, then streams Q, dO, LSE, D per (query head, query block) ----
template <typename Cfg>
__device__ void produce(const BackwardSmem<Cfg>& sm, const KeyBlockWork& w, int heads_per_kv, const CUtensorMap* tm_q,
                        const CUtensorMap* tm_k, const CUtensorMap* tm_v, const CUtensorMap* tm_do,
                        const CUtensorMap* tm_lse, const CUtensorMap* tm_dsum) {
  constexpr int kPanels = Cfg::kHeadDim / kPanelCols;    // of Q and K
  constexpr int kPanelsV = Cfg::kHeadDimV / kPanelCols;  // of V and dO: as many, or fewer (the 192 bucket)
  mbarrier_arrive_expect_tx(sm.kv_full(), Cfg::kKBytes + Cfg::kVBytes);
#pragma unroll
  for (int p = 0; p < kPanels; ++p) {
    tma_load_4d(sm.k() + p * Cfg::kBlockN * kSwizzleBytes, tm_k, p * kPanelCols, w.k_row0 + w.key0, w.kv_head,
                w.batch_coord, sm.kv_full());
    if (p < kPanelsV)
      tma_load_4d(sm.v() + p * Cfg::kBlockN * kSwizzleBytes, tm_v, p * kPanelCols, w.k_row0 + w.key0, w.kv_head,
                  w.batch_coord, sm.kv_full());
  }
  RingPosition<Cfg::kStages> pos;
  RingPosition<Cfg::kDoStages> do_pos;
  for (int g = 0; g < heads_per_kv; ++g) {
    const int head = w.kv_head * heads_per_kv + g;
    for (int step = w.m_begin; step < w.m_end; ++step) {
      const int m = sweep_block<Cfg>(w, step);
      mbarrier_wait(&sm.empty()[pos.index], pos.phase ^ 1u);
      uint64_t* full = &sm.full()[pos.index];
      mbarrier_arrive_expect_tx(full, Cfg::kStageTxBytes);
      const int row = w.q_row0 + m * Cfg::kBlockM;
#pragma unroll
      for (int p = 0; p < kPanels; ++p) {
        tma_load_4d(sm.q(pos.index) + p * Cfg::kBlockM * kSwizzleBytes, tm_q, p * kPanelCols, row, head,
                    w.batch_coord, full);
        if (!Cfg::kSeparateDoRing && p < kPanelsV)
          tma_load_4d(sm.dout(pos.index) + p * Cfg::kBlockM * kSwizzleBytes, tm_do, p * kPanelCols, row, head,
                      w.batch_coord, full);
      }
      tma_load_2d(sm.lse_log2(pos.index), tm_lse, w.ws_row0 + m * Cfg::kBlockM, head, full);
      tma_load_2d(sm.dsum(pos.index), tm_dsum, w.ws_row0 + m * Cfg::kBlockM, head, full);
      pos.advance();
      if constexpr (Cfg::kSeparateDoRing) {
        // After the next Q: the consumers release dO once dV has landed, later than the Q stage before it.
        mbarrier_wait(&sm.do_empty()[do_pos.index], do_pos.phase ^ 1u);
        uint64_t* do_full = &sm.do_full()[do_pos.index];
        mbarrier_arrive_expect_tx(do_full, Cfg::kDoBytes);
#pragma unroll
        for (int p = 0; p < kPanelsV; ++p)
          tma_load_4d(sm.dout(do_pos.index) + p * Cfg::kBlockM * kSwizzleBytes, tm_do, p * kPanelCols, row, head,
                      w.batch_coord, do_full);
        do_pos.advance();
      }
    }
  }
}

// What consume knows of a query block's mask when it calls gradients (consume's two copies of the iteration).
constexpr int kMaskUnknown = 0, kMaskKnownNo = 1, kMaskKnownYes = 2;

// dq_accum's tiles (kBlockM x kDqRowCols floats, kDqStagePieces pieces per consumer warpgroup, each in its register
// fragments' order: BackwardConfig::dq_piece_offset) and their turn counters (BackwardKernelArgs::dq_turns), by
// index: the tile of `head` whose first workspace row is ws_row (a multiple of kBlockM), and the tile itself. The
// writer (write_dq) and the conversion (dq_convert_fragments_kernel) both address them so.
template <typename Cfg>
__device__ __forceinline__ int64_t dq_tile_index(int64_t ws_head_stride, int head, int64_t ws_row) {
  return (int64_t(head) * ws_head_stride + ws_row) / Cfg::kBlockM;
}
template <typename Cfg, typename F>
__device__ __forceinline__ F* dq_accum_tile(F* dq_accum, int64_t index) {
  return dq_accum + index * Cfg::kBlockM * Cfg::kDqRowCols;
}

// ---- dQ writer: one warp of the producer warpgroup adds each consumer warpgroup's dQ stage to dq_accum with one
// bulk reduce-add per hand-off (kDqStagePieces per warpgroup and block) ----
// Deterministic mode: the key blocks that add into query block m's tile are a contiguous run of the KV head's key
// blocks (the mask's edges move monotonically with the row), from the one holding the first key that any row of
// the block sees to the one holding the last. They add in key order, or from the last under a mask with a right
// edge: there each key block starts its sweep at the first query block that sees it, so the later key blocks
// reach a tile first (FlashAttention-3's shortest-first order; key order there serialises them, 0.56-0.64x the
// default at causal 2k-16k, bench/results/hopper-backward.md). This CTA's turn is its distance from the run's
// first block in that order. The grid launches key blocks in the same order (last_key_block_first), and CTAs
// start in that order within a (KV head, batch entry) (key_block_work), so every block ahead in the run has started
// (or finished) when this one waits.
// Without a mask every key block adds into every tile, and in key order the N key blocks of a KV head reached
// each tile in a queue that grew by one hand-off per key block (hd 256 at 2k: 0.68-0.77x the default). Under
// rotate_sweeps key block n starts at query block n · M / N, so at any step the key blocks are at different tiles,
// and each tile takes them in the order they reach it: first the last key block that started at or before it,
// then down from there, wrapping around. Key blocks wait here for later ones, so all N must be able to run at
// once (rotate_sweeps' condition), with the grid started x fastest: a KV head's key blocks start before the
// next's, and those of a KV head that has started are never all stuck behind ones that cannot.
template <typename Cfg>
__device__ int dq_turn(const BackwardKernelArgs& a, const KeyBlockWork& w, int m) {
  const int block = w.key0 / Cfg::kBlockN;
  if (a.rotate_sweeps) {
    // The key blocks that start at or before query block m, n · M / N <= m (M query blocks, N key blocks). 32 bits:
    // N is at most half the SM count.
    const unsigned key_blocks = (w.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
    const unsigned query_blocks = (w.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
    const int started = int(min(key_blocks, ((unsigned(m) + 1) * key_blocks + query_blocks - 1) / query_blocks));
    const int turn = started - 1 - block;
    return turn < 0 ? turn + int(key_blocks) : turn;
  }
  int64_t first_key, end_key;
  w.mask.key_range_for_rows(int64_t(m) * Cfg::kBlockM, min(int64_t(m + 1) * Cfg::kBlockM, int64_t(w.seqlen_q)),
                            &first_key, &end_key);
  return a.last_key_block_first ? int((end_key - 1) / Cfg::kBlockN) - block : block - int(first_key / Cfg::kBlockN);
}

// In the deterministic mode dq_accum is not zeroed (a memset of 134 MB at B·S = 16k, H·D = 2048: 3-4% of a call
// at 2k): turn 0 of each tile stores its pieces and the later turns add theirs; a tile nobody writes holds
// garbage, and the conversion writes zeros for it.
template <typename Cfg>
__device__ void write_dq(const BackwardSmem<Cfg>& sm, const KeyBlockWork& w, const BackwardKernelArgs& a) {
  const bool leader = threadIdx.x % 32 == 0;
  const QueryBlockOrder<Cfg> order(w, a.heads_per_kv);
  for (int i = 0; i < order.blocks; ++i) {
    const int head = order.head(w, a.heads_per_kv, i), m = order.block(w, i);
    // An index in 32 bits (a tile is at least 16 KB of workspace), pointers made from it at each use: the writer
    // warp has 24 registers (kProducerRegisters).
    const int tile = int(dq_tile_index<Cfg>(a.ws_head_stride, head, w.ws_row0)) + m;
    bool first = false;
    // Piece by piece, the warpgroups in turn: a warpgroup's second hand-off waits behind one of the other's, not
    // behind all of them (hd 256: 2 pieces per warpgroup and block).
#pragma unroll
    for (int piece = 0; piece < Cfg::kDqStagePieces; ++piece) {
#pragma unroll
      for (int wg = 0; wg < Cfg::kConsumerWarpgroups; ++wg) {
        if (piece >= Cfg::dq_pieces(wg)) continue;  // a narrower last warpgroup (BackwardConfig::dq_pieces)
        named_barrier_sync(kDqFullBarrier + wg, kDqHandoffThreads);
        const bool last_piece = Cfg::dq_last_handoff(wg, piece);
        if (leader) {
          if (a.dq_turns && wg == 0 && piece == 0) {
            const int turn = dq_turn<Cfg>(a, w, m);
            first = turn == 0;
            take_bulk_turn(a.dq_turns + tile, turn);
          }
          float* dst = dq_accum_tile<Cfg>(a.dq_accum, tile) + Cfg::dq_piece_offset(wg, piece);
          const uint32_t bytes = kWgmmaRows * Cfg::dq_stage_cols(wg) * 4;
          if (first)
            bulk_store_f32(dst, sm.dq_stage(wg), bytes);
          else
            bulk_reduce_add_f32(dst, sm.dq_stage(wg), bytes);
          bulk_commit();
          if (a.dq_turns && last_piece) {
            pass_bulk_turn(a.dq_turns + tile);
          } else {
            bulk_wait_read<0>();
          }
        }
        __syncwarp();
        // The consumers wait for an empty stage before every hand-off but their first.
        if (i + 1 < order.blocks || piece + 1 < Cfg::dq_pieces(wg))
          named_barrier_arrive(kDqEmptyBarrier + wg, kDqHandoffThreads);
      }
    }
  }
  if (leader) bulk_wait<0>();
}

// A kDescaled consumer's factors for its (batch, KV head): the scores' (BackwardKernelArgs' times q_descale ·
// k_descale) and dK's (times q_descale). The consumer's base, empty without kDescaled, so that the other kernels'
// consumers keep their layout (and code).
template <bool kDescaled>
struct ConsumerDescales {};
template <>
struct ConsumerDescales<true> {
  float descaled_log2, descaled_tanh, descaled_dk;
};

// ---- consumer: one warpgroup, 64 keys ----
// kLast: the copy of the last consumer warpgroup where it has fewer gradient columns than the others
// (BackwardConfig::kNarrowLast), its dQ, dK and dV widths compile-time constants: products of different N in one
// copy, behind a branch on the warpgroup, made ptxas serialise every wgmma (C7520).
template <typename T, typename Cfg, bool kLast = false>
struct BackwardConsumer : ConsumerDescales<Cfg::kDescaled> {
  // The warpgroup whose column shares this copy has: the last one's, or those of every other (warpgroup 0's).
  static constexpr int kShareOf = kLast ? Cfg::kLastWarpgroup : 0;
  static constexpr int kDqCols = Cfg::dq_tile_cols(kShareOf);
  // The warpgroup's dQ columns in kDqProducts products of kDqProductCols, one after another (Cfg::kDqPanelProducts).
  static constexpr int kDqProductCols = Cfg::kDqPanelProducts ? kPanelCols : kDqCols;
  static constexpr int kDqProducts = kDqCols / kDqProductCols;
  using DqProduct = float[kDqProductCols / 2];
  static constexpr int kDkCols = Cfg::dk_cols(kShareOf);
  static constexpr int kDvCols = Cfg::dv_cols(kShareOf);
  static constexpr int kDvRegs = kDvCols > 0 ? kDvCols / 2 : 1;  // one unused register without dV columns
  static constexpr int kM = Cfg::kBlockM;
  static constexpr int kN = Cfg::kBlockN;
  static constexpr int kSQ = Cfg::kScoreQueries;
  using Scores = float[kSQ / 2];                 // Sᵀ or dPᵀ: 64 keys x kSQ queries, accumulator layout
  using Fragments = uint32_t[kSQ / kWgmmaK][4];  // Pᵀ or dSᵀ as the A operand, 16 queries per fragment

  // A descriptor `bytes` further on: one 64-bit add (the constant high word is not rebuilt before each wgmma),
  // except in the dQ product where the head dim's kernel compiles better with the 32-bit one
  // (kWholeDqDescriptorSteps).
  template <bool kWhole = true>
  static __device__ __forceinline__ uint64_t step_desc(uint64_t desc, uint32_t bytes) {
    return kWhole ? desc_advance_whole(desc, bytes) : desc_advance(desc, bytes);
  }

  const BackwardSmem<Cfg>& sm;
  const KeyBlockWork& w;
  const BackwardKernelArgs& a;
  int wg, warp, lane, quad;
  int key_local[2];        // this thread's two keys (accumulator rows), inside the CTA's block
  int query_lo[2], query_hi[2];  // the queries that see them, relative to the sequence start
  // The warpgroup's first key inside the CTA's block and first dK/dV column (backward_config.h, kColumnSplit).
  static constexpr int kOutCols = Cfg::kOutCols;
  int key_row0, out_col0;
  __device__ float scale_log2() const {
    if constexpr (Cfg::kDescaled) return this->descaled_log2;
    return a.scale_log2;
  }
  __device__ float tanh_scale() const {
    if constexpr (Cfg::kDescaled) return this->descaled_tanh;
    return a.tanh_scale;
  }
  __device__ float dk_scale() const {
    if constexpr (Cfg::kDescaled) return this->descaled_dk;
    return a.scale;
  }
  float dk[kDkCols / 2], dv[kDvRegs];
  // Dropout's keep bits of the current block (Cfg::kDropout): bit i for Sᵀ's element i.
  static constexpr int kKeepWords = Cfg::kKeepWords;
  uint32_t keep[kKeepWords];

  __device__ BackwardConsumer(const BackwardSmem<Cfg>& sm_, const KeyBlockWork& w_, const BackwardKernelArgs& a_,
                              const ScoreDescales& descales, int wg_)
      : sm(sm_), w(w_), a(a_), wg(wg_) {
    if constexpr (Cfg::kDescaled) {
      const float q_descale = descale_of(descales.q, descales.q_strides, w.batch, w.kv_head);
      const float qk_descale = q_descale * descale_of(descales.k, descales.k_strides, w.batch, w.kv_head);
      this->descaled_log2 = a.scale_log2 * qk_descale;
      this->descaled_tanh = a.tanh_scale * qk_descale;
      this->descaled_dk = a.scale * q_descale;
    }
    const int t = threadIdx.x % kWarpgroupThreads;
    warp = t / 32;
    lane = t % 32;
    quad = lane % 4;
    key_row0 = Cfg::kColumnSplit ? 0 : wg * kWgmmaRows;
    out_col0 = Cfg::kColumnSplit ? wg * kOutCols : 0;
    key_local[0] = key_row0 + 16 * warp + lane / 4;
    key_local[1] = key_local[0] + 8;
    for (int r = 0; r < 2; ++r) {
      const int key = w.key0 + key_local[r];
      int64_t lo = 0, hi = 0;
      if (key < w.seqlen_k) w.mask.query_range_for_keys(key, key + 1, &lo, &hi);
      query_lo[r] = int(lo);
      query_hi[r] = int(hi);
    }
#pragma unroll
    for (int i = 0; i < kDkCols / 2; ++i) dk[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kDvRegs; ++i) dv[i] = 0.f;
  }

  // Dropout's keep bits of query block m of `head` into buffer `buffer`, in the consumers' layout: kKeepWords words
  // per consumer thread, bit i for its Sᵀ element i, so that each thread loads its bits of a block with one load
  // and holds them in registers (load_keep_bits). Every consumer thread draws a share of the block's groups: the
  // mask's Philox groups (common/dropout.h) are a query row's keys 2q + b + 8c (b < 2, c < 4) of a 32-key span,
  // which are rows r = c % 2 of the consumer threads with lane / 4 = 2q + b in warp (32·span + 8c) / 16 of the
  // consumers (warpgroup span / 2; at hd 256 both warpgroups hold the same 64 keys and split the queries), and a
  // thread's queries are 8j + 2·quad + e of its warpgroup's. So a role (span, q, quad and, under kColumnSplit, query
  // half) draws every group four consumer threads need; four threads share a role, each a quarter of its queries
  // (j), and OR their bits by shuffles before one of them stores each word. Drawn in the producer warpgroup's
  // spare warps instead (24 registers, one Philox chain at a time) the backward ran 3.0-3.6x slower at hd 64.
  __device__ void draw_keep_bits(int head, int m, int buffer) const {
    constexpr int kJ = kSQ / 8;                     // a consumer thread's query pairs
    constexpr int kJPerThread = kJ / 4;             // of which each of the role's four threads draws these
    constexpr int kThreadsPerWord = 4 / kKeepWords;  // the role's threads whose queries fall in one word
    static_assert(kJPerThread * 4 == kJ && 8 % kJPerThread == 0,
                  "draw_keep_bits: a role's queries split four ways, each share inside one word");
    const int t = int(threadIdx.x) - kWarpgroupThreads;  // among both consumer warpgroups
    const int share = t % 4, role = t / 4;
    const int role_quad = role % 4, q = role / 4 % 4;
    const int span = Cfg::kColumnSplit ? role / 16 % Cfg::kKeySpans : role / 16;
    const int query_half = Cfg::kColumnSplit ? role / (16 * Cfg::kKeySpans) : 0;
    static_assert(Cfg::kKeySpans * 16 * (Cfg::kColumnSplit ? Cfg::kConsumerWarpgroups : 1) * 4 ==
                      Cfg::kConsumerWarpgroups * kWarpgroupThreads,
                  "draw_keep_bits: four consumer threads per role");
    const DropoutSpec drop = DropoutSpec::make(a.dropout_p, a.dropout_rng, w.batch, head);
    const uint32_t group = uint32_t(w.key0 / 32 + span) << 2 | uint32_t(q);
    const int j0 = share * kJPerThread;
    const int64_t query0 = int64_t(m) * kM + query_half * kSQ + 2 * role_quad + 8 * j0;
    uint32_t bits[2][2] = {};  // [b][h = c / 2]: bit (4j + 2 (c % 2) + e) % 32 of the word of j
#pragma unroll
    for (int jj = 0; jj < kJPerThread; ++jj)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t slots = drop.kept_slots(query0 + 8 * jj + e, group);  // bit 2c + b
        const int at = (4 * (j0 + jj) + e) % 32;
#pragma unroll
        for (int c = 0; c < 4; ++c)
#pragma unroll
          for (int b = 0; b < 2; ++b) bits[b][c / 2] |= (slots >> (2 * c + b) & 1u) << (at + 2 * (c % 2));
      }
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int x = 1; x < kThreadsPerWord; x *= 2) bits[b][h] |= __shfl_xor_sync(0xffffffffu, bits[b][h], x);
    if (share % kThreadsPerWord != 0) return;
    const int word = j0 / 8;
    uint32_t* words = sm.keep_mask(buffer);
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = 32 * span + 16 * h + 2 * q + b;  // row 0 of the consumer thread holding it
        const int wg_of_key = Cfg::kColumnSplit ? query_half : key / kWgmmaRows;
        const int owner = wg_of_key * kWarpgroupThreads + (key % kWgmmaRows) / 16 * 32 + 4 * (key % 8) + role_quad;
        words[owner * kKeepWords + word] = bits[b][h];
      }
  }

  // This thread's keep bits of the query block in buffer `buffer` (draw_keep_bits).
  __device__ void load_keep_bits(int buffer) {
    const uint32_t* words = sm.keep_mask(buffer) + (threadIdx.x - kWarpgroupThreads) * kKeepWords;
    if constexpr (kKeepWords == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(words);
      keep[0] = v.x, keep[1] = v.y;
    } else {
      keep[0] = words[0];
    }
  }

  // Dropout's keep bits of the pair of scores (4j + 2r, 4j + 2r + 1): bit e for query 8j + 2·quad + e, key row
  // r. 3 (both kept) without dropout.
  __device__ uint32_t keep_pair(int j, int r) const {
    if constexpr (!Cfg::kDropout) return 3u;
    const int i = 4 * j + 2 * r;
    return keep[i / 32] >> (i % 32) & 3u;
  }

  // The first of the block's queries in this warpgroup's Sᵀ and dPᵀ of pass `pass` (Cfg::kScorePasses).
  __device__ int score_q0(int pass) const { return Cfg::kColumnSplit ? wg * kSQ : pass * kSQ; }

  // A tile needs per-element masking unless every (query, key) of it is visible and inside both sequences.
  __device__ bool needs_mask(int m) const {
    const int row_begin = m * kM, row_end = row_begin + kM;
    if (row_end > w.seqlen_q || w.key0 + kN > w.seqlen_k) return true;
    return !w.mask.tile_fully_visible(row_begin, row_end, w.key0, w.key0 + kN);
  }

  // D(64 x kSQ) = rows key_local of `keys` times rows score_q0(pass).. of `queries`ᵀ, both K-major over the first kCols
  // columns of the head dim: Sᵀ = K Qᵀ (Cfg::kProductCols), dPᵀ = V dOᵀ (Cfg::kProductColsV).
  template <int kCols>
  __device__ void issue_transposed_scores(Scores& d, const uint8_t* keys, const uint8_t* queries, int pass) {
    const uint32_t key_addr = smem_address(keys) + key_row0 * kSwizzleBytes;
    const uint32_t query_addr = smem_address(queries) + score_q0(pass) * kSwizzleBytes;
    const uint64_t key_desc = warp_uniform_desc(make_desc_k_major(key_addr));
    const uint64_t query_desc = warp_uniform_desc(make_desc_k_major(query_addr));
#pragma unroll
    for (int kk = 0; kk < kCols / kWgmmaK; ++kk) {
      const uint32_t step = (kk % 4) * kWgmmaK * 2;
      wgmma_ss<T, kSQ, 0>(d, step_desc(key_desc, (kk / 4) * kN * kSwizzleBytes + step),
                         step_desc(query_desc, (kk / 4) * kM * kSwizzleBytes + step), kk > 0);
    }
    wgmma_commit();
  }

  // acc(64 x 2 kRegs) += fragments(64 x kM) * rows(kM x this warpgroup's 2 kRegs columns), rows N-major from a
  // staged Q or dO tile.
  template <int kRegs>
  __device__ void issue_accumulate(float (&acc)[kRegs], const Fragments& f, const uint8_t* rows, int pass = 0) const {
    const uint32_t addr =
        smem_address(rows) + (out_col0 / kPanelCols) * kM * kSwizzleBytes + score_q0(pass) * kSwizzleBytes;
    const uint64_t desc = warp_uniform_desc(make_desc_mn_major(addr, kM * kSwizzleBytes));
#pragma unroll
    for (int kk = 0; kk < kSQ / kWgmmaK; ++kk)
      wgmma_rs<T, 2 * kRegs, 1>(acc, f[kk], step_desc(desc, kk * kWgmmaK * kSwizzleBytes), true);
    wgmma_commit();
  }

  // kColumnSplit: the same product with the 64 x kM left operand read K-major from a shared score tile (Pᵀ or dSᵀ,
  // queries contiguous, as the key tiles of the scores).
  template <int kRegs>
  __device__ void issue_accumulate_shared(float (&acc)[kRegs], const uint8_t* tile, const uint8_t* rows) const {
    const uint32_t tile_addr = smem_address(tile);
    const uint32_t addr = smem_address(rows) + (out_col0 / kPanelCols) * kM * kSwizzleBytes;
    const uint64_t tile_desc = warp_uniform_desc(make_desc_k_major(tile_addr));
    const uint64_t rows_desc = warp_uniform_desc(make_desc_mn_major(addr, kM * kSwizzleBytes));
#pragma unroll
    for (int kk = 0; kk < kM / kWgmmaK; ++kk)
      wgmma_ss<T, 2 * kRegs, 1>(acc, step_desc(tile_desc, (kk / 4) * kN * kSwizzleBytes + (kk % 4) * kWgmmaK * 2),
                               step_desc(rows_desc, kk * kWgmmaK * kSwizzleBytes), true);
    wgmma_commit();
  }

  // The fragment slot of the accumulator pair (4j + 2r, 4j + 2r + 1): keys row r, queries 8j + 2·quad, +1
  // (primitives_sm90.cuh's accumulator_to_a_fragment, one pair at a time).
  __device__ static uint32_t& slot(Fragments& f, int j, int r) { return f[j / 2][(j % 2) * 2 + r]; }

  // Pᵀ from Sᵀ in place (p, or p·(1 − tanh²) under softcap: the factor dS needs), and its 16-bit values (kPack)
  // into fragments, or under kColumnSplit into the shared Pᵀ tile `pt_tile` (without softcap score_grads can
  // pack the fragments from s instead, as the fp32 values die).
  // ALiBi's bias (slope2 in log2 units per key of distance, 0 without slopes) is folded into the LSE it subtracts.
  // With dropout the packed Pᵀ (dV's operand) is P ∘ keep, and s keeps P for dS with a dropped element's sign
  // flipped (P >= 0: score_grads reads the decision back from the sign, and a dropped 0 read as kept has the same
  // effect). Reading the bits again there instead spilled at hd 64 and 128.
  // The masked and the unmasked block as two copies: as one, the compiler computes every element's query range
  // test on every block and selects (about 140 instructions per block and thread at hd 128). Not with 128-row
  // blocks (hd 64), where the second copy here makes ptxas serialise the wgmmas (C7512): consume copies the whole
  // iteration there instead.
  // kMask: as gradients takes it; kMaskKnownNo takes the unmasked copy at every block size.
  template <bool kSoftcap, bool kAlibi, bool kPack, int kMask = kMaskUnknown>
  __device__ void probabilities(Scores& s, Fragments& pf, const float* lse_log2, int m, bool masked,
                                float alibi_slope2, uint8_t* pt_tile = nullptr, int pass = 0) const {
    if (kMask == kMaskKnownNo || (!Cfg::kScoresBeforeDv && !masked))
      probabilities_copy<kSoftcap, kAlibi, kPack, false>(s, pf, lse_log2, m, false, alibi_slope2, pt_tile, pass);
    else
      probabilities_copy<kSoftcap, kAlibi, kPack, true>(s, pf, lse_log2, m, masked, alibi_slope2, pt_tile, pass);
  }
  // One copy of probabilities; kMaybeMasked false: `masked` is known false.
  template <bool kSoftcap, bool kAlibi, bool kPack, bool kMaybeMasked>
  __device__ void probabilities_copy(Scores& s, Fragments& pf, const float* lse_log2, int m, bool masked,
                                     float alibi_slope2, uint8_t* pt_tile, int pass) const {
    // Row r's distance from query score_q0(pass) + 8j + 2·quad + e of the block is alibi_base[r] + 8j + e
    // (common/alibi.h).
    float alibi_base[2] = {0.f, 0.f};
    if constexpr (kAlibi) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alibi_base[r] = float(m * kM + score_q0(pass) + 2 * quad + (w.seqlen_k - w.seqlen_q) - (w.key0 + key_local[r]));
    }
#pragma unroll
    for (int j = 0; j < kSQ / 8; ++j) {
      const int col = score_q0(pass) + 8 * j + 2 * quad;
      const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + col);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t kp = keep_pair(j, r);
        float p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * r + e];
          float lse_e = e == 0 ? lse.x : lse.y;
          if constexpr (kAlibi) lse_e = fmaf(alibi_slope2, fabsf(alibi_base[r] + float(8 * j + e)), lse_e);
          float dscale = 1.f;
          if constexpr (kSoftcap) {
            const TanhParts t = tanh_parts(x * (tanh_scale() * kTanhExp2));  // as the forward computes it
            p[e] = exp2_approx(scaled_tanh(t, 1.f) * a.softcap_log2 - lse_e);
            dscale = tanh_slope(t);
          } else {
            p[e] = exp2_approx(x * scale_log2() - lse_e);
          }
          const int query = m * kM + col + e;
          if (kMaybeMasked && masked && (query < query_lo[r] || query >= query_hi[r])) p[e] = 0.f;
          x = kSoftcap ? p[e] * dscale : p[e];
          if (Cfg::kDropout && !(kp >> e & 1u)) x = -x;
        }
        // dV's operand: P ∘ keep (the factor 1 / (1 - p) comes in the epilogue).
        if constexpr (Cfg::kColumnSplit || kPack) {
          const uint32_t packed = pack_pair<T>(kp & 1u ? p[0] : 0.f, kp & 2u ? p[1] : 0.f);
          if constexpr (Cfg::kColumnSplit)
            *reinterpret_cast<uint32_t*>(pt_tile + swizzled_offset(key_local[r], col, kN)) = packed;
          else
            slot(pf, j, r) = packed;
        }
      }
    }
  }

  // dSᵀ = Pᵀ∘(dPᵀ − D) into fragments and into the shared dSᵀ buffer (queries contiguous, 128-byte swizzled:
  // the M-major A operand of dQ = dS K). kPackP: also Pᵀ's fragments from pd (Pᵀ itself without softcap), in the
  // same pass, so that each pair of fp32 scores dies where its two 16-bit values are made.
  // Dropout: dSᵀ = Pᵀ∘(Z∘dPᵀ − D) with Z = keep / (1 - p), and the packed Pᵀ is P ∘ keep; pd holds P with a
  // dropped element's sign flipped (probabilities).
  template <bool kPackP = false>
  __device__ void score_grads(const Scores& pd, const Scores& dp, Fragments& dsf, const float* dsum,
                              uint8_t* ds_tile, Fragments* pf = nullptr, int pass = 0) const {
    // The shared copy goes out with stmatrix, four 8 x 8 blocks (keys 8r.., queries 8j..) per instruction:
    // lane l addresses row l % 8 of block (r, j + jj) = (l / 8 % 2, l / 16), its 16 bytes one swizzle chunk.
    const int st_row = key_row0 + 16 * warp + 8 * (lane / 8 % 2) + lane % 8;
    // The address is swizzled_offset's, written out with the row's part hoisted: calling swizzled_offset per store
    // changes the hd 256 kernel's code, which would need a GPU run to replace the verified one.
    const uint32_t st_base = smem_address(ds_tile) + st_row * kSwizzleBytes;
#pragma unroll
    for (int j = 0; j < kSQ / 8; ++j) {
      const int col = score_q0(pass) + 8 * j + 2 * quad;
      const float2 d = *reinterpret_cast<const float2*>(dsum + col);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * j + 2 * r;
        float p0 = pd[i], p1 = pd[i + 1], z0 = dp[i], z1 = dp[i + 1];  // P and Z ∘ dPᵀ
        if constexpr (Cfg::kDropout) {
          if constexpr (kPackP) slot(*pf, j, r) = pack_pair<T>(fmaxf(p0, 0.f), fmaxf(p1, 0.f));
          z0 = p0 >= 0.f ? z0 * a.keep_scale : 0.f;
          z1 = p1 >= 0.f ? z1 * a.keep_scale : 0.f;
          p0 = fabsf(p0), p1 = fabsf(p1);
        } else if constexpr (kPackP) {
          slot(*pf, j, r) = pack_pair<T>(p0, p1);
        }
        slot(dsf, j, r) = pack_pair<T>(p0 * (z0 - d.x), p1 * (z1 - d.y));
      }
      if (j % 2 == 1) {
        const int st_col = score_q0(pass) + 8 * (j - 1) + 8 * (lane / 16);
        const uint32_t addr = st_base + (st_col / kPanelCols) * kN * kSwizzleBytes +
                              ((((st_col % kPanelCols) / 8) ^ (st_row % 8)) * kChunkBytes);
        stmatrix_x4(addr, slot(dsf, j - 1, 0), slot(dsf, j - 1, 1), slot(dsf, j, 0), slot(dsf, j, 1));
      }
    }
  }

  // This warpgroup's 64 x kDqCols piece of dQ = dS K over every key of the block (both warpgroups' dSᵀ rows
  // in the shared tile, or under kColumnSplit both warpgroups' queries): its columns, or under kDqSplitRows
  // its 64 query rows (one 64-query panel of dSᵀ) and every column.
  __device__ int dq_col0() const { return Cfg::kDqSplitRows ? 0 : wg * Cfg::kDqTileCols; }
  __device__ int dq_row0() const { return Cfg::kDqSplitRows ? wg * kWgmmaRows : 0; }

  // Product `product` of the warpgroup's kDqProducts: its columns from dq_col0() + product · kDqProductCols.
  __device__ void issue_dq(DqProduct& dq, const uint8_t* ds_tile, int product = 0) const {
    // dS (queries x keys) is stored as dSᵀ, queries contiguous: M-major, one 64-query panel per 64 queries. K's
    // columns are N: N-major, one panel per 64 columns of head dim (a 32-column piece starts 64 bytes into its
    // panel's rows; the swizzle applies to the address, as for the K-major k-steps). Both step 16 keys = 16 rows
    // per k-step.
    const uint32_t a_addr = smem_address(ds_tile) + (dq_row0() / kPanelCols) * kN * kSwizzleBytes;
    const int col0 = dq_col0() + product * kDqProductCols;
    const uint32_t b_addr = smem_address(sm.k()) + (col0 / kPanelCols) * kN * kSwizzleBytes +
                            (col0 % kPanelCols) * Cfg::kElemBytes;
    const uint64_t a_desc = warp_uniform_desc(make_desc_mn_major(a_addr, kN * kSwizzleBytes));
    const uint64_t b_desc = warp_uniform_desc(make_desc_mn_major(b_addr, kN * kSwizzleBytes));
#pragma unroll
    for (int kk = 0; kk < kN / kWgmmaK; ++kk)
      wgmma_ss<T, kDqProductCols, 1, 1>(
          dq, step_desc<Cfg::kWholeDqDescriptorSteps>(a_desc, kk * kWgmmaK * kSwizzleBytes),
          step_desc<Cfg::kWholeDqDescriptorSteps>(b_desc, kk * kWgmmaK * kSwizzleBytes), kk > 0);
    wgmma_commit();
  }

  // This thread's dQ fragment into the warpgroup's stage, Cfg::dq_stage_cols columns per hand-off to the dQ writer:
  // float4 k of thread t at 16 (128 k + t) bytes (a warp's stores cover 512 contiguous bytes: no bank conflicts).
  // The stage is reused once the writer has read the previous hand-off (`wait_empty`: every block but the
  // first; every piece but a block's first). `product`: which of the warpgroup's dQ products dq holds.
  __device__ void stage_dq(const DqProduct& dq, bool wait_empty, int product = 0) const {
    float4* stage = reinterpret_cast<float4*>(sm.dq_stage(wg)) + threadIdx.x % kWarpgroupThreads;
    constexpr int kChunks = Cfg::dq_stage_cols(kShareOf) / 8;
    constexpr int kPieces = kDqProductCols / Cfg::dq_stage_cols(kShareOf);  // of one product
    static_assert(kPieces * kChunks * 8 == kDqProductCols && kPieces * kDqProducts == Cfg::dq_pieces(kShareOf),
                  "stage_dq: the warpgroup's dQ in whole hand-offs");
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) {
      if (wait_empty || piece > 0 || product > 0) named_barrier_sync(kDqEmptyBarrier + wg, kDqHandoffThreads);
#pragma unroll
      for (int k = 0; k < kChunks; ++k) {
        const int j = piece * kChunks + k;
        stage[k * kWarpgroupThreads] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      }
      fence_async_shared();  // the bulk reduce reads the stage through the async proxy
      named_barrier_arrive(kDqFullBarrier + wg, kDqHandoffThreads);
    }
  }

  __device__ void release(int stage) const {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.empty()[stage]);
  }
  __device__ void release_do(int do_stage) const {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.do_empty()[do_stage]);
  }

  // Sᵀ and dPᵀ of the query block staged in `stage` (its dO in `do_stage`, the same stage unless kSeparateDoRing:
  // then waited for once Sᵀ is issued, which needs only Q), issued as two commit groups.
  __device__ void issue_scores(Scores& s, Scores& dp, int stage, int do_stage, uint32_t do_phase, int pass = 0) {
    wgmma_fence();
    issue_transposed_scores<Cfg::kProductCols>(s, sm.k(), sm.q(stage), pass);
    if constexpr (Cfg::kSeparateDoRing) {
      mbarrier_wait(&sm.do_full()[do_stage], do_phase);
      wgmma_fence();  // after the wait's branch ptxas would insert one itself
    }
    issue_transposed_scores<Cfg::kProductColsV>(dp, sm.v(), sm.dout(do_stage), pass);
  }

  // The rest of one query block once its Sᵀ and dPᵀ are issued: P, dV, dS, then dQ and dK issued (not waited
  // for). On return the wgmma groups in flight are dV, dQ (its first product: Cfg::kDqPanelProducts) and dK, in that
  // order: dQ lands while dK still runs, so the consumer hands dQ to the writer under dK's products instead of with
  // the tensor pipe idle (FlashAttention-3's order; bench/results/hopper-backward.md).
  // kMask: whether the block needs a mask, as consume knows it (kMaskKnownNo / kMaskKnownYes: its two copies of the
  // iteration) or not yet (kMaskUnknown: needs_mask decides here).
  template <bool kSoftcap, bool kAlibi, int kMask = kMaskUnknown>
  __device__ void gradients(Scores& s, Scores& dp, DqProduct& dq, int m, int stage,
                            int do_stage, int ds_buffer, float alibi_slope2) {
    const uint8_t* q_tile = sm.q(stage);
    const uint8_t* do_tile = sm.dout(do_stage);
    if constexpr (Cfg::kDropout) load_keep_bits(ds_buffer);
    Fragments pf;
    if constexpr (Cfg::kScorePasses > 1) {
      // Per pass of kSQ queries: dV and dK take the pass's Pᵀ and dSᵀ from registers (k-steps over the pass's
      // queries), issued before the next pass's Sᵀ and dPᵀ; dSᵀ also goes to the shared tile for dQ.
      uint8_t* ds_tile = sm.ds(ds_buffer);
      const bool block_masked = needs_mask(m);
#pragma unroll
      for (int pass = 0; pass < Cfg::kScorePasses; ++pass) {
        Fragments dsf;
        if (pass > 0) issue_scores(s, dp, stage, do_stage, 0, pass);  // no dO ring of its own here
        wgmma_wait<1>();  // Sᵀ (and the previous pass's dV and dK) have landed; dPᵀ may still run
        fence_registers(s);
        probabilities<kSoftcap, kAlibi, kSoftcap>(s, pf, sm.lse_log2(stage), m, block_masked, alibi_slope2, nullptr,
                                                  pass);
        wgmma_wait<0>();
        fence_registers(dp);
        score_grads<!kSoftcap>(s, dp, dsf, sm.dsum(stage), ds_tile, &pf, pass);
        wgmma_fence();
        issue_accumulate(dv, pf, do_tile, pass);
        if (pass + 1 == Cfg::kScorePasses) {  // dQ reads both warpgroups' whole dSᵀ tile
          fence_async_shared();
          consumers_meet<Cfg>();
          issue_dq(dq, ds_tile);
        }
        issue_accumulate(dk, dsf, q_tile, pass);
      }
    } else if constexpr (Cfg::kColumnSplit) {
      // This warpgroup's queries of Pᵀ and dSᵀ into the shared tiles; dV, dK, dQ read both warpgroups' queries.
      uint8_t* ds_tile = sm.ds(ds_buffer);
      uint8_t* pt_tile = sm.pt(ds_buffer);
      Fragments dsf;  // unused: dK reads dSᵀ from the tile
      wgmma_wait<1>();  // Sᵀ has landed; dPᵀ may still run
      fence_registers(s);
      probabilities<kSoftcap, kAlibi, false>(s, pf, sm.lse_log2(stage), m, needs_mask(m), alibi_slope2, pt_tile);
      wgmma_wait<0>();
      fence_registers(dp);
      score_grads(s, dp, dsf, sm.dsum(stage), ds_tile);
      fence_async_shared();
      consumers_meet<Cfg>();
      wgmma_fence();
      if constexpr (kDvCols > 0) issue_accumulate_shared(dv, pt_tile, do_tile);
      issue_dq(dq, ds_tile);
      issue_accumulate_shared(dk, ds_tile, q_tile);
    } else {
      wgmma_wait<1>();  // Sᵀ has landed; dPᵀ may still run
      fence_registers(s);
      if constexpr (Cfg::kScoresBeforeDv) {
        probabilities<kSoftcap, kAlibi, kSoftcap, kMask>(s, pf, sm.lse_log2(stage), m,
                                                         kMask == kMaskUnknown ? needs_mask(m) : kMask == kMaskKnownYes,
                                                         alibi_slope2);
        wgmma_wait<0>();
        fence_registers(dp);
      } else {
        probabilities<kSoftcap, kAlibi, true>(s, pf, sm.lse_log2(stage), m, needs_mask(m), alibi_slope2);
        wgmma_fence();
        issue_accumulate(dv, pf, do_tile);
        wgmma_wait<1>();  // dPᵀ has landed; dV may still run
        fence_registers(dp);
      }
      Fragments dsf;
      uint8_t* ds_tile = sm.ds(ds_buffer);
      score_grads<Cfg::kScoresBeforeDv && !kSoftcap>(s, dp, dsf, sm.dsum(stage), ds_tile, &pf);
      fence_async_shared();
      wgmma_fence();
      if constexpr (Cfg::kScoresBeforeDv) issue_accumulate(dv, pf, do_tile);
      consumers_meet<Cfg>();
      issue_dq(dq, ds_tile);
      issue_accumulate(dk, dsf, q_tile);
    }
  }

  __device__ void epilogue() const {
    const float dv_scale = Cfg::kDropout ? a.keep_scale : 1.f;  // (P ∘ Z)ᵀ dO
    const float dk_factor = dk_scale();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = w.key0 + key_local[r];
      if (key >= w.seqlen_k) continue;
      const int64_t row = int64_t(w.k_row0) + key;
      const bool varlen = a.cu_seqlens_q != nullptr;
      T* dk_row = static_cast<T*>(a.dk) + row * a.dk_row_stride + int64_t(w.kv_head) * a.dk_head_stride +
                  (varlen ? 0 : int64_t(w.batch) * a.dk_batch_stride);
      T* dv_row = static_cast<T*>(a.dv) + row * a.dv_row_stride + int64_t(w.kv_head) * a.dv_head_stride +
                  (varlen ? 0 : int64_t(w.batch) * a.dv_batch_stride);
#pragma unroll
      for (int j = 0; j < std::max(kDkCols, kDvCols) / 8; ++j) {
        const int col = out_col0 + 8 * j + 2 * quad;
        if (j < kDkCols / 8 && col < a.head_dim)
          *reinterpret_cast<uint32_t*>(dk_row + col) =
              pack_pair<T>(dk[4 * j + 2 * r] * dk_factor, dk[4 * j + 2 * r + 1] * dk_factor);
        if (j < kDvCols / 8 && col < a.head_dim_v)
          *reinterpret_cast<uint32_t*>(dv_row + col) =
              pack_pair<T>(dv[4 * j + 2 * r] * dv_scale, dv[4 * j + 2 * r + 1] * dv_scale);
      }
    }
  }
};

// The query blocks of every query head of the group. dQ lands before dK (gradients' order) and is staged while dK
// runs; the block's stage goes back once dK has landed (bench/results/hopper-backward.md, 81ae37a). Issuing the
// next block's Sᵀ and dPᵀ behind dQ instead of waiting was slower at hd 64 (324 -> 262 TFLOP/s at 16k) and
// spilled at hd 128 (53a4bb5).
template <typename T, typename Cfg, bool kLast, bool kSoftcap, bool kAlibi>
__device__ void consume(BackwardConsumer<T, Cfg, kLast>& c, const KeyBlockWork& w, int heads_per_kv) {
  // Dropout: block i's keep bits are drawn during block i - 1 (under its Sᵀ and dPᵀ) into buffer i % 2, which the
  // barrier on which both warpgroups meet in each block (gradients) hands over; block 0's before the loop, while K
  // and V load.
  if constexpr (Cfg::kDropout) {
    const QueryBlockOrder<Cfg> first(w, heads_per_kv);
    c.draw_keep_bits(first.head(w, heads_per_kv, 0), first.block(w, 0), 0);
    consumers_meet<Cfg>();
  }
  mbarrier_wait(c.sm.kv_full(), 0);
  const QueryBlockOrder<Cfg> order(w, heads_per_kv);
  RingPosition<Cfg::kStages> pos;
  RingPosition<Cfg::kDoStages> do_pos;
  // hd 64 (kScoresBeforeDv) runs the whole iteration in two copies, one for blocks that need no mask, chosen before
  // any wgmma of the block is issued: there the per-element mask tests are a quarter of the loop's instructions
  // (FA3 separates its masking iterations at hd <= 64 likewise). Choosing inside probabilities instead, with dPᵀ in
  // flight, made ptxas serialise the wgmmas (C7512). Softcap, ALiBi and dropout keep one copy.
  constexpr bool kUnmaskedCopy = Cfg::kScoresBeforeDv && !kSoftcap && !kAlibi && !Cfg::kDropout;
  // Query block i (query head `head`, block m): its Sᵀ and dPᵀ issued once its stage is full, then gradients, dQ
  // handed to the writer and the stage released. `mask`: what is known of its mask (gradients' kMask).
  const auto block = [&](int i, int head, int m, auto mask) {
    typename BackwardConsumer<T, Cfg, kLast>::Scores s, dp;
    mbarrier_wait(&c.sm.full()[pos.index], pos.phase);
    const int do_stage = Cfg::kSeparateDoRing ? do_pos.index : pos.index;
    c.issue_scores(s, dp, pos.index, do_stage, do_pos.phase);
    if constexpr (Cfg::kDropout) {
      if (i + 1 < order.blocks)
        c.draw_keep_bits(order.head(w, heads_per_kv, i + 1), order.block(w, i + 1), (i + 1) % 2);
    }
    typename BackwardConsumer<T, Cfg, kLast>::DqProduct dq;
    const float alibi_slope2 =
        kAlibi ? Alibi32::make(c.a.alibi_slopes, c.a.alibi_batch_stride, w.batch, head, w.seqlen_q, w.seqlen_k)
                     .slope_log2()
               : 0.f;
    const int ds_buffer = i % 2;
    c.template gradients<kSoftcap, kAlibi, decltype(mask)::value>(s, dp, dq, m, pos.index, do_stage, ds_buffer,
                                                                  alibi_slope2);
    if constexpr (Cfg::kSeparateDoRing) {
      wgmma_wait<2>();  // dV has landed: dO is no longer read
      fence_registers(c.dv);
      c.release_do(do_stage);
      do_pos.advance();
    }
    wgmma_wait<1>();  // dV and dQ have landed; dK may still run
    fence_registers(c.dv);
    fence_registers(dq);
    c.stage_dq(dq, i > 0);
    // The warpgroup's further dQ products (Cfg::kDqPanelProducts), each behind dK and the one before.
#pragma unroll
    for (int product = 1; product < BackwardConsumer<T, Cfg, kLast>::kDqProducts; ++product) {
      wgmma_fence();
      c.issue_dq(dq, c.sm.ds(ds_buffer), product);
      wgmma_wait<0>();
      fence_registers(dq);
      c.stage_dq(dq, true, product);
    }
    wgmma_wait<0>();  // dK has landed: this stage's Q and dO are no longer read
    fence_registers(c.dk);
    c.release(pos.index);
    pos.advance();
  };
  if constexpr (kUnmaskedCopy) {
    // The blocks that need no mask are one run, [unmasked_begin, unmasked_end), found once (the same answer as
    // needs_mask for each block); the walk steps (head, m) instead of dividing i, so that a block's choice and
    // position cost a few uniform instructions (offline SASS, hd 64: the block's setup was 100 instructions).
    int64_t row_lo, row_hi;
    w.mask.rows_seeing_all_keys(w.key0, int64_t(w.key0) + Cfg::kBlockN, &row_lo, &row_hi);
    const int unmasked_begin = int((row_lo + Cfg::kBlockM - 1) / Cfg::kBlockM);
    const int unmasked_end = int(min(row_hi, int64_t(w.seqlen_q)) / Cfg::kBlockM);
    int head = order.head(w, heads_per_kv, 0), step = w.m_begin;
    for (int i = 0; i < order.blocks; ++i) {
      const int m = sweep_block<Cfg>(w, step);
      if (m >= unmasked_begin && m < unmasked_end)
        block(i, head, m, std::integral_constant<int, kMaskKnownNo>{});
      else
        block(i, head, m, std::integral_constant<int, kMaskKnownYes>{});
      if (++step == w.m_end) step = w.m_begin, ++head;
    }
  } else {
    for (int i = 0; i < order.blocks; ++i)
      block(i, order.head(w, heads_per_kv, i), order.block(w, i), std::integral_constant<int, kMaskUnknown>{});
  }
}

// One consumer warpgroup's whole part: its query blocks, then its dK and dV.
template <typename T, typename Cfg, bool kLast>
__device__ void run_consumer(const BackwardSmem<Cfg>& sm, const KeyBlockWork& w, const BackwardKernelArgs& args,
                             const ScoreDescales& descales, int consumer_wg, bool has_work) {
  BackwardConsumer<T, Cfg, kLast> c(sm, w, args, descales, consumer_wg);
  if (has_work) {
    if (args.softcap > 0.f)
      consume<T, Cfg, kLast, true, Cfg::kExtras>(c, w, args.heads_per_kv);
    else
      consume<T, Cfg, kLast, false, Cfg::kExtras>(c, w, args.heads_per_kv);
  }
  c.epilogue();
}

// Cfg::kExtras (ALiBi) and Cfg::kDropout: kernels of their own, so that the plain kernel's register allocation
// stays what it was without them, and the ALiBi kernel's without dropout.
template <typename T, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    backward_kernel(const __grid_constant__ BackwardKernelArgs args, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                    const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_lse,
                    const __grid_constant__ CUtensorMap tm_dsum, const __grid_constant__ ScoreDescales descales) {
  extern __shared__ uint8_t smem_raw[];
  BackwardSmem<Cfg> sm(smem_raw);
  const KeyBlockWork w = key_block_work<Cfg>(args);
  if (w.key0 >= w.seqlen_k) return;  // a varlen sequence shorter than this block: the whole CTA leaves
  if (threadIdx.x == 0) {
    mbarrier_init(sm.kv_full(), 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(&sm.full()[s], 1);
      mbarrier_init(&sm.empty()[s], Cfg::kConsumerWarps);
    }
    if constexpr (Cfg::kSeparateDoRing) {
      for (int s = 0; s < Cfg::kDoStages; ++s) {
        mbarrier_init(&sm.do_full()[s], 1);
        mbarrier_init(&sm.do_empty()[s], Cfg::kConsumerWarps);
      }
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // No query sees these keys (or there are none): dK = dV = 0, written without loading anything.
  const bool has_work = w.m_end > w.m_begin;
  const int wg = threadIdx.x / kWarpgroupThreads;
  if (wg == 0) {
    setmaxnreg_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0 && has_work) {
      tma_prefetch_map(&tm_q);
      tma_prefetch_map(&tm_do);
      produce<Cfg>(sm, w, args.heads_per_kv, &tm_q, &tm_k, &tm_v, &tm_do, &tm_lse, &tm_dsum);
    } else if (threadIdx.x / 32 == kDqWriterWarp && has_work) {
      write_dq<Cfg>(sm, w, args);
    }
  } else {
    setmaxnreg_increase<Cfg::kConsumerRegisters>();
    if constexpr (Cfg::kNarrowLast) {
      if (wg - 1 == Cfg::kLastWarpgroup)
        run_consumer<T, Cfg, true>(sm, w, args, descales, wg - 1, has_work);
      else
        run_consumer<T, Cfg, false>(sm, w, args, descales, wg - 1, has_work);
    } else {
      run_consumer<T, Cfg, false>(sm, w, args, descales, wg - 1, has_work);
    }
  }
}

// What dq_convert_fragments_kernel reads; lengths and strides in elements.
struct DqConvertArgs {
  void* dq;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  const float* dq_accum;
  const int* dq_turns;  // BackwardKernelArgs::dq_turns: where not null, a tile whose counter is 0 was never written
  int64_t ws_head_stride;
  const int32_t* cu_seqlens_q;  // null: padded batch of `batch` sequences of seqlen_q rows
  int batch, seqlen_q;
  int head_dim;     // dQ's columns (at most the bucket's)
  float scale;      // softmax_scale
  ScoreDescales descales;  // Cfg::kDescaled: dQ's factor is times k_descale
  int heads_per_kv;
  bool pair_stores;   // dq's base and strides allow 4-byte stores of element pairs
  bool chunk_stores;  // ... and 16-byte stores of 8 elements (head_dim a multiple of 8)
};

// dQ = dq_accum · scale as the dtype, from the fragment-ordered tiles of write_dq: one CTA per
// (query block of the workspace, query head), a thread per fragment slot of the consumer warpgroups; thread t's
// float4 k of piece p holds rows r0 + 16 (t / 32) + (t % 32) / 4 (+ 8) at columns c0 + 8 k + 2 (t % 4) (+ 1), as
// in the wgmma accumulator, where piece p starts at row r0 = 64 p, column c0 = 0 under kDqSplitRows, else at
// row 0, column p kDqStageCols. With chunk_stores the quad's four threads swap their pairs (quad_transpose) over
// two float4s k, k + 1 so that each thread stores 16 bytes: 8 consecutive columns of one row (the 4-byte pair
// stores ran at a third of HBM speed: 182 us against cuDNN's 56 for its own conversion at hd 128, 2k,
// bench/results/hopper-backward.md). A block past its sequence's last row (the slack between sequences) writes
// nothing; one whose tile no key block wrote (no key visible to its rows) writes zeros.
template <typename T, typename Cfg>
__global__ void __launch_bounds__(kWarpgroupThreads) dq_convert_fragments_kernel(const DqConvertArgs a) {
  const int64_t ws_row = int64_t(blockIdx.x) * Cfg::kBlockM;
  const int head = blockIdx.y;
  // The sequence whose workspace rows hold this block: the last one starting at or before it (the starts grow by
  // at least a block from one sequence to the next, empty ones included).
  auto first_row = [&](int b) -> int64_t { return a.cu_seqlens_q ? a.cu_seqlens_q[b] : int64_t(b) * a.seqlen_q; };
  int lo = 0, hi = a.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (sm80::ws_sequence_start(first_row(mid), mid, Cfg::kWsAlign) <= ws_row) lo = mid;
    else hi = mid - 1;
  }
  const int b = lo;
  const int64_t row0 = first_row(b);
  const int64_t len = a.cu_seqlens_q ? a.cu_seqlens_q[b + 1] - row0 : a.seqlen_q;
  const int64_t i0 = ws_row - sm80::ws_sequence_start(row0, b, Cfg::kWsAlign);
  if (i0 >= len) return;
  T* dq = static_cast<T*>(a.dq) + (a.cu_seqlens_q ? row0 * a.dq_row_stride : int64_t(b) * a.dq_batch_stride) +
          int64_t(head) * a.dq_head_stride;
  const float scale =
      Cfg::kDescaled ? a.scale * descale_of(a.descales.k, a.descales.k_strides, b, head / a.heads_per_kv) : a.scale;
  const int64_t tile_index = dq_tile_index<Cfg>(a.ws_head_stride, head, ws_row);
  const float* tile = dq_accum_tile<Cfg>(a.dq_accum, tile_index);
  const bool written = !a.dq_turns || a.dq_turns[tile_index] > 0;
  const int t = threadIdx.x, quad = t % 4;
  static_assert(Cfg::kDqStageCols % 16 == 0, "dq_convert_fragments_kernel: float4s in pairs");
  // Piece p is warpgroup p / kDqStagePieces's; a narrower last warpgroup has narrower pieces, or fewer
  // (BackwardConfig::dq_stage_cols, dq_pieces).
  constexpr int kPieces = Cfg::kConsumerWarpgroups * Cfg::kDqStagePieces, kFloat4s = Cfg::kDqStageCols / 8;
  constexpr auto float4s_of = [](int piece) {
    const int wg = piece / Cfg::kDqStagePieces;
    return piece % Cfg::kDqStagePieces < Cfg::dq_pieces(wg) ? Cfg::dq_stage_cols(wg) / 8 : 0;
  };
  // Every load of the tile issued before the first store: dq may alias dq_accum for all the compiler knows, so
  // loads left between the stores wait for them, one tile's worth of latency at a time (ncu: 76 of 80 cycles per
  // instruction stalled on them, 72 us against 64 for FlashAttention-4's conversion at hd 64, B·S = 16k, H100).
  float4 v[kPieces][kFloat4s];
#pragma unroll
  for (int piece = 0; piece < kPieces; ++piece) {
    const float4* stage = reinterpret_cast<const float4*>(
        tile + Cfg::dq_piece_offset(piece / Cfg::kDqStagePieces, piece % Cfg::kDqStagePieces));
#pragma unroll
    for (int k = 0; k < float4s_of(piece); ++k)
      v[piece][k] = written ? stage[k * kWarpgroupThreads + t] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int piece = 0; piece < kPieces; ++piece) {
    const int row_in_block = (Cfg::kDqSplitRows ? piece * kWgmmaRows : 0) + 16 * (t / 32) + (t % 32) / 4;
    const int col0 = Cfg::kDqSplitRows ? 0 : piece * Cfg::kDqStageCols;
    if (a.chunk_stores) {
#pragma unroll
      for (int k = 0; k < float4s_of(piece); k += 2) {
        const float4 v0 = v[piece][k], v1 = v[piece][k + 1];
        // Word c: float4 k + c / 2, row half c % 2; after the transpose, this thread's chunk c = quad.
        uint32_t words[4] = {
            pack_pair<T>(v0.x * scale, v0.y * scale), pack_pair<T>(v0.z * scale, v0.w * scale),
            pack_pair<T>(v1.x * scale, v1.y * scale), pack_pair<T>(v1.z * scale, v1.w * scale)};
        quad_transpose(words, quad);
        const int col = col0 + 8 * (k + quad / 2);
        const int64_t i = i0 + row_in_block + 8 * (quad % 2);
        if (col < a.head_dim && i < len)
          *reinterpret_cast<uint4*>(dq + i * a.dq_row_stride + col) =
              make_uint4(words[0], words[1], words[2], words[3]);
      }
      continue;
    }
#pragma unroll
    for (int k = 0; k < float4s_of(piece); ++k) {
      const float4 f = v[piece][k];
      const int col = col0 + 8 * k + 2 * (t % 4);
      if (col >= a.head_dim) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t i = i0 + row_in_block + 8 * half;
        if (i >= len) continue;
        T* dst = dq + i * a.dq_row_stride + col;
        const float x = (half ? f.z : f.x) * scale, y = (half ? f.w : f.y) * scale;
        if (a.pair_stores) {
          *reinterpret_cast<uint32_t*>(dst) = pack_pair<T>(x, y);
        } else {
          const uint32_t bits = pack_pair<T>(x, y);
          *reinterpret_cast<uint16_t*>(dst) = uint16_t(bits & 0xffffu);
          *reinterpret_cast<uint16_t*>(dst + 1) = uint16_t(bits >> 16);
        }
      }
    }
  }
}

}  // namespace
}  // namespace flashattn::cuda::sm90

namespace flashattn::detail {
namespace {

using sm90_checks::aligned;
using sm90_checks::tma_stride_ok;

template <typename T, int kHeadDim, bool kExtras, bool kDropout, bool kDescaled, int kProductCols = kHeadDim,
          int kProductColsV = kProductCols>
Status launch(const BwdParams& p) {
  using Cfg = cuda::sm90::BackwardConfig<kHeadDim, kExtras, kDropout, kDescaled, kProductCols, kProductColsV>;
  // The conversion depends only on dq_accum's layout: the bucket kernel's unless the product columns narrow it (the
  // 192 bucket has one kernel, and a config only with its V columns).
  using ConvertCfg = std::conditional_t<
      kHeadDim == 192, Cfg,
      std::conditional_t<Cfg::kDqRowCols == kHeadDim, cuda::sm90::BackwardConfig<kHeadDim, kExtras, kDropout, kDescaled>,
                         cuda::sm90::BackwardConfig<kHeadDim, kExtras, kDropout, kDescaled, kProductCols>>>;
  cuda::sm90::ScoreDescales descales{p.q_descale, p.k_descale, {}, {}};
  for (int i = 0; i < 2; ++i)
    descales.q_strides[i] = p.q_descale_strides[i], descales.k_strides[i] = p.k_descale_strides[i];
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const bool varlen = p.is_varlen();
  cuda::sm80::BwdKernelArgs rows = sm80_backward_args(p);
  // Rows of the Q / dO and K / V tensor maps: one sequence's (padded batch) or every sequence's (varlen).
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  // Workspace: D, LSE·log2e [heads_q][ws_head_stride] and dq_accum [heads_q][ws_head_stride][Cfg::kDqRowCols].
  // Every sequence starts at a multiple of Cfg::kWsAlign rows (sm80::ws_sequence_start, which needs up to batch *
  // kWsAlign rows of slack): a whole query block for the fragment-ordered dq_accum tiles, at least 4 for TMA's
  // 16-byte aligned boxes of LSE and D; the head stride is a multiple of it (at least one, so the maps over D and
  // LSE always have a base).
  constexpr int kWsAlign = Cfg::kWsAlign;
  const int64_t ws_rows = rows.rows_q + int64_t(p.batch) * kWsAlign;
  const int64_t ws_head_stride = std::max<int64_t>((ws_rows + kWsAlign - 1) / kWsAlign * kWsAlign, kWsAlign);
  const size_t row_elems = size_t(p.heads_q) * size_t(ws_head_stride);
  const int64_t key_blocks = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  // One CTA per SM (backward_config.h): a wave is the SM count.
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, 1);
  const bool no_mask = !rows.causal && rows.window_left < 0 && rows.window_right < 0;
  // Rotated sweeps make a key block wait for later ones (dq_turn), so all of a KV head's must be able to run at
  // once: at most half the SMs, so that kernels on other streams (a data-parallel all-reduce) holding some of them
  // delay the call but do not stall it. Past that (long sequences) key order costs little: the queue at a tile is
  // short beside the sweep (bench/results/hopper-backward.md). Not covered: a context held to fewer than half the
  // SMs this attribute reports (MPS provisioning, green contexts); there the turn wait traps after seconds.
  const bool rotate_sweeps = p.deterministic && no_mask && 2 * key_blocks <= sms;
  // Deterministic mode: the tiles' turn counters after D and LSE, and dq_accum after them on a 512-byte boundary,
  // as it is without them (a build that left it on a 16-byte boundary ran 4-5% slower at hd 256, 16k). Zeroed up to
  // dq_accum, which its first writers store into.
  constexpr size_t kDqAccumAlignInts = 512 / sizeof(int);
  const size_t turn_ints =
      p.deterministic ? (row_elems / Cfg::kBlockM + kDqAccumAlignInts - 1) / kDqAccumAlignInts * kDqAccumAlignInts : 0;
  const size_t ws_bytes = (2 + Cfg::kDqRowCols) * row_elems * sizeof(float) + turn_ints * sizeof(int);
  const size_t zeroed_bytes = p.deterministic ? 2 * row_elems * sizeof(float) + turn_ints * sizeof(int) : ws_bytes;
  void* ws = nullptr;
  if (ws_bytes > 0) {
    Status got = workspace_alloc(&ws, ws_bytes, p.device.index, stream);
    if (!got.ok()) return got;
  }
  rows.ws_head_stride = ws_head_stride;
  rows.ws_seq_align = kWsAlign;
  rows.dsum = static_cast<float*>(ws);
  rows.lse_log2 = rows.dsum + row_elems;
  int* const after_rows = reinterpret_cast<int*>(rows.lse_log2 + row_elems);
  int* const dq_turns = p.deterministic ? after_rows : nullptr;
  rows.dq_accum = reinterpret_cast<float*>(after_rows + turn_ints);

  Status st = [&]() -> Status {
    if (ws_bytes == 0) return Status::success();
    // Zeroed up to dq_accum, or with it where it is summed into: the turn counters count from 0, and the slack rows
    // between sequences, which the tiles past a sequence's end load, must hold finite D values (their P is 0, but
    // 0 · (dP − NaN) is not).
    FA_CUDA_TRY(cudaMemsetAsync(ws, 0, zeroed_bytes, stream));
    Status pre = sm80_backward_preprocess(rows, p.dtype, stream);
    if (!pre.ok()) return pre;
    if (key_blocks > 0 && p.batch > 0 && p.heads_kv > 0 && rows_k > 0) {
      const int64_t batch_dim = varlen ? 1 : p.batch;
      // In varlen the batch dimension has extent 1 and is never stepped; any valid stride will do.
      auto batch_stride = [&](int64_t s, int64_t row_stride, int64_t n) {
        return varlen ? row_stride * std::max<int64_t>(n, 1) : s;
      };
      // With no queries the loop never reads Q or dO, but their maps still need an address.
      const void* q_base = rows_q > 0 ? p.q : p.k;
      const void* do_base = rows_q > 0 ? p.dout : p.k;
      CUtensorMap tm_q, tm_k, tm_v, tm_do, tm_lse, tm_dsum;
      {
        // The true head dims, not the bucket's: TMA loads zeros past them (support_checks.h, head_dim_bucket).
        const int64_t dims[4] = {p.head_dim, rows_q, p.heads_q, batch_dim};
        const int64_t qs[3] = {p.q_row_stride, p.q_head_stride, batch_stride(p.q_batch_stride, p.q_row_stride, rows_q)};
        Status m = make_tensor_map_sw128(&tm_q, q_base, p.dtype, dims, qs, Cfg::kBlockM);
        if (!m.ok()) return m;
        const int64_t ds[3] = {p.do_row_stride, p.do_head_stride,
                               batch_stride(p.do_batch_stride, p.do_row_stride, rows_q)};
        const int64_t do_dims[4] = {p.head_dim_v, rows_q, p.heads_q, batch_dim};
        m = make_tensor_map_sw128(&tm_do, do_base, p.dtype, do_dims, ds, Cfg::kBlockM);
        if (!m.ok()) return m;
      }
      {
        const int64_t dims[4] = {p.head_dim, rows_k, p.heads_kv, batch_dim};
        const int64_t ks[3] = {p.k_row_stride, p.k_head_stride, batch_stride(p.k_batch_stride, p.k_row_stride, rows_k)};
        Status m = make_tensor_map_sw128(&tm_k, p.k, p.dtype, dims, ks, Cfg::kBlockN);
        if (!m.ok()) return m;
        const int64_t vs[3] = {p.v_row_stride, p.v_head_stride, batch_stride(p.v_batch_stride, p.v_row_stride, rows_k)};
        const int64_t v_dims[4] = {p.head_dim_v, rows_k, p.heads_kv, batch_dim};
        m = make_tensor_map_sw128(&tm_v, p.v, p.dtype, v_dims, vs, Cfg::kBlockN);
        if (!m.ok()) return m;
      }
      {
        Status m = make_tensor_map_f32_rows(&tm_lse, rows.lse_log2, ws_head_stride, p.heads_q, ws_head_stride,
                                            Cfg::kBlockM);
        if (!m.ok()) return m;
        m = make_tensor_map_f32_rows(&tm_dsum, rows.dsum, ws_head_stride, p.heads_q, ws_head_stride, Cfg::kBlockM);
        if (!m.ok()) return m;
      }
      cuda::sm90::BackwardKernelArgs a{};
      a.dk = p.dk;
      a.dv = p.dv;
      a.dk_batch_stride = p.dk_batch_stride, a.dk_row_stride = p.dk_row_stride, a.dk_head_stride = p.dk_head_stride;
      a.dv_batch_stride = p.dv_batch_stride, a.dv_row_stride = p.dv_row_stride, a.dv_head_stride = p.dv_head_stride;
      a.head_dim = int(p.head_dim), a.head_dim_v = int(p.head_dim_v);
      a.dq_accum = rows.dq_accum;
      a.dq_turns = dq_turns;
      a.last_key_block_first = p.deterministic && (rows.causal || rows.window_right >= 0);
      a.rotate_sweeps = rotate_sweeps;
      a.tail_pairs = a.rotate_sweeps ? 0 : cuda::tail_pairs_for_wave(uint32_t(key_blocks), sms);
      a.ws_head_stride = ws_head_stride;
      a.ws_seq_align = kWsAlign;
      a.cu_seqlens_q = p.cu_seqlens_q;
      a.cu_seqlens_k = p.cu_seqlens_k;
      a.seqlen_q = int(p.seqlen_q);
      a.seqlen_k = int(p.seqlen_k);
      a.heads_per_kv = rows.group;
      // The score transforms exactly as the sm80 backward derives them (sm80_backward_args).
      a.scale = rows.scale, a.scale_log2 = rows.scale_log2;
      a.softcap = rows.softcap, a.tanh_scale = rows.tanh_scale, a.softcap_log2 = rows.softcap_log2;
      a.causal = rows.causal;
      // 32-bit window arguments: the narrowest edges that mean the same (a window past 2^31 would truncate).
      a.window_left = int(MaskSpec::narrowest_left(rows.window_left, p.seqlen_k));
      a.window_right = int(MaskSpec::narrowest_right(rows.window_right, p.seqlen_q));
      a.alibi_slopes = rows.alibi_slopes, a.alibi_batch_stride = rows.alibi_batch_stride;
      a.dropout_p = rows.dropout_p, a.dropout_rng = rows.dropout_rng;
      a.keep_scale = kDropout ? 1.f / (1.f - rows.dropout_p) : 1.f;

      auto kernel = cuda::sm90::backward_kernel<T, Cfg>;
      FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
      const dim3 grid(unsigned(key_blocks), unsigned(p.heads_kv), unsigned(p.batch));
      kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, tm_q, tm_k, tm_v, tm_do, tm_lse, tm_dsum,
                                                               descales);
      FA_CUDA_TRY(cudaGetLastError());
    }
    if (p.heads_q == 0 || p.batch == 0) return Status::success();
    cuda::sm90::DqConvertArgs c{};
    c.dq = p.dq;
    c.dq_batch_stride = p.dq_batch_stride, c.dq_row_stride = p.dq_row_stride, c.dq_head_stride = p.dq_head_stride;
    c.dq_accum = rows.dq_accum;
    c.dq_turns = dq_turns;
    c.ws_head_stride = ws_head_stride;
    c.cu_seqlens_q = p.cu_seqlens_q;
    c.batch = int(p.batch);
    c.seqlen_q = int(p.seqlen_q);
    c.head_dim = int(p.head_dim);
    c.scale = rows.scale;
    c.descales = descales;
    c.heads_per_kv = rows.group;
    c.pair_stores = aligned(p.dq, 4) && p.dq_row_stride % 2 == 0 && p.dq_head_stride % 2 == 0 &&
                    (varlen || p.dq_batch_stride % 2 == 0);
    c.chunk_stores = aligned(p.dq, 16) && tma_stride_ok(p.dq_row_stride) && tma_stride_ok(p.dq_head_stride) &&
                     (varlen || tma_stride_ok(p.dq_batch_stride)) && p.head_dim % 8 == 0;
    const dim3 grid(unsigned(ws_head_stride / Cfg::kBlockM), unsigned(p.heads_q));
    cuda::sm90::dq_convert_fragments_kernel<T, ConvertCfg><<<grid, cuda::sm90::kWarpgroupThreads, 0, stream>>>(c);
    FA_CUDA_TRY(cudaGetLastError());
    return Status::success();
  }();
  if (ws) {
    Status freed = workspace_free(ws, stream);
    if (st.ok()) st = freed;
  }
  return st;
}

// The product columns of the narrower plain kernels (BackwardConfig::kProductCols, kProductColsV): 96, and 128 / 64,
// in the 128 bucket; 192 in the 256 bucket; 192 / 128 (MLA) in the 192 bucket.
constexpr int kNarrowProductCols = 96, kNarrowProductColsV = 64;
constexpr int kMlaProductCols = 192, kMlaProductColsV = 128;

// ALiBi runs in the kernels with kExtras, dropout in the one with kDropout, float8 inputs' descales in the ones with
// kDescaled (backward_config.h).
template <typename T, bool kExtras, bool kDropout, bool kDescaled = false>
Status launch_head_dim(const BwdParams& p) {
  constexpr bool kPlain = !kExtras && !kDescaled;  // the kernels that have narrower copies (dropout needs kExtras)
  switch (sm90_checks::head_dim_bucket(p.head_dim, p.head_dim_v, sm90_checks::Pass::backward)) {
    case 64: return launch<T, 64, kExtras, kDropout, kDescaled>(p);
    case 128:
      // Head dims up to 96 (80, 96: Phi-2, Phi-3, ViT-H) compute 96 of the bucket's columns in the plain kernel,
      // and d_v up to 64 beside a larger d (128 / 64) 64 columns of dV and dPᵀ's k-steps.
      if (kPlain && std::max(p.head_dim, p.head_dim_v) <= kNarrowProductCols)
        return launch<T, 128, false, false, false, kNarrowProductCols>(p);
      if (kPlain && p.head_dim_v <= kNarrowProductColsV)
        return launch<T, 128, false, false, false, 128, kNarrowProductColsV>(p);
      return launch<T, 128, kExtras, kDropout, kDescaled>(p);
    default:
      // d up to 192 beside d_v up to 128 (DeepSeek's MLA): the 192 bucket's 128-key CTAs; d and d_v up to 192 (hd
      // 192): the 256 bucket with the scores' k-steps stopping at 192.
      if (kPlain && p.head_dim <= kMlaProductCols && p.head_dim_v <= kMlaProductColsV)
        return launch<T, 192, false, false, false, kMlaProductCols, kMlaProductColsV>(p);
      if (kPlain && p.head_dim <= kMlaProductCols && p.head_dim_v <= kMlaProductCols)
        return launch<T, 256, false, false, false, kMlaProductCols>(p);
      return launch<T, 256, kExtras, kDropout, kDescaled>(p);
  }
}
template <typename T>
Status launch_extras(const BwdParams& p) {
  if (p.q_descale != nullptr || p.k_descale != nullptr) return launch_head_dim<T, false, false, true>(p);
  if (DropoutSpec::drops(p.dropout_p)) return launch_head_dim<T, true, true>(p);
  return p.alibi_slopes != nullptr ? launch_head_dim<T, true, false>(p) : launch_head_dim<T, false, false>(p);
}

}  // namespace

Status sm90_backward_supports(const BwdParams& p) {
  Status common = sm90_checks::common(p);
  if (!common.ok()) return common;
  const bool varlen = p.is_varlen();
  // float8_e4m3fn inputs reach the kernel as contiguous 16-bit copies in aligned workspace (backward_sm90_fp8.cu),
  // which meet TMA's rules whatever the e4m3 tensors' layout.
  const bool staged = p.dtype == DType::e4m3;
  if (staged && (p.alibi_slopes != nullptr || p.dropout_p > 0))
    return Status::unsupported("cuda_sm90: float8_e4m3fn inputs with ALiBi or dropout are not supported yet");
  if (p.attention_chunk > 0)
    return Status::unsupported("cuda_sm90: the backward of chunked attention (attention_chunk) is not built yet "
                               "(cuda_sm80's backward runs it)");
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride, p.v_row_stride,
                             p.v_head_stride, p.do_row_stride, p.do_head_stride, varlen ? 0 : p.q_batch_stride,
                             varlen ? 0 : p.k_batch_stride, varlen ? 0 : p.v_batch_stride,
                             varlen ? 0 : p.do_batch_stride};
  for (int64_t s : strides)
    if (!staged && !tma_stride_ok(s))
      return Status::unsupported("cuda_sm90: TMA needs every row/head/batch stride of q, k, v, dout to be a multiple of 8 elements");
  if (!staged && (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.dout, 16)))
    return Status::unsupported("cuda_sm90: TMA needs 16-byte aligned q, k, v, dout");
  const int64_t out_strides[] = {p.dk_row_stride, p.dk_head_stride, p.dv_row_stride, p.dv_head_stride,
                                 varlen ? 0 : p.dk_batch_stride, varlen ? 0 : p.dv_batch_stride};
  for (int64_t s : out_strides)
    if (s % 2 != 0) return Status::unsupported("cuda_sm90: the backward writes dk, dv in pairs: strides must be even");
  if (!aligned(p.dk, 4) || !aligned(p.dv, 4))
    return Status::unsupported("cuda_sm90: the backward writes dk, dv in pairs: 4-byte aligned bases needed");
  if (p.heads_q > 65535 || p.batch > 65535)
    return Status::unsupported("cuda_sm90: more than 65535 query heads or batches");
  return Status::success();
}

Status sm90_backward_run(const BwdParams& p) {
  Status st = sm90_backward_supports(p);
  if (!st.ok()) return st;
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  if (p.dtype == DType::e4m3) return sm90_fp8_backward_run(p, sm90_backward_run);
  return p.dtype == DType::bf16 ? launch_extras<__nv_bfloat16>(p) : launch_extras<__half>(p);
}

}  // namespace flashattn::detail
