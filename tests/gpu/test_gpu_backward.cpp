// GPU tests of the CUDA backward against the CPU reference: the sm80 kernels (src/cuda/sm80/backward*.cu[h])
// forced, and whatever dispatch picks (on Hopper the sm90 kernel, src/cuda/sm90/backward_sm90.cu, for the calls
// it supports; each such case also checks that dispatch did pick it).
//
// O and LSE come from the oracle's forward (tests/common/oracle.h), rounded as a forward stores them, so these tests
// depend neither on the GPU forward nor on the library's own reference. The oracle is the textbook backward in
// float64 on the same rounded inputs. The tolerance follows FlashAttention's rule: err(ours) <= 2 *
// err(emulation) + atol, where the emulation is the same textbook in fp32 rounding exactly where the kernel must
// (P and dS to the storage type before their products, D from the stored O, outputs rounded), and err is both
// the L2 and the max abs error vs the oracle; atol is u * |ref| (u = the dtype's unit roundoff) plus a tiny floor
// for gradients that vanish exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

#include "common/host_tensor.h"
#include "common/oracle.h"
#include "cuda/grid_order.h"
#include "cuda/sm80/backward_launch.cuh"
#include "flashattn/flashattn.h"
#include "gpu/device_tensor.h"

namespace flashattn::test {
namespace {

struct BwdCase {
  DType dtype = DType::bf16;
  int64_t batch = 1, sq = 64, sk = 64, hq = 2, hkv = 2, d = 64, dv = 64;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  int64_t chunk = 0;   // attention_chunk (0: none)
  double softcap = 0;
  double softmax_scale = 0;  // 0: 1/√d
  bool bhsd = false;   // storage order [b, h, s, d] (a permuted view) instead of [b, s, h, d]
  bool dout_own_layout = false;  // dout in the other storage order, 8 elements of row padding (unlike out)
  int64_t pad = 0;     // extra elements at the end of every row (odd values break 16-byte alignment)
  int64_t out_pad = -1;  // out's own row padding (-1: pad), so that out alone can be misaligned
  std::vector<int> lens_q, lens_k;  // varlen when non-empty
  bool deterministic = false;
  int stages = 0;  // pipeline depth forced on the kernels (0: what the device's shared memory allows)
  int smem_limit = 0;  // > 0: run as if a block could use only this much shared memory (compact tiles)
  Backend backend = Backend::cuda_sm80;  // or automatic: what dispatch picks
  uint64_t seed = 1;

  bool varlen() const { return !lens_q.empty(); }
  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dtype) << " b" << batch << " sq" << sq << " sk" << sk << " h" << hq << "/" << hkv << " d" << d
       << "/" << dv << (causal ? " causal" : "") << " win(" << wl << "," << wr << ")" << " chunk" << chunk << " cap" << softcap << " scale" << softmax_scale
       << (bhsd ? " bhsd" : "") << (dout_own_layout ? " dout-own-layout" : "") << " pad" << pad << " out_pad" << out_pad << (varlen() ? " varlen" : "") << (deterministic ? " det" : "") << " stages" << stages
       << " smem" << smem_limit << " " << backend_name(backend);
    return os.str();
  }
};

// Tensors of one problem in one dtype, laid out per the case.
struct Problem {
  HostTensor q, k, v, o, lse, dout, dq, dk, dv, cu_q, cu_k;
  int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
};

HostTensor make_tensor(const BwdCase& c, DType dt, int64_t rows_or_seq, int64_t heads, int64_t dim) {
  if (c.varlen()) return HostTensor(dt, {rows_or_seq, heads, dim}, c.bhsd ? std::vector<int>{1, 0, 2} : std::vector<int>{}, c.pad);
  return HostTensor(dt, {c.batch, rows_or_seq, heads, dim}, c.bhsd ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{},
                    c.pad);
}

Problem make_problem(const BwdCase& c, DType dt) {
  Problem p;
  int64_t rq, rk;
  if (c.varlen()) {
    p.cu_q = cu_seqlens_of(c.lens_q);
    p.cu_k = cu_seqlens_of(c.lens_k);
    int64_t aq = 0, ak = 0;
    for (size_t i = 0; i < c.lens_q.size(); ++i) {
      aq += c.lens_q[i], ak += c.lens_k[i];
      p.max_q = std::max<int64_t>(p.max_q, c.lens_q[i]), p.max_k = std::max<int64_t>(p.max_k, c.lens_k[i]);
    }
    p.total_q = aq, p.total_k = ak;
    rq = aq, rk = ak;
  } else {
    rq = c.sq, rk = c.sk;
  }
  p.q = make_tensor(c, dt, rq, c.hq, c.d);
  p.k = make_tensor(c, dt, rk, c.hkv, c.d);
  p.v = make_tensor(c, dt, rk, c.hkv, c.dv);
  {
    BwdCase out_case = c;
    if (c.out_pad >= 0) out_case.pad = c.out_pad;
    p.o = make_tensor(out_case, dt, rq, c.hq, c.dv);
  }
  if (c.dout_own_layout) {
    BwdCase other = c;
    other.bhsd = !c.bhsd, other.pad = 8;
    p.dout = make_tensor(other, dt, rq, c.hq, c.dv);
  } else {
    p.dout = make_tensor(c, dt, rq, c.hq, c.dv);
  }
  p.dq = make_tensor(c, dt, rq, c.hq, c.d);
  p.dk = make_tensor(c, dt, rk, c.hkv, c.d);
  p.dv = make_tensor(c, dt, rk, c.hkv, c.dv);
  p.lse = c.varlen() ? HostTensor(DType::f32, {c.hq, rq}) : HostTensor(DType::f32, {c.batch, c.hq, rq});
  return p;
}

BackwardArgs views(Problem& p, bool varlen, const DeviceTensor* dev = nullptr) {
  // dev: device tensors in the order q, k, v, o, lse, dout, dq, dk, dv, cu_q, cu_k.
  HostTensor* hs[] = {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv, &p.cu_q, &p.cu_k};
  TensorView tv[11];
  for (int i = 0; i < 11; ++i) tv[i] = dev ? dev[i].view(*hs[i]) : hs[i]->view();
  BackwardArgs a;
  a.q = tv[0], a.k = tv[1], a.v = tv[2], a.out = tv[3], a.lse = tv[4], a.dout = tv[5];
  a.dq = tv[6], a.dk = tv[7], a.dv = tv[8];
  if (varlen) {
    a.cu_seqlens_q = tv[9], a.cu_seqlens_k = tv[10];
    a.max_seqlen_q = p.max_q, a.max_seqlen_k = p.max_k;
  }
  return a;
}

// Device copies of a problem's tensors, in views()'s order.
struct DeviceProblem {
  DeviceTensor t[11];
  explicit DeviceProblem(Problem& p) {
    HostTensor* hs[] = {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.dout, &p.dq, &p.dk, &p.dv, &p.cu_q, &p.cu_k};
    for (int i = 0; i < 11; ++i) t[i] = DeviceTensor(*hs[i]);
  }
};

AttentionOptions options(const BwdCase& c, Backend b) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window_left = c.wl, o.window_right = c.wr;
  o.attention_chunk = c.chunk;
  o.softcap = c.softcap;
  o.softmax_scale = c.softmax_scale;
  o.deterministic = c.deterministic;
  o.backend = b;
  return o;
}

AttnSpec spec_of(const BwdCase& c) {
  AttnSpec s;
  s.causal = c.causal, s.window_left = c.wl, s.window_right = c.wr, s.softcap = c.softcap;
  s.attention_chunk = c.chunk;
  s.softmax_scale = c.softmax_scale;
  s.lens_q.assign(c.lens_q.begin(), c.lens_q.end());
  s.lens_k.assign(c.lens_k.begin(), c.lens_k.end());
  return s;
}

// Logical values into a tensor of the same logical shape (any layout).
void set_values(HostTensor& t, const std::vector<double>& values) {
  size_t i = 0;
  t.for_each([&](int64_t off) { t.set(off, values[i++]); });
}

// Storage offsets that are not logical elements (row padding) must keep their poison.
bool padding_untouched(const HostTensor& t) {
  std::vector<char> logical(size_t(t.storage_elems()), 0);
  t.for_each([&](int64_t off) { logical[size_t(off)] = 1; });
  for (int64_t off = 0; off < t.storage_elems(); ++off)
    if (!logical[size_t(off)] && !std::isnan(t.get(off))) return false;
  return true;
}

struct Err {
  double l2, max_abs;   // of (x - ref)
  double ref_l2, ref_max;
  int64_t n;
};
Err error_of(const HostTensor& x, const HostTensor& ref) {
  const std::vector<double> a = x.values(), r = ref.values();
  Err e{0, 0, 0, 0, int64_t(a.size())};
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::isnan(a[i]) ? INFINITY : std::fabs(a[i] - r[i]);
    e.l2 += d * d;
    e.max_abs = std::max(e.max_abs, d);
    e.ref_l2 += r[i] * r[i];
    e.ref_max = std::max(e.ref_max, std::fabs(r[i]));
  }
  e.l2 = std::sqrt(e.l2), e.ref_l2 = std::sqrt(e.ref_l2);
  return e;
}

// Whether dispatch must pick the Hopper backward for the case (backward_sm90.cu's preconditions; chunked attention
// runs cuda_sm80's backward).
bool sm90_expected(const BwdCase& c) {
  return c.backend == Backend::automatic && cuda_compute_capability(0) == 90 && c.chunk == 0 &&
         sm90_takes_head_dims(c.d, c.dv) && c.pad % 8 == 0;
}

Status run_gpu(const BwdCase& c, const BackwardArgs& ga) {
  if (c.stages == 0 && c.smem_limit == 0) {
    if (sm90_expected(c)) {
      BwdParams params;
      Status st = make_backward_params(ga, options(c, c.backend), &params);
      if (!st.ok()) return st;
      const BackendChoice choice = choose_backend(params, c.backend);
      EXPECT_EQ(choice.backend, Backend::cuda_sm90) << choice.reason;
    }
    return attention_backward(ga, options(c, c.backend));
  }
  BwdParams params;
  Status st = make_backward_params(ga, options(c, Backend::cuda_sm80), &params);
  return st.ok() ? detail::cuda_sm80_backward_staged(params, c.stages, c.smem_limit) : st;
}

// Runs one case on the GPU (twice if deterministic) and checks dq, dk, dv.
void run_case(const BwdCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(c.seed);
  Problem lo = make_problem(c, c.dtype);
  lo.q.fill_normal(rng), lo.k.fill_normal(rng), lo.v.fill_normal(rng), lo.dout.fill_normal(rng);

  // The forward, as a forward stores it: O rounded to the dtype, LSE in fp32.
  const AttnSpec spec = spec_of(c);
  {
    const AttnResult fwd = textbook_attention<double>(lo.q, lo.k, lo.v, nullptr, spec, Rounding{c.dtype, false});
    set_values(lo.o, fwd.o);
    set_values(lo.lse, fwd.lse);
  }
  // Oracle: the float64 backward on the same (rounded) inputs, and the emulation of the kernel's rounding: the
  // error scale the tolerance is built on.
  const std::vector<double> stored_o = lo.o.values();
  Problem ref = make_problem(c, DType::f64), emu = make_problem(c, c.dtype);
  {
    const AttnResult exact = oracle_attention(lo.q, lo.k, lo.v, &lo.dout, spec);
    set_values(ref.dq, exact.dq), set_values(ref.dk, exact.dk), set_values(ref.dv, exact.dv);
    const AttnResult kernel_like =
        textbook_attention<float>(lo.q, lo.k, lo.v, &lo.dout, spec, Rounding{c.dtype, true}, &stored_o);
    set_values(emu.dq, kernel_like.dq), set_values(emu.dk, kernel_like.dk), set_values(emu.dv, kernel_like.dv);
  }

  // GPU.
  lo.dq.poison(), lo.dk.poison(), lo.dv.poison();
  DeviceProblem device(lo);
  DeviceTensor* dev = device.t;
  const BackwardArgs ga = views(lo, c.varlen(), dev);
  Status st = run_gpu(c, ga);
  ASSERT_TRUE(st.ok()) << st.message;
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  dev[6].download(lo.dq), dev[7].download(lo.dk), dev[8].download(lo.dv);

  const double u = unit_roundoff(c.dtype);
  const char* names[] = {"dq", "dk", "dv"};
  HostTensor* ours[] = {&lo.dq, &lo.dk, &lo.dv};
  HostTensor* oracle[] = {&ref.dq, &ref.dk, &ref.dv};
  HostTensor* emul[] = {&emu.dq, &emu.dk, &emu.dv};
  // atol: gradients that vanish exactly (one visible key: dS = 0) leave only fp32 rounding noise.
  const double atol = 1e-5;
  for (int t = 0; t < 3; ++t) {
    const Err e = error_of(*ours[t], *oracle[t]);
    const Err base = error_of(*emul[t], *oracle[t]);
    EXPECT_LE(e.l2, 2 * base.l2 + u * e.ref_l2 + atol * std::sqrt(double(e.n)))
        << names[t] << " L2 error (emulation " << base.l2 << ", |ref| " << e.ref_l2 << ")";
    EXPECT_LE(e.max_abs, 2 * base.max_abs + u * e.ref_max + atol)
        << names[t] << " max abs error (emulation " << base.max_abs << ", max |ref| " << e.ref_max << ")";
    EXPECT_TRUE(padding_untouched(*ours[t])) << names[t] << ": row padding was written";
  }

  if (c.deterministic) {
    // Bitwise identical over many more runs (each over fresh poison): a sum whose order depended on scheduling
    // would differ in some of them.
    constexpr int kRuns = 10;
    for (int run = 1; run < kRuns; ++run) {
      Problem again = make_problem(c, c.dtype);
      again.dq.poison(), again.dk.poison(), again.dv.poison();
      dev[6].upload(again.dq), dev[7].upload(again.dk), dev[8].upload(again.dv);
      st = run_gpu(c, ga);
      ASSERT_TRUE(st.ok()) << st.message;
      FA_CUDA_CHECK(cudaDeviceSynchronize());
      dev[6].download(again.dq), dev[7].download(again.dk), dev[8].download(again.dv);
      EXPECT_EQ(std::memcmp(again.dq.data(), lo.dq.data(), lo.dq.bytes()), 0) << "dq differs in run " << run;
      EXPECT_EQ(std::memcmp(again.dk.data(), lo.dk.data(), lo.dk.bytes()), 0) << "dk differs in run " << run;
      EXPECT_EQ(std::memcmp(again.dv.data(), lo.dv.data(), lo.dv.bytes()), 0) << "dv differs in run " << run;
    }
  }
}

// The suite's parameter: dtype, and the sm80 kernels forced or what dispatch picks.
using Path = std::tuple<DType, Backend>;

BwdCase base(const Path& path, int64_t sq, int64_t sk, int64_t d) {
  BwdCase c;
  c.dtype = std::get<0>(path), c.backend = std::get<1>(path);
  c.sq = sq, c.sk = sk, c.d = d, c.dv = d;
  c.seed = uint64_t(sq * 1000003 + sk * 131 + d);
  return c;
}

class GpuBackward : public ::testing::TestWithParam<Path> {
 protected:
  // Tests of the sm80 kernels' own machinery (pipeline depth, shared-memory budget) run only where it is forced.
  bool sm80_forced() const { return std::get<1>(GetParam()) == Backend::cuda_sm80; }
};

// Three varlen sequences: one with no queries, one with both, one with no keys (shared by the pipeline-path tests).
BwdCase varlen_with_empty_sequences(const Path& t, int64_t d) {
  BwdCase c = base(t, 0, 0, d);
  c.lens_q = {0, 70, 200};
  c.lens_k = {9, 130, 0};
  return c;
}

// The case as given, then in deterministic mode (the separate dQ kernel).
void run_case_both_modes(BwdCase c) {
  run_case(c);
  c.deterministic = true;
  run_case(c);
}

TEST_P(GpuBackward, Lengths) {
  FA_REQUIRE_GPU();
  for (int64_t s : {1, 2, 17, 127, 1000}) {
    BwdCase c = base(GetParam(), s, s, 64);
    c.batch = 2;
    run_case(c);
    c.causal = true;
    run_case(c);
  }
}

// Chunked attention (attention_chunk; the extras kernels): chunks inside and across key blocks, with causal, a
// window, s_q != s_k, GQA, varlen, deterministic mode.
TEST_P(GpuBackward, ChunkedAttention) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 300, 300, 64);
  c.causal = true, c.chunk = 40;
  run_case_both_modes(c);
  c = base(GetParam(), 250, 400, 128);
  c.chunk = 100, c.wl = 30, c.wr = 10, c.hq = 4, c.hkv = 2;
  run_case(c);
  c = base(GetParam(), 400, 200, 256);
  c.chunk = 64;
  run_case(c);
  c = base(GetParam(), 0, 0, 64);
  c.lens_q = {90, 0, 130}, c.lens_k = {140, 7, 200}, c.causal = true, c.chunk = 9;
  run_case_both_modes(c);
}

TEST_P(GpuBackward, LongSequences) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 2048, 2048, 128);
  c.hq = c.hkv = 1;
  run_case(c);
  c.causal = true;
  run_case(c);
  c = base(GetParam(), 1536, 1536, 256);
  c.hq = c.hkv = 1;
  run_case(c);
}

TEST_P(GpuBackward, CausalUnequalLengths) {
  FA_REQUIRE_GPU();
  // sq > sk: the first sq - sk rows see no key (LSE = -inf, dQ = 0).
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{300, 1000}, {1000, 300}, {129, 7}, {7, 129}}) {
    BwdCase c = base(GetParam(), sq, sk, 128);
    c.causal = true;
    run_case(c);
  }
}

TEST_P(GpuBackward, GroupedQueryAttention) {
  FA_REQUIRE_GPU();
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 2}, {8, 1}, {2, 2}}) {
    BwdCase c = base(GetParam(), 200, 333, 64);
    c.hq = hq, c.hkv = hkv;
    run_case(c);
    c.causal = true;
    c.d = c.dv = 128;
    c.batch = 2;  // padded batch entries past the first: their own rows of every tensor and of the workspace
    run_case(c);
  }
}

TEST_P(GpuBackward, HeadDims) {
  FA_REQUIRE_GPU();
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{1, 1}, {8, 8}, {33, 33}, {40, 72}, {96, 96}, {128, 128},
                       {160, 96}, {100, 200}, {256, 256}, {256, 17}}) {
    BwdCase c = base(GetParam(), 150, 170, d);
    c.dv = dv;
    run_case(c);
  }
}

// The head dims between the Hopper buckets and d_v != d that models use (Phi: 80, 96; MLA: 192 / 128), through
// masks, GQA, varlen and the deterministic mode (on Hopper: the bucket kernels with TMA's zero columns past d and
// d_v, support_checks.h).
TEST_P(GpuBackward, ModelHeadDims) {
  FA_REQUIRE_GPU();
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{32, 32}, {80, 80}, {96, 96}, {160, 160}, {192, 192},
                       {192, 128}, {128, 64}, {64, 128}, {96, 64}, {72, 88}, {112, 48}}) {
    BwdCase c = base(GetParam(), 200, 260, d);
    c.dv = dv;
    c.hq = 4, c.hkv = 2, c.causal = true;
    run_case(c);
  }
  // The 128 bucket's kernels with narrower products on Hopper (backward_config.h kProductCols: 96, and 128 / 64),
  // over several key and query blocks without a mask.
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{96, 96}, {80, 80}, {128, 64}}) {
    BwdCase c = base(GetParam(), 333, 400, d);
    c.dv = dv, c.batch = 2;
    run_case(c);
  }
  BwdCase c = base(GetParam(), 0, 0, 96);
  c.lens_q = {0, 150, 90};
  c.lens_k = {30, 170, 0};
  c.wl = 50, c.softcap = 4;
  run_case(c);
  c = base(GetParam(), 190, 190, 80);
  c.deterministic = true, c.causal = true;
  run_case(c);
  c = base(GetParam(), 150, 300, 192);
  c.dv = 128, c.bhsd = true, c.pad = 8;
  run_case(c);
}

// d 129..192 beside d_v <= 128 (DeepSeek's MLA; on Hopper the 192 bucket, backward_config.h: 128-key CTAs, Sᵀ and
// dPᵀ in two passes of 32 queries, dQ a 64-column product at a time) over several key and query blocks, GQA, each
// mask, softcap, varlen with empty sequences, columns past d and d_v inside a panel, and both deterministic orders.
TEST_P(GpuBackward, MlaHeadDims) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 333, 400, 192);
  c.dv = 128, c.batch = 2, c.hq = 4, c.hkv = 2;
  run_case(c);
  c.causal = true;
  run_case_both_modes(c);
  c = varlen_with_empty_sequences(GetParam(), 192);
  c.dv = 128, c.hq = 4, c.hkv = 1, c.wl = 40, c.wr = 7, c.softcap = 3;
  run_case(c);
  c = base(GetParam(), 190, 260, 136);
  c.dv = 72, c.bhsd = true, c.pad = 8, c.causal = true;
  run_case(c);
  c = base(GetParam(), 100, 2000, 192);  // no mask: rotated sweeps in the deterministic mode
  c.dv = 128;
  run_case_both_modes(c);
}

// Head dim 256 through each mask, GQA, padded and varlen batches (on Hopper: the column-split sm90 kernel,
// backward_config.h kColumnSplit, whose CTA owns 64 keys).
TEST_P(GpuBackward, HeadDim256) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 300, 333, 256);
  c.batch = 2, c.hq = 4, c.hkv = 2, c.causal = true;
  run_case(c);
  c.causal = false, c.softcap = 3, c.wl = 40, c.wr = 7;
  run_case(c);
  c = varlen_with_empty_sequences(GetParam(), 256);
  c.causal = true;
  run_case(c);
}

TEST_P(GpuBackward, LayoutsAndMisalignedStrides) {
  FA_REQUIRE_GPU();
  for (int64_t pad : {0, 8, 3}) {
    for (bool bhsd : {false, true}) {
      BwdCase c = base(GetParam(), 130, 190, 64);
      c.hq = 4, c.hkv = 2, c.pad = pad, c.bhsd = bhsd, c.causal = pad == 3;
      run_case(c);
    }
  }
  BwdCase c = base(GetParam(), 77, 77, 33);  // odd head dim with an odd row pitch
  c.pad = 1;
  run_case(c);
  // dout laid out unlike out (a gradient arriving transposed): its own strides for the loads and the tensor map.
  for (int64_t d : {64, 128}) {
    c = base(GetParam(), 150, 140, d);
    c.hq = 4, c.hkv = 2, c.causal = d == 128, c.dout_own_layout = true;
    run_case(c);
  }
  // out alone misaligned (odd row pitch) beside TMA-aligned inputs: the Hopper backward still runs (TMA never reads
  // out), and its row-wise preprocess reads out an element at a time (bwd_preprocess_kernel without vec_rows).
  for (int64_t d : {64, 128, 256}) {
    c = base(GetParam(), 150, 140, d);
    c.hq = 4, c.hkv = 2, c.out_pad = 1, c.causal = d == 64;
    run_case(c);
  }
}

TEST_P(GpuBackward, WindowsAndSoftcap) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 500, 600, 64);
  c.wl = 50, c.wr = 10;
  run_case(c);
  c.causal = true, c.wl = 100, c.wr = -1;
  run_case(c);
  c = base(GetParam(), 300, 300, 128);
  c.wl = 0, c.wr = 0;  // each row sees exactly its diagonal key
  run_case(c);
  c = base(GetParam(), 400, 400, 128);
  c.softcap = 2.0;
  run_case(c);
  c.causal = true, c.wl = 64;
  run_case(c);
  // Windows past 2^31 mean "every key" here; a kernel argument that truncated them to 32 bits would not.
  c = base(GetParam(), 200, 300, 64);
  c.wl = (int64_t(1) << 32) + 5, c.wr = (int64_t(1) << 32) + 3;
  run_case(c);
}

// A caller's softmax scale (not 1/√d): every head dim bucket, with masks, softcap, GQA and varlen.
TEST_P(GpuBackward, SoftmaxScale) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256, 80}) {
    BwdCase c = base(GetParam(), 200, 260, d);
    c.hq = 4, c.hkv = 2, c.causal = d != 128, c.softmax_scale = d == 64 ? 0.3 : d == 128 ? 0.02 : 1.25;
    c.softcap = d == 256 ? 6 : 0;
    run_case(c);
  }
  BwdCase c = base(GetParam(), 0, 0, 128);
  c.lens_q = {70, 0, 190}, c.lens_k = {130, 4, 150};
  c.hq = 4, c.hkv = 1, c.causal = true, c.wl = 50, c.softmax_scale = 0.2;
  run_case(c);
}

TEST_P(GpuBackward, VarlenWithEmptySequences) {
  FA_REQUIRE_GPU();
  BwdCase c = base(GetParam(), 0, 0, 64);
  c.lens_q = {0, 17, 300, 1, 0, 129, 5};
  c.lens_k = {5, 0, 280, 64, 0, 200, 1};
  c.hq = 4, c.hkv = 2;
  run_case(c);
  c.causal = true, c.d = 128, c.dv = 96;
  run_case(c);
  c.bhsd = true, c.pad = 3, c.wl = 20;
  run_case(c);
}

TEST_P(GpuBackward, Deterministic) {
  FA_REQUIRE_GPU();
  for (int64_t d : {64, 128, 256}) {
    BwdCase c = base(GetParam(), 300, 400, d);
    c.hq = 4, c.hkv = 1, c.deterministic = true;
    run_case(c);
    c.causal = true;
    run_case(c);
  }
  BwdCase c = base(GetParam(), 0, 0, 80);
  c.lens_q = {3, 0, 260, 100};
  c.lens_k = {0, 9, 300, 70};
  c.causal = true, c.deterministic = true, c.pad = 5;
  run_case(c);
  // The Hopper kernel's orders of addition: key order (left edge only, or no mask), last key block first (right
  // edges), over varlen sequences with GQA and sequences shorter than the grid's key blocks.
  for (auto [wl, wr] : {std::pair<int64_t, int64_t>{200, -1}, {100, 40}, {-1, 0}, {-1, -1}}) {
    c = base(GetParam(), 0, 0, wl == 100 ? 64 : 128);
    c.lens_q = {300, 0, 70, 513}, c.lens_k = {400, 5, 130, 260};
    c.hq = 4, c.hkv = 2, c.wl = wl, c.wr = wr, c.deterministic = true;
    run_case(c);
  }
  // Without a mask the Hopper kernel rotates the key blocks' sweeps where they fit in half the GPU: here over more
  // key blocks than query blocks (key blocks sharing a first query block), and past that size in key order (9000
  // keys: 71 blocks of 128 keys, 141 of 64).
  for (auto [sq, sk, d] : {std::tuple<int64_t, int64_t, int64_t>{100, 2000, 128}, {70, 9000, 64}, {70, 9000, 256}}) {
    c = base(GetParam(), sq, sk, d);
    c.deterministic = true;
    run_case(c);
  }
}

// Small shapes touching every kernel path (each bucket, tails, masks, GQA, varlen, misaligned rows,
// deterministic): the case the compute-sanitizer runs use.
TEST_P(GpuBackward, TinyAllPaths) {
  FA_REQUIRE_GPU();
  for (int64_t d : {24, 128, 200}) {
    BwdCase c = base(GetParam(), 70, 90, d);
    c.hq = 2, c.hkv = 1, c.causal = d != 128, c.pad = d == 200 ? 3 : 0;
    run_case_both_modes(c);
  }
  BwdCase c = base(GetParam(), 0, 0, 64);
  c.lens_q = {0, 33, 5};
  c.lens_k = {4, 70, 0};
  c.wl = 8, c.wr = 8, c.softcap = 3;
  run_case(c);
  c.stages = 1, c.deterministic = true;
  run_case(c);
}

// The one-stage pipeline (what devices with less shared memory than Hopper, e.g. the A100, run), forced here
// so that any GPU covers it: every bucket, tails, masks, GQA, varlen, deterministic.
TEST_P(GpuBackward, SingleStagePipeline) {
  FA_REQUIRE_GPU();
  if (!sm80_forced()) GTEST_SKIP() << "sm80 pipeline depth: run with the sm80 kernels forced";
  for (int64_t d : {64, 128, 256}) {
    BwdCase c = base(GetParam(), 300, 260, d);
    c.hq = 4, c.hkv = 2, c.stages = 1, c.causal = d == 128;
    run_case_both_modes(c);
  }
  BwdCase c = varlen_with_empty_sequences(GetParam(), 96);
  c.stages = 1, c.wl = 30, c.pad = 3;
  run_case(c);
}

// GPUs with 99 KB of shared memory per block (compute capability 8.6 / 8.9), forced here: the hd64 and hd128
// buckets run their compact tiles (every head dim up to 128, tails, masks, GQA, varlen, deterministic); hd256
// reports unsupported with what it needs.
TEST_P(GpuBackward, ConsumerGpuSharedMemory) {
  FA_REQUIRE_GPU();
  if (!sm80_forced()) GTEST_SKIP() << "sm80 shared-memory budget: run with the sm80 kernels forced";
  constexpr int kConsumerGpuSmem = 99 * 1024;
  for (int64_t d : {40, 64, 96, 128}) {
    BwdCase c = base(GetParam(), 150 + d, 260, d);
    c.hq = 4, c.hkv = 2, c.smem_limit = kConsumerGpuSmem, c.causal = d % 64 == 0;
    run_case_both_modes(c);
  }
  BwdCase c = varlen_with_empty_sequences(GetParam(), 128);
  c.smem_limit = kConsumerGpuSmem, c.wl = 30, c.softcap = 5, c.pad = 3;
  run_case(c);

  c = base(GetParam(), 64, 64, 256);
  c.smem_limit = kConsumerGpuSmem;
  Problem pb = make_problem(c, c.dtype);
  const DeviceProblem device(pb);
  BwdParams params;
  ASSERT_TRUE(make_backward_params(views(pb, false, device.t), options(c, Backend::cuda_sm80), &params).ok());
  const Status st = detail::cuda_sm80_backward_staged(params, 0, c.smem_limit);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  EXPECT_NE(st.message.find("needs"), std::string::npos) << st.message;
}

INSTANTIATE_TEST_SUITE_P(Paths, GpuBackward,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(Backend::cuda_sm80, Backend::automatic)),
                         [](const ::testing::TestParamInfo<Path>& i) {
                           return std::string(dtype_name(std::get<0>(i.param))) + "_" +
                                  backend_name(std::get<1>(i.param));
                         });

// The Hopper backward's start order (cuda/grid_order.h): every block of the grid exactly once; the pairs (y, z)
// before the tail whole and one after another, x fastest; the tail's x never decreasing; within every (y, z), x in
// increasing order. Host arithmetic: runs without a GPU.
TEST(GridOrder, TailStartsKeyBlockByKeyBlock) {
  struct Grid {
    uint32_t nx, ny, nz, tail;
  };
  for (const Grid g : {Grid{5, 3, 4, 3}, Grid{1, 7, 1, 2}, Grid{6, 1, 1, 1}, Grid{2, 1, 9, 20}, Grid{16, 128, 1, 9},
                       Grid{4, 2, 2, 0}, Grid{3, 5, 1, 5}}) {
    const uint64_t pairs = uint64_t(g.ny) * g.nz, tail = std::min<uint64_t>(g.tail, pairs);
    std::vector<int> seen(pairs * g.nx, 0);
    std::vector<int64_t> last_x(pairs, -1);
    uint32_t previous_tail_x = 0;
    for (uint64_t linear = 0; linear < seen.size(); ++linear) {
      const cuda::GridPlace p = cuda::tail_x_slowest_place(linear, g.nx, g.ny, g.nz, g.tail);
      ASSERT_LT(p.x, g.nx);
      ASSERT_LT(p.y, g.ny);
      ASSERT_LT(p.z, g.nz);
      const uint64_t pair = uint64_t(p.z) * g.ny + p.y;
      ++seen[pair * g.nx + p.x];
      if (linear < (pairs - tail) * g.nx) {
        EXPECT_EQ(pair * g.nx + p.x, linear) << "before the tail: blockIdx order";
      } else {
        EXPECT_GE(pair, pairs - tail);
        EXPECT_GE(p.x, previous_tail_x) << "start " << linear;
        previous_tail_x = p.x;
      }
      EXPECT_EQ(int64_t(p.x), last_x[pair] + 1) << "(y, z) = (" << p.y << ", " << p.z << ")";
      last_x[pair] = p.x;
    }
    for (int count : seen) EXPECT_EQ(count, 1);
  }
  EXPECT_EQ(cuda::tail_pairs_for_wave(16, 132), 9u);
  EXPECT_EQ(cuda::tail_pairs_for_wave(32, 132), 5u);
  EXPECT_EQ(cuda::tail_pairs_for_wave(256, 132), 1u);
}

}  // namespace
}  // namespace flashattn::test
