// The per-bucket launch sequence of the sm80 backward (host code), shared by backward_hd64/128/256.cu, each
// of which instantiates it for fp16 and bf16 so that the buckets compile in parallel. On params.stream:
//   1. memset dq_accum (non-deterministic mode)     2. bwd_preprocess_kernel (D = rowsum(dO∘O), LSE·log2e)
//   3. bwd_dkdv_kernel (dK, dV; dQ atomics)          4. bwd_dq_convert_kernel, or bwd_dq_kernel (deterministic)
// (2 and 4 through backward_rows.cu's launchers, which the Hopper backward shares.)
// The workspace (D, LSE·log2e, and dq_accum unless deterministic) comes from the library's stream-ordered pool
// (cuda/workspace.h) and goes back to it on the same stream, so the whole call is capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "backend.h"
#include "cuda/check.h"
#include "cuda/sm80/backward_args.cuh"
#include "cuda/workspace.h"

namespace flashattn::detail {

// The sm80 backward with a chosen pipeline depth: 0 = the deepest that fits the device's shared memory (what
// cuda_sm80_backward runs), 1 or 2 forced (tests use 1 to cover the small-shared-memory path on any GPU); and
// a shared-memory budget: 0 = the device's, less to run the tiles of a smaller GPU (tests: 99 KB).
Status cuda_sm80_backward_staged(const BwdParams& p, int stages, int smem_limit = 0);

// BwdParams narrowed to the kernels' arguments (workspace pointers left null, ws_head_stride = rows_q).
cuda::sm80::BwdKernelArgs sm80_backward_args(const BwdParams& p);

// The row-wise kernels around a backward's main kernel (backward_rows.cu): D = rowsum(dO∘O) and LSE·log2e into
// the workspace, and dQ = dq_accum·scale written as the dtype. Asynchronous on `stream`.
Status sm80_backward_preprocess(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream);
Status sm80_backward_dq_convert(const cuda::sm80::BwdKernelArgs& a, DType dtype, cudaStream_t stream);

// One per head-dim bucket (both dtypes), defined in backward_hd<bucket>.cu.
Status sm80_backward_hd64(const cuda::sm80::BwdKernelArgs& a, const BwdParams& p, cudaStream_t s, int max_smem,
                          int stages);
Status sm80_backward_hd128(const cuda::sm80::BwdKernelArgs& a, const BwdParams& p, cudaStream_t s, int max_smem,
                           int stages);
Status sm80_backward_hd256(const cuda::sm80::BwdKernelArgs& a, const BwdParams& p, cudaStream_t s, int max_smem,
                           int stages);

}  // namespace flashattn::detail

#ifdef FA_SM80_BACKWARD_INSTANTIATE
#include "cuda/sm80/backward_kernels.cuh"

namespace flashattn::detail {

using cuda::sm80::BwdConfig;
using cuda::sm80::BwdKernelArgs;
using cuda::sm80::kBwdThreads;

// Shared memory one call needs with `stages` pipeline stages: the main kernel's, or the deterministic dQ
// kernel's where that is larger.
template <typename C>
int backward_smem_need(const BwdParams& p, int stages) {
  const int main_bytes = C::main_smem_bytes(stages), dq_bytes = p.deterministic ? C::dq_smem_bytes(stages) : 0;
  return main_bytes > dq_bytes ? main_bytes : dq_bytes;
}

template <typename T, int kD, bool kCompact>
Status sm80_backward_launch(BwdKernelArgs a, const BwdParams& p, cudaStream_t stream, int max_smem, int stages) {
  using C = BwdConfig<kD, kCompact>;
  auto need = [&](int st) { return backward_smem_need<C>(p, st); };
  if (stages == 0) stages = need(C::kMaxStages) <= max_smem ? C::kMaxStages : 1;
  if (stages < 1 || stages > C::kMaxStages) return Status::invalid("cuda_sm80: backward pipeline depth must be 1 or 2");
  if (need(stages) > max_smem) {
    return Status::unsupported("cuda_sm80: the backward for head dim bucket " + std::to_string(kD) + " needs " +
                               std::to_string(need(stages)) + " bytes of shared memory per block; device " +
                               std::to_string(p.device.index) + " allows " + std::to_string(max_smem));
  }
  a.stages = stages;
  const int main_bytes = C::main_smem_bytes(stages), dq_bytes = C::dq_smem_bytes(stages);
  const int64_t n_key_blocks = (p.seqlen_k + C::kN - 1) / C::kN;
  const int64_t n_query_blocks = (p.seqlen_q + C::kM - 1) / C::kM;
  if (p.batch > 65535 || p.heads_q > 65535 || n_key_blocks > 0x7fffffff || n_query_blocks > 0x7fffffff) {
    return Status::unsupported("cuda_sm80: backward grid too large (batch or heads above 65535)");
  }

  // Workspace: D and lse_log2 [heads_q][rows_q] each, then (non-deterministic) dq_accum [heads_q][rows_q][kD],
  // each part 256-byte aligned (the float2 reductions need 8).
  const size_t row_elems = size_t(p.heads_q) * size_t(a.rows_q);
  const size_t row_padded = (row_elems + 63) / 64 * 64;
  const size_t accum_elems = p.deterministic ? 0 : row_elems * size_t(kD);
  const size_t ws_bytes = (2 * row_padded + accum_elems) * sizeof(float);
  void* ws = nullptr;
  if (ws_bytes > 0) {
    Status got = workspace_alloc(&ws, ws_bytes, p.device.index, stream);
    if (!got.ok()) return got;
  }
  a.dsum = static_cast<float*>(ws);
  a.lse_log2 = a.dsum + row_padded;
  a.dq_accum = accum_elems ? a.lse_log2 + row_padded : nullptr;
  a.dq_accum_ld = kD;

  // ALiBi, dropout and chunks run in kernels of their own (kExtras), so that the plain kernels' registers stay as
  // they were.
  const bool extras = p.has_extras();
  Status st = [&]() -> Status {
    if (accum_elems) FA_CUDA_TRY(cudaMemsetAsync(a.dq_accum, 0, accum_elems * sizeof(float), stream));
    Status pre = sm80_backward_preprocess(a, p.dtype, stream);
    if (!pre.ok()) return pre;
    if (n_key_blocks > 0 && p.batch > 0) {
      auto kernel = extras ? cuda::sm80::bwd_dkdv_kernel<T, kD, kCompact, true>
                           : cuda::sm80::bwd_dkdv_kernel<T, kD, kCompact, false>;
      FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, main_bytes));
      const dim3 grid(unsigned(n_key_blocks), unsigned(p.heads_kv), unsigned(p.batch));
      kernel<<<grid, kBwdThreads, main_bytes, stream>>>(a);
      FA_CUDA_TRY(cudaGetLastError());
    }
    if (p.deterministic) {
      if (n_query_blocks > 0 && p.batch > 0) {
        auto kernel = extras ? cuda::sm80::bwd_dq_kernel<T, kD, kCompact, true>
                             : cuda::sm80::bwd_dq_kernel<T, kD, kCompact, false>;
        FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_bytes));
        const dim3 grid(unsigned(n_query_blocks), unsigned(p.heads_q), unsigned(p.batch));
        kernel<<<grid, kBwdThreads, dq_bytes, stream>>>(a);
        FA_CUDA_TRY(cudaGetLastError());
      }
      return Status::success();
    }
    return sm80_backward_dq_convert(a, p.dtype, stream);
  }();
  if (ws) {
    Status freed = workspace_free(ws, stream);
    if (st.ok()) st = freed;
  }
  return st;
}


// The regular tiles where one stage of them fits, else the compact tiles where the bucket has them (else the
// regular launch reports what it needs).
template <typename T, int kD>
Status sm80_backward_tiles(const BwdKernelArgs& a, const BwdParams& p, cudaStream_t stream, int max_smem,
                           int stages) {
  if constexpr (cuda::sm80::kBwdHasCompactTiles<kD>) {
    if (backward_smem_need<BwdConfig<kD>>(p, 1) > max_smem)
      return sm80_backward_launch<T, kD, true>(a, p, stream, max_smem, stages);
  }
  return sm80_backward_launch<T, kD, false>(a, p, stream, max_smem, stages);
}

template <int kD>
Status sm80_backward_bucket(const BwdKernelArgs& a, const BwdParams& p, cudaStream_t stream, int max_smem,
                            int stages) {
  return p.dtype == DType::f16 ? sm80_backward_tiles<__half, kD>(a, p, stream, max_smem, stages)
                               : sm80_backward_tiles<__nv_bfloat16, kD>(a, p, stream, max_smem, stages);
}

}  // namespace flashattn::detail
#endif  // FA_SM80_BACKWARD_INSTANTIATE
