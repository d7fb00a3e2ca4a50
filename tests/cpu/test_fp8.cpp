// float8_e4m3fn inputs on the CPU backends: the forward over the dequantised inputs (e4m3 value x its fp32 descale)
// against the float64 oracle of those values, padded and varlen, GQA, masks, softcap, per-(sequence, KV head)
// descales given, expanded or absent, bfloat16 and float16 outputs; and the errors that name the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/host_tensor.h"
#include "common/oracle.h"
#include "cuda/sm90/fp8_v_layout.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

// Nearest e4m3fn value of x (ties to even), saturating at +-448, by search over every code: the definition the
// library's to_e4m3 (common/half.h) is checked against, and how the tests quantise their inputs.
uint8_t nearest_e4m3(float x) {
  uint8_t best = 0;
  float best_err = INFINITY;
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_to_float(uint8_t(b));
    if (std::isnan(v)) continue;
    const float err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (b & 1) == 0 && (best & 1) == 1)) best = uint8_t(b), best_err = err;
  }
  return best;
}

TEST(Fp8, DecodesEveryE4m3Value) {
  // The format: bias 7, subnormals below 2^-6, no infinities, S.1111.111 NaN, largest 448.
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)) && std::isnan(e4m3_to_float(0xff)));
  for (int b = 0; b < 0x7e; ++b) {  // positive values increase with the bits, up to 448
    EXPECT_LT(e4m3_to_float(uint8_t(b)), e4m3_to_float(uint8_t(b + 1))) << b;
  }
  EXPECT_EQ(nearest_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(nearest_e4m3(-0.3f), 0xaa);  // -0.3 between -0.28125 (0xa9) and -0.3125 (0xaa): the nearer
}

// The library's rounding to e4m3 (rotated cache rows): every code, every midpoint between neighbours (ties to even)
// and a hair either side of it, the saturation, NaN, and random values over the whole range.
TEST(Fp8, LibraryRoundingIsNearestEvenSaturating) {
  std::vector<float> probes = {0.0f, 447.9f, 448.0f, 464.0f, 480.0f, 1e6f, 0x1p-10f, 0x1p-11f};
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = e4m3_to_float(uint8_t(b)), hi = e4m3_to_float(uint8_t(b + 1)), mid = (lo + hi) / 2;
    for (float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) probes.push_back(x);
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) probes.push_back(std::exp2(exponent(rng)));
  int wrong = 0;
  for (float x : probes)
    for (float v : {x, -x}) {
      // Compared as values (the search returns +0 for what rounds to zero; the library keeps the sign, as the
      // hardware conversion does: checked below).
      const float got = e4m3_to_float(to_e4m3(v)), want = e4m3_to_float(nearest_e4m3(v));
      if (got != want && wrong++ < 5) ADD_FAILURE() << v << ": " << got << " vs " << want;
    }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(to_e4m3(-0x1p-11f), 0x80);
  EXPECT_EQ(to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(to_e4m3(0x1p-10f), 0x00);  // the tie between 0 and the smallest subnormal 2^-9: to even
  EXPECT_EQ(to_e4m3(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(to_e4m3(-1000.0f), 0xfe);
  EXPECT_TRUE(std::isnan(e4m3_to_float(to_e4m3(NAN))));
}

// The Hopper FP8 forward's V_t (src/cuda/sm90/fp8_v_layout.h), checked on the host: the slot order is the one in
// which the A fragment of e4m3 wgmma receives P's accumulator columns, and the sequences' spans never overlap.
TEST(Fp8, VtSlotOrderIsTheAccumulatorToFragmentOrder) {
  using cuda::sm90::fp8_key_of_slot;
  std::vector<int> seen(cuda::sm90::kFp8KeyGroup, 0);
  for (int s = 0; s < cuda::sm90::kFp8KeyGroup; ++s) {
    const int key = fp8_key_of_slot(s);
    ASSERT_GE(key, 0);
    ASSERT_LT(key, cuda::sm90::kFp8KeyGroup);
    ++seen[size_t(key)];
    EXPECT_EQ(key / 16, s / 16) << "slot " << s;  // each half of a group onto itself
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), cuda::sm90::kFp8KeyGroup) << "not a permutation";
  // Thread q of a quad holds accumulator columns 2q, 2q + 1 of the 8-column blocks 0..3 of a group; its A fragment
  // bytes are K-slots 4q..4q + 3 (blocks 0, 1) and 16 + 4q.. (blocks 2, 3), in that order.
  for (int q = 0; q < 4; ++q) {
    const int keys[8] = {2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q, 16 + 2 * q, 17 + 2 * q, 24 + 2 * q, 25 + 2 * q};
    const int slots[8] = {4 * q, 4 * q + 1, 4 * q + 2, 4 * q + 3, 16 + 4 * q, 17 + 4 * q, 18 + 4 * q, 19 + 4 * q};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(fp8_key_of_slot(slots[i]), keys[i]) << "thread " << q << " byte " << i;
  }
}

TEST(Fp8, VtSequenceSpansDoNotOverlap) {
  using namespace cuda::sm90;
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t batch = 1 + int64_t(rng() % 6);
    std::vector<int64_t> lens(static_cast<size_t>(batch));
    int64_t total = 0;
    for (auto& l : lens) total += (l = int64_t(rng() % 400));
    const int64_t slots = fp8_v_row_slots(true, 0, total, batch);
    EXPECT_EQ(slots % kFp8KeyPad, 0);
    int64_t row0 = 0, end_prev = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t first = fp8_v_slot0(true, row0, b), end = first + fp8_round_to_span(lens[size_t(b)]);
      EXPECT_EQ(first % kFp8KeyPad, 0);
      EXPECT_GE(first, end_prev) << "sequence " << b << " starts inside the previous one's spans";
      EXPECT_LE(end, slots) << "sequence " << b << " past the row";
      end_prev = end, row0 += lens[size_t(b)];
    }
  }
  EXPECT_EQ(fp8_v_row_slots(false, 300, 0, 4), 384);  // padded batch: each entry its own rows
}

struct Fp8Case {
  std::string name;
  bool varlen = false;
  std::vector<int64_t> lens_q, lens_k;  // varlen: the sequences' lengths
  int64_t batch = 2, s_q = 0, s_k = 0, h_q = 4, h_kv = 2, d = 64, d_v = 64;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  int descales = 2;  // 0: none, 1: one factor expanded (stride 0), 2: per (sequence, KV head)
  DType out = DType::bf16;
};

// One e4m3 input: bytes in the call's layout and the logical dequantised values (without descale) in double.
struct Quantised {
  std::vector<uint8_t> bytes;
  std::vector<double> values;
};

Quantised quantised(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Quantised q;
  for (int64_t i = 0; i < n; ++i) {
    q.bytes.push_back(nearest_e4m3(normal(rng) * 2.0f));
    q.values.push_back(double(e4m3_to_float(q.bytes.back())));
  }
  return q;
}

TensorView view(void* data, DType dtype, std::vector<int64_t> shape) {
  return make_contiguous_view(data, dtype, Device{}, int(shape.size()), shape.data());
}

void run_case(const Fp8Case& c, Backend backend) {
  std::mt19937_64 rng(7);
  const int64_t batch = c.varlen ? int64_t(c.lens_q.size()) : c.batch;
  int64_t rows_q = c.s_q, rows_k = c.s_k;
  if (c.varlen) {
    rows_q = rows_k = 0;
    for (size_t b = 0; b < c.lens_q.size(); ++b) rows_q += c.lens_q[b], rows_k += c.lens_k[b];
  }
  const int64_t nb = c.varlen ? 1 : batch;
  Quantised q = quantised(nb * rows_q * c.h_q * c.d, rng), k = quantised(nb * rows_k * c.h_kv * c.d, rng);
  Quantised v = quantised(nb * rows_k * c.h_kv * c.d_v, rng);
  // Descales in [0.5, 2): one per (sequence, KV head), or one for all viewed with stride 0.
  std::uniform_real_distribution<float> factor(0.5f, 2.0f);
  std::vector<float> qs(size_t(batch * c.h_kv)), ks = qs, vs = qs;
  for (auto* s : {&qs, &ks, &vs})
    for (float& x : *s) x = c.descales == 1 ? 1.25f : factor(rng);
  // The logical values the oracle sees: every element times its (sequence, KV head)'s factor, in fp32 as the
  // library multiplies.
  auto seq_of_row = [&](int64_t row) {
    int64_t b = 0, start = 0;
    while (c.varlen && b + 1 < batch && start + c.lens_q[size_t(b)] <= row) start += c.lens_q[size_t(b++)];
    return b;
  };
  auto seq_of_key = [&](int64_t row) {
    int64_t b = 0, start = 0;
    while (c.varlen && b + 1 < batch && start + c.lens_k[size_t(b)] <= row) start += c.lens_k[size_t(b++)];
    return b;
  };
  auto scaled = [&](Quantised& t, int64_t rows, int64_t heads, int64_t dim, const std::vector<float>& s,
                    int64_t group, bool keys) {
    std::vector<double> out(t.values.size());
    for (int64_t i = 0; i < int64_t(out.size()); ++i) {
      const int64_t h = (i / dim) % heads, r = (i / (dim * heads)) % rows, b = i / (dim * heads * rows);
      const int64_t seq = c.varlen ? (keys ? seq_of_key(r) : seq_of_row(r)) : b;
      const float f = c.descales ? s[size_t(seq * c.h_kv + h / group)] : 1.0f;
      out[size_t(i)] = double(float(t.values[size_t(i)]) * f);
    }
    return out;
  };
  const int64_t group = c.h_q / c.h_kv;
  const std::vector<double> Q = scaled(q, rows_q, c.h_q, c.d, qs, group, false);
  const std::vector<double> K = scaled(k, rows_k, c.h_kv, c.d, ks, 1, true);
  const std::vector<double> V = scaled(v, rows_k, c.h_kv, c.d_v, vs, 1, true);
  AttnSpec spec;
  spec.causal = c.causal, spec.window_left = c.window_left, spec.window_right = c.window_right;
  spec.softcap = c.softcap;
  if (c.varlen) spec.lens_q = c.lens_q, spec.lens_k = c.lens_k;
  AttnShape shape;
  shape.batch = batch, shape.s_q = c.s_q, shape.s_k = c.s_k, shape.h_q = c.h_q, shape.h_kv = c.h_kv;
  shape.d = c.d, shape.d_v = c.d_v;
  const AttnResult want = textbook_attention<double>(shape, Q, K, V, nullptr, spec);

  std::vector<uint16_t> out(size_t(nb * rows_q * c.h_q * c.d_v), 0xffff);
  std::vector<float> lse(size_t(nb * c.h_q * rows_q), NAN);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; c.varlen && b < c.lens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + int32_t(c.lens_q[b]));
    cu_k.push_back(cu_k.back() + int32_t(c.lens_k[b]));
  }
  ForwardArgs a;
  auto shape_of = [&](int64_t rows, int64_t heads, int64_t dim) {
    return c.varlen ? std::vector<int64_t>{rows, heads, dim} : std::vector<int64_t>{batch, rows, heads, dim};
  };
  a.q = view(q.bytes.data(), DType::e4m3, shape_of(rows_q, c.h_q, c.d));
  a.k = view(k.bytes.data(), DType::e4m3, shape_of(rows_k, c.h_kv, c.d));
  a.v = view(v.bytes.data(), DType::e4m3, shape_of(rows_k, c.h_kv, c.d_v));
  a.out = view(out.data(), c.out, shape_of(rows_q, c.h_q, c.d_v));
  a.lse = c.varlen ? view(lse.data(), DType::f32, {c.h_q, rows_q}) : view(lse.data(), DType::f32, {batch, c.h_q, rows_q});
  if (c.varlen) {
    a.cu_seqlens_q = view(cu_q.data(), DType::i32, {batch + 1});
    a.cu_seqlens_k = view(cu_k.data(), DType::i32, {batch + 1});
  }
  if (c.descales) {
    for (auto [t, s] : {std::pair<TensorView*, std::vector<float>*>{&a.q_descale, &qs}, {&a.k_descale, &ks},
                        {&a.v_descale, &vs}}) {
      *t = view(s->data(), DType::f32, {batch, c.h_kv});
      if (c.descales == 1) t->stride[0] = t->stride[1] = 0;
    }
  }
  AttentionOptions o;
  o.causal = c.causal, o.window_left = c.window_left, o.window_right = c.window_right, o.softcap = c.softcap;
  o.backend = backend;
  const Status st = attention_forward(a, o);
  ASSERT_TRUE(st.ok()) << st.message;

  std::vector<double> got(out.size()), bound(out.size());
  const double u = unit_roundoff(c.out);
  for (size_t i = 0; i < out.size(); ++i) {
    got[i] = c.out == DType::bf16 ? to_float(bfloat16_t{out[i]}) : to_float(half_t{out[i]});
    bound[i] = 4 * u * (std::fabs(want.o[i]) + want.o_mag[i]) + 0x1p-22 * double(rows_k);
  }
  std::string worst;
  EXPECT_EQ(count_outside(got, want.o, bound, &worst), 0) << "out: " << worst;
  std::vector<double> got_lse(lse.begin(), lse.end()), lse_bound(lse.size());
  for (size_t i = 0; i < lse.size(); ++i) lse_bound[i] = 1e-4 * (1 + want.lse_mag[i]);
  EXPECT_EQ(count_outside(got_lse, want.lse, lse_bound, &worst), 0) << "lse: " << worst;
}

std::vector<Fp8Case> cases() {
  std::vector<Fp8Case> out;
  Fp8Case c;  // padded: batch 2
  c.name = "padded_causal", c.s_q = 33, c.s_k = 47, c.causal = true;
  out.push_back(c);
  c.name = "padded_no_descales_f16", c.descales = 0, c.out = DType::f16, c.causal = false, c.d = 128, c.d_v = 128;
  out.push_back(c);
  c.name = "padded_expanded_descale_softcap", c.descales = 1, c.out = DType::bf16, c.softcap = 8, c.h_q = 8;
  c.h_kv = 1, c.d = 64, c.d_v = 64;
  out.push_back(c);
  c = Fp8Case{};
  c.name = "varlen_window_gqa", c.varlen = true, c.lens_q = {5, 0, 17}, c.lens_k = {9, 3, 20}, c.h_q = 6, c.h_kv = 3;
  c.d = 32, c.d_v = 48, c.window_left = 4, c.window_right = 2, c.softcap = 10;
  out.push_back(c);
  return out;
}

class Fp8Forward : public ::testing::TestWithParam<std::tuple<Fp8Case, Backend>> {};

TEST_P(Fp8Forward, MatchesTheOracleOfTheDequantisedInputs) {
  run_case(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8Forward,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(Backend::cpu_reference, Backend::cpu_flash)),
                         [](const auto& i) {
                           return std::get<0>(i.param).name + "_" + backend_name(std::get<1>(i.param));
                         });

// Bad float8 calls: every error names the argument, and nothing is written.
TEST(Fp8Forward, ErrorsNameTheArgument) {
  std::vector<uint8_t> q(2 * 3 * 2 * 8, 0x38), k = q, v = q;
  std::vector<uint16_t> out(q.size(), 0xffff), out16 = out;
  std::vector<float> out32(q.size()), scales(2 * 2, 1.0f), grads(q.size());
  std::vector<int32_t> iscales(4, 1);
  auto base = [&] {
    ForwardArgs a;
    a.q = view(q.data(), DType::e4m3, {2, 3, 2, 8});
    a.k = view(k.data(), DType::e4m3, {2, 3, 2, 8});
    a.v = view(v.data(), DType::e4m3, {2, 3, 2, 8});
    a.out = view(out.data(), DType::bf16, {2, 3, 2, 8});
    return a;
  };
  struct Bad {
    const char* prefix;
    std::function<void(ForwardArgs&)> change;
  };
  std::vector<float> bad_scales = {1.0f, 0.0f, 1.0f, 1.0f};
  const std::vector<Bad> bad = {
      {"k: expected dtype float8_e4m3fn", [&](ForwardArgs& a) { a.k = view(out16.data(), DType::bf16, {2, 3, 2, 8}); }},
      {"out: float8_e4m3fn inputs write", [&](ForwardArgs& a) { a.out = view(out32.data(), DType::f32, {2, 3, 2, 8}); }},
      {"q_descale: expected shape [2, 2]", [&](ForwardArgs& a) { a.q_descale = view(scales.data(), DType::f32, {4, 1}); }},
      {"k_descale: expected dtype float32", [&](ForwardArgs& a) { a.k_descale = view(iscales.data(), DType::i32, {2, 2}); }},
      {"v_descale: must be finite and > 0", [&](ForwardArgs& a) { a.v_descale = view(bad_scales.data(), DType::f32, {2, 2}); }},
  };
  for (const Bad& b : bad) {
    ForwardArgs a = base();
    b.change(a);
    const Status st = attention_forward(a, {});
    EXPECT_FALSE(st.ok()) << b.prefix;
    EXPECT_EQ(st.message.rfind(b.prefix, 0), 0u) << st.message;
  }
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t x) { return x == 0xffff; })) << "out was written";
  // Descales with 16-bit inputs and the backward's dtypes: refused, naming the argument.
  ForwardArgs a16;
  a16.q = a16.k = a16.v = view(out16.data(), DType::bf16, {2, 3, 2, 8});
  a16.out = view(out.data(), DType::bf16, {2, 3, 2, 8});
  a16.q_descale = view(scales.data(), DType::f32, {2, 2});
  Status st = attention_forward(a16, {});
  EXPECT_EQ(st.message.rfind("q_descale: descale factors go with float8_e4m3fn inputs", 0), 0u) << st.message;
  BackwardArgs b;
  static_cast<ForwardArgs&>(b) = base();
  std::vector<float> lse(2 * 2 * 3);
  b.lse = view(lse.data(), DType::f32, {2, 2, 3});
  // The backward of float8 inputs takes an e4m3 dout and writes out's 16-bit dtype.
  b.dout = view(out16.data(), DType::bf16, {2, 3, 2, 8});
  b.dq = b.dk = b.dv = view(grads.data(), DType::f32, {2, 3, 2, 8});
  st = attention_backward(b, {});
  EXPECT_EQ(st.message.rfind("dout: ", 0), 0u) << st.message;
  b.dout = base().q;
  st = attention_backward(b, {});
  EXPECT_EQ(st.message.rfind("dq: ", 0), 0u) << st.message;
  KVCacheArgs kv;
  kv.q = base().q;
  kv.k_cache = base().k;
  kv.v_cache = base().v;
  // A float8 KV cache runs (CPU backends) and writes a 16-bit out, like the plain FP8 forward.
  kv.out = base().out;
  st = attention_with_kvcache(kv, {});
  EXPECT_TRUE(st.ok()) << st.message;
  kv.out = view(grads.data(), DType::f32, {2, 3, 2, 8});
  st = attention_with_kvcache(kv, {});
  EXPECT_EQ(st.message.rfind("out: float8_e4m3fn inputs write a bfloat16 or float16 output", 0), 0u) << st.message;
}

}  // namespace
}  // namespace flashattn::test
