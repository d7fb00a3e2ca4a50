#include <gtest/gtest.h>

#include "common/host_tensor.h"
#include "flashattn/flashattn.h"

using namespace flashattn;

TEST(Smoke, ReferenceForwardRuns) {
  std::mt19937_64 rng(1);
  test::HostTensor q(DType::f32, {1, 4, 2, 8}), k(DType::f32, {1, 5, 2, 8}), v(DType::f32, {1, 5, 2, 8});
  test::HostTensor o(DType::f32, {1, 4, 2, 8}), lse(DType::f32, {1, 2, 4});
  q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng);
  ForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = o.view(), a.lse = lse.view();
  AttentionOptions opt;
  opt.backend = Backend::cpu_reference;
  Status st = attention_forward(a, opt);
  ASSERT_TRUE(st.ok()) << st.message;
}
