// Host side of the sm80 forward: FwdParams -> ForwardKernelArgs, the launch checks, and the launch of one
// (dtype, head-dim bucket) kernel. Instantiated once per bucket in forward_hd*.cu so that the buckets compile
// in parallel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "cuda/sm80/forward_kernel.cuh"
#include "flashattn/params.h"

namespace flashattn::cuda::sm80 {

constexpr int kMaxDevices = 64;  // devices whose shared-memory attribute setting is remembered

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16-byte vector access is safe for a tensor when its base, its three strides and its row length all keep
// every 8-element chunk on a 16-byte boundary.
inline bool vector_ok(const void* p, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int64_t dim) {
  return aligned16(p) && batch_stride % 8 == 0 && row_stride % 8 == 0 && head_stride % 8 == 0 && dim % 8 == 0;
}

// Launches one kernel (the bucket's regular or compact tile; with ALiBi, dropout or chunks, kExtras) with the
// arguments filled in.
template <typename T, int kD, bool kCompact, bool kExtras>
Status launch_forward_kernel(const FwdParams& p, ForwardKernelArgs a) {
  using Kernel = ForwardKernel<T, kD, kCompact, kExtras>;
  constexpr int kSmem = Kernel::kSmemBytes;
  a.num_m_blocks = int((p.seqlen_q + Kernel::kBlockM - 1) / Kernel::kBlockM);
  auto kernel = forward_kernel<T, kD, kCompact, kExtras>;
  // Once per device: the attribute call costs microseconds, which short launches would otherwise pay each time.
  static std::atomic<bool> smem_set[kMaxDevices];
  const bool cached = p.device.index >= 0 && p.device.index < kMaxDevices;
  if (!cached || !smem_set[p.device.index].load(std::memory_order_acquire)) {
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    if (cached) smem_set[p.device.index].store(true, std::memory_order_release);
  }
  const dim3 grid(unsigned(a.num_m_blocks), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, Kernel::kThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(a);
  FA_CUDA_TRY(cudaGetLastError());
  return Status::success();
}

// ALiBi, dropout and chunks run in kernels of their own, so that the plain kernels' registers stay as they were.
template <typename T, int kD, bool kCompact>
Status launch_forward_tile(const FwdParams& p, const ForwardKernelArgs& a) {
  return p.has_extras() ? launch_forward_kernel<T, kD, kCompact, true>(p, a)
                                                       : launch_forward_kernel<T, kD, kCompact, false>(p, a);
}

// The kernel arguments the forward and the decode kernel (decode_launch.cuh) share, under the same names: the
// tensors and their strides, head dims, the mask, the score scales, the ALiBi slopes and the 16-byte access flags.
template <typename Args>
void fill_attention_args(const FwdParams& p, Args* a) {
  a->q = p.q;
  a->k = p.k;
  a->v = p.v;
  a->o = p.o;
  a->lse = p.lse;
  a->q_batch_stride = p.q_batch_stride, a->q_row_stride = p.q_row_stride, a->q_head_stride = p.q_head_stride;
  a->k_batch_stride = p.k_batch_stride, a->k_row_stride = p.k_row_stride, a->k_head_stride = p.k_head_stride;
  a->v_batch_stride = p.v_batch_stride, a->v_row_stride = p.v_row_stride, a->v_head_stride = p.v_head_stride;
  a->o_batch_stride = p.o_batch_stride, a->o_row_stride = p.o_row_stride, a->o_head_stride = p.o_head_stride;
  a->lse_batch_stride = p.lse_batch_stride, a->lse_head_stride = p.lse_head_stride;
  a->cu_seqlens_q = p.cu_seqlens_q;
  a->seqlen_q = int(p.seqlen_q);
  a->head_group = int(p.heads_q / p.heads_kv);
  a->head_dim = int(p.head_dim);
  a->head_dim_v = int(p.head_dim_v);
  a->causal = p.causal;
  a->window_left = p.window_left;
  a->window_right = p.window_right;
  a->attention_chunk = p.attention_chunk;
  const double unit = p.softcap > 0 ? double(p.softcap) : double(p.softmax_scale);
  a->unit_scale = float(unit);
  a->scale_log2 = float(unit * 1.4426950408889634);  // log2(e)
  a->softcap_pre = p.softcap > 0 ? float(double(p.softmax_scale) / double(p.softcap)) : 0.f;
  a->alibi_slopes = p.alibi_slopes;
  a->alibi_batch_stride = p.alibi_slopes_batch_stride;
  a->q_vec = vector_ok(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.head_dim);
  a->k_vec = vector_ok(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.head_dim);
  a->v_vec = vector_ok(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.head_dim_v);
  a->o_vec = vector_ok(p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride, p.head_dim_v);
}

// smem_limit: the shared memory a block may use; 0 = what the device allows (cudaDevAttrMaxSharedMemoryPerBlockOptin).
template <typename T, int kD>
Status launch_forward(const FwdParams& p, int smem_limit) {
  ForwardKernelArgs a{};
  fill_attention_args(p, &a);
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.dropout_p = p.dropout_p, a.dropout_rng = DropoutRng::of(p);
  a.seqlen_k = int(p.seqlen_k);

  detail::DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  int smem_optin = 0;
  FA_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device.index));
  const int budget = smem_limit > 0 && smem_limit < smem_optin ? smem_limit : smem_optin;
  if (budget >= forward_smem_bytes(kD, false)) return launch_forward_tile<T, kD, false>(p, a);
  if constexpr (forward_has_compact_tile(kD)) {
    if (budget >= forward_smem_bytes(kD, true)) return launch_forward_tile<T, kD, true>(p, a);
  }
  constexpr int kLeast = forward_smem_bytes(kD, forward_has_compact_tile(kD));
  return Status::unsupported("cuda_sm80: the head-dim " + std::to_string(kD) + " forward kernel needs " +
                             std::to_string(kLeast / 1024) + " KB of shared memory per block; device " +
                             std::to_string(p.device.index) + " allows " + std::to_string(budget / 1024) + " KB");
}

}  // namespace flashattn::cuda::sm80
