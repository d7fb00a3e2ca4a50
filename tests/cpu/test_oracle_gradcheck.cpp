// The oracle's own gradients (tests/common/oracle.h) against central finite differences of its own forward, in
// fp64, so that every other test can trust them. Loss L = Σ O ∘ G for a fixed random G (= dout), so dL/dX is what
// the backward returns.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>

#include "cpu/attention_problem.h"

namespace flashattn::test {
namespace {

double loss(const AttnProblem& pb, const HostTensor& q, const HostTensor& k, const HostTensor& v) {
  const std::vector<double> o = oracle_attention(q, k, v, nullptr, pb.c().spec()).o, g = pb.dout().values();
  double l = 0;
  for (size_t i = 0; i < o.size(); ++i) l += o[i] * g[i];
  return l;
}

void check_gradients(AttnCase c) {
  c.dtype = DType::f64;
  const AttnProblem pb(c, std::hash<std::string>{}(c.name()));
  const AttnResult r = oracle_for(pb, true);
  HostTensor q = to_f64(pb.q());
  HostTensor k = to_f64(pb.k()), v = to_f64(pb.v());
  // Step: balances truncation (h²) against cancellation (u / h) for O(1) data in fp64.
  const double h = 1e-5;
  // Hundreds of tiny forward calls: one thread, so that a busy machine does not turn every OpenMP barrier into
  // a scheduler time slice.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  struct Target {
    const char* name;
    HostTensor* t;
    const std::vector<double>* grad;
  } targets[] = {{"dQ", &q, &r.dq}, {"dK", &k, &r.dk}, {"dV", &v, &r.dv}};
  for (const Target& tg : targets) {
    std::vector<double> fd;
    std::vector<int64_t> offsets;
    tg.t->for_each([&](int64_t off) { offsets.push_back(off); });
    for (int64_t off : offsets) {
      const double x = tg.t->get(off);
      tg.t->set(off, x + h);
      const double lp = loss(pb, q, k, v);
      tg.t->set(off, x - h);
      const double lm = loss(pb, q, k, v);
      tg.t->set(off, x);
      fd.push_back((lp - lm) / (2 * h));
    }
    // Central differences are exact to O(h²) ~ 1e-10 relative here; 1e-7 leaves room and still fails on any
    // real mistake (a missed term is O(1)).
    const double err = l2_distance(*tg.grad, fd), norm = l2_norm(fd);
    EXPECT_LE(err, 1e-7 * std::max(norm, 1.0)) << c.name() << " " << tg.name << ": ‖analytic − fd‖ = " << err
                                                << ", ‖fd‖ = " << norm;
  }
  omp_set_num_threads(saved_threads);
}

AttnCase small(int64_t sq, int64_t sk, int64_t hq, int64_t hkv) {
  AttnCase c;
  c.batch = 2, c.s_q = sq, c.s_k = sk, c.h_q = hq, c.h_kv = hkv, c.d = 6, c.dv = 5;
  return c;
}

TEST(OracleGradcheck, Plain) { check_gradients(small(5, 7, 2, 2)); }

TEST(OracleGradcheck, CausalBottomRight) {
  AttnCase c = small(7, 4, 2, 2);  // s_q > s_k: the first rows see nothing
  c.causal = true;
  check_gradients(c);
}

TEST(OracleGradcheck, WindowAndCausal) {
  AttnCase c = small(6, 9, 2, 1);
  c.causal = true, c.window_left = 2;
  check_gradients(c);
}

TEST(OracleGradcheck, TwoSidedWindow) {
  AttnCase c = small(8, 6, 1, 1);
  c.window_left = 1, c.window_right = 2;
  check_gradients(c);
}

TEST(OracleGradcheck, Softcap) {
  AttnCase c = small(5, 6, 2, 2);
  c.softcap = 1.5;  // small enough that tanh is far from linear on these scores
  check_gradients(c);
}

TEST(OracleGradcheck, SoftmaxScale) {
  AttnCase c = small(5, 6, 2, 1);
  c.softmax_scale = 0.9, c.softcap = 2, c.window_right = 1;
  check_gradients(c);
}

TEST(OracleGradcheck, GroupedQueryHeads) {
  AttnCase c = small(4, 5, 4, 1);  // four query heads share one K/V head: dK/dV sum over them
  c.causal = true;
  check_gradients(c);
}

TEST(OracleGradcheck, Alibi) {
  AttnCase c = small(5, 7, 2, 1);
  c.alibi = AttnCase::Alibi::per_batch;
  check_gradients(c);
  c.causal = true, c.softcap = 1.5, c.alibi = AttnCase::Alibi::per_head;
  check_gradients(c);
}

TEST(OracleGradcheck, DropoutWithTheSeedFixed) {
  AttnCase c = small(5, 7, 2, 1);
  c.dropout_p = 0.3;
  check_gradients(c);
  c.causal = true, c.alibi = AttnCase::Alibi::per_head;
  check_gradients(c);
}

TEST(OracleGradcheck, Varlen) {
  AttnCase c = small(0, 0, 2, 1);
  c.lens_q = {3, 0, 4};
  c.lens_k = {5, 2, 0};
  c.causal = true;
  check_gradients(c);
}

}  // namespace
}  // namespace flashattn::test
