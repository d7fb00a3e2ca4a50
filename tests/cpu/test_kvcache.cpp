// The KV-cache call (flash_attn_with_kvcache) on the CPU backends against the oracle over the gathered keys:
// dense and paged caches (pages 1, 16, 64, 256, shuffled), appended rows with both rotary styles, cache_batch_idx,
// cache_leftpad, GQA/MQA, causal / window / softcap, d_v != d, empty caches; and its argument checks.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common/kv_cache_case.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

struct CpuKVParam {
  KVCaseSpec spec;
  Backend backend;
};

class CpuKVCache : public ::testing::TestWithParam<CpuKVParam> {};

TEST_P(CpuKVCache, MatchesOracle) {
  KVCase c = make_kv_case(GetParam().spec);
  const KVExpected want = expected_kv(c);
  std::vector<TensorView> views;
  for (HostTensor* t : kv_tensors(c)) views.push_back(t->numel() > 0 || !t->shape().empty() ? t->view() : TensorView{});
  const Status st = attention_with_kvcache(kv_args(c, views), kv_options(c.spec, GetParam().backend));
  ASSERT_TRUE(st.ok()) << st.message;
  check_kv_results(c, want, GetParam().backend == Backend::cpu_reference ? DType::f64 : DType::f32);
}

std::vector<CpuKVParam> cpu_grid() {
  std::vector<CpuKVParam> out;
  for (const KVCaseSpec& s : kv_case_grid(false)) {
    out.push_back({s, Backend::cpu_flash});
    out.push_back({s, Backend::cpu_reference});
  }
  KVCaseSpec f32;  // fp32 runs on the CPU backends only
  f32.dtype = DType::f32, f32.page_size = 16, f32.s_new = 2, f32.rotary_dim = 16, f32.causal = true;
  out.push_back({f32, Backend::cpu_flash});
  // The CPU flash path's few-row products (a cache call's query block of at most one vector of rows): head dims with
  // a tail of every size past whole vectors, d_v != d, every row count's tail (GQA-packed or not), key counts off
  // the key passes, dense and paged caches, fp32 / bf16 / fp16.
  const int64_t dims[][2] = {{33, 17}, {59, 59}, {72, 40}, {8, 250}, {250, 8}, {100, 100}, {127, 129}};
  const int64_t rows[] = {1, 3, 6, 13};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  int n = 0;
  for (const auto& dd : dims)
    for (int64_t sq : rows) {
      KVCaseSpec s;
      s.dtype = dtypes[n % 3];
      s.s_q = sq, s.h_q = 2, s.h_kv = n % 3 ? 2 : 1, s.d = dd[0], s.d_v = dd[1];
      s.capacity = 131 + 29 * n, s.page_size = n % 4 == 1 ? 16 : 0, s.full = n % 2 == 0;
      s.causal = n % 2 == 0;
      if (n % 5 == 3) s.softcap = 12;
      s.seed = uint64_t(100 + n);
      out.push_back({s, Backend::cpu_flash});
      ++n;
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, CpuKVCache, ::testing::ValuesIn(cpu_grid()),
                         [](const ::testing::TestParamInfo<CpuKVParam>& i) {
                           return i.param.spec.name() + "_" + backend_name(i.param.backend);
                         });

// Bad arguments: a clear error naming the argument, and nothing written.
class KVCacheArguments : public ::testing::Test {
 protected:
  void SetUp() override {
    KVCaseSpec s;
    s.page_size = 16, s.s_new = 2, s.rotary_dim = 16, s.batch_idx = false;
    c = make_kv_case(s);
  }
  Status call(const std::function<void(KVCacheArgs&)>& edit) {
    std::vector<TensorView> views;
    for (HostTensor* t : kv_tensors(c)) views.push_back(t->shape().empty() ? TensorView{} : t->view());
    KVCacheArgs a = kv_args(c, views);
    edit(a);
    const HostTensor k_before = c.k_cache, out_before = c.out;
    const Status st = attention_with_kvcache(a, kv_options(c.spec, Backend::cpu_flash));
    if (!st.ok()) {
      EXPECT_EQ(std::memcmp(k_before.data(), c.k_cache.data(), k_before.bytes()), 0) << "k_cache written";
    }
    return st;
  }
  void expect_error(const std::function<void(KVCacheArgs&)>& edit, const std::string& names) {
    const Status st = call(edit);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message.find(names), std::string::npos) << st.message;
  }
  KVCase c;
};

TEST_F(KVCacheArguments, Accepted) { EXPECT_TRUE(call([](KVCacheArgs&) {}).ok()); }

TEST_F(KVCacheArguments, EachBadArgumentIsNamed) {
  HostTensor wrong_i64(DType::f32, {2});
  HostTensor table_rank1(DType::i32, {c.entries * c.pages_per_entry});
  HostTensor seqlens3(DType::i32, {3});
  HostTensor k_heads(c.spec.dtype, {c.num_pages, 16, 3, c.spec.d});
  expect_error([&](KVCacheArgs& a) { a.cache_seqlens = wrong_i64.view(); }, "cache_seqlens");
  expect_error([&](KVCacheArgs& a) { a.cache_seqlens = seqlens3.view(); }, "cache_seqlens");
  expect_error([&](KVCacheArgs& a) { a.block_table = table_rank1.view(); }, "block_table");
  expect_error([&](KVCacheArgs& a) { a.k_cache = k_heads.view(); }, "k_cache");
  expect_error([&](KVCacheArgs& a) { a.v_new = TensorView{}; }, "v_new");
  expect_error([&](KVCacheArgs& a) { a.cache_seqlens = TensorView{}; }, "cache_seqlens");
  expect_error([&](KVCacheArgs& a) { a.rotary_sin = TensorView{}; }, "rotary_sin");
  expect_error([&](KVCacheArgs& a) { a.k_new = a.v_new = TensorView{}; }, "rotary_cos");
  expect_error([&](KVCacheArgs& a) { a.num_splits = -1; }, "num_splits");
  expect_error([&](KVCacheArgs& a) { a.out = TensorView{}; }, "out");
}

TEST_F(KVCacheArguments, IndexValuesAreChecked) {
  // A length past the capacity with the new rows: named after block_table (the capacity it addresses).
  const int64_t saved = int64_t(c.seqlens.get(1));
  c.seqlens.set(1, double(c.capacity - 1));
  expect_error([](KVCacheArgs&) {}, "block_table");
  c.seqlens.set(1, -1);
  expect_error([](KVCacheArgs&) {}, "cache_seqlens");
  c.seqlens.set(1, double(saved));
  // A page out of range in a used row.
  c.seqlens.set(0, 20);
  const int32_t page = int32_t(c.block_table.get(0));
  c.block_table.set(0, double(c.num_pages));
  expect_error([](KVCacheArgs&) {}, "block_table");
  c.block_table.set(0, page);
  EXPECT_TRUE(call([](KVCacheArgs&) {}).ok());
}

TEST_F(KVCacheArguments, UncheckedIndexValuesStayInBounds) {
  // With the host check off (as under graph capture) bad values are clamped: no crash, no write outside.
  c.seqlens.set(0, 1e6);
  c.seqlens.set(1, -50);
  c.block_table.set(1, -3);
  const Status st = call([](KVCacheArgs& a) { a.check_index_values = false; });
  EXPECT_TRUE(st.ok()) << st.message;
}

}  // namespace
}  // namespace flashattn::test

namespace flashattn::test {
namespace {

// Backward params carrying a KV cache (filled by hand, as an engine may) are refused, not run as something else.
TEST(KVCacheBackward, IsRefusedWithTheReason) {
  BwdParams p;
  int32_t lengths[1] = {4};
  p.seqused_k = lengths;
  for (Backend b : {Backend::automatic, Backend::cpu_flash, Backend::cpu_reference}) {
    const Status st = run_backward(p, b);
    EXPECT_EQ(st.code, ErrorCode::unsupported) << backend_name(b);
    EXPECT_NE(st.message.find("inference only"), std::string::npos) << st.message;
  }
}

}  // namespace
}  // namespace flashattn::test
