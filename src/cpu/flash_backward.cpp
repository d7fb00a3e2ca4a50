// CPU flash backward: dQ, dK, dV by recomputation. For each (query block, key block) tile of a head:
//   S = Q · (Kᵀ · scale · log2e)         (softcap: c·log2e·tanh(Q · Kᵀ · scale / c)); mask on partial tiles
//   P = exp2(S + B - LSE · log2e)         (B: the ALiBi bias, kept apart from S for softcap's derivative; P is
//                                          never stored beyond the tile)
//   dP = dO · Vᵀ,   dS = P ∘ (Z ∘ dP - D) · scale  (∘ (1 - tanh²) with softcap),   D = rowsum(dO ∘ O)
//   dV += (P ∘ Z)ᵀ dO,    dK += dSᵀ Q,    dQ += dS K
// (Z: dropout's factors, 1 / (1 - p) where kept and 0 where dropped, regenerated from the seed; 1 without dropout)
// five register-blocked products per tile (micro_gemm.h), the transposed uses of P and dS read through strides.
// bf16 at the avx512_bf16 level: all five on AVX-512 BF16 pair dot products (gemm_bf16_pairs: exact products, fp32
// sums). S and dP take the inputs themselves; dV, dK, dQ take P ∘ Z and dS rounded to bf16, as the GPU kernels
// do (the tests' naive rounds them too at that level); query tiles then start on even rows so that a tile's pairs
// of queries are pairs of the head's rows.
//
// Work split, chosen so that the result is bitwise identical whatever the number of threads: a task owns one
// (batch, KV head), or a fixed part of it when there are fewer than kBackwardMinTasks such units:
//  - first its query heads are split into parts (each part sums dK/dV over its heads into a partial buffer),
//  - then, once every part is a single head, its key blocks are split into chunks of equal work (each chunk
//    adds its contribution to dQ into a partial buffer).
// A task walks its key blocks in order, and for each one the query blocks that can see it
// (MaskSpec::query_range_for_keys), accumulating dK/dV of the block in its own buffer and dQ of the head in a
// per-head buffer. Partial buffers are then summed in part / chunk order (a second parallel pass). The split
// depends only on the shapes, never on the thread count, and every sum has a fixed order.
//
// Extra memory: per thread, the query side of one head in fp32 (Q, dO, dQ: s_q · (2d + d_v)), dK/dV of one
// key chunk (≤ s_k · (d + d_v)) and tile buffers; partial buffers only for small batch·heads, bounded by
// kBackwardMinTasks · s · (d + d_v). All O(s) per (batch, head); nothing is O(s_q · s_k).
//
// fp64: the LSE input is fp32, which would cap fp64 gradients at fp32 accuracy, so the fp64 path recomputes
// each row's LSE in fp64 from Q and K (one more Q·Kᵀ per tile) instead of reading it.
// Preconditions: params validated (make_backward_params); CPU tensors.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend.h"
#include "common/mask.h"
#include "common/softmax_state.h"
#include "cpu/sequence.h"

// See flash_forward.cpp: 512-bit vectors for the micro-kernels on AVX-512 cores.
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif

#include "cpu/attention_tile.h"
#include "cpu/micro_gemm.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/vec_math.h"

namespace flashattn::detail {
namespace {

struct BackwardTask {
  int64_t batch, kv_head;
  int64_t part, head_begin, head_end;  // query heads (within the group) whose dK/dV contributions it sums
  int64_t chunk, key_begin, key_end;   // key rows it owns
};

// How the call is cut into tasks, and where partial sums live.
struct BackwardPlan {
  int64_t group = 1;       // query heads per KV head
  int64_t head_parts = 1;  // > 1: dK/dV partials per part, summed afterwards
  std::vector<int64_t> key_chunks;  // per batch; > 1: dQ partials per chunk, summed afterwards
  std::vector<BackwardTask> tasks;
  std::vector<int64_t> dq_partial_at, dkv_partial_at;  // per (batch, KV head): offset, or -1 when not split
  int64_t dq_partial_size = 0, dkv_partial_size = 0;
};

template <typename Acc>
BackwardPlan make_plan(const BwdParams& p) {
  using C = CpuTiles<Acc>;
  BackwardPlan plan;
  plan.group = p.heads_q / p.heads_kv;
  const int64_t dp = round_up(p.head_dim, C::kVec), dvp = round_up(p.head_dim_v, C::kVec);
  const int64_t units = p.batch * p.heads_kv;
  const int64_t want = units >= C::kBackwardMinTasks ? 1 : (C::kBackwardMinTasks + units - 1) / std::max<int64_t>(units, 1);
  plan.head_parts = std::min(plan.group, want);
  const int64_t chunks_wanted = plan.head_parts == plan.group ? (want + plan.group - 1) / plan.group : 1;

  plan.key_chunks.assign(size_t(p.batch), 1);
  plan.dq_partial_at.assign(size_t(units), -1);
  plan.dkv_partial_at.assign(size_t(units), -1);
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceExtent ext = sequence_extent(p, b);
    const MaskSpec mask = sequence_mask(p, ext);
    const int64_t blocks = (ext.len_k + C::kBlockK - 1) / C::kBlockK;
    const int64_t chunks = std::max<int64_t>(1, std::min(chunks_wanted, blocks));
    plan.key_chunks[size_t(b)] = chunks;

    // Chunk boundaries (in key blocks) splitting the work evenly: a block costs the query rows that see it.
    std::vector<int64_t> bounds(size_t(chunks + 1), blocks);
    bounds[0] = 0;
    if (chunks > 1) {
      std::vector<int64_t> prefix(size_t(blocks + 1), 0);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        int64_t lo, hi;
        mask.query_range_for_keys(kb * C::kBlockK, std::min((kb + 1) * C::kBlockK, ext.len_k), &lo, &hi);
        prefix[size_t(kb + 1)] = prefix[size_t(kb)] + (hi - lo) + 1;
      }
      int64_t kb = 0;
      for (int64_t c = 1; c < chunks; ++c) {
        const int64_t target = prefix[size_t(blocks)] * c / chunks;
        while (kb < blocks && prefix[size_t(kb)] < target) ++kb;
        bounds[size_t(c)] = kb;
      }
    }

    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const size_t unit = size_t(b * p.heads_kv + hk);
      if (chunks > 1) {
        plan.dq_partial_at[unit] = plan.dq_partial_size;
        plan.dq_partial_size += chunks * plan.group * ext.len_q * dp;
      }
      if (plan.head_parts > 1) {
        plan.dkv_partial_at[unit] = plan.dkv_partial_size;
        plan.dkv_partial_size += plan.head_parts * ext.len_k * (dp + dvp);
      }
      for (int64_t part = 0; part < plan.head_parts; ++part) {
        for (int64_t c = 0; c < chunks; ++c) {
          BackwardTask t;
          t.batch = b;
          t.kv_head = hk;
          t.part = part;
          t.head_begin = plan.group * part / plan.head_parts;
          t.head_end = plan.group * (part + 1) / plan.head_parts;
          t.chunk = c;
          t.key_begin = std::min(bounds[size_t(c)] * C::kBlockK, ext.len_k);
          t.key_end = std::min(bounds[size_t(c + 1)] * C::kBlockK, ext.len_k);
          plan.tasks.push_back(t);
        }
      }
    }
  }
  return plan;
}

// Per-thread buffers, sized once per call for the longest sequence.
template <typename Acc>
struct BackwardScratch {
  AlignedBuffer<Acc> q, dout, dq, lse2, dsum;  // query side of one head
  AlignedBuffer<Acc> dk, dv;                   // dK / dV of one key chunk
  AlignedBuffer<Acc> kt, vt, krow, s, prob, ds, keep, m, l;  // keep: dropout's factors Z of a tile
  // bf16 with pair products (kBf16PairProducts): Q and dO of one head, K and V of a key block, in pairs along the
  // head dim (S, dP); Q and dO in pairs of rows (dK's and dV's B operands), the key block's K in pairs of keys
  // (dQ's), and a tile's P and dS, rounded to bf16: Pᵀ and dSᵀ in pairs of queries, dS in pairs of keys.
  AlignedBuffer<uint32_t> q_pairs, dout_pairs, k_pairs, v_pairs;
  AlignedBuffer<uint32_t> q_row_pairs, dout_row_pairs, k_row_pairs, pt_pairs, dst_pairs, ds_pairs;
  // D of kVec rows at a time (row_sums_of_products): their O rows transposed (in pairs for bf16 pair products),
  // and the kVec x kVec products.
  AlignedBuffer<uint32_t> o_pairs;
  AlignedBuffer<Acc> ot, d_tile;
  // Row strides of Q, dO and the K rows: micro-kernel B operands, padded (tile_config.h); of the pairs.
  int64_t ldq, lddo, ldk, ldq_pairs, lddo_pairs;

  BackwardScratch(const BwdParams& p) {
    using C = CpuTiles<Acc>;
    const int64_t dp = round_up(p.head_dim, C::kVec), dvp = round_up(p.head_dim_v, C::kVec);
    const int64_t rows = std::max<int64_t>(p.seqlen_q, 1), keys = std::max<int64_t>(round_up(p.seqlen_k, C::kBlockK), 1);
    ldq = ldk = b_operand_ld(p.head_dim, sizeof(Acc));
    lddo = b_operand_ld(p.head_dim_v, sizeof(Acc));
    q.resize(rows * ldq);
    dout.resize(rows * lddo);
    dq.resize(rows * dp);
    lse2.resize(rows);
    dsum.resize(rows);
    dk.resize(keys * dp);
    dv.resize(keys * dvp);
    kt.resize(p.head_dim * C::kBlockK);
    vt.resize(p.head_dim_v * C::kBlockK);
    krow.resize(std::max(C::kBlockK * ldk, dp + dvp));  // also the reduction passes' row buffer
    for (auto* b : {&s, &prob, &ds, &keep}) b->resize(C::kBlockQ * C::kBlockK);
    m.resize(C::kBlockQ);
    l.resize(C::kBlockQ);
    ldq_pairs = (p.head_dim + 1) / 2;
    lddo_pairs = (p.head_dim_v + 1) / 2;
    if (kBf16PairProducts && p.dtype == DType::bf16) {
      q_pairs.resize(rows * ldq_pairs);
      dout_pairs.resize(rows * lddo_pairs);
      k_pairs.resize(ldq_pairs * C::kBlockK);
      v_pairs.resize(lddo_pairs * C::kBlockK);
      q_row_pairs.resize((rows + 1) / 2 * dp);
      dout_row_pairs.resize((rows + 1) / 2 * dvp);
      k_row_pairs.resize(C::kBlockK / 2 * dp);
      for (auto* b : {&pt_pairs, &dst_pairs, &ds_pairs}) b->resize(C::kBlockQ * C::kBlockK / 2);
      o_pairs.resize(lddo_pairs * C::kVec);
    }
    ot.resize(p.head_dim_v * C::kVec);
    d_tile.resize(C::kVec * C::kVec);
  }
};

// D = rowsum(dO ∘ O) of `rows` rows (dO from the task's buffers w.dout / w.dout_pairs, O from the output), by the
// very product routine and operands dP = dO · Vᵀ takes, so that D equals dP_j bitwise where O = V_j (a row whose
// probability sits on one key, the first row under causal among them): its dS is then exactly 0, as the softmax's
// derivative says, not a rounding difference of two summation orders. kVec rows at a time: their O rows
// transposed as a B operand, the diagonal of dO · Oᵀ kept (the rest of the small product is discarded; it costs
// what a row-by-row dot product would).
template <typename T, typename Acc>
void row_sums_of_products(const T* o, int64_t o_rs, int64_t rows, int64_t dv, BackwardScratch<Acc>& w, Acc* dsum) {
  constexpr int64_t kV = CpuTiles<Acc>::kVec;
  constexpr bool kPairs = std::is_same_v<T, bfloat16_t> && kBf16PairProducts;
  Acc* d_tile = w.d_tile.data();
  for (int64_t i0 = 0; i0 < rows; i0 += kV) {
    const int64_t n = std::min(kV, rows - i0);
    if constexpr (kPairs) {
      load_transposed_pairs(o + i0 * o_rs, o_rs, n, dv, w.o_pairs.data(), kV, kV);
      gemm_bf16_pairs(n, kV, w.lddo_pairs, w.dout_pairs.data() + i0 * w.lddo_pairs, w.lddo_pairs, 1,
                      w.o_pairs.data(), kV, d_tile, kV, GemmMode::overwrite);
    } else {
      load_transposed(o + i0 * o_rs, o_rs, n, dv, w.ot.data(), kV, kV);
      gemm<Acc>(n, kV, dv, w.dout.data() + i0 * w.lddo, w.lddo, 1, w.ot.data(), kV, d_tile, kV, GemmMode::overwrite);
    }
    for (int64_t r = 0; r < n; ++r) dsum[i0 + r] = d_tile[r * kV + r];
  }
}

// The scores' transforms after the product: softcap, then the mask on partial tiles (masked entries -inf).
template <typename Acc>
void finish_scores(const ScoreTransform<Acc>& score, const MaskSpec& mask, int64_t i0, int64_t nq, int64_t j0,
                   int64_t nk, Acc* s) {
  constexpr int64_t kBk = CpuTiles<Acc>::kBlockK;
  const int64_t nkp = round_up(nk, CpuTiles<Acc>::kVec);
  score.apply_softcap(s, kBk, nq, nkp);
  if (!mask.tile_fully_visible(i0, i0 + nq, j0, j0 + nk)) mask_query_major(mask, s, kBk, i0, nq, j0, nkp);
}

// S (nq x nkp, query-major, log2 units) for queries i0.. against the key tile in w.kt; masked entries -inf.
template <typename Acc>
void score_tile(const ScoreTransform<Acc>& score, const MaskSpec& mask, const Acc* q, int64_t ldq, int64_t d,
                const Acc* kt, int64_t i0, int64_t nq, int64_t j0, int64_t nk, Acc* s) {
  constexpr int64_t kBk = CpuTiles<Acc>::kBlockK;
  const int64_t nkp = round_up(nk, CpuTiles<Acc>::kVec);
  gemm<Acc>(nq, nkp, d, q, ldq, 1, kt, kBk, s, kBk, GemmMode::overwrite);
  finish_scores(score, mask, i0, nq, j0, nk, s);
}

// score_tile from bf16 pairs (kBf16PairProducts; Acc = float): S = Q·Kᵀ of the inputs' own values, then the
// scale that the fp32 path folds into Kᵀ.
template <typename Acc>
void score_tile_pairs(const ScoreTransform<Acc>& score, const MaskSpec& mask, const uint32_t* q_pairs,
                      int64_t ldq_pairs, int64_t d_pairs, const uint32_t* k_pairs, int64_t i0, int64_t nq, int64_t j0,
                      int64_t nk, Acc* s) {
  constexpr int64_t kBk = CpuTiles<Acc>::kBlockK;
  const int64_t nkp = round_up(nk, CpuTiles<Acc>::kVec);
  gemm_bf16_pairs(nq, nkp, d_pairs, q_pairs, ldq_pairs, 1, k_pairs, kBk, s, kBk, GemmMode::overwrite, score.qk_scale);
  finish_scores(score, mask, i0, nq, j0, nk, s);
}

// fp64 only: each row's LSE (log2 units) recomputed in fp64 by a forward-style sweep without the P·V product.
template <typename T, typename Acc>
void recompute_lse2(const BwdParams& p, const MaskSpec& mask, const ScoreTransform<Acc>& score,
                    const AlibiTile<Acc>& alibi, const SequenceView<const T>& k, int64_t qlo, int64_t qhi,
                    BackwardScratch<Acc>& w) {
  using C = CpuTiles<Acc>;
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const int64_t d = p.head_dim;
  Acc *m = w.m.data(), *l = w.l.data(), *s = w.s.data();
  for (int64_t i0 = qlo; i0 < qhi; i0 += C::kBlockQ) {
    const int64_t nq = std::min<int64_t>(C::kBlockQ, qhi - i0);
    for (int64_t r = 0; r < nq; ++r) m[r] = kNegInf, l[r] = Acc(0);
    int64_t lo, hi;
    mask.key_range_for_rows(i0, i0 + nq, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += C::kBlockK) {
      const int64_t nk = std::min<int64_t>(C::kBlockK, hi - j0);
      load_transposed(k.row(j0), k.row_stride, nk, d, w.kt.data(), C::kBlockK, round_up(nk, C::kVec), score.qk_scale);
      score_tile(score, mask, w.q.data() + (i0 - qlo) * w.ldq, w.ldq, d, w.kt.data(), i0, nq, j0, nk, s);
      if (alibi.active()) alibi.add_query_major(s, C::kBlockK, i0, nq, j0, nk);
      for (int64_t r = 0; r < nq; ++r) {
        const Acc* sr = s + r * C::kBlockK;
        Acc mx = m[r];
        for (int64_t j = 0; j < nk; ++j) mx = sr[j] > mx ? sr[j] : mx;
        const Acc off = SoftmaxState<Acc>::exp_offset(mx);
        Acc sum = l[r] * exp2_approx(m[r] - off);
        for (int64_t j = 0; j < nk; ++j) sum += exp2_approx(sr[j] - off);
        m[r] = mx;
        l[r] = sum;
      }
    }
    for (int64_t r = 0; r < nq; ++r) {
      w.lse2.data()[i0 - qlo + r] = l[r] > Acc(0) ? m[r] + std::log2(l[r]) : std::numeric_limits<Acc>::infinity();
    }
  }
}

template <typename T, typename Acc>
void backward_task(const BwdParams& p, const BackwardPlan& plan, const BackwardTask& t, BackwardScratch<Acc>& w,
                   Acc* dq_partial, Acc* dkv_partial) {
  using C = CpuTiles<Acc>;
  constexpr int64_t kBq = C::kBlockQ, kBk = C::kBlockK;
  // bf16 on a level with pair dot products: every product on them (file header).
  constexpr bool kPairs = std::is_same_v<T, bfloat16_t> && kBf16PairProducts;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const int64_t dp = round_up(d, C::kVec), dvp = round_up(dv, C::kVec);
  const SequenceExtent ext = sequence_extent(p, t.batch);
  const MaskSpec mask = sequence_mask(p, ext);
  const ScoreTransform<Acc> score(p);
  // With pairs dS is rounded to bf16 before its scale, which its products apply (the tests' naive rounds there).
  const Acc ds_scale = kPairs ? Acc(1) : Acc(p.softmax_scale);
  const float pair_ds_scale = float(p.softmax_scale);
  const Acc keep_scale = Acc(1.0 / (1.0 - double(p.dropout_p)));
  const auto k = key_view<const T>(p, p.k, ext, t.kv_head, false);
  const auto v = key_view<const T>(p, p.v, ext, t.kv_head, true);
  const size_t unit = size_t(t.batch * p.heads_kv + t.kv_head);

  const int64_t kc0 = t.key_begin, kc1 = t.key_end, chunk_keys = kc1 - kc0;
  Acc *dk_acc = w.dk.data(), *dv_acc = w.dv.data();
  std::fill(dk_acc, dk_acc + chunk_keys * dp, Acc(0));
  std::fill(dv_acc, dv_acc + chunk_keys * dvp, Acc(0));
  // Query rows that see any key of the chunk; the others get dQ = 0 from this task.
  int64_t qlo = 0, qhi = 0;
  if (chunk_keys > 0) mask.query_range_for_keys(kc0, kc1, &qlo, &qhi);
  if (kPairs && qhi > qlo) qlo -= qlo % 2;  // pairs of rows start on even rows; the row added sees no key here
  const int64_t rows = qhi - qlo;
  Acc *q = w.q.data(), *dout = w.dout.data(), *dq = w.dq.data(), *lse2 = w.lse2.data(), *dsum = w.dsum.data();
  const int64_t ldq = w.ldq, lddo = w.lddo;
  Acc *s = w.s.data(), *prob = w.prob.data(), *ds = w.ds.data();

  for (int64_t g = t.head_begin; g < t.head_end; ++g) {
    const int64_t h = t.kv_head * plan.group + g;
    const AlibiTile<Acc> alibi(Alibi::make(p.alibi_slopes, p.alibi_slopes_batch_stride, t.batch, h, ext.len_q, ext.len_k));
    const DropoutTile dropout(DropoutSpec::make(p.dropout_p, DropoutRng::of(p), t.batch, h));
    const auto qv = query_view<const T>(p, p.q, ext, t.batch, h);
    const auto ov = output_view<const T>(p, p.o, ext, t.batch, h);
    const auto dov = grad_out_view<const T>(p, ext, t.batch, h);
    load_rows(qv.row(qlo), qv.row_stride, rows, d, q, ldq);
    load_rows(dov.row(qlo), dov.row_stride, rows, dv, dout, lddo);
    if constexpr (kPairs) {
      load_row_pairs(qv.row(qlo), qv.row_stride, rows, d, w.q_pairs.data(), w.ldq_pairs);
      load_row_pairs(dov.row(qlo), dov.row_stride, rows, dv, w.dout_pairs.data(), w.lddo_pairs);
      pack_row_pairs(q, ldq, rows, dp, w.q_row_pairs.data());
      pack_row_pairs(dout, lddo, rows, dvp, w.dout_row_pairs.data());
    }
    row_sums_of_products<T, Acc>(ov.row(qlo), ov.row_stride, rows, dv, w, dsum);
    if constexpr (std::is_same_v<Acc, double>) {
      recompute_lse2(p, mask, score, alibi, k, qlo, qhi, w);
    } else {
      // P = exp2(S - LSE·log2e); a row that saw no key has LSE = -inf, and +inf here makes its P exactly 0.
      for (int64_t i = 0; i < rows; ++i) {
        const Acc lse = Acc(*lse_ptr(p, ext, t.batch, h, qlo + i));
        lse2[i] = lse == -std::numeric_limits<Acc>::infinity() ? std::numeric_limits<Acc>::infinity() : lse * Acc(kLog2e);
      }
    }
    std::fill(dq, dq + rows * dp, Acc(0));

    for (int64_t j0 = kc0; j0 < kc1; j0 += kBk) {
      const int64_t nk = std::min(kBk, kc1 - j0), nkp = round_up(nk, C::kVec);
      if constexpr (kPairs) {
        load_transposed_pairs(k.row(j0), k.row_stride, nk, d, w.k_pairs.data(), kBk, nkp);
        load_transposed_pairs(v.row(j0), v.row_stride, nk, dv, w.v_pairs.data(), kBk, nkp);
      } else {
        load_transposed(k.row(j0), k.row_stride, nk, d, w.kt.data(), kBk, nkp, score.qk_scale);
        load_transposed(v.row(j0), v.row_stride, nk, dv, w.vt.data(), kBk, nkp);
      }
      const RowTile<Acc> krow = rows_as_acc<Acc>(k.row(j0), k.row_stride, nk, d, w.ldk, w.krow.data());
      if constexpr (kPairs) pack_row_pairs(krow.data, krow.ld, nk, dp, w.k_row_pairs.data());
      Acc* dk_blk = dk_acc + (j0 - kc0) * dp;
      Acc* dv_blk = dv_acc + (j0 - kc0) * dvp;
      int64_t ilo, ihi;
      mask.query_range_for_keys(j0, j0 + nk, &ilo, &ihi);
      if (kPairs && ihi > ilo) ilo -= ilo % 2;  // still >= qlo, which is even
      for (int64_t i0 = ilo; i0 < ihi; i0 += kBq) {
        const int64_t nq = std::min(kBq, ihi - i0), r0 = i0 - qlo;
        if constexpr (kPairs) {
          score_tile_pairs(score, mask, w.q_pairs.data() + r0 * w.ldq_pairs, w.ldq_pairs, w.ldq_pairs,
                           w.k_pairs.data(), i0, nq, j0, nk, s);
        } else {
          score_tile(score, mask, q + r0 * ldq, ldq, d, w.kt.data(), i0, nq, j0, nk, s);
        }
        for (int64_t r = 0; r < nq; ++r) {
          const Acc* sr = s + r * kBk;
          Acc* pr = prob + r * kBk;
          const Acc lse_r = lse2[r0 + r];
          if (alibi.active()) {
            alibi.row(pr, i0 + r, j0, nkp);
            for (int64_t j = 0; j < nkp; ++j) pr[j] = exp2_approx(sr[j] + pr[j] - lse_r);
          } else {
            for (int64_t j = 0; j < nkp; ++j) pr[j] = exp2_approx(sr[j] - lse_r);
          }
        }
        if constexpr (kPairs) {  // dP
          gemm_bf16_pairs(nq, nkp, w.lddo_pairs, w.dout_pairs.data() + r0 * w.lddo_pairs, w.lddo_pairs, 1,
                          w.v_pairs.data(), kBk, ds, kBk, GemmMode::overwrite);
        } else {
          gemm<Acc>(nq, nkp, dv, dout + r0 * lddo, lddo, 1, w.vt.data(), kBk, ds, kBk, GemmMode::overwrite);
        }
        Acc* z = w.keep.data();
        if (dropout.active()) dropout.factors_query_major(z, kBk, i0, nq, j0, nk, nkp, keep_scale);
        for (int64_t r = 0; r < nq; ++r) {
          Acc* pr = prob + r * kBk;
          Acc* dsr = ds + r * kBk;
          const Acc dr = dsum[r0 + r];
          if (dropout.active()) {
            // dS = P ∘ (Z ∘ dP - D), then P ∘ Z for dV.
            const Acc* zr = z + r * kBk;
            for (int64_t j = 0; j < nkp; ++j) dsr[j] = zr[j] * dsr[j];
          }
          if (score.softcap()) {
            const Acc* sr = s + r * kBk;
            for (int64_t j = 0; j < nkp; ++j) dsr[j] = pr[j] * (dsr[j] - dr) * ds_scale * score.softcap_grad(sr[j]);
          } else {
            for (int64_t j = 0; j < nkp; ++j) dsr[j] = pr[j] * (dsr[j] - dr) * ds_scale;
          }
          if (dropout.active()) {
            const Acc* zr = z + r * kBk;
            for (int64_t j = 0; j < nkp; ++j) pr[j] *= zr[j];
          }
        }
        // dV += Pᵀ dO, dK += dSᵀ Q (P and dS read transposed through their strides), dQ += dS K.
        if constexpr (kPairs) {
          // Pᵀ and dSᵀ as A(key, query pair) at [pair][key]; dS as A(query, key pair); r0 is even.
          const int64_t nq2 = (nq + 1) / 2, nk2 = (nk + 1) / 2;
          pack_row_pairs(prob, kBk, nq, nkp, w.pt_pairs.data());
          pack_row_pairs(ds, kBk, nq, nkp, w.dst_pairs.data());
          for (int64_t r = 0; r < nq; ++r) pack_adjacent_pairs(ds + r * kBk, nk, w.ds_pairs.data() + r * (kBk / 2));
          gemm_bf16_pairs(nk, dvp, nq2, w.pt_pairs.data(), 1, nkp, w.dout_row_pairs.data() + r0 / 2 * dvp, dvp,
                          dv_blk, dvp, GemmMode::add);
          gemm_bf16_pairs(nk, dp, nq2, w.dst_pairs.data(), 1, nkp, w.q_row_pairs.data() + r0 / 2 * dp, dp, dk_blk,
                          dp, GemmMode::add, pair_ds_scale);
          gemm_bf16_pairs(nq, dp, nk2, w.ds_pairs.data(), kBk / 2, 1, w.k_row_pairs.data(), dp, dq + r0 * dp, dp,
                          GemmMode::add, pair_ds_scale);
        } else {
          gemm<Acc>(nk, dvp, nq, prob, 1, kBk, dout + r0 * lddo, lddo, dv_blk, dvp, GemmMode::add);
          gemm<Acc>(nk, dp, nq, ds, 1, kBk, q + r0 * ldq, ldq, dk_blk, dp, GemmMode::add);
          gemm<Acc>(nq, dp, nk, ds, kBk, 1, krow.data, krow.ld, dq + r0 * dp, dp, GemmMode::add);
        }
      }
    }

    // dQ of head h from this chunk: every row of the sequence (zero where no key of the chunk is visible).
    if (plan.key_chunks[size_t(t.batch)] == 1) {
      const auto dqv = grad_query_view<T>(p, ext, t.batch, h);
      for (int64_t i = 0; i < qlo; ++i) std::fill(dqv.row(i), dqv.row(i) + d, narrow<T>(Acc(0)));
      store_rows(dq, dp, rows, d, dqv.row(qlo), dqv.row_stride);
      for (int64_t i = qhi; i < ext.len_q; ++i) std::fill(dqv.row(i), dqv.row(i) + d, narrow<T>(Acc(0)));
    } else {
      Acc* part = dq_partial + plan.dq_partial_at[unit] + (t.chunk * plan.group + g) * ext.len_q * dp;
      std::fill(part, part + qlo * dp, Acc(0));
      std::copy(dq, dq + rows * dp, part + qlo * dp);
      std::fill(part + qhi * dp, part + ext.len_q * dp, Acc(0));
    }
  }

  if (plan.head_parts == 1) {
    const auto dkv = grad_key_view<T>(p, ext, t.batch, t.kv_head, false);
    const auto dvv = grad_key_view<T>(p, ext, t.batch, t.kv_head, true);
    store_rows(dk_acc, dp, chunk_keys, d, dkv.row(kc0), dkv.row_stride);
    store_rows(dv_acc, dvp, chunk_keys, dv, dvv.row(kc0), dvv.row_stride);
  } else {
    Acc* base = dkv_partial + plan.dkv_partial_at[unit];
    std::copy(dk_acc, dk_acc + chunk_keys * dp, base + (t.part * ext.len_k + kc0) * dp);
    std::copy(dv_acc, dv_acc + chunk_keys * dvp, base + plan.head_parts * ext.len_k * dp + (t.part * ext.len_k + kc0) * dvp);
  }
}

// dQ of query head h = the sum of its key chunks' partials, in chunk order.
template <typename T, typename Acc>
void reduce_dq(const BwdParams& p, const BackwardPlan& plan, int64_t b, int64_t h, const Acc* dq_partial, Acc* row) {
  const int64_t d = p.head_dim, dp = round_up(d, CpuTiles<Acc>::kVec);
  const SequenceExtent ext = sequence_extent(p, b);
  const int64_t hk = h / plan.group, g = h % plan.group, chunks = plan.key_chunks[size_t(b)];
  const Acc* base = dq_partial + plan.dq_partial_at[size_t(b * p.heads_kv + hk)];
  const auto dqv = grad_query_view<T>(p, ext, b, h);
  for (int64_t i = 0; i < ext.len_q; ++i) {
    std::fill(row, row + d, Acc(0));
    for (int64_t c = 0; c < chunks; ++c) {
      const Acc* src = base + ((c * plan.group + g) * ext.len_q + i) * dp;
      for (int64_t x = 0; x < d; ++x) row[x] += src[x];
    }
    store_rows(row, dp, 1, d, dqv.row(i), dqv.row_stride);
  }
}

// dK / dV of a KV head = the sum of its head parts' partials, in part order.
template <typename T, typename Acc>
void reduce_dkv(const BwdParams& p, const BackwardPlan& plan, int64_t b, int64_t hk, const Acc* dkv_partial, Acc* row) {
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const int64_t dp = round_up(d, CpuTiles<Acc>::kVec), dvp = round_up(dv, CpuTiles<Acc>::kVec);
  const SequenceExtent ext = sequence_extent(p, b);
  const Acc* base = dkv_partial + plan.dkv_partial_at[size_t(b * p.heads_kv + hk)];
  const Acc* dv_base = base + plan.head_parts * ext.len_k * dp;
  const auto dkv = grad_key_view<T>(p, ext, b, hk, false);
  const auto dvv = grad_key_view<T>(p, ext, b, hk, true);
  for (int64_t j = 0; j < ext.len_k; ++j) {
    std::fill(row, row + dp + dvp, Acc(0));
    for (int64_t part = 0; part < plan.head_parts; ++part) {
      const Acc* sk = base + (part * ext.len_k + j) * dp;
      const Acc* sv = dv_base + (part * ext.len_k + j) * dvp;
      for (int64_t x = 0; x < d; ++x) row[x] += sk[x];
      for (int64_t x = 0; x < dv; ++x) row[dp + x] += sv[x];
    }
    store_rows(row, dp, 1, d, dkv.row(j), dkv.row_stride);
    store_rows(row + dp, dvp, 1, dv, dvv.row(j), dvv.row_stride);
  }
}

template <typename T, typename Acc>
Status backward_typed(const BwdParams& p) {
  const BackwardPlan plan = make_plan<Acc>(p);
  AlignedBuffer<Acc> dq_partial(plan.dq_partial_size), dkv_partial(plan.dkv_partial_size);
  const int64_t n = int64_t(plan.tasks.size());
  const int64_t dq_items = p.batch * p.heads_q, dkv_items = p.batch * p.heads_kv;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (n > 1)
  {
    BackwardScratch<Acc> scratch(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t) {
      backward_task<T, Acc>(p, plan, plan.tasks[size_t(t)], scratch, dq_partial.data(), dkv_partial.data());
    }
    // The implicit barrier above: every partial is written before it is summed.
    if (plan.dq_partial_size > 0) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t x = 0; x < dq_items; ++x) {
        const int64_t b = x / p.heads_q, h = x % p.heads_q;
        if (plan.key_chunks[size_t(b)] > 1) reduce_dq<T, Acc>(p, plan, b, h, dq_partial.data(), scratch.krow.data());
      }
    }
    if (plan.dkv_partial_size > 0) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t x = 0; x < dkv_items; ++x) {
        reduce_dkv<T, Acc>(p, plan, x / p.heads_kv, x % p.heads_kv, dkv_partial.data(), scratch.s.data());
      }
    }
  }
  return Status::success();
}

}  // namespace

inline namespace FLASHATTN_CPU_ISA {

// This instruction-set level's backward (src/cpu/isa.cpp chooses the level).
bool bf16_pair_products() { return kBf16PairProducts; }

Status flash_backward_kernels(const BwdParams& p) {
  switch (p.dtype) {
    case DType::f32: return backward_typed<float, float>(p);
    case DType::f64: return backward_typed<double, double>(p);
    case DType::f16: return backward_typed<half_t, float>(p);
    case DType::bf16: return backward_typed<bfloat16_t, float>(p);
    default: return Status::unsupported(std::string("cpu_flash: dtype ") + dtype_name(p.dtype) + " is not supported");
  }
}

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
