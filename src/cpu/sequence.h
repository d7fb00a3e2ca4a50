// Where one (batch, head) sequence lives in the params' tensors: padded or varlen offsets, GQA head mapping
// and strides, as small views the CPU backends index by (row, column).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/kv_cache.h"
#include "common/mask.h"
#include "flashattn/params.h"

namespace flashattn::detail {

struct SequenceExtent {
  int64_t start_q = 0, start_k = 0;  // first packed row (varlen) or 0 (padded); cache: first used key row
  int64_t len_q = 0, len_k = 0;
  int64_t kv_batch = 0;              // K/V batch index: b, or the cache entry of sequence b
};

// A cache's used key rows [start_k, start_k + len_k) of entry kv_batch; where those rows live in a paged cache is
// the reader's to look up (the flash forward reads pages; the reference densifies them first, cpu/kv_cache.h).
inline SequenceExtent sequence_extent(const FwdParams& p, int64_t b) {
  SequenceExtent e;
  e.kv_batch = b;
  if (p.is_varlen()) {
    e.start_q = p.cu_seqlens_q[b];
    e.len_q = p.cu_seqlens_q[b + 1] - e.start_q;
  } else {
    e.len_q = p.seqlen_q;
  }
  if (p.has_kv_cache()) {
    const KVCacheLayout cache = KVCacheLayout::of(p);
    int64_t end = 0;
    cache.rows(b, &e.start_k, &end);
    e.len_k = end - e.start_k;
    e.kv_batch = cache.entry(b) < 0 ? 0 : cache.entry(b);
  } else if (p.is_varlen()) {
    e.start_k = p.cu_seqlens_k[b];
    e.len_k = p.cu_seqlens_k[b + 1] - e.start_k;
  } else {
    e.len_k = p.seqlen_k;
  }
  return e;
}

// The mask of sequence e: the call's causal flag, window and chunk over the sequence's own lengths.
inline MaskSpec sequence_mask(const FwdParams& p, const SequenceExtent& e) {
  return MaskSpec::make(e.len_q, e.len_k, p.causal, p.window_left, p.window_right, p.attention_chunk);
}

// Rows of one head: element (i, c) at base[i * row_stride + c].
template <typename T>
struct SequenceView {
  T* base = nullptr;
  int64_t row_stride = 0;
  int64_t rows = 0;
  T& at(int64_t i, int64_t c) const { return base[i * row_stride + c]; }
  T* row(int64_t i) const { return base + i * row_stride; }
};

template <typename T, typename Ptr>
SequenceView<T> make_view(Ptr ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int64_t b,
                          int64_t start, int64_t h, int64_t rows) {
  using Byte = std::conditional_t<std::is_const_v<T>, const T, T>;
  Byte* base = static_cast<Byte*>(ptr) + b * batch_stride + start * row_stride + h * head_stride;
  return {base, row_stride, rows};
}

template <typename T>
SequenceView<T> query_view(const FwdParams& p, const void* q, const SequenceExtent& e, int64_t b, int64_t h) {
  return make_view<T>(const_cast<void*>(q), p.q_batch_stride, p.q_row_stride, p.q_head_stride, b, e.start_q, h, e.len_q);
}

// FA3's qv rows of query head h (FwdParams::qv, laid out like Q with d_v columns).
template <typename T>
SequenceView<T> query_value_view(const FwdParams& p, const SequenceExtent& e, int64_t b, int64_t h) {
  return make_view<T>(const_cast<void*>(p.qv), p.qv_batch_stride, p.qv_row_stride, p.qv_head_stride, b, e.start_q, h,
                      e.len_q);
}

// K (is_value = false) or V (true) of KV head `hk`, in batch entry e.kv_batch (the sequence's, or its cache entry).
template <typename T>
SequenceView<T> key_view(const FwdParams& p, const void* kv, const SequenceExtent& e, int64_t hk, bool is_value) {
  return is_value ? make_view<T>(const_cast<void*>(kv), p.v_batch_stride, p.v_row_stride, p.v_head_stride, e.kv_batch, e.start_k, hk, e.len_k)
                  : make_view<T>(const_cast<void*>(kv), p.k_batch_stride, p.k_row_stride, p.k_head_stride, e.kv_batch, e.start_k, hk, e.len_k);
}

template <typename T>
SequenceView<T> output_view(const FwdParams& p, void* o, const SequenceExtent& e, int64_t b, int64_t h) {
  return make_view<T>(o, p.o_batch_stride, p.o_row_stride, p.o_head_stride, b, e.start_q, h, e.len_q);
}

template <typename T>
SequenceView<T> grad_out_view(const BwdParams& p, const SequenceExtent& e, int64_t b, int64_t h) {
  return make_view<T>(const_cast<void*>(p.dout), p.do_batch_stride, p.do_row_stride, p.do_head_stride, b, e.start_q, h, e.len_q);
}

template <typename T>
SequenceView<T> grad_query_view(const BwdParams& p, const SequenceExtent& e, int64_t b, int64_t h) {
  return make_view<T>(p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, b, e.start_q, h, e.len_q);
}

template <typename T>
SequenceView<T> grad_key_view(const BwdParams& p, const SequenceExtent& e, int64_t b, int64_t hk, bool is_value) {
  return is_value ? make_view<T>(p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, b, e.start_k, hk, e.len_k)
                  : make_view<T>(p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, b, e.start_k, hk, e.len_k);
}

// LSE of row i: [b, h, s] padded, [h, total] varlen.
inline float* lse_ptr(const FwdParams& p, const SequenceExtent& e, int64_t b, int64_t h, int64_t i) {
  return p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + e.start_q + i;
}

}  // namespace flashattn::detail
