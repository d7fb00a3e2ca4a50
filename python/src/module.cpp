// flashattn._C: the framework-neutral native module behind the Python package.
//
// Tensors arrive as DLPack arrays (torch, numpy, JAX, CuPy, ...; CPU or CUDA) through nanobind's ndarray, so the
// module never compiles against a framework: the PyTorch layer (python/flashattn/_ops.py) is plain Python on
// top of it. The caller allocates every output; a CUDA stream arrives as an integer (cudaStream_t, 0 = the
// legacy default stream) because only the caller knows which stream its framework is using.
//
// Errors: Status::invalid_argument -> ValueError, unsupported -> NotImplementedError, device_error ->
// RuntimeError, each with the C++ message unchanged. Element types this library has no DType for -> TypeError.
// The GIL is released while validating (varlen and KV-cache validation may wait on a device copy) and computing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "flashattn/flashattn.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashattn::AttentionOptions;
using flashattn::Backend;
using flashattn::Device;
using flashattn::DeviceType;
using flashattn::DType;
using flashattn::ErrorCode;
using flashattn::Status;
using flashattn::TensorView;

// Inputs are read-only (JAX arrays, read-only numpy views); outputs must be writable.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

[[noreturn]] void throw_python(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

void throw_if_failed(const Status& st) {
  if (st.ok()) return;
  switch (st.code) {
    case ErrorCode::invalid_argument: throw_python(PyExc_ValueError, st.message);
    case ErrorCode::unsupported: throw_python(PyExc_NotImplementedError, st.message);
    case ErrorCode::device_error: throw_python(PyExc_RuntimeError, st.message);
    case ErrorCode::ok: break;
  }
  throw_python(PyExc_RuntimeError, st.message);
}

const char* dl_type_name(const nb::dlpack::dtype& t) {
  switch (nb::dlpack::dtype_code(t.code)) {
    case nb::dlpack::dtype_code::Int: return "int";
    case nb::dlpack::dtype_code::UInt: return "uint";
    case nb::dlpack::dtype_code::Float: return "float";
    case nb::dlpack::dtype_code::Bfloat: return "bfloat";
    case nb::dlpack::dtype_code::Complex: return "complex";
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: return "dlpack-type-code-";
  }
}

// int64_ok: the one argument the library takes int64 for (the dropout generator state); elsewhere int64 stays an
// unsupported type.
DType to_dtype(const char* name, const nb::dlpack::dtype& t, bool int64_ok = false) {
  using code = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(code::Float) && t.bits == 16) return DType::f16;
    if (t.code == uint8_t(code::Float) && t.bits == 32) return DType::f32;
    if (t.code == uint8_t(code::Float) && t.bits == 64) return DType::f64;
    if (t.code == uint8_t(code::Bfloat) && t.bits == 16) return DType::bf16;
    if (t.code == uint8_t(code::Int) && t.bits == 32) return DType::i32;
    if (t.code == uint8_t(code::Int) && t.bits == 64 && int64_ok) return DType::i64;
    if (t.code == uint8_t(code::Float8_E4M3FN) && t.bits == 8) return DType::e4m3;
  }
  std::string got = std::string(dl_type_name(t)) + std::to_string(int(t.bits));
  if (t.code > uint8_t(code::Bool)) got = "dlpack type code " + std::to_string(int(t.code)) + " bits " + std::to_string(int(t.bits));
  if (t.lanes != 1) got += "x" + std::to_string(int(t.lanes));
  throw_python(PyExc_TypeError, std::string(name) + ": unsupported dtype " + got +
                                    " (expected float16, bfloat16, float32, float64 or float8_e4m3fn; int32 for"
                                    " cu_seqlens and the cache indices, int64 for dropout_rng)");
}

Device to_device(const char* name, int device_type, int device_id) {
  if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value) {
    return Device{DeviceType::cpu, 0};  // pinned host memory is ordinary host-addressable memory
  }
  if (device_type == nb::device::cuda::value || device_type == nb::device::cuda_managed::value) {
    return Device{DeviceType::cuda, device_id};
  }
  throw_python(PyExc_ValueError, std::string(name) + ": tensors must live on the CPU or a CUDA device (DLPack device type " +
                              std::to_string(device_type) + ")");
}

template <typename Array>
TensorView to_view(const char* name, const Array& a, bool int64_ok = false) {
  if (a.ndim() > size_t(flashattn::kMaxRank)) {
    throw_python(PyExc_ValueError, std::string(name) + ": rank " + std::to_string(a.ndim()) + " is above the maximum of " +
                                std::to_string(flashattn::kMaxRank));
  }
  TensorView t;
  t.dtype = to_dtype(name, a.dtype(), int64_ok);
  t.device = to_device(name, a.device_type(), a.device_id());
  t.rank = int(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = int64_t(a.shape(size_t(i)));
    t.stride[i] = a.stride(size_t(i));
  }
  // data() includes DLPack's byte_offset; a const input is never written (validation and the backends only
  // read q, k, v, dout, out and lse in the backward).
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  return t;
}

template <typename Array>
TensorView to_view(const char* name, const std::optional<Array>& a, bool int64_ok = false) {
  return a ? to_view(name, *a, int64_ok) : TensorView{};
}

AttentionOptions make_options(double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                              int64_t attention_chunk, double softcap, bool deterministic, const std::string& backend,
                              int num_threads, uintptr_t stream) {
  AttentionOptions o;
  o.softmax_scale = softmax_scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.attention_chunk = attention_chunk;
  o.softcap = softcap;
  o.deterministic = deterministic;
  if (!flashattn::parse_backend(backend, &o.backend)) {
    throw_python(PyExc_ValueError, "backend: unknown name '" + backend +
                                "' (expected auto, cpu_reference, cpu_flash, cuda_sm80 or cuda_sm90)");
  }
  o.num_threads = num_threads;
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

flashattn::ForwardArgs forward_args(const In& q, const In& k, const In& v, const TensorView& out, const TensorView& lse,
                                    const OptIn& cu_seqlens_q, const OptIn& cu_seqlens_k, int64_t max_seqlen_q,
                                    int64_t max_seqlen_k, const OptIn& alibi_slopes) {
  flashattn::ForwardArgs a;
  a.q = to_view("q", q);
  a.k = to_view("k", k);
  a.v = to_view("v", v);
  a.out = out;
  a.lse = lse;
  a.cu_seqlens_q = to_view("cu_seqlens_q", cu_seqlens_q);
  a.cu_seqlens_k = to_view("cu_seqlens_k", cu_seqlens_k);
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_k = max_seqlen_k;
  a.alibi_slopes = to_view("alibi_slopes", alibi_slopes);
  return a;
}

// Validates (make), picks the backend (choose) and runs (run) with the GIL released; raises on failure, else
// returns the name of the backend that ran.
template <typename Params, typename Args, typename Make, typename Choose, typename Run>
std::string validate_and_run(const Args& a, const AttentionOptions& o, Make make, Choose choose, Run run) {
  Status st;
  Backend ran = o.backend;
  {
    nb::gil_scoped_release release;
    Params p;
    st = make(a, o, &p);
    if (st.ok()) {
      const flashattn::BackendChoice c = choose(p);
      st = c.status.ok() ? run(p, c.backend) : c.status;
      ran = c.backend;
    }
  }
  throw_if_failed(st);
  return flashattn::backend_name(ran);
}

// Validates, picks the backend and runs the forward; returns the name of the backend that ran.
std::string forward(const In& q, const In& k, const In& v, const Out& out, const OptOut& lse, const OptIn& cu_seqlens_q,
                    const OptIn& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                    bool causal, int64_t window_left, int64_t window_right, int64_t attention_chunk, double softcap,
                    const OptIn& alibi_slopes, double dropout_p, uint64_t dropout_seed, uint64_t dropout_offset,
                    const OptIn& dropout_rng, const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale,
                    const std::string& backend, int num_threads, uintptr_t stream, const OptIn& qv) {
  flashattn::ForwardArgs a = forward_args(q, k, v, to_view("out", out), to_view("lse", lse), cu_seqlens_q,
                                          cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes);
  a.qv = to_view("qv", qv);
  a.dropout_rng = to_view("dropout_rng", dropout_rng, /*int64_ok=*/true);
  a.q_descale = to_view("q_descale", q_descale);
  a.k_descale = to_view("k_descale", k_descale);
  a.v_descale = to_view("v_descale", v_descale);
  AttentionOptions o = make_options(softmax_scale, causal, window_left, window_right, attention_chunk, softcap, false,
                                    backend, num_threads, stream);
  o.dropout_p = dropout_p, o.dropout_seed = dropout_seed, o.dropout_offset = dropout_offset;
  return validate_and_run<flashattn::FwdParams>(
      a, o, flashattn::make_forward_params,
      [&](const flashattn::FwdParams& p) { return flashattn::choose_backend(p, o.backend, false); },
      flashattn::run_forward);
}

std::string backward(const In& dout, const In& q, const In& k, const In& v, const In& out, const OptIn& lse,
                     const Out& dq, const Out& dk, const Out& dv, const OptIn& cu_seqlens_q, const OptIn& cu_seqlens_k,
                     int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
                     int64_t window_right, int64_t attention_chunk, double softcap, bool deterministic,
                     const OptIn& alibi_slopes, double dropout_p, uint64_t dropout_seed, uint64_t dropout_offset,
                     const OptIn& dropout_rng, const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale,
                     const OptIn& do_descale, const std::string& backend, int num_threads, uintptr_t stream) {
  flashattn::BackwardArgs a;
  static_cast<flashattn::ForwardArgs&>(a) = forward_args(q, k, v, to_view("out", out), to_view("lse", lse),
                                                         cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                         alibi_slopes);
  a.dout = to_view("dout", dout);
  a.dropout_rng = to_view("dropout_rng", dropout_rng, /*int64_ok=*/true);
  a.q_descale = to_view("q_descale", q_descale);
  a.k_descale = to_view("k_descale", k_descale);
  a.v_descale = to_view("v_descale", v_descale);
  a.do_descale = to_view("do_descale", do_descale);
  a.dq = to_view("dq", dq);
  a.dk = to_view("dk", dk);
  a.dv = to_view("dv", dv);
  AttentionOptions o = make_options(softmax_scale, causal, window_left, window_right, attention_chunk, softcap,
                                    deterministic, backend, num_threads, stream);
  o.dropout_p = dropout_p, o.dropout_seed = dropout_seed, o.dropout_offset = dropout_offset;
  return validate_and_run<flashattn::BwdParams>(
      a, o, flashattn::make_backward_params,
      [&](const flashattn::BwdParams& p) { return flashattn::choose_backend(p, o.backend); }, flashattn::run_backward);
}

// flash_attn_with_kvcache: appends k_new / v_new (k rotated) into the caches in place, then attends over them into
// caller-allocated out and optional lse. The caches are writable arrays (they are written when k_new is given).
// Returns the name of the backend that ran.
std::string attention_with_kvcache(
    const In& q, const Out& k_cache, const Out& v_cache, const Out& out, const OptOut& lse, const OptIn& k_new,
    const OptIn& v_new, const OptIn& rotary_cos, const OptIn& rotary_sin, const OptIn& cache_seqlens,
    const OptIn& cache_batch_idx, const OptIn& cache_leftpad, const OptIn& block_table, const OptIn& cu_seqlens_q,
    int64_t max_seqlen_q, double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
    int64_t attention_chunk, double softcap, bool rotary_interleaved, int num_splits, bool check_index_values,
    const OptIn& alibi_slopes, const OptIn& cu_seqlens_k_new, const OptIn& rotary_seqlens, const std::string& backend,
    int num_threads, uintptr_t stream, const OptIn& q_descale, const OptIn& k_descale, const OptIn& v_descale,
    const OptIn& qv) {
  flashattn::KVCacheArgs a;
  a.qv = to_view("qv", qv);
  a.q = to_view("q", q);
  a.k_cache = to_view("k_cache", k_cache);
  a.v_cache = to_view("v_cache", v_cache);
  a.out = to_view("out", out);
  a.lse = to_view("lse", lse);
  a.k_new = to_view("k_new", k_new);
  a.v_new = to_view("v_new", v_new);
  a.rotary_cos = to_view("rotary_cos", rotary_cos);
  a.rotary_sin = to_view("rotary_sin", rotary_sin);
  a.cache_seqlens = to_view("cache_seqlens", cache_seqlens);
  a.cache_batch_idx = to_view("cache_batch_idx", cache_batch_idx);
  a.cache_leftpad = to_view("cache_leftpad", cache_leftpad);
  a.block_table = to_view("block_table", block_table);
  a.cu_seqlens_q = to_view("cu_seqlens_q", cu_seqlens_q);
  a.alibi_slopes = to_view("alibi_slopes", alibi_slopes);
  a.cu_seqlens_k_new = to_view("cu_seqlens_k_new", cu_seqlens_k_new);
  a.rotary_seqlens = to_view("rotary_seqlens", rotary_seqlens);
  a.q_descale = to_view("q_descale", q_descale);
  a.k_descale = to_view("k_descale", k_descale);
  a.v_descale = to_view("v_descale", v_descale);
  a.max_seqlen_q = max_seqlen_q;
  a.rotary_interleaved = rotary_interleaved;
  a.num_splits = num_splits;
  a.check_index_values = check_index_values;
  const AttentionOptions o = make_options(softmax_scale, causal, window_left, window_right, attention_chunk, softcap,
                                          false, backend, num_threads, stream);
  return validate_and_run<flashattn::KVCacheParams>(
      a, o, flashattn::make_kvcache_params,
      [&](const flashattn::KVCacheParams& p) { return flashattn::choose_backend(p.attn, o.backend, false); },
      flashattn::run_kvcache);
}

// Merges two partial attentions (flashattn::merge_attention_states): out (and lse, when given) may be out_a
// (lse_a) itself.
void merge_attention_states(const In& out_a, const In& lse_a, const In& out_b, const In& lse_b, const Out& out,
                            const OptOut& lse, int num_threads, uintptr_t stream) {
  flashattn::MergeArgs a;
  a.out_a = to_view("out_a", out_a);
  a.lse_a = to_view("lse_a", lse_a);
  a.out_b = to_view("out_b", out_b);
  a.lse_b = to_view("lse_b", lse_b);
  a.out = to_view("out", out);
  a.lse = to_view("lse", lse);
  a.num_threads = num_threads;
  a.stream = reinterpret_cast<void*>(stream);
  Status st;
  {
    nb::gil_scoped_release release;
    st = flashattn::merge_attention_states(a);
  }
  throw_if_failed(st);
}

// What the dispatcher would run for this call and why, as (backend, supported, reason). Validation errors
// raise as in forward(). Without `out` a view of the right shape over q's memory stands in: validation only
// reads shapes and strides, and nothing runs (float8_e4m3fn inputs: a bfloat16 view).
std::tuple<std::string, bool, std::string> choose_backend(
    const In& q, const In& k, const In& v, const OptOut& out, const OptIn& cu_seqlens_q, const OptIn& cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_left,
    int64_t window_right, int64_t attention_chunk, double softcap, bool backward, bool deterministic,
    const OptIn& alibi_slopes, double dropout_p, const std::string& backend, uintptr_t stream) {
  TensorView out_view;
  if (out) {
    out_view = to_view("out", *out);
  } else {
    const TensorView qv = to_view("q", q), vv = to_view("v", v);
    if (qv.rank >= 1 && vv.rank == qv.rank) {
      int64_t shape[flashattn::kMaxRank];
      for (int i = 0; i < qv.rank; ++i) shape[i] = qv.shape[i];
      shape[qv.rank - 1] = vv.shape[vv.rank - 1];
      // float8_e4m3fn inputs write bfloat16 (the FP8 path's default output).
      const DType out_dtype = qv.dtype == DType::e4m3 ? DType::bf16 : qv.dtype;
      out_view = flashattn::make_contiguous_view(qv.data, out_dtype, qv.device, qv.rank, shape);
    }
  }
  const flashattn::ForwardArgs a =
      forward_args(q, k, v, out_view, TensorView{}, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   alibi_slopes);
  AttentionOptions o = make_options(softmax_scale, causal, window_left, window_right, attention_chunk, softcap,
                                    deterministic, backend, 0, stream);
  o.dropout_p = dropout_p;
  flashattn::BackendChoice c;
  Status st;
  {
    nb::gil_scoped_release release;
    flashattn::FwdParams p;
    st = flashattn::make_forward_params(a, o, &p);
    if (st.ok()) c = flashattn::choose_backend(p, o.backend, backward, deterministic);
  }
  throw_if_failed(st);
  return {flashattn::backend_name(c.backend), c.status.ok(), c.reason};
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn native module: exact attention on DLPack tensors (CPU or CUDA), no framework dependency";

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none() = nb::none(),
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, nb::kw_only(), "softmax_scale"_a = 0.0, "causal"_a = false, "window_left"_a = -1,
        "window_right"_a = -1, "attention_chunk"_a = 0, "softcap"_a = 0.0, "alibi_slopes"_a.none() = nb::none(),
        "dropout_p"_a = 0.0, "dropout_seed"_a = 0, "dropout_offset"_a = 0, "dropout_rng"_a.none() = nb::none(),
        "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),
        "backend"_a = "auto", "num_threads"_a = 0, "stream"_a = 0, "qv"_a.none() = nb::none(),
        "Attention forward into caller-allocated out [b, s_q, h_q, d_v] and optional lse [b, h_q, s_q] (fp32);\n"
        "varlen: [total, h, d] tensors with int32 cu_seqlens_q/k. softmax_scale <= 0 means 1/sqrt(d). stream is a\n"
        "cudaStream_t as an integer (CUDA tensors). alibi_slopes: fp32 [h_q] or [b, h_q] (ALiBi). dropout_p in\n"
        "[0, 1) with its seed and offset, or dropout_rng (int64 [2] {seed, offset} on q's device, read by the\n"
        "kernels: the CUDA-graph-safe form); the backward must get the same. float8_e4m3fn q, k, v: out bfloat16 or\n"
        "float16, optional fp32 [b, h_kv] q/k/v_descale (CPU backends). qv (FA3's, like q with d_v): scores\n"
        "scale * (q.k + qv.v), CPU backends, default scale 1/sqrt(d + d_v). Returns the name of the backend that ran.");

  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "dq"_a, "dk"_a, "dv"_a,
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, nb::kw_only(), "softmax_scale"_a = 0.0, "causal"_a = false, "window_left"_a = -1,
        "window_right"_a = -1, "attention_chunk"_a = 0, "softcap"_a = 0.0, "deterministic"_a = false,
        "alibi_slopes"_a.none() = nb::none(), "dropout_p"_a = 0.0, "dropout_seed"_a = 0, "dropout_offset"_a = 0,
        "dropout_rng"_a.none() = nb::none(), "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(),
        "v_descale"_a.none() = nb::none(), "do_descale"_a.none() = nb::none(), "backend"_a = "auto",
        "num_threads"_a = 0, "stream"_a = 0,
        "Attention backward: fills caller-allocated dq, dk, dv from dout and the forward's out and lse.\n"
        "float8_e4m3fn q, k, v, dout (with optional descales): dq, dk, dv in out's 16-bit dtype.\n"
        "Returns the name of the backend that ran.");

  m.def("attention_with_kvcache", &attention_with_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "out"_a,
        "lse"_a.none() = nb::none(), "k_new"_a.none() = nb::none(), "v_new"_a.none() = nb::none(),
        "rotary_cos"_a.none() = nb::none(), "rotary_sin"_a.none() = nb::none(), "cache_seqlens"_a.none() = nb::none(),
        "cache_batch_idx"_a.none() = nb::none(), "cache_leftpad"_a.none() = nb::none(),
        "block_table"_a.none() = nb::none(), "cu_seqlens_q"_a.none() = nb::none(), "max_seqlen_q"_a = 0, nb::kw_only(),
        "softmax_scale"_a = 0.0, "causal"_a = false, "window_left"_a = -1, "window_right"_a = -1,
        "attention_chunk"_a = 0, "softcap"_a = 0.0, "rotary_interleaved"_a = true, "num_splits"_a = 0,
        "check_index_values"_a = true, "alibi_slopes"_a.none() = nb::none(), "cu_seqlens_k_new"_a.none() = nb::none(),
        "rotary_seqlens"_a.none() = nb::none(), "backend"_a = "auto", "num_threads"_a = 0, "stream"_a = 0,
        "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none(),
        "qv"_a.none() = nb::none(),
        "Attention over a key/value cache (flash_attn_with_kvcache), forward only. k_cache / v_cache: dense\n"
        "[b_cache, s_cache, h_kv, d] or, with block_table (int32 [entries, max_pages]), paged [num_pages, page_size,\n"
        "h_kv, d]; written in place when k_new / v_new [b, s_new, h_kv, d] (or [total_new, h_kv, d] with\n"
        "cu_seqlens_k_new, int32 [b + 1]) are given (appended at cache_seqlens, k_new rotated by rotary_cos /\n"
        "rotary_sin [s_ro, rotary_dim / 2] at positions from rotary_seqlens or cache_seqlens). Index tensors are\n"
        "int32 [b]. q is\n"
        "[b, s_q, h_q, d], or [total_q, h_q, d] with cu_seqlens_q; out like q with d_v, lse [b, h_q, s_q] or\n"
        "[h_q, total_q] (fp32). check_index_values=False skips the host copy and check of the index values (CUDA\n"
        "graph capture; the kernels then clamp). float8_e4m3fn q, caches and new rows (no rotary) with optional fp32\n"
        "[b, h_kv] q_descale / k_descale / v_descale write a bfloat16 or float16 out (CPU backends). qv: as in\n"
        "forward (not rotated). Returns the name of the backend that ran.");

  m.def("merge_attention_states", &merge_attention_states, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a,
        "lse"_a.none() = nb::none(), nb::kw_only(), "num_threads"_a = 0, "stream"_a = 0,
        "Attention over two disjoint key sets from each one's (out, lse): out = exp(lse_a - lse) out_a +\n"
        "exp(lse_b - lse) out_b, lse = logaddexp(lse_a, lse_b). out_* [b, s, h, d_v] or [total, h, d_v], lse_* fp32\n"
        "[b, h, s] or [h, total]; out in out_a's dtype and may be out_a itself (lse: lse_a) to accumulate in place.");

  m.def("choose_backend", &choose_backend, "q"_a, "k"_a, "v"_a, "out"_a.none() = nb::none(),
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, nb::kw_only(), "softmax_scale"_a = 0.0, "causal"_a = false, "window_left"_a = -1,
        "window_right"_a = -1, "attention_chunk"_a = 0, "softcap"_a = 0.0, "backward"_a = false,
        "deterministic"_a = false, "alibi_slopes"_a.none() = nb::none(), "dropout_p"_a = 0.0, "backend"_a = "auto",
        "stream"_a = 0, "The backend the dispatcher would run for this call: (name, supported, reason). Runs nothing.");

  m.def("built_with_cuda", &flashattn::built_with_cuda, "Whether this build contains the CUDA kernels.");
  m.def("cuda_device_count", &flashattn::cuda_device_count, "CUDA devices visible (0 without CUDA).");
  m.def("cuda_compute_capability", &flashattn::cuda_compute_capability, "device_index"_a,
        "major * 10 + minor of a CUDA device, or 0.");
  m.def(
      "release_cached_memory", [] { throw_if_failed(flashattn::release_cached_memory()); },
      "Waits for each device's work and returns the unused memory of the library's CUDA workspace pools to the "
      "driver (like torch.cuda.empty_cache()).");
  m.def("version", &flashattn::version, "The library version.");
  m.def("cpu_isa", &flashattn::cpu_isa,
        "The instruction-set level the CPU kernels run at: avx512_bf16, avx512, avx2 or baseline (chosen from the CPU once, "
        "capped by the environment variable FLASHATTN_CPU_ISA), native in a FLASHATTN_NATIVE build.");
  m.attr("__version__") = flashattn::version();
}
