// merge_attention_states on the CPU: the float64 formula for every dtype pair, padded and varlen, strided views,
// rows without keys on either side or both, NaN LSEs; in-place accumulation; errors that name the argument and
// leave the outputs untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/merge_case.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

double storage_tolerance(DType t) { return t == DType::f32 ? 2e-6 : t == DType::f16 ? 1e-3 : 8e-3; }

TEST(MergeAttentionStates, FormulaForEveryDtypePairAndLayout) {
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  for (bool varlen : {false, true}) {
    for (DType a : dtypes) {
      for (DType b : dtypes) {
        MergeCase c(varlen, 2, 9, 3, 20, a, b, /*row_pad=*/3, 11);
        ASSERT_TRUE(merge_attention_states(c.args()).ok());
        std::vector<double> o, l;
        c.expected(&o, &l);
        const double tol = storage_tolerance(a) + storage_tolerance(b);
        EXPECT_TRUE(merged_close(c.out.values(), o, tol)) << dtype_name(a) << " + " << dtype_name(b);
        EXPECT_TRUE(merged_close(c.lse.values(), l, 1e-6));
      }
    }
  }
}

TEST(MergeAttentionStates, AccumulatesInPlace) {
  MergeCase c(false, 1, 6, 2, 8, DType::f32, DType::bf16, 0, 3);
  std::vector<double> o, l;
  c.expected(&o, &l);
  MergeArgs a = c.args();
  a.out = a.out_a;  // out_a and lse_a become the merge
  a.lse = a.lse_a;
  ASSERT_TRUE(merge_attention_states(a).ok());
  EXPECT_TRUE(merged_close(c.out_a.values(), o, 2e-6));
  EXPECT_TRUE(merged_close(c.lse_a.values(), l, 1e-6));
}

TEST(MergeAttentionStates, LseOutputIsOptional) {
  MergeCase c(true, 1, 5, 2, 4, DType::f32, DType::f32, 0, 5);
  MergeArgs a = c.args();
  a.lse = TensorView{};
  ASSERT_TRUE(merge_attention_states(a).ok());
  std::vector<double> o, l;
  c.expected(&o, &l);
  EXPECT_TRUE(merged_close(c.out.values(), o, 2e-6));
}

TEST(MergeAttentionStates, RejectsBadArgumentsBeforeWriting) {
  MergeCase c(false, 1, 4, 2, 8, DType::f32, DType::f32, 0, 7);
  HostTensor wrong_lse(DType::f32, {1, 4, 2});
  HostTensor f64(DType::f64, {1, 4, 2, 8});
  HostTensor out_f16(DType::f16, {1, 4, 2, 8});
  HostTensor rank2(DType::f32, {4, 8});
  struct Bad {
    const char* what;
    std::function<void(MergeArgs&)> edit;
    std::string message;
  };
  const Bad bad[] = {
      {"missing out_b", [](MergeArgs& a) { a.out_b = TensorView{}; }, "out_b: required"},
      {"lse_b's shape", [&](MergeArgs& a) { a.lse_b = wrong_lse.view(); }, "lse_b: expected shape [1, 2, 4]"},
      {"out_b's dtype", [&](MergeArgs& a) { a.out_b = f64.view(); }, "out_b: expected float32, float16 or bfloat16"},
      {"out's dtype", [&](MergeArgs& a) { a.out = out_f16.view(); }, "out: expected dtype float32"},
      {"out_a's rank", [&](MergeArgs& a) { a.out_a = rank2.view(); }, "out_a: expected [batch, seqlen, heads"},
      {"device", [](MergeArgs& a) { a.lse_b.device = Device{DeviceType::cuda, 0}; }, "lse_b: on cuda:0"},
      {"overlap", [](MergeArgs& a) { a.out.data = static_cast<float*>(a.out_b.data) + 8; }, "out: overlaps out_b"},
      {"lse overlapping out", [](MergeArgs& a) { a.lse = a.out; a.lse.rank = 3; a.lse.shape[0] = 1;
                                                 a.lse.shape[1] = 2; a.lse.shape[2] = 4; a.lse.stride[2] = 1; },
       "lse: overlaps out"},
      {"threads", [](MergeArgs& a) { a.num_threads = -1; }, "num_threads"},
  };
  for (const Bad& b : bad) {
    MergeArgs a = c.args();
    b.edit(a);
    const Status st = merge_attention_states(a);
    EXPECT_EQ(st.code, ErrorCode::invalid_argument) << b.what;
    EXPECT_NE(st.message.find(b.message), std::string::npos) << b.what << ": " << st.message;
  }
  for (double v : c.out.values()) EXPECT_TRUE(std::isnan(v));  // still the poison: nothing written
}

}  // namespace
}  // namespace flashattn::test
