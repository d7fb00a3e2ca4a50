// Validation: tensor views + options -> params. Every rejection names the argument. Nothing here writes to
// any output, so a rejected call leaves the caller's buffers untouched.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <sstream>
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
  if (o.window_left < -1) return Status::invalid("window_left: must be >= -1 (-1 = unbounded)");
  if (o.window_right < -1) return Status::invalid("window_right: must be >= -1 (-1 = unbounded)");
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
  if (!is_float_dtype(a.q.dtype)) {
    return Status::invalid(std::string("q: dtype must be float16, bfloat16, float32 or float64, got ") +
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

  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) {
    return Status::invalid("q: head dim must be in [1, " + std::to_string(kMaxHeadDim) + "], got " +
                           std::to_string(p.head_dim));
  }
  if (p.head_dim_v < 1 || p.head_dim_v > kMaxHeadDim) {
    return Status::invalid("v: head dim must be in [1, " + std::to_string(kMaxHeadDim) + "], got " +
                           std::to_string(p.head_dim_v));
  }
  if (p.heads_q < 1) return Status::invalid("q: number of heads must be >= 1");
  if (p.heads_kv < 1) return Status::invalid("k: number of heads must be >= 1");
  if (p.heads_q % p.heads_kv != 0) {
    return Status::invalid("k: query heads (" + std::to_string(p.heads_q) + ") must be a multiple of key/value heads (" +
                           std::to_string(p.heads_kv) + ")");
  }

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
  if (!((st = check_tensor("out", a.out, rank, o_shape, p.dtype, dev, true)).ok())) return st;

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

  if (a.lse.defined()) {
    const int64_t lse_varlen[2] = {p.heads_q, p.total_q};
    const int64_t lse_padded[3] = {p.batch, p.heads_q, p.seqlen_q};
    if (!((st = check_tensor("lse", a.lse, varlen ? 2 : 3, varlen ? lse_varlen : lse_padded, DType::f32, dev, true))
              .ok()))
      return st;
    p.lse = static_cast<float*>(a.lse.data);
    p.lse_batch_stride = varlen ? 0 : a.lse.stride[0];
    p.lse_head_stride = varlen ? a.lse.stride[0] : a.lse.stride[1];
  }

  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.o = a.out.data;
  row_strides(a.q, varlen, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  row_strides(a.k, varlen, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  row_strides(a.v, varlen, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  row_strides(a.out, varlen, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);

  p.softmax_scale = o.softmax_scale > 0 ? float(o.softmax_scale) : float(1.0 / std::sqrt(double(p.head_dim)));
  p.softcap = float(o.softcap);
  p.causal = o.causal;
  // A window edge of 2^62 keys already reaches every key of any sequence (lengths are below 2^62); wider ones are
  // the same window, and narrowing them keeps every backend's mask arithmetic (diagonal ± edge) inside int64.
  constexpr int64_t kWidestWindow = int64_t(1) << 62;
  p.window_left = std::min(o.window_left, kWidestWindow);
  p.window_right = std::min(o.window_right, kWidestWindow);
  p.stream = o.stream;
  p.num_threads = o.num_threads;
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
    st = check_tensor(g.name, *g.t, rank, g.like->shape, f.dtype, f.device, true);
    if (!st.ok()) return st;
  }
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
