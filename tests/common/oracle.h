// The oracle of every suite: attention computed straight from its documented semantics, written apart from the
// library. It reads only logical tensor values (host_tensor.h) and the case's own description of the call, never
// the library's params, mask (src/common/mask.h), sequence offsets (src/cpu/sequence.h), conversions
// (src/common/half.h) or argument handling (src/validate.cpp), so a bug in any of those cannot also be in the
// answer a test expects. tests/cpu/test_oracle.cpp checks the library's own reference backend and MaskSpec
// against it, and its gradients against finite differences.
//
// The semantics (README "Supported features", include/flashattn/flashattn.h), per sequence of s_q queries and s_k
// keys (varlen: each sequence its own lengths, rows packed one sequence after the other):
//   query i sits on key diagonal t = i + s_k - s_q (bottom-right alignment, as flash-attn >= 2.1);
//   key j is visible iff 0 <= j < s_k, j <= t under causal, j >= t - window_left when window_left >= 0 and
//   j <= t + window_right when window_right >= 0, and, with attention_chunk c > 0, j in the same chunk of c keys
//   as t (j / c == floor(t / c); a row with t < 0 sees no key);
//   score = scale · q·k (scale = softmax_scale, 1/√d when 0), then softcap · tanh(score / softcap) when softcap > 0,
//   then minus slope · |i + s_k - s_q - j| with ALiBi (slope of query head h, and of sequence b when per batch);
//   dropout with probability p: O = (P ∘ Z) V, Z = 1 / (1 - p) where kept, 0 where dropped (the mask from
//   philox_reference.h's generator and its layout), dS = P ∘ (Z ∘ dO Vᵀ − D), dV = (P ∘ Z)ᵀ dO;
//   query head h reads KV head h / (h_q / h_kv);
//   P = softmax of the visible scores, O = P V, LSE = log Σ exp(score); a row with no visible key has O = 0,
//   LSE = −inf and zero gradients.
// Backward, for dO: D = rowsum(dO ∘ O), dS = P ∘ (dO Vᵀ − D) [∘ (1 − tanh²) under softcap], dQ = scale · dS K,
// dK = scale · dSᵀ Q and dV = Pᵀ dO, summed over the query heads that share a KV head.
//
// textbook_attention<Acc> evaluates this with every sum in Acc. In double and without rounding it is the oracle;
// in float, rounding where an implementation must (outputs to the storage type, O before D, and optionally P and
// dS before their products, as the GPU kernels do) it is the error a straightforward implementation in that
// precision makes, which the tolerance rules are built on. Alongside each output it returns the magnitude of the
// terms that output sums (the same sums over absolute values, each probability weighted by 1 + |score|, the
// factor by which a score's rounding moves it): rounding errors scale with those, not with an output that may
// cancel to 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/philox_reference.h"
#include "common/rounding.h"

namespace flashattn::test {

// What a call means, as the test describes it (independently of the library's options and params).
struct AttnSpec {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // negative: unbounded
  int64_t attention_chunk = 0;                  // 0: off
  double softcap = 0;                           // 0: off
  double softmax_scale = 0;                     // 0: 1/√d
  std::vector<int64_t> lens_q, lens_k;          // varlen when non-empty: per-sequence lengths, rows packed
  std::vector<float> alibi_slopes;              // ALiBi: [h_q], or [batch][h_q] when alibi_per_batch; empty: none
  bool alibi_per_batch = false;
  double dropout_p = 0;  // taken in fp32, as the library does
  uint64_t dropout_seed = 0, dropout_offset = 0;

  // Dropout's factor Z for query i and key j of sequence b, query head h.
  double dropout_factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const float p = float(dropout_p);
    if (p <= 0) return 1;
    return dropout_kept(p, dropout_seed, dropout_offset, b, h, i, j) ? 1.0 / (1.0 - double(p)) : 0;
  }

  // ALiBi's bias for query i and key j of sequence b, query head h (h_q heads).
  double alibi_bias(int64_t b, int64_t h, int64_t h_q, int64_t i, int64_t j, int64_t sq, int64_t sk) const {
    if (alibi_slopes.empty()) return 0;
    const double slope = alibi_slopes[size_t(alibi_per_batch ? b * h_q + h : h)];
    return -slope * std::fabs(double(i + sk - sq - j));
  }
  // The library takes the scale in fp32 (documented in flashattn.h, AttentionOptions::softmax_scale).
  double scale(int64_t head_dim) const {
    return double(float(softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim))));
  }
  // Whether query i of a sequence of sq queries and sk keys sees key j (distances from the diagonal compared with
  // the edges, so that edges up to the largest int64 cannot overflow).
  bool sees(int64_t i, int64_t j, int64_t sq, int64_t sk) const {
    const int64_t after_diagonal = j - (i + sk - sq);  // > 0: right of the diagonal
    if (j < 0 || j >= sk) return false;
    if (causal && after_diagonal > 0) return false;
    if (window_left >= 0 && -after_diagonal > window_left) return false;
    if (window_right >= 0 && after_diagonal > window_right) return false;
    if (attention_chunk > 0) {
      const int64_t t = i + sk - sq;
      // Chunk numbers, rounding toward minus infinity (j >= 0 here, t may be negative).
      const int64_t chunk_of_t = t >= 0 ? t / attention_chunk : -((-t + attention_chunk - 1) / attention_chunk);
      if (j / attention_chunk != chunk_of_t) return false;
    }
    return true;
  }
};

// Where textbook_attention rounds (double and DType::f64: nowhere, the oracle).
struct Rounding {
  DType storage = DType::f64;  // outputs rounded to it, and O before D
  bool operands = false;       // P and dS rounded to `storage` before they enter products (the GPU kernels)
};

struct AttnResult {
  std::vector<double> o, lse, dq, dk, dv;  // logical order of out, lse ([b, h, s] / [h, total]), q, k, v
  std::vector<double> o_mag, lse_mag, dq_mag, dk_mag, dv_mag;  // magnitudes of the summed terms (file header)
};

// The sizes of a call: padded batch (batch, s_q, s_k) or varlen (spec.lens_*; batch and lengths unused), heads and
// head dims.
struct AttnShape {
  int64_t batch = 1, s_q = 0, s_k = 0, h_q = 1, h_kv = 1, d = 0, d_v = 0;
};

// q, k, v (and dout) as logical values: [b, s, h, dim] row-major, or [total, h, dim] with spec.lens_*; dout like
// out, or null for the forward only. `backward_reads_o`: the O (logical order) the backward computes D from, as a
// real backward is given the forward's output; null: this computation's own (rounded) O.
template <typename Acc>
AttnResult textbook_attention(const AttnShape& shape, const std::vector<double>& Q, const std::vector<double>& K,
                              const std::vector<double>& V, const std::vector<double>* dout, const AttnSpec& spec,
                              Rounding rounding = {}, const std::vector<double>* backward_reads_o = nullptr) {
  const bool varlen = !spec.lens_q.empty();
  const int64_t hq = shape.h_q, d = shape.d, hkv = shape.h_kv, dv = shape.d_v;
  const int64_t batch = varlen ? int64_t(spec.lens_q.size()) : shape.batch;
  const int64_t group = hq / hkv;
  const bool backward = dout != nullptr;
  // First packed row and length of each sequence, on each side.
  std::vector<int64_t> row_q(static_cast<size_t>(batch)), row_k = row_q, len_q = row_q, len_k = row_q;
  int64_t total_q = 0, total_k = 0;
  for (int64_t b = 0; b < batch; ++b) {
    len_q[size_t(b)] = varlen ? spec.lens_q[size_t(b)] : shape.s_q;
    len_k[size_t(b)] = varlen ? spec.lens_k[size_t(b)] : shape.s_k;
    row_q[size_t(b)] = total_q, row_k[size_t(b)] = total_k;
    total_q += len_q[size_t(b)], total_k += len_k[size_t(b)];
  }
  const std::vector<double> empty;
  const std::vector<double>& dO = backward ? *dout : empty;
  auto qi = [&](int64_t row, int64_t h, int64_t c) { return size_t((row * hq + h) * d + c); };
  auto ki = [&](int64_t row, int64_t h, int64_t c) { return size_t((row * hkv + h) * d + c); };
  auto vi = [&](int64_t row, int64_t h, int64_t c) { return size_t((row * hkv + h) * dv + c); };
  auto oi = [&](int64_t row, int64_t h, int64_t c) { return size_t((row * hq + h) * dv + c); };
  auto li = [&](int64_t b, int64_t h, int64_t i) {
    return size_t(varlen ? h * total_q + row_q[size_t(b)] + i : (b * hq + h) * len_q[size_t(b)] + i);
  };
  const DType storage = rounding.storage;
  const DType lse_storage = storage == DType::f64 ? DType::f64 : DType::f32;  // LSE is an fp32 output
  auto stored = [&](double x) { return round_to_storage(storage, x); };
  auto operand = [&](Acc x) { return rounding.operands ? Acc(round_to_storage(storage, double(x))) : x; };
  const double scale_d = spec.scale(d);
  const Acc scale = Acc(scale_d), cap = Acc(float(spec.softcap));  // both applied in fp32 (flashattn.h)

  AttnResult r;
  r.o.assign(size_t(total_q * hq * dv), 0.0);
  r.o_mag = r.o;
  r.lse.assign(size_t(total_q * hq), 0.0);
  r.lse_mag = r.lse;
  if (backward) {
    r.dq.assign(Q.size(), 0.0), r.dk.assign(K.size(), 0.0), r.dv.assign(V.size(), 0.0);
    r.dq_mag = r.dq, r.dk_mag = r.dk, r.dv_mag = r.dv;
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = len_q[size_t(b)], sk = len_k[size_t(b)], q0 = row_q[size_t(b)], k0 = row_k[size_t(b)];
    for (int64_t hk = 0; hk < hkv; ++hk) {
      std::vector<Acc> dk_acc(size_t(sk * d), Acc(0)), dv_acc(size_t(sk * dv), Acc(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        // Per (query, key), for the key-side sums: P and dS as they enter products, and their magnitudes.
        std::vector<Acc> P, dS;
        std::vector<double> p_mag, ds_mag;
        if (backward) {
          P.assign(size_t(sq * sk), Acc(0)), dS = P;
          p_mag.assign(size_t(sq * sk), 0.0), ds_mag = p_mag;
        }
#pragma omp parallel for schedule(dynamic)
        for (int64_t i = 0; i < sq; ++i) {
          std::vector<Acc> s(size_t(sk), Acc(0)), th(size_t(sk), Acc(0)), p(size_t(sk), Acc(0));
          std::vector<double> weight(size_t(sk), 0.0);
          std::vector<Acc> z(size_t(sk), Acc(1));  // dropout's factors
          std::vector<char> seen(size_t(sk), 0);
          Acc m = Acc(-INFINITY);
          double weight_max = 0;
          for (int64_t j = 0; j < sk; ++j) {
            if (!spec.sees(i, j, sq, sk)) continue;
            Acc dot = 0;
            double dot_abs = 0;
            for (int64_t c = 0; c < d; ++c) {
              dot += Acc(Q[qi(q0 + i, h, c)]) * Acc(K[ki(k0 + j, hk, c)]);
              dot_abs += std::fabs(Q[qi(q0 + i, h, c)] * K[ki(k0 + j, hk, c)]);
            }
            Acc x = dot * scale;
            if (spec.softcap > 0) {
              th[size_t(j)] = std::tanh(x / cap);
              x = cap * th[size_t(j)];
            }
            const double bias = spec.alibi_bias(b, h, hq, i, j, sq, sk);
            x += Acc(bias);
            s[size_t(j)] = x;
            z[size_t(j)] = Acc(spec.dropout_factor(b, h, i, j));
            seen[size_t(j)] = 1;
            weight[size_t(j)] = 1 + scale_d * dot_abs + std::fabs(bias);
            weight_max = std::max(weight_max, weight[size_t(j)]);
            m = std::max(m, x);
          }
          Acc l = 0;
          for (int64_t j = 0; j < sk; ++j)
            if (seen[size_t(j)]) l += (p[size_t(j)] = std::exp(s[size_t(j)] - m));
          const bool any = l > 0;
          for (int64_t j = 0; j < sk; ++j) p[size_t(j)] = any ? p[size_t(j)] / l : Acc(0);
          r.lse[li(b, h, i)] = any ? round_to_storage(lse_storage, double(m + std::log(l))) : -INFINITY;
          r.lse_mag[li(b, h, i)] = any ? std::fabs(double(m)) + weight_max : 0.0;
          std::vector<double> o_used(size_t(dv), 0.0);  // O as the backward reads it
          for (int64_t c = 0; c < dv; ++c) {
            Acc acc = 0;
            double mag = 0;
            for (int64_t j = 0; j < sk; ++j) {
              if (!seen[size_t(j)]) continue;
              acc += operand(p[size_t(j)] * z[size_t(j)]) * Acc(V[vi(k0 + j, hk, c)]);
              mag += double(p[size_t(j)] * z[size_t(j)]) * weight[size_t(j)] * std::fabs(V[vi(k0 + j, hk, c)]);
            }
            r.o[oi(q0 + i, h, c)] = stored(double(acc));
            o_used[size_t(c)] = backward_reads_o ? (*backward_reads_o)[oi(q0 + i, h, c)] : r.o[oi(q0 + i, h, c)];
            r.o_mag[oi(q0 + i, h, c)] = mag;
          }
          if (!backward) continue;
          Acc row_d = 0;  // D = rowsum(dO ∘ O)
          double row_d_abs = 0;
          for (int64_t c = 0; c < dv; ++c) {
            row_d += Acc(dO[oi(q0 + i, h, c)]) * Acc(o_used[size_t(c)]);
            row_d_abs += std::fabs(dO[oi(q0 + i, h, c)] * o_used[size_t(c)]);
          }
          std::vector<Acc> dq(size_t(d), Acc(0));
          std::vector<double> dq_mag(size_t(d), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            if (!seen[size_t(j)]) continue;
            Acc dp = 0;
            double dp_abs = 0;
            for (int64_t c = 0; c < dv; ++c) {
              dp += Acc(dO[oi(q0 + i, h, c)]) * Acc(V[vi(k0 + j, hk, c)]);
              dp_abs += std::fabs(dO[oi(q0 + i, h, c)] * V[vi(k0 + j, hk, c)]);
            }
            Acc ds = p[size_t(j)] * (z[size_t(j)] * dp - row_d);
            if (spec.softcap > 0) ds *= Acc(1) - th[size_t(j)] * th[size_t(j)];
            const size_t ij = size_t(i * sk + j);
            P[ij] = operand(p[size_t(j)] * z[size_t(j)]);
            dS[ij] = operand(ds);
            p_mag[ij] = double(p[size_t(j)] * z[size_t(j)]) * weight[size_t(j)];
            ds_mag[ij] = double(p[size_t(j)]) * weight[size_t(j)] * (double(z[size_t(j)]) * dp_abs + row_d_abs) * scale_d;
            for (int64_t c = 0; c < d; ++c) {
              dq[size_t(c)] += dS[ij] * Acc(K[ki(k0 + j, hk, c)]);
              dq_mag[size_t(c)] += ds_mag[ij] * std::fabs(K[ki(k0 + j, hk, c)]);
            }
          }
          for (int64_t c = 0; c < d; ++c) {
            r.dq[qi(q0 + i, h, c)] = stored(double(dq[size_t(c)] * scale));
            r.dq_mag[qi(q0 + i, h, c)] = dq_mag[size_t(c)];
          }
        }
        if (!backward) continue;
#pragma omp parallel for schedule(dynamic)
        for (int64_t j = 0; j < sk; ++j) {
          for (int64_t i = 0; i < sq; ++i) {
            const size_t ij = size_t(i * sk + j);
            if (P[ij] == Acc(0) && dS[ij] == Acc(0)) continue;  // masked, or a probability that underflowed
            for (int64_t c = 0; c < dv; ++c) {
              dv_acc[size_t(j * dv + c)] += P[ij] * Acc(dO[oi(q0 + i, h, c)]);
              r.dv_mag[vi(k0 + j, hk, c)] += p_mag[ij] * std::fabs(dO[oi(q0 + i, h, c)]);
            }
            for (int64_t c = 0; c < d; ++c) {
              dk_acc[size_t(j * d + c)] += dS[ij] * Acc(Q[qi(q0 + i, h, c)]);
              r.dk_mag[ki(k0 + j, hk, c)] += ds_mag[ij] * std::fabs(Q[qi(q0 + i, h, c)]);
            }
          }
        }
      }
      if (!backward) continue;
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < d; ++c) r.dk[ki(k0 + j, hk, c)] = stored(double(dk_acc[size_t(j * d + c)] * scale));
        for (int64_t c = 0; c < dv; ++c) r.dv[vi(k0 + j, hk, c)] = stored(double(dv_acc[size_t(j * dv + c)]));
      }
    }
  }
  return r;
}

// The same from tensors in any layout: q [b, s_q, h_q, d] and k, v [b, s_k, h_kv, d / d_v], or [total, h, dim].
template <typename Acc>
AttnResult textbook_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor* dout,
                              const AttnSpec& spec, Rounding rounding = {},
                              const std::vector<double>* backward_reads_o = nullptr) {
  const size_t rank = q.shape().size();
  AttnShape shape;
  shape.h_q = q.shape()[rank - 2], shape.d = q.shape()[rank - 1];
  shape.h_kv = k.shape()[rank - 2], shape.d_v = v.shape()[rank - 1];
  if (rank == 4) shape.batch = q.shape()[0], shape.s_q = q.shape()[1], shape.s_k = k.shape()[1];
  const std::vector<double> dO = dout ? dout->values() : std::vector<double>();
  return textbook_attention<Acc>(shape, q.values(), k.values(), v.values(), dout ? &dO : nullptr, spec, rounding,
                                 backward_reads_o);
}

// The oracle: exact up to double rounding.
inline AttnResult oracle_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                   const HostTensor* dout, const AttnSpec& spec) {
  return textbook_attention<double>(q, k, v, dout, spec);
}

// Elements outside a per-element bound: |got − want| > bound, with −inf matching only −inf and NaN never
// matching. Describes the worst (largest error / bound) in `worst`.
inline int64_t count_outside(const std::vector<double>& got, const std::vector<double>& want,
                             const std::vector<double>& bound, std::string* worst = nullptr) {
  if (got.size() != want.size() || bound.size() != want.size()) return int64_t(std::max(got.size(), want.size())) + 1;
  int64_t bad = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - want[i]);
    if (std::isnan(got[i]) || std::isnan(want[i])) err = INFINITY;
    else if (std::isinf(got[i]) || std::isinf(want[i])) err = got[i] == want[i] ? 0.0 : INFINITY;
    if (err > bound[i]) ++bad;
    const double ratio = err == 0 ? 0.0 : bound[i] > 0 ? err / bound[i] : INFINITY;
    if (worst && ratio > worst_ratio) {
      worst_ratio = ratio;
      std::ostringstream os;
      os << std::setprecision(17) << "element " << i << ": got " << got[i] << ", want " << want[i] << ", bound "
         << bound[i];
      *worst = os.str();
    }
  }
  return bad;
}

}  // namespace flashattn::test
