// Encodes TMA descriptors through the driver entry point (see tensor_map.h for why no libcuda link).
#include "cuda/sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <string>

namespace flashattn::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(Status* st) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    // 12000: the ABI version of cuTensorMapEncodeTiled this file was written against.
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &query);
    if (err == cudaSuccess && query == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  if (!fn) {
    *st = Status::device(std::string("cuda_sm90: cuTensorMapEncodeTiled not available from the driver (") +
                         cudaGetErrorName(err) + ", query result " + std::to_string(int(query)) + ")");
  }
  return fn;
}

}  // namespace

Status make_tensor_map_sw128(CUtensorMap* map, const void* base, DType dtype, const int64_t dims[4],
                             const int64_t strides[3], int box_rows, int swizzle_bytes) {
  if (dtype != DType::bf16 && dtype != DType::f16 && dtype != DType::e4m3)
    return Status::unsupported("cuda_sm90: TMA maps are for fp16, bf16 and e4m3");
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0)
    return Status::unsupported("cuda_sm90: tensor base address not 16-byte aligned");
  const int64_t elem_bytes = int64_t(dtype_size(dtype));
  // The widest box inner extent the swizzle allows.
  if (swizzle_bytes != 128 && swizzle_bytes != 64) return Status::unsupported("cuda_sm90: TMA swizzle of 128 or 64 bytes");
  const uint32_t panel_cols = uint32_t(swizzle_bytes / elem_bytes);
  for (int i = 0; i < 3; ++i) {
    if ((strides[i] * elem_bytes) % 16 != 0)
      return Status::unsupported("cuda_sm90: TMA needs strides that are multiples of 16 bytes, got " +
                                 std::to_string(strides[i]) + " elements");
  }
  if (box_rows < 1 || box_rows > 256) return Status::unsupported("cuda_sm90: TMA box rows must be in 1..256");
  Status st;
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn(&st);
  if (!fn) return st;

  cuuint64_t gdim[4], gstride[3];
  for (int i = 0; i < 4; ++i) gdim[i] = cuuint64_t(dims[i] < 1 ? 1 : dims[i]);
  for (int i = 0; i < 3; ++i) gstride[i] = cuuint64_t(strides[i] * elem_bytes);
  const cuuint32_t box[4] = {panel_cols, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = dtype == DType::bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                         : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult r = fn(map, type,
                        4, const_cast<void*>(base), gdim, gstride, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::device("cuda_sm90: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)));
  return Status::success();
}

Status make_tensor_map_f32_rows(CUtensorMap* map, const float* base, int64_t rows, int64_t heads,
                                int64_t head_stride, int box_rows) {
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0)
    return Status::unsupported("cuda_sm90: row-value base address not 16-byte aligned");
  if (head_stride % 4 != 0) return Status::unsupported("cuda_sm90: row-value head stride not a multiple of 16 bytes");
  if (box_rows < 1 || box_rows > 256) return Status::unsupported("cuda_sm90: TMA box rows must be in 1..256");
  Status st;
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn(&st);
  if (!fn) return st;
  const cuuint64_t gdim[2] = {cuuint64_t(rows < 1 ? 1 : rows), cuuint64_t(heads < 1 ? 1 : heads)};
  const cuuint64_t gstride[1] = {cuuint64_t(head_stride) * sizeof(float)};
  const cuuint32_t box[2] = {cuuint32_t(box_rows), 1};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), gdim, gstride, box,
                        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::device("cuda_sm90: cuTensorMapEncodeTiled (fp32 rows) failed with CUresult " + std::to_string(int(r)));
  return Status::success();
}

}  // namespace flashattn::detail
