// The one plain parameter struct every backend reads. Built and checked by `flashattn::attention_forward` /
// `attention_backward` from tensor views; engines that already validated their inputs may fill it directly and
// call `run_forward` / `run_backward`.
//
// Logical layout (any strides, last dimension contiguous):
//   Q [batch, seqlen_q, heads_q,  head_dim]      O  [batch, seqlen_q, heads_q, head_dim_v]
//   K [batch, seqlen_k, heads_kv, head_dim]      V  [batch, seqlen_k, heads_kv, head_dim_v]
//   LSE [batch, heads_q, seqlen_q], fp32, row stride 1 (natural-log log-sum-exp of the scaled scores)
// Varlen: cu_seqlens_q/k (int32, batch + 1 entries, on the tensors' device) are set; Q/K/V/O are then
// [total, heads, dim] with batch stride unused, seqlen_q/k hold the maximum lengths, and LSE is
// [heads_q, total_q] (lse_head_stride = total_q, lse_batch_stride unused).
#pragma once

#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

// Mask semantics, shared by every backend. For query row i of a sequence with s_q queries and s_k keys, let
// diag = i + s_k - s_q (bottom-right alignment, as flash-attn >= 2.1). Key j is visible iff
//   (!causal || j <= diag) && (window_left < 0 || j >= diag - window_left)
//                          && (window_right < 0 || j <= diag + window_right).
struct FwdParams {
  DType dtype = DType::bf16;
  Device device;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: the forward then does not write it

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  int64_t batch = 0;
  int64_t seqlen_q = 0, seqlen_k = 0;  // the maximum lengths in varlen mode
  int64_t heads_q = 0, heads_kv = 0;   // heads_q % heads_kv == 0; query head h reads KV head h / (heads_q / heads_kv)
  int64_t head_dim = 0, head_dim_v = 0;

  const int32_t* cu_seqlens_q = nullptr;  // both set (varlen) or both null
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;       // varlen only: the packed row counts

  float softmax_scale = 0.f;  // already resolved: never the "default" sentinel here
  float softcap = 0.f;        // 0 = off; else scores become softcap * tanh(scores / softcap)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;

  void* stream = nullptr;  // cudaStream_t for CUDA backends
  int num_threads = 0;     // CPU backends: 0 = all hardware threads

  bool is_varlen() const { return cu_seqlens_q != nullptr; }
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;  // like O
  void* dq = nullptr;          // like Q
  void* dk = nullptr;          // like K
  void* dv = nullptr;          // like V

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;  // bitwise-identical gradients from run to run
};

}  // namespace flashattn
