// The CPU flash forward's two products for a query block of a few rows (decode steps: one query row per sequence,
// or the few query heads of a KV group packed together), read straight from the K / V rows in their storage type:
//   scores:  Sᵀ[j][i] = K(j) · Q(i)             (one dot product along the head dim per key and query row)
//   output:  O(i) = alpha(i) O(i) + Σ_j Sᵀ[j][i] V(j)
//
// Why a separate form: the block-sized micro-kernels (micro_gemm.h) broadcast K and run vectors over query columns,
// so with a few rows most vector lanes multiply padding, and they read K / V from fp32 copies of each tile that
// cost a conversion pass per tile, which a tall query block amortises and a decode step does not. Here a vector
// runs along the head dim instead: every lane of every FMA is a useful product, K and V are widened to the
// accumulation type as they are loaded (bf16: a zero-extend and a shift), and no tile is copied. The price is one
// horizontal sum per (key, query row), a few instructions against d / kVec FMAs.
//
// Register blocking (tile_config.h): scores take kMicroVecs keys by kMicroRows query rows of accumulators per
// pass; the output takes kMicroRows rows by kMicroVecs vectors of O, every key streaming past them.
// Preconditions: Q rows and O rows are Acc buffers padded to whole vectors (zeros past d in Q); K / V rows hold at
// least d / d_v elements (no read past them), never null (callers substitute a row of zeros).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "cpu/micro_gemm.h"
#include "cpu/tile_config.h"
#include "cpu/vec_math.h"

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

#if defined(__GNUC__)
namespace few_rows {

template <typename Acc, int kBytes>
struct VecOf {
  typedef Acc type __attribute__((vector_size(kBytes)));
};

// A vector's halves added until 16 bytes are left (one extract and add each).
template <typename Acc, int kBytes = kVectorBytes>
inline typename VecOf<Acc, 16>::type fold16(typename VecOf<Acc, kBytes>::type v) {
  if constexpr (kBytes > 16) {
    using Half = typename VecOf<Acc, kBytes / 2>::type;
    Half lo, hi;
    std::memcpy(&lo, &v, sizeof(Half));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(Half), sizeof(Half));
    return fold16<Acc, kBytes / 2>(lo + hi);
  } else {
    return v;
  }
}

// The sum of a vector's lanes: folded to 16 bytes, then the lanes.
template <typename Acc>
inline Acc lane_sum(typename VecReg<Acc>::type v) {
  const auto r = fold16<Acc>(v);
  if constexpr (16 / sizeof(Acc) == 4) {
    return (r[0] + r[2]) + (r[1] + r[3]);
  } else {
    return r[0] + r[1];
  }
}

// Lanes I0..I3 of the concatenation [x, y] of two 4-lane fp32 vectors (GCC before 12 has no
// __builtin_shufflevector, clang no __builtin_shuffle).
template <int I0, int I1, int I2, int I3>
inline typename VecOf<float, 16>::type pick(typename VecOf<float, 16>::type x, typename VecOf<float, 16>::type y) {
#if defined(__clang__)
  return __builtin_shufflevector(x, y, I0, I1, I2, I3);
#else
  typedef int32_t Lanes __attribute__((vector_size(16)));
  return __builtin_shuffle(x, y, Lanes{I0, I1, I2, I3});
#endif
}

// The lane sums of four fp32 vectors as one 16-byte vector, [sum a, sum b, sum c, sum d]: halves folded to 16
// bytes, then two rounds of pairing lanes across the four (a transpose fused with the adds), where four separate
// lane_sum calls would take three times the instructions.
inline typename VecOf<float, 16>::type lane_sums4(typename VecReg<float>::type a, typename VecReg<float>::type b,
                                                  typename VecReg<float>::type c, typename VecReg<float>::type d) {
  using V4 = typename VecOf<float, 16>::type;
  const V4 a4 = fold16<float>(a), b4 = fold16<float>(b), c4 = fold16<float>(c), d4 = fold16<float>(d);
  // [a0 + a2, b0 + b2, a1 + a3, b1 + b3] and the same for c, d; then [Σa, Σb, Σc, Σd].
  const V4 ab = pick<0, 4, 1, 5>(a4, b4) + pick<2, 6, 3, 7>(a4, b4);
  const V4 cd = pick<0, 4, 1, 5>(c4, d4) + pick<2, 6, 3, 7>(c4, d4);
  return pick<0, 1, 4, 5>(ab, cd) + pick<2, 3, 6, 7>(ab, cd);
}

// n (<= kVec) elements of a row widened to Acc, zeros past n; n == kVec is a whole-vector load.
template <typename Acc, bool kWhole, typename T>
inline typename VecReg<Acc>::type load_widened(const T* p, int n = CpuTiles<Acc>::kVec) {
  using V = typename VecReg<Acc>::type;
  constexpr int kVec = CpuTiles<Acc>::kVec;
  V v;
  if constexpr (kWhole && std::is_same_v<T, Acc>) {
    std::memcpy(&v, p, sizeof(V));
  } else if constexpr (kWhole && std::is_same_v<T, bfloat16_t> && std::is_same_v<Acc, float>) {
    // bf16 is the top half of an fp32: zero-extend the 16-bit words and shift them up. GCC lowers the generic
    // form below to two half-width extensions and an insert; the intrinsics are one extension from memory.
#if defined(__AVX512F__)
    static_assert(kVec == 16, "load_widened: a 512-bit vector of fp32");
    // (The zero-masked form: GCC 12 warns that the plain one's undefined pass-through is uninitialised.)
    const __m512i w = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff),
                                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    typename VecOf<uint32_t, 64>::type words;
    std::memcpy(&words, &w, sizeof(words));
    words <<= 16;
    std::memcpy(&v, &words, sizeof(V));
#elif defined(__AVX2__)
    static_assert(kVec == 8, "load_widened: a 256-bit vector of fp32");
    const __m256i w =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
    std::memcpy(&v, &w, sizeof(V));
#else
    using Narrow = typename VecOf<uint16_t, kVec * 2>::type;
    using Wide = typename VecOf<uint32_t, kVec * 4>::type;
    Narrow h;
    std::memcpy(&h, p, sizeof(Narrow));
    const Wide w = __builtin_convertvector(h, Wide) << 16;
    std::memcpy(&v, &w, sizeof(V));
#endif
#if defined(__AVX512F__) || defined(__F16C__)
  } else if constexpr (kWhole && std::is_same_v<T, half_t> && std::is_same_v<Acc, float>) {
    // fp16: the hardware conversion, where the level has one (x86-64-v3 and up).
#if defined(__AVX512F__)
    const __m512 w = _mm512_maskz_cvtph_ps(__mmask16(0xffff), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
    static_assert(kVec == 8, "load_widened: a 256-bit vector of fp32");
    const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
    std::memcpy(&v, &w, sizeof(V));
#endif
  } else {
    Acc t[kVec];
    for (int c = 0; c < kVec; ++c) t[c] = c < n ? widen(p[c < n ? c : 0]) : Acc(0);
    std::memcpy(&v, t, sizeof(V));
  }
  return v;
}

// Sᵀ[kj][ri] (s + kj * lds + ri) = K(kj) · Q(ri) for KJ keys and RI query rows.
template <typename T, typename Acc, int KJ, int RI>
void score_block(const T* const* k, const Acc* __restrict q, int64_t ldq, int64_t d, Acc* __restrict s,
                 int64_t lds) {
  using V = typename VecReg<Acc>::type;
  constexpr int kVec = CpuTiles<Acc>::kVec;
  V acc[KJ][RI];
  FA_UNROLL(8)
  for (int kj = 0; kj < KJ; ++kj) {
    FA_UNROLL(8)
    for (int ri = 0; ri < RI; ++ri) acc[kj][ri] = V{};
  }
  auto step = [&](int64_t c, auto whole, int n) {
    V kv[KJ];
    FA_UNROLL(8)
    for (int kj = 0; kj < KJ; ++kj) kv[kj] = load_widened<Acc, decltype(whole)::value>(k[kj] + c, n);
    FA_UNROLL(8)
    for (int ri = 0; ri < RI; ++ri) {
      V qv;
      std::memcpy(&qv, q + ri * ldq + c, sizeof(V));
      FA_UNROLL(8)
      for (int kj = 0; kj < KJ; ++kj) acc[kj][ri] += kv[kj] * qv;
    }
  };
  const int64_t whole = d / kVec * kVec;
  for (int64_t c = 0; c < whole; c += kVec) step(c, std::true_type{}, kVec);
  if (whole < d) step(whole, std::false_type{}, int(d - whole));
  FA_UNROLL(8)
  for (int kj = 0; kj < KJ; ++kj) {
    if constexpr (RI == 4 && std::is_same_v<Acc, float>) {
      const auto sums = lane_sums4(acc[kj][0], acc[kj][1], acc[kj][2], acc[kj][3]);
      std::memcpy(s + kj * lds, &sums, sizeof(sums));
    } else {
      FA_UNROLL(8)
      for (int ri = 0; ri < RI; ++ri) s[kj * lds + ri] = lane_sum<Acc>(acc[kj][ri]);
    }
  }
}

template <typename T, typename Acc, int KJ>
void score_rows(const T* const* k, const Acc* q, int64_t ldq, int64_t d, Acc* s, int64_t lds, int rows) {
  constexpr int RI = CpuTiles<Acc>::kMicroRows;
  static_assert(RI == 4, "score_rows: the row tails below assume 4-row passes");
  int i = 0;
  for (; i + RI <= rows; i += RI) score_block<T, Acc, KJ, RI>(k, q + i * ldq, ldq, d, s + i, lds);
  switch (rows - i) {
    case 3: return score_block<T, Acc, KJ, 3>(k, q + i * ldq, ldq, d, s + i, lds);
    case 2: return score_block<T, Acc, KJ, 2>(k, q + i * ldq, ldq, d, s + i, lds);
    case 1: return score_block<T, Acc, KJ, 1>(k, q + i * ldq, ldq, d, s + i, lds);
    default: return;
  }
}

// O(r) = alpha(r) O(r) + Σ_j P[j][r] V(j) on columns [col, col + NV vectors) of MR rows; kWhole: every vector is
// whole, else NV is 1 and the vector holds the last n < kVec columns of V.
template <typename T, typename Acc, int MR, int NV, bool kWhole>
void output_block(int64_t nk, const Acc* __restrict p, int64_t lds, const T* const* v, int64_t col, int n,
                  Acc* __restrict o, int64_t ldo, const Acc* __restrict alpha) {
  using V = typename VecReg<Acc>::type;
  constexpr int kVec = CpuTiles<Acc>::kVec;
  V acc[MR][NV];
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int nv = 0; nv < NV; ++nv) {
      std::memcpy(&acc[r][nv], o + r * ldo + col + nv * kVec, sizeof(V));
      acc[r][nv] *= alpha[r];
    }
  }
  for (int64_t j = 0; j < nk; ++j) {
    V vv[NV];
    FA_UNROLL(8)
    for (int nv = 0; nv < NV; ++nv) vv[nv] = load_widened<Acc, kWhole>(v[j] + col + nv * kVec, n);
    FA_UNROLL(8)
    for (int r = 0; r < MR; ++r) {
      const Acc pj = p[j * lds + r];
      FA_UNROLL(8)
      for (int nv = 0; nv < NV; ++nv) acc[r][nv] += pj * vv[nv];
    }
  }
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int nv = 0; nv < NV; ++nv) std::memcpy(o + r * ldo + col + nv * kVec, &acc[r][nv], sizeof(V));
  }
}

template <typename T, typename Acc, int MR>
void output_rows(int64_t nk, const Acc* p, int64_t lds, const T* const* v, int64_t dv, Acc* o, int64_t ldo,
                 const Acc* alpha) {
  constexpr int kVec = CpuTiles<Acc>::kVec, NV = CpuTiles<Acc>::kMicroVecs;
  const int64_t whole = dv / kVec * kVec;
  int64_t col = 0;
  for (; col + NV * kVec <= whole; col += NV * kVec)
    output_block<T, Acc, MR, NV, true>(nk, p, lds, v, col, kVec, o, ldo, alpha);
  for (; col < whole; col += kVec) output_block<T, Acc, MR, 1, true>(nk, p, lds, v, col, kVec, o, ldo, alpha);
  if (whole < dv) output_block<T, Acc, MR, 1, false>(nk, p, lds, v, whole, int(dv - whole), o, ldo, alpha);
}

}  // namespace few_rows

// Sᵀ[j][i] (s + j * lds + i) = K(j) · Q(i) for j < nk, i < rows: k[j] row j of the key tile (d elements of T),
// Q row i at q + i * ldq (Acc, zeros from d to the next whole vector).
template <typename T, typename Acc>
void few_row_scores(int64_t nk, int rows, int64_t d, const T* const* k, const Acc* q, int64_t ldq, Acc* s,
                    int64_t lds) {
  constexpr int KJ = CpuTiles<Acc>::kMicroVecs;
  int64_t j = 0;
  for (; j + KJ <= nk; j += KJ) few_rows::score_rows<T, Acc, KJ>(k + j, q, ldq, d, s + j * lds, lds, rows);
  for (; j < nk; ++j) few_rows::score_rows<T, Acc, 1>(k + j, q, ldq, d, s + j * lds, lds, rows);
}

// O(i) = alpha(i) O(i) + Σ_{j < nk} P[j][i] V(j) for i < rows: P key-major (p + j * lds + i), v[j] row j of the
// value tile (dv elements of T), O row i at o + i * ldo (Acc; columns from dv to the next whole vector stay 0).
template <typename T, typename Acc>
void few_row_output(int64_t nk, int rows, int64_t dv, const Acc* p, int64_t lds, const T* const* v, Acc* o,
                    int64_t ldo, const Acc* alpha) {
  constexpr int MR = CpuTiles<Acc>::kMicroRows;
  static_assert(MR == 4, "few_row_output: the row tails below assume 4-row passes");
  int i = 0;
  for (; i + MR <= rows; i += MR) few_rows::output_rows<T, Acc, MR>(nk, p + i, lds, v, dv, o + i * ldo, ldo, alpha + i);
  switch (rows - i) {
    case 3: return few_rows::output_rows<T, Acc, 3>(nk, p + i, lds, v, dv, o + i * ldo, ldo, alpha + i);
    case 2: return few_rows::output_rows<T, Acc, 2>(nk, p + i, lds, v, dv, o + i * ldo, ldo, alpha + i);
    case 1: return few_rows::output_rows<T, Acc, 1>(nk, p + i, lds, v, dv, o + i * ldo, ldo, alpha + i);
    default: return;
  }
}
#else
// Plain loops for other compilers (vectorised or not at their discretion), with the same contract.

template <typename T, typename Acc>
void few_row_scores(int64_t nk, int rows, int64_t d, const T* const* k, const Acc* q, int64_t ldq, Acc* s,
                    int64_t lds) {
  for (int64_t j = 0; j < nk; ++j)
    for (int i = 0; i < rows; ++i) {
      Acc sum = Acc(0);
      for (int64_t c = 0; c < d; ++c) sum += widen(k[j][c]) * q[i * ldq + c];
      s[j * lds + i] = sum;
    }
}

template <typename T, typename Acc>
void few_row_output(int64_t nk, int rows, int64_t dv, const Acc* p, int64_t lds, const T* const* v, Acc* o,
                    int64_t ldo, const Acc* alpha) {
  for (int i = 0; i < rows; ++i) {
    Acc* oi = o + i * ldo;
    for (int64_t c = 0; c < dv; ++c) oi[c] *= alpha[i];
    for (int64_t j = 0; j < nk; ++j)
      for (int64_t c = 0; c < dv; ++c) oi[c] += p[j * lds + i] * widen(v[j][c]);
  }
}
#endif

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
