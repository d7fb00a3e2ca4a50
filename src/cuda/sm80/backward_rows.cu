// Host launchers of the backward's row-wise kernels (bwd_preprocess_kernel, bwd_dq_convert_kernel in
// backward_kernels.cuh), shared by the sm80 backward and the Hopper backward, which runs the same preprocess
// and conversion around its own main kernel. A group of threads per (query row, query head) (RowLaunch); nothing
// to do for no rows.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"
#include "cuda/sm80/backward_launch.cuh"
#include "cuda/sm80/backward_kernels.cuh"

namespace flashattn::detail {
namespace {

constexpr int kRowThreads = 256;

// How the row-wise kernels cover a row of `cols` elements: 16-byte chunks where vec_rows, one per thread of a
// group of the fewest threads (a power of two, at most a warp) that covers the row in one pass; else one
// element per access, a warp per row.
struct RowLaunch {
  int group_log2;
  bool vec_rows;
  RowLaunch(int64_t cols, bool vec) : group_log2(5), vec_rows(vec && cols % cuda::sm80::kRowChunk == 0) {
    if (!vec_rows) return;
    group_log2 = 0;
    while (group_log2 < 5 && (int64_t(cuda::sm80::kRowChunk) << group_log2) < cols) ++group_log2;
  }
  unsigned blocks(const cuda::sm80::BwdKernelArgs& a) const {
    const int64_t threads = (a.rows_q * a.heads_q) << group_log2;
    return unsigned((threads + kRowThreads - 1) / kRowThreads);
  }
};

template <typename T>
void preprocess(const cuda::sm80::BwdKernelArgs& a, cudaStream_t s) {
  const RowLaunch l(a.head_dim_v, a.vec_o && a.vec_do);
  cuda::sm80::bwd_preprocess_kernel<T><<<l.blocks(a), kRowThreads, 0, s>>>(a, l.group_log2, l.vec_rows);
}

template <typename T>
void dq_convert(const cuda::sm80::BwdKernelArgs& a, cudaStream_t s) {
  const RowLaunch l(a.head_dim, a.vec_dq && reinterpret_cast<uintptr_t>(a.dq_accum) % 16 == 0 &&
                                    a.dq_accum_ld % 4 == 0);
  cuda::sm80::bwd_dq_convert_kernel<T><<<l.blocks(a), kRowThreads, 0, s>>>(a, l.group_log2, l.vec_rows);
}

Status for_dtype(DType dtype, const cuda::sm80::BwdKernelArgs& a, cudaStream_t stream,
                 void (*half_launch)(const cuda::sm80::BwdKernelArgs&, cudaStream_t),
                 void (*bf16_launch)(const cuda::sm80::BwdKernelArgs&, cudaStream_t)) {
  if (a.rows_q * a.heads_q == 0) return Status::success();
  (dtype == DType::f16 ? half_launch : bf16_launch)(a, stream);
  FA_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

}  // namespace

Status sm80_backward_preprocess(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream) {
  return for_dtype(dtype, a, stream, preprocess<__half>, preprocess<__nv_bfloat16>);
}

Status sm80_backward_dq_convert(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream) {
  return for_dtype(dtype, a, stream, dq_convert<__half>, dq_convert<__nv_bfloat16>);
}

}  // namespace flashattn::detail
