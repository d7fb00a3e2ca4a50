// Shared-memory tiles of the sm80 kernels: the swizzled layout, and the copies between global memory and it.
//
// Layout: a tile of R rows x D columns of 2-byte elements (D a multiple of 64) is stored row-major, with the
// 16-byte chunk index XOR-ed by (row & 7). ldmatrix reads one 16-byte chunk from each of 8 consecutive rows;
// unswizzled, rows 128 bytes or more apart would all hit the same four banks (an 8-way conflict). With the
// XOR the 8 chunks land in 8 different bank groups, for reads (ldmatrix) and for the 32-bit fragment writes of
// the epilogue alike.
//
// Loads: the fast path is cp.async of 16 bytes with zero-fill, which needs the global address 16-byte
// aligned: the base pointer 16-byte aligned, every stride a multiple of 8 elements and the valid column count
// a multiple of 8. The launcher checks that per tensor (`vec`); otherwise each chunk is gathered element by
// element (synchronously) and stored to shared memory as one 16-byte write. Both paths zero-fill rows past
// `rows_valid` and columns past `cols_valid`, so tails need no branch in the matrix products.
#pragma once

#include <cstdint>

#include "cuda/primitives.cuh"

namespace flashattn::cuda::sm80 {

// Element offset of (row, col) in a swizzled tile with kD columns; col % 8 is kept within the chunk.
template <int kD>
__device__ __forceinline__ int swizzle(int row, int col) {
  static_assert(kD % 64 == 0, "the swizzle permutes chunks within groups of 8");
  return row * kD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// The 8 16-bit elements of the chunk at `chunk` (column `col` of its row) read one by one, those at or past
// cols_valid, or all of them when !in, as zeros: the path for rows that are not 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 gather_chunk(const T* chunk, int col, int cols_valid, bool in) {
  const uint16_t* src16 = reinterpret_cast<const uint16_t*>(chunk);
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = (in && col + 2 * j < cols_valid) ? src16[2 * j] : 0u;
    const uint32_t hi = (in && col + 2 * j + 1 < cols_valid) ? src16[2 * j + 1] : 0u;
    w[j] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8 float8_e4m3fn bytes at src + col (a row's chunk), loaded synchronously: one 8-byte load when `vec` (8-byte
// aligned rows, cols_valid a multiple of 8), else byte by byte; those at or past cols_valid, or all of them when
// !in, as zeros.
__device__ __forceinline__ uint2 load_e4m3_bytes(const uint8_t* src, int col, int cols_valid, bool in, bool vec) {
  if (in && vec) return *reinterpret_cast<const uint2*>(src + col);
  alignas(8) uint8_t bytes[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) bytes[j] = (in && col + j < cols_valid) ? src[col + j] : uint8_t(0);
  return *reinterpret_cast<const uint2*>(bytes);
}

// float8_e4m3fn tiles in shared memory (the decode kernel's FP8 KV cache). K and V stay e4m3 there, kD bytes per
// row, and the matrix products widen each lane's own fragment bytes (warp_gemm.cuh warp_gemm_qk_e4m3 /
// warp_gemm_pv_e4m3). The 16-byte chunk c of row r is stored at chunk c ^ phase(r) (e4m3_offset), so that the rows
// one fragment load touches fall in different banks: 8 consecutive rows (Q Kᵀ reads one word of each), or rows 2q,
// 2q + 1, 2q + 8, 2q + 9 (P V) of kD >= 128 bytes; at kD = 64 two rows share a 128-byte line and the phase counts
// lines. Q, loaded once, is widened on its way in
// (load_e4m3_q), with the column order the Q Kᵀ fragments assume.
constexpr int kE4m3Chunk = 16;  // float8 elements (bytes) per staging copy

template <int kD>
__device__ __forceinline__ int e4m3_offset(int row, int byte) {
  static_assert(kD % 64 == 0, "16-byte chunks in groups that fill 128-byte lines");
  constexpr int kChunks = kD / kE4m3Chunk;
  const int phase = kChunks >= 8 ? (row & 7) : ((row >> 1) & (kChunks - 1));
  return row * kD + ((((byte >> 4) ^ phase)) << 4) + (byte & 15);
}

// One 16-byte chunk of a staging row from the global row `src` (null: zeros): cp.async when `vec` (16-byte aligned
// rows, cols_valid a multiple of 8: a chunk past it is zero-filled from there), else a synchronous byte gather;
// columns past cols_valid are zeros. `fallback` is any valid global address (a zero-filled cp.async does not
// read it).
__device__ __forceinline__ void copy_e4m3_chunk(uint8_t* dst, const uint8_t* src, const uint8_t* fallback, int col,
                                                int cols_valid, bool vec) {
  const bool in = col < cols_valid && src != nullptr;
  if (vec) {
    cp_async_16_partial(dst, in ? src + col : fallback, in ? min(kE4m3Chunk, cols_valid - col) : 0);
    return;
  }
  const uint2 lo = load_e4m3_bytes(src, col, cols_valid, in, false);
  const uint2 hi = load_e4m3_bytes(src, col + 8, cols_valid, in, false);
  *reinterpret_cast<uint4*>(dst) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}

// Rows [0, kRows) of a global float8 tile (row r at g + r * row_stride) into the e4m3 tile `s`, rows >= rows_valid
// and columns >= cols_valid as zeros.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_e4m3_tile(uint8_t* s, const uint8_t* g, int64_t row_stride, int rows_valid,
                                               int cols_valid, bool vec) {
  // load_tile's assignment: thread t copies chunk t % (kD / 16) of rows t / (kD / 16) + i * kRowsPerPass.
  constexpr int kChunksPerRow = kD / kE4m3Chunk;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  const int row0 = int(threadIdx.x) / kChunksPerRow, col = (int(threadIdx.x) % kChunksPerRow) * kE4m3Chunk;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int row = row0 + i * kRowsPerPass;
    copy_e4m3_chunk(s + e4m3_offset<kD>(row, col), row < rows_valid ? g + row * row_stride : nullptr, g, col,
                    cols_valid, vec);
  }
}

// The kRows x kD float8 Q tile (row r from row_ptr(r), null: zeros) widened into the swizzled float16 tile `s`, its
// columns permuted within each 16-column step as warp_gemm_qk_e4m3 reads K: the step's first 8 columns are the
// actual columns 0, 1, 4, 5, 8, 9, 12, 13, the next 8 the columns 2, 3, 6, 7, 10, 11, 14, 15 (float16 pairs 0, 2, 4,
// 6 and 1, 3, 5, 7). Synchronous loads (Q is read once per block).
template <int kRows, int kD, int kThreads, typename RowPtr>
__device__ __forceinline__ void load_e4m3_q(__half* s, RowPtr row_ptr, int cols_valid, bool vec) {
  constexpr int kSteps = kD / 16;
  for (int idx = int(threadIdx.x); idx < kRows * kSteps; idx += kThreads) {
    const int row = idx / kSteps, col = (idx % kSteps) * 16;
    const uint8_t* src = row_ptr(row);
    const bool in = src != nullptr;
    const uint4 lo = e4m3x8_to_half(load_e4m3_bytes(src, col, cols_valid, in && col < cols_valid, vec));
    const uint4 hi = e4m3x8_to_half(load_e4m3_bytes(src, col + 8, cols_valid, in && col + 8 < cols_valid, vec));
    *reinterpret_cast<uint4*>(s + swizzle<kD>(row, col)) = make_uint4(lo.x, lo.z, hi.x, hi.z);
    *reinterpret_cast<uint4*>(s + swizzle<kD>(row, col + 8)) = make_uint4(lo.y, lo.w, hi.y, hi.w);
  }
}

// Which chunks of a kRows x kD tile thread t copies (load_tile, load_whole_tile): column chunk t % (kD / 8) of rows
// t / (kD / 8) + i * kRowsPerPass: one global pointer and one shared offset per thread, stepped by constants, so that
// a kernel's main loop keeps no per-chunk addresses alive (they cost registers: hoisted out of the loop, 16 chunk
// addresses spilled).
template <int kRows, int kD, int kThreads>
struct TileChunks {
  static constexpr int kChunksPerRow = kD / 8;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  static_assert(kRowsPerPass % 8 == 0 || kRowsPerPass == 4, "the swizzle phase (row & 7) is known per pass");
  int row0 = int(threadIdx.x) / kChunksPerRow;
  int col = (int(threadIdx.x) % kChunksPerRow) * 8;
  // With 4 rows per pass (128 threads on 256 columns) the odd passes sit 4 rows further in the swizzle phase:
  // their chunk index differs from the first pass's in bit 2, a fixed shift of 4 chunks one way or the other.
  int odd_pass_shift = kRowsPerPass % 8 == 0 ? 0 : ((((col >> 3) ^ (row0 & 7)) & 4) ? -32 : 32);
  // Pass i's chunk in the swizzled tile, from the first pass's (swizzle<kD>(row0, col)).
  __device__ __forceinline__ int pass_offset(int i) const { return i * kRowsPerPass * kD + (i & 1) * odd_pass_shift; }
};

// Copies rows [0, kRows) x columns [0, kD) of a global tile (element (r, c) at g[r * row_stride + c]) into
// the swizzled shared tile `s`, zero-filling rows >= rows_valid and columns >= cols_valid. All kThreads
// threads of the block call it; the fast path only issues cp.async (the caller commits and waits).
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t row_stride, int rows_valid, int cols_valid,
                                          bool vec) {
  const TileChunks<kRows, kD, kThreads> chunks;
  constexpr int kRowsPerPass = chunks.kRowsPerPass;
  T* dst = s + swizzle<kD>(chunks.row0, chunks.col);
  const T* src = g + chunks.row0 * row_stride + chunks.col;
  const int64_t src_step = int64_t(kRowsPerPass) * row_stride;
  const bool col_in = chunks.col < cols_valid;
  if (vec) {
#pragma unroll
    for (int i = 0; i < chunks.kPasses; ++i) {
      const bool in = col_in && chunks.row0 + i * kRowsPerPass < rows_valid;
      // The source of a zero-filled chunk is not read; the tile base keeps the address a valid one.
      cp_async_16(dst + chunks.pass_offset(i), in ? src + i * src_step : g, in);
    }
  } else {
    // Not unrolled: the slow path must not hold many gathered chunks in registers next to the accumulators.
#pragma unroll 1
    for (int i = 0; i < chunks.kPasses; ++i) {
      const bool in = col_in && chunks.row0 + i * kRowsPerPass < rows_valid;
      *reinterpret_cast<uint4*>(dst + chunks.pass_offset(i)) =
          gather_chunk(src + i * src_step, chunks.col, cols_valid, in);
    }
  }
}

// load_tile for a tile known to be whole (every row and column in range, 16-byte aligned rows): the pointer
// stepped from pass to pass and no zero-fill selects, 2 instructions per chunk besides the copy (load_tile's
// per-chunk selects and 64-bit products took about 10).
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_whole_tile(T* s, const T* g, int64_t row_stride) {
  const TileChunks<kRows, kD, kThreads> chunks;
  T* dst = s + swizzle<kD>(chunks.row0, chunks.col);
  const T* src = g + chunks.row0 * row_stride + chunks.col;
  const int64_t src_step = int64_t(chunks.kRowsPerPass) * row_stride;
#pragma unroll
  for (int i = 0; i < chunks.kPasses; ++i) {
    cp_async_16(dst + chunks.pass_offset(i), src, true);
    src += src_step;
  }
}

// Stores rows [0, rows_valid) x columns [0, cols_valid) of the swizzled shared tile `s` (kRows x kD) to global
// memory, one 16-byte chunk per lane at a time, so a warp writes whole row segments. Called by one warp for
// the rows it owns (no block barrier needed); `vec` as for load_tile.
template <int kRows, int kD, typename T>
__device__ __forceinline__ void store_tile_warp(T* g, int64_t row_stride, const T* s, int rows_valid,
                                                int cols_valid, bool vec, int lane) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % 32 == 0, "every lane stores the same number of chunks");
#pragma unroll
  for (int i = 0; i < kChunks / 32; ++i) {
    const int c = lane + i * 32;
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 8;
    if (row >= rows_valid || col >= cols_valid) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(s + swizzle<kD>(row, col));
    T* dst = g + row * row_stride + col;
    if (vec) {
      *reinterpret_cast<uint4*>(dst) = v;
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (col + j < cols_valid) d16[j] = uint16_t(w[j / 2] >> (16 * (j % 2)));
      }
    }
  }
}

}  // namespace flashattn::cuda::sm80
