// Warp- and block-level tile operations of the sm80 backward, built on src/cuda/primitives.cuh:
//   warp_mma      : a warp's C (MI*16 x NI*8, fp32 registers) += A * B, both operands from shared memory, each
//                   either row-major ("plain") or transposed, so the five backward products read the same
//                   staged Q, dO, K, V, P, dS tiles without copies.
//   load_tile     : a block copies a rows x cols global tile into padded shared memory, zero-filling rows and
//                   columns past the valid extent; cp.async (16 B) when the tensor is 16-byte aligned, plain
//                   element loads otherwise. load_full_tile: the same for a whole, aligned tile, without tests.
//   for_each_acc  : visits a C fragment with its (row, column) inside the warp tile.
#pragma once

#include <cstdint>

#include "cuda/primitives.cuh"

namespace flashattn::cuda::sm80 {

// Operand storage in shared memory (ld = row pitch in elements):
//   A plain : A(m, k) at a[m * ld + k]        A trans : A(m, k) at a[k * ld + m]
//   B plain : B(k, n) at b[n * ld + k]        B trans : B(k, n) at b[k * ld + n]
// "Plain" is what mma's row.col wants (k contiguous); "trans" is read with ldmatrix.trans.
//
// Lane addressing (lane = 8 * i + r, i = which 8x8 matrix of an x4 load, r = its row):
//   A plain : matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a[0..3]
//             -> row m = lane & 15, column k = (lane >> 4) * 8
//   A trans : the same four matrices, stored k-major: stored row k = (lane & 7) + (lane >> 4) * 8,
//             column m = ((lane >> 3) & 1) * 8
//   B plain : (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) = b[ni][0..1], b[ni+1][0..1]
//             -> row n = (lane & 7) + (lane >> 4) * 8, column k = ((lane >> 3) & 1) * 8
//   B trans : same four, stored k-major: stored row k = lane & 15, column n = (lane >> 4) * 8
template <typename T, int MI, int NI, int KSteps, bool kATrans, bool kBTrans>
__device__ __forceinline__ void warp_mma(float (&acc)[MI][NI][4], const T* a, int lda, const T* b, int ldb,
                                         int lane) {
  static_assert(NI % 2 == 0, "B fragments are loaded two n-blocks at a time");
  const T* a_lane = kATrans ? a + ((lane & 7) + (lane >> 4) * 8) * lda + ((lane >> 3) & 1) * 8
                            : a + (lane & 15) * lda + (lane >> 4) * 8;
  const T* b_lane = kBTrans ? b + (lane & 15) * ldb + (lane >> 4) * 8
                            : b + ((lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < KSteps; ++ks) {
    uint32_t af[MI][4];
    uint32_t bf[NI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      if constexpr (kATrans) {
        ldmatrix_x4_trans(af[mi], a_lane + ks * 16 * lda + mi * 16);
      } else {
        ldmatrix_x4(af[mi], a_lane + mi * 16 * lda + ks * 16);
      }
    }
#pragma unroll
    for (int ni = 0; ni < NI; ni += 2) {
      uint32_t r[4];
      if constexpr (kBTrans) {
        ldmatrix_x4_trans(r, b_lane + ks * 16 * ldb + ni * 8);
      } else {
        ldmatrix_x4(r, b_lane + ni * 8 * ldb + ks * 16);
      }
      bf[ni][0] = r[0];
      bf[ni][1] = r[1];
      bf[ni + 1][0] = r[2];
      bf[ni + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) mma_16x8x16<T>(acc[mi][ni], af[mi], bf[ni]);
    }
  }
}

template <int MI, int NI>
__device__ __forceinline__ void zero_acc(float (&acc)[MI][NI][4]) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.f;
}

// Row (within the warp tile) of C-fragment element c of m-block mi, and column of element c of n-block ni:
// c[0..1] = (group, 2*quad..+1), c[2..3] = (group + 8, 2*quad..+1).
__device__ __forceinline__ int acc_row(int mi, int half, int lane) { return mi * 16 + half * 8 + (lane >> 2); }
__device__ __forceinline__ int acc_col(int ni, int lane) { return ni * 8 + (lane & 3) * 2; }

// Block-wide copy of a kRows x kCols tile (kCols a multiple of 8) from global memory (row pitch `row_stride`
// elements) into shared memory (pitch `ld`). Rows >= rows_valid and columns >= cols_valid arrive as zeros.
// `vec_ok`: base pointer and row stride are 16-byte aligned, so each 8-element chunk is one cp.async; the
// caller commits and waits. Otherwise plain loads and stores (visible after the caller's __syncthreads).
// `gmem` must point at a valid element (row 0 of the tile, which callers only load when it exists).
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile(T* smem, int ld, const T* gmem, int64_t row_stride, int rows_valid,
                                          int cols_valid, bool vec_ok, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
  static_assert(kCols % 8 == 0, "tiles are whole 16-byte chunks wide");
  if (vec_ok) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = it * kThreads + tid;
      if (kChunks % kThreads == 0 || idx < kChunks) {
        const int row = idx / kChunksPerRow;
        const int col = (idx % kChunksPerRow) * 8;
        int elems = cols_valid - col;
        elems = row < rows_valid ? (elems < 0 ? 0 : (elems > 8 ? 8 : elems)) : 0;
        const T* src = elems > 0 ? gmem + row * row_stride + col : gmem;
        cp_async_16_partial(smem + row * ld + col, src, elems * int(sizeof(T)));
      }
    }
  } else {
    const T zero = T(0.f);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = it * kThreads + tid;
      if (kChunks % kThreads == 0 || idx < kChunks) {
        const int row = idx / kChunksPerRow;
        const int col = (idx % kChunksPerRow) * 8;
        const T* src = gmem + row * row_stride + col;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          smem[row * ld + col + e] = (row < rows_valid && col + e < cols_valid) ? src[e] : zero;
        }
      }
    }
  }
}

// load_tile's common case: every row and column of the tile exists and the tensor is 16-byte aligned. Each
// thread copies the same column chunk of every (kThreads / chunks per row)-th row, so its source advances by one
// constant stride per chunk: a few instructions per 16 bytes instead of load_tile's per-chunk bounds and
// address arithmetic, which is most of a query block's non-mma instructions in the main kernel's loop.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_full_tile(T* smem, int ld, const T* gmem, int64_t row_stride, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  static_assert(kCols % 8 == 0 && kThreads % kChunksPerRow == 0, "each thread keeps one column chunk");
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kRows % kRowsPerPass == 0, "whole passes of the block over the tile");
  const int row = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  const T* src = gmem + row * row_stride + col;
  T* dst = smem + row * ld + col;
  const int64_t pass_stride = kRowsPerPass * row_stride;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    cp_async_16(dst + pass * kRowsPerPass * ld, src, true);
    src += pass_stride;
  }
}

}  // namespace flashattn::cuda::sm80
