// The forward over slices of V's columns (src/value_slices.h), which the CUDA backends run for d_v past their
// kernels' 256: the slice rule, and that the slices' forwards together write the whole forward's O and LSE. Run here
// with the CPU flash path as the per-slice forward, so that the pointer and width arithmetic is checked without a
// GPU (tests/python/test_fa3.py runs the CUDA backends' d_v 512 calls against float64 attention).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "common/host_tensor.h"
#include "flashattn/flashattn.h"
#include "value_slices.h"

namespace flashattn::test {
namespace {

TEST(ValueSlices, WidthCoversTheColumnsInAlignedSlices) {
  EXPECT_EQ(detail::value_slice_width(512, 256, 8), 256);
  EXPECT_EQ(detail::value_slice_width(256, 256, 8), 256);
  EXPECT_EQ(detail::value_slice_width(300, 256, 8), 152);  // 152 + 148, not 256 + 44
  EXPECT_EQ(detail::value_slice_width(264, 256, 16), 144);  // float8: 16-byte slice starts
  EXPECT_EQ(detail::value_slice_width(59, 256, 8), 59);
  for (int64_t align : {1, 8, 16}) {
    for (int64_t max_width : {64, 112, 256}) {
      for (int64_t dv = 1; dv <= 512; ++dv) {
        const int64_t w = detail::value_slice_width(dv, max_width, align);
        ASSERT_LE(w, max_width) << dv;
        if (dv <= max_width) {
          ASSERT_EQ(w, dv);
          continue;
        }
        // As few slices as any split into max_width columns needs, each starting on an aligned column.
        ASSERT_EQ(w % align, 0) << dv;
        ASSERT_EQ((dv + w - 1) / w, (dv + max_width - 1) / max_width) << dv << " " << max_width;
      }
    }
  }
}

struct SliceCase {
  DType dtype;
  bool varlen, causal;
  float dropout_p;
  int64_t d, dv, max_width;
};

class ValueSlices : public ::testing::TestWithParam<SliceCase> {};

TEST_P(ValueSlices, SlicesTogetherWriteTheWholeForward) {
  const SliceCase c = GetParam();
  const int64_t b = 2, sq = 7, sk = 11, hq = 4, hkv = 2, total_q = 12, total_k = 17;
  HostTensor q, k, v, out, lse, cu_q, cu_k;
  if (c.varlen) {
    q = HostTensor(c.dtype, {total_q, hq, c.d}), k = HostTensor(c.dtype, {total_k, hkv, c.d});
    v = HostTensor(c.dtype, {total_k, hkv, c.dv}, {}, 8);  // padded rows: the slices keep v's strides
    out = HostTensor(c.dtype, {total_q, hq, c.dv}), lse = HostTensor(DType::f32, {hq, total_q});
    cu_q = cu_seqlens_of(std::vector<int>{5, 7}), cu_k = cu_seqlens_of(std::vector<int>{9, 8});
  } else {
    q = HostTensor(c.dtype, {b, sq, hq, c.d}), k = HostTensor(c.dtype, {b, sk, hkv, c.d});
    v = HostTensor(c.dtype, {b, sk, hkv, c.dv}, {0, 2, 1, 3});  // [b, h, s, d] storage
    out = HostTensor(c.dtype, {b, sq, hq, c.dv}, {}, 8), lse = HostTensor(DType::f32, {b, hq, sq});
  }
  std::mt19937_64 rng(41);
  for (HostTensor* t : {&q, &k, &v}) t->fill_normal(rng);

  AttentionOptions opt;
  opt.backend = Backend::cpu_flash;
  opt.causal = c.causal;
  opt.dropout_p = double(c.dropout_p);
  opt.dropout_seed = 7;
  ForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
  if (c.varlen) a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
  out.poison(), lse.poison();
  Status st = attention_forward(a, opt);
  ASSERT_TRUE(st.ok()) << st.message;
  const HostTensor whole_out = out, whole_lse = lse;

  FwdParams p;
  ASSERT_TRUE(make_forward_params(a, opt, &p).ok());
  out.poison(), lse.poison();
  int slices = 0;
  st = detail::for_each_value_slice(p, c.max_width, [&](const FwdParams& slice) {
    ++slices;
    EXPECT_LE(slice.head_dim_v, c.max_width);
    return detail::cpu_flash_forward(slice);
  });
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(slices, (c.dv + c.max_width - 1) / c.max_width);  // as few as max_width allows
  // Each slice is a forward of its own (its own tile plan for its width), so the sums may round differently.
  const double tol = c.dtype == DType::f64 ? 1e-13 : 1e-5;
  EXPECT_LE(max_error_relative_above_one(out.values(), whole_out.values()), tol);
  EXPECT_LE(max_error_relative_above_one(lse.values(), whole_lse.values()), tol);
}

INSTANTIATE_TEST_SUITE_P(Grid, ValueSlices,
                         ::testing::Values(SliceCase{DType::f64, false, true, 0.f, 16, 300, 104},
                                           SliceCase{DType::f32, true, false, 0.f, 24, 512, 256},
                                           SliceCase{DType::f32, false, false, 0.2f, 8, 72, 32},
                                           SliceCase{DType::f64, true, true, 0.3f, 16, 40, 16}),
                         [](const auto& info) {
                           const SliceCase& c = info.param;
                           return std::string(dtype_name(c.dtype)) + (c.varlen ? "_varlen" : "_padded") +
                                  (c.causal ? "_causal" : "") + (c.dropout_p > 0 ? "_dropout" : "") + "_d" +
                                  std::to_string(c.d) + "_" + std::to_string(c.dv) + "_slices_of_" +
                                  std::to_string(c.max_width);
                         });

// qv's scores read every column of V, so a qv call cannot be sliced: refused before any slice runs.
TEST(ValueSlices, RefusesQueryValueCalls) {
  HostTensor q(DType::f32, {1, 3, 1, 8}), k(DType::f32, {1, 5, 1, 8}), v(DType::f32, {1, 5, 1, 64});
  HostTensor qv(DType::f32, {1, 3, 1, 64}), out(DType::f32, {1, 3, 1, 64});
  ForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.qv = qv.view(), a.out = out.view();
  FwdParams p;
  ASSERT_TRUE(make_forward_params(a, AttentionOptions{}, &p).ok());
  int slices = 0;
  const Status st = detail::for_each_value_slice(p, 32, [&](const FwdParams&) {
    ++slices;
    return Status::success();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message.find("qv"), std::string::npos) << st.message;
  EXPECT_EQ(slices, 0);
}

}  // namespace
}  // namespace flashattn::test
