// FA3's qv term (ForwardArgs::qv, KVCacheArgs::qv): every score becomes scale · (q·k + qv·v). Checked against the
// identity it stands for: the same attention with q' = [q | qv] and k' = [k | v] (d + d_v columns) and the scale
// given explicitly, run without qv (the path every other test checks against the oracle); and the refusals of
// arguments that do not fit it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

// [.., a] and [.., b] (same leading shape) -> [.., a + b], contiguous.
HostTensor concat_last(const HostTensor& a, const HostTensor& b) {
  std::vector<int64_t> shape = a.shape();
  const int64_t na = a.shape().back(), nb = b.shape().back();
  shape.back() = na + nb;
  HostTensor out(a.dtype(), shape);
  const int64_t rows = a.numel() / na;
  for (int64_t r = 0; r < rows; ++r) {
    // Row r of each tensor: its leading index from r, then the columns.
    std::vector<int64_t> idx(shape.size(), 0);
    int64_t rest = r;
    for (int i = int(shape.size()) - 2; i >= 0; --i) idx[size_t(i)] = rest % shape[size_t(i)], rest /= shape[size_t(i)];
    for (int64_t c = 0; c < na + nb; ++c) {
      idx.back() = c < na ? c : c - na;
      const double x = c < na ? a.get(a.offset(idx)) : b.get(b.offset(idx));
      idx.back() = c;
      out.set(out.offset(idx), x);
    }
  }
  return out;
}

double max_rel_diff(const HostTensor& x, const HostTensor& y) {
  return max_error_relative_above_one(x.values(), y.values());
}

double tolerance(DType dt) { return dt == DType::f64 ? 1e-12 : 2e-5; }

struct QvCase {
  DType dtype;
  bool varlen, causal;
  double softcap;
  int64_t h_q, h_kv, d, dv;
};

class QueryValue : public ::testing::TestWithParam<std::tuple<QvCase, Backend>> {};

TEST_P(QueryValue, EqualsTheConcatenatedProduct) {
  const auto& [c, backend] = GetParam();
  const int64_t b = 2, sq = 6, sk = 9, total_q = 10, total_k = 13;
  HostTensor q, k, v, qv, out, lse, cu_q, cu_k;
  if (c.varlen) {
    q = HostTensor(c.dtype, {total_q, c.h_q, c.d}), qv = HostTensor(c.dtype, {total_q, c.h_q, c.dv});
    k = HostTensor(c.dtype, {total_k, c.h_kv, c.d}), v = HostTensor(c.dtype, {total_k, c.h_kv, c.dv});
    out = HostTensor(c.dtype, {total_q, c.h_q, c.dv}), lse = HostTensor(DType::f32, {c.h_q, total_q});
    cu_q = cu_seqlens_of(std::vector<int>{4, 6}), cu_k = cu_seqlens_of(std::vector<int>{2, 11});  // s_q > s_k in the first: rows without keys under causal
  } else {
    q = HostTensor(c.dtype, {b, sq, c.h_q, c.d}), qv = HostTensor(c.dtype, {b, sq, c.h_q, c.dv});
    k = HostTensor(c.dtype, {b, sk, c.h_kv, c.d}), v = HostTensor(c.dtype, {b, sk, c.h_kv, c.dv});
    out = HostTensor(c.dtype, {b, sq, c.h_q, c.dv}), lse = HostTensor(DType::f32, {b, c.h_q, sq});
  }
  std::mt19937_64 rng(29);
  for (HostTensor* t : {&q, &k, &v, &qv}) t->fill_normal(rng);
  const HostTensor q_cat = concat_last(q, qv), k_cat = concat_last(k, v);
  HostTensor out_cat(out.dtype(), out.shape()), lse_cat(lse.dtype(), lse.shape());

  AttentionOptions opt;
  opt.backend = backend;
  opt.causal = c.causal;
  opt.softcap = c.softcap;
  ForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.qv = qv.view(), a.out = out.view(), a.lse = lse.view();
  if (c.varlen) a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
  Status st = attention_forward(a, opt);
  ASSERT_TRUE(st.ok()) << st.message;

  // The default scale with qv is FA3's 1 / sqrt(d + d_v): the concatenation's own default.
  ForwardArgs cat = a;
  cat.q = q_cat.view(), cat.k = k_cat.view(), cat.qv = TensorView(), cat.out = out_cat.view(), cat.lse = lse_cat.view();
  st = attention_forward(cat, opt);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_LE(max_rel_diff(out, out_cat), tolerance(c.dtype));
  EXPECT_LE(max_rel_diff(lse, lse_cat), tolerance(c.dtype));

  // An explicit scale applies to both products.
  opt.softmax_scale = 0.37;
  ASSERT_TRUE(attention_forward(a, opt).ok());
  ASSERT_TRUE(attention_forward(cat, opt).ok());
  EXPECT_LE(max_rel_diff(out, out_cat), tolerance(c.dtype));
  EXPECT_LE(max_rel_diff(lse, lse_cat), tolerance(c.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, QueryValue,
    ::testing::Combine(::testing::Values(QvCase{DType::f64, false, false, 0.0, 4, 1, 24, 40},
                                         QvCase{DType::f64, true, true, 0.0, 2, 2, 8, 72},
                                         QvCase{DType::f32, false, true, 3.0, 4, 2, 16, 48},
                                         QvCase{DType::f32, true, false, 0.0, 3, 1, 64, 128}),
                       ::testing::Values(Backend::cpu_reference, Backend::cpu_flash)),
    [](const auto& info) {
      const QvCase& c = std::get<0>(info.param);
      return std::string(dtype_name(c.dtype)) + (c.varlen ? "_varlen" : "_padded") + (c.causal ? "_causal" : "") +
             (c.softcap > 0 ? "_softcap" : "") + "_h" + std::to_string(c.h_q) + "_" + std::to_string(c.h_kv) + "_d" +
             std::to_string(c.d) + "_" + std::to_string(c.dv) + "_" + backend_name(std::get<1>(info.param));
    });

// The KV-cache path: appended rows, rotary on q and the new keys (the first rotary_dim columns of [k | v] are k's),
// a paged cache; qv is not rotated, so the identity holds with the rotation in place.
TEST(QueryValueKVCache, EqualsTheConcatenatedProduct) {
  for (Backend backend : {Backend::cpu_reference, Backend::cpu_flash}) {
    const int64_t b = 2, sq = 3, s_new = 2, hq = 4, hkv = 2, d = 16, dv = 32, page = 4, pages = 8, rot = 8;
    const DType dt = DType::f64;
    HostTensor q(dt, {b, sq, hq, d}), qv(dt, {b, sq, hq, dv}), k_new(dt, {b, s_new, hkv, d}),
        v_new(dt, {b, s_new, hkv, dv}), k_cache(dt, {pages, page, hkv, d}), v_cache(dt, {pages, page, hkv, dv});
    HostTensor cos(dt, {16, rot / 2}), sin(dt, {16, rot / 2}), seqlens(DType::i32, {b}), table(DType::i32, {b, 4});
    std::mt19937_64 rng(31);
    for (HostTensor* t : {&q, &qv, &k_new, &v_new, &k_cache, &v_cache}) t->fill_normal(rng);
    for (int64_t i = 0; i < 16 * rot / 2; ++i) cos.set(i, std::cos(0.1 * double(i))), sin.set(i, std::sin(0.1 * double(i)));
    seqlens.set(0, 5), seqlens.set(1, 9);
    const int32_t pages_of[2][4] = {{6, 1, 3, 0}, {2, 7, 5, 4}};
    for (int64_t e = 0; e < b; ++e)
      for (int64_t p = 0; p < 4; ++p) table.set(e * 4 + p, pages_of[e][p]);
    // The concatenated problem, from the caches as they are before the first call appends to them.
    HostTensor k_cache_cat = concat_last(k_cache, v_cache), v_cache_cat = v_cache;
    const HostTensor k_new_cat = concat_last(k_new, v_new), q_cat = concat_last(q, qv);
    HostTensor out(dt, {b, sq, hq, dv}), out_cat(dt, {b, sq, hq, dv});

    AttentionOptions opt;
    opt.backend = backend;
    opt.causal = true;
    KVCacheArgs a;
    a.q = q.view(), a.qv = qv.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view(), a.out = out.view();
    a.k_new = k_new.view(), a.v_new = v_new.view(), a.rotary_cos = cos.view(), a.rotary_sin = sin.view();
    a.cache_seqlens = seqlens.view(), a.block_table = table.view(), a.rotary_interleaved = false;
    Status st = attention_with_kvcache(a, opt);
    ASSERT_TRUE(st.ok()) << st.message;

    KVCacheArgs cat = a;
    cat.q = q_cat.view(), cat.qv = TensorView(), cat.k_cache = k_cache_cat.view(), cat.v_cache = v_cache_cat.view();
    cat.k_new = k_new_cat.view(), cat.out = out_cat.view();
    st = attention_with_kvcache(cat, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    EXPECT_LE(max_rel_diff(concat_last(k_cache, v_cache), k_cache_cat), 0.0) << "the appended rows differ";
    EXPECT_LE(max_rel_diff(out, out_cat), tolerance(dt)) << backend_name(backend);
  }
}

TEST(QueryValue, BadArgumentsAreNamedAndNothingIsWritten) {
  const int64_t b = 1, s = 3, h = 2, d = 8, dv = 16;
  HostTensor q(DType::f32, {b, s, h, d}), k(DType::f32, {b, s, h, d}), v(DType::f32, {b, s, h, dv});
  HostTensor out(DType::f32, {b, s, h, dv}), lse(DType::f32, {b, h, s});
  HostTensor qv_short(DType::f32, {b, s, h, d}), qv_f64(DType::f64, {b, s, h, dv}), qv(DType::f32, {b, s, h, dv});
  std::mt19937_64 rng(5);
  for (HostTensor* t : {&q, &k, &v, &qv}) t->fill_normal(rng);
  out.poison();
  const std::vector<double> before = out.values();
  ForwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
  auto expect = [&](const TensorView& bad, ErrorCode code, const char* what) {
    a.qv = bad;
    const Status st = attention_forward(a);
    EXPECT_EQ(st.code, code) << what << ": " << st.message;
    EXPECT_EQ(st.message.rfind("qv:", 0), 0u) << what << ": " << st.message;
  };
  expect(qv_short.view(), ErrorCode::invalid_argument, "d columns instead of d_v");
  expect(qv_f64.view(), ErrorCode::invalid_argument, "another dtype");
  const std::vector<double> after = out.values();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(double)), 0);

  // Forward only: the backward is refused, by validation and by the dispatcher for params filled directly.
  BackwardArgs g;
  static_cast<ForwardArgs&>(g) = a;
  g.qv = qv.view();
  HostTensor dout(DType::f32, out.shape()), dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv_(DType::f32, v.shape());
  g.dout = dout.view(), g.dq = dq.view(), g.dk = dk.view(), g.dv = dv_.view();
  Status st = attention_backward(g);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  EXPECT_EQ(st.message.rfind("qv:", 0), 0u) << st.message;
  g.qv = TensorView();
  BwdParams p;
  ASSERT_TRUE(make_backward_params(g, {}, &p).ok());
  p.qv = qv.data();
  st = run_backward(p, Backend::cpu_flash);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  EXPECT_EQ(st.message.rfind("qv:", 0), 0u) << st.message;

  // float8 inputs do not take it.
  HostTensor q8(DType::e4m3, {b, s, h, d}), k8(DType::e4m3, {b, s, h, d}), v8(DType::e4m3, {b, s, h, dv});
  HostTensor qv8(DType::e4m3, {b, s, h, dv}), out16(DType::bf16, {b, s, h, dv});
  ForwardArgs f8;
  f8.q = q8.view(), f8.k = k8.view(), f8.v = v8.view(), f8.qv = qv8.view(), f8.out = out16.view();
  st = attention_forward(f8);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  EXPECT_EQ(st.message.rfind("qv:", 0), 0u) << st.message;
}

}  // namespace
}  // namespace flashattn::test
