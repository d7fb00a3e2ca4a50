// ALiBi and dropout on the CUDA backends, forward and backward, against the fp64 oracle (tests/common/oracle.h,
// whose dropout mask comes from the tests' own Philox): both slope shapes, with and without causal, s_q != s_k,
// GQA, windows, softcap, varlen, head dims of the Hopper kernels (64, 128, 256) and of the sm80 ones (80), each
// through cuda_sm80 forced and through automatic dispatch (cuda_sm90 on Hopper at its head dims); dropout's seed and
// offset also from device memory (ForwardArgs::dropout_rng).
//
// Rule, per output: ‖gpu − ref‖ ≤ 2‖emu − ref‖ + u‖ref‖ + atol·√n and the same for the largest element, where emu
// is the textbook algorithm in fp32 with P and dS rounded to the storage type before their products, as the
// kernels do (its backward reading the GPU's own O).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cpu/attention_problem.h"
#include "gpu/device_tensor.h"

namespace flashattn::test {
namespace {

struct GpuAlibiCase {
  AttnCase c;
  Backend backend;
};

std::string case_name(const GpuAlibiCase& g) {
  std::string n = g.c.name() + "_" + backend_name(g.backend);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

struct Norms {
  double l2 = 0, max_abs = 0, ref_l2 = 0, ref_max = 0;
};
Norms distance(const std::vector<double>& x, const std::vector<double>& ref) {
  Norms n;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(ref[i]) && x[i] == ref[i]) continue;  // the LSE of a row that sees no key
    const double d = std::isnan(x[i]) ? INFINITY : std::fabs(x[i] - ref[i]);
    n.l2 += d * d, n.max_abs = std::max(n.max_abs, d);
    if (!std::isinf(ref[i])) n.ref_l2 += ref[i] * ref[i], n.ref_max = std::max(n.ref_max, std::fabs(ref[i]));
  }
  n.l2 = std::sqrt(n.l2), n.ref_l2 = std::sqrt(n.ref_l2);
  return n;
}

void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
                  const std::vector<double>& emu, double u) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Norms e = distance(got, ref), base = distance(emu, ref);
  const double atol = 1e-5;
  EXPECT_LE(e.l2, 2 * base.l2 + u * e.ref_l2 + atol * std::sqrt(double(got.size())))
      << what << " L2 error (emulation " << base.l2 << ", |ref| " << e.ref_l2 << ")";
  EXPECT_LE(e.max_abs, 2 * base.max_abs + u * e.ref_max + atol)
      << what << " max error (emulation " << base.max_abs << ", max |ref| " << e.ref_max << ")";
}

class GpuAlibiDropout : public ::testing::TestWithParam<GpuAlibiCase> {};

TEST_P(GpuAlibiDropout, MatchesOracle) {
  FA_REQUIRE_GPU();
  const GpuAlibiCase& g = GetParam();
  const AttnCase& c = g.c;
  const AttnProblem pb(c, std::hash<std::string>{}(c.name()));
  HostTensor out = pb.alloc_out(c.dtype), lse = pb.alloc_lse();
  HostTensor dq = pb.alloc(c.dtype, true, c.h_q, c.d), dk = pb.alloc(c.dtype, false, c.h_kv, c.d);
  HostTensor dv = pb.alloc(c.dtype, false, c.h_kv, c.dv);
  for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) t->poison();

  // Device copies of the problem's tensors, layouts and padding included.
  DeviceTensor q(pb.q()), k(pb.k()), v(pb.v()), o(out), l(lse), dout(pb.dout()), gq(dq), gk(dk), gv(dv);
  DeviceTensor slopes(pb.alibi());
  BackwardArgs a;
  a.q = q.view(pb.q()), a.k = k.view(pb.k()), a.v = v.view(pb.v()), a.out = o.view(out), a.lse = l.view(lse);
  a.dout = dout.view(pb.dout()), a.dq = gq.view(dq), a.dk = gk.view(dk), a.dv = gv.view(dv);
  if (c.alibi != AttnCase::Alibi::none) a.alibi_slopes = slopes.view(pb.alibi());
  // The generator state in device memory, as PyTorch's graph-safe path hands it over (read by the kernels).
  HostTensor rng_host(DType::f64, {2});  // 16 bytes of storage for the two 64-bit words
  std::memcpy(rng_host.data(), pb.dropout_state(), 2 * sizeof(uint64_t));
  DeviceTensor rng(rng_host);
  if (c.dropout_rng_tensor) a.dropout_rng = AttnProblem::dropout_rng_view(rng.data(), Device{DeviceType::cuda, 0});
  HostTensor cu_q, cu_k;
  DeviceTensor dcu_q, dcu_k;
  if (c.varlen()) {
    cu_q = cu_seqlens_of(c.lens_q), cu_k = cu_seqlens_of(c.lens_k);
    dcu_q = DeviceTensor(cu_q), dcu_k = DeviceTensor(cu_k);
    a.cu_seqlens_q = dcu_q.view(cu_q), a.cu_seqlens_k = dcu_k.view(cu_k);
  }
  const AttentionOptions opt = c.options(g.backend);
  if (g.backend == Backend::automatic && cuda_compute_capability(0) == 90 && sm90_takes_head_dims(c.d, c.dv)) {
    BwdParams p;
    ASSERT_TRUE(make_backward_params(a, opt, &p).ok());
    const Backend want = Backend::cuda_sm90;
    EXPECT_EQ(choose_backend(static_cast<const FwdParams&>(p), Backend::automatic, false).backend, want);
    EXPECT_EQ(choose_backend(p, Backend::automatic).backend, want);
  }
  Status st = attention_forward(a, opt);
  ASSERT_TRUE(st.ok()) << st.message;
  st = attention_backward(a, opt);
  ASSERT_TRUE(st.ok()) << st.message;
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  o.download(out), l.download(lse), gq.download(dq), gk.download(dk), gv.download(dv);

  const AttnResult ref = oracle_for(pb, true);
  const std::vector<double> got_o = out.values();
  const AttnResult emu = textbook_attention<float>(pb.q(), pb.k(), pb.v(), &pb.dout(), c.spec(),
                                                   Rounding{c.dtype, true}, &got_o);
  const double u = unit_roundoff(c.dtype);
  expect_close("O", got_o, ref.o, emu.o, u);
  expect_close("LSE", lse.values(), ref.lse, emu.lse, unit_roundoff(DType::f32));
  expect_close("dQ", dq.values(), ref.dq, emu.dq, u);
  expect_close("dK", dk.values(), ref.dk, emu.dk, u);
  expect_close("dV", dv.values(), ref.dv, emu.dv, u);
}

std::vector<GpuAlibiCase> cases() {
  using A = AttnCase::Alibi;
  auto make = [](DType dt, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
    AttnCase c;
    c.dtype = dt, c.s_q = sq, c.s_k = sk, c.h_q = hq, c.h_kv = hkv, c.d = c.dv = d;
    return c;
  };
  std::vector<AttnCase> base;
  for (int64_t d : {64, 128, 256}) {
    AttnCase c = make(DType::bf16, 77, 130, 4, 2, d);
    c.batch = 2, c.alibi = A::per_head;
    base.push_back(c);
    c.causal = true, c.alibi = A::per_batch;
    base.push_back(c);
  }
  AttnCase c = make(DType::f16, 150, 60, 2, 2, 128);  // s_q > s_k: rows that see no key
  c.causal = true, c.alibi = A::per_head;
  base.push_back(c);
  c = make(DType::bf16, 200, 200, 4, 1, 64);
  c.window_left = 40, c.window_right = 7, c.softcap = 10, c.alibi = A::per_batch;
  base.push_back(c);
  c = make(DType::bf16, 0, 0, 4, 2, 128);
  c.lens_q = {70, 0, 129, 5}, c.lens_k = {90, 17, 129, 0}, c.causal = true, c.alibi = A::per_batch;
  base.push_back(c);
  c = make(DType::f16, 300, 300, 2, 2, 256);
  c.alibi = A::per_head;
  base.push_back(c);
  c = make(DType::bf16, 100, 180, 2, 1, 80);  // sm80 kernels on every GPU
  c.causal = true, c.alibi = A::per_batch;
  base.push_back(c);
  // Dropout: every head-dim bucket, masks, GQA, varlen, with ALiBi and softcap.
  for (int64_t d : {64, 128, 256}) {
    c = make(d == 128 ? DType::f16 : DType::bf16, 77, 130, 4, 2, d);
    c.batch = 2, c.dropout_p = 0.3, c.dropout_seed = uint64_t(d) * 7919, c.dropout_offset = 4;
    base.push_back(c);
    c.causal = true, c.dropout_p = 0.1;
    base.push_back(c);
  }
  c = make(DType::bf16, 0, 0, 4, 2, 64);
  c.lens_q = {70, 0, 129, 5}, c.lens_k = {90, 17, 129, 0}, c.causal = true, c.dropout_p = 0.25;
  base.push_back(c);
  c = make(DType::bf16, 150, 200, 2, 1, 80);
  c.window_left = 30, c.softcap = 10, c.alibi = A::per_head, c.dropout_p = 0.5;
  base.push_back(c);
  // The seed and offset read from device memory (dropout_rng): every kernel family's dropout path.
  for (int64_t d : {64, 128, 80}) {
    c = make(DType::bf16, 90, 140, 4, 2, d);
    c.batch = 2, c.causal = d == 128, c.dropout_p = 0.2, c.dropout_seed = 0xfeedbeef12345ull, c.dropout_offset = 12;
    c.dropout_rng_tensor = true;
    base.push_back(c);
  }
  std::vector<GpuAlibiCase> out;
  for (const AttnCase& x : base)
    for (Backend b : {Backend::cuda_sm80, Backend::automatic}) out.push_back({x, b});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuAlibiDropout, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<GpuAlibiCase>& info) {
                           return std::to_string(info.index) + "_" + case_name(info.param);
                         });

}  // namespace
}  // namespace flashattn::test
