// Hopper forward main loop: the producer (TMA into the K/V ring) and the consumer warpgroups' steps
// (S = Q Kᵀ, softcap, ALiBi and mask, online softmax, dropout, O += P V, epilogue) and their order (S_n issued with
// P_{n+1} V_{n+1}, the softmax under P V, the consumer warpgroups taking turns or issuing freely). Warp roles
// and budgets: forward_sm90.cu's header and forward_config.h.
// Included by forward_sm90.cu only.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/alibi.h"
#include "common/dropout.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_tiles.cuh"
#include "cuda/sm90/primitives_sm90.cuh"

namespace flashattn::cuda::sm90 {

// Where a CTA's producer or consumer warpgroup is in its pipelines: the K/V ring position and the parity of
// the Q buffer's current use. Carried from one tile to the next in a persistent CTA; producer and consumers
// visit the same tiles with the same key ranges, so their copies stay in step.
template <int kStages>
struct PipelineState {
  RingPosition<kStages> kv;
  uint32_t q_phase = 0;
};

// ---- producer: one thread streams each tile's Q, then its K/V tiles through the ring ----
// K and V of a stage are freed separately (k_empty / v_empty): the consumers free K as soon as S has landed,
// V only after P V. The consumers read K_n one key tile before V_n (S_n goes out with P_{n+1} V_{n+1}), so K
// runs one tile ahead here: K_{n-1} is requested before V_n, whose stage frees last (its previous V's P V ends
// an iteration after that K's S). In tile order, K then V, each K waited behind the previous V's slot and
// reached the consumers with one iteration to spare. Timed level with that order (the probe's K/V waits, 6% of
// consumer time, are not this latency), but this loop keeps the producer free of spills
// (bench/results/hopper-forward.md, 44259c8, 32e49d1). The first K tile is loaded before waiting for the Q buffer: in a
// persistent CTA it then arrives while the consumers still finish the previous tile.
// In a cluster (kClusterCtas > 1) the producer of rank r loads rows [r, r + 1) * kKVPartRows of each K / V tile
// into the same slot of every CTA (the tensor maps' boxes are that tall): it waits until the slot is free in
// all of them (empty counts every CTA's consumer warps), and its own full barrier expects the whole tile, whose
// other parts the other CTAs' loads deliver (their bytes may arrive before this expect_tx: the phase still needs
// this arrival).
template <typename Cfg>
__device__ void produce(const SharedStorage<Cfg>& sm, const BlockWork& w, int kv_head, const CUtensorMap* tm_q,
                        const CUtensorMap* tm_k, const CUtensorMap* tm_v, PipelineState<Cfg::kStages>& st,
                        uint32_t rank) {
  constexpr int kQKPanels = Cfg::kHeadDim / Cfg::kQKPanelElems;  // of a Q or K row
  if (w.n_end <= w.n_begin) return;  // no visible keys: the consumers neither read Q nor wait for it
  // Tile n's K and V share a stage; pos is V's (tile n), the K load runs one position ahead.
  RingPosition<Cfg::kStages>& pos = st.kv;
  // values: the V ring (kHeadDimV columns), whose e4m3 tiles are V_t's.
  auto load = [&](auto values, const CUtensorMap* map, uint8_t* ring, uint64_t* empty, uint64_t* full, int n,
                  const RingPosition<Cfg::kStages>& at) {
    constexpr bool kValues = decltype(values)::value;
    constexpr int kTileBytes = kValues ? Cfg::kVTileBytes : Cfg::kKTileBytes;
    mbarrier_wait(&empty[at.index], at.phase ^ 1u);
    mbarrier_arrive_expect_tx(&full[at.index], kTileBytes);
    if constexpr (Cfg::kElemBytes == 1 && kValues) {
      // V_t (fp8_v_layout.h): kHeadDim rows of the tile's keys, one box per 128-key panel.
#pragma unroll
      for (int p = 0; p < Cfg::kBlockN / Cfg::kPanelElems; ++p)
        tma_load_4d(ring + at.index * kTileBytes + p * Cfg::kHeadDim * kSwizzleBytes, map,
                    w.vt_slot0 + n * Cfg::kBlockN + p * Cfg::kPanelElems, 0, kv_head, w.batch_coord,
                    &full[at.index]);
      return;
    }
    uint8_t* part = ring + at.index * kTileBytes + rank * Cfg::kKVPartRows * Cfg::kQKPanelBytes;
    const int row = w.k_row0 + n * Cfg::kBlockN + int(rank) * Cfg::kKVPartRows;
#pragma unroll
    for (int p = 0; p < (kValues ? Cfg::kHeadDimV / Cfg::kQKPanelElems : kQKPanels); ++p) {
      if constexpr (Cfg::kClusterCtas > 1)
        tma_load_4d_multicast(part + p * Cfg::kBlockN * Cfg::kQKPanelBytes, map, p * Cfg::kQKPanelElems, row, kv_head,
                              w.batch_coord, &full[at.index], uint16_t((1u << Cfg::kClusterCtas) - 1));
      else
        tma_load_4d(part + p * Cfg::kBlockN * Cfg::kQKPanelBytes, map, p * Cfg::kQKPanelElems, row, kv_head, w.batch_coord,
                    &full[at.index]);
    }
  };
  load(std::false_type{}, tm_k, sm.k(), sm.k_empty(), sm.k_full(), w.n_end - 1, pos);
  // Q's previous use has ended (a fresh barrier passes parity 1 at once).
  mbarrier_wait(sm.q_empty(), st.q_phase ^ 1u);
  mbarrier_arrive_expect_tx(sm.q_full(), Cfg::kQBytes);
#pragma unroll
  for (int p = 0; p < kQKPanels; ++p)
    tma_load_4d(sm.q() + p * Cfg::kBlockM * Cfg::kQKPanelBytes, tm_q, p * Cfg::kQKPanelElems, w.q_row0 + w.m_block * Cfg::kBlockM,
                w.head, w.batch_coord, sm.q_full());
  st.q_phase ^= 1u;
  for (int n = w.n_end - 1; n >= w.n_begin; --n) {
    RingPosition<Cfg::kStages> next = pos;
    next.advance();
    if (n > w.n_begin) load(std::false_type{}, tm_k, sm.k(), sm.k_empty(), sm.k_full(), n - 1, next);
    load(std::true_type{}, tm_v, sm.v(), sm.v_empty(), sm.v_full(), n, pos);
    pos = next;
  }
}

// ---- consumer: one warpgroup, 64 query rows ----
// The per-warpgroup state and the steps of one key tile; consume() below puts them in order.
// T: the inputs' element type (fp16, bf16 or e4m3: Fp8); TOut: O's (T, or fp16 / bf16 for e4m3 inputs).
// e4m3: S and P V in FP8 wgmma (V_t from shared memory, fp8_v_layout.h), the descales folded into the softmax's
// scale (Q's and K's) and the epilogue's normaliser (V's), P quantised as P · 2^kFp8POffsetLog2.
// kExtras: ALiBi's bias and dropout compiled in (a kernel of its own, so that the plain kernel's code stays as it
// was), in two copies: kDropout false runs ALiBi on every tile (the calls with ALiBi alone, whose code then stays
// what it was before dropout came: as one copy with run-time switches their forward was 3-12% slower), kDropout
// true drops and applies ALiBi where the call has slopes.
template <typename T, typename Cfg_, bool kExtras = false, bool kDropout = false, typename TOut = T>
struct Consumer {
  using Cfg = Cfg_;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kHeadDimV = Cfg::kHeadDimV;  // O's columns
  static constexpr int kN = Cfg::kBlockN;
  static constexpr bool kFp8 = kIsFp8<T>;
  static_assert(kFp8 == (Cfg::kElemBytes == 1), "sm90 forward: the plan's element size is T's");
  static_assert(!kFp8 || !kExtras, "sm90 forward: e4m3 runs without ALiBi and dropout");
  using Scores = float[kN / 2];                          // S (then P) of one tile: accumulator layout
  using PFragments = uint32_t[kN / kWgmmaKFor<T>][4];    // P as the A operand of P V, one wgmma's keys each
  // e4m3: P is quantised as P · 2^kFp8POffsetLog2, so that its small values keep e4m3's normal range (down to
  // 2^-6 / 2^kFp8POffsetLog2 instead of 2^-6) instead of flushing: the row sums carry the same factor, the
  // normaliser cancels it, and the LSE takes it off. The running maximum may lag by Cfg::kFp8StaleLog2 (P at most
  // 2^kFp8StaleLog2 before the factor), so P · 2^kFp8POffsetLog2 stays at most 2^8 = 256 < 448, e4m3's largest.
  static constexpr float kStaleLog2 = kFp8 ? float(Cfg::kFp8StaleLog2) : kStaleMaxLog2;
  static constexpr float kFp8POffsetLog2 = 8.f - float(Cfg::kFp8StaleLog2);

  const SharedStorage<Cfg>& sm;
  const BlockWork& w;
  const ForwardKernelArgs& a;
  int lane, quad;
  int row[2];  // this thread's two rows (accumulator layout), relative to the sequence start
  int key_lo[2], key_hi[2];  // their visible keys (lengths fit in int: sm90_forward_supports)
  int full_lo, full_hi;      // key tiles [full_lo, full_hi) are visible to every row of the tile: no mask
  // Descriptors of this warpgroup's Q rows and of stage 0's K and V tiles; every operand of a wgmma is one
  // desc_advance from these.
  uint64_t q_desc, k_desc, v_desc;
  float o[kHeadDimV / 2];
  float row_max[2] = {-INFINITY, -INFINITY};  // in score units (after softcap), not yet scaled to log2
  float row_sum[2] = {0.f, 0.f};              // this thread's part; the quad's four parts add up at the end
  bool has_slopes = false;  // the call has ALiBi slopes (has_alibi)
  float alibi_slope_u = 0.f;  // ALiBi: the slope in score units (S's, before the scale)
  int alibi_diag[2] = {0, 0}; // ALiBi: the rows' diagonals, row + s_k - s_q
  int alibi_warp_diag0 = 0;   // ALiBi: the diagonal of the warp's first row
  DropoutSpec dropout;        // kExtras: inactive unless the call asks for dropout
  float keep_scale = 1.f;     // dropout: 1 / (1 - p), applied to O in the epilogue
  // e4m3: the softmax's scale and softcap's input scale with Q's and K's descales folded in, and V's descale.
  float fp8_scale_log2 = 0.f, fp8_softcap_in_scale = 0.f, fp8_v_scale = 1.f;

  // Where the descales are not folded in (16-bit inputs) these stay the kernel arguments, so that no register
  // holds a copy.
  __device__ float scale_log2() const {
    if constexpr (kFp8) return fp8_scale_log2;
    return a.scale_log2;
  }
  __device__ float softcap_in_scale() const {
    if constexpr (kFp8) return fp8_softcap_in_scale;
    return a.softcap_in_scale;
  }

  __device__ Consumer(const SharedStorage<Cfg>& sm_, const BlockWork& w_, const ForwardKernelArgs& a_, int wg)
      : sm(sm_), w(w_), a(a_) {
    const int t = threadIdx.x % kWarpgroupThreads;
    const int warp = t / 32;
    lane = t % 32;
    quad = lane % 4;
    row[0] = w.m_block * Cfg::kBlockM + wg * kWgmmaRows + 16 * warp + lane / 4;
    row[1] = row[0] + 8;
    for (int r = 0; r < 2; ++r) {
      w.mask.key_range(row[r], &key_lo[r], &key_hi[r]);
    }
    if constexpr (kFp8) {
      // Descale of (sequence, KV head); absent: 1.
      const int kv_head = w.head / a.heads_per_kv;
      auto descale = [&](const float* d, const int64_t* strides) {
        return d ? d[int64_t(w.batch) * strides[0] + int64_t(kv_head) * strides[1]] : 1.f;
      };
      const float qk = descale(a.q_descale, a.q_descale_strides) * descale(a.k_descale, a.k_descale_strides);
      // Softcap takes the scores at softmax_scale (then scale_log2 is log2 e); without it the scale is folded in.
      fp8_scale_log2 = a.softcap > 0.f ? a.scale_log2 : a.scale_log2 * qk;
      fp8_softcap_in_scale = a.softcap_in_scale * qk;
      fp8_v_scale = descale(a.v_descale, a.v_descale_strides);
    }
    has_slopes = a.alibi_slopes != nullptr;
    if (has_alibi()) {
      const Alibi32 bias = Alibi32::make(a.alibi_slopes, a.alibi_batch_stride, w.batch, w.head, w.seqlen_q, w.seqlen_k);
      // S's unit is worth scale_log2 / log2e natural-log units (softmax_scale, or 1 under softcap).
      alibi_slope_u = bias.slope_log2() / scale_log2();
      for (int r = 0; r < 2; ++r) alibi_diag[r] = row[r] + bias.shift;
      alibi_warp_diag0 = row[0] - lane / 4 + bias.shift;
    }
    if constexpr (kDropout) {
      dropout = DropoutSpec::make(a.dropout_p, a.dropout_rng, w.batch, w.head);
      if (dropout.active()) keep_scale = 1.f / (1.f - a.dropout_p);
    }
    // Both edges of the visible band move right with the row, so the keys every row of the tile sees are
    // [first key of the last row, end of the first row's keys); a key tile inside that needs no mask. The
    // end is at most seqlen_k, so the tile holding the end of the keys is masked too. A block past the sequence's
    // end (in a cluster, the other CTA's block has rows) counts as one row: its rows are never written.
    const int row_begin = w.m_block * Cfg::kBlockM;
    const int row_end = min(row_begin + Cfg::kBlockM, max(w.seqlen_q, row_begin + 1));
    int lo_first, hi_first, lo_last, hi_last;
    w.mask.key_range(row_begin, &lo_first, &hi_first);
    w.mask.key_range(row_end - 1, &lo_last, &hi_last);
    full_lo = (lo_last + kN - 1) / kN;
    full_hi = hi_first / kN;
    q_desc = make_desc_k_major_rows<Cfg::kQKPanelBytes>(smem_address(sm.q()) + wg * kWgmmaRows * Cfg::kQKPanelBytes);
    k_desc = make_desc_k_major_rows<Cfg::kQKPanelBytes>(smem_address(sm.k()));
    // V_t (e4m3) is K-major, V N-major.
    v_desc = kFp8 ? make_desc_k_major(smem_address(sm.v())) : make_desc_mn_major(smem_address(sm.v()), kN * kSwizzleBytes);
#pragma unroll
    for (int i = 0; i < kHeadDimV / 2; ++i) o[i] = 0.f;
  }

  // S = Q Kᵀ, issued and committed (not waited for). K-major operands; k-step kk (32 bytes of a row, 16-bit or
  // e4m3 alike) is panel kk / kSteps, 32 bytes further per step inside a row.
  __device__ void issue_qk(Scores& s, int stage) {
    constexpr int kSteps = Cfg::kQKPanelBytes / 32;  // k-steps per panel
    const uint64_t k_stage = desc_advance(k_desc, stage * Cfg::kKTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kWgmmaKFor<T>; ++kk) {
      const uint32_t step = (kk % kSteps) * 32;
      wgmma_ss<T, kN, 0>(s, desc_advance(q_desc, (kk / kSteps) * Cfg::kBlockM * Cfg::kQKPanelBytes + step),
                         desc_advance(k_stage, (kk / kSteps) * kN * Cfg::kQKPanelBytes + step), kk > 0);
    }
    wgmma_commit();
  }

  // O += P V, issued and committed. V is N-major: one panel (kN rows) per 64 columns of head dim. P is
  // converted before the fence: a register write between two wgmmas would make the compiler serialise them.
  // e4m3: V_t is K-major, kHeadDim rows per 128-key panel; k-step kk is panel kk / 4, 32 bytes further per step.
  __device__ void issue_pv(const PFragments& p, int stage) {
    const uint64_t v_stage = desc_advance(v_desc, stage * Cfg::kVTileBytes);
    wgmma_fence();
    if constexpr (kFp8) {
#pragma unroll
      for (int kk = 0; kk < kN / kWgmmaKFor<T>; ++kk)
        wgmma_rs<T, kHeadDim, 0>(o, p[kk], desc_advance(v_stage, (kk / 4) * kHeadDim * kSwizzleBytes + (kk % 4) * 32),
                                 true);
    } else {
#pragma unroll
      for (int kk = 0; kk < kN / kWgmmaK; ++kk)
        wgmma_rs<T, kHeadDimV, 1>(o, p[kk], desc_advance(v_stage, kk * kWgmmaK * kSwizzleBytes), true);
    }
    wgmma_commit();
  }

  // ALiBi's bias runs in the extras kernel: on every tile in its ALiBi copy (kDropout false, only ALiBi calls
  // run it), where the call has slopes in its dropout copy.
  __device__ bool has_alibi() const { return kExtras && (!kDropout || has_slopes); }

  // Softcap, ALiBi's bias (has_alibi), then the mask (only on tiles that cross a mask edge or the end of the keys).
  // ALiBi: score (j, e) sits at row e / 2, key n·kN + 2·quad + 8j + e % 2, at distance base[row] - c from the
  // row's diagonal (c = 8j + e % 2). On a tile whose keys all lie on one side of every diagonal of the warp's rows
  // (most tiles: all of them under a causal mask) the bias -slope·|base - c| is linear in c: s gets slope·c (one
  // FFMA with an immediate per score, sign by side) and `shift` the row's rest, -(±slope)·base, which the softmax
  // adds per row. Tiles that cross a diagonal take |·| per score (two instructions) and a zero shift.
  __device__ void transform_scores(Scores& s, int n, float (&shift)[2]) {
    if (a.softcap > 0.f) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i)
        s[i] = scaled_tanh(tanh_parts(s[i] * (softcap_in_scale() * kTanhExp2)), a.softcap);
    }
    if (has_alibi()) {
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) base[r] = float(alibi_diag[r] - (n * kN + 2 * quad));
      // Warp-uniform: the warp's 16 rows have diagonals [warp_diag0, warp_diag0 + 15].
      const int first_key = n * kN, last_key = n * kN + kN - 1;
      const bool keys_left = last_key <= alibi_warp_diag0, keys_right = first_key >= alibi_warp_diag0 + 15;
      if (keys_left || keys_right) {
        const float slope = keys_left ? alibi_slope_u : -alibi_slope_u;
#pragma unroll
        for (int r = 0; r < 2; ++r) shift[r] = -slope * base[r];
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[4 * j + e] = fmaf(slope, float(8 * j + (e & 1)), s[4 * j + e]);
      } else {
        shift[0] = shift[1] = 0.f;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[4 * j + e] = fmaf(-alibi_slope_u, fabsf(base[e >> 1] - float(8 * j + (e & 1))), s[4 * j + e]);
      }
    }
    if (n >= full_lo && n < full_hi) return;
    // The bounds are taken relative to this lane's first key in the tile, so that each score compares them with
    // its column's compile-time offset: one ISETP with an immediate per bound and a FSEL (the key's own add and
    // a compare per bound and row cost 3.5 instructions per score). A causal mask has no lower bound inside the
    // tile: one compare per score.
    const int first_key = n * kN + 2 * quad;
    int lo[2], hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) lo[r] = key_lo[r] - first_key, hi[r] = key_hi[r] - first_key;
    auto mask = [&](auto with_lower_bound) {
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int column = 8 * j + (e & 1);
          if ((with_lower_bound && column < lo[e >> 1]) || column >= hi[e >> 1]) s[4 * j + e] = -INFINITY;
        }
    };
    if (lo[0] <= 0 && lo[1] <= 0)
      mask(std::false_type{});
    else
      mask(std::true_type{});
  }

  // Online softmax: raises the running maxima, turns S into P in place, updates the row sums and returns in
  // `rescale` the factor O must still be multiplied by. A row whose maximum is still -inf (nothing visible yet)
  // subtracts 0, so exp2(-inf) = 0 and the factor exp2(-inf) = 0 clears nothing that was not already 0.
  // A running maximum is raised only once the tile's maximum exceeds it by more than 2^kStaleMaxLog2 in P's
  // units (forward_config.h); until then P is taken against the stale maximum (at most 2^kStaleMaxLog2, which
  // 16-bit P holds at full relative precision) and the factor is 1. O and the row sum share that maximum, so
  // the result is the same softmax; the epilogue's LSE uses it too. Past the first tiles the maxima rarely move
  // that far, so rescale_o can skip its multiplies.
  // ALiBi: the true scores of row r are s + shift[r] (transform_scores; 0 without ALiBi).
  __device__ void softmax(Scores& s, float (&rescale)[2], const float (&shift)[2]) {
    // The two rows' chains run side by side (r innermost), each split four ways, and the quad shuffles of both
    // rows are in flight together: with two consumer warps per scheduler, the softmax's own independent work
    // is what hides ALU and shuffle latency (ncu: "wait" was the largest stall, bench/results/hopper-forward.md,
    // bea5ed7, e4177d3).
    float mx4[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx4[r][0] = kExtras ? row_max[r] - shift[r] : row_max[r];
      mx4[r][1] = mx4[r][2] = mx4[r][3] = -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        mx4[r][j % 4] = fmaxf(mx4[r][j % 4], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    float mx[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(fmaxf(mx4[r][0], mx4[r][1]), fmaxf(mx4[r][2], mx4[r][3]));
      if constexpr (kExtras) mx[r] = fmaxf(mx[r] + shift[r], row_max[r]);  // the shift differs across the quad
    }
#pragma unroll
    for (int lane_mask = 1; lane_mask < 4; lane_mask *= 2)
#pragma unroll
      for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], lane_mask));
    float neg_base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // mx[r] >= row_max[r]: the running maximum seeded the reduction.
      const bool raise = row_max[r] == -INFINITY || (mx[r] - row_max[r]) * scale_log2() > kStaleLog2;
      const float m = raise ? mx[r] : row_max[r];
      neg_base[r] = m == -INFINITY ? 0.f : -m * scale_log2();
      rescale[r] = raise ? exp2_approx(fmaf(row_max[r], scale_log2(), neg_base[r])) : 1.f;
      row_max[r] = m;
      if constexpr (kExtras) neg_base[r] = m == -INFINITY ? 0.f : (shift[r] - m) * scale_log2();
      if constexpr (kFp8) neg_base[r] += kFp8POffsetLog2;
    }
    float sum4[2][4] = {};
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // One FFMA and one exp2 (MUFU.EX2) per score: exp(scale·s - scale·m) = 2^(s·scale·log2e - m·scale·log2e).
        const float p0 = exp2_approx(fmaf(s[4 * j + 2 * r], scale_log2(), neg_base[r]));
        const float p1 = exp2_approx(fmaf(s[4 * j + 2 * r + 1], scale_log2(), neg_base[r]));
        s[4 * j + 2 * r] = p0;
        s[4 * j + 2 * r + 1] = p1;
        sum4[r][j % 4] += p0 + p1;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      row_sum[r] = fmaf(row_sum[r], rescale[r], (sum4[r][0] + sum4[r][1]) + (sum4[r][2] + sum4[r][3]));
  }

  // Dropout on key tile n's P (kExtras): the dropped probabilities become 0 after the row sums took them (the LSE
  // is the undropped one); the kept ones' factor 1 / (1 - p) waits for the epilogue. The lane's keys of a 32-key
  // span (2·quad and 2·quad + 1 of each 8-key column block) are one Philox group (common/dropout.h): one call per
  // row and span. Tiles start on multiples of 16 keys, so kPhase = (the tile's first key / 8) % 4 is 0 or 2, and
  // each column block's span and slots are compile-time offsets from the tile's first span.
  // Run once the previous tile's P V has landed (consume): drawn earlier, under the S wait, the Philox state beside
  // S, O and the P fragments in flight spilled (hd 128's 176-key tiles, hd 64's 160-register consumers).
  template <int kPhase>
  __device__ void drop_tile(Scores& s, int n) const {
    constexpr int kSpans = (8 * kPhase + kN + 31) / 32;
    const uint32_t span0 = uint32_t(n * kN) >> 5;
#pragma unroll
    for (int span = 0; span < kSpans; ++span)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t slots = dropout.kept_slots(row[r], (span0 + uint32_t(span)) << 2 | uint32_t(quad));
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int j = 4 * span + t - kPhase;  // the column block whose keys are slots 2t, 2t + 1
          if (j < 0 || j >= kN / 8) continue;
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (!(slots >> (2 * t + e) & 1u)) s[4 * j + 2 * r + e] = 0.f;
        }
      }
  }
  __device__ void drop_tile(Scores& s, int n) const {
    if (!kDropout || !dropout.active()) return;
    if (kN % 32 == 0 || (n * kN) % 32 == 0)
      drop_tile<0>(s, n);
    else
      drop_tile<2>(s, n);
  }

  // Warp-uniform skip: the multiplies run only if a row of this warp raised its maximum (softmax).
  __device__ void rescale_o(const float (&rescale)[2]) {
    if (!__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) return;
#pragma unroll
    for (int j = 0; j < kHeadDimV / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= rescale[e >> 1];
  }

  __device__ static void to_fragments(PFragments& p, const Scores& s) {
#pragma unroll
    for (int kk = 0; kk < kN / kWgmmaKFor<T>; ++kk) {
      if constexpr (kFp8)
        accumulator_to_a_fragment_fp8(p[kk], s, kk);
      else
        accumulator_to_a_fragment<T>(p[kk], s, kk);
    }
  }

  // A buffer this warp read through wgmma is free: one arrival per warp (the wgmma reads completed for the whole
  // warpgroup once this warp's wait returned).
  __device__ void release(uint64_t* empty) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty);
  }
  // A K / V slot is filled by every CTA of the cluster (produce): its release reaches each CTA's barrier.
  __device__ void release_kv(uint64_t* empty) {
    if constexpr (Cfg::kClusterCtas == 1) return release(empty);
    __syncwarp();
    if (lane == 0)
      for (uint32_t r = 0; r < uint32_t(Cfg::kClusterCtas); ++r)
        mbarrier_arrive_cluster_after_reads(cluster_shared_address(empty, r));
  }
  __device__ void release_k(int stage) { release_kv(&sm.k_empty()[stage]); }
  __device__ void release_v(int stage) { release_kv(&sm.v_empty()[stage]); }
  // The tile's last S has landed: Q is no longer read.
  __device__ void release_q() { release(sm.q_empty()); }

  // Waits for every product in flight (the last is P V from V stage `stage`) and frees that V.
  __device__ void land_pv(int stage) {
    wgmma_wait<0>();
    fence_registers(o);
    release_v(stage);
  }

  // Key tile n's S was issued from K stage `stage`, then kLater more commit groups (P V): waits for S, frees K
  // (and Q after the block's last S, last_s), applies softcap and mask and the online softmax.
  template <int kLater>
  __device__ void land_scores(Scores& s, int n, int stage, bool last_s, float (&rescale)[2]) {
    wgmma_wait<kLater>();
    fence_registers(s);
    release_k(stage);
    if (last_s) release_q();
    float shift[2] = {0.f, 0.f};
    transform_scores(s, n, shift);
    softmax(s, rescale, shift);
  }

  // Normalise, write O and the LSE of the rows inside the sequence. O leaves in 16-byte runs: the quad's four
  // lanes swap their 4-byte column pairs (quad_transpose) so that each lane holds 8 consecutive columns, and a
  // warp's store writes whole 32-byte sectors (8 rows x 64 bytes) instead of 8 rows x 16 bytes. The 4-byte
  // stores wrote 4x the sectors and left the epilogue at 13-16% of the consumers' time at causal 2k (hd 128, 256;
  // ~9% after; bench/results/hopper-forward.md, 9eba035). Rows start 16-byte aligned (sm90_forward_supports: strides a
  // multiple of 8 elements, 16-byte aligned base). The LSE takes log2 from the special-function unit (absolute error
  // ~1e-7, against the 1e-3 the tests allow).
  __device__ void epilogue() {
    constexpr float kLn2 = 0.69314718055994530942f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // A row that saw no key has maximum -inf and sum 0.
      const bool empty = row_max[r] == -INFINITY;
      const float total = quad_sum(row_sum[r]);
      // Correctly rounded, without division's slow path; dropout's kept probabilities count 1 / (1 - p).
      const float inv = empty      ? 0.f
                        : kDropout ? __frcp_rn(total) * keep_scale
                        : kFp8     ? __frcp_rn(total) * fp8_v_scale
                                   : __frcp_rn(total);
      const bool inside = row[r] < w.seqlen_q;
      const int64_t grow = int64_t(w.q_row0) + row[r];
      TOut* out = static_cast<TOut*>(a.o) + grow * a.o_row_stride + int64_t(w.head) * a.o_head_stride +
               (a.cu_seqlens_q ? 0 : int64_t(w.batch) * a.o_batch_stride);
#pragma unroll
      for (int g = 0; g < kHeadDimV / 32; ++g) {  // 32 columns: 4 column blocks of 8, one per lane after
        uint32_t words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * g + i;
          words[i] = pack_pair<TOut>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        }
        quad_transpose(words, quad);  // every lane, inside the sequence or not
        const int col = 8 * (4 * g + quad);
        if (inside && col < a.head_dim_v)  // columns past d_v hold P·0 (V's zero-filled columns)
          *reinterpret_cast<uint4*>(out + col) = make_uint4(words[0], words[1], words[2], words[3]);
      }
      if (!inside) continue;
      if (a.lse && quad == 0) {
        const float log2_sum = kFp8 ? __log2f(total) - kFp8POffsetLog2 : __log2f(total);
        const float lse = empty ? -INFINITY : (row_max[r] * scale_log2() + log2_sum) * kLn2;
        float* dst = a.cu_seqlens_q ? a.lse + int64_t(w.head) * a.lse_head_stride + grow
                                    : a.lse + int64_t(w.batch) * a.lse_batch_stride +
                                          int64_t(w.head) * a.lse_head_stride + row[r];
        *dst = lse;
      }
    }
  }
};

// Turns of the consumer warpgroups (round robin): each issues its matrix products only in its turn, so one
// warpgroup's softmax runs while the others' products occupy the tensor cores. One token circulates: a
// warpgroup waits on its own named barrier and, after issuing, arrives on the next warpgroup's; each barrier
// phase is 128 waiting + 128 arriving threads. Plans whose warpgroups issue freely (IssueOrder::free), and a
// single consumer warpgroup (another CTA or the CTA's other pipelines share the SM, and their products fill the
// tensor cores instead), skip both.
template <typename Cfg>
__device__ __forceinline__ void wait_turn(int wg) {
  if constexpr (Cfg::kTakeTurns) named_barrier_sync(kTurnBarrier0 + wg, 2 * kWarpgroupThreads);
}
template <typename Cfg>
__device__ __forceinline__ void pass_turn(int wg) {
  if constexpr (Cfg::kTakeTurns)
    named_barrier_arrive(kTurnBarrier0 + (wg + 1) % Cfg::kConsumerWarpgroups, 2 * kWarpgroupThreads);
}

// The consumers' order (941cb61-17568a4, FlashAttention-3's: intra-warpgroup overlap and turns): the products of tile n,
// S_n = Q K_nᵀ and O += P_{n+1} V_{n+1} (the previous tile; keys run downwards), are issued in one turn, with
// O's rescale by the previous softmax in between (it runs under S_n instead of delaying the next issue). The
// softmax of S_n then runs while P V is still on the tensor cores. K_n is released as soon as S_n has landed
// and V_{n+1} after its product, so a 2-stage ring refills K one iteration before it is needed.
// The turn token starts at warpgroup 0 (the kernel passes it once, before the first tile); every warpgroup
// takes key tiles + 1 turns per tile, so each tile starts with the token at warpgroup 0 again.
template <typename C>
__device__ void consume(C& c, int wg, PipelineState<C::Cfg::kStages>& st) {
  const BlockWork& w = c.w;
  if (w.n_end <= w.n_begin) return;
  mbarrier_wait(c.sm.q_full(), st.q_phase);
  st.q_phase ^= 1u;
  RingPosition<C::Cfg::kStages>& pos = st.kv;
  typename C::Scores s;
  typename C::PFragments p;
  float rescale[2];
  // First tile: S only.
  mbarrier_wait(&c.sm.k_full()[pos.index], pos.phase);
  wait_turn<typename C::Cfg>(wg);
  c.issue_qk(s, pos.index);
  pass_turn<typename C::Cfg>(wg);
  // O is still 0: its rescale (by 0) is harmless.
  c.template land_scores<0>(s, w.n_end - 1, pos.index, w.n_end - 1 == w.n_begin, rescale);
  c.drop_tile(s, w.n_end - 1);
  C::to_fragments(p, s);
  int prev = pos.index;
  uint32_t prev_phase = pos.phase;
  pos.advance();
  for (int n = w.n_end - 2; n >= w.n_begin; --n) {
    mbarrier_wait(&c.sm.k_full()[pos.index], pos.phase);
    mbarrier_wait(&c.sm.v_full()[prev], prev_phase);
    wait_turn<typename C::Cfg>(wg);
    c.issue_qk(s, pos.index);
    c.rescale_o(rescale);
    c.issue_pv(p, prev);
    pass_turn<typename C::Cfg>(wg);
    // S_n lands (groups complete in order); P V may still run.
    c.template land_scores<1>(s, n, pos.index, n == w.n_begin, rescale);
    c.land_pv(prev);
    c.drop_tile(s, n);
    C::to_fragments(p, s);
    prev = pos.index;
    prev_phase = pos.phase;
    pos.advance();
  }
  // Last tile's P V.
  mbarrier_wait(&c.sm.v_full()[prev], prev_phase);
  wait_turn<typename C::Cfg>(wg);
  c.rescale_o(rescale);
  c.issue_pv(p, prev);
  pass_turn<typename C::Cfg>(wg);
  c.land_pv(prev);
}

}  // namespace flashattn::cuda::sm90
