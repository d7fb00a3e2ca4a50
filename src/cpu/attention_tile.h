// Score-tile steps shared by the CPU flash forward and backward: the scale / softcap transform of raw Q·K
// products, the ALiBi bias, per-element masking of partially visible tiles, and K / V tiles as fp32 / fp64 rows.
//
// Scores are kept in log2 units (multiplied by log2 e) so that every exponential is a single exp2:
//   no softcap: S2 = (Q · scale · log2e) · K            (the scale is folded into whichever operand is cheaper)
//   softcap c:  S2 = c · log2e · tanh((Q · scale / c) · K)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/mask.h"
#include "cpu/tile_io.h"
#include "cpu/vec_math.h"
#include "flashattn/params.h"

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

template <typename Acc>
struct ScoreTransform {
  Acc qk_scale;    // multiplies Q (forward) or K (backward) before the product
  Acc cap_log2;    // softcap · log2e, or 0 when softcap is off
  Acc inv_cap_log2;

  explicit ScoreTransform(const FwdParams& p) {
    const double scale = double(p.softmax_scale), cap = double(p.softcap);
    qk_scale = Acc(cap > 0 ? scale / cap : scale * kLog2e);
    cap_log2 = Acc(cap > 0 ? cap * kLog2e : 0.0);
    inv_cap_log2 = Acc(cap > 0 ? 1.0 / (cap * kLog2e) : 0.0);
  }

  bool softcap() const { return cap_log2 > Acc(0); }

  // Raw products -> softcapped log2 scores, in place (rows x cols of a tile with row stride ld).
  void apply_softcap(Acc* s, int64_t ld, int64_t rows, int64_t cols) const {
    if (!softcap()) return;
    const Acc c = cap_log2;
    for (int64_t r = 0; r < rows; ++r) {
      Acc* sr = s + r * ld;
      for (int64_t j = 0; j < cols; ++j) sr[j] = c * tanh_approx(sr[j]);
    }
  }

  // d(softcapped score)/d(raw score) = 1 - tanh², from the softcapped log2 score. A masked score (-inf) clamps
  // to tanh = -1 and gives 0, never inf * 0.
  Acc softcap_grad(Acc s2) const {
    Acc t = s2 * inv_cap_log2;
    t = t < Acc(-1) ? Acc(-1) : (t > Acc(1) ? Acc(1) : t);
    return Acc(1) - t * t;
  }
};

// The ALiBi bias (common/alibi.h) of one (sequence, head) in log2 units, added to score tiles. Distances are
// formed in Acc from the tile's first one plus the column offset, so the inner loops vectorise; they are exact
// below 2^24 keys in fp32.
template <typename Acc>
struct AlibiTile {
  Acc slope2;     // slope · log2e per key of distance
  int64_t shift;  // s_k - s_q

  explicit AlibiTile(const Alibi& a) : slope2(Acc(double(a.slope) * kLog2e)), shift(a.shift) {}
  bool active() const { return slope2 != Acc(0); }

  // out[j] = bias of query i for keys j0 + j, j < n.
  void row(Acc* out, int64_t i, int64_t j0, int64_t n) const {
    const Acc base = Acc(i + shift - j0);
    for (int j = 0; j < int(n); ++j) out[j] = -slope2 * std::fabs(base - Acc(j));
  }
  // Key-major tile Sᵀ[j][i] (keys j0.., queries i0..): adds the bias in place.
  void add_key_major(Acc* s, int64_t ld, int64_t j0, int64_t nk, int64_t i0, int64_t ncols) const {
    for (int64_t j = 0; j < nk; ++j) {
      const Acc base = Acc(i0 + shift - (j0 + j));
      Acc* sj = s + j * ld;
      for (int i = 0; i < int(ncols); ++i) sj[i] -= slope2 * std::fabs(base + Acc(i));
    }
  }
  // Query-major tile S[i][j] (queries i0.., keys j0..): adds the bias in place.
  void add_query_major(Acc* s, int64_t ld, int64_t i0, int64_t nq, int64_t j0, int64_t ncols) const {
    for (int64_t i = 0; i < nq; ++i) {
      const Acc base = Acc(i0 + i + shift - j0);
      Acc* si = s + i * ld;
      for (int j = 0; j < int(ncols); ++j) si[j] -= slope2 * std::fabs(base - Acc(j));
    }
  }
};

// Dropout (common/dropout.h) of one (sequence, head) on probability tiles. One Philox call serves the eight keys
// of a group; a row's keys [j0, j0 + n) take the groups of the 32-key spans they touch.
struct DropoutTile {
  DropoutSpec spec;

  explicit DropoutTile(const DropoutSpec& d) : spec(d) {}
  bool active() const { return spec.active(); }

  // f(j, kept) for every key j in [j0, j0 + n) of query row i.
  template <typename F>
  void for_each_key(int64_t i, int64_t j0, int64_t n, F f) const {
    const int64_t j1 = j0 + n;
    for (int64_t span = j0 >> 5; span <= (j1 - 1) >> 5; ++span)
      for (uint32_t lane = 0; lane < 4; ++lane) {
        const uint32_t g = uint32_t(span << 2) | lane;
        uint32_t w[4];
        spec.draws(i, g, w);
        for (int slot = 0; slot < DropoutSpec::kKeysPerGroup; ++slot) {
          const int64_t j = DropoutSpec::key_of(g, slot);
          if (j >= j0 && j < j1) f(j, spec.kept(w, slot));
        }
      }
  }
  // Key-major Pᵀ[j][i] (keys j0.. j0 + nk, queries i0.. i0 + nq): dropped entries set to 0 (the caller scales the
  // kept ones by 1 / (1 - p)).
  template <typename Acc>
  void drop_key_major(Acc* s, int64_t ld, int64_t j0, int64_t nk, int64_t i0, int64_t nq) const {
    for (int64_t i = 0; i < nq; ++i)
      for_each_key(i0 + i, j0, nk, [&](int64_t j, bool kept) {
        if (!kept) s[(j - j0) * ld + i] = Acc(0);
      });
  }
  // Query-major Z[i][j] (queries i0.., keys j0..): `scale` where kept, 0 where dropped, 0 past nk up to ncols.
  template <typename Acc>
  void factors_query_major(Acc* z, int64_t ld, int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t ncols,
                           Acc scale) const {
    for (int64_t i = 0; i < nq; ++i) {
      Acc* zi = z + i * ld;
      for (int64_t j = nk; j < ncols; ++j) zi[j] = Acc(0);
      for_each_key(i0 + i, j0, nk, [&](int64_t j, bool kept) { zi[j - j0] = kept ? scale : Acc(0); });
    }
  }
};

// Key-major tile Sᵀ[j][i] (keys j0.., queries i0..): -inf where key j0 + j is hidden from query i0 + i. With
// `group` > 1 the columns are packed rows i0 + i of query (i0 + i) / group (the query heads of a KV group).
template <typename Acc>
void mask_key_major(const MaskSpec& mask, Acc* s, int64_t ld, int64_t j0, int64_t nk, int64_t i0, int64_t ncols,
                    int64_t group = 1) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  for (int64_t j = 0; j < nk; ++j) {
    int64_t lo, hi;
    mask.query_range_for_keys(j0 + j, j0 + j + 1, &lo, &hi);
    lo = std::min(std::max(lo * group - i0, int64_t(0)), ncols);
    hi = std::min(std::max(hi * group - i0, lo), ncols);
    Acc* sj = s + j * ld;
    for (int64_t i = 0; i < lo; ++i) sj[i] = kNegInf;
    for (int64_t i = hi; i < ncols; ++i) sj[i] = kNegInf;
  }
}

// Query-major tile S[i][j] (queries i0.., keys j0..): -inf where key j0 + j is hidden from query i0 + i.
template <typename Acc>
void mask_query_major(const MaskSpec& mask, Acc* s, int64_t ld, int64_t i0, int64_t nq, int64_t j0, int64_t ncols) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  for (int64_t i = 0; i < nq; ++i) {
    int64_t lo, hi;
    mask.key_range(i0 + i, &lo, &hi);
    lo = std::min(std::max(lo - j0, int64_t(0)), ncols);
    hi = std::min(std::max(hi - j0, lo), ncols);
    Acc* si = s + i * ld;
    for (int64_t j = 0; j < lo; ++j) si[j] = kNegInf;
    for (int64_t j = hi; j < ncols; ++j) si[j] = kNegInf;
  }
}

// Rows of a tile as the micro-kernels read them: fp32 / fp64, row stride ld, zero-padded from cols to ld.
template <typename Acc>
struct RowTile {
  const Acc* data;
  int64_t ld;
};

// Always a copy, even for fp32 / fp64 inputs that could be read in place: one code path for every dtype, rows
// padded with zeros to whole vectors, and a compact tile that the micro-kernel re-reads from L1 (reading fp32
// rows in place from a [b, s, h, d] tensor measured 10% slower for the whole forward at d = 64 and d = 128).
template <typename Acc, typename RowPtr>
RowTile<Acc> rows_as_acc_from(RowPtr row, int64_t rows, int64_t cols, int64_t ld, Acc* buf) {
  load_rows_from<Acc>(row, rows, cols, buf, ld);
  return {buf, ld};
}

// rows_as_acc_from of rows src_rs apart.
template <typename Acc, typename T>
RowTile<Acc> rows_as_acc(const T* src, int64_t src_rs, int64_t rows, int64_t cols, int64_t ld, Acc* buf) {
  return rows_as_acc_from<Acc>([=](int64_t r) { return src + r * src_rs; }, rows, cols, ld, buf);
}

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
