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
//
// KV cache (forward only; `has_kv_cache()`): K/V are a cache that sequence b reads through its entry
// e = kv_batch_idx ? kv_batch_idx[b] : b. Dense: K [cache_entries, seqlen_k, heads_kv, head_dim] (batch stride
// = entry stride). Paged: K [num_pages, page_size, heads_kv, head_dim] (batch stride = page stride); key row j
// of entry e lives in page block_table[e * block_table_stride + j / page_size], row j % page_size. Sequence b
// uses key rows [leftpad_k[b], seqused_k[b] + appended(b)) (defaults 0 and seqlen_k), appended(b) being
// cu_seqlens_k_new[b + 1] - cu_seqlens_k_new[b] when that is set, else appended_k; its mask is that of a
// sequence of seqused_k[b] + appended(b) - leftpad_k[b] keys. Queries are padded or varlen (cu_seqlens_q alone;
// cu_seqlens_k stays null). seqlen_k is the capacity: the cache's rows, or block-table columns x page_size.
// Index values out of range never reach memory: the kernels clamp lengths to the capacity and treat a page or
// entry index out of range as rows of zeros that are never written (validation rejects them up front unless
// asked not to read device memory).
#pragma once

#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

// Mask semantics, shared by every backend. For query row i of a sequence with s_q queries and s_k keys, let
// diag = i + s_k - s_q (bottom-right alignment, as flash-attn >= 2.1). Key j is visible iff
//   (!causal || j <= diag) && (window_left < 0 || j >= diag - window_left)
//                          && (window_right < 0 || j <= diag + window_right)
//                          && (attention_chunk == 0 || j / attention_chunk == floor(diag / attention_chunk)).
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
  // FA3's query-value term (DeepSeek MLA's absorbed decode): Qv laid out like Q with head_dim_v columns (strides
  // as Q's); the score of query i and key j becomes scale · (q_i · k_j + qv_i · v_j), before softcap, bias and
  // mask. Null: no such term. Forward only, CPU backends.
  const void* qv = nullptr;
  int64_t qv_batch_stride = 0, qv_row_stride = 0, qv_head_stride = 0;

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
  int64_t attention_chunk = 0;  // 0 = off; else keys in chunks of this many, a row seeing its diagonal's chunk
  // ALiBi (common/alibi.h): fp32 slopes on the tensors' device, [heads_q] (batch stride 0) or [batch, heads_q];
  // query head h of sequence b adds -alibi_slopes[b * alibi_slopes_batch_stride + h] · |i + s_k - s_q - j| to its
  // score for key j. Null: no bias.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0;
  // Attention dropout (common/dropout.h): probabilities dropped with probability dropout_p in [0, 1) (0: off), the
  // kept ones scaled by 1 / (1 - dropout_p); the mask is a function of (seed, offset, b, h, i, j) alone, so the
  // backward given the same seed and offset applies the forward's.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  // {seed, offset} in the tensors' memory (ForwardArgs::dropout_rng), read in place of the two above; null: unused.
  const uint64_t* dropout_state = nullptr;
  // float8_e4m3fn inputs (dtype e4m3): O's dtype (float16 or bfloat16; else O is in `dtype`), and the fp32 descale
  // factors of Q, K, V, each [batch, heads_kv] with these strides (null: 1): query head h of sequence b reads
  // q * q_descale[b, h / (heads_q / heads_kv)], its keys k * k_descale[b, h_kv], values v * v_descale[b, h_kv].
  DType out_dtype = DType::f32;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_strides[2] = {0, 0}, k_descale_strides[2] = {0, 0}, v_descale_strides[2] = {0, 0};

  // KV cache (see above); all int32 on the tensors' device, each optional.
  const int32_t* seqused_k = nullptr;     // [batch]: end of sequence b's used key rows, before appended_k
  const int32_t* leftpad_k = nullptr;     // [batch]: first used key row
  const int32_t* kv_batch_idx = nullptr;  // [batch]: cache entry of sequence b
  const int32_t* block_table = nullptr;   // [cache_entries, pages_per_entry]: paged K/V
  int64_t block_table_stride = 0;         // elements between block-table rows
  int64_t page_size = 0;                  // rows per page (paged only)
  int64_t cache_entries = 0;              // dense: K's first dim; paged: block-table rows
  int64_t num_pages = 0;                  // paged: K's first dim
  int64_t appended_k = 0;                 // rows appended after seqused_k (flash_attn_with_kvcache's new k/v)
  const int32_t* cu_seqlens_k_new = nullptr;  // [batch + 1]: per-sequence appended rows (FA3), instead of appended_k
  int num_splits = 0;                     // CUDA decode: key splits per sequence, 0 = chosen from the shape

  void* stream = nullptr;  // cudaStream_t for CUDA backends
  int num_threads = 0;     // CPU backends: 0 = all hardware threads

  bool is_varlen() const { return cu_seqlens_q != nullptr; }
  // A causal, window or chunk mask.
  bool has_mask() const { return causal || window_left >= 0 || window_right >= 0 || attention_chunk > 0; }
  // ALiBi, dropout or chunks: what the CUDA kernels compile only into their extras variants (kExtras), so that the
  // plain kernels carry none of it.
  bool has_extras() const { return alibi_slopes != nullptr || dropout_p > 0 || attention_chunk > 0; }
  // Varlen queries over a padded or paged K/V (cu_seqlens_q without cu_seqlens_k) are a cache call too.
  bool has_kv_cache() const {
    return seqused_k != nullptr || leftpad_k != nullptr || kv_batch_idx != nullptr || block_table != nullptr ||
           cu_seqlens_k_new != nullptr || (cu_seqlens_q != nullptr && cu_seqlens_k == nullptr);
  }
  bool is_paged() const { return block_table != nullptr; }
};

// flash_attn_with_kvcache's appending step: new K/V rows [batch, seqlen_new, heads_kv, d] written into the cache
// at rows [seqused_k[b], seqused_k[b] + seqlen_new) of sequence b's entry, K rotated (rotary embedding) on the
// way; Q (attn.q, left untouched) rotated into scratch at positions r_b + i (causal or local) or r_b
// (otherwise), r_b = rotary_seqlens[b] if given, else seqused_k[b]; new row i of sequence b at r_b + i.
// `attn` is the attention over the cache afterwards (appended_k = seqlen_new). Varlen new rows (FA3's
// cu_seqlens_k_new, attn.cu_seqlens_k_new set): K/V new are [total_new, heads_kv, d], sequence b's rows being
// [cu_seqlens_k_new[b], cu_seqlens_k_new[b + 1]); the batch strides are unused and seqlen_new = total_new.
struct KVCacheParams {
  FwdParams attn;
  void* k_cache = nullptr;  // attn.k / attn.v, writable
  void* v_cache = nullptr;
  const void* k_new = nullptr;  // null: nothing appended
  const void* v_new = nullptr;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  int64_t seqlen_new = 0;

  // Rotary embedding: cos/sin [rotary_rows, rotary_dim / 2], contiguous, in the inputs' dtype; null = none.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int64_t rotary_dim = 0;
  int64_t rotary_rows = 0;
  bool rotary_interleaved = true;  // pairs (2i, 2i + 1) (GPT-J) or (i, i + rotary_dim / 2) (GPT-NeoX)
  bool rotary_per_row = false;     // q row i at position r_b + i (causal or local windows)
  const int32_t* rotary_seqlens = nullptr;  // [batch]: r_b, the rotary positions' base (FA3); null: seqused_k
  // Positions past the table (only reachable with unchecked index values) use its last row.
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;  // like O (float8_e4m3fn inputs: e4m3 too, scaled like Q by do_descale)
  const float* do_descale = nullptr;
  int64_t do_descale_strides[2] = {0, 0};
  void* dq = nullptr;          // like Q
  void* dk = nullptr;          // like K
  void* dv = nullptr;          // like V

  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  bool deterministic = false;  // bitwise-identical gradients from run to run
};

// merge_attention_states (flashattn.h): rows (b, i) x heads h of two partial attentions and their merge.
// Padded: out-like tensors [batch, rows, heads, head_dim_v], LSE-like [batch, heads, rows]; varlen ([total, ...])
// is batch = 1 with every batch stride 0. Strides in elements; out-like last dim and LSE-like row stride 1.
struct MergeParams {
  struct Side {
    const void* out = nullptr;
    const float* lse = nullptr;
    DType dtype = DType::f32;
    int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // out
    int64_t lse_batch_stride = 0, lse_head_stride = 0;
  };
  Side a, b;
  void* out = nullptr;  // a's dtype
  float* lse = nullptr;  // may be null: not written
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int64_t batch = 0, rows = 0, heads = 0, head_dim_v = 0;
  Device device;
  void* stream = nullptr;
  int num_threads = 0;
};

}  // namespace flashattn
