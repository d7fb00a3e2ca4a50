// float8_e4m3fn inputs on the CPU backends: see fp8.h.
#include "cpu/fp8.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/kv_cache.h"

namespace flashattn::detail {
namespace {

// Rows of one input ([batch, rows, heads, dim], or varlen [total, heads, dim] when its cu_seqlens is given) of e4m3
// or 16-bit elements widened into a contiguous fp32 copy of the same logical shape (batch stride 0 in varlen, as
// validation leaves a varlen call's), each times its descale if one is given: descale index of (sequence b, head
// h) [b, h / head_group]. Varlen queries over a KV cache are packed while the cache is not: each tensor's own
// cu_seqlens says which it is.
struct Dequantised {
  std::vector<float> values;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

template <typename Decode>
Dequantised widen(const FwdParams& p, const void* data, int64_t rows, int64_t heads, int64_t dim,
                  int64_t batch_stride, int64_t row_stride, int64_t head_stride, const float* descale,
                  const int64_t* descale_strides, int64_t head_group, const int32_t* cu_seqlens, Decode decode) {
  Dequantised d;
  const bool varlen = cu_seqlens != nullptr;
  const int64_t per_row = heads * dim;
  const int64_t batches = varlen ? 1 : p.batch;
  d.values.resize(size_t(batches * rows * per_row));
  d.head_stride = dim, d.row_stride = per_row, d.batch_stride = varlen ? 0 : rows * per_row;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      // The sequence whose descale applies: the batch entry, or (varlen) the sequence holding packed row r.
      const int64_t seq = descale && varlen ? varlen_sequence_of(cu_seqlens, int(p.batch), r) : b;
      for (int64_t h = 0; h < heads; ++h) {
        const float scale =
            descale ? descale[seq * descale_strides[0] + (h / head_group) * descale_strides[1]] : 1.0f;
        const int64_t in = b * batch_stride + r * row_stride + h * head_stride;
        float* out = d.values.data() + b * d.batch_stride + r * d.row_stride + h * d.head_stride;
        for (int64_t c = 0; c < dim; ++c) out[c] = decode(data, in + c) * scale;
      }
    }
  }
  return d;
}

// An e4m3 input with its descale.
Dequantised dequantise(const FwdParams& p, const void* data, int64_t rows, int64_t heads, int64_t dim,
                       int64_t batch_stride, int64_t row_stride, int64_t head_stride, const float* descale,
                       const int64_t* descale_strides, int64_t head_group, const int32_t* cu_seqlens) {
  return widen(p, data, rows, heads, dim, batch_stride, row_stride, head_stride, descale, descale_strides,
               head_group, cu_seqlens,
               [](const void* base, int64_t i) { return e4m3_to_float(static_cast<const uint8_t*>(base)[i]); });
}

// A contiguous fp32 [batches, rows, heads, dim] result written into a 16-bit tensor of the given strides.
template <typename T>
void store_rows(void* data, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int64_t batches,
                int64_t rows, int64_t heads, int64_t dim, const std::vector<float>& values) {
  T* dst = static_cast<T*>(data);
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = values.data() + ((b * rows + r) * heads + h) * dim;
        T* out = dst + b * batch_stride + r * row_stride + h * head_stride;
        for (int64_t c = 0; c < dim; ++c) out[c] = from_double<T>(double(in[c]));
      }
}

void store_rows(DType dtype, void* data, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                int64_t batches, int64_t rows, int64_t heads, int64_t dim, const std::vector<float>& values) {
  if (dtype == DType::bf16)
    store_rows<bfloat16_t>(data, batch_stride, row_stride, head_stride, batches, rows, heads, dim, values);
  else
    store_rows<half_t>(data, batch_stride, row_stride, head_stride, batches, rows, heads, dim, values);
}

// Q, K, V of p dequantised, and fp32 params `f` (a copy of p) pointed at them.
struct DequantisedInputs {
  Dequantised q, k, v;
  int64_t rows_q, rows_k;
};
DequantisedInputs dequantise_inputs(const FwdParams& p, FwdParams* f) {
  DequantisedInputs in;
  in.rows_q = p.cu_seqlens_q ? p.total_q : p.seqlen_q, in.rows_k = p.cu_seqlens_k ? p.total_k : p.seqlen_k;
  in.q = dequantise(p, p.q, in.rows_q, p.heads_q, p.head_dim, p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                    p.q_descale, p.q_descale_strides, p.heads_q / p.heads_kv, p.cu_seqlens_q);
  in.k = dequantise(p, p.k, in.rows_k, p.heads_kv, p.head_dim, p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                    p.k_descale, p.k_descale_strides, 1, p.cu_seqlens_k);
  in.v = dequantise(p, p.v, in.rows_k, p.heads_kv, p.head_dim_v, p.v_batch_stride, p.v_row_stride,
                    p.v_head_stride, p.v_descale, p.v_descale_strides, 1, p.cu_seqlens_k);
  f->dtype = f->out_dtype = DType::f32;
  f->q = in.q.values.data(), f->k = in.k.values.data(), f->v = in.v.values.data();
  f->q_batch_stride = in.q.batch_stride, f->q_row_stride = in.q.row_stride, f->q_head_stride = in.q.head_stride;
  f->k_batch_stride = in.k.batch_stride, f->k_row_stride = in.k.row_stride, f->k_head_stride = in.k.head_stride;
  f->v_batch_stride = in.v.batch_stride, f->v_row_stride = in.v.row_stride, f->v_head_stride = in.v.head_stride;
  f->q_descale = f->k_descale = f->v_descale = nullptr;
  return in;
}

Status check_out_dtype(const FwdParams& p) {
  if (p.out_dtype == DType::bf16 || p.out_dtype == DType::f16) return Status::success();
  return Status::invalid(std::string("out: float8_e4m3fn inputs write bfloat16 or float16, not ") +
                         dtype_name(p.out_dtype));
}

}  // namespace

Status cpu_fp8_forward(const FwdParams& p, ForwardFn run) {
  Status st = check_out_dtype(p);
  if (!st.ok()) return st;
  const bool varlen = p.is_varlen();
  FwdParams f = p;
  const DequantisedInputs in = dequantise_inputs(p, &f);
  std::vector<float> o(size_t((varlen ? 1 : p.batch) * in.rows_q * p.heads_q * p.head_dim_v));
  f.o = o.data();
  f.o_head_stride = p.head_dim_v, f.o_row_stride = p.heads_q * p.head_dim_v;
  f.o_batch_stride = varlen ? 0 : in.rows_q * f.o_row_stride;
  st = run(f);
  if (!st.ok()) return st;
  store_rows(p.out_dtype, p.o, p.o_batch_stride, p.o_row_stride, p.o_head_stride, varlen ? 1 : p.batch, in.rows_q,
             p.heads_q, p.head_dim_v, o);
  return Status::success();
}

Status cpu_fp8_backward(const BwdParams& p, BackwardFn run) {
  Status st = check_out_dtype(p);
  if (!st.ok()) return st;
  const int64_t batches = p.is_varlen() ? 1 : p.batch;
  BwdParams f = p;
  const DequantisedInputs in = dequantise_inputs(p, &f);
  const Dequantised dout = dequantise(p, p.dout, in.rows_q, p.heads_q, p.head_dim_v, p.do_batch_stride,
                                      p.do_row_stride, p.do_head_stride, p.do_descale, p.do_descale_strides,
                                      p.heads_q / p.heads_kv, p.cu_seqlens_q);
  // The forward's O (16-bit), which the backward only reads (D = rowsum(dO · O)).
  const bool bf16 = p.out_dtype == DType::bf16;
  Dequantised o = widen(p, p.o, in.rows_q, p.heads_q, p.head_dim_v, p.o_batch_stride, p.o_row_stride,
                        p.o_head_stride, nullptr, nullptr, 1, p.cu_seqlens_q, [bf16](const void* base, int64_t i) {
                          const uint16_t bits = static_cast<const uint16_t*>(base)[i];
                          return bf16 ? to_float(bfloat16_t{bits}) : to_float(half_t{bits});
                        });
  std::vector<float> dq(in.q.values.size()), dk(in.k.values.size()), dv(in.v.values.size());
  f.o = o.values.data(), f.dout = dout.values.data();
  f.dq = dq.data(), f.dk = dk.data(), f.dv = dv.data();
  f.dq_batch_stride = f.q_batch_stride, f.dq_row_stride = f.q_row_stride, f.dq_head_stride = f.q_head_stride;
  f.dk_batch_stride = f.k_batch_stride, f.dk_row_stride = f.k_row_stride, f.dk_head_stride = f.k_head_stride;
  f.dv_batch_stride = f.v_batch_stride, f.dv_row_stride = f.v_row_stride, f.dv_head_stride = f.v_head_stride;
  f.o_batch_stride = o.batch_stride, f.o_row_stride = o.row_stride, f.o_head_stride = o.head_stride;
  f.do_batch_stride = dout.batch_stride, f.do_row_stride = dout.row_stride, f.do_head_stride = dout.head_stride;
  f.do_descale = nullptr;
  st = run(f);
  if (!st.ok()) return st;
  store_rows(p.out_dtype, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, batches, in.rows_q, p.heads_q,
             p.head_dim, dq);
  store_rows(p.out_dtype, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, batches, in.rows_k,
             p.heads_kv, p.head_dim, dk);
  store_rows(p.out_dtype, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, batches, in.rows_k,
             p.heads_kv, p.head_dim_v, dv);
  return Status::success();
}

}  // namespace flashattn::detail
