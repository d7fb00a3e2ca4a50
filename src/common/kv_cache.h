// Key/value cache addressing, written once for every backend: which cache entry and which key rows a sequence
// uses, where key row j of an entry lives (dense or paged), and the rotary embedding of appended rows.
// Semantics (params.h): sequence b reads entry e = kv_batch_idx[b] (or b) and key rows [leftpad_k[b],
// seqused_k[b] + appended(b)), each defaulting to the whole capacity.
//
// Out-of-range index values are made harmless here, so that no backend reads or writes outside the tensors
// whatever the device memory holds (validation rejects them up front unless told not to read device memory,
// as under CUDA-graph capture): lengths are clamped to [0, capacity], an entry out of range gives an empty
// sequence, and a page out of range gives -1 (its rows read as zeros, writes to it are dropped).
#pragma once

#include <math.h>
#include <cstdint>

#include "common/hd.h"

namespace flashattn {

// The cache fields of FwdParams in a form device code can take by value.
struct KVCacheLayout {
  const int32_t* seqused_k = nullptr;
  const int32_t* leftpad_k = nullptr;
  const int32_t* kv_batch_idx = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int64_t page_size = 0;
  int64_t cache_entries = 0;
  int64_t num_pages = 0;
  int64_t appended_k = 0;
  const int32_t* cu_seqlens_k_new = nullptr;  // per-sequence appended rows instead of appended_k
  int64_t capacity = 0;  // rows per entry: seqlen_k

  template <typename Params>
  static KVCacheLayout of(const Params& p) {
    KVCacheLayout c;
    c.seqused_k = p.seqused_k;
    c.leftpad_k = p.leftpad_k;
    c.kv_batch_idx = p.kv_batch_idx;
    c.block_table = p.block_table;
    c.block_table_stride = p.block_table_stride;
    c.page_size = p.page_size;
    c.cache_entries = p.cache_entries;
    c.num_pages = p.num_pages;
    c.appended_k = p.appended_k;
    c.cu_seqlens_k_new = p.cu_seqlens_k_new;
    c.capacity = p.seqlen_k;
    return c;
  }

  FA_HD bool paged() const { return block_table != nullptr; }

  // Cache entry of sequence b, or -1 when its index is out of range.
  FA_HD int64_t entry(int64_t b) const {
    const int64_t e = kv_batch_idx ? int64_t(kv_batch_idx[b]) : b;
    return e >= 0 && e < cache_entries ? e : -1;
  }

  // Rows sequence b appends (>= 0; unchecked offsets that decrease give none).
  FA_HD int64_t appended(int64_t b) const {
    if (cu_seqlens_k_new == nullptr) return appended_k;
    const int64_t n = int64_t(cu_seqlens_k_new[b + 1]) - int64_t(cu_seqlens_k_new[b]);
    return n > 0 ? n : 0;
  }

  // First used row and end of sequence b's keys (absolute rows of its entry), 0 <= begin <= end <= capacity.
  FA_HD void rows(int64_t b, int64_t* begin, int64_t* end) const {
    int64_t e = seqused_k ? int64_t(seqused_k[b]) + appended(b) : capacity;
    e = e < 0 ? 0 : (e > capacity ? capacity : e);
    int64_t s = leftpad_k ? int64_t(leftpad_k[b]) : 0;
    s = s < 0 ? 0 : (s > e ? e : s);
    if (entry(b) < 0) s = e = 0;
    *begin = s;
    *end = e;
  }

  // Page in block-table slot `slot` of entry `e` (paged caches), or -1 when the table's value is out of range.
  FA_HD int64_t page_in_slot(int64_t e, int64_t slot) const {
    const int64_t pg = block_table[e * block_table_stride + slot];
    return pg >= 0 && pg < num_pages ? pg : -1;
  }
  // Page holding row j of entry `e` (paged caches), or -1 when the block table's value is out of range.
  FA_HD int64_t page(int64_t e, int64_t j) const { return page_in_slot(e, j / page_size); }

  // Element offset of row j of entry e in K (or V, with its strides); -1 when the row has no valid page. For
  // paged caches the batch stride is the page stride.
  FA_HD int64_t row_offset(int64_t e, int64_t j, int64_t batch_stride, int64_t row_stride) const {
    if (!paged()) return e * batch_stride + j * row_stride;
    const int64_t pg = page(e, j);
    return pg < 0 ? -1 : pg * batch_stride + (j % page_size) * row_stride;
  }
};

// Sequence of packed row `row` given offsets cu[0..batch] (varlen queries or new rows): the last b with
// cu[b] <= row, found by bisection (b = 0 when none is; unchecked offsets give some b in [0, batch), and the
// caller checks the row against that sequence's extent).
FA_HD int varlen_sequence_of(const int32_t* cu, int batch, int64_t row) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// Element offset of new row i of sequence b in k_new / v_new: packed at cu_seqlens_k_new[b] + i (FA3's varlen
// append; no batch stride), else row i of batch entry b.
FA_HD int64_t new_row_offset(const int32_t* cu_seqlens_k_new, int64_t b, int64_t i, int64_t batch_stride,
                             int64_t row_stride) {
  return cu_seqlens_k_new != nullptr ? (int64_t(cu_seqlens_k_new[b]) + i) * row_stride
                                     : b * batch_stride + i * row_stride;
}

// The rotary positions' base of sequence b: rotary_seqlens[b] when given (FA3), else its cache length before the
// append. Query row i sits at base + i (causal or local) or base; new row i at base + i.
FA_HD int64_t rotary_base(const int32_t* rotary_seqlens, const int32_t* seqused_k, int64_t b) {
  return int64_t(rotary_seqlens != nullptr ? rotary_seqlens[b] : seqused_k[b]);
}

// Rotary embedding of one pair (x0, x1) by the angle whose cosine and sine are c and s, with the two fused
// multiply-adds spelled out, so that every backend rounds it identically before storing: fp32 for 16- and
// 32-bit storage, fp64 for fp64 storage.
FA_HD void rotate_pair(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = fmaf(x0, c, -(x1 * s));
  *y1 = fmaf(x0, s, x1 * c);
}
FA_HD void rotate_pair(double x0, double x1, double c, double s, double* y0, double* y1) {
  *y0 = fma(x0, c, -(x1 * s));
  *y1 = fma(x0, s, x1 * c);
}

// The partner of column c inside the rotated prefix [0, rotary_dim), and whether c is the pair's first member.
// Interleaved (GPT-J): pairs (2i, 2i + 1); otherwise (GPT-NeoX): pairs (i, i + rotary_dim / 2). The pair's
// angle index is `*freq`.
FA_HD void rotary_pair_of(int64_t c, int64_t rotary_dim, bool interleaved, int64_t* partner, bool* first,
                          int64_t* freq) {
  const int64_t half = rotary_dim / 2;
  if (interleaved) {
    *first = (c % 2) == 0;
    *partner = *first ? c + 1 : c - 1;
    *freq = c / 2;
  } else {
    *first = c < half;
    *partner = *first ? c + half : c - half;
    *freq = *first ? c : c - half;
  }
}

}  // namespace flashattn
