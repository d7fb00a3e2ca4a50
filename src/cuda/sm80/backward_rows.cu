// Host launchers of the backward's row-wise kernels (bwd_preprocess_kernel, bwd_dq_convert_kernel in
// backward_kernels.cuh), shared by the sm80 backward and the Hopper backward, which runs the same preprocess
// and conversion around its own main kernel. One warp per (query row, query head); nothing to do for no rows.
#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/sm80/backward_launch.cuh"
#include "cuda/sm80/backward_kernels.cuh"

namespace flashattn::detail {
namespace {

constexpr int kRowThreads = 256;

unsigned blocks_for_row_warps(int64_t warps) { return unsigned((warps * 32 + kRowThreads - 1) / kRowThreads); }

template <template <typename> class Launch>
Status for_dtype(DType dtype, const cuda::sm80::BwdKernelArgs& a, cudaStream_t stream) {
  const int64_t row_warps = a.rows_q * a.heads_q;
  if (row_warps == 0) return Status::success();
  if (dtype == DType::f16)
    Launch<__half>::run(a, blocks_for_row_warps(row_warps), stream);
  else
    Launch<__nv_bfloat16>::run(a, blocks_for_row_warps(row_warps), stream);
  FA_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

template <typename T>
struct Preprocess {
  static void run(const cuda::sm80::BwdKernelArgs& a, unsigned blocks, cudaStream_t s) {
    cuda::sm80::bwd_preprocess_kernel<T><<<blocks, kRowThreads, 0, s>>>(a);
  }
};
template <typename T>
struct DqConvert {
  static void run(const cuda::sm80::BwdKernelArgs& a, unsigned blocks, cudaStream_t s) {
    cuda::sm80::bwd_dq_convert_kernel<T><<<blocks, kRowThreads, 0, s>>>(a);
  }
};

}  // namespace

Status sm80_backward_preprocess(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream) {
  return for_dtype<Preprocess>(dtype, a, stream);
}

Status sm80_backward_dq_convert(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream) {
  return for_dtype<DqConvert>(dtype, a, stream);
}

}  // namespace flashattn::detail
