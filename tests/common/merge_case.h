// merge_attention_states test cases shared by the CPU and GPU suites: two random partial attentions (with rows
// that saw no key on one side, on both, and a NaN LSE), and the float64 formula they must merge to.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/host_tensor.h"

namespace flashattn::test {

struct MergeCase {
  HostTensor out_a, lse_a, out_b, lse_b, out, lse;
  bool varlen = false;

  // out_a / out [b, s, h, d] (varlen: [s, h, d]) in dtype_a, out_b in dtype_b; `row_pad` pads every row of the
  // out-like tensors (strided views; an odd pad leaves the vector alignment).
  MergeCase(bool varlen_layout, int64_t b, int64_t s, int64_t h, int64_t d, DType dtype_a, DType dtype_b,
            int64_t row_pad, uint64_t seed)
      : varlen(varlen_layout) {
    const std::vector<int64_t> o_shape = varlen ? std::vector<int64_t>{s, h, d} : std::vector<int64_t>{b, s, h, d};
    const std::vector<int64_t> l_shape = varlen ? std::vector<int64_t>{h, s} : std::vector<int64_t>{b, h, s};
    out_a = HostTensor(dtype_a, o_shape, {}, row_pad);
    out_b = HostTensor(dtype_b, o_shape, {}, row_pad);
    out = HostTensor(dtype_a, o_shape, {}, row_pad);
    lse_a = HostTensor(DType::f32, l_shape);
    lse_b = HostTensor(DType::f32, l_shape);
    lse = HostTensor(DType::f32, l_shape);
    std::mt19937_64 rng(seed);
    out_a.fill_normal(rng);
    out_b.fill_normal(rng);
    lse_a.fill_normal(rng, 3.0);
    lse_b.fill_normal(rng, 3.0);
    out.poison();
    lse.poison();
    const double inf = std::numeric_limits<double>::infinity();
    // Row 0 head 0: side a saw no key (its out is NaN and must not be read); row 1: side b none; row 2: neither;
    // row 3 head 0: a NaN LSE.
    auto at_lse = [&](int64_t i) { return varlen ? lse_a.offset({0, i}) : lse_a.offset({0, 0, i}); };
    auto at_out = [&](const HostTensor& t, int64_t i, int64_t c) {
      return varlen ? t.offset({i, 0, c}) : t.offset({0, i, 0, c});
    };
    lse_a.set(at_lse(0), -inf);
    for (int64_t c = 0; c < d; ++c) out_a.set(at_out(out_a, 0, c), std::nan(""));
    lse_b.set(at_lse(1), -inf);
    lse_a.set(at_lse(2), -inf);
    lse_b.set(at_lse(2), -inf);
    lse_a.set(at_lse(3), std::nan(""));
  }

  MergeArgs args(Device device = {}, void* oa = nullptr, void* la = nullptr, void* ob = nullptr,
                 void* lb = nullptr, void* o = nullptr, void* l = nullptr) const {
    MergeArgs a;
    a.out_a = out_a.view(device, oa);
    a.lse_a = lse_a.view(device, la);
    a.out_b = out_b.view(device, ob);
    a.lse_b = lse_b.view(device, lb);
    a.out = out.view(device, o);
    a.lse = lse.view(device, l);
    return a;
  }

  // The float64 merge of the inputs: out and lse flattened in their logical order.
  void expected(std::vector<double>* o, std::vector<double>* l) const {
    const int64_t rank = int64_t(out_a.shape().size());
    const int64_t rows = out_a.shape()[size_t(rank - 3)], heads = out_a.shape()[size_t(rank - 2)];
    const int64_t d = out_a.shape()[size_t(rank - 1)], batch = varlen ? 1 : out_a.shape()[0];
    o->clear();
    l->assign(size_t(batch * heads * rows), 0.0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          auto lse_at = [&](const HostTensor& t) {
            return t.get(varlen ? t.offset({h, i}) : t.offset({b, h, i}));
          };
          const double la = lse_at(lse_a), lb = lse_at(lse_b);
          const double m = std::max(la, lb), inf = std::numeric_limits<double>::infinity();
          double wa = 0, wb = 0, merged = -inf;
          if (std::isnan(la) || std::isnan(lb)) {
            wa = wb = merged = std::nan("");
          } else if (m != -inf) {
            merged = m + std::log(std::exp(la - m) + std::exp(lb - m));
            wa = std::exp(la - merged), wb = std::exp(lb - merged);
          }
          (*l)[size_t((b * heads + h) * rows + i)] = merged;
          for (int64_t c = 0; c < d; ++c) {
            auto val = [&](const HostTensor& t) {
              return t.get(varlen ? t.offset({i, h, c}) : t.offset({b, i, h, c}));
            };
            o->push_back((wa == 0 ? 0.0 : wa * val(out_a)) + (wb == 0 ? 0.0 : wb * val(out_b)));
          }
        }
      }
    }
  }
};

// NaN where expected NaN, else within `tol` (absolute + relative); -inf only where expected.
inline ::testing::AssertionResult merged_close(const std::vector<double>& got, const std::vector<double>& want,
                                               double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t e = 0; e < got.size(); ++e) {
    const bool ok = std::isnan(want[e]) ? std::isnan(got[e])
                    : std::isinf(want[e]) ? got[e] == want[e]
                                          : std::fabs(got[e] - want[e]) <= tol * (1 + std::fabs(want[e]));
    if (!ok) return ::testing::AssertionFailure() << "element " << e << ": got " << got[e] << ", want " << want[e];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace flashattn::test
