// Validation: tensor views + options -> params. Every rejection names the argument. Nothing here writes to
// any output, so a rejected call leaves the caller's buffers untouched.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "backend.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace {

std::string shape_str(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.rank; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

std::string device_str(Device d) {
  return d.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

bool same_device(Device a, Device b) { return a.type == b.type && (a.type == DeviceType::cpu || a.index == b.index); }

// Shape, strides and pointer of one tensor argument. `expected` holds the required shape.
Status check_tensor(const char* name, const TensorView& t, int rank, const int64_t* expected, DType dtype,
                    Device device, bool last_dim_contiguous) {
  if (t.rank != rank) {
    return Status::invalid(std::string(name) + ": expected a rank-" + std::to_string(rank) + " tensor, got rank " +
                           std::to_string(t.rank) + " " + shape_str(t));
  }
  if (t.dtype != dtype) {
    return Status::invalid(std::string(name) + ": expected dtype " + dtype_name(dtype) + ", got " +
                           dtype_name(t.dtype));
  }
  if (!same_device(t.device, device)) {
    return Status::invalid(std::string(name) + ": on " + device_str(t.device) + " but q is on " +
                           device_str(device));
  }
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] != expected[i]) {
      std::ostringstream os;
      os << name << ": expected shape [";
      for (int j = 0; j < rank; ++j) os << (j ? ", " : "") << expected[j];
      os << "], got " << shape_str(t);
      return Status::invalid(os.str());
    }
    if (t.stride[i] < 0) return Status::invalid(std::string(name) + ": negative strides are not supported");
  }
  if (last_dim_contiguous && t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1) {
    return Status::invalid(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
                           std::to_string(t.stride[rank - 1]));
  }
  if (t.data == nullptr && t.numel() > 0) return Status::invalid(std::string(name) + ": data pointer is null");
  return Status::success();
}

bool is_float_dtype(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64; }

Status check_options(const AttentionOptions& o) {
  // Both are applied in fp32: a value finite as a double but past float's range would become inf there.
  if (!std::isfinite(o.softmax_scale) || std::fabs(o.softmax_scale) > double(FLT_MAX))
    return Status::invalid("softmax_scale: must be finite in float32 (|softmax_scale| <= 3.4e38)");
  if (!std::isfinite(o.softcap) || o.softcap < 0 || o.softcap > double(FLT_MAX))
    return Status::invalid("softcap: must be finite in float32 and >= 0");
  if (!(o.dropout_p >= 0.0 && o.dropout_p < 1.0))  // NaN fails this too
    return Status::invalid("dropout_p: must be in [0, 1), got " + std::to_string(o.dropout_p));
  if (o.window_left < -1) return Status::invalid("window_left: must be >= -1 (-1 = unbounded)");
  if (o.window_right < -1) return Status::invalid("window_right: must be >= -1 (-1 = unbounded)");
  if (o.attention_chunk < 0) return Status::invalid("attention_chunk: must be >= 0 (0 = off)");
  if (o.num_threads < 0) return Status::invalid("num_threads: must be >= 0 (0 = all hardware threads)");
  switch (o.backend) {
    case Backend::automatic:
    case Backend::cpu_reference:
    case Backend::cpu_flash:
    case Backend::cuda_sm80:
    case Backend::cuda_sm90: break;
    default: return Status::invalid("backend: unknown value " + std::to_string(int(o.backend)));
  }
  return Status::success();
}

// Reads cu_seqlens (host or device) and checks it: int32 [batch + 1], 0 first, non-decreasing, last = total,
// every length <= its bound. Fills the max length when the caller passed 0.
Status check_cu_seqlens(const char* name, const TensorView& cu, Device device, int64_t batch, int64_t total,
                        int64_t* max_seqlen, const char* max_name, void* stream) {
  const int64_t shape[1] = {batch + 1};
  Status st = check_tensor(name, cu, 1, shape, DType::i32, device, true);
  if (!st.ok()) return st;
  std::vector<int32_t> host(size_t(batch + 1));
  if (device.type == DeviceType::cpu) {
    const int32_t* p = static_cast<const int32_t*>(cu.data);
    for (int64_t i = 0; i <= batch; ++i) host[size_t(i)] = p[i * cu.stride[0]];
  } else {
    if (cu.stride[0] != 1) return Status::invalid(std::string(name) + ": must be contiguous on CUDA");
    st = detail::cuda_copy_to_host(host.data(), cu.data, host.size() * sizeof(int32_t), device.index, stream);
    if (!st.ok()) return st;
  }
  if (host[0] != 0) return Status::invalid(std::string(name) + ": must start at 0, got " + std::to_string(host[0]));
  int64_t longest = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t len = int64_t(host[size_t(i + 1)]) - host[size_t(i)];
    if (len < 0) {
      return Status::invalid(std::string(name) + ": must be non-decreasing, but entry " + std::to_string(i + 1) +
                             " (" + std::to_string(host[size_t(i + 1)]) + ") < entry " + std::to_string(i) + " (" +
                             std::to_string(host[size_t(i)]) + ")");
    }
    longest = std::max(longest, len);
  }
  if (host[size_t(batch)] != total) {
    return Status::invalid(std::string(name) + ": last entry " + std::to_string(host[size_t(batch)]) +
                           " does not match the packed row count " + std::to_string(total));
  }
  if (*max_seqlen < 0) return Status::invalid(std::string(max_name) + ": must be >= 0");
  if (*max_seqlen == 0) {
    *max_seqlen = longest;
  } else if (longest > *max_seqlen) {
    return Status::invalid(std::string(max_name) + ": " + std::to_string(*max_seqlen) +
                           " is smaller than the longest sequence (" + std::to_string(longest) + ")");
  }
  return Status::success();
}

// Batch, row and head strides of [b, s, h, d] (padded) or [total, h, d] (varlen, no batch stride).
void row_strides(const TensorView& t, bool varlen, int64_t* batch, int64_t* row, int64_t* head) {
  const int row_dim = varlen ? 0 : 1;
  *batch = varlen ? 0 : t.stride[0];
  *row = t.stride[row_dim];
  *head = t.stride[row_dim + 1];
}

// Batch and head strides of an LSE [b, h, s] (padded) or [h, total] (varlen, no batch stride).
void lse_strides(const TensorView& t, bool varlen, int64_t* batch, int64_t* head) {
  *batch = varlen ? 0 : t.stride[0];
  *head = t.stride[varlen ? 0 : 1];
}

// Head counts and dims read off the shapes: their ranges and the GQA ratio; q_name / k_name / v_name are the
// tensors they came from.
Status check_heads(const FwdParams& p, const char* k_name, const char* v_name) {
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) {
    return Status::invalid("q: head dim must be in [1, " + std::to_string(kMaxHeadDim) + "], got " +
                           std::to_string(p.head_dim));
  }
  if (p.head_dim_v < 1 || p.head_dim_v > kMaxHeadDimV) {
    return Status::invalid(std::string(v_name) + ": head dim must be in [1, " + std::to_string(kMaxHeadDimV) +
                           "], got " + std::to_string(p.head_dim_v));
  }
  if (p.heads_q < 1) return Status::invalid("q: number of heads must be >= 1");
  if (p.heads_kv < 1) return Status::invalid(std::string(k_name) + ": number of heads must be >= 1");
  if (p.heads_q % p.heads_kv != 0) {
    return Status::invalid(std::string(k_name) + ": query heads (" + std::to_string(p.heads_q) +
                           ") must be a multiple of key/value heads (" + std::to_string(p.heads_kv) + ")");
  }
  return Status::success();
}

// The optional LSE output: [b, h_q, s_q] fp32, or [h_q, total_q] for varlen queries.
Status set_lse(const TensorView& lse, FwdParams* p) {
  if (!lse.defined()) return Status::success();
  const bool varlen = p->is_varlen();
  const int64_t lse_varlen[2] = {p->heads_q, p->total_q};
  const int64_t lse_padded[3] = {p->batch, p->heads_q, p->seqlen_q};
  Status st = check_tensor("lse", lse, varlen ? 2 : 3, varlen ? lse_varlen : lse_padded, DType::f32, p->device, true);
  if (!st.ok()) return st;
  p->lse = static_cast<float*>(lse.data);
  lse_strides(lse, varlen, &p->lse_batch_stride, &p->lse_head_stride);
  return Status::success();
}

// O's dtype: float8 inputs write a 16-bit output (out's), every other dtype its own.
Status set_out_dtype(const TensorView& out, FwdParams* p) {
  p->out_dtype = p->dtype;
  if (p->dtype != DType::e4m3) return Status::success();
  if (out.dtype != DType::bf16 && out.dtype != DType::f16) {
    return Status::invalid(std::string("out: float8_e4m3fn inputs write a bfloat16 or float16 output, got ") +
                           dtype_name(out.dtype));
  }
  p->out_dtype = out.dtype;
  return Status::success();
}

// One descale factor tensor of float8 inputs: fp32 [batch, heads_kv], any strides (an expanded scalar is fine),
// finite and > 0 where the host can read it (CPU tensors).
Status set_descale(const char* name, const TensorView& t, FwdParams* p, const float** ptr, int64_t* strides) {
  *ptr = nullptr;
  if (!t.defined()) return Status::success();
  if (p->dtype != DType::e4m3) {
    return Status::invalid(std::string(name) + ": descale factors go with float8_e4m3fn inputs; q is " +
                           dtype_name(p->dtype));
  }
  const int64_t shape[2] = {p->batch, p->heads_kv};
  Status st = check_tensor(name, t, 2, shape, DType::f32, p->device, false);
  if (!st.ok()) return st;
  const float* v = static_cast<const float*>(t.data);
  if (p->device.type == DeviceType::cpu) {
    for (int64_t b = 0; b < p->batch; ++b)
      for (int64_t h = 0; h < p->heads_kv; ++h) {
        const float x = v[b * t.stride[0] + h * t.stride[1]];
        if (!(std::isfinite(x) && x > 0)) {
          return Status::invalid(std::string(name) + ": must be finite and > 0, got " + std::to_string(x) + " at [" +
                                 std::to_string(b) + ", " + std::to_string(h) + "]");
        }
      }
  }
  *ptr = v;
  strides[0] = t.stride[0];
  strides[1] = t.stride[1];
  return Status::success();
}

// The optional ALiBi slopes: fp32 [h_q] or [batch, h_q] on the call's device, last dim contiguous; on the CPU
// every slope finite (CUDA slopes stay unread: reading them would synchronise every call).
Status set_alibi(const TensorView& slopes, FwdParams* p) {
  if (!slopes.defined()) return Status::success();
  const int64_t per_head[1] = {p->heads_q}, per_batch[2] = {p->batch, p->heads_q};
  const bool shape_ok = (slopes.rank == 1 && slopes.shape[0] == p->heads_q) ||
                        (slopes.rank == 2 && slopes.shape[0] == p->batch && slopes.shape[1] == p->heads_q);
  if (!shape_ok) {
    return Status::invalid("alibi_slopes: expected shape [" + std::to_string(p->heads_q) + "] or [" +
                           std::to_string(p->batch) + ", " + std::to_string(p->heads_q) +
                           "] (heads, or batch x heads), got " + shape_str(slopes));
  }
  const bool batched = slopes.rank == 2;
  Status st = check_tensor("alibi_slopes", slopes, slopes.rank, batched ? per_batch : per_head, DType::f32, p->device,
                           true);
  if (!st.ok()) return st;
  if (p->device.type == DeviceType::cpu) {
    const float* v = static_cast<const float*>(slopes.data);
    for (int64_t b = 0; b < (batched ? p->batch : 1); ++b)
      for (int64_t h = 0; h < p->heads_q; ++h) {
        const float x = v[(batched ? b * slopes.stride[0] : 0) + h];
        if (!std::isfinite(x)) {
          return Status::invalid("alibi_slopes: must be finite, got " + std::to_string(x) + " at " +
                                 (batched ? "[" + std::to_string(b) + ", " : std::string("[")) + std::to_string(h) +
                                 "]");
        }
      }
  }
  p->alibi_slopes = static_cast<const float*>(slopes.data);
  p->alibi_slopes_batch_stride = batched ? slopes.stride[0] : 0;
  return Status::success();
}

// The optional dropout generator state: int64 [2] {seed, offset} on the call's device, contiguous and 8-byte aligned
// (the kernels read it as two 64-bit words), and only with dropout (it keys nothing else).
Status set_dropout_rng(const TensorView& rng, double dropout_p, FwdParams* p) {
  if (!rng.defined()) return Status::success();
  if (!(dropout_p > 0)) return Status::invalid("dropout_rng: given, but dropout_p is 0 (it only keys the dropout mask)");
  const int64_t shape[1] = {2};
  Status st = check_tensor("dropout_rng", rng, 1, shape, DType::i64, p->device, true);
  if (!st.ok()) return st;
  if (reinterpret_cast<uintptr_t>(rng.data) % alignof(uint64_t) != 0) {
    return Status::invalid("dropout_rng: data pointer not aligned to 8 bytes");
  }
  p->dropout_state = static_cast<const uint64_t*>(rng.data);
  return Status::success();
}

// The optional qv (FA3's query-value term): like q (`q_view`'s shape, padded or varlen) with head_dim_v columns, in
// q's 16/32/64-bit dtype.
Status set_qv(const TensorView& qv, const TensorView& q_view, bool varlen, FwdParams* p) {
  if (!qv.defined()) return Status::success();
  if (p->dtype == DType::e4m3) {
    return Status::unsupported("qv: not supported with float8_e4m3fn inputs (FA3 has no such combination either)");
  }
  int64_t shape[4];
  const int rank = q_view.rank;
  std::copy(q_view.shape, q_view.shape + rank, shape);
  shape[rank - 1] = p->head_dim_v;
  Status st = check_tensor("qv", qv, rank, shape, p->dtype, p->device, true);
  if (!st.ok()) return st;
  p->qv = qv.data;
  row_strides(qv, varlen, &p->qv_batch_stride, &p->qv_row_stride, &p->qv_head_stride);
  return Status::success();
}

// The options every forward takes as they are (check_options has accepted them).
void set_options(const AttentionOptions& o, FwdParams* p) {
  // FA3's default with qv: the score sums products over d + d_v columns.
  const int64_t score_dim = p->head_dim + (p->qv ? p->head_dim_v : 0);
  p->softmax_scale = o.softmax_scale > 0 ? float(o.softmax_scale) : float(1.0 / std::sqrt(double(score_dim)));
  p->softcap = float(o.softcap);
  p->dropout_p = float(o.dropout_p);
  // A probability just below 1 must stay below 1 in float (the kept ones are scaled by 1 / (1 - p)).
  if (p->dropout_p >= 1.f) p->dropout_p = std::nextafter(1.f, 0.f);
  p->dropout_seed = o.dropout_seed;
  p->dropout_offset = o.dropout_offset;
  p->causal = o.causal;
  // A window edge of 2^62 keys already reaches every key of any sequence (lengths are below 2^62); wider ones are
  // the same window, and narrowing them keeps every backend's mask arithmetic (diagonal ± edge) inside int64.
  constexpr int64_t kWidestWindow = int64_t(1) << 62;
  p->window_left = std::min(o.window_left, kWidestWindow);
  p->window_right = std::min(o.window_right, kWidestWindow);
  p->attention_chunk = o.attention_chunk;
  p->stream = o.stream;
  p->num_threads = o.num_threads;
}

}  // namespace

Status make_forward_params(const ForwardArgs& a, const AttentionOptions& o, FwdParams* out) {
  Status st = check_options(o);
  if (!st.ok()) return st;
  if (out == nullptr) return Status::invalid("params: null output pointer");

  const bool varlen = a.cu_seqlens_q.defined() || a.cu_seqlens_k.defined();
  if (varlen && !(a.cu_seqlens_q.defined() && a.cu_seqlens_k.defined())) {
    return Status::invalid(a.cu_seqlens_q.defined() ? "cu_seqlens_k: required when cu_seqlens_q is given"
                                                    : "cu_seqlens_q: required when cu_seqlens_k is given");
  }
  // The batch size of a varlen call is read off cu_seqlens_q, so it must have at least one entry before anything
  // is sized from it (an empty one would make batch = -1).
  if (varlen && (a.cu_seqlens_q.rank != 1 || a.cu_seqlens_q.shape[0] < 1)) {
    return Status::invalid("cu_seqlens_q: expected a rank-1 tensor of batch + 1 >= 1 entries, got rank " +
                           std::to_string(a.cu_seqlens_q.rank) + " " + shape_str(a.cu_seqlens_q));
  }
  const int rank = varlen ? 3 : 4;
  const int o_ = varlen ? 0 : 1;  // offset of the row dimension: [b, s, h, d] vs [total, h, d]

  if (a.q.rank != rank) {
    return Status::invalid(std::string("q: expected a rank-") + std::to_string(rank) + " tensor " +
                           (varlen ? "[total_q, heads, dim] (varlen)" : "[batch, seqlen, heads, dim]") + ", got rank " +
                           std::to_string(a.q.rank));
  }
  if (!is_float_dtype(a.q.dtype) && a.q.dtype != DType::e4m3) {
    return Status::invalid(std::string("q: dtype must be float16, bfloat16, float32, float64 or float8_e4m3fn, got ") +
                           dtype_name(a.q.dtype));
  }
  if (a.k.rank != rank) {
    return Status::invalid("k: expected rank " + std::to_string(rank) + ", got rank " + std::to_string(a.k.rank));
  }
  if (a.v.rank != rank) {
    return Status::invalid("v: expected rank " + std::to_string(rank) + ", got rank " + std::to_string(a.v.rank));
  }
  for (int i = 0; i < rank; ++i) {
    if (a.q.shape[i] < 0) return Status::invalid("q: negative size in " + shape_str(a.q));
    if (a.k.shape[i] < 0) return Status::invalid("k: negative size in " + shape_str(a.k));
    if (a.v.shape[i] < 0) return Status::invalid("v: negative size in " + shape_str(a.v));
  }

  FwdParams p;
  p.dtype = a.q.dtype;
  p.device = a.q.device;
  p.batch = varlen ? a.cu_seqlens_q.shape[0] - 1 : a.q.shape[0];
  const int64_t rows_q = a.q.shape[o_];
  const int64_t rows_k = a.k.shape[o_];
  p.heads_q = a.q.shape[o_ + 1];
  p.heads_kv = a.k.shape[o_ + 1];
  p.head_dim = a.q.shape[o_ + 2];
  p.head_dim_v = a.v.shape[o_ + 2];

  if (!((st = check_heads(p, "k", "v")).ok())) return st;

  // Shapes every other tensor must have.
  int64_t k_shape[4], v_shape[4], o_shape[4], q_shape[4];
  if (varlen) {
    const int64_t q3[3] = {rows_q, p.heads_q, p.head_dim}, k3[3] = {rows_k, p.heads_kv, p.head_dim};
    const int64_t v3[3] = {rows_k, p.heads_kv, p.head_dim_v}, o3[3] = {rows_q, p.heads_q, p.head_dim_v};
    std::copy(q3, q3 + 3, q_shape);
    std::copy(k3, k3 + 3, k_shape);
    std::copy(v3, v3 + 3, v_shape);
    std::copy(o3, o3 + 3, o_shape);
  } else {
    const int64_t b = p.batch, sq = a.q.shape[1], sk = a.k.shape[1];
    const int64_t q4[4] = {b, sq, p.heads_q, p.head_dim}, k4[4] = {b, sk, p.heads_kv, p.head_dim};
    const int64_t v4[4] = {b, sk, p.heads_kv, p.head_dim_v}, o4[4] = {b, sq, p.heads_q, p.head_dim_v};
    std::copy(q4, q4 + 4, q_shape);
    std::copy(k4, k4 + 4, k_shape);
    std::copy(v4, v4 + 4, v_shape);
    std::copy(o4, o4 + 4, o_shape);
  }
  const Device dev = a.q.device;
  if (!((st = check_tensor("q", a.q, rank, q_shape, p.dtype, dev, true)).ok())) return st;
  if (!((st = check_tensor("k", a.k, rank, k_shape, p.dtype, dev, true)).ok())) return st;
  if (!((st = check_tensor("v", a.v, rank, v_shape, p.dtype, dev, true)).ok())) return st;
  if (!a.out.defined()) return Status::invalid("out: required");
  if (!((st = set_out_dtype(a.out, &p)).ok())) return st;
  if (!((st = check_tensor("out", a.out, rank, o_shape, p.out_dtype, dev, true)).ok())) return st;

  if (varlen) {
    p.total_q = rows_q;
    p.total_k = rows_k;
    p.seqlen_q = a.max_seqlen_q;
    p.seqlen_k = a.max_seqlen_k;
    if (!((st = check_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, dev, p.batch, rows_q, &p.seqlen_q, "max_seqlen_q",
                                 o.stream))
              .ok()))
      return st;
    if (a.cu_seqlens_k.shape[0] != p.batch + 1) {
      return Status::invalid("cu_seqlens_k: expected " + std::to_string(p.batch + 1) +
                             " entries (like cu_seqlens_q), got " + std::to_string(a.cu_seqlens_k.shape[0]));
    }
    if (!((st = check_cu_seqlens("cu_seqlens_k", a.cu_seqlens_k, dev, p.batch, rows_k, &p.seqlen_k, "max_seqlen_k",
                                 o.stream))
              .ok()))
      return st;
    p.cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int32_t*>(a.cu_seqlens_k.data);
  } else {
    p.seqlen_q = a.q.shape[1];
    p.seqlen_k = a.k.shape[1];
  }

  if (!((st = set_lse(a.lse, &p)).ok())) return st;
  if (!((st = set_alibi(a.alibi_slopes, &p)).ok())) return st;
  if (!((st = set_dropout_rng(a.dropout_rng, o.dropout_p, &p)).ok())) return st;
  if (!((st = set_descale("q_descale", a.q_descale, &p, &p.q_descale, p.q_descale_strides)).ok())) return st;
  if (!((st = set_descale("k_descale", a.k_descale, &p, &p.k_descale, p.k_descale_strides)).ok())) return st;
  if (!((st = set_descale("v_descale", a.v_descale, &p, &p.v_descale, p.v_descale_strides)).ok())) return st;
  if (!((st = set_qv(a.qv, a.q, varlen, &p)).ok())) return st;

  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.out.data;
  row_strides(a.q, varlen, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  row_strides(a.k, varlen, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  row_strides(a.v, varlen, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  row_strides(a.out, varlen, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);

  set_options(o, &p);
  *out = p;
  return Status::success();
}

Status make_backward_params(const BackwardArgs& a, const AttentionOptions& o, BwdParams* out) {
  if (out == nullptr) return Status::invalid("params: null output pointer");
  if (!a.lse.defined()) return Status::invalid("lse: required by the backward (the forward's log-sum-exp)");
  FwdParams f;
  Status st = make_forward_params(a, o, &f);
  if (!st.ok()) return st;
  BwdParams p;
  static_cast<FwdParams&>(p) = f;
  const bool varlen = f.is_varlen();
  const int rank = varlen ? 3 : 4;
  struct Grad {
    const char* name;
    const TensorView* t;
    const TensorView* like;
  } grads[4] = {{"dout", &a.dout, &a.out}, {"dq", &a.dq, &a.q}, {"dk", &a.dk, &a.k}, {"dv", &a.dv, &a.v}};
  for (const Grad& g : grads) {
    if (!g.t->defined()) return Status::invalid(std::string(g.name) + ": required");
    // float8 inputs: dout in e4m3 like them, the gradients in out's 16-bit dtype.
    const DType want = f.dtype == DType::e4m3 && g.t != &a.dout ? f.out_dtype : f.dtype;
    st = check_tensor(g.name, *g.t, rank, g.like->shape, want, f.device, true);
    if (!st.ok()) return st;
  }
  if (!((st = set_descale("do_descale", a.do_descale, &p, &p.do_descale, p.do_descale_strides)).ok())) return st;
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  row_strides(a.dout, varlen, &p.do_batch_stride, &p.do_row_stride, &p.do_head_stride);
  row_strides(a.dq, varlen, &p.dq_batch_stride, &p.dq_row_stride, &p.dq_head_stride);
  row_strides(a.dk, varlen, &p.dk_batch_stride, &p.dk_row_stride, &p.dk_head_stride);
  row_strides(a.dv, varlen, &p.dv_batch_stride, &p.dv_row_stride, &p.dv_head_stride);
  p.deterministic = o.deterministic;
  *out = p;
  return Status::success();
}

}  // namespace flashattn

namespace flashattn {
namespace {

// An optional int32 [batch] index tensor of a KV-cache call.
Status check_index_vector(const char* name, const TensorView& t, int64_t batch, Device dev, const int32_t** out) {
  *out = nullptr;
  if (!t.defined()) return Status::success();
  const int64_t shape[1] = {batch};
  Status st = check_tensor(name, t, 1, shape, DType::i32, dev, true);
  if (!st.ok()) return st;
  *out = static_cast<const int32_t*>(t.data);
  return Status::success();
}

// Host copy of `count` int32 values (a contiguous device or host array).
Status read_indices(const int32_t* data, int64_t count, Device dev, void* stream, std::vector<int32_t>* host) {
  host->assign(size_t(count), 0);
  if (count == 0) return Status::success();
  if (dev.type == DeviceType::cpu) {
    std::copy(data, data + count, host->begin());
    return Status::success();
  }
  return detail::cuda_copy_to_host(host->data(), data, size_t(count) * sizeof(int32_t), dev.index, stream);
}

// The index values of a validated KV-cache call: lengths within the capacity, entries and pages in range.
Status check_index_values(const KVCacheParams& kp, const TensorView& block_table_view) {
  const FwdParams& p = kp.attn;
  const Device dev = p.device;
  std::vector<int32_t> used, pad, idx, table, cu_new, rotary;
  Status st;
  if (p.seqused_k && !(st = read_indices(p.seqused_k, p.batch, dev, p.stream, &used)).ok()) return st;
  if (p.leftpad_k && !(st = read_indices(p.leftpad_k, p.batch, dev, p.stream, &pad)).ok()) return st;
  if (p.kv_batch_idx && !(st = read_indices(p.kv_batch_idx, p.batch, dev, p.stream, &idx)).ok()) return st;
  if (p.cu_seqlens_k_new && !(st = read_indices(p.cu_seqlens_k_new, p.batch + 1, dev, p.stream, &cu_new)).ok())
    return st;
  if (kp.rotary_seqlens && !(st = read_indices(kp.rotary_seqlens, p.batch, dev, p.stream, &rotary)).ok()) return st;
  // The block table's pages are checked where reading it is free (CPU tensors). On CUDA it may be large and its
  // pages cost nothing to leave to the kernels, which never read or write through a page out of range.
  const bool check_pages = p.block_table != nullptr && dev.type == DeviceType::cpu;
  if (check_pages) {
    // Rows are read whole; the stride between them may exceed the row (a view of a wider table).
    const int64_t cols = block_table_view.shape[1];
    std::vector<int32_t> row;
    table.reserve(size_t(p.cache_entries * cols));
    if (p.block_table_stride == cols) {
      if (!(st = read_indices(p.block_table, p.cache_entries * cols, dev, p.stream, &table)).ok()) return st;
    } else {
      for (int64_t r = 0; r < p.cache_entries; ++r) {
        if (!(st = read_indices(p.block_table + r * p.block_table_stride, cols, dev, p.stream, &row)).ok()) return st;
        table.insert(table.end(), row.begin(), row.end());
      }
    }
  }
  const char* capacity_name = p.block_table ? "block_table" : "k_cache";
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t entry = p.kv_batch_idx ? idx[size_t(b)] : b;
    if (entry < 0 || entry >= p.cache_entries) {
      return Status::invalid("cache_batch_idx: entry " + std::to_string(b) + " is " + std::to_string(entry) +
                             ", outside [0, " + std::to_string(p.cache_entries) + ")");
    }
    const int64_t appended = p.cu_seqlens_k_new ? int64_t(cu_new[size_t(b + 1)]) - cu_new[size_t(b)] : p.appended_k;
    const int64_t end = (p.seqused_k ? int64_t(used[size_t(b)]) : p.seqlen_k) + appended;
    if (p.seqused_k && used[size_t(b)] < 0) {
      return Status::invalid("cache_seqlens: entry " + std::to_string(b) + " is negative (" +
                             std::to_string(used[size_t(b)]) + ")");
    }
    if (end > p.seqlen_k) {
      std::string what = "cache_seqlens[" + std::to_string(b) + "] (" + std::to_string(end - appended) + ")";
      if (appended > 0) what += " + " + std::to_string(appended) + " new rows";
      return Status::invalid(std::string(capacity_name) + ": " + what + " exceeds the " +
                             std::to_string(p.seqlen_k) + " rows the cache addresses" +
                             (p.block_table ? " (block_table columns x page_size)" : " (k_cache's dim 1)"));
    }
    if (kp.rotary_cos) {
      // Positions: query rows at base (+ i), new rows at base + i; base = rotary_seqlens[b] or cache_seqlens[b].
      const int64_t base = kp.rotary_seqlens ? int64_t(rotary[size_t(b)]) : end - appended;
      const int64_t len_q = p.seqlen_q;  // varlen: the longest, a bound on every sequence's rows
      const int64_t last = base + std::max<int64_t>(kp.rotary_per_row ? len_q : 1, appended) - 1;
      const char* name = kp.rotary_seqlens ? "rotary_seqlens" : "rotary_cos";
      if (base < 0) {
        return Status::invalid(std::string(name) + ": entry " + std::to_string(b) + " is negative (" +
                               std::to_string(base) + ")");
      }
      if (last >= kp.rotary_rows) {
        return Status::invalid(std::string(name) + ": sequence " + std::to_string(b) +
                               " rotates rows at positions up to " + std::to_string(last) + " (" +
                               (kp.rotary_seqlens ? "rotary_seqlens" : "cache_seqlens") +
                               " + row), past rotary_cos's " + std::to_string(kp.rotary_rows) + " positions");
      }
    }
    const int64_t begin = p.leftpad_k ? pad[size_t(b)] : 0;
    if (begin < 0 || begin > end) {
      return Status::invalid("cache_leftpad: entry " + std::to_string(b) + " is " + std::to_string(begin) +
                             ", outside [0, " + std::to_string(end) + "] (the sequence's used rows)");
    }
    // The pages of the rows read (from leftpad) and of the rows written (the appended ones, which may start
    // before leftpad).
    const int64_t first = appended > 0 ? std::min(begin, end - appended) : begin;
    if (check_pages && end > first) {
      const int64_t cols = block_table_view.shape[1];
      for (int64_t pg = first / p.page_size; pg <= (end - 1) / p.page_size; ++pg) {
        const int64_t page = table[size_t(entry * cols + pg)];
        if (page < 0 || page >= p.num_pages) {
          return Status::invalid("block_table: row " + std::to_string(entry) + ", column " + std::to_string(pg) +
                                 " is page " + std::to_string(page) + ", outside [0, " + std::to_string(p.num_pages) +
                                 ") (k_cache's dim 0)");
        }
      }
    }
  }
  return Status::success();
}

}  // namespace

Status make_kvcache_params(const KVCacheArgs& a, const AttentionOptions& o, KVCacheParams* out) {
  Status st = check_options(o);
  if (!st.ok()) return st;
  if (o.dropout_p > 0) return Status::invalid("dropout_p: the KV-cache path is inference-only: it takes no dropout");
  if (out == nullptr) return Status::invalid("params: null output pointer");
  const bool varlen = a.cu_seqlens_q.defined();
  const int qrank = varlen ? 3 : 4;
  if (a.q.rank != qrank) {
    return Status::invalid(std::string("q: expected a rank-") + std::to_string(qrank) + " tensor " +
                           (varlen ? "[total_q, heads, dim] (cu_seqlens_q given)" : "[batch, seqlen_q, heads, dim]") +
                           ", got rank " + std::to_string(a.q.rank) + " " + shape_str(a.q));
  }
  if (!is_float_dtype(a.q.dtype) && a.q.dtype != DType::e4m3) {
    return Status::invalid(std::string("q: dtype must be float16, bfloat16, float32, float64 or float8_e4m3fn, got ") +
                           dtype_name(a.q.dtype));
  }
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"k_cache", &a.k_cache}, {"v_cache", &a.v_cache}}) {
    if (t->rank != 4) {
      return Status::invalid(std::string(name) + ": expected a rank-4 tensor [batch_cache, seqlen_cache, heads_kv, dim] "
                             "or, paged, [num_pages, page_size, heads_kv, dim], got rank " + std::to_string(t->rank) +
                             " " + shape_str(*t));
    }
  }
  if (varlen && (a.cu_seqlens_q.rank != 1 || a.cu_seqlens_q.shape[0] < 1)) {
    return Status::invalid("cu_seqlens_q: expected a rank-1 tensor of batch + 1 >= 1 entries, got " +
                           shape_str(a.cu_seqlens_q));
  }
  for (int i = 0; i < qrank; ++i)
    if (a.q.shape[i] < 0) return Status::invalid("q: negative size in " + shape_str(a.q));
  for (int i = 0; i < 4; ++i) {
    if (a.k_cache.shape[i] < 0) return Status::invalid("k_cache: negative size in " + shape_str(a.k_cache));
    if (a.v_cache.shape[i] < 0) return Status::invalid("v_cache: negative size in " + shape_str(a.v_cache));
  }

  KVCacheParams kp;
  FwdParams& p = kp.attn;
  p.dtype = a.q.dtype;
  p.device = a.q.device;
  const Device dev = p.device;
  const int o_ = varlen ? 0 : 1;
  p.batch = varlen ? a.cu_seqlens_q.shape[0] - 1 : a.q.shape[0];
  p.heads_q = a.q.shape[o_ + 1];
  p.head_dim = a.q.shape[o_ + 2];
  p.heads_kv = a.k_cache.shape[2];
  p.head_dim_v = a.v_cache.shape[3];
  if (!((st = check_heads(p, "k_cache", "v_cache")).ok())) return st;
  if (!((st = check_tensor("q", a.q, qrank, a.q.shape, p.dtype, dev, true)).ok())) return st;

  // The cache: dense, or paged through block_table.
  const bool paged = a.block_table.defined();
  const int64_t cache_dim0 = a.k_cache.shape[0], cache_rows = a.k_cache.shape[1];
  if (paged) {
    if (a.block_table.rank != 2) {
      return Status::invalid("block_table: expected a rank-2 int32 tensor [batch, max_pages], got rank " +
                             std::to_string(a.block_table.rank) + " " + shape_str(a.block_table));
    }
    if (!((st = check_tensor("block_table", a.block_table, 2, a.block_table.shape, DType::i32, dev, true)).ok()))
      return st;
    if (cache_rows < 1) return Status::invalid("k_cache: the page size (dim 1) must be >= 1 when paged");
    p.block_table = static_cast<const int32_t*>(a.block_table.data);
    p.block_table_stride = a.block_table.stride[0];
    p.page_size = cache_rows;
    p.num_pages = cache_dim0;
    p.cache_entries = a.block_table.shape[0];
    p.seqlen_k = a.block_table.shape[1] * cache_rows;
  } else {
    p.cache_entries = cache_dim0;
    p.seqlen_k = cache_rows;
  }
  const int64_t k_shape[4] = {cache_dim0, cache_rows, p.heads_kv, p.head_dim};
  const int64_t v_shape[4] = {cache_dim0, cache_rows, p.heads_kv, p.head_dim_v};
  if (!((st = check_tensor("k_cache", a.k_cache, 4, k_shape, p.dtype, dev, true)).ok())) return st;
  if (!((st = check_tensor("v_cache", a.v_cache, 4, v_shape, p.dtype, dev, true)).ok())) return st;

  if (!((st = check_index_vector("cache_seqlens", a.cache_seqlens, p.batch, dev, &p.seqused_k)).ok())) return st;
  if (!((st = check_index_vector("cache_leftpad", a.cache_leftpad, p.batch, dev, &p.leftpad_k)).ok())) return st;
  if (!((st = check_index_vector("cache_batch_idx", a.cache_batch_idx, p.batch, dev, &p.kv_batch_idx)).ok()))
    return st;
  if (!p.kv_batch_idx && p.cache_entries < p.batch) {
    return Status::invalid(std::string(paged ? "block_table" : "k_cache") + ": " + std::to_string(p.cache_entries) +
                           (paged ? " rows" : " cache entries (dim 0)") + " for a batch of " +
                           std::to_string(p.batch) + " (pass cache_batch_idx to map sequences to entries)");
  }

  // Queries, and the output laid out like them.
  if (varlen) {
    p.total_q = a.q.shape[0];
    p.seqlen_q = a.max_seqlen_q;
    if (a.check_index_values || a.max_seqlen_q <= 0 || dev.type == DeviceType::cpu) {
      if (!((st = check_cu_seqlens("cu_seqlens_q", a.cu_seqlens_q, dev, p.batch, p.total_q, &p.seqlen_q,
                                   "max_seqlen_q", o.stream))
                .ok()))
        return st;
    } else {
      // Unchecked (CUDA-graph capture): the offsets stay on the device; the kernels read them, bounded by
      // max_seqlen_q rows per sequence and total_q rows in all.
      const int64_t shape[1] = {p.batch + 1};
      if (!((st = check_tensor("cu_seqlens_q", a.cu_seqlens_q, 1, shape, DType::i32, dev, true)).ok())) return st;
    }
    p.cu_seqlens_q = static_cast<const int32_t*>(a.cu_seqlens_q.data);
  } else {
    p.seqlen_q = a.q.shape[1];
  }
  int64_t o_shape[4];
  std::copy(a.q.shape, a.q.shape + qrank, o_shape);
  o_shape[qrank - 1] = p.head_dim_v;
  if (!a.out.defined()) return Status::invalid("out: required");
  if (!((st = set_out_dtype(a.out, &p)).ok())) return st;
  if (!((st = check_tensor("out", a.out, qrank, o_shape, p.out_dtype, dev, true)).ok())) return st;
  if (!((st = set_lse(a.lse, &p)).ok())) return st;
  if (!((st = set_alibi(a.alibi_slopes, &p)).ok())) return st;
  if (!((st = set_descale("q_descale", a.q_descale, &p, &p.q_descale, p.q_descale_strides)).ok())) return st;
  if (!((st = set_descale("k_descale", a.k_descale, &p, &p.k_descale, p.k_descale_strides)).ok())) return st;
  if (!((st = set_descale("v_descale", a.v_descale, &p, &p.v_descale, p.v_descale_strides)).ok())) return st;
  if (!((st = set_qv(a.qv, a.q, varlen, &p)).ok())) return st;

  // New rows to append, and the rotary embedding.
  if (a.k_new.defined() != a.v_new.defined()) {
    return Status::invalid(a.k_new.defined() ? "v_new: required when k_new is given" : "k_new: required when v_new is given");
  }
  if (a.cu_seqlens_k_new.defined() && !a.k_new.defined()) {
    return Status::invalid("cu_seqlens_k_new: given without the new rows k_new / v_new");
  }
  if (a.k_new.defined()) {
    if (!a.cache_seqlens.defined()) return Status::invalid("cache_seqlens: required when k_new / v_new are appended");
    // Padded new rows [b, s_new, h_kv, d], or packed [total_new, h_kv, d] with cu_seqlens_k_new.
    const bool varlen_new = a.cu_seqlens_k_new.defined();
    const int new_rank = varlen_new ? 3 : 4;
    if (a.k_new.rank != new_rank) {
      return Status::invalid(std::string("k_new: expected a rank-") + std::to_string(new_rank) + " tensor " +
                             (varlen_new ? "[total_new, heads_kv, dim] (with cu_seqlens_k_new)"
                                         : "[batch, seqlen_new, heads_kv, dim]") +
                             ", got " + shape_str(a.k_new));
    }
    kp.seqlen_new = a.k_new.shape[varlen_new ? 0 : 1];
    int64_t kn_shape[4] = {p.batch, kp.seqlen_new, p.heads_kv, p.head_dim};
    int64_t vn_shape[4] = {p.batch, kp.seqlen_new, p.heads_kv, p.head_dim_v};
    const int o_new = varlen_new ? 1 : 0;  // the packed shapes drop the batch dim
    if (!((st = check_tensor("k_new", a.k_new, new_rank, kn_shape + o_new, p.dtype, dev, true)).ok())) return st;
    if (!((st = check_tensor("v_new", a.v_new, new_rank, vn_shape + o_new, p.dtype, dev, true)).ok())) return st;
    if (!varlen_new && kp.seqlen_new > p.seqlen_k) {
      return Status::invalid("k_new: " + std::to_string(kp.seqlen_new) + " new rows exceed the cache's " +
                             std::to_string(p.seqlen_k) + " rows");
    }
    if (varlen_new) {
      if (a.check_index_values || dev.type == DeviceType::cpu) {
        int64_t longest = 0;
        if (!((st = check_cu_seqlens("cu_seqlens_k_new", a.cu_seqlens_k_new, dev, p.batch, kp.seqlen_new, &longest,
                                     "cu_seqlens_k_new", o.stream))
                  .ok()))
          return st;
      } else {
        // Unchecked (CUDA-graph capture): the kernels read the offsets on the device, bounded by total_new rows.
        const int64_t shape[1] = {p.batch + 1};
        if (!((st = check_tensor("cu_seqlens_k_new", a.cu_seqlens_k_new, 1, shape, DType::i32, dev, true)).ok()))
          return st;
      }
      p.cu_seqlens_k_new = static_cast<const int32_t*>(a.cu_seqlens_k_new.data);
    }
    kp.k_new = a.k_new.data;
    kp.v_new = a.v_new.data;
    kp.k_new_batch_stride = varlen_new ? 0 : a.k_new.stride[0];
    kp.k_new_row_stride = a.k_new.stride[o_new ? 0 : 1], kp.k_new_head_stride = a.k_new.stride[o_new ? 1 : 2];
    kp.v_new_batch_stride = varlen_new ? 0 : a.v_new.stride[0];
    kp.v_new_row_stride = a.v_new.stride[o_new ? 0 : 1], kp.v_new_head_stride = a.v_new.stride[o_new ? 1 : 2];
    p.appended_k = varlen_new ? 0 : kp.seqlen_new;
  }
  if (a.rotary_cos.defined() != a.rotary_sin.defined()) {
    return Status::invalid(a.rotary_cos.defined() ? "rotary_sin: required when rotary_cos is given"
                                                  : "rotary_cos: required when rotary_sin is given");
  }
  // Without rotary_cos / rotary_sin nothing is rotated, so the positions' base cannot change a result: checked, then
  // unused (FA3 passes rotary_seqlens whether or not it passes tables).
  const int32_t* rotary_seqlens = nullptr;
  if (!((st = check_index_vector("rotary_seqlens", a.rotary_seqlens, p.batch, dev, &rotary_seqlens)).ok())) return st;
  if (a.rotary_cos.defined()) {
    if (!a.k_new.defined()) return Status::invalid("rotary_cos: rotary embedding needs the new rows k_new / v_new");
    if (a.rotary_cos.rank != 2) {
      return Status::invalid("rotary_cos: expected a rank-2 tensor [seqlen_ro, rotary_dim / 2], got " +
                             shape_str(a.rotary_cos));
    }
    kp.rotary_rows = a.rotary_cos.shape[0];
    kp.rotary_dim = 2 * a.rotary_cos.shape[1];
    if (!((st = check_tensor("rotary_cos", a.rotary_cos, 2, a.rotary_cos.shape, p.dtype, dev, true)).ok())) return st;
    if (!((st = check_tensor("rotary_sin", a.rotary_sin, 2, a.rotary_cos.shape, p.dtype, dev, true)).ok())) return st;
    if (a.rotary_cos.stride[0] != a.rotary_cos.shape[1] || a.rotary_sin.stride[0] != a.rotary_sin.shape[1]) {
      return Status::invalid(std::string(a.rotary_cos.stride[0] != a.rotary_cos.shape[1] ? "rotary_cos" : "rotary_sin") +
                             ": must be contiguous");
    }
    if (kp.rotary_dim < 2 || kp.rotary_dim > p.head_dim) {
      return Status::invalid("rotary_cos: rotary_dim (2 x dim 1 = " + std::to_string(kp.rotary_dim) +
                             ") must be in [2, head dim " + std::to_string(p.head_dim) + "]");
    }
    kp.rotary_per_row = o.causal || o.window_left >= 0 || o.window_right >= 0 || o.attention_chunk > 0;
    kp.rotary_seqlens = rotary_seqlens;
    // Appended rows are rotated at their cache rows (without rotary_seqlens); queries past the new rows
    // (s_q > s_new) at positions beyond them, and rotary_seqlens' positions, are checked with the index values.
    if (!kp.rotary_seqlens && kp.rotary_rows < p.seqlen_k) {
      return Status::invalid("rotary_cos: " + std::to_string(kp.rotary_rows) +
                             " positions, but rows are rotated at positions up to " + std::to_string(p.seqlen_k - 1) +
                             " (the cache's rows)");
    }
    kp.rotary_cos = a.rotary_cos.data;
    kp.rotary_sin = a.rotary_sin.data;
    kp.rotary_interleaved = a.rotary_interleaved;
  }
  if (a.num_splits < 0 || a.num_splits > 256) {
    return Status::invalid("num_splits: must be in [0, 256] (0 = chosen from the shape), got " +
                           std::to_string(a.num_splits));
  }

  p.q = a.q.data;
  p.k = a.k_cache.data;
  p.v = a.v_cache.data;
  p.o = a.out.data;
  kp.k_cache = a.k_cache.data;
  kp.v_cache = a.v_cache.data;
  row_strides(a.q, varlen, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  row_strides(a.out, varlen, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  row_strides(a.k_cache, false, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  row_strides(a.v_cache, false, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  p.num_splits = a.num_splits;
  set_options(o, &p);
  // With no index tensor at all this is a plain forward over every cache row (any backend runs it).
  if (a.check_index_values && !((st = check_index_values(kp, a.block_table)).ok())) return st;
  *out = kp;
  return Status::success();
}

namespace {

// The lowest and one past the highest byte a view can touch (its elements' span).
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
  return {base, base + uintptr_t((last + 1) * int64_t(dtype_size(t.dtype)))};
}

bool same_view(const TensorView& x, const TensorView& y) {
  if (x.data != y.data || x.dtype != y.dtype || x.rank != y.rank) return false;
  for (int i = 0; i < x.rank; ++i) {
    if (x.shape[i] != y.shape[i] || (x.shape[i] > 1 && x.stride[i] != y.stride[i])) return false;
  }
  return true;
}

// An output may be exactly an input (in-place accumulation: each element is read before it is written) but must
// not overlap it otherwise.
Status check_overlap(const char* out_name, const TensorView& out, const char* in_name, const TensorView& in) {
  if (out.numel() == 0 || in.numel() == 0 || same_view(out, in)) return Status::success();
  const auto o = byte_span(out), i = byte_span(in);
  if (o.first < i.second && i.first < o.second) {
    return Status::invalid(std::string(out_name) + ": overlaps " + in_name +
                           " without being the same view (only exact in-place accumulation is supported)");
  }
  return Status::success();
}

bool is_merge_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

}  // namespace

Status make_merge_params(const MergeArgs& a, MergeParams* out) {
  if (!out) return Status::invalid("params: null output pointer");
  if (!a.out_a.defined()) return Status::invalid("out_a: required");
  const bool varlen = a.out_a.rank == 3;
  if (a.out_a.rank != 3 && a.out_a.rank != 4) {
    return Status::invalid("out_a: expected [batch, seqlen, heads, head_dim_v] or [total, heads, head_dim_v], got "
                           "rank " + std::to_string(a.out_a.rank) + " " + shape_str(a.out_a));
  }
  if (!is_merge_dtype(a.out_a.dtype)) {
    return Status::invalid(std::string("out_a: expected float32, float16 or bfloat16, got ") +
                           dtype_name(a.out_a.dtype));
  }
  if (a.out_b.defined() && !is_merge_dtype(a.out_b.dtype)) {
    return Status::invalid(std::string("out_b: expected float32, float16 or bfloat16, got ") +
                           dtype_name(a.out_b.dtype));
  }
  const Device device = a.out_a.device;
  const int rank = a.out_a.rank;
  const int64_t* shape = a.out_a.shape;
  const int64_t lse_padded[3] = {shape[0], shape[2], shape[1]};
  const int64_t lse_varlen[2] = {shape[1], shape[0]};
  const int64_t* lse_shape = varlen ? lse_varlen : lse_padded;
  struct Named {
    const char* name;
    const TensorView& t;
    bool out_like;
  };
  const Named all[] = {{"out_a", a.out_a, true}, {"lse_a", a.lse_a, false}, {"out_b", a.out_b, true},
                       {"lse_b", a.lse_b, false}, {"out", a.out, true},     {"lse", a.lse, false}};
  for (const Named& n : all) {
    if (!n.t.defined()) {
      if (&n.t == &a.lse) continue;
      return Status::invalid(std::string(n.name) + ": required");
    }
    if (!same_device(n.t.device, device)) {
      return Status::invalid(std::string(n.name) + ": on " + device_str(n.t.device) + " but out_a is on " +
                             device_str(device));
    }
    const DType dtype = !n.out_like ? DType::f32 : &n.t == &a.out_b ? a.out_b.dtype : a.out_a.dtype;
    const Status st = check_tensor(n.name, n.t, n.out_like ? rank : rank - 1, n.out_like ? shape : lse_shape, dtype,
                                   device, true);
    if (!st.ok()) return st;
  }
  for (const Named& o : {all[4], all[5]}) {
    if (!o.t.defined()) continue;
    for (const Named& in : all) {
      if (&in.t == &a.out || &in.t == &a.lse || !in.t.defined()) continue;
      const Status st = check_overlap(o.name, o.t, in.name, in.t);
      if (!st.ok()) return st;
    }
  }
  if (a.lse.defined()) {
    const Status st = check_overlap("lse", a.lse, "out", a.out);
    if (!st.ok()) return st;
  }
  if (a.num_threads < 0) return Status::invalid("num_threads: must be >= 0, got " + std::to_string(a.num_threads));

  MergeParams p;
  auto side = [&](const TensorView& o, const TensorView& lse) {
    MergeParams::Side s;
    s.out = o.data;
    s.lse = static_cast<const float*>(lse.data);
    s.dtype = o.dtype;
    row_strides(o, varlen, &s.batch_stride, &s.row_stride, &s.head_stride);
    lse_strides(lse, varlen, &s.lse_batch_stride, &s.lse_head_stride);
    return s;
  };
  p.a = side(a.out_a, a.lse_a);
  p.b = side(a.out_b, a.lse_b);
  p.out = a.out.data;
  row_strides(a.out, varlen, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  if (a.lse.defined()) {
    p.lse = static_cast<float*>(a.lse.data);
    lse_strides(a.lse, varlen, &p.lse_batch_stride, &p.lse_head_stride);
  }
  p.batch = varlen ? 1 : shape[0];
  p.rows = shape[varlen ? 0 : 1];
  p.heads = shape[rank - 2];
  p.head_dim_v = shape[rank - 1];
  p.device = device;
  p.stream = a.stream;
  p.num_threads = a.num_threads;
  *out = p;
  return Status::success();
}

}  // namespace flashattn
