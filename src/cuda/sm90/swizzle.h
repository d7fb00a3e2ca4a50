// The 128-byte swizzled tile layout shared by TMA (CU_TENSOR_MAP_SWIZZLE_128B), the wgmma descriptors and the
// tests, usable from host and device code.
//
// A [rows x cols] tile of 16-bit elements is stored as cols/64 "panels" of 64 columns; a panel is rows x 128
// bytes, row r at byte r*128, and inside a row the 16-byte chunk c is stored at chunk c ^ (r % 8). Eight rows
// form one 1024-byte swizzle atom, so every tile base is 1024-byte aligned (the hardware swizzles on address
// bits, so an aligned base makes "tile offset" and "address" swizzle alike).
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn::cuda::sm90 {

constexpr int kSwizzleBytes = 128;                    // one swizzled row: 64 16-bit elements
constexpr int kPanelCols = kSwizzleBytes / 2;         // columns per panel
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;  // 8 rows: the pattern repeats after this
constexpr int kChunkBytes = 16;                       // the unit the swizzle permutes

// Byte offset of 16-bit element (row, col) in a swizzled tile of `rows` rows (rows a multiple of 8).
FA_HD constexpr uint32_t swizzled_offset(int row, int col, int rows) {
  return uint32_t((col / kPanelCols) * rows * kSwizzleBytes + row * kSwizzleBytes +
                  ((((col % kPanelCols) * 2 / kChunkBytes) ^ (row % 8)) * kChunkBytes) + (col % 8) * 2);
}

}  // namespace flashattn::cuda::sm90
