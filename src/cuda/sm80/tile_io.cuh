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

// float8_e4m3fn tiles through shared memory, widened to float16 (exact: the float8 kernels compute in float16
// whatever their output type). Tiles loaded once (Q) convert on their way in (e4m3_chunk_half); streamed tiles
// arrive as bytes in a plain row-major staging tile (kD bytes per row: each thread reads back only what it copied,
// so no swizzle is needed), 16 bytes per chunk, and each thread then widens its own chunks into the swizzled
// 16-bit tile (convert_e4m3_tile).
constexpr int kE4m3Chunk = 16;  // float8 elements (bytes) per staging copy

// The 8 bytes at src + col as one 16-byte chunk of float16 (load_e4m3_bytes' zeros included).
__device__ __forceinline__ uint4 e4m3_chunk_half(const uint8_t* src, int col, int cols_valid, bool in, bool vec) {
  return e4m3x8_to_half(load_e4m3_bytes(src, col, cols_valid, in, vec));
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

// This thread's kChunk-column chunks of a kRows x kCols tile, as load_tile assigns them: column chunk
// t % (kCols / kChunk) of rows row(i) = t / (kCols / kChunk) + i * kRowsPerPass, i < kPasses.
template <int kRows, int kCols, int kThreads, int kChunk = 8>
struct ThreadChunks {
  static constexpr int kChunksPerRow = kCols / kChunk;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  int row0 = int(threadIdx.x) / kChunksPerRow;
  int col = (int(threadIdx.x) % kChunksPerRow) * kChunk;
  __device__ __forceinline__ int row(int i) const { return row0 + i * kRowsPerPass; }
};
template <int kRows, int kD, int kThreads>
using E4m3Chunks = ThreadChunks<kRows, kD, kThreads, kE4m3Chunk>;

// Rows [0, kRows) of a global float8 tile (row r at g + r * row_stride) into the staging tile `s`, rows >=
// rows_valid and columns >= cols_valid as zeros.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_e4m3_tile(uint8_t* s, const uint8_t* g, int64_t row_stride, int rows_valid,
                                               int cols_valid, bool vec) {
  using Chunks = E4m3Chunks<kRows, kD, kThreads>;
  const Chunks c;
#pragma unroll
  for (int i = 0; i < Chunks::kPasses; ++i) {
    const int row = c.row(i);
    copy_e4m3_chunk(s + row * kD + c.col, row < rows_valid ? g + row * row_stride : nullptr, g, c.col, cols_valid,
                    vec);
  }
}

// This thread's chunks of the staging tile `staged` (kRows x kD bytes) widened (exactly) into the swizzled float16
// tile `s`.
template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void convert_e4m3_tile(__half* s, const uint8_t* staged) {
  using Chunks = E4m3Chunks<kRows, kD, kThreads>;
  const Chunks c;
#pragma unroll
  for (int i = 0; i < Chunks::kPasses; ++i) {
    const int row = c.row(i);
    const uint4 bytes = *reinterpret_cast<const uint4*>(staged + row * kD + c.col);
    *reinterpret_cast<uint4*>(s + swizzle<kD>(row, c.col)) = e4m3x8_to_half(make_uint2(bytes.x, bytes.y));
    *reinterpret_cast<uint4*>(s + swizzle<kD>(row, c.col + 8)) = e4m3x8_to_half(make_uint2(bytes.z, bytes.w));
  }
}

// Copies rows [0, kRows) x columns [0, kD) of a global tile (element (r, c) at g[r * row_stride + c]) into
// the swizzled shared tile `s`, zero-filling rows >= rows_valid and columns >= cols_valid. All kThreads
// threads of the block call it; the fast path only issues cp.async (the caller commits and waits).
// Thread t always copies column chunk t % (kD / 8) of rows t / (kD / 8) + i * kRowsPerPass: one global pointer
// and one shared offset per thread, stepped by constants, so that the kernel's main loop keeps no per-chunk
// addresses alive (they cost registers: hoisted out of the loop, 16 chunk addresses spilled).
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t row_stride, int rows_valid, int cols_valid,
                                          bool vec) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  static_assert(kRowsPerPass % 8 == 0 || kRowsPerPass == 4, "the swizzle phase (row & 7) is known per pass");
  const int row0 = int(threadIdx.x) / kChunksPerRow;
  const int col = (int(threadIdx.x) % kChunksPerRow) * 8;
  T* dst = s + swizzle<kD>(row0, col);
  // With 4 rows per pass (128 threads on 256 columns) the odd passes sit 4 rows further in the swizzle phase:
  // their chunk index differs from the first pass's in bit 2, a fixed shift of 4 chunks one way or the other.
  const int odd_pass_shift = kRowsPerPass % 8 == 0 ? 0 : ((((col >> 3) ^ (row0 & 7)) & 4) ? -32 : 32);
  auto pass_offset = [&](int i) { return i * kRowsPerPass * kD + (i & 1) * odd_pass_shift; };
  const T* src = g + row0 * row_stride + col;
  const int64_t src_step = int64_t(kRowsPerPass) * row_stride;
  const bool col_in = col < cols_valid;
  if (vec) {
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const bool in = col_in && row0 + i * kRowsPerPass < rows_valid;
      // The source of a zero-filled chunk is not read; the tile base keeps the address a valid one.
      cp_async_16(dst + pass_offset(i), in ? src + i * src_step : g, in);
    }
  } else {
    // Not unrolled: the slow path must not hold many gathered chunks in registers next to the accumulators.
#pragma unroll 1
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
      const bool in = col_in && row0 + i * kRowsPerPass < rows_valid;
      *reinterpret_cast<uint4*>(dst + pass_offset(i)) = gather_chunk(src + i * src_step, col, cols_valid, in);
    }
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
