// The naive reference: every score of a row materialised in double precision, exact softmax, no tiling. It is
// the oracle of every test in the project, so it is written for obviousness, not speed; its own gradients are
// checked against finite differences (tests/cpu).
#include "cpu/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "backend.h"
#include "common/alibi.h"
#include "common/dropout.h"
#include "common/half.h"
#include "common/mask.h"
#include "cpu/dtype_dispatch.h"
#include "cpu/kv_cache.h"
#include "cpu/sequence.h"

namespace flashattn::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <typename T>
void row_typed(const BwdParams& p, int64_t b, int64_t h, int64_t i, bool with_grad, ReferenceRow* r) {
  const int64_t group = p.heads_q / p.heads_kv;
  const SequenceExtent ext = sequence_extent(p, b);
  const auto q = query_view<const T>(p, p.q, ext, b, h);
  const auto k = key_view<const T>(p, p.k, ext, h / group, false);
  const auto v = key_view<const T>(p, p.v, ext, h / group, true);
  const auto qv = query_value_view<const T>(p, ext, b, h);
  const MaskSpec mask = sequence_mask(p, ext);
  const Alibi alibi = Alibi::make(p.alibi_slopes, p.alibi_slopes_batch_stride, b, h, ext.len_q, ext.len_k);
  const DropoutSpec dropout = DropoutSpec::make(p.dropout_p, DropoutRng::of(p), b, h);
  const double keep_scale = 1.0 / (1.0 - double(p.dropout_p));
  const int64_t sk = ext.len_k;

  std::vector<double> s(size_t(sk), kNegInf), th(size_t(sk), 0.0);
  double m = kNegInf;
  for (int64_t j = 0; j < sk; ++j) {
    if (!mask.visible(i, j)) continue;
    double dot = 0;
    for (int64_t c = 0; c < p.head_dim; ++c) dot += double(to_float(q.at(i, c))) * double(to_float(k.at(j, c)));
    if (p.qv) {
      for (int64_t c = 0; c < p.head_dim_v; ++c) dot += double(to_float(qv.at(i, c))) * double(to_float(v.at(j, c)));
    }
    double u = dot * double(p.softmax_scale);
    if (p.softcap > 0) {
      th[size_t(j)] = std::tanh(u / double(p.softcap));
      u = double(p.softcap) * th[size_t(j)];
    }
    u += alibi.bias(i, j);
    s[size_t(j)] = u;
    m = std::max(m, u);
  }

  r->out.assign(size_t(p.head_dim_v), 0.0);
  r->prob.assign(size_t(sk), 0.0);
  r->weight.assign(size_t(sk), 0.0);
  r->dq.assign(with_grad ? size_t(p.head_dim) : 0, 0.0);
  r->dscore.assign(with_grad ? size_t(sk) : 0, 0.0);
  r->lse = kNegInf;
  if (m == kNegInf) return;  // no visible key: O = 0, LSE = -inf, zero gradients

  double sum = 0;
  for (int64_t j = 0; j < sk; ++j) sum += (r->prob[size_t(j)] = std::exp(s[size_t(j)] - m));
  for (int64_t j = 0; j < sk; ++j) r->prob[size_t(j)] /= sum;
  r->lse = m + std::log(sum);
  for (int64_t j = 0; j < sk; ++j) {
    const double pj = r->prob[size_t(j)];
    r->weight[size_t(j)] = !dropout.active() ? pj : dropout.keep(i, j) ? pj * keep_scale : 0.0;
    const double wj = r->weight[size_t(j)];
    if (wj == 0) continue;
    for (int64_t c = 0; c < p.head_dim_v; ++c) r->out[size_t(c)] += wj * double(to_float(v.at(j, c)));
  }
  if (!with_grad) return;

  const auto dout = grad_out_view<const T>(p, ext, b, h);
  double row_d = 0;  // D = rowsum(dO ∘ O), from the exact O
  for (int64_t c = 0; c < p.head_dim_v; ++c) row_d += double(to_float(dout.at(i, c))) * r->out[size_t(c)];
  for (int64_t j = 0; j < sk; ++j) {
    const double pj = r->prob[size_t(j)];
    if (pj == 0) continue;
    double dp = 0;
    for (int64_t c = 0; c < p.head_dim_v; ++c) dp += double(to_float(dout.at(i, c))) * double(to_float(v.at(j, c)));
    // Under dropout dP reaches the kept probabilities only, scaled: dS = P ∘ (Z ∘ dP - D).
    const double z = pj == 0 ? 0.0 : r->weight[size_t(j)] / pj;
    double ds = pj * (z * dp - row_d);
    if (p.softcap > 0) ds *= 1.0 - th[size_t(j)] * th[size_t(j)];
    ds *= double(p.softmax_scale);
    r->dscore[size_t(j)] = ds;
    for (int64_t c = 0; c < p.head_dim; ++c) r->dq[size_t(c)] += ds * double(to_float(k.at(j, c)));
  }
}

template <typename T>
Status forward_typed(const FwdParams& fp) {
  BwdParams p;
  static_cast<FwdParams&>(p) = fp;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const SequenceExtent ext = sequence_extent(p, b);
      const auto o = output_view<T>(p, p.o, ext, b, h);
      ReferenceRow r;
      for (int64_t i = 0; i < ext.len_q; ++i) {
        row_typed<T>(p, b, h, i, false, &r);
        for (int64_t c = 0; c < p.head_dim_v; ++c) o.at(i, c) = from_double<T>(r.out[size_t(c)]);
        if (p.lse) *lse_ptr(p, ext, b, h, i) = float(r.lse);
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
      const int64_t sk = ext.len_k;
      // dK and dV of a KV head sum over the query heads that share it.
      std::vector<double> dk(size_t(sk * p.head_dim), 0.0), dv(size_t(sk * p.head_dim_v), 0.0);
      ReferenceRow r;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const auto q = query_view<const T>(p, p.q, ext, b, h);
        const auto dout = grad_out_view<const T>(p, ext, b, h);
        const auto dq = grad_query_view<T>(p, ext, b, h);
        for (int64_t i = 0; i < ext.len_q; ++i) {
          row_typed<T>(p, b, h, i, true, &r);
          for (int64_t c = 0; c < p.head_dim; ++c) dq.at(i, c) = from_double<T>(r.dq[size_t(c)]);
          for (int64_t j = 0; j < sk; ++j) {
            const double pj = r.prob[size_t(j)], wj = r.weight[size_t(j)], ds = r.dscore[size_t(j)];
            if (pj == 0) continue;
            for (int64_t c = 0; c < p.head_dim_v; ++c) dv[size_t(j * p.head_dim_v + c)] += wj * double(to_float(dout.at(i, c)));
            for (int64_t c = 0; c < p.head_dim; ++c) dk[size_t(j * p.head_dim + c)] += ds * double(to_float(q.at(i, c)));
          }
        }
      }
      const auto dk_out = grad_key_view<T>(p, ext, b, hk, false);
      const auto dv_out = grad_key_view<T>(p, ext, b, hk, true);
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < p.head_dim; ++c) dk_out.at(j, c) = from_double<T>(dk[size_t(j * p.head_dim + c)]);
        for (int64_t c = 0; c < p.head_dim_v; ++c) dv_out.at(j, c) = from_double<T>(dv[size_t(j * p.head_dim_v + c)]);
      }
    }
  }
  return Status::success();
}

template <template <typename> class F, typename... Args>
Status by_dtype(DType dtype, Args&&... args) {
  return call_by_dtype<F>("cpu_reference", dtype, args...);
}

template <typename T>
struct Forward {
  Status operator()(const FwdParams& p) const { return forward_typed<T>(p); }
};
template <typename T>
struct Backward {
  Status operator()(const BwdParams& p) const { return backward_typed<T>(p); }
};
template <typename T>
struct Row {
  Status operator()(const BwdParams& p, int64_t b, int64_t h, int64_t i, bool g, ReferenceRow* r) const {
    row_typed<T>(p, b, h, i, g, r);
    return Status::success();
  }
};

}  // namespace

void reference_row(const BwdParams& p, int64_t b, int64_t h, int64_t i, bool with_grad, ReferenceRow* row) {
  by_dtype<Row>(p.dtype, p, b, h, i, with_grad, row);
}

Status cpu_reference_forward(const FwdParams& p) {
  if (p.is_paged()) return cpu_forward_dense_cache(p, cpu_reference_forward);
  return by_dtype<Forward>(p.dtype, p);
}
Status cpu_reference_backward(const BwdParams& p) { return by_dtype<Backward>(p.dtype, p); }

}  // namespace flashattn::detail
