// The CPU flash path against the fp64 reference, forward and backward, over a grid shaped like real use and its
// edges: lengths 1, 2, 17, 127 (and a few at 1000), s_q > s_k and s_q < s_k with causal, GQA ratios 1, 2, 8,
// head dims 8..256 with d_v != d, both layouts and padded rows, windows with and without causal, softcap,
// varlen with empty sequences, fully masked rows, softmax scales other than 1/√d, ALiBi (both slope shapes, with
// every mask, softcap, GQA and varlen), chunked attention, decode shapes (GQA-packed tiles), all four dtypes.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "cpu/attention_problem.h"

namespace flashattn::test {
namespace {

AttnCase base(DType dt, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t dv) {
  AttnCase c;
  c.dtype = dt;
  c.s_q = sq, c.s_k = sk, c.h_q = hq, c.h_kv = hkv, c.d = d, c.dv = dv;
  return c;
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

std::vector<AttnCase> grid_cases() {
  std::vector<AttnCase> cases;
  // Lengths, square and not, with and without causal (s_q > s_k causal leaves the first rows fully masked).
  const int64_t lens[][2] = {{1, 1}, {2, 2}, {17, 17}, {127, 127}, {1, 127}, {127, 1}, {17, 2}, {2, 17}, {127, 17}, {17, 127}};
  for (DType dt : kDtypes)
    for (const auto& l : lens)
      for (bool causal : {false, true}) {
        AttnCase c = base(dt, l[0], l[1], 2, 1, 40, 40);
        c.causal = causal;
        cases.push_back(c);
      }
  // Head dims, including non-powers of two, d_v != d and d_v past 256 (FA3's MLA shape: 64 / 512).
  const int64_t dims[][2] = {{8, 8}, {24, 24}, {64, 64}, {80, 80}, {96, 96}, {128, 128}, {160, 160}, {256, 256},
                             {64, 32}, {40, 72}, {256, 8}, {8, 256}, {33, 17}, {64, 512}};
  for (DType dt : {DType::f32, DType::bf16})
    for (const auto& dd : dims) {
      AttnCase c = base(dt, 33, 70, 2, 2, dd[0], dd[1]);
      c.causal = dd[0] % 16 == 0;
      cases.push_back(c);
    }
  // GQA ratios 1, 2, 8 in both layouts, with padded rows.
  const int64_t heads[][2] = {{3, 3}, {4, 2}, {8, 1}, {16, 2}};
  for (const auto& hh : heads)
    for (Layout layout : {Layout::bshd, Layout::bhsd}) {
      AttnCase c = base(DType::f32, 50, 90, hh[0], hh[1], 32, 48);
      c.batch = 2;
      c.layout = layout;
      c.pad = layout == Layout::bhsd ? 5 : 0;
      c.causal = true;
      cases.push_back(c);
    }
  // Windows with and without causal, and softcap, for s_q < s_k, s_q > s_k and square.
  struct Win {
    bool causal;
    int64_t left, right;
  };
  const Win wins[] = {{false, 16, 4}, {true, 8, -1}, {false, 0, -1}, {false, -1, 3}, {true, 0, -1}, {false, 0, 0}};
  const int64_t wlens[][2] = {{60, 100}, {100, 60}, {80, 80}};
  for (const Win& w : wins)
    for (const auto& l : wlens)
      for (double cap : {0.0, 15.0}) {
        AttnCase c = base(DType::f32, l[0], l[1], 2, 1, 64, 64);
        c.causal = w.causal, c.window_left = w.left, c.window_right = w.right, c.softcap = cap;
        cases.push_back(c);
      }
  for (DType dt : kDtypes) {
    AttnCase c = base(dt, 70, 90, 4, 2, 48, 48);
    c.causal = true, c.window_left = 20, c.softcap = 5;
    c.layout = Layout::bhsd, c.pad = 2;
    cases.push_back(c);
  }
  // Varlen, empty sequences included (on either side), with masks.
  const std::vector<std::vector<int32_t>> vq = {{5, 0, 17, 1}, {0, 0}, {127, 3, 64}, {1, 2, 0, 40}};
  const std::vector<std::vector<int32_t>> vk = {{7, 3, 0, 20}, {4, 0}, {60, 90, 64}, {1, 5, 9, 0}};
  for (size_t i = 0; i < vq.size(); ++i)
    for (DType dt : kDtypes) {
      AttnCase c = base(dt, 0, 0, 4, 2, 32, 24);
      c.lens_q = vq[i], c.lens_k = vk[i];
      c.causal = i % 2 == 0;
      c.window_left = i == 2 ? 30 : -1;
      c.softcap = i == 3 ? 10 : 0;
      c.layout = dt == DType::f16 ? Layout::bhsd : Layout::bshd;
      c.pad = dt == DType::bf16 ? 1 : 0;
      cases.push_back(c);
    }
  // A softmax scale of the caller's (not 1/√d), forward and backward, with masks, softcap, GQA and varlen.
  for (DType dt : kDtypes) {
    AttnCase c = base(dt, 45, 70, 4, 2, 32, 40);
    c.softmax_scale = dt == DType::f32 ? 0.37 : 1.1;
    c.causal = dt != DType::f64;
    c.softcap = dt == DType::bf16 ? 6 : 0;
    cases.push_back(c);
    c.lens_q = {5, 0, 40}, c.lens_k = {9, 3, 33};
    c.window_left = 7;
    cases.push_back(c);
  }
  // ALiBi: both slope shapes, without and with causal, s_q < s_k, s_q > s_k, GQA, windows, softcap, varlen.
  {
    using A = AttnCase::Alibi;
    const int64_t alens[][2] = {{33, 70}, {70, 33}, {64, 64}, {1, 90}};
    for (DType dt : kDtypes)
      for (const auto& l : alens)
        for (bool causal : {false, true}) {
          AttnCase c = base(dt, l[0], l[1], 4, 2, 32, 24);
          c.batch = 2;
          c.causal = causal;
          c.alibi = causal ? A::per_batch : A::per_head;
          cases.push_back(c);
        }
    AttnCase c = base(DType::f32, 80, 100, 4, 1, 64, 64);
    c.window_left = 20, c.window_right = 5, c.alibi = A::per_head;
    cases.push_back(c);
    c.causal = true, c.window_right = -1, c.softcap = 8, c.alibi = A::per_batch;
    cases.push_back(c);
    c = base(DType::bf16, 0, 0, 4, 2, 48, 48);
    c.lens_q = {5, 0, 70, 1}, c.lens_k = {9, 3, 60, 40};
    for (bool causal : {false, true}) {
      c.causal = causal;
      c.alibi = causal ? A::per_batch : A::per_head;
      cases.push_back(c);
    }
    c = base(DType::f32, 600, 900, 8, 8, 32, 32);  // 512-row query blocks
    c.alibi = A::per_head;
    cases.push_back(c);
  }
  // Dropout: every dtype, with masks, s_q != s_k, GQA, softcap, ALiBi, varlen, a saturated p and a tiny one.
  {
    const int64_t dlens[][2] = {{33, 70}, {70, 33}, {64, 64}};
    for (DType dt : kDtypes)
      for (const auto& l : dlens)
        for (bool causal : {false, true}) {
          AttnCase c = base(dt, l[0], l[1], 4, 2, 32, 24);
          c.batch = 2, c.causal = causal, c.dropout_p = causal ? 0.17 : 0.5;
          c.dropout_seed = uint64_t(l[0] * 1000 + l[1]);
          cases.push_back(c);
        }
    AttnCase c = base(DType::f32, 80, 100, 4, 1, 64, 64);
    c.window_left = 20, c.window_right = 5, c.softcap = 8, c.alibi = AttnCase::Alibi::per_batch, c.dropout_p = 0.3;
    cases.push_back(c);
    c = base(DType::bf16, 0, 0, 4, 2, 48, 48);
    c.lens_q = {5, 0, 70, 1}, c.lens_k = {9, 3, 60, 40}, c.causal = true, c.dropout_p = 0.1, c.dropout_offset = 12345;
    cases.push_back(c);
    c = base(DType::f32, 40, 40, 2, 2, 16, 16);
    c.dropout_p = 0.95;
    cases.push_back(c);
    c.dropout_p = 1e-4;
    cases.push_back(c);
    c = base(DType::f32, 600, 900, 8, 8, 32, 32);  // 512-row query blocks
    c.dropout_p = 0.2;
    cases.push_back(c);
  }
  // Chunked attention (attention_chunk): chunks shorter than a key block and crossing the blocks' edges, about a
  // block, and longer than the keys; with and without causal and windows, s_q < s_k, s_q > s_k (rows above the
  // first key see nothing), GQA, softcap, ALiBi, dropout, varlen, every dtype.
  {
    const int64_t clens[][2] = {{70, 130}, {130, 70}, {96, 96}};
    const int64_t chunks[] = {1, 13, 64, 100, 1000};
    for (const auto& l : clens)
      for (int64_t chunk : chunks)
        for (bool causal : {false, true}) {
          AttnCase c = base(kDtypes[size_t(chunk) % 4], l[0], l[1], 4, 2, 32, 24);
          c.causal = causal, c.attention_chunk = chunk;
          cases.push_back(c);
        }
    AttnCase c = base(DType::f32, 150, 200, 4, 1, 64, 64);
    c.attention_chunk = 48, c.window_left = 20, c.window_right = 5, c.softcap = 8;
    cases.push_back(c);
    c.causal = true, c.window_right = -1, c.alibi = AttnCase::Alibi::per_batch, c.dropout_p = 0.2;
    cases.push_back(c);
    c = base(DType::bf16, 0, 0, 4, 2, 48, 48);
    c.lens_q = {5, 0, 70, 1, 90}, c.lens_k = {9, 3, 60, 40, 130}, c.attention_chunk = 32;
    for (bool causal : {false, true}) {
      c.causal = causal;
      cases.push_back(c);
    }
    c = base(DType::f32, 600, 900, 8, 8, 32, 32);  // 512-row query blocks
    c.attention_chunk = 200, c.causal = true;
    cases.push_back(c);
  }
  // Random combinations of every axis (kept small: this grid also runs under the sanitizers).
  std::mt19937_64 rng(20261129);
  auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  const int64_t rl[] = {1, 2, 5, 17, 31, 64, 65, 100, 127};
  const int64_t rd[] = {8, 16, 24, 40, 64, 72, 96, 128, 200, 256};
  const int64_t rh[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {8, 1}, {8, 4}};
  for (int n = 0; n < 60; ++n) {
    const auto& hh = rh[pick(6)];
    AttnCase c = base(kDtypes[pick(4)], rl[pick(9)], rl[pick(9)], hh[0], hh[1], rd[pick(10)], rd[pick(10)]);
    c.batch = 1 + pick(2);
    c.causal = pick(2) == 1;
    c.window_left = pick(3) == 0 ? pick(40) : -1;
    c.window_right = pick(4) == 0 ? pick(10) : -1;
    c.softcap = pick(4) == 0 ? 20 : 0;
    c.softmax_scale = pick(3) == 0 ? 0.05 * double(1 + pick(20)) : 0;
    c.layout = pick(2) ? Layout::bhsd : Layout::bshd;
    c.pad = pick(3) == 0 ? 7 : 0;
    cases.push_back(c);
  }
  // Decode shapes, where the forward packs a KV group's query heads into the columns of one tile (s_q x group up to
  // the query block): GQA 4 / 8 / 32 and MQA, causal (bottom-right), windows, softcap, chunks, both layouts with
  // padded rows, varlen with an empty sequence, and s_q x group past the packing limit.
  {
    const int64_t decode_heads[][2] = {{8, 2}, {32, 8}, {8, 1}, {32, 1}};
    const int64_t decode_sq[] = {1, 2, 5, 16};
    int n = 0;
    for (const auto& hh : decode_heads)
      for (int64_t sq : decode_sq) {
        AttnCase c = base(n % 2 ? DType::bf16 : DType::f32, sq, 300 + 37 * n, hh[0], hh[1], n % 3 ? 64 : 40, 64);
        c.batch = 2;
        c.causal = n % 4 != 3;
        if (n % 5 == 1) c.window_left = 50, c.window_right = 0;
        if (n % 7 == 2) c.softcap = 15;
        if (n % 6 == 4) c.attention_chunk = 64;
        c.layout = n % 2 ? Layout::bhsd : Layout::bshd;
        c.pad = n % 3 == 0 ? 3 : 0;
        cases.push_back(c);
        ++n;
      }
    AttnCase c = base(DType::f16, 0, 0, 16, 4, 64, 64);
    c.lens_q = {1, 0, 4, 2}, c.lens_k = {200, 50, 0, 130}, c.causal = true;
    cases.push_back(c);  // varlen decode: an empty query sequence, an empty key sequence
    c = base(DType::f32, 40, 260, 16, 2, 64, 64);
    c.causal = true;
    cases.push_back(c);  // 40 x 8 packed rows: past the packing limit, per-head tasks
  }
  // Saturated softmax: scores in the thousands, most probabilities underflow to exactly 0.
  for (DType dt : {DType::f32, DType::bf16}) {
    AttnCase c = base(dt, 40, 90, 2, 1, 64, 64);
    c.input_scale = 20;
    c.causal = dt == DType::f32;
    cases.push_back(c);
  }
  // Shapes for which the forward picks 512- and 256-row query blocks (enough heads x blocks, small head dims).
  {
    AttnCase c = base(DType::f32, 1100, 700, 16, 4, 16, 24);
    c.causal = true;
    cases.push_back(c);  // 512 rows, last block partial, s_q > s_k
    c = base(DType::bf16, 600, 900, 8, 8, 32, 32);
    c.window_left = 100, c.window_right = 20;
    cases.push_back(c);  // 512 rows, two-sided window
    c = base(DType::f16, 1500, 300, 4, 2, 16, 16);
    c.causal = true, c.softcap = 10;
    cases.push_back(c);  // 256 rows, most rows fully masked
  }
  // A few at length 1000.
  {
    AttnCase c = base(DType::f32, 1000, 1000, 2, 1, 64, 64);
    c.causal = true;
    cases.push_back(c);
    c = base(DType::bf16, 1000, 1000, 1, 1, 96, 96);
    cases.push_back(c);
    c = base(DType::f16, 1000, 300, 2, 2, 64, 32);
    c.causal = true, c.window_left = 100, c.softcap = 30;
    cases.push_back(c);
    c = base(DType::f64, 200, 1000, 1, 1, 32, 32);
    c.causal = true;
    cases.push_back(c);
  }
  return cases;
}

class FlashGrid : public ::testing::TestWithParam<AttnCase> {};

TEST_P(FlashGrid, MatchesReference) {
  const AttnCase& c = GetParam();
  const AttnProblem pb(c, std::hash<std::string>{}(c.name()));
  const AttnResult ref = oracle_for(pb, true);
  const AttnResult got = run_attention(pb, Backend::cpu_flash, true);
  expect_matches_reference(c, got, ref, naive_for(pb, true, &got.o), true);
}

INSTANTIATE_TEST_SUITE_P(Cpu, FlashGrid, ::testing::ValuesIn(grid_cases()),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           return std::to_string(info.index) + "_" + info.param.name();
                         });

}  // namespace
}  // namespace flashattn::test
