// Warp-level matrix products of the sm80 forward, on mma.sync m16n8k16 with fp32 accumulation. Scope: one
// warp; the operands live in swizzled shared tiles (tile_io.cuh) or in registers.
//
// Fragment layouts are the PTX ones (primitives.cuh). The ldmatrix lane addressing below follows from them:
// ldmatrix.x4 loads four 8x8 matrices, lane l giving the row address of row (l & 7) of matrix (l >> 3), and
// lane t receiving elements (t / 4, 2 (t % 4) .. +1) of each matrix (with .trans, the transposed pair).
#pragma once

#include "cuda/primitives.cuh"
#include "cuda/sm80/tile_io.cuh"

namespace flashattn::cuda::sm80 {

// S[mt][nt] += Q[16 mt .., :] · K[8 nt .., :]ᵀ for a warp owning kMTiles x 16 query rows.
//   sq: the warp's first query row in the swizzled Q tile (kD columns); sk: the K tile (rows = keys).
// A = Q rows: matrices (rows +0/+8) x (cols +0/+8) in the order a[0..3] needs: row offset (l >> 3 & 1) * 8,
// column offset (l >> 4) * 8. B = K rows read as "col" operand: b[0], b[1] of n-tile 2p are K rows +0..7 at
// columns +0 / +8, those of n-tile 2p+1 rows +8..15: row offset (l >> 4) * 8, column offset (l >> 3 & 1) * 8.
// The Q fragments of 16-column step ks: A operands of the warp's kMTiles m16 tiles of the swizzled tile sq.
template <typename T, int kD, int kMTiles>
__device__ __forceinline__ void q_fragments(uint32_t (&a)[kMTiles][4], const T* sq, int ks, int lane) {
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a[mt], sq + swizzle<kD>(mt * 16 + a_row, ks * 16 + a_col));
}

// S[mt][nt] += Q · Kᵀ with Q's fragments from `a_of(ks)`: read from the Q tile per step (warp_gemm_qk), or held in
// registers across key tiles (warp_gemm_qk_held).
template <typename T, int kD, int kMTiles, int kNTiles, typename QFragments>
__device__ __forceinline__ void warp_gemm_qk_with(float (&s)[kMTiles][kNTiles][4], QFragments a_of, const T* sk,
                                                  int lane) {
  static_assert(kNTiles % 2 == 0, "K fragments are loaded two n-tiles at a time");
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[kMTiles][4];
    a_of(a, ks);
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, sk + swizzle<kD>(np * 16 + b_row, ks * 16 + b_col));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_16x8x16<T>(s[mt][2 * np], a[mt], b0);
        mma_16x8x16<T>(s[mt][2 * np + 1], a[mt], b1);
      }
    }
  }
}

template <typename T, int kD, int kMTiles, int kNTiles>
__device__ __forceinline__ void warp_gemm_qk(float (&s)[kMTiles][kNTiles][4], const T* sq, const T* sk, int lane) {
  warp_gemm_qk_with<T, kD, kMTiles, kNTiles>(
      s, [&](uint32_t(&a)[kMTiles][4], int ks) { q_fragments<T, kD, kMTiles>(a, sq, ks, lane); }, sk, lane);
}

// Every Q fragment of the warp's rows (all kD / 16 steps), for a loop over key tiles that keeps Q in registers.
template <typename T, int kD, int kMTiles>
__device__ __forceinline__ void q_fragments_all(uint32_t (&a)[kD / 16][kMTiles][4], const T* sq, int lane) {
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) q_fragments<T, kD, kMTiles>(a[ks], sq, ks, lane);
}

template <typename T, int kD, int kMTiles, int kNTiles>
__device__ __forceinline__ void warp_gemm_qk_held(float (&s)[kMTiles][kNTiles][4],
                                                  const uint32_t (&q)[kD / 16][kMTiles][4], const T* sk, int lane) {
  warp_gemm_qk_with<T, kD, kMTiles, kNTiles>(
      s,
      [&](uint32_t(&a)[kMTiles][4], int ks) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = q[ks][mt][e];
      },
      sk, lane);
}

// The P operand of one 16-key step, rounded to T: the C fragments of S n-tiles 2 ks and 2 ks + 1 are exactly
// the A fragment of a 16x16 tile (a[0] / a[1]: rows g / g+8 of n-tile 2 ks; a[2] / a[3]: of n-tile 2 ks + 1),
// so P never leaves registers.
template <typename T, int kNTiles>
__device__ __forceinline__ void p_fragment(uint32_t (&a)[4], const float (&p)[kNTiles][4], int ks) {
  a[0] = pack_pair<T>(p[2 * ks][0], p[2 * ks][1]);
  a[1] = pack_pair<T>(p[2 * ks][2], p[2 * ks][3]);
  a[2] = pack_pair<T>(p[2 * ks + 1][0], p[2 * ks + 1][1]);
  a[3] = pack_pair<T>(p[2 * ks + 1][2], p[2 * ks + 1][3]);
}

// O[mt][dt] += P[mt] · V for the warp's rows; P in registers (kNTiles = keys / 8 fp32 C fragments per m-tile),
// V a swizzled tile (rows = keys, kD columns). B = V read transposed: b[0], b[1] of d-tile 2p are keys +0..7
// / +8..15 at columns +0..7, those of d-tile 2p+1 at columns +8..15: key offset (l >> 3 & 1) * 8, column
// offset (l >> 4) * 8.
template <typename T, int kD, int kMTiles, int kNTiles>
__device__ __forceinline__ void warp_gemm_pv(float (&o)[kMTiles][kD / 8][4], const float (&p)[kMTiles][kNTiles][4],
                                             const T* sv, int lane) {
  const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_col = (lane >> 4) * 8;
#pragma unroll
  for (int ks = 0; ks < kNTiles / 2; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) p_fragment<T, kNTiles>(a[mt], p[mt], ks);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sv + swizzle<kD>(ks * 16 + b_row, dp * 16 + b_col));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_16x8x16<T>(o[mt][2 * dp], a[mt], b0);
        mma_16x8x16<T>(o[mt][2 * dp + 1], a[mt], b1);
      }
    }
  }
}

// ---- float8_e4m3fn K and V straight from their e4m3 tiles (tile_io.cuh e4m3_offset), products in float16 ----
// Each lane reads whole 32-bit words of the byte tiles and widens its own fragments (one conversion per pair), so
// K and V never pass through 16-bit tiles. What that takes:
// - S = Q Kᵀ sums over d in a permuted order: in each 16-column step the B fragment's k indices 2q, 2q + 1 | 2q + 8,
//   2q + 9 are the actual columns 4q .. 4q + 3, one word of the key row; Q is stored with the same order
//   (load_e4m3_q), which leaves S unchanged.
// - O += P V: lane (g, q) reads the words at column 32 G + 4 g of keys 2q, 2q + 1, 2q + 8, 2q + 9 (four words),
//   transposes the 4 x 4 bytes in registers, and so holds the B fragments of 4 d-tiles: output column n of d-tile t
//   is the actual column e4m3_o_column(t, n). The caller puts O's columns back.
__device__ __forceinline__ int e4m3_o_column(int d_tile, int n) { return 32 * (d_tile >> 2) + 4 * n + (d_tile & 3); }

// S[mt][nt] += Q[16 mt .., :] · K[key0 + 8 nt .., :]ᵀ; sq: the warp's first query row of the permuted float16 Q
// tile; sk: the e4m3 K tile (row 0), key0: the warp's first key row in it (a multiple of 8).
template <int kD, int kMTiles, int kNTiles>
__device__ __forceinline__ void warp_gemm_qk_e4m3(float (&s)[kMTiles][kNTiles][4], const __half* sq,
                                                  const uint8_t* sk, int key0, int lane) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[kMTiles][4];
    q_fragments<__half, kD, kMTiles>(a, sq, ks, lane);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint8_t* bytes = sk + e4m3_offset<kD>(key0 + nt * 8 + g, ks * 16 + 4 * q);
      const uint32_t word = *reinterpret_cast<const uint32_t*>(bytes);
      const uint32_t b[2] = {e4m3_pair_to_half(uint16_t(word)), e4m3_pair_to_half(uint16_t(word >> 16))};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma_16x8x16<__half>(s[mt][nt], a[mt], b);
    }
  }
}

// O[mt][t] += P[mt] · V[key0 .., :] with O's columns in e4m3_o_column order; P in registers as for warp_gemm_pv,
// sv: the e4m3 V tile (row 0), key0: the warp's first key row (a multiple of 16).
template <int kD, int kMTiles, int kNTiles>
__device__ __forceinline__ void warp_gemm_pv_e4m3(float (&o)[kMTiles][kD / 8][4],
                                                  const float (&p)[kMTiles][kNTiles][4], const uint8_t* sv, int key0,
                                                  int lane) {
  const int g = lane >> 2, q = lane & 3;
  auto word = [&](int row, int byte) { return *reinterpret_cast<const uint32_t*>(sv + e4m3_offset<kD>(row, byte)); };
#pragma unroll
  for (int ks = 0; ks < kNTiles / 2; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) p_fragment<__half, kNTiles>(a[mt], p[mt], ks);
    const int row = key0 + ks * 16 + 2 * q;
#pragma unroll
    for (int group = 0; group < kD / 32; ++group) {
      const int byte = group * 32 + 4 * g;
      const uint32_t r0 = word(row, byte), r1 = word(row + 1, byte), r2 = word(row + 8, byte),
                     r3 = word(row + 9, byte);
      // Byte j of column word c_j: keys 2q, 2q + 1 (low half: b[0]) and 2q + 8, 2q + 9 (high half: b[1]).
      const uint32_t lo01 = __byte_perm(r0, r1, 0x5140), hi01 = __byte_perm(r0, r1, 0x7362);
      const uint32_t lo23 = __byte_perm(r2, r3, 0x5140), hi23 = __byte_perm(r2, r3, 0x7362);
      const uint32_t column[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                  __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t b[2] = {e4m3_pair_to_half(uint16_t(column[j])), e4m3_pair_to_half(uint16_t(column[j] >> 16))};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) mma_16x8x16<__half>(o[mt][4 * group + j], a[mt], b);
      }
    }
  }
}

}  // namespace flashattn::cuda::sm80
