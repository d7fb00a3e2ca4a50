// CPU test support: an attention case as a parameter struct (ggml / MLX style), the tensors it needs in any
// layout, the oracles it is checked against, and the error rule.
//
// Oracles:
// - ref64: Backend::cpu_reference run on fp64 copies of the (already rounded) inputs: the exact answer for
//   exactly these inputs, to fp64 accuracy.
// - same-precision naive: the textbook algorithm (materialised S and P, sequential sums) computed in the
//   accumulation type the flash path uses (fp32 for fp16 / bf16 / fp32, fp64 for fp64), with the outputs
//   rounded to the storage type. Its distance from ref64 is the error any straightforward implementation in
//   that precision makes, cancellation included (a gradient that is 0 in exact arithmetic comes out as noise of
//   the size of its terms, which a purely relative rule cannot judge).
// Rule, per output tensor (FlashAttention-3's, plus a term for cancellation):
//   ‖flash − ref64‖ ≤ 2·‖naive − ref64‖ + 4·u(storage)·‖ref64‖ + u(acc)·‖terms‖
// where ‖terms‖ is the norm of the same sums taken over absolute values (each probability weighted by
// 1 + |score|, the factor by which a score's rounding moves it). The last term is what rounding every summed
// term once in the accumulation type can cost; it matters only when the output cancels to near 0 (s_k = 1,
// where dQ and dK are exactly 0 and the naive algorithm happens to cancel exactly). Measured over the grid,
// the flash path uses at most 0.3 of it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/mask.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {

enum class Layout { bshd, bhsd };

struct AttnCase {
  DType dtype = DType::f32;
  int64_t batch = 1, s_q = 1, s_k = 1, h_q = 1, h_kv = 1, d = 8, dv = 8;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  Layout layout = Layout::bshd;
  int64_t pad = 0;                        // extra elements at the end of every row of every tensor
  std::vector<int32_t> lens_q, lens_k;    // varlen when non-empty (batch = lens_q.size())
  double input_scale = 1;                 // standard deviation of Q and K (large: saturated softmax)

  bool varlen() const { return !lens_q.empty(); }

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
    if (window_left >= 0 || window_right >= 0) os << "_win" << (window_left + 1) << "m1_" << (window_right + 1) << "m1";
    if (softcap > 0) os << "_cap" << int(softcap);
    if (layout == Layout::bhsd) os << "_bhsd";
    if (pad) os << "_pad" << pad;
    if (input_scale != 1) os << "_scale" << int(input_scale);
    return os.str();
  }

  AttentionOptions options(Backend backend) const {
    AttentionOptions o;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.backend = backend;
    return o;
  }
};

inline double round_to(DType t, double x) {
  switch (t) {
    case DType::f16: return to_float(to_half(float(x)));
    case DType::bf16: return to_float(to_bfloat16(float(x)));
    case DType::f32: return float(x);
    default: return x;
  }
}

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
  }

  const AttnCase& c() const { return c_; }
  const HostTensor& q() const { return q_; }
  const HostTensor& k() const { return k_; }
  const HostTensor& v() const { return v_; }
  const HostTensor& dout() const { return dout_; }

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
  HostTensor q_, k_, v_, dout_, cu_q_, cu_k_;
};

// fp64 copy of a tensor's logical values (contiguous).
inline HostTensor to_f64(const HostTensor& t) {
  HostTensor out(DType::f64, t.shape());
  const std::vector<double> vals = t.values();
  size_t i = 0;
  out.for_each([&](int64_t off) { out.set(off, vals[i++]); });
  return out;
}

struct AttnResult {
  std::vector<double> o, lse, dq, dk, dv;
  // naive_same_precision only: the magnitude of the terms each output element sums (the same sums over
  // absolute values, each probability weighted by how much its score's rounding can move it). Rounding errors
  // are relative to these, not to the outputs, which may cancel to 0.
  std::vector<double> o_mag, lse_mag, dq_mag, dk_mag, dv_mag;
};

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

// The textbook algorithm in accumulation type Acc, outputs rounded to the case's storage type (O before it is
// used for D, as a real forward/backward pair would).
template <typename Acc>
AttnResult naive_same_precision(const AttnProblem& pb, bool backward) {
  const AttnCase& c = pb.c();
  const DType dt = c.dtype;
  const std::vector<double> qv = pb.q().values(), kv = pb.k().values(), vv = pb.v().values(), dov = pb.dout().values();
  const RowIndex rq = pb.rows(true, c.h_q, c.d), rk = pb.rows(false, c.h_kv, c.d);
  const RowIndex rv = pb.rows(false, c.h_kv, c.dv), ro = pb.rows(true, c.h_q, c.dv);
  AttnResult r;
  r.o.assign(pb.q().numel() / c.d * c.dv, 0.0);
  r.lse.assign(size_t(pb.alloc_lse().numel()), 0.0);
  r.dq.assign(qv.size(), 0.0);
  r.dk.assign(kv.size(), 0.0);
  r.dv.assign(vv.size(), 0.0);
  r.o_mag.assign(r.o.size(), 0.0);
  r.lse_mag.assign(r.lse.size(), 0.0);
  r.dq_mag.assign(qv.size(), 0.0);
  r.dk_mag.assign(kv.size(), 0.0);
  r.dv_mag.assign(vv.size(), 0.0);
  const double default_scale = 1.0 / std::sqrt(double(c.d));
  const Acc scale = Acc(float(default_scale)), cap = Acc(c.softcap);
  const int64_t group = c.h_q / c.h_kv;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t sq = rq.len[size_t(b)], sk = rk.len[size_t(b)];
    const MaskSpec mask = MaskSpec::make(sq, sk, c.causal, c.window_left, c.window_right);
    for (int64_t hk = 0; hk < c.h_kv; ++hk) {
      std::vector<Acc> dk(size_t(sk * c.d), Acc(0)), dvacc(size_t(sk * c.dv), Acc(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        std::vector<Acc> p(size_t(sq * sk), Acc(0)), t(size_t(sq * sk), Acc(0)), orow(size_t(c.dv));
        std::vector<double> w(size_t(sq * sk), 0.0);  // 1 + |score| bound: relative error scale of P
        for (int64_t i = 0; i < sq; ++i) {
          Acc m = -INFINITY;
          double wmax = 0;
          std::vector<Acc> srow(size_t(sk), Acc(-INFINITY));
          for (int64_t j = 0; j < sk; ++j) {
            if (!mask.visible(i, j)) continue;
            Acc dot = 0;
            double dot_abs = 0;
            for (int64_t x = 0; x < c.d; ++x) {
              dot += Acc(qv[size_t(rq.at(b, i, h, x))]) * Acc(kv[size_t(rk.at(b, j, hk, x))]);
              dot_abs += std::fabs(qv[size_t(rq.at(b, i, h, x))] * kv[size_t(rk.at(b, j, hk, x))]);
            }
            w[size_t(i * sk + j)] = 1 + default_scale * dot_abs;
            wmax = std::max(wmax, w[size_t(i * sk + j)]);
            Acc u = dot * scale;
            if (cap > 0) {
              t[size_t(i * sk + j)] = std::tanh(u / cap);
              u = cap * t[size_t(i * sk + j)];
            }
            srow[size_t(j)] = u;
            m = std::max(m, u);
          }
          Acc l = 0;
          for (int64_t j = 0; j < sk; ++j) {
            const Acc e = m == Acc(-INFINITY) ? Acc(0) : std::exp(srow[size_t(j)] - m);
            p[size_t(i * sk + j)] = e;
            l += e;
          }
          for (int64_t j = 0; j < sk; ++j) p[size_t(i * sk + j)] = l > 0 ? p[size_t(i * sk + j)] / l : Acc(0);
          r.lse[size_t(pb.lse_index(rq, b, h, i))] = l > 0 ? double(float(m + std::log(l))) : -INFINITY;
          r.lse_mag[size_t(pb.lse_index(rq, b, h, i))] = l > 0 ? std::fabs(double(m)) + wmax : 0.0;
          for (int64_t x = 0; x < c.dv; ++x) {
            Acc acc = 0;
            double mag = 0;
            for (int64_t j = 0; j < sk; ++j) {
              acc += p[size_t(i * sk + j)] * Acc(vv[size_t(rv.at(b, j, hk, x))]);
              mag += double(p[size_t(i * sk + j)]) * w[size_t(i * sk + j)] * std::fabs(vv[size_t(rv.at(b, j, hk, x))]);
            }
            r.o[size_t(ro.at(b, i, h, x))] = round_to(dt, double(acc));
            r.o_mag[size_t(ro.at(b, i, h, x))] = mag;
          }
        }
        if (!backward) continue;
        for (int64_t i = 0; i < sq; ++i) {
          Acc dsum = 0;
          double dsum_abs = 0;
          for (int64_t x = 0; x < c.dv; ++x) {
            dsum += Acc(dov[size_t(ro.at(b, i, h, x))]) * Acc(r.o[size_t(ro.at(b, i, h, x))]);
            dsum_abs += std::fabs(dov[size_t(ro.at(b, i, h, x))] * r.o[size_t(ro.at(b, i, h, x))]);
          }
          std::vector<Acc> dq(size_t(c.d), Acc(0));
          for (int64_t j = 0; j < sk; ++j) {
            const Acc pij = p[size_t(i * sk + j)];
            Acc dp = 0;
            double dp_abs = 0;
            for (int64_t x = 0; x < c.dv; ++x) {
              dp += Acc(dov[size_t(ro.at(b, i, h, x))]) * Acc(vv[size_t(rv.at(b, j, hk, x))]);
              dp_abs += std::fabs(dov[size_t(ro.at(b, i, h, x))] * vv[size_t(rv.at(b, j, hk, x))]);
            }
            Acc ds = pij * (dp - dsum);
            const double pw = double(pij) * w[size_t(i * sk + j)];
            const double ds_mag = pw * (dp_abs + dsum_abs) * default_scale;
            if (cap > 0) ds *= Acc(1) - t[size_t(i * sk + j)] * t[size_t(i * sk + j)];
            ds *= scale;
            for (int64_t x = 0; x < c.dv; ++x) {
              dvacc[size_t(j * c.dv + x)] += pij * Acc(dov[size_t(ro.at(b, i, h, x))]);
              r.dv_mag[size_t(rv.at(b, j, hk, x))] += pw * std::fabs(dov[size_t(ro.at(b, i, h, x))]);
            }
            for (int64_t x = 0; x < c.d; ++x) {
              dq[size_t(x)] += ds * Acc(kv[size_t(rk.at(b, j, hk, x))]);
              dk[size_t(j * c.d + x)] += ds * Acc(qv[size_t(rq.at(b, i, h, x))]);
              r.dq_mag[size_t(rq.at(b, i, h, x))] += ds_mag * std::fabs(kv[size_t(rk.at(b, j, hk, x))]);
              r.dk_mag[size_t(rk.at(b, j, hk, x))] += ds_mag * std::fabs(qv[size_t(rq.at(b, i, h, x))]);
            }
          }
          for (int64_t x = 0; x < c.d; ++x) r.dq[size_t(rq.at(b, i, h, x))] = round_to(dt, double(dq[size_t(x)]));
        }
      }
      if (!backward) continue;
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t x = 0; x < c.d; ++x) r.dk[size_t(rk.at(b, j, hk, x))] = round_to(dt, double(dk[size_t(j * c.d + x)]));
        for (int64_t x = 0; x < c.dv; ++x) r.dv[size_t(rv.at(b, j, hk, x))] = round_to(dt, double(dvacc[size_t(j * c.dv + x)]));
      }
    }
  }
  return r;
}

// The rule of the file header. `u` is the unit roundoff of the tensor's storage type, `u_acc` of the
// accumulation type; `mag` the magnitude of the summed terms (naive_same_precision).
inline double error_bound(const std::vector<double>& ref, const std::vector<double>& naive,
                          const std::vector<double>& mag, double u, double u_acc) {
  return 2 * l2_distance(naive, ref) + 4 * u * l2_norm(ref) + u_acc * l2_norm(mag);
}

inline void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                         const std::vector<double>& naive, const std::vector<double>& mag, double u, double u_acc) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const double err = l2_distance(got, ref), bound = error_bound(ref, naive, mag, u, u_acc);
  EXPECT_LE(err, bound) << what << ": ‖flash − ref‖ = " << err << ", same-precision naive " << l2_distance(naive, ref)
                        << ", ‖ref‖ = " << l2_norm(ref) << ", ‖terms‖ = " << l2_norm(mag) << ", u = " << u;
}

// Every output of a flash run against ref64 under the rule above.
inline void expect_matches_reference(const AttnCase& c, const AttnResult& got, const AttnResult& ref,
                                     const AttnResult& naive, bool backward) {
  const double u = unit_roundoff(c.dtype), u32 = unit_roundoff(DType::f32);
  const double u_acc = c.dtype == DType::f64 ? unit_roundoff(DType::f64) : u32;
  expect_close("O", got.o, ref.o, naive.o, naive.o_mag, u, u_acc);
  expect_close("LSE", got.lse, ref.lse, naive.lse, naive.lse_mag, u32, u_acc);
  if (!backward) return;
  expect_close("dQ", got.dq, ref.dq, naive.dq, naive.dq_mag, u, u_acc);
  expect_close("dK", got.dk, ref.dk, naive.dk, naive.dk_mag, u, u_acc);
  expect_close("dV", got.dv, ref.dv, naive.dv, naive.dv_mag, u, u_acc);
}

inline AttnResult naive_for(const AttnProblem& pb, bool backward) {
  return pb.c().dtype == DType::f64 ? naive_same_precision<double>(pb, backward)
                                    : naive_same_precision<float>(pb, backward);
}

}  // namespace flashattn::test
