// Moving tiles between the caller's strided tensors (any of the four storage types) and the flash path's
// per-thread fp32 / fp64 buffers. Buffers have padded row lengths (multiples of the vector width); the padding
// is zero-filled so that the micro-kernels can run whole vectors over it without reading garbage (0 * NaN would
// poison a row).
#pragma once

#include <cstdint>
#include <cstring>
#include <new>

#include "cpu/vec_math.h"

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

// dst[r * ld + c] = widen(row(r)[c]) * scale for c < cols; zero for cols <= c < ld, and the whole row where row(r)
// is null (a paged cache's row of no valid page).
template <typename Acc, typename RowPtr>
void load_rows_from(RowPtr row, int64_t rows, int64_t cols, Acc* dst, int64_t ld, Acc scale = Acc(1)) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* s = row(r);
    Acc* d = dst + r * ld;
    const int64_t filled = s != nullptr ? cols : 0;
    for (int64_t c = 0; c < filled; ++c) d[c] = widen(s[c]) * scale;
    for (int64_t c = filled; c < ld; ++c) d[c] = Acc(0);
  }
}

// load_rows_from rows src_rs apart.
template <typename Acc, typename T>
void load_rows(const T* src, int64_t src_rs, int64_t rows, int64_t cols, Acc* dst, int64_t ld, Acc scale = Acc(1)) {
  load_rows_from<Acc>([=](int64_t r) { return src + r * src_rs; }, rows, cols, dst, ld, scale);
}

// Transposed: dst[c * ld + r] = widen(row(r)[c]) * scale for r < rows, c < cols, row(r) a pointer to row r (rows
// anywhere: the packed query rows of several heads); columns rows <= r < padded_rows of dst are zero-filled.
template <typename Acc, typename RowPtr>
void load_transposed_rows(RowPtr row, int64_t rows, int64_t cols, Acc* dst, int64_t ld, int64_t padded_rows,
                          Acc scale = Acc(1)) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* s = row(r);
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = widen(s[c]) * scale;
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = rows; r < padded_rows; ++r) dst[c * ld + r] = Acc(0);
}

// load_transposed_rows of rows src_rs apart: dst[c * ld + r] = widen(src[r * src_rs + c]) * scale.
template <typename Acc, typename T>
void load_transposed(const T* src, int64_t src_rs, int64_t rows, int64_t cols, Acc* dst, int64_t ld,
                     int64_t padded_rows, Acc scale = Acc(1)) {
  load_transposed_rows<Acc>([=](int64_t r) { return src + r * src_rs; }, rows, cols, dst, ld, padded_rows, scale);
}

// bf16 in pairs, the operand of the pair dot products (micro_gemm.h, gemm_bf16_pairs): elements 2c and 2c + 1 of a
// row in one 32-bit word, the first in the low half; a missing last element of an odd row is 0.
inline uint32_t bf16_pair(const bfloat16_t* row, int64_t c2, int64_t cols) {
  const uint32_t lo = row[2 * c2].bits, hi = 2 * c2 + 1 < cols ? row[2 * c2 + 1].bits : 0u;
  return lo | (hi << 16);
}

// fp32 values rounded to bf16 (to_bfloat16) in pairs, for the pair dot products' operands computed in fp32 (the
// backward's P and dS) and fp32 copies of bf16 inputs (exact): rows 2 r2 and 2 r2 + 1 of src (ld apart; rows past
// `rows` are 0) interleaved column by column, dst[r2 * cols + c] = (src(2 r2, c), src(2 r2 + 1, c)), for
// r2 < ceil(rows / 2).
inline void pack_row_pairs(const float* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst) {
  for (int64_t r2 = 0; 2 * r2 < rows; ++r2) {
    const float* x = src + 2 * r2 * ld;
    uint32_t* d = dst + r2 * cols;
    if (2 * r2 + 1 < rows) {
      const float* y = x + ld;
      for (int64_t c = 0; c < cols; ++c)
        d[c] = uint32_t(to_bfloat16(x[c]).bits) | uint32_t(to_bfloat16(y[c]).bits) << 16;
    } else {
      for (int64_t c = 0; c < cols; ++c) d[c] = uint32_t(to_bfloat16(x[c]).bits);
    }
  }
}

// The same along a row: dst[c2] = (src[2 c2], src[2 c2 + 1]) rounded to bf16, for c2 < ceil(cols / 2) (a missing
// last element is 0).
inline void pack_adjacent_pairs(const float* src, int64_t cols, uint32_t* dst) {
  for (int64_t c2 = 0; 2 * c2 + 1 < cols; ++c2)
    dst[c2] = uint32_t(to_bfloat16(src[2 * c2]).bits) | uint32_t(to_bfloat16(src[2 * c2 + 1]).bits) << 16;
  if (cols % 2) dst[cols / 2] = uint32_t(to_bfloat16(src[cols - 1]).bits);
}

// dst[r * ld + c2] = the pair (c2) of row r, for c2 < ceil(cols / 2); zero for the rest of ld.
template <typename RowPtr>
void load_row_pairs_from(RowPtr row, int64_t rows, int64_t cols, uint32_t* dst, int64_t ld) {
  const int64_t pairs = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const bfloat16_t* s = row(r);
    uint32_t* d = dst + r * ld;
    const int64_t filled = s != nullptr ? pairs : 0;  // null: a paged cache's row of no valid page, zeros
    for (int64_t c2 = 0; c2 < filled; ++c2) d[c2] = bf16_pair(s, c2, cols);
    for (int64_t c2 = filled; c2 < ld; ++c2) d[c2] = 0u;
  }
}

inline void load_row_pairs(const bfloat16_t* src, int64_t src_rs, int64_t rows, int64_t cols, uint32_t* dst,
                           int64_t ld) {
  load_row_pairs_from([=](int64_t r) { return src + r * src_rs; }, rows, cols, dst, ld);
}

// Transposed: dst[c2 * ld + r] = the pair (c2) of row r for r < rows; columns rows <= r < padded_rows are zero.
template <typename RowPtr>
void load_transposed_pairs_rows(RowPtr row, int64_t rows, int64_t cols, uint32_t* dst, int64_t ld,
                                int64_t padded_rows) {
  const int64_t pairs = (cols + 1) / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const bfloat16_t* s = row(r);
    for (int64_t c2 = 0; c2 < pairs; ++c2) dst[c2 * ld + r] = bf16_pair(s, c2, cols);
  }
  for (int64_t c2 = 0; c2 < pairs; ++c2)
    for (int64_t r = rows; r < padded_rows; ++r) dst[c2 * ld + r] = 0u;
}

inline void load_transposed_pairs(const bfloat16_t* src, int64_t src_rs, int64_t rows, int64_t cols, uint32_t* dst,
                                  int64_t ld, int64_t padded_rows) {
  load_transposed_pairs_rows([=](int64_t r) { return src + r * src_rs; }, rows, cols, dst, ld, padded_rows);
}

// row(r)[c] = narrow(src[r * ld + c] * row_scale[r]) for c < cols (row_scale may be null: 1); row(r) a pointer
// to destination row r, of element type T.
template <typename T, typename Acc, typename RowPtr>
void store_rows_to(const Acc* src, int64_t ld, int64_t rows, int64_t cols, RowPtr row,
                   const Acc* row_scale = nullptr, Acc scale = Acc(1)) {
  for (int64_t r = 0; r < rows; ++r) {
    const Acc s = (row_scale ? row_scale[r] : Acc(1)) * scale;
    const Acc* in = src + r * ld;
    T* out = row(r);
    for (int64_t c = 0; c < cols; ++c) out[c] = narrow<T>(in[c] * s);
  }
}

// store_rows_to rows dst_rs apart: dst[r * dst_rs + c] = narrow(src[r * ld + c] * row_scale[r]).
template <typename T, typename Acc>
void store_rows(const Acc* src, int64_t ld, int64_t rows, int64_t cols, T* dst, int64_t dst_rs,
                const Acc* row_scale = nullptr, Acc scale = Acc(1)) {
  store_rows_to<T>(src, ld, rows, cols, [=](int64_t r) { return dst + r * dst_rs; }, row_scale, scale);
}

// An uninitialised, cache-line aligned buffer (tiles start on a line, so that vector loads do not split lines).
template <typename T>
class AlignedBuffer {
 public:
  static constexpr std::align_val_t kAlign{64};
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t n) { resize(n); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  void resize(int64_t n) {
    if (n <= size_) return;
    release();
    data_ = static_cast<T*>(::operator new(size_t(n) * sizeof(T), kAlign));
    size_ = n;
  }
  T* data() { return data_; }
  int64_t size() const { return size_; }

 private:
  void release() {
    if (data_) ::operator delete(data_, kAlign);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
