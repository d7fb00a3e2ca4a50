// merge_attention_states on CUDA: the float64 formula for every dtype pair, padded and varlen, aligned rows
// (vector path) and padded rows (scalar path), rows without keys, NaN LSEs; in-place accumulation.
#include <gtest/gtest.h>

#include <vector>

#include "common/merge_case.h"
#include "device_tensor.h"

namespace flashattn::test {
namespace {

double storage_tolerance(DType t) { return t == DType::f32 ? 2e-6 : t == DType::f16 ? 1e-3 : 8e-3; }

struct DeviceMerge {
  DeviceTensor oa, la, ob, lb, o, l;
  explicit DeviceMerge(const MergeCase& c) : oa(c.out_a), la(c.lse_a), ob(c.out_b), lb(c.lse_b), o(c.out), l(c.lse) {}
  MergeArgs args(const MergeCase& c) const {
    return c.args(Device{DeviceType::cuda, 0}, oa.data(), la.data(), ob.data(), lb.data(), o.data(), l.data());
  }
};

TEST(GpuMerge, FormulaForEveryDtypePairLayoutAndAlignment) {
  FA_REQUIRE_GPU();
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  for (bool varlen : {false, true}) {
    for (int64_t pad : {0, 1}) {  // 0: every row 16-byte aligned (vector path); 1: not (scalar path)
      for (int64_t d : {8, 64, 200}) {
        for (DType a : dtypes) {
          for (DType b : dtypes) {
            MergeCase c(varlen, 2, 33, 3, d, a, b, pad, 17);
            DeviceMerge dev(c);
            ASSERT_TRUE(merge_attention_states(dev.args(c)).ok());
            FA_CUDA_CHECK(cudaDeviceSynchronize());
            dev.o.download(c.out);
            dev.l.download(c.lse);
            std::vector<double> o, l;
            c.expected(&o, &l);
            const double tol = storage_tolerance(a) + storage_tolerance(b);
            EXPECT_TRUE(merged_close(c.out.values(), o, tol))
                << dtype_name(a) << " + " << dtype_name(b) << " varlen " << varlen << " pad " << pad << " d " << d;
            EXPECT_TRUE(merged_close(c.lse.values(), l, 1e-6));
          }
        }
      }
    }
  }
}

TEST(GpuMerge, AccumulatesInPlace) {
  FA_REQUIRE_GPU();
  MergeCase c(false, 3, 70, 4, 128, DType::f32, DType::bf16, 0, 23);
  std::vector<double> o, l;
  c.expected(&o, &l);
  DeviceMerge dev(c);
  MergeArgs a = dev.args(c);
  a.out = a.out_a;
  a.lse = a.lse_a;
  ASSERT_TRUE(merge_attention_states(a).ok());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  dev.oa.download(c.out_a);
  dev.la.download(c.lse_a);
  EXPECT_TRUE(merged_close(c.out_a.values(), o, 2e-6));
  EXPECT_TRUE(merged_close(c.lse_a.values(), l, 1e-6));
}

}  // namespace
}  // namespace flashattn::test
