// Host side of TMA: building CUtensorMap descriptors for the sm90 kernels. The driver function that encodes
// them (cuTensorMapEncodeTiled) is fetched at run time through the runtime's driver entry point, so the
// library never links against libcuda. Only the CUDA headers' types are used here.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "flashattn/types.h"

namespace flashattn::detail {

// A rank-4 tiled tensor map over 16-bit (fp16, bf16) or 8-bit (e4m3) elements with 128-byte swizzle, for boxes of
// `box_rows` rows of 128 contiguous bytes (one swizzle panel: 64 or 128 elements; wider tiles take one copy per
// panel).
//   dims (innermost first) {cols, rows, heads, batch}; strides in elements for rows, heads, batch.
// Requires a 16-byte aligned base and strides that are multiples of 16 bytes. Out-of-range rows and columns arrive
// as zeros. swizzle_bytes 64: rows of 64 bytes swizzled by 64 bytes instead (e4m3 Q and K at hd 64).
Status make_tensor_map_sw128(CUtensorMap* map, const void* base, DType dtype, const int64_t dims[4],
                             const int64_t strides[3], int box_rows, int swizzle_bytes = 128);

// A rank-2 map over per-row fp32 values stored [heads][head_stride] (the backward's LSE and D), for boxes of
// `box_rows` consecutive rows of one head, unswizzled. Requires a 16-byte aligned base and head_stride a multiple
// of 4; rows past `rows` arrive as zeros.
Status make_tensor_map_f32_rows(CUtensorMap* map, const float* base, int64_t rows, int64_t heads,
                                int64_t head_stride, int box_rows);

}  // namespace flashattn::detail
