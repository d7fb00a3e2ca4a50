// The naive reference: materialises S and P for one (batch, head) at a time in double precision. It is the
// oracle of every test in the project, so it is written for obviousness, not speed; its own gradients are
// checked against finite differences (tests/test_reference.cpp).
#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "common/half.h"
#include "common/mask.h"
#include "cpu/sequence.h"

namespace flashattn::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Scores of one head, softcapped and masked (masked = -inf). Also returns tanh(u) per score for the softcap
// gradient when `tanh_out` is given.
template <typename T>
void scores(const FwdParams& p, const SequenceView<const T>& q, const SequenceView<const T>& k, const MaskSpec& mask,
            std::vector<double>& s, std::vector<double>* tanh_out) {
  const int64_t sq = q.rows, sk = k.rows;
  s.assign(size_t(sq * sk), kNegInf);
  if (tanh_out) tanh_out->assign(size_t(sq * sk), 0.0);
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t j = 0; j < sk; ++j) {
      if (!mask.visible(i, j)) continue;
      double dot = 0;
      for (int64_t c = 0; c < p.head_dim; ++c) dot += double(to_float(q.at(i, c))) * double(to_float(k.at(j, c)));
      double u = dot * double(p.softmax_scale);
      if (p.softcap > 0) {
        const double t = std::tanh(u / double(p.softcap));
        if (tanh_out) (*tanh_out)[size_t(i * sk + j)] = t;
        u = double(p.softcap) * t;
      }
      s[size_t(i * sk + j)] = u;
    }
  }
}

// Turns scores into probabilities row by row; returns each row's LSE (-inf for a row with no visible key).
void softmax_rows(int64_t sq, int64_t sk, std::vector<double>& s, std::vector<double>& lse) {
  lse.assign(size_t(sq), kNegInf);
  for (int64_t i = 0; i < sq; ++i) {
    double* row = &s[size_t(i * sk)];
    double m = kNegInf;
    for (int64_t j = 0; j < sk; ++j) m = std::max(m, row[j]);
    if (m == kNegInf) {
      for (int64_t j = 0; j < sk; ++j) row[j] = 0;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < sk; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < sk; ++j) row[j] /= sum;
    lse[size_t(i)] = m + std::log(sum);
  }
}

template <typename T>
Status forward_typed(const FwdParams& p) {
  const int64_t group = p.heads_q / p.heads_kv;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const SequenceExtent ext = sequence_extent(p, b);
      auto q = query_view<const T>(p, p.q, ext, b, h);
      auto k = key_view<const T>(p, p.k, ext, b, h / group, false);
      auto v = key_view<const T>(p, p.v, ext, b, h / group, true);
      auto o = output_view<T>(p, p.o, ext, b, h);
      const MaskSpec mask = MaskSpec::make(ext.len_q, ext.len_k, p.causal, p.window_left, p.window_right);
      std::vector<double> s, lse;
      scores(p, q, k, mask, s, nullptr);
      softmax_rows(ext.len_q, ext.len_k, s, lse);
      for (int64_t i = 0; i < ext.len_q; ++i) {
        for (int64_t c = 0; c < p.head_dim_v; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < ext.len_k; ++j) acc += s[size_t(i * ext.len_k + j)] * double(to_float(v.at(j, c)));
          o.at(i, c) = from_double<T>(acc);
        }
        if (p.lse) *lse_ptr(p, ext, b, h, i) = float(lse[size_t(i)]);
      }
    }
  }
  return Status::success();
}

template <typename T>
Status backward_typed(const BwdParams& p) {
  const int64_t group = p.heads_q / p.heads_kv;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const SequenceExtent ext = sequence_extent(p, b);
      const int64_t sq = ext.len_q, sk = ext.len_k;
      auto k = key_view<const T>(p, p.k, ext, b, hk, false);
      auto v = key_view<const T>(p, p.v, ext, b, hk, true);
      // dK and dV of a KV head sum over the query heads that share it.
      std::vector<double> dk(size_t(sk * p.head_dim), 0.0), dv(size_t(sk * p.head_dim_v), 0.0);
      const MaskSpec mask = MaskSpec::make(sq, sk, p.causal, p.window_left, p.window_right);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        auto q = query_view<const T>(p, p.q, ext, b, h);
        auto dout = grad_out_view<const T>(p, ext, b, h);
        auto dq = grad_query_view<T>(p, ext, b, h);
        std::vector<double> prob, lse, th;
        scores(p, q, k, mask, prob, &th);
        softmax_rows(sq, sk, prob, lse);
        for (int64_t i = 0; i < sq; ++i) {
          // dP = dO Vᵀ for the row, D = Σ_j P_ij dP_ij.
          std::vector<double> dp(size_t(sk), 0.0);
          double row_d = 0;
          for (int64_t j = 0; j < sk; ++j) {
            const double pij = prob[size_t(i * sk + j)];
            if (pij == 0) continue;
            double acc = 0;
            for (int64_t c = 0; c < p.head_dim_v; ++c) acc += double(to_float(dout.at(i, c))) * double(to_float(v.at(j, c)));
            dp[size_t(j)] = acc;
            row_d += pij * acc;
          }
          std::vector<double> dq_row(size_t(p.head_dim), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            const double pij = prob[size_t(i * sk + j)];
            if (pij == 0) continue;
            for (int64_t c = 0; c < p.head_dim_v; ++c) dv[size_t(j * p.head_dim_v + c)] += pij * double(to_float(dout.at(i, c)));
            double ds = pij * (dp[size_t(j)] - row_d);
            if (p.softcap > 0) {
              const double t = th[size_t(i * sk + j)];
              ds *= 1.0 - t * t;
            }
            ds *= double(p.softmax_scale);
            for (int64_t c = 0; c < p.head_dim; ++c) {
              dq_row[size_t(c)] += ds * double(to_float(k.at(j, c)));
              dk[size_t(j * p.head_dim + c)] += ds * double(to_float(q.at(i, c)));
            }
          }
          for (int64_t c = 0; c < p.head_dim; ++c) dq.at(i, c) = from_double<T>(dq_row[size_t(c)]);
        }
      }
      auto dk_out = grad_key_view<T>(p, ext, b, hk, false);
      auto dv_out = grad_key_view<T>(p, ext, b, hk, true);
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < p.head_dim; ++c) dk_out.at(j, c) = from_double<T>(dk[size_t(j * p.head_dim + c)]);
        for (int64_t c = 0; c < p.head_dim_v; ++c) dv_out.at(j, c) = from_double<T>(dv[size_t(j * p.head_dim_v + c)]);
      }
    }
  }
  return Status::success();
}

}  // namespace

Status cpu_reference_forward(const FwdParams& p) {
  switch (p.dtype) {
    case DType::f32: return forward_typed<float>(p);
    case DType::f64: return forward_typed<double>(p);
    case DType::f16: return forward_typed<half_t>(p);
    case DType::bf16: return forward_typed<bfloat16_t>(p);
    default: return Status::unsupported(std::string("cpu_reference: dtype ") + dtype_name(p.dtype));
  }
}

Status cpu_reference_backward(const BwdParams& p) {
  switch (p.dtype) {
    case DType::f32: return backward_typed<float>(p);
    case DType::f64: return backward_typed<double>(p);
    case DType::f16: return backward_typed<half_t>(p);
    case DType::bf16: return backward_typed<bfloat16_t>(p);
    default: return Status::unsupported(std::string("cpu_reference: dtype ") + dtype_name(p.dtype));
  }
}

}  // namespace flashattn::detail
