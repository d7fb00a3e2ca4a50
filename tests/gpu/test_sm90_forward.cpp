// GPU tests of the Hopper forward (src/cuda/sm90/forward_sm90.cu) against the oracle (tests/common/oracle.h:
// float64 on the same rounded inputs, written apart from the library). Runs only on compute capability 9.0.
//
// Tolerance: the kernel rounds P to 16 bits before P V and rounds O once at the end; each contributes a
// relative error of about half a unit roundoff u of the storage type, so ‖O − O_ref‖ / ‖O_ref‖ ≤ 2u leaves
// room without hiding layout or masking bugs (those give errors of order 1). Per element, P's rounding moves O by
// at most u · Σ p |v| (the oracle's magnitude of the terms) and the normaliser and the store by 1.5 u |O|, so
// |O − O_ref| ≤ 4u (|O_ref| + terms) (with fp16, plus 2^-22 per visible key for probabilities that become
// subnormal), so that a bug confined to a few rows cannot hide in the norm. The LSE is accumulated in fp32 on
// exact products of the rounded inputs: |ΔLSE| ≤ 1e-3. Rows with no visible key must give O = 0 and LSE = -inf
// exactly; outputs are poisoned with NaN first, so an unwritten element fails.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/oracle.h"
#include "cuda/sm90/forward_sm90.h"
#include "gpu/device_tensor.h"
#include "gpu/sm90_primitive_kernels.h"
#include "gpu/stress.h"

namespace flashattn::test {
namespace {

struct FwdCase {
  std::string name;
  DType dtype = DType::bf16;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 2, heads_kv = 2, head_dim = 128;
  int64_t head_dim_v = 0;                 // 0: head_dim
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int64_t attention_chunk = 0;            // 0: none
  double softcap = 0;
  double softmax_scale = 0;               // 0: 1/√d
  std::vector<int> perm;                  // storage order of [b, s, h, d] (empty: contiguous)
  int64_t row_pad = 0;                    // extra elements after each head_dim row (a multiple of 8 for TMA)
  std::vector<int32_t> lens_q, lens_k;    // varlen when set
  // Standard deviation of Q's and K's elements: 3 spreads the scores over about 13 units of log2 (P's scale),
  // so a tile's row maximum sometimes jumps past the running one by more than the softmax lets it lag
  // (kStaleMaxLog2) and sometimes by less: both the rescaling and the stale-maximum paths run.
  double qk_stddev = 1.0;
};

std::ostream& operator<<(std::ostream& os, const FwdCase& c) { return os << c.name; }

// On failure: where the first few large differences are, as logical coordinates (enough to tell a layout,
// mask or tail bug apart from a rounding problem in one device run).
std::string first_mismatches(const HostTensor& got_t, const HostTensor& want_t, double tol) {
  const std::vector<double> got = got_t.values(), want = want_t.values();
  const std::vector<int64_t>& shape = got_t.shape();
  std::string out;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 6; ++i) {
    const bool bad = std::isnan(got[i]) || std::isnan(want[i]) ? !(std::isnan(got[i]) && std::isnan(want[i]))
                     : (std::isinf(got[i]) || std::isinf(want[i])) ? got[i] != want[i]
                                                                    : std::fabs(got[i] - want[i]) > tol;
    if (!bad) continue;
    std::vector<int64_t> idx(shape.size());
    int64_t rest = int64_t(i);
    for (int d = int(shape.size()) - 1; d >= 0; --d) {
      idx[size_t(d)] = rest % shape[size_t(d)];
      rest /= shape[size_t(d)];
    }
    out += "\n  at [";
    for (size_t d = 0; d < idx.size(); ++d) out += (d ? "," : "") + std::to_string(idx[d]);
    out += "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]);
    ++shown;
  }
  return out;
}

// Device copies of a forward's tensors (the host tensors' shapes, strides and padding) and the arguments that
// point at them.
struct DeviceForward {
  DeviceTensor q, k, v, out, lse;
  ForwardArgs args;
  DeviceForward(const HostTensor& hq, const HostTensor& hk, const HostTensor& hv, const HostTensor& ho,
                const HostTensor& hlse)
      : q(hq), k(hk), v(hv), out(ho), lse(hlse) {
    args.q = q.view(hq);
    args.k = k.view(hk);
    args.v = v.view(hv);
    args.out = out.view(ho);
    args.lse = lse.view(hlse);
  }
};

class Sm90Forward : public ::testing::TestWithParam<FwdCase> {};

TEST_P(Sm90Forward, MatchesReference) {
  FA_REQUIRE_GPU();
  if (flashattn::cuda_compute_capability(0) != 90) GTEST_SKIP() << "needs compute capability 9.0";
  const FwdCase c = GetParam();
  const bool varlen = !c.lens_q.empty();
  const int64_t d = c.head_dim, dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  HostTensor q, k, v, o, lse, cuq_h, cuk_h;
  int64_t max_q = c.seqlen_q, max_k = c.seqlen_k;
  if (varlen) {
    cuq_h = cu_seqlens_of(c.lens_q);
    cuk_h = cu_seqlens_of(c.lens_k);
    const int64_t total_q = int64_t(cuq_h.get(int64_t(c.lens_q.size())));
    const int64_t total_k = int64_t(cuk_h.get(int64_t(c.lens_k.size())));
    max_q = max_k = 0;
    for (int32_t l : c.lens_q) max_q = std::max<int64_t>(max_q, l);
    for (int32_t l : c.lens_k) max_k = std::max<int64_t>(max_k, l);
    q = HostTensor(c.dtype, {total_q, c.heads_q, d}, {}, c.row_pad);
    k = HostTensor(c.dtype, {total_k, c.heads_kv, d}, {}, c.row_pad);
    v = HostTensor(c.dtype, {total_k, c.heads_kv, dv}, {}, c.row_pad);
    o = HostTensor(c.dtype, {total_q, c.heads_q, dv}, {}, c.row_pad);
    lse = HostTensor(DType::f32, {c.heads_q, total_q});
  } else {
    q = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.heads_q, d}, c.perm, c.row_pad);
    k = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, d}, c.perm, c.row_pad);
    v = HostTensor(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, dv}, c.perm, c.row_pad);
    o = HostTensor(c.dtype, {c.batch, c.seqlen_q, c.heads_q, dv}, c.perm, c.row_pad);
    lse = HostTensor(DType::f32, {c.batch, c.heads_q, c.seqlen_q});
  }
  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  q.fill_normal(rng, c.qk_stddev);
  k.fill_normal(rng, c.qk_stddev);
  v.fill_normal(rng);

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  opt.window_right = c.window_right;
  opt.attention_chunk = c.attention_chunk;
  opt.softcap = c.softcap;
  opt.softmax_scale = c.softmax_scale;

  AttnSpec spec;
  spec.causal = c.causal, spec.window_left = c.window_left, spec.window_right = c.window_right;
  spec.attention_chunk = c.attention_chunk;
  spec.softcap = c.softcap, spec.softmax_scale = c.softmax_scale;
  spec.lens_q.assign(c.lens_q.begin(), c.lens_q.end());
  spec.lens_k.assign(c.lens_k.begin(), c.lens_k.end());
  const AttnResult want = oracle_attention(q, k, v, nullptr, spec);
  HostTensor o_ref = o, lse_ref = lse;
  {
    size_t i = 0;
    o_ref.for_each([&](int64_t off) { o_ref.set(off, want.o[i++]); });
    i = 0;
    lse_ref.for_each([&](int64_t off) { lse_ref.set(off, want.lse[i++]); });
  }
  // The per-element bound of the file header.
  std::vector<double> o_bound(want.o.size());
  {
    const double u = unit_roundoff(c.dtype);
    const int64_t batches = varlen ? int64_t(c.lens_q.size()) : c.batch;
    size_t e = 0;
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t sq = varlen ? c.lens_q[size_t(b)] : c.seqlen_q, sk = varlen ? c.lens_k[size_t(b)] : c.seqlen_k;
      for (int64_t i = 0; i < sq; ++i) {
        int64_t keys = 0;
        if (c.dtype == DType::f16)
          for (int64_t j = 0; j < sk; ++j) keys += spec.sees(i, j, sq, sk);
        for (int64_t x = 0; x < c.heads_q * dv; ++x, ++e)
          o_bound[e] = 4 * u * (std::fabs(want.o[e]) + want.o_mag[e]) + 0x1p-22 * double(keys);
      }
    }
  }

  o.poison();
  lse.poison();
  DeviceForward dev(q, k, v, o, lse);
  DeviceTensor dcuq, dcuk;
  ForwardArgs& a = dev.args;
  if (varlen) {
    dcuq = DeviceTensor(cuq_h);
    dcuk = DeviceTensor(cuk_h);
    a.cu_seqlens_q = dcuq.view(cuq_h);
    a.cu_seqlens_k = dcuk.view(cuk_h);
    a.max_seqlen_q = max_q;
    a.max_seqlen_k = max_k;
  }
  FwdParams p;
  Status st = make_forward_params(a, opt, &p);
  ASSERT_TRUE(st.ok()) << st.message;
  st = detail::sm90_forward_supports(p);
  ASSERT_TRUE(st.ok()) << st.message;
  // Each grid through the kernel's entry point, then once through the public entry point with automatic
  // dispatch, which must pick cuda_sm90.
  ASSERT_EQ(choose_backend(p, Backend::automatic, false).backend, Backend::cuda_sm90);
  for (int run = 0; run <= int(std::size(detail::kSm90Grids)); ++run) {
    const bool dispatched = run == int(std::size(detail::kSm90Grids));
    SCOPED_TRACE(dispatched ? std::string("attention_forward (automatic)")
                            : std::string("grid ") + detail::sm90_grid_name(detail::kSm90Grids[run]));
    o.poison();
    lse.poison();
    dev.out.upload(o);
    dev.lse.upload(lse);
    st = dispatched ? attention_forward(a, opt) : detail::sm90_forward_run(p, detail::kSm90Grids[run]);
    ASSERT_TRUE(st.ok()) << st.message;
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    dev.out.download(o);
    dev.lse.download(lse);

    const double u = unit_roundoff(c.dtype);
    const double o_err = relative_error(o.values(), o_ref.values());
    EXPECT_LT(o_err, 2 * u) << "O relative error" << first_mismatches(o, o_ref, 0.05);
    std::string worst;
    EXPECT_EQ(count_outside(o.values(), want.o, o_bound, &worst), 0)
        << "O elements outside 4u(|O_ref| + terms); worst " << worst << first_mismatches(o, o_ref, 0.05);
    EXPECT_LT(max_abs_error(lse.values(), lse_ref.values()), 1e-3) << "LSE" << first_mismatches(lse, lse_ref, 1e-3);
  }
}

std::vector<FwdCase> cases() {
  std::vector<FwdCase> v;
  auto add = [&](FwdCase c) { v.push_back(std::move(c)); };
  FwdCase c;
  c = {}; c.name = "bf16_d128_exact_tiles"; c.batch = 2; c.seqlen_q = c.seqlen_k = 256; add(c);
  c = {}; c.name = "bf16_d128_causal_tail"; c.seqlen_q = c.seqlen_k = 300; c.causal = true; add(c);
  c = {}; c.name = "f16_d64_causal_sq_lt_sk"; c.dtype = DType::f16; c.head_dim = 64; c.seqlen_q = 200; c.seqlen_k = 333;
  c.causal = true; add(c);
  c = {}; c.name = "bf16_d64_causal_sq_gt_sk_empty_rows"; c.head_dim = 64; c.seqlen_q = 300; c.seqlen_k = 100;
  c.causal = true; add(c);
  c = {}; c.name = "bf16_d256_window"; c.head_dim = 256; c.seqlen_q = c.seqlen_k = 190; c.window_left = 32;
  c.window_right = 8; add(c);
  c = {}; c.name = "f16_d256_causal"; c.dtype = DType::f16; c.head_dim = 256; c.seqlen_q = c.seqlen_k = 257;
  c.causal = true; add(c);
  c = {}; c.name = "bf16_d64_gqa"; c.head_dim = 64; c.heads_q = 6; c.heads_kv = 2; c.seqlen_q = 129; c.seqlen_k = 257;
  add(c);
  c = {}; c.name = "f16_d128_softcap"; c.dtype = DType::f16; c.seqlen_q = c.seqlen_k = 160; c.softcap = 5; add(c);
  c = {}; c.name = "bf16_d256_bhsd_layout"; c.head_dim = 256; c.seqlen_q = c.seqlen_k = 130; c.perm = {0, 2, 1, 3};
  add(c);
  c = {}; c.name = "bf16_d128_window_padded_rows"; c.seqlen_q = c.seqlen_k = 500; c.window_left = 64;
  c.window_right = 64; c.row_pad = 8; add(c);
  c = {}; c.name = "bf16_d128_varlen_causal"; c.heads_q = 4; c.heads_kv = 2; c.causal = true;
  c.lens_q = {17, 0, 300, 129}; c.lens_k = {40, 5, 300, 0}; add(c);
  c = {}; c.name = "f16_d64_varlen_window"; c.dtype = DType::f16; c.head_dim = 64; c.window_left = 20;
  c.window_right = 0; c.lens_q = {1, 250, 64}; c.lens_k = {130, 250, 1}; add(c);
  // 8 key tiles wrap hd 64's ring (2 stages up to 4k keys, 3 beyond) several times.
  c = {}; c.name = "bf16_d64_ring_wraps"; c.head_dim = 64; c.seqlen_q = 200; c.seqlen_k = 1000; add(c);
  c = {}; c.name = "bf16_d128_varlen_gqa_softcap_causal"; c.heads_q = 4; c.heads_kv = 1; c.causal = true;
  c.softcap = 20; c.lens_q = {300, 77}; c.lens_k = {513, 77}; add(c);
  // More tiles than an H200 has SMs (132), so that persistent CTAs run several tiles each (ring, Q buffer and
  // turn token carried across tiles); the varlen case also has tiles with no rows or no keys in between.
  c = {}; c.name = "bf16_d64_causal_many_tiles"; c.head_dim = 64; c.batch = 2; c.heads_q = c.heads_kv = 40;
  c.seqlen_q = c.seqlen_k = 260; c.causal = true; add(c);
  c = {}; c.name = "bf16_d128_varlen_causal_many_tiles"; c.heads_q = 24; c.heads_kv = 8; c.causal = true;
  c.lens_q = {300, 5, 0, 700}; c.lens_k = {300, 40, 10, 700}; add(c);
  // hd 64 varlen over many tiles with padded O rows: warpgroups whose rows cross a sequence's end, empty
  // sequences, and O's 16-byte stores at row strides past head_dim.
  c = {}; c.name = "bf16_d64_varlen_many_tiles_padded"; c.head_dim = 64; c.heads_q = c.heads_kv = 40;
  c.row_pad = 8; c.lens_q = {300, 5, 0, 700, 64, 128}; c.lens_k = {300, 40, 10, 700, 64, 200}; add(c);
  // Causal blocks aligned with the key tiles (every block's diagonal tile masked in its upper half for the first
  // warpgroup), more tiles than SMs: each persistent CTA reuses its Q buffer and ring across blocks.
  c = {}; c.name = "bf16_d128_causal_aligned_many_tiles"; c.heads_q = c.heads_kv = 140; c.seqlen_q = c.seqlen_k = 256;
  c.causal = true; add(c);
  // No mask, a last key tile with 44 keys, GQA, and persistent CTAs running several blocks each: 64-row blocks
  // on three pipelines per CTA up to 4k keys, 192-row blocks past them.
  c = {}; c.name = "f16_d64_key_tail_many_tiles"; c.dtype = DType::f16; c.head_dim = 64; c.heads_q = 140;
  c.heads_kv = 70; c.seqlen_q = 200; c.seqlen_k = 300; add(c);
  c = {}; c.name = "f16_d64_key_tail_many_tiles_past_short_keys"; c.dtype = DType::f16; c.head_dim = 64;
  c.heads_q = 140; c.heads_kv = 70; c.seqlen_q = 100; c.seqlen_k = 4140; add(c);
  c = {}; c.name = "f16_d256_many_tiles"; c.dtype = DType::f16; c.head_dim = 256; c.heads_q = c.heads_kv = 140;
  c.seqlen_q = 128; c.seqlen_k = 300; add(c);
  // hd 256 under a mask runs 64-key tiles: a causal diagonal crossing two key tiles per 128-row block, varlen with
  // unequal lengths, GQA and more tiles than SMs.
  c = {}; c.name = "bf16_d256_varlen_gqa_causal_many_tiles"; c.head_dim = 256; c.heads_q = 60; c.heads_kv = 20;
  c.causal = true; c.lens_q = {300, 5, 0, 450}; c.lens_k = {300, 70, 10, 400}; add(c);
  // Windows past 2^31 reach every key: the kernel's 32-bit window arguments narrow them
  // (MaskSpec::narrowest_left / right), where a truncation would leave a window of 5 and 3 keys.
  c = {}; c.name = "bf16_d64_window_past_int32"; c.head_dim = 64; c.seqlen_q = 200; c.seqlen_k = 300;
  c.window_left = (int64_t(1) << 32) + 5; c.window_right = (int64_t(1) << 32) + 3; add(c);
  c = {}; c.name = "f16_d256_window_left_only"; c.dtype = DType::f16; c.head_dim = 256; c.seqlen_q = 150;
  c.seqlen_k = 400; c.window_left = 100; add(c);
  // hd 64 runs a second kernel past 4k keys, hd 128 without a mask too (forward_config.h, ShortKeysPlan).
  c = {}; c.name = "bf16_d64_causal_past_short_keys"; c.head_dim = 64; c.seqlen_q = 200; c.seqlen_k = 4400;
  c.causal = true; add(c);
  c = {}; c.name = "f16_d64_window_past_short_keys"; c.dtype = DType::f16; c.head_dim = 64; c.seqlen_q = 4200;
  c.seqlen_k = 4200; c.window_left = 300; c.window_right = 40; c.heads_q = 1; c.heads_kv = 1; add(c);
  c = {}; c.name = "bf16_d64_past_short_keys"; c.head_dim = 64; c.seqlen_q = 130; c.seqlen_k = 4300; add(c);
  // Past 4k keys hd 64 runs 192-row blocks, whose diagonal crosses two key tiles: square, and varlen with
  // unequal query and key lengths.
  c = {}; c.name = "bf16_d64_causal_square_past_short_keys"; c.head_dim = 64; c.seqlen_q = c.seqlen_k = 4200;
  c.heads_q = 1; c.heads_kv = 1; c.causal = true; add(c);
  c = {}; c.name = "bf16_d64_varlen_causal_past_short_keys"; c.head_dim = 64; c.lens_q = {4200, 150, 700};
  c.lens_k = {4200, 4500, 500}; c.heads_q = 2; c.heads_kv = 1; c.causal = true; add(c);
  // hd 64 with at most 4k keys runs three pipelines per CTA on 64-row blocks: varlen with GQA, empty sequences
  // and more tiles than every pipeline of the grid takes at once (each carries its ring and Q buffer across
  // blocks); without a mask, a tile count that leaves pipelines of the grid without a first tile.
  c = {}; c.name = "bf16_d64_varlen_gqa_causal_pipelines"; c.head_dim = 64; c.heads_q = 48; c.heads_kv = 12;
  c.causal = true; c.lens_q = {1000, 3, 0, 513}; c.lens_k = {1000, 64, 7, 600}; add(c);
  c = {}; c.name = "f16_d64_pipelines_idle"; c.dtype = DType::f16; c.head_dim = 64; c.heads_q = c.heads_kv = 5;
  c.seqlen_q = 300; c.seqlen_k = 700; add(c);
  c = {}; c.name = "f16_d128_past_short_keys"; c.dtype = DType::f16; c.head_dim = 128; c.seqlen_q = 130;
  c.seqlen_k = 4200; add(c);
  // A caller's softmax scale (not 1/√d), with and without softcap and masks, at each head dim.
  c = {}; c.name = "bf16_d64_scale_causal"; c.head_dim = 64; c.seqlen_q = 200; c.seqlen_k = 333; c.causal = true;
  c.softmax_scale = 0.3; add(c);
  c = {}; c.name = "f16_d128_scale_softcap_varlen_gqa"; c.dtype = DType::f16; c.heads_q = 4; c.heads_kv = 2;
  c.softmax_scale = 0.05; c.softcap = 8; c.lens_q = {100, 0, 257}; c.lens_k = {300, 9, 200}; add(c);
  c = {}; c.name = "bf16_d256_scale_window"; c.head_dim = 256; c.seqlen_q = c.seqlen_k = 300; c.window_left = 50;
  c.window_right = 10; c.softmax_scale = 0.125; add(c);
  c = {}; c.name = "bf16_d128_large_scores"; c.seqlen_q = 150; c.seqlen_k = 1000; c.qk_stddev = 3; add(c);
  c = {}; c.name = "f16_d64_large_scores_causal"; c.dtype = DType::f16; c.head_dim = 64; c.seqlen_q = c.seqlen_k = 700;
  c.causal = true; c.qk_stddev = 3; add(c);
  c = {}; c.name = "bf16_d256_large_scores_softcap"; c.head_dim = 256; c.seqlen_q = 130; c.seqlen_k = 600;
  c.softcap = 30; c.qk_stddev = 3; add(c);
  c = {}; c.name = "f16_d256_large_scores"; c.dtype = DType::f16; c.head_dim = 256; c.seqlen_q = 130; c.seqlen_k = 600;
  c.qk_stddev = 3; add(c);
  // Head dims between the buckets, and d_v != d (support_checks.h: TMA's zero columns past d and d_v), through
  // each bucket's plans (short-keys plans, masks, ALiBi-free softcap), GQA, varlen and padded rows.
  c = {}; c.name = "bf16_d32_causal"; c.head_dim = 32; c.seqlen_q = c.seqlen_k = 300; c.causal = true; add(c);
  c = {}; c.name = "f16_d80"; c.dtype = DType::f16; c.head_dim = 80; c.seqlen_q = 200; c.seqlen_k = 333; add(c);
  c = {}; c.name = "bf16_d80_causal_gqa_past_short_keys"; c.head_dim = 80; c.heads_q = 4; c.heads_kv = 2;
  c.seqlen_q = 150; c.seqlen_k = 4400; c.causal = true; add(c);
  c = {}; c.name = "bf16_d96_window_softcap"; c.head_dim = 96; c.seqlen_q = c.seqlen_k = 400; c.window_left = 70;
  c.window_right = 5; c.softcap = 20; add(c);
  c = {}; c.name = "f16_d96_varlen_causal_padded"; c.dtype = DType::f16; c.head_dim = 96; c.lens_q = {130, 0, 300};
  c.lens_k = {200, 40, 300}; c.causal = true; c.row_pad = 8; add(c);
  c = {}; c.name = "bf16_d112_past_short_keys"; c.head_dim = 112; c.seqlen_q = 130; c.seqlen_k = 4200; add(c);
  c = {}; c.name = "bf16_d160_causal"; c.head_dim = 160; c.seqlen_q = c.seqlen_k = 257; c.causal = true; add(c);
  c = {}; c.name = "f16_d192_gqa_bhsd"; c.dtype = DType::f16; c.head_dim = 192; c.heads_q = 6; c.heads_kv = 2;
  c.seqlen_q = 140; c.seqlen_k = 270; c.perm = {0, 2, 1, 3}; add(c);
  c = {}; c.name = "bf16_d192_v128_causal"; c.head_dim = 192; c.head_dim_v = 128; c.seqlen_q = c.seqlen_k = 300;
  c.causal = true; add(c);
  c = {}; c.name = "bf16_d192_v128_varlen"; c.head_dim = 192; c.head_dim_v = 128; c.lens_q = {70, 260};
  c.lens_k = {300, 90}; add(c);
  // d in 129..192 beside d_v <= 128: the 192 / 128 plan (128-key tiles, V and O at 128 columns), over key tails,
  // GQA, large scores, windows with softcap, d_v below one panel, strided and padded rows, varlen with empty
  // sequences; chunked attention keeps the 192 plan (f16_d192_v128_causal_chunk128 below).
  c = {}; c.name = "bf16_d192_v128_gqa_tails_large_scores"; c.head_dim = 192; c.head_dim_v = 128; c.heads_q = 6;
  c.heads_kv = 2; c.seqlen_q = 200; c.seqlen_k = 333; c.qk_stddev = 3; add(c);
  c = {}; c.name = "f16_d144_v72_window_softcap"; c.dtype = DType::f16; c.head_dim = 144; c.head_dim_v = 72;
  c.seqlen_q = c.seqlen_k = 410; c.window_left = 90; c.window_right = 30; c.softcap = 25; add(c);
  c = {}; c.name = "bf16_d136_v128_causal_bhsd_padded"; c.head_dim = 136; c.head_dim_v = 128; c.seqlen_q = 129;
  c.seqlen_k = 257; c.causal = true; c.perm = {0, 2, 1, 3}; c.row_pad = 8; add(c);
  c = {}; c.name = "bf16_d192_v64_varlen_causal"; c.head_dim = 192; c.head_dim_v = 64; c.causal = true;
  c.lens_q = {130, 0, 300, 1}; c.lens_k = {200, 40, 300, 77}; add(c);
  // d in 65..128 beside d_v <= 64: the 128 / 64 plan (176-key tiles without a mask, 128 under one).
  c = {}; c.name = "bf16_d120_v48_gqa_tails_large_scores"; c.head_dim = 120; c.head_dim_v = 48; c.heads_q = 4;
  c.heads_kv = 1; c.seqlen_q = 190; c.seqlen_k = 555; c.qk_stddev = 3; add(c);
  c = {}; c.name = "bf16_d128_v64_varlen_causal_padded"; c.head_dim = 128; c.head_dim_v = 64; c.causal = true;
  c.lens_q = {130, 0, 300, 1}; c.lens_k = {200, 40, 300, 77}; c.row_pad = 8; add(c);
  c = {}; c.name = "f16_d128_v64_window"; c.dtype = DType::f16; c.head_dim = 128; c.head_dim_v = 64;
  c.seqlen_q = c.seqlen_k = 333; c.window_left = 40; add(c);
  c = {}; c.name = "bf16_d64_v128_causal"; c.head_dim = 64; c.head_dim_v = 128; c.seqlen_q = 200; c.seqlen_k = 260;
  c.causal = true; add(c);
  c = {}; c.name = "bf16_d40_v24_short_keys"; c.head_dim = 40; c.head_dim_v = 24; c.heads_q = 3; c.heads_kv = 3;
  c.seqlen_q = c.seqlen_k = 190; add(c);
  c = {}; c.name = "f16_d192_large_scores_softcap"; c.dtype = DType::f16; c.head_dim = 192; c.seqlen_q = 130;
  c.seqlen_k = 600; c.softcap = 30; c.qk_stddev = 3; add(c);
  // Chunked attention (the extras kernels): chunks inside a tile, across tiles, past the keys; causal, windows,
  // s_q > s_k, varlen, GQA, every head-dim bucket, the short-keys plans and the persistent grid.
  c = {}; c.name = "bf16_d128_causal_chunk40"; c.seqlen_q = c.seqlen_k = 500; c.causal = true; c.attention_chunk = 40;
  add(c);
  c = {}; c.name = "f16_d64_chunk200_sq_gt_sk"; c.dtype = DType::f16; c.head_dim = 64; c.seqlen_q = 450;
  c.seqlen_k = 300; c.attention_chunk = 200; add(c);
  c = {}; c.name = "bf16_d256_window_chunk96"; c.head_dim = 256; c.seqlen_q = 300; c.seqlen_k = 420;
  c.window_left = 50; c.window_right = 20; c.attention_chunk = 96; add(c);
  c = {}; c.name = "bf16_d128_varlen_gqa_causal_chunk7"; c.heads_q = 4; c.heads_kv = 2; c.causal = true;
  c.attention_chunk = 7; c.lens_q = {130, 0, 300, 1}; c.lens_k = {200, 40, 300, 77}; add(c);
  c = {}; c.name = "bf16_d64_causal_chunk1000_past_short_keys"; c.head_dim = 64; c.seqlen_q = c.seqlen_k = 4300;
  c.heads_q = 1; c.heads_kv = 1; c.causal = true; c.attention_chunk = 1000; add(c);
  c = {}; c.name = "f16_d192_v128_causal_chunk128"; c.dtype = DType::f16; c.head_dim = 192; c.head_dim_v = 128;
  c.seqlen_q = c.seqlen_k = 400; c.causal = true; c.attention_chunk = 128; add(c);
  c = {}; c.name = "bf16_d128_chunk_past_the_keys"; c.seqlen_q = 100; c.seqlen_k = 260; c.causal = true;
  c.attention_chunk = (int64_t(1) << 40); add(c);
  c = {}; c.name = "bf16_d176_v136_window_gqa"; c.head_dim = 176; c.head_dim_v = 136; c.heads_q = 4; c.heads_kv = 2;
  c.seqlen_q = 250; c.seqlen_k = 300; c.window_left = 60; c.window_right = 20; add(c);
  c = {}; c.name = "bf16_d96_v256_large_scores"; c.head_dim = 96; c.head_dim_v = 256; c.seqlen_q = 130;
  c.seqlen_k = 600; c.qk_stddev = 3; add(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, Sm90Forward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FwdCase>& i) { return i.param.name; });

// Races in the persistent grid's tile hand-off (between a producer and its consumers, or between the CTAs of a
// cluster) show up rarely, as a hang or as a tile computed for the wrong rows. Many back-to-back launches of a
// shape with many short tiles must give bitwise the same O and LSE every time (a tile's arithmetic does not
// depend on which pipeline runs it). The first such race (a cluster's tile ring read after the slot was freed)
// hung within 20000 launches of hd 64 causal 512 at this size (bench/results/hopper-forward.md, 018c957).
TEST(Sm90ForwardStress, BackToBackLaunchesGiveIdenticalOutputs) {
  FA_REQUIRE_GPU();
  if (flashattn::cuda_compute_capability(0) != 90) GTEST_SKIP() << "needs compute capability 9.0";
  // The benchmark grid's shapes (B·S = 16k tokens, H·D = 2048). hd 64 up to 2k keys runs in clusters (the race
  // above); the other head dims' kernels hand tiles from producer to consumers through the same ring in one CTA.
  constexpr int64_t kTokens = 16384, kModelWidth = 2048;
  const StressShape shapes[] = {StressShape{64, 512, true, 10000}, StressShape{64, 512, false, 4000},
                                 StressShape{64, 1024, true, 4000}, StressShape{128, 512, true, 3000},
                                 StressShape{256, 512, true, 3000}};
  for (const StressShape& s : shapes) {
    SCOPED_TRACE(s.name());
    const int64_t batch = kTokens / s.seqlen, heads = kModelWidth / s.head_dim;
    HostTensor q(DType::bf16, {batch, s.seqlen, heads, s.head_dim}), o = q, k = q, v = q;
    HostTensor lse(DType::f32, {batch, heads, s.seqlen});
    std::mt19937_64 rng(uint64_t(s.head_dim * s.seqlen) * 2 + s.causal);
    q.fill_normal(rng, 1.0);
    k.fill_normal(rng, 1.0);
    v.fill_normal(rng, 1.0);
    DeviceForward dev(q, k, v, o, lse);
    AttentionOptions opt;
    opt.causal = s.causal;
    FwdParams p;
    const Status made = make_forward_params(dev.args, opt, &p);
    ASSERT_TRUE(made.ok()) << made.message;
    expect_identical_over_launches(
        s.launches, [&] { return detail::sm90_forward_run(p, detail::Sm90Grid::persistent); },
        {{dev.out.data(), o.bytes()}, {dev.lse.data(), lse.bytes()}}, "O and LSE");
  }
}

TEST(Sm90ForwardSupport, ReportsWhyItDeclines) {
  FA_REQUIRE_GPU();
  FwdParams p;
  p.dtype = DType::f32;
  Status st = detail::sm90_forward_supports(p);
  EXPECT_EQ(st.code, ErrorCode::unsupported);
  EXPECT_NE(st.message.find("cuda_sm90"), std::string::npos) << st.message;
}

}  // namespace
}  // namespace flashattn::test

namespace flashattn::test {
namespace {

// On Hopper, dispatch routes supported forwards and backwards to cuda_sm90 and says why it passes over it
// otherwise.
TEST(Sm90ForwardSupport, DispatchPicksSm90OnHopper) {
  FA_REQUIRE_GPU();
  if (flashattn::cuda_compute_capability(0) != 90) GTEST_SKIP() << "needs compute capability 9.0";
  auto params_for = [](int64_t d, FwdParams* p) {
    HostTensor q(DType::bf16, {1, 64, 2, d}), o(DType::bf16, {1, 64, 2, d});
    static DeviceTensor dq, dout;  // kept alive: make_forward_params only records pointers
    dq = DeviceTensor(q);
    dout = DeviceTensor(o);
    ForwardArgs a;
    a.q = a.k = a.v = dq.view(q);
    a.out = dout.view(o);
    return make_forward_params(a, AttentionOptions{}, p);
  };
  FwdParams p;
  ASSERT_TRUE(params_for(128, &p).ok());
  BackendChoice c = choose_backend(p, Backend::automatic, false);
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  c = choose_backend(p, Backend::automatic, true);
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  // The backward's own params: dout laid out like out runs on cuda_sm90, deterministic too.
  BwdParams bp;
  static_cast<FwdParams&>(bp) = p;
  bp.dout = p.o, bp.dq = const_cast<void*>(p.q), bp.dk = const_cast<void*>(p.k), bp.dv = const_cast<void*>(p.v);
  bp.do_batch_stride = p.o_batch_stride, bp.do_row_stride = p.o_row_stride, bp.do_head_stride = p.o_head_stride;
  bp.dq_batch_stride = p.q_batch_stride, bp.dq_row_stride = p.q_row_stride, bp.dq_head_stride = p.q_head_stride;
  bp.dk_batch_stride = p.k_batch_stride, bp.dk_row_stride = p.k_row_stride, bp.dk_head_stride = p.k_head_stride;
  bp.dv_batch_stride = p.v_batch_stride, bp.dv_row_stride = p.v_row_stride, bp.dv_head_stride = p.v_head_stride;
  float lse_stand_in = 0.f;  // only its presence is checked
  bp.lse = &lse_stand_in;
  c = choose_backend(bp, Backend::automatic);
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  bp.deterministic = true;
  c = choose_backend(bp, Backend::automatic);
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  c = choose_backend(p, Backend::automatic, true, /*deterministic=*/true);  // the same, from the forward's params
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  FwdParams p256;
  ASSERT_TRUE(params_for(256, &p256).ok());
  // Deterministic at hd 256 runs the Hopper kernel too (its dQ goes through bulk reduce-adds in key order).
  c = choose_backend(p256, Backend::automatic, true, /*deterministic=*/true);
  EXPECT_EQ(c.backend, Backend::cuda_sm90) << c.reason;
  // Head dims between the buckets run on cuda_sm90 (forward_config.h); those that are not multiples of 8 do not.
  ASSERT_TRUE(params_for(96, &p).ok());
  for (bool backward : {false, true}) EXPECT_EQ(choose_backend(p, Backend::automatic, backward).backend, Backend::cuda_sm90);
  ASSERT_TRUE(params_for(100, &p).ok());
  for (bool backward : {false, true}) {
    c = choose_backend(p, Backend::automatic, backward);
    EXPECT_NE(c.backend, Backend::cuda_sm90) << c.reason;
    EXPECT_NE(c.reason.find("cuda_sm90 passed over"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("head dim 100"), std::string::npos) << c.reason;
  }
}

}  // namespace
}  // namespace flashattn::test
