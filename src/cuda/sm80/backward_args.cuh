// The plain struct the sm80 backward kernels read: BwdParams narrowed to what the device needs, plus the
// workspace and the per-tensor alignment facts the launcher works out once.
#pragma once

#include <cstdint>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/hd.h"
#include "common/mask.h"

namespace flashattn::cuda::sm80 {

struct BwdKernelArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  const int32_t* cu_seqlens_q;  // null: padded batch
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // padded lengths, or the maxima in varlen mode
  int batch, heads_q, heads_kv, group;
  int head_dim, head_dim_v;

  float scale;       // softmax_scale
  float scale_log2;  // softmax_scale * log2(e): exp(s * scale - lse) = exp2(s * scale_log2 - lse * log2e)
  float softcap;     // 0 = off
  float tanh_scale;    // softmax_scale / softcap: tanh's argument is s * tanh_scale
  float softcap_log2;  // softcap * log2(e)
  bool causal;
  int64_t window_left, window_right;
  int64_t attention_chunk;  // 0: none; taken by the kExtras kernels only (FwdParams::has_extras)
  const float* alibi_slopes;  // null: no ALiBi (common/alibi.h)
  int64_t alibi_batch_stride;
  float dropout_p;  // 0: no dropout (common/dropout.h)
  DropoutRng dropout_rng;

  // Workspace: D = rowsum(dO o O) and lse_log2, [heads_q][ws_head_stride] each, and the fp32 dQ accumulator
  // [heads_q][ws_head_stride][dq_accum_ld] (rows_q of each head's ws_head_stride rows are used).
  // rows_q is batch * seqlen_q (padded) or total_q (varlen); a sequence's rows start at ws_row0 (below).
  float* dsum;
  float* lse_log2;  // [heads_q][rows_q]: LSE * log2(e), +inf for rows that saw no key
  float* dq_accum;
  int64_t rows_q;
  int64_t ws_head_stride;  // rows per head in dsum, lse_log2 and dq_accum: rows_q, or more for alignment
  int ws_seq_align;        // each sequence's rows start at a multiple of this in the workspace (ws_sequence_start)
  int dq_accum_ld;
  bool accumulate_dq;  // false in deterministic mode: the dQ pass recomputes instead
  int stages;          // pipeline depth of the streamed tiles (Q/dO or K/V): 1 or 2

  // 16-byte alignment of pointer and every stride (cp.async path; O: the preprocess's 16-byte loads) per input;
  // 4-byte pairs for outputs, and 16-byte chunks of dQ (the row-wise conversion).
  bool vec_q, vec_k, vec_v, vec_do, vec_o;
  bool pair_dq, pair_dk, pair_dv, vec_dq;
};

// First workspace row of batch entry b whose rows start at row `start` of the tensors (packed or b * seqlen_q):
// `start` itself with align 1 (the sm80 kernels), else rounded down to a multiple of `align` after b * align
// rows of slack, so that every sequence starts aligned (the Hopper backward loads LSE and D with TMA, whose
// box starts must be 16-byte aligned) and sequences do not overlap: entry b + 1 starts at least
// align * (floor(len_b / align) + 1) > len_b rows later. Rows used: at most rows_q + batch * align. `align` is a
// power of two (rounding down is then a mask, not a 64-bit division in every thread of the row-wise kernels).
FA_HD int64_t ws_sequence_start(int64_t start, int64_t b, int align) {
  return align == 1 ? start : (start + b * align) & ~int64_t(align - 1);
}

// Where batch entry b lives: packed offsets in varlen mode, b * seqlen otherwise.
struct SeqExtent {
  int64_t start_q, start_k;  // first row inside the tensors (varlen) or 0
  int64_t ws_row0;           // first row inside the workspace
  int len_q, len_k;
};

__device__ __forceinline__ SeqExtent seq_extent(const BwdKernelArgs& a, int b) {
  SeqExtent e;
  if (a.cu_seqlens_q != nullptr) {
    const int q0 = a.cu_seqlens_q[b], q1 = a.cu_seqlens_q[b + 1];
    const int k0 = a.cu_seqlens_k[b], k1 = a.cu_seqlens_k[b + 1];
    e.start_q = q0;
    e.start_k = k0;
    e.ws_row0 = ws_sequence_start(q0, b, a.ws_seq_align);
    e.len_q = q1 - q0;
    e.len_k = k1 - k0;
  } else {
    e.start_q = 0;
    e.start_k = 0;
    e.ws_row0 = ws_sequence_start(int64_t(b) * a.seqlen_q, b, a.ws_seq_align);
    e.len_q = a.seqlen_q;
    e.len_k = a.seqlen_k;
  }
  return e;
}

// The sequence's mask, with the chunk in the kernels that take one (kChunks).
template <bool kChunks>
__device__ __forceinline__ BasicMaskSpec<int64_t, kChunks> seq_mask(const BwdKernelArgs& a, const SeqExtent& e) {
  return make_mask<int64_t, kChunks>(e.len_q, e.len_k, a.causal, a.window_left, a.window_right, a.attention_chunk);
}

// ALiBi of one (sequence, query head) as the kernels apply it: the slope in log2 units (0: none) and s_k - s_q.
struct BwdAlibi {
  float slope2;
  int64_t shift;
};
// Dropout of one (sequence, query head): the mask's generator and the kept probabilities' factor 1 / (1 - p).
struct BwdDropout {
  DropoutSpec spec;
  float keep_scale;
};
__device__ __forceinline__ BwdDropout seq_dropout(const BwdKernelArgs& a, int b, int h) {
  return {DropoutSpec::make(a.dropout_p, a.dropout_rng, b, h), 1.f / (1.f - a.dropout_p)};
}

__device__ __forceinline__ BwdAlibi seq_alibi(const BwdKernelArgs& a, const SeqExtent& e, int b, int h) {
  const Alibi bias = Alibi::make(a.alibi_slopes, a.alibi_batch_stride, b, h, e.len_q, e.len_k);
  return {bias.slope_log2(), bias.shift};
}

}  // namespace flashattn::cuda::sm80
