// sm80 backward entry point: checks what the kernels need, turns validated BwdParams into kernel arguments
// (alignment facts included) and hands them to the head-dim bucket's launcher (backward_launch.cuh).
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "backend.h"
#include "cuda/check.h"
#include "cuda/sm80/backward_launch.cuh"

namespace flashattn::detail {

using cuda::sm80::BwdKernelArgs;

namespace {

constexpr float kLog2e = 1.4426950408889634f;

bool aligned(const void* p, int64_t bytes, int64_t elem_size, std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) != 0) return false;
  for (int64_t s : strides)
    if ((s * elem_size) % bytes != 0) return false;
  return true;
}

}  // namespace

BwdKernelArgs sm80_backward_args(const BwdParams& p) {
  const int64_t rows_q = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;
  BwdKernelArgs a{};
  a.q = p.q, a.k = p.k, a.v = p.v, a.o = p.o, a.dout = p.dout, a.lse = p.lse;
  a.dq = p.dq, a.dk = p.dk, a.dv = p.dv;
  a.q_batch_stride = p.q_batch_stride, a.q_row_stride = p.q_row_stride, a.q_head_stride = p.q_head_stride;
  a.k_batch_stride = p.k_batch_stride, a.k_row_stride = p.k_row_stride, a.k_head_stride = p.k_head_stride;
  a.v_batch_stride = p.v_batch_stride, a.v_row_stride = p.v_row_stride, a.v_head_stride = p.v_head_stride;
  a.o_batch_stride = p.o_batch_stride, a.o_row_stride = p.o_row_stride, a.o_head_stride = p.o_head_stride;
  a.do_batch_stride = p.do_batch_stride, a.do_row_stride = p.do_row_stride, a.do_head_stride = p.do_head_stride;
  a.dq_batch_stride = p.dq_batch_stride, a.dq_row_stride = p.dq_row_stride, a.dq_head_stride = p.dq_head_stride;
  a.dk_batch_stride = p.dk_batch_stride, a.dk_row_stride = p.dk_row_stride, a.dk_head_stride = p.dk_head_stride;
  a.dv_batch_stride = p.dv_batch_stride, a.dv_row_stride = p.dv_row_stride, a.dv_head_stride = p.dv_head_stride;
  a.lse_batch_stride = p.lse_batch_stride, a.lse_head_stride = p.lse_head_stride;
  a.cu_seqlens_q = p.cu_seqlens_q, a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqlen_q = int(p.seqlen_q), a.seqlen_k = int(p.seqlen_k);
  a.batch = int(p.batch), a.heads_q = int(p.heads_q), a.heads_kv = int(p.heads_kv);
  a.group = int(p.heads_q / p.heads_kv);
  a.head_dim = int(p.head_dim), a.head_dim_v = int(p.head_dim_v);
  a.scale = p.softmax_scale;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.softcap = p.softcap;
  a.tanh_scale = p.softcap > 0 ? p.softmax_scale / p.softcap : 0.f;
  a.softcap_log2 = p.softcap * kLog2e;
  a.causal = p.causal;
  a.window_left = p.window_left, a.window_right = p.window_right;
  a.attention_chunk = p.attention_chunk;
  a.alibi_slopes = p.alibi_slopes, a.alibi_batch_stride = p.alibi_slopes_batch_stride;
  a.dropout_p = p.dropout_p, a.dropout_rng = DropoutRng::of(p);
  a.rows_q = rows_q;
  a.ws_head_stride = rows_q;
  a.ws_seq_align = 1;
  a.accumulate_dq = !p.deterministic;

  constexpr int64_t e = 2;  // bytes per fp16 / bf16 element
  a.vec_q = aligned(p.q, 16, e, {p.q_batch_stride, p.q_row_stride, p.q_head_stride});
  a.vec_k = aligned(p.k, 16, e, {p.k_batch_stride, p.k_row_stride, p.k_head_stride});
  a.vec_v = aligned(p.v, 16, e, {p.v_batch_stride, p.v_row_stride, p.v_head_stride});
  a.vec_do = aligned(p.dout, 16, e, {p.do_batch_stride, p.do_row_stride, p.do_head_stride});
  a.vec_o = aligned(p.o, 16, e, {p.o_batch_stride, p.o_row_stride, p.o_head_stride});
  a.vec_dq = aligned(p.dq, 16, e, {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride});
  a.pair_dq = aligned(p.dq, 4, e, {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride});
  a.pair_dk = aligned(p.dk, 4, e, {p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride});
  a.pair_dv = aligned(p.dv, 4, e, {p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride});
  return a;
}

Status cuda_sm80_backward(const BwdParams& p) { return cuda_sm80_backward_staged(p, 0); }

Status cuda_sm80_backward_staged(const BwdParams& p, int stages, int smem_limit) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return Status::unsupported(std::string("cuda_sm80: backward runs float16 and bfloat16; got ") + dtype_name(p.dtype));
  }
  if (p.seqlen_q > 0x7fffffff || p.seqlen_k > 0x7fffffff) {
    return Status::unsupported("cuda_sm80: backward sequence lengths must fit in 31 bits");
  }
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  int max_smem = 0;
  FA_CUDA_TRY(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device.index));
  if (smem_limit > 0 && smem_limit < max_smem) max_smem = smem_limit;

  const BwdKernelArgs a = sm80_backward_args(p);
  auto stream = static_cast<cudaStream_t>(p.stream);
  // The smallest compiled bucket holding both head dims; columns past d (d_v) are zero-filled in the kernels.
  const int64_t d = p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
  if (d <= 64) return sm80_backward_hd64(a, p, stream, max_smem, stages);
  if (d <= 128) return sm80_backward_hd128(a, p, stream, max_smem, stages);
  if (d <= 256) return sm80_backward_hd256(a, p, stream, max_smem, stages);
  return Status::unsupported("cuda_sm80: backward head dims above 256 (got " + std::to_string(d) + ")");
}

}  // namespace flashattn::detail
