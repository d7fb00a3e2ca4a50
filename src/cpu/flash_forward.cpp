// CPU flash forward: O = softmax(mask(softcap(Q Kᵀ · scale))) V and the per-row LSE, by tiled online softmax,
// never materialising more than one kBlockK x block_q score tile per thread.
//
// Work split: one task per (batch, query head, block of block_q query rows; block_q from 512 down to 64, see
// tile_config.h), spread over OpenMP threads
// (dynamic schedule; head-major so that consecutive tasks reuse K / V from L2, costly blocks of a head first).
// A task streams the key blocks its rows can see (MaskSpec::key_range_for_rows), so blocks outside the mask
// cost nothing.
//
// Per key block, in the task's fp32 (fp64 for fp64 inputs) buffers:
//   Sᵀ = K · Qᵀ                     (micro_gemm: K broadcast, Qᵀ rows as vectors; Qᵀ transposed once per task
//                                    and pre-multiplied by scale·log2(e), so that exp is one exp2)
//        (+ V · QVᵀ with FA3's qv, QVᵀ transposed and scaled the same way)
//   softcap, ALiBi, then mask       (the mask per element only on tiles MaskSpec::tile_fully_visible says are
//                                    partial)
//   m' = max(m, column max of Sᵀ),  P = exp2(Sᵀ - m'),  l = l·exp2(m - m') + column sums of P
//   dropout: dropped P set to 0    (l keeps the undropped sum; the kept ones' 1 / (1 - p) comes with 1 / l)
//   O = diag(exp2(m - m')) O + Pᵀᵀ V  (micro_gemm reading P transposed through its strides)
// The score tile is kept key-major (Sᵀ) so that the per-query-row max / sum run down columns as plain vector
// operations and no operand ever needs a per-tile transpose: Q is transposed once per task, K and V are copied
// (converted for fp16 / bf16) as rows into the thread's tile buffers once per tile. Within a tile, the products
// and the softmax cover only the queries that see some key of it (half of a diagonal tile under causal).
//
// A block of at most kFewRowsMax (packed) rows, a decode step's, takes the few-row products instead
// (few_row_products.h): Q as scaled rows, dot products along the head dim for Sᵀ, and P V with K / V read in place,
// widened as they are loaded; the softmax between them is the same.
//
// bf16 at the avx512_bf16 level: Sᵀ = K · Qᵀ on AVX-512 BF16 pair dot products (gemm_bf16_pairs) from the
// inputs' own values, the scale applied to the scores; P V in fp32 as at every level.
//
// K / V rows: strided (tensors, dense caches) or, for a paged cache, looked up row by row in the block table as the
// tiles are copied (a page out of range reads as zeros), so a decode step reads only the rows it uses and copies
// no cache.
//
// Extra memory: per thread, Qᵀ, K, V, Sᵀ and O tiles, O(block_q·kBlockK + (block_q + kBlockK)·(d + d_v))
// elements, independent of the sequence lengths; plus the task list, O(batch · heads · s_q / block_q).
// Preconditions: params validated (make_forward_params); CPU tensors.
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

// GCC's tuning for recent Xeons prefers 256-bit vectors; the micro-kernels need 512-bit ones to use both FMA
// units of such cores (twice the rate). Everything below is the kernel proper.
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif

#include "cpu/attention_tile.h"
#include "cpu/few_row_products.h"
#include "cpu/micro_gemm.h"
#include "cpu/tile_config.h"
#include "cpu/tile_io.h"
#include "cpu/vec_math.h"

namespace flashattn::detail {
namespace {

// Per-thread buffers of one forward task, sized once per call.
template <typename Acc>
struct ForwardScratch {
  AlignedBuffer<Acc> qt, qvt, k, v, s, o;
  AlignedBuffer<Acc> m, l, alpha, offset, tile_max;

  // bf16 with pair products (kBf16PairProducts): Qᵀ of the task and K of a tile, in pairs.
  AlignedBuffer<uint32_t> qt_pairs, k_pairs;
  // Few-row blocks (few_row_products.h): the block's Q rows (scaled, zero-padded to whole vectors), and a row of
  // zeros read in place of a paged cache's rows of no valid page.
  AlignedBuffer<Acc> q_rows, zero_row;
  int64_t ld_q_rows;
  // Row strides: Qᵀ, V and the score tile (read as P) are micro-kernel B / A operands, padded (tile_config.h).
  int64_t ldq, ldv, lds;

  ForwardScratch(int64_t block_q, int64_t d, int64_t dvp, bool pairs, bool with_qv) {
    using C = CpuTiles<Acc>;
    ldq = lds = b_operand_ld(block_q, sizeof(Acc));
    ldv = b_operand_ld(dvp, sizeof(Acc));
    qt.resize(d * ldq);
    if (with_qv) qvt.resize(dvp * ldq);
    k.resize(C::kBlockK * d);
    v.resize(C::kBlockK * ldv);
    s.resize(C::kBlockK * lds);
    o.resize(block_q * dvp);
    for (auto* b : {&m, &l, &alpha, &offset, &tile_max}) b->resize(block_q);
    if (pairs) {
      qt_pairs.resize((d + 1) / 2 * ldq);
      k_pairs.resize(C::kBlockK * ((d + 1) / 2));
    }
    ld_q_rows = round_up(d, C::kVec);
    q_rows.resize(C::kFewRowsMax * ld_q_rows);
    zero_row.resize(std::max(d, dvp));
    std::fill(zero_row.data(), zero_row.data() + std::max(d, dvp), Acc(0));
  }
};

// A task's rows: with group 1, query rows row0.. of query head `head`; with group g > 1 (GQA packing, below),
// packed rows row0.. of KV head `head`, packed row r being query row r / g of query head head · g + r % g, so that
// the g query heads that share K / V read and convert each tile once, as the columns of one score tile.
struct QueryBlockTask {
  int64_t batch, head, row0;
  int64_t cost;  // score-tile elements the task computes
};

// GQA packing where a sequence's packed rows fit one query block (decode: a few query rows per sequence, where
// per-head tasks would fill a vector of query columns with one row and read K / V once per query head). Not with
// ALiBi, dropout or qv, whose terms are per head.
int64_t packed_group(const FwdParams& p, int64_t block_q) {
  const int64_t group = p.heads_q / p.heads_kv;
  const bool per_head_terms = p.alibi_slopes != nullptr || p.dropout_p > 0.f || p.qv != nullptr;
  return group > 1 && !per_head_terms && p.seqlen_q * group <= block_q ? group : 1;
}

template <typename T, typename Acc>
void forward_task(const FwdParams& p, int64_t block_q, int64_t group, const QueryBlockTask& t,
                  ForwardScratch<Acc>& w) {
  using C = CpuTiles<Acc>;
  constexpr int64_t kBk = C::kBlockK;
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  // bf16 on a level with pair dot products: Sᵀ = K·Qᵀ runs on the inputs' own values (micro_gemm.h,
  // gemm_bf16_pairs), and the scale the fp32 path folds into Qᵀ is applied to the scores.
  constexpr bool kPairs = std::is_same_v<T, bfloat16_t> && kBf16PairProducts;
  const int64_t d = p.head_dim, dv = p.head_dim_v, dvp = round_up(dv, C::kVec), d_pairs = (d + 1) / 2;
  const SequenceExtent ext = sequence_extent(p, t.batch);
  const int64_t hk = group > 1 ? t.head : t.head / (p.heads_q / p.heads_kv);
  const int64_t head0 = group > 1 ? t.head * group : t.head;  // the query head of packed row 0
  const auto q = query_view<const T>(p, p.q, ext, t.batch, head0);
  // K and V rows of a key tile (tile_rows): strided rows of a dense cache or tensor, or a paged cache's rows, its
  // block table read once per page the tile touches and shared by K and V (null where the table's page is out of
  // range: the row reads as zeros).
  const KVCacheLayout cache = KVCacheLayout::of(p);
  const bool paged = cache.paged();
  const int64_t entry = paged ? cache.entry(t.batch) : 0;
  const auto k = paged ? SequenceView<const T>{} : key_view<const T>(p, p.k, ext, hk, false);
  const auto v = paged ? SequenceView<const T>{} : key_view<const T>(p, p.v, ext, hk, true);
  const T* k_rows[kBk];
  const T* v_rows[kBk];
  // What a row of no valid page reads as: null (the block path's copies zero-fill it) or, for the few-row products,
  // which read rows in place, a row of zeros (set below).
  const T* missing_row = nullptr;
  auto tile_rows = [&](int64_t j0, int64_t nk) {
    if (!paged) {
      for (int64_t r = 0; r < nk; ++r) k_rows[r] = k.row(j0 + r), v_rows[r] = v.row(j0 + r);
      return;
    }
    const int64_t first = ext.start_k + j0;
    int64_t slot = first / cache.page_size, in_page = first - slot * cache.page_size;
    int64_t page = cache.page_in_slot(entry, slot);
    for (int64_t r = 0; r < nk; ++r) {
      k_rows[r] = page < 0 ? missing_row
                           : static_cast<const T*>(p.k) + page * p.k_batch_stride + in_page * p.k_row_stride +
                                 hk * p.k_head_stride;
      v_rows[r] = page < 0 ? missing_row
                           : static_cast<const T*>(p.v) + page * p.v_batch_stride + in_page * p.v_row_stride +
                                 hk * p.v_head_stride;
      if (++in_page == cache.page_size && r + 1 < nk) in_page = 0, page = cache.page_in_slot(entry, ++slot);
    }
  };
  auto k_row = [&](int64_t r) { return k_rows[r]; };
  auto v_row = [&](int64_t r) { return v_rows[r]; };
  const auto o = output_view<T>(p, p.o, ext, t.batch, head0);
  const MaskSpec mask = sequence_mask(p, ext);
  const ScoreTransform<Acc> score(p);
  const AlibiTile<Acc> alibi(Alibi::make(p.alibi_slopes, p.alibi_slopes_batch_stride, t.batch, t.head, ext.len_q, ext.len_k));
  const DropoutTile dropout(DropoutSpec::make(p.dropout_p, DropoutRng::of(p), t.batch, t.head));

  // i0.., nq: the task's (packed) rows; query rows (i0 + c) / group for column c.
  const int64_t i0 = t.row0, nq = std::min(block_q, ext.len_q * group - i0), nqp = round_up(nq, C::kVec);
  const int64_t ldq = w.ldq, lds = w.lds;
  auto q_row = [&](int64_t c) { return q.row((i0 + c) / group) + (i0 + c) % group * p.q_head_stride; };
  // A block of a few rows of a KV-cache call (decode) takes the few-row products: Q as scaled rows, K / V read in
  // place. Cache calls only, which are inference only (dispatch.cpp refuses their backward): the products' other
  // summation order changes the scores by rounding, and a training forward's LSE must stay the one its backward's
  // recomputed scores give (with the few-row LSE, d 256, 8 rows, fp32: dQ's largest error 3.25e-6 against 2.38e-6,
  // over 20 seeds); and a plain call's rows stay independent of how they are blocked.
  const bool few_rows = p.has_kv_cache() && nq <= C::kFewRowsMax && !p.qv;
  if (few_rows) {
    missing_row = reinterpret_cast<const T*>(w.zero_row.data());
    load_rows_from<Acc>(q_row, nq, d, w.q_rows.data(), w.ld_q_rows, score.qk_scale);
  } else if constexpr (kPairs)
    load_transposed_pairs_rows(q_row, nq, d, w.qt_pairs.data(), ldq, nqp);
  else
    load_transposed_rows<Acc>(q_row, nq, d, w.qt.data(), ldq, nqp, score.qk_scale);
  // FA3's qv term: QVᵀ scaled like Qᵀ, so that V · QVᵀ adds to the same log2-unit scores.
  if (p.qv) {
    const auto qv = query_value_view<const T>(p, ext, t.batch, t.head);
    load_transposed(qv.row(i0), qv.row_stride, nq, dv, w.qvt.data(), ldq, nqp, score.qk_scale);
  }
  Acc *m = w.m.data(), *l = w.l.data(), *alpha = w.alpha.data(), *off = w.offset.data(), *tmax = w.tile_max.data();
  for (int64_t i = 0; i < nqp; ++i) m[i] = kNegInf, l[i] = Acc(0);
  std::fill(w.o.data(), w.o.data() + nq * dvp, Acc(0));

  int64_t key_lo, key_hi;
  mask.key_range_for_rows(i0 / group, (i0 + nq - 1) / group + 1, &key_lo, &key_hi);
  Acc* s = w.s.data();
  for (int64_t j0 = key_lo; j0 < key_hi; j0 += kBk) {
    const int64_t nk = std::min(kBk, key_hi - j0);
    RowTile<Acc> kt{}, vt{};
    tile_rows(j0, nk);
    if (!few_rows) {
      if constexpr (kPairs)
        load_row_pairs_from(k_row, nk, d, w.k_pairs.data(), d_pairs);
      else
        kt = rows_as_acc_from<Acc>(k_row, nk, d, d, w.k.data());
      vt = rows_as_acc_from<Acc>(v_row, nk, dv, w.ldv, w.v.data());
    }

    // Only the block's queries that see some key of this tile, whole vectors of them: under a causal or
    // windowed mask that skips up to half of a diagonal tile in both products and the softmax.
    int64_t qa, qb;
    mask.query_range_for_keys(j0, j0 + nk, &qa, &qb);
    const int64_t c0 = std::max<int64_t>(qa * group - i0, 0) / C::kVec * C::kVec;
    const int64_t c1 = std::min(nqp, round_up(std::max<int64_t>(qb * group - i0, 0), C::kVec));
    const int64_t rows = std::min(c1, nq) - c0;
    if (rows <= 0) continue;
    Acc* sc = s + c0;

    // Sᵀ (nk x [c0, c1), key-major) in log2 units.
    if (few_rows) {
      few_row_scores(nk, int(rows), d, k_rows, w.q_rows.data() + c0 * w.ld_q_rows, w.ld_q_rows, sc, lds);
      for (int64_t j = 0; j < nk; ++j) std::fill(sc + j * lds + rows, sc + j * lds + (c1 - c0), Acc(0));
    } else if constexpr (kPairs) {
      gemm_bf16_pairs(nk, c1 - c0, d_pairs, w.k_pairs.data(), d_pairs, 1, w.qt_pairs.data() + c0, ldq, sc, lds,
                      GemmMode::overwrite, score.qk_scale);
    } else {
      gemm<Acc>(nk, c1 - c0, d, kt.data, kt.ld, 1, w.qt.data() + c0, ldq, sc, lds, GemmMode::overwrite);
    }
    if (p.qv) gemm<Acc>(nk, c1 - c0, dv, vt.data, vt.ld, 1, w.qvt.data() + c0, ldq, sc, lds, GemmMode::add);
    score.apply_softcap(sc, lds, nk, c1 - c0);
    if (alibi.active()) alibi.add_key_major(sc, lds, j0, nk, i0 + c0, c1 - c0);
    if (!mask.tile_fully_visible((i0 + c0) / group, (i0 + c0 + rows - 1) / group + 1, j0, j0 + nk)) {
      mask_key_major(mask, sc, lds, j0, nk, i0 + c0, c1 - c0, group);
    }

    // Online softmax, one query row per column.
    for (int64_t i = c0; i < c1; ++i) tmax[i] = kNegInf;
    for (int64_t j = 0; j < nk; ++j) {
      const Acc* sj = s + j * lds;
      for (int64_t i = c0; i < c1; ++i) tmax[i] = sj[i] > tmax[i] ? sj[i] : tmax[i];
    }
    for (int64_t i = c0; i < c1; ++i) {
      const Acc m_new = tmax[i] > m[i] ? tmax[i] : m[i];
      off[i] = SoftmaxState<Acc>::exp_offset(m_new);
      alpha[i] = exp2_approx(m[i] - off[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
    for (int64_t j = 0; j < nk; ++j) {
      Acc* sj = s + j * lds;
      for (int64_t i = c0; i < c1; ++i) {
        sj[i] = exp2_approx(sj[i] - off[i]);
        l[i] += sj[i];
      }
    }
    if (dropout.active()) dropout.drop_key_major(sc, lds, j0, nk, i0 + c0, rows);
    // O = diag(alpha) O + P V on those rows, with P(i, j) = Sᵀ[j][i].
    if (few_rows)
      few_row_output(nk, int(rows), dv, sc, lds, v_rows, w.o.data() + c0 * dvp, dvp, alpha + c0);
    else
      gemm<Acc>(rows, dvp, nk, sc, 1, lds, vt.data, vt.ld, w.o.data() + c0 * dvp, dvp, GemmMode::scale_add,
                alpha + c0);
  }

  // Finalise: O / l (0 for rows that saw no key; times 1 / (1 - p) under dropout), LSE = ln2 · (m + log2 l) (-inf
  // for those rows).
  const Acc keep_scale = Acc(1.0 / (1.0 - double(p.dropout_p)));
  for (int64_t i = 0; i < nq; ++i) alpha[i] = l[i] > Acc(0) ? keep_scale / l[i] : Acc(0);
  store_rows_to<T>(w.o.data(), dvp, nq, dv,
                   [&](int64_t c) { return o.row((i0 + c) / group) + (i0 + c) % group * p.o_head_stride; }, alpha);
  if (p.lse) {
    for (int64_t c = 0; c < nq; ++c) {
      *lse_ptr(p, ext, t.batch, head0 + (i0 + c) % group, (i0 + c) / group) =
          float(SoftmaxState<Acc>::lse_from_log2(m[c], l[c]));
    }
  }
}

// Head-major order, so that the tasks a thread takes one after another stream the same K / V (which then stay in
// its L2); within a head, costly blocks first (under a causal mask the last query blocks see the most keys), so
// that the small ones fill the gaps at the end of the dynamic schedule.
std::vector<QueryBlockTask> make_tasks(const FwdParams& p, int64_t block_q, int64_t group) {
  std::vector<QueryBlockTask> tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceExtent ext = sequence_extent(p, b);
    const MaskSpec mask = sequence_mask(p, ext);
    for (int64_t h = 0; h < p.heads_q / group; ++h) {
      const size_t first = tasks.size();
      for (int64_t i0 = 0; i0 < ext.len_q * group; i0 += block_q) {
        const int64_t nq = std::min(block_q, ext.len_q * group - i0);
        int64_t lo, hi;
        mask.key_range_for_rows(i0 / group, (i0 + nq - 1) / group + 1, &lo, &hi);
        tasks.push_back({b, h, i0, nq * (hi - lo) + nq});
      }
      std::stable_sort(tasks.begin() + std::ptrdiff_t(first), tasks.end(),
                       [](const QueryBlockTask& x, const QueryBlockTask& y) { return x.cost > y.cost; });
    }
  }
  return tasks;
}

// The forward's query block height for this call (tile_config.h): as tall as the L2 budget allows while still
// giving kFwdMinTasks tasks.
template <typename Acc>
int64_t choose_block_q(const FwdParams& p) {
  using C = CpuTiles<Acc>;
  // Per query row: Qᵀ, the O accumulator and, with qv, QVᵀ.
  const int64_t row_bytes = (p.head_dim + round_up(p.head_dim_v, C::kVec) * (p.qv ? 2 : 1)) * int64_t(sizeof(Acc));
  int64_t bq = C::kFwdBlockQMax;
  while (bq > C::kFwdBlockQMin && bq * row_bytes > C::kFwdQueryTileBytes) bq /= 2;
  for (; bq > C::kFwdBlockQMin; bq /= 2) {
    int64_t tasks = 0;
    for (int64_t b = 0; b < p.batch; ++b) tasks += (sequence_extent(p, b).len_q + bq - 1) / bq;
    if (tasks * p.heads_q >= C::kFwdMinTasks) return bq;
  }
  return C::kFwdBlockQMin;
}

template <typename T, typename Acc>
Status forward_typed(const FwdParams& p) {
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  const int64_t block_q = choose_block_q<Acc>(p);
  const int64_t group = packed_group(p, block_q);
  const std::vector<QueryBlockTask> tasks = make_tasks(p, block_q, group);
  const int64_t n = int64_t(tasks.size());
#pragma omp parallel num_threads(threads) if (n > 1)
  {
    ForwardScratch<Acc> scratch(block_q, p.head_dim, round_up(p.head_dim_v, CpuTiles<Acc>::kVec),
                                kBf16PairProducts && std::is_same_v<T, bfloat16_t>, p.qv != nullptr);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n; ++t) forward_task<T, Acc>(p, block_q, group, tasks[size_t(t)], scratch);
  }
  return Status::success();
}

}  // namespace

inline namespace FLASHATTN_CPU_ISA {

// This instruction-set level's forward (src/cpu/isa.cpp chooses the level).
Status flash_forward_kernels(const FwdParams& p) {
  switch (p.dtype) {
    case DType::f32: return forward_typed<float, float>(p);
    case DType::f64: return forward_typed<double, double>(p);
    case DType::f16: return forward_typed<half_t, float>(p);
    case DType::bf16: return forward_typed<bfloat16_t, float>(p);
    default: return Status::unsupported(std::string("cpu_flash: dtype ") + dtype_name(p.dtype) + " is not supported");
  }
}

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
