// Register-blocked matrix product for the CPU flash path: C (M x N) = A (M x K) * B (K x N), optionally added
// to C, whose rows may first be rescaled (the online-softmax correction of the output).
//
// Why this shape: every product the forward and backward need has one operand that is read a scalar at a time
// and broadcast (A, any layout: that is how P and dS are used transposed without a transposed copy) and one
// read as contiguous rows (B). The micro-kernel keeps a kMicroRows x kMicroCols block of C in registers and
// for each k does kMicroRows broadcasts, kMicroVecs vector loads and kMicroRows * kMicroVecs FMAs, written with
// the GCC / Clang vector extension (portable C++, any target width) with compile-time trip counts that the
// compiler fully unrolls. Plain scalar loops were tried first: GCC's vectoriser turned them into the intended
// broadcast-FMA form for some instantiations and into scalar code or k-loop reductions (10-20x slower) for
// others. In the attention loops the kernel runs at about 90% of one core's FMA peak with AVX-512.
//
// Preconditions: N is a multiple of CpuTiles<T>::kVec (callers pad rows of their fp32/fp64 buffers); A, B and C
// do not overlap.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "cpu/tile_config.h"

#define FA_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define FA_UNROLL(n) FA_PRAGMA(unroll)
#elif defined(__GNUC__)
#define FA_UNROLL(n) FA_PRAGMA(GCC unroll n)
#else
#define FA_UNROLL(n)
#endif

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

enum class GemmMode : int {
  overwrite,  // C = A B
  add,        // C += A B
  scale_add,  // C = diag(row_scale) C + A B
};

#if defined(__GNUC__)
// One vector register of T, through the GCC / Clang vector extension: portable C++ (the compiler lowers it to
// whatever width the target has), but with the register blocking stated rather than hoped for.
template <typename T>
struct VecReg {
  typedef T type __attribute__((vector_size(kVectorBytes)));
};

template <typename T, int MR, int NV, GemmMode kMode>
void micro_tile(int64_t K, const T* __restrict a, int64_t a_rs, int64_t a_ks, const T* __restrict b, int64_t ldb,
                T* __restrict c, int64_t ldc, const T* __restrict row_scale) {
  using V = typename VecReg<T>::type;
  constexpr int kVec = CpuTiles<T>::kVec;
  V acc[MR][NV];
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) {
      if constexpr (kMode == GemmMode::overwrite) {
        acc[r][v] = V{};
      } else {
        std::memcpy(&acc[r][v], c + r * ldc + v * kVec, sizeof(V));
        if constexpr (kMode == GemmMode::scale_add) acc[r][v] *= row_scale[r];
      }
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    V bk[NV];
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) std::memcpy(&bk[v], b + k * ldb + v * kVec, sizeof(V));
    FA_UNROLL(8)
    for (int r = 0; r < MR; ++r) {
      const T ar = a[r * a_rs + k * a_ks];
      FA_UNROLL(8)
      for (int v = 0; v < NV; ++v) acc[r][v] += ar * bk[v];
    }
  }
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) std::memcpy(c + r * ldc + v * kVec, &acc[r][v], sizeof(V));
  }
}
#else
// Plain-loop form for other compilers (vectorised or not at their discretion).
template <typename T, int MR, int NV, GemmMode kMode>
void micro_tile(int64_t K, const T* __restrict a, int64_t a_rs, int64_t a_ks, const T* __restrict b, int64_t ldb,
                T* __restrict c, int64_t ldc, const T* __restrict row_scale) {
  constexpr int NR = NV * CpuTiles<T>::kVec;
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r) {
    const T s = kMode == GemmMode::scale_add ? row_scale[r] : T(1);
    for (int n = 0; n < NR; ++n) acc[r][n] = kMode == GemmMode::overwrite ? T(0) : c[r * ldc + n] * s;
  }
  for (int64_t k = 0; k < K; ++k)
    for (int r = 0; r < MR; ++r)
      for (int n = 0; n < NR; ++n) acc[r][n] += a[r * a_rs + k * a_ks] * b[k * ldb + n];
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) c[r * ldc + n] = acc[r][n];
}
#endif

namespace gemm_impl {

template <typename T>
using TileFn = void (*)(int64_t, const T*, int64_t, int64_t, const T*, int64_t, T*, int64_t, const T*);

// fn[mr - 1][nv - 1] = micro_tile<T, mr, nv, kMode>: the full tile and every row / column tail.
template <typename T, GemmMode kMode>
struct TileTable {
  static constexpr int kRows = CpuTiles<T>::kMicroRows;
  static constexpr int kVecs = CpuTiles<T>::kMicroVecs;
  TileFn<T> fn[kRows][kVecs] = {};

  template <int MR, int... NVs>
  constexpr void fill_row(std::integer_sequence<int, NVs...>) {
    ((fn[MR - 1][NVs] = &micro_tile<T, MR, NVs + 1, kMode>), ...);
  }
  template <int... MRs>
  constexpr explicit TileTable(std::integer_sequence<int, MRs...>) {
    (fill_row<MRs + 1>(std::make_integer_sequence<int, kVecs>{}), ...);
  }
};

template <typename T, GemmMode kMode>
inline const TileTable<T, kMode>& tile_table() {
  static const TileTable<T, kMode> table(std::make_integer_sequence<int, CpuTiles<T>::kMicroRows>{});
  return table;
}

template <typename T, GemmMode kMode>
void gemm_mode(int64_t M, int64_t N, int64_t K, const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t ldb,
               T* c, int64_t ldc, const T* row_scale) {
  constexpr int kVec = CpuTiles<T>::kVec;
  constexpr int MR = CpuTiles<T>::kMicroRows;
  constexpr int NR = CpuTiles<T>::kMicroCols;
  const auto& table = tile_table<T, kMode>();
  // Column panels outermost: a K x NR panel of B stays in L1 while every row block of A streams past it.
  for (int64_t n0 = 0; n0 < N; n0 += NR) {
    const int nv = int((N - n0 < NR ? N - n0 : NR) / kVec);
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int mr = int(M - m0 < MR ? M - m0 : MR);
      table.fn[mr - 1][nv - 1](K, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc,
                               row_scale ? row_scale + m0 : nullptr);
    }
  }
}

}  // namespace gemm_impl

// C = A B (or C += A B, or C = diag(row_scale) C + A B). A(r, k) = a[r * a_rs + k * a_ks]; row k of B starts at
// b + k * ldb; row r of C at c + r * ldc; row_scale has M entries (scale_add only).
template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t ldb, T* c,
          int64_t ldc, GemmMode mode, const T* row_scale = nullptr) {
  switch (mode) {
    case GemmMode::overwrite:
      return gemm_impl::gemm_mode<T, GemmMode::overwrite>(M, N, K, a, a_rs, a_ks, b, ldb, c, ldc, row_scale);
    case GemmMode::add:
      return gemm_impl::gemm_mode<T, GemmMode::add>(M, N, K, a, a_rs, a_ks, b, ldb, c, ldc, row_scale);
    case GemmMode::scale_add:
      return gemm_impl::gemm_mode<T, GemmMode::scale_add>(M, N, K, a, a_rs, a_ks, b, ldb, c, ldc, row_scale);
  }
}

#if defined(__AVX512BF16__) && defined(__GNUC__)
// C (M x N, fp32) = scale · A B (GemmMode::overwrite) or C += scale · A B (add) for bf16 A (M x 2 K2) and B
// (2 K2 x N) stored in pairs (tile_io.h, bf16_pair): word a[r * a_rs + k2 * a_ks] holds A(r, 2 k2) and
// A(r, 2 k2 + 1); row k2 of B (b + k2 * ldb, N words) holds, per column n, B(2 k2, n) and B(2 k2 + 1, n). One
// vdpbf16ps multiplies 16 columns by both elements of a pair: the products of two bf16 are exact in fp32, so C is
// the fp32 product of the same values up to the order of its additions (and subnormal terms flushed to zero), at
// twice the fp32 FMA's rate (bench/results/cpu.md). N a multiple of 16.
constexpr bool kBf16PairProducts = true;

template <int MR, int NV, bool kAdd>
void micro_tile_bf16_pairs(int64_t K2, const uint32_t* __restrict a, int64_t a_rs, int64_t a_ks,
                           const uint32_t* __restrict b, int64_t ldb, float* __restrict c, int64_t ldc, float scale) {
  __m512 acc[MR][NV];
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512bh bk[NV];
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) bk[v] = (__m512bh)_mm512_loadu_si512(b + k2 * ldb + 16 * v);
    FA_UNROLL(8)
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(a[r * a_rs + k2 * a_ks]));
      FA_UNROLL(8)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bk[v]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  FA_UNROLL(8)
  for (int r = 0; r < MR; ++r) {
    FA_UNROLL(8)
    for (int v = 0; v < NV; ++v) {
      float* cv = c + r * ldc + 16 * v;
      _mm512_storeu_ps(cv, kAdd ? _mm512_fmadd_ps(acc[r][v], s, _mm512_loadu_ps(cv)) : _mm512_mul_ps(acc[r][v], s));
    }
  }
}

namespace gemm_impl {
using PairTileFn = void (*)(int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, float*, int64_t,
                            float);

// fn[add][rows - 1][vectors - 1].
struct PairTileTable {
  static constexpr int kRows = CpuTiles<float>::kMicroRows;
  static constexpr int kVecs = CpuTiles<float>::kMicroVecs;
  PairTileFn fn[2][kRows][kVecs] = {};
  template <int MR, int... NVs>
  constexpr void fill_row(std::integer_sequence<int, NVs...>) {
    ((fn[0][MR - 1][NVs] = &micro_tile_bf16_pairs<MR, NVs + 1, false>), ...);
    ((fn[1][MR - 1][NVs] = &micro_tile_bf16_pairs<MR, NVs + 1, true>), ...);
  }
  template <int... MRs>
  constexpr explicit PairTileTable(std::integer_sequence<int, MRs...>) {
    (fill_row<MRs + 1>(std::make_integer_sequence<int, kVecs>{}), ...);
  }
};
}  // namespace gemm_impl

// mode: overwrite or add (scale_add is the fp32 gemm's alone).
inline void gemm_bf16_pairs(int64_t M, int64_t N, int64_t K2, const uint32_t* a, int64_t a_rs, int64_t a_ks,
                            const uint32_t* b, int64_t ldb, float* c, int64_t ldc, GemmMode mode,
                            float scale = 1.f) {
  constexpr int MR = CpuTiles<float>::kMicroRows, NR = CpuTiles<float>::kMicroCols;
  static_assert(CpuTiles<float>::kVec == 16, "gemm_bf16_pairs: 16 fp32 columns per vector");
  static const gemm_impl::PairTileTable table(std::make_integer_sequence<int, MR>{});
  const int add = mode == GemmMode::add ? 1 : 0;
  for (int64_t n0 = 0; n0 < N; n0 += NR) {
    const int nv = int((N - n0 < NR ? N - n0 : NR) / 16);
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int mr = int(M - m0 < MR ? M - m0 : MR);
      table.fn[add][mr - 1][nv - 1](K2, a + m0 * a_rs, a_rs, a_ks, b + n0, ldb, c + m0 * ldc + n0, ldc, scale);
    }
  }
}
#else
constexpr bool kBf16PairProducts = false;
// Declared for the kernels' `if constexpr (kBf16PairProducts)` branches, which this level never instantiates.
void gemm_bf16_pairs(int64_t M, int64_t N, int64_t K2, const uint32_t* a, int64_t a_rs, int64_t a_ks,
                     const uint32_t* b, int64_t ldb, float* c, int64_t ldc, GemmMode mode, float scale = 1.f);
#endif

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
