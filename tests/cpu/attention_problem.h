// CPU test support: an attention case as a parameter struct (ggml / MLX style), the tensors it needs in any
// layout, the oracles it is checked against (tests/common/oracle.h), and the error rules.
//
// Oracles, both computed by the tests from the case's own description (AttnSpec), never through the library:
// - ref: the oracle (textbook_attention in double, nothing rounded): the exact answer for exactly these
//   (already rounded) inputs, to fp64 accuracy.
// - same-precision naive: the same textbook algorithm with every sum in the accumulation type the flash path uses
//   (fp32 for fp16 / bf16 / fp32, fp64 for fp64) and the outputs rounded to the storage type (O before it is used
//   for D, as a real forward/backward pair). Its distance from ref is the error any straightforward
//   implementation in that precision makes, cancellation included.
// Rules, per output tensor:
// - norm-wise (FlashAttention-3's, plus a term for cancellation):
//     ‖flash − ref‖ ≤ 2·‖naive − ref‖ + 4·u(storage)·‖ref‖ + u(acc)·‖terms‖
//   where ‖terms‖ is the norm of the magnitudes of the summed terms (oracle.h). The last term is what rounding
//   every summed term once in the accumulation type can cost; it matters only when an output cancels to near 0.
// - per element, against the naive, whose rounding points the CPU flash path shares (outputs only; P and dS stay
//   in the accumulation type; its backward reads the same O): |flash − naive| ≤ 2·u(storage)·|naive| + tiny +
//   kTermsFactor·u(acc)·terms, elementwise. The first term allows the two to round to neighbouring storage values
//   (tiny: below the smallest value the type keeps apart from 0), the last their different summation orders. A bug confined to a few rows, or a small bias (a 1% error in D), fails it where the norm-wise rule
//   would average it away; an element that must be exactly 0 (a row that sees no key) must be exactly 0.
// - bf16 at a level with pair dot products (cpu_flash_bf16_pair_products): the backward rounds P ∘ Z and dS to bf16
//   before dV, dK and dQ, as the GPU kernels do, and so does the naive of the gradients. The two compute each
//   such operand in fp32 in different orders, so one may round to the other's neighbouring bf16 value: the
//   per-element rule of dQ, dK, dV adds 2·u(storage)·terms.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "common/host_tensor.h"
#include "common/oracle.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {

enum class Layout { bshd, bhsd };

struct AttnCase {
  DType dtype = DType::f32;
  int64_t batch = 1, s_q = 1, s_k = 1, h_q = 1, h_kv = 1, d = 8, dv = 8;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int64_t attention_chunk = 0;            // 0: off
  double softcap = 0;
  double softmax_scale = 0;               // 0: the default 1/√d
  Layout layout = Layout::bshd;
  int64_t pad = 0;                        // extra elements at the end of every row of every tensor
  std::vector<int32_t> lens_q, lens_k;    // varlen when non-empty (batch = lens_q.size())
  double input_scale = 1;                 // standard deviation of Q and K (large: saturated softmax)
  enum class Alibi { none, per_head, per_batch } alibi = Alibi::none;  // ALiBi slopes [h_q] or [batch, h_q]
  double dropout_p = 0;                   // attention dropout, with the seed and offset below
  uint64_t dropout_seed = 0x5eed, dropout_offset = 0;
  // The seed and offset in an int64 [2] tensor (ForwardArgs::dropout_rng), the options' own seed altered: only the
  // tensor gives the oracle's mask.
  bool dropout_rng_tensor = false;

  bool varlen() const { return !lens_q.empty(); }

  // The case's ALiBi slopes, in the order of the slopes tensor: spread over [0.02, 0.6] and one of them 0 (a head
  // without bias next to biased ones), different per sequence when per batch.
  std::vector<float> alibi_slopes() const {
    std::vector<float> s;
    if (alibi == Alibi::none) return s;
    const int64_t rows = alibi == Alibi::per_batch ? (varlen() ? int64_t(lens_q.size()) : batch) : 1;
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < h_q; ++h) {
        const double golden = double(b * 7 + h * 3 + 1) * 0.6180339887;
        s.push_back(h == 1 && b == 0 ? 0.f : float(0.02 + 0.58 * (golden - std::floor(golden))));
      }
    return s;
  }

  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dtype) << "_b" << batch;
    if (varlen()) {
      os << "_varlenq";
      for (int32_t l : lens_q) os << "_" << l;
      os << "_k";
      for (int32_t l : lens_k) os << "_" << l;
    } else {
      os << "_sq" << s_q << "_sk" << s_k;
    }
    os << "_h" << h_q << "x" << h_kv << "_d" << d << "_dv" << dv;
    if (causal) os << "_causal";
    auto edge = [](int64_t e) { return e < 0 ? std::string("inf") : std::to_string(e); };
    if (window_left >= 0 || window_right >= 0) os << "_win" << edge(window_left) << "_" << edge(window_right);
    if (attention_chunk > 0) os << "_chunk" << attention_chunk;
    if (softcap > 0) os << "_cap" << int(softcap);
    if (softmax_scale > 0) os << "_sm" << int(std::lround(softmax_scale * 1000)) << "m";
    if (layout == Layout::bhsd) os << "_bhsd";
    if (pad) os << "_pad" << pad;
    if (input_scale != 1) os << "_scale" << int(input_scale);
    if (alibi != Alibi::none) os << (alibi == Alibi::per_batch ? "_alibib" : "_alibi");
    if (dropout_p > 0) os << "_drop" << int(std::lround(dropout_p * 100));
    if (dropout_rng_tensor) os << "_rngtensor";
    return os.str();
  }

  AttentionOptions options(Backend backend) const {
    AttentionOptions o;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.attention_chunk = attention_chunk;
    o.softcap = softcap;
    o.softmax_scale = softmax_scale;
    o.dropout_p = dropout_p, o.dropout_seed = dropout_seed, o.dropout_offset = dropout_offset;
    if (dropout_rng_tensor) o.dropout_seed = ~dropout_seed;
    o.backend = backend;
    return o;
  }

  // The same call as the oracle reads it.
  AttnSpec spec() const {
    AttnSpec s;
    s.causal = causal;
    s.window_left = window_left, s.window_right = window_right;
    s.attention_chunk = attention_chunk;
    s.softcap = softcap;
    s.softmax_scale = softmax_scale;
    s.lens_q.assign(lens_q.begin(), lens_q.end());
    s.lens_k.assign(lens_k.begin(), lens_k.end());
    s.alibi_slopes = alibi_slopes();
    s.alibi_per_batch = alibi == Alibi::per_batch;
    s.dropout_p = dropout_p, s.dropout_seed = dropout_seed, s.dropout_offset = dropout_offset;
    return s;
  }
};

// Logical positions of rows: padded [b, s, h, dim] or varlen [total, h, dim], as HostTensor::values() orders them.
struct RowIndex {
  int64_t heads = 0, dim = 0;
  std::vector<int64_t> start, len;
  int64_t at(int64_t b, int64_t i, int64_t h, int64_t c) const { return ((start[size_t(b)] + i) * heads + h) * dim + c; }
};

// Every tensor of one case: inputs in the storage dtype and layout, their fp64 copies, output allocators.
class AttnProblem {
 public:
  AttnProblem(const AttnCase& c, uint64_t seed) : c_(c) {
    if (c.varlen()) {
      c_.batch = int64_t(c.lens_q.size());
      total_q_ = total_k_ = 0;
      for (int32_t l : c.lens_q) total_q_ += l;
      for (int32_t l : c.lens_k) total_k_ += l;
      cu_q_ = cu_seqlens_of(c.lens_q);
      cu_k_ = cu_seqlens_of(c.lens_k);
    }
    std::mt19937_64 rng(seed);
    q_ = alloc(c_.dtype, true, c_.h_q, c_.d);
    k_ = alloc(c_.dtype, false, c_.h_kv, c_.d);
    v_ = alloc(c_.dtype, false, c_.h_kv, c_.dv);
    dout_ = alloc(c_.dtype, true, c_.h_q, c_.dv);
    for (HostTensor* t : {&q_, &k_, &v_, &dout_}) {
      t->poison();  // padding stays NaN: a kernel that reads it poisons its output
      t->fill_normal(rng, t == &q_ || t == &k_ ? c.input_scale : 1.0);
    }
    if (c.alibi != AttnCase::Alibi::none) {
      const std::vector<float> slopes = c_.alibi_slopes();
      alibi_ = c.alibi == AttnCase::Alibi::per_batch ? HostTensor(DType::f32, {c_.batch, c_.h_q})
                                                     : HostTensor(DType::f32, {c_.h_q});
      for (size_t i = 0; i < slopes.size(); ++i) alibi_.set(int64_t(i), slopes[i]);
    }
  }

  const AttnCase& c() const { return c_; }
  // {seed, offset} for ForwardArgs::dropout_rng (dropout_rng_tensor), and its view at `data` on `device`.
  const uint64_t* dropout_state() const { return dropout_state_; }
  static TensorView dropout_rng_view(const void* data, Device device = Device{}) {
    const int64_t shape[1] = {2};
    return make_contiguous_view(const_cast<void*>(data), DType::i64, device, 1, shape);
  }
  const HostTensor& q() const { return q_; }
  const HostTensor& k() const { return k_; }
  const HostTensor& v() const { return v_; }
  const HostTensor& dout() const { return dout_; }
  const HostTensor& alibi() const { return alibi_; }

  // A tensor shaped like Q (query side) or K (key side) with `heads` x `dim`, in the case's layout and padding.
  HostTensor alloc(DType dt, bool query_side, int64_t heads, int64_t dim) const {
    if (c_.varlen()) {
      const int64_t rows = query_side ? total_q_ : total_k_;
      return HostTensor(dt, {rows, heads, dim}, c_.layout == Layout::bhsd ? std::vector<int>{1, 0, 2} : std::vector<int>{}, c_.pad);
    }
    const int64_t s = query_side ? c_.s_q : c_.s_k;
    return HostTensor(dt, {c_.batch, s, heads, dim},
                      c_.layout == Layout::bhsd ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{}, c_.pad);
  }
  HostTensor alloc_out(DType dt) const { return alloc(dt, true, c_.h_q, c_.dv); }
  HostTensor alloc_lse() const {
    if (c_.varlen()) return HostTensor(DType::f32, {c_.h_q, total_q_}, {}, c_.pad);
    return HostTensor(DType::f32, {c_.batch, c_.h_q, c_.s_q}, {}, c_.pad);
  }

  ForwardArgs forward_args(const HostTensor& q, const HostTensor& k, const HostTensor& v, HostTensor& out,
                           HostTensor* lse) const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    if (lse) a.lse = lse->view();
    if (c_.alibi != AttnCase::Alibi::none) a.alibi_slopes = alibi_.view();
    if (c_.dropout_rng_tensor) a.dropout_rng = dropout_rng_view(dropout_state_);
    if (c_.varlen()) {
      a.cu_seqlens_q = cu_q_.view();
      a.cu_seqlens_k = cu_k_.view();
    }
    return a;
  }

  RowIndex rows(bool query_side, int64_t heads, int64_t dim) const {
    RowIndex r;
    r.heads = heads;
    r.dim = dim;
    int64_t acc = 0;
    for (int64_t b = 0; b < c_.batch; ++b) {
      const int64_t len = c_.varlen() ? (query_side ? c_.lens_q : c_.lens_k)[size_t(b)] : (query_side ? c_.s_q : c_.s_k);
      r.start.push_back(c_.varlen() ? acc : b * len);
      r.len.push_back(len);
      acc += len;
    }
    return r;
  }
  // Logical index of LSE row (b, h, i).
  int64_t lse_index(const RowIndex& rq, int64_t b, int64_t h, int64_t i) const {
    return c_.varlen() ? h * total_q_ + rq.start[size_t(b)] + i : (b * c_.h_q + h) * c_.s_q + i;
  }

 private:
  AttnCase c_;
  int64_t total_q_ = 0, total_k_ = 0;
  HostTensor q_, k_, v_, dout_, cu_q_, cu_k_, alibi_;
  uint64_t dropout_state_[2] = {c_.dropout_seed, c_.dropout_offset};
};

// fp64 copy of a tensor's logical values (contiguous).
inline HostTensor to_f64(const HostTensor& t) {
  HostTensor out(DType::f64, t.shape());
  const std::vector<double> vals = t.values();
  size_t i = 0;
  out.for_each([&](int64_t off) { out.set(off, vals[i++]); });
  return out;
}

// Forward (and backward when `backward`) on `backend`, in storage type `dt` (inputs converted when it differs
// from the case's dtype, as for the fp64 oracle). Outputs start poisoned; the backward reads this forward's
// O and LSE. Fails the test if a call fails or leaves a logical output element unwritten or writes padding.
inline AttnResult run_attention(const AttnProblem& pb, Backend backend, bool backward, int num_threads = 0,
                                bool as_f64 = false) {
  const AttnCase& c = pb.c();
  AttnResult r;
  HostTensor q64, k64, v64, do64;
  const HostTensor *q = &pb.q(), *k = &pb.k(), *v = &pb.v(), *dout = &pb.dout();
  if (as_f64) {
    q64 = to_f64(pb.q()), k64 = to_f64(pb.k()), v64 = to_f64(pb.v()), do64 = to_f64(pb.dout());
    q = &q64, k = &k64, v = &v64, dout = &do64;
  }
  const DType dt = as_f64 ? DType::f64 : c.dtype;
  HostTensor out = pb.alloc_out(dt);
  HostTensor lse = pb.alloc_lse();
  out.poison();
  lse.poison();
  AttentionOptions opt = c.options(backend);
  opt.num_threads = num_threads;
  BackwardArgs a;
  static_cast<ForwardArgs&>(a) = pb.forward_args(*q, *k, *v, out, &lse);
  Status st = attention_forward(a, opt);
  EXPECT_TRUE(st.ok()) << backend_name(backend) << " forward: " << st.message;
  auto check_written = [](const char* what, const HostTensor& t) {
    int64_t nan = 0;
    for (int64_t off = 0; off < t.storage_elems(); ++off) nan += std::isnan(t.get(off)) ? 1 : 0;
    EXPECT_EQ(nan, t.storage_elems() - t.numel()) << what << ": unwritten logical elements or written padding";
  };
  check_written("out", out);
  check_written("lse", lse);
  r.o = out.values();
  r.lse = lse.values();
  if (!backward) return r;

  HostTensor dq = pb.alloc(dt, true, c.h_q, c.d), dk = pb.alloc(dt, false, c.h_kv, c.d);
  HostTensor dv = pb.alloc(dt, false, c.h_kv, c.dv);
  for (HostTensor* t : {&dq, &dk, &dv}) t->poison();
  a.dout = dout->view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  st = attention_backward(a, opt);
  EXPECT_TRUE(st.ok()) << backend_name(backend) << " backward: " << st.message;
  check_written("dq", dq);
  check_written("dk", dk);
  check_written("dv", dv);
  r.dq = dq.values();
  r.dk = dk.values();
  r.dv = dv.values();
  return r;
}

// The oracle of the problem (forward, and backward when `backward`).
inline AttnResult oracle_for(const AttnProblem& pb, bool backward) {
  return oracle_attention(pb.q(), pb.k(), pb.v(), backward ? &pb.dout() : nullptr, pb.c().spec());
}

// The same-precision naive of the problem (file header). Its backward reads `forward_o` for D, as the backward
// under test reads its own forward's O: two forwards may round an element of O to neighbouring values, and D
// would carry that difference into every gradient of the row.
// Whether the cpu_flash backward rounds P ∘ Z and dS to the storage type before their products (file header).
inline bool backward_rounds_operands(DType t) { return t == DType::bf16 && detail::cpu_flash_bf16_pair_products(); }

inline AttnResult naive_for(const AttnProblem& pb, bool backward, const std::vector<double>* forward_o = nullptr) {
  const AttnCase& c = pb.c();
  const HostTensor* dout = backward ? &pb.dout() : nullptr;
  const Rounding rounding{c.dtype, false};
  if (c.dtype == DType::f64)
    return textbook_attention<double>(pb.q(), pb.k(), pb.v(), dout, c.spec(), rounding, forward_o);
  const bool rounded = backward && backward_rounds_operands(c.dtype);
  AttnResult r =
      textbook_attention<float>(pb.q(), pb.k(), pb.v(), rounded ? nullptr : dout, c.spec(), rounding, forward_o);
  if (rounded) {
    // The gradients with rounded operands; O and LSE (above) as the forward computes them.
    AttnResult g = textbook_attention<float>(pb.q(), pb.k(), pb.v(), dout, c.spec(), Rounding{c.dtype, true},
                                             forward_o);
    r.dq = std::move(g.dq), r.dk = std::move(g.dk), r.dv = std::move(g.dv);
    r.dq_mag = std::move(g.dq_mag), r.dk_mag = std::move(g.dk_mag), r.dv_mag = std::move(g.dv_mag);
  }
  return r;
}

// Below this an output may differ from the naive's by its whole value: fp16's subnormal step; for fp32 and bf16
// 2^-100, since the flash path's fp32 arithmetic may flush subnormal terms (near 2^-126) to zero and the sums
// they enter then lose them.
inline double smallest_kept(DType t) {
  switch (t) {
    case DType::f16: return 0x1p-24;
    case DType::f64: return 0x1p-1000;
    default: return 0x1p-100;
  }
}

// Per-element rule of the file header: the factor on u(acc)·terms. Over the CPU grid the flash path needs at most
// 5.6 (2026-12-01, bench/results/test-quality.md).
constexpr double kTermsFactor = 16;

// The rules of the file header for one output tensor. `u` is the unit roundoff of the tensor's storage type,
// `u_acc` of the accumulation type.
inline void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                         const std::vector<double>& naive, const std::vector<double>& mag, double u, double u_acc,
                         double tiny, double u_operands = 0) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double err = l2_distance(got, ref);
  const double bound = 2 * l2_distance(naive, ref) + 4 * u * l2_norm(ref) + u_acc * l2_norm(mag);
  EXPECT_LE(err, bound) << what << ": ‖flash − ref‖ = " << err << ", same-precision naive " << l2_distance(naive, ref)
                        << ", ‖ref‖ = " << l2_norm(ref) << ", ‖terms‖ = " << l2_norm(mag) << ", u = " << u;
  std::vector<double> element_bound(naive.size());
  for (size_t i = 0; i < naive.size(); ++i)
    element_bound[i] = 2 * u * std::fabs(naive[i]) + tiny + (kTermsFactor * u_acc + 2 * u_operands) * mag[i];
  std::string worst;
  const int64_t outside = count_outside(got, naive, element_bound, &worst);
  EXPECT_EQ(outside, 0) << what << ": elements outside 2·u·|naive| + " << kTermsFactor
                        << "·u_acc·terms of the same-precision naive (of " << got.size() << "); worst " << worst;
}

// Every output of a flash run against the oracle and the same-precision naive under the rules above.
inline void expect_matches_reference(const AttnCase& c, const AttnResult& got, const AttnResult& ref,
                                     const AttnResult& naive, bool backward) {
  const double u = unit_roundoff(c.dtype), u32 = unit_roundoff(DType::f32);
  const double u_acc = c.dtype == DType::f64 ? unit_roundoff(DType::f64) : u32;
  const double tiny = smallest_kept(c.dtype), tiny32 = smallest_kept(DType::f32);
  expect_close("O", got.o, ref.o, naive.o, naive.o_mag, u, u_acc, tiny);
  expect_close("LSE", got.lse, ref.lse, naive.lse, naive.lse_mag, u32, u_acc, tiny32);
  if (!backward) return;
  const double u_operands = backward_rounds_operands(c.dtype) ? u : 0.0;
  expect_close("dQ", got.dq, ref.dq, naive.dq, naive.dq_mag, u, u_acc, tiny, u_operands);
  expect_close("dK", got.dk, ref.dk, naive.dk, naive.dk_mag, u, u_acc, tiny, u_operands);
  expect_close("dV", got.dv, ref.dv, naive.dv, naive.dv_mag, u, u_acc, tiny, u_operands);
}

}  // namespace flashattn::test
