// Races in the Hopper backward's hand-offs (the Q/dO ring, the dQ stages between the consumer warpgroups and the
// writer warp, the turn counters of the deterministic mode) show up rarely, as a hang or a wrong sum. Many
// back-to-back launches of the benchmark's shapes in the deterministic mode must give bitwise the same dQ, dK
// and dV every time; the turn counters trap rather than hang if the protocol is wrong.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "gpu/device_tensor.h"
#include "gpu/stress.h"

namespace flashattn::test {
namespace {

TEST(Sm90BackwardStress, DeterministicLaunchesGiveIdenticalGradients) {
  FA_REQUIRE_GPU();
  if (flashattn::cuda_compute_capability(0) != 90) GTEST_SKIP() << "needs compute capability 9.0";
  // B·S = 8k tokens, H·D = 2048 (the benchmark's model width, half its tokens); GQA 2 on the last shape.
  constexpr int64_t kTokens = 8192, kModelWidth = 2048;
  const StressShape shapes[] = {StressShape{64, 512, true, 400}, StressShape{128, 1024, false, 200},
                                 StressShape{128, 512, true, 400}, StressShape{64, 2048, false, 100},
                                 StressShape{256, 1024, true, 150}};
  for (const StressShape& s : shapes) {
    SCOPED_TRACE(s.name());
    const int64_t batch = kTokens / s.seqlen, heads = kModelWidth / s.head_dim;
    const int64_t heads_kv = s.seqlen == 2048 ? heads / 2 : heads;
    HostTensor q(DType::bf16, {batch, s.seqlen, heads, s.head_dim}), o = q, dout = q, dq = q;
    HostTensor k(DType::bf16, {batch, s.seqlen, heads_kv, s.head_dim}), v = k, dk = k, dv = k;
    HostTensor lse(DType::f32, {batch, heads, s.seqlen});
    std::mt19937_64 rng(uint64_t(s.head_dim * s.seqlen) + s.causal);
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng, 1.0);
    DeviceTensor t_q(q), t_k(k), t_v(v), t_o(o), t_lse(lse), t_do(dout), t_dq(dq), t_dk(dk), t_dv(dv);
    BackwardArgs a;
    a.q = t_q.view(q), a.k = t_k.view(k), a.v = t_v.view(v), a.out = t_o.view(o), a.lse = t_lse.view(lse);
    a.dout = t_do.view(dout), a.dq = t_dq.view(dq), a.dk = t_dk.view(dk), a.dv = t_dv.view(dv);
    AttentionOptions opt;
    opt.causal = s.causal;
    opt.deterministic = true;
    BwdParams p;
    ASSERT_TRUE(make_backward_params(a, opt, &p).ok());
    const BackendChoice choice = choose_backend(p, Backend::automatic);
    ASSERT_EQ(choice.backend, Backend::cuda_sm90) << choice.reason;
    const Status st = attention_forward(a, opt);
    ASSERT_TRUE(st.ok()) << st.message;
    expect_identical_over_launches(
        s.launches, [&] { return attention_backward(a, opt); },
        {{t_dq.data(), dq.bytes()}, {t_dk.data(), dk.bytes()}, {t_dv.data(), dv.bytes()}}, "dQ, dK and dV");
  }
}

}  // namespace
}  // namespace flashattn::test
