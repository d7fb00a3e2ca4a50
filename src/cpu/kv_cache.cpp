// The KV-cache path on the CPU backends: appending new rows (rotary on K), rotating Q, and densifying paged
// caches so that the attention kernels (reference and flash) read every cache as strided rows.
#include "cpu/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "common/kv_cache.h"
#include "cpu/dtype_dispatch.h"
#include "cpu/fp8.h"

namespace flashattn::detail {
namespace {

template <typename T>
struct RotaryMath {
  using type = float;
};
template <>
struct RotaryMath<double> {
  using type = double;
};

template <typename T>
typename RotaryMath<T>::type widen(T x) {
  return typename RotaryMath<T>::type(to_float(x));
}
template <typename T>
T store_as(typename RotaryMath<T>::type x) {
  return from_double<T>(double(x));
}
// float8_e4m3fn rows (bytes): widened exactly, rotated in fp32 and stored as FA3's kernels store them (to_e4m3). The
// descales are per (sequence, KV head), so rotating the stored values commutes with them.
inline float widen(uint8_t x) { return e4m3_to_float(x); }
template <>
inline uint8_t store_as<uint8_t>(float x) {
  return to_e4m3(x);
}

// Copies `cols` columns of one row, rotating columns [0, rotary_dim) by position `pos` (no rotation when cos is
// null). src and dst never alias.
template <typename T>
void rotate_row(const T* src, T* dst, int64_t cols, const KVCacheParams& kp, int64_t pos) {
  using M = typename RotaryMath<T>::type;
  const int64_t rd = kp.rotary_cos ? kp.rotary_dim : 0;
  const T* cos = static_cast<const T*>(kp.rotary_cos);
  const T* sin = static_cast<const T*>(kp.rotary_sin);
  for (int64_t c = 0; c < cols; ++c) {
    if (c >= rd) {
      dst[c] = src[c];
      continue;
    }
    int64_t partner, freq;
    bool first;
    rotary_pair_of(c, rd, kp.rotary_interleaved, &partner, &first, &freq);
    const M cs = widen(cos[pos * (rd / 2) + freq]), sn = widen(sin[pos * (rd / 2) + freq]);
    const M x0 = widen(src[first ? c : partner]), x1 = widen(src[first ? partner : c]);
    M y0, y1;
    rotate_pair(x0, x1, cs, sn, &y0, &y1);
    dst[c] = store_as<T>(first ? y0 : y1);
  }
}

template <typename T>
void append_typed(const KVCacheParams& kp) {
  const FwdParams& p = kp.attn;
  const KVCacheLayout cache = KVCacheLayout::of(p);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t e = cache.entry(b);
    if (e < 0) continue;
    const int64_t base = p.seqused_k[b], count = cache.appended(b);
    // Varlen new rows are packed: sequence b's start at cu_seqlens_k_new[b] (validated, or clamped to the rows).
    const int64_t first_new = p.cu_seqlens_k_new ? int64_t(p.cu_seqlens_k_new[b]) : 0;
    const int64_t rotary0 = rotary_base(kp.rotary_seqlens, p.seqused_k, b);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = base + i;
      if (row < 0 || row >= p.seqlen_k) continue;
      if (p.cu_seqlens_k_new && (first_new + i < 0 || first_new + i >= kp.seqlen_new)) continue;
      const int64_t k_off = cache.row_offset(e, row, p.k_batch_stride, p.k_row_stride);
      const int64_t v_off = cache.row_offset(e, row, p.v_batch_stride, p.v_row_stride);
      if (k_off < 0 || v_off < 0) continue;
      const int64_t pos = std::max<int64_t>(std::min(rotary0 + i, kp.rotary_rows - 1), 0);
      const int64_t kn_row = new_row_offset(p.cu_seqlens_k_new, b, i, kp.k_new_batch_stride, kp.k_new_row_stride);
      const int64_t vn_row = new_row_offset(p.cu_seqlens_k_new, b, i, kp.v_new_batch_stride, kp.v_new_row_stride);
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        const T* kn = static_cast<const T*>(kp.k_new) + kn_row + hk * kp.k_new_head_stride;
        const T* vn = static_cast<const T*>(kp.v_new) + vn_row + hk * kp.v_new_head_stride;
        T* kc = static_cast<T*>(kp.k_cache) + k_off + hk * p.k_head_stride;
        T* vc = static_cast<T*>(kp.v_cache) + v_off + hk * p.v_head_stride;
        rotate_row(kn, kc, p.head_dim, kp, pos);
        std::memcpy(vc, vn, size_t(p.head_dim_v) * sizeof(T));
      }
    }
  }
}

// Q rotated into dst, laid out [rows, heads_q, head_dim] contiguous (rows = batch x seqlen_q, or total_q).
template <typename T>
void rotate_queries_typed(const KVCacheParams& kp, T* dst) {
  const FwdParams& p = kp.attn;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t start = p.is_varlen() ? p.cu_seqlens_q[b] : b * p.seqlen_q;
    const int64_t len = p.is_varlen() ? p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] : p.seqlen_q;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t pos = std::min(rotary_base(kp.rotary_seqlens, p.seqused_k, b) + (kp.rotary_per_row ? i : 0),
                                   kp.rotary_rows - 1);
      const int64_t row = start + i;
      const int64_t src_row = p.is_varlen() ? row * p.q_row_stride : b * p.q_batch_stride + i * p.q_row_stride;
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const T* src = static_cast<const T*>(p.q) + src_row + h * p.q_head_stride;
        rotate_row(src, dst + (row * p.heads_q + h) * p.head_dim, p.head_dim, kp, std::max<int64_t>(pos, 0));
      }
    }
  }
}

// kp.attn with Q replaced by its rotation, held in *rotated.
template <typename T>
FwdParams with_rotated_queries(const KVCacheParams& kp, std::vector<T>* rotated) {
  const FwdParams& p = kp.attn;
  const int64_t rows = p.is_varlen() ? p.total_q : p.batch * p.seqlen_q;
  rotated->assign(size_t(rows * p.heads_q * p.head_dim), T());
  rotate_queries_typed<T>(kp, rotated->data());
  FwdParams r = p;
  r.q = rotated->data();
  r.q_head_stride = p.head_dim;
  r.q_row_stride = p.heads_q * p.head_dim;
  r.q_batch_stride = p.is_varlen() ? 0 : p.seqlen_q * r.q_row_stride;
  return r;
}

// Paged K and V gathered into dense [batch, max_len, heads_kv, d] copies holding each sequence's used rows
// from row 0, with the lengths as seqused_k; `run` (any callable taking the dense params) attends over them.
template <typename T, typename Run>
Status dense_typed(const FwdParams& p, Run run) {
  const KVCacheLayout cache = KVCacheLayout::of(p);
  std::vector<int32_t> lengths(size_t(p.batch));
  std::vector<int64_t> begins(size_t(p.batch));
  int64_t max_len = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t begin, end;
    cache.rows(b, &begin, &end);
    begins[size_t(b)] = begin;
    lengths[size_t(b)] = int32_t(end - begin);
    max_len = std::max(max_len, end - begin);
  }
  const int64_t k_row = p.heads_kv * p.head_dim, v_row = p.heads_kv * p.head_dim_v;
  std::vector<T> k(size_t(p.batch * max_len * k_row), T()), v(size_t(p.batch * max_len * v_row), T());
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t e = cache.entry(b);
    for (int64_t j = 0; j < lengths[size_t(b)]; ++j) {
      const int64_t row = begins[size_t(b)] + j;
      const int64_t k_off = cache.row_offset(e, row, p.k_batch_stride, p.k_row_stride);
      const int64_t v_off = cache.row_offset(e, row, p.v_batch_stride, p.v_row_stride);
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        T* kd = k.data() + (b * max_len + j) * k_row + hk * p.head_dim;
        T* vd = v.data() + (b * max_len + j) * v_row + hk * p.head_dim_v;
        T zero;  // all bits clear: +0 in every float format, e4m3's included
        std::memset(&zero, 0, sizeof zero);
        if (k_off >= 0) {
          std::memcpy(kd, static_cast<const T*>(p.k) + k_off + hk * p.k_head_stride, size_t(p.head_dim) * sizeof(T));
        } else {
          std::fill(kd, kd + p.head_dim, zero);
        }
        if (v_off >= 0) {
          std::memcpy(vd, static_cast<const T*>(p.v) + v_off + hk * p.v_head_stride, size_t(p.head_dim_v) * sizeof(T));
        } else {
          std::fill(vd, vd + p.head_dim_v, zero);
        }
      }
    }
  }
  FwdParams d = p;
  d.k = k.data();
  d.v = v.data();
  d.k_batch_stride = max_len * k_row, d.k_row_stride = k_row, d.k_head_stride = p.head_dim;
  d.v_batch_stride = max_len * v_row, d.v_row_stride = v_row, d.v_head_stride = p.head_dim_v;
  d.seqlen_k = max_len;
  d.seqused_k = lengths.data();
  d.leftpad_k = nullptr;
  d.kv_batch_idx = nullptr;
  d.block_table = nullptr;
  d.cache_entries = p.batch;
  d.num_pages = 0;
  d.page_size = 0;
  d.appended_k = 0;
  d.cu_seqlens_k_new = nullptr;
  return run(d);
}

template <template <typename> class F, typename... Args>
Status by_dtype(DType t, Args&&... args) {
  return call_by_dtype<F>("KV cache on the CPU", t, args...);
}

template <typename T>
struct Append {
  Status operator()(const KVCacheParams& kp) const {
    append_typed<T>(kp);
    return Status::success();
  }
};
template <typename T>
struct RotateQueriesAndRun {
  Status operator()(const KVCacheParams& kp, ForwardFn run) const {
    std::vector<T> rotated;
    return run(with_rotated_queries<T>(kp, &rotated));
  }
};
template <typename T>
struct Dense {
  Status operator()(const FwdParams& p, ForwardFn run) const { return dense_typed<T>(p, run); }
};

}  // namespace

Status cpu_forward_dense_cache(const FwdParams& p, ForwardFn run) {
  if (!p.is_paged()) return run(p);
  return by_dtype<Dense>(p.dtype, p, run);
}

Status cpu_kvcache(const KVCacheParams& kp, ForwardFn run) {
  Status st;
  if (kp.attn.dtype == DType::e4m3) {
    // float8 caches: the new rows copied in as bytes, then every sequence's rows gathered into dense per-sequence
    // copies (so that the dequantising adapter sees [batch, rows, heads, dim] with descale row b = sequence b),
    // dequantised and run in fp32.
    if (kp.k_new) append_typed<uint8_t>(kp);
    std::vector<uint8_t> rotated;
    const FwdParams attn = kp.rotary_cos ? with_rotated_queries<uint8_t>(kp, &rotated) : kp.attn;
    return dense_typed<uint8_t>(attn, [run](const FwdParams& d) { return cpu_fp8_forward(d, run); });
  }
  if (kp.k_new && !(st = by_dtype<Append>(kp.attn.dtype, kp)).ok()) return st;
  if (!kp.rotary_cos) return run(kp.attn);
  return by_dtype<RotateQueriesAndRun>(kp.attn.dtype, kp, run);
}

}  // namespace flashattn::detail
