// Validation: every kind of bad input gives a non-ok Status whose message names the argument, and leaves every
// output byte as it was; then thousands of random mutations of a valid call show that validation never crashes
// and never writes an output, and that what it accepts runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

// A valid backward call (and so a valid forward call) on small tensors, padded or varlen.
struct Call {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k;
  BackwardArgs a;
  AttentionOptions opt;

  explicit Call(bool varlen, DType dt = DType::f32) {
    const int64_t b = 2, sq = 5, sk = 6, hq = 4, hkv = 2, d = 8, dvh = 12;
    if (varlen) {
      q = HostTensor(dt, {7, hq, d}), out = HostTensor(dt, {7, hq, dvh}), dout = HostTensor(dt, {7, hq, dvh});
      k = HostTensor(dt, {9, hkv, d}), v = HostTensor(dt, {9, hkv, dvh});
      lse = HostTensor(DType::f32, {hq, 7});
      cu_q = HostTensor(DType::i32, {b + 1}), cu_k = HostTensor(DType::i32, {b + 1});
      const int32_t cq[] = {0, 3, 7}, ck[] = {0, 9, 9};
      for (int i = 0; i <= b; ++i) cu_q.set(i, cq[i]), cu_k.set(i, ck[i]);
    } else {
      q = HostTensor(dt, {b, sq, hq, d}), out = HostTensor(dt, {b, sq, hq, dvh}), dout = HostTensor(dt, {b, sq, hq, dvh});
      k = HostTensor(dt, {b, sk, hkv, d}), v = HostTensor(dt, {b, sk, hkv, dvh});
      lse = HostTensor(DType::f32, {b, hq, sq});
    }
    dq = HostTensor(dt, q.shape()), dk = HostTensor(dt, k.shape()), dv = HostTensor(dt, v.shape());
    std::mt19937_64 rng(3);
    for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
    // A real forward first, so that the backward's O and LSE are consistent.
    for (HostTensor* t : outputs()) t->poison();
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
    if (varlen) a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
    a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    opt.backend = Backend::cpu_flash;
    const Status st = attention_forward(a, opt);
    EXPECT_TRUE(st.ok()) << st.message;
  }

  std::vector<HostTensor*> outputs() { return {&out, &lse, &dq, &dk, &dv}; }

  // Back to the valid call (views, cu_seqlens contents, options) after mutations.
  void restore(bool varlen) {
    a = BackwardArgs();
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
    if (varlen) {
      a.cu_seqlens_q = cu_q.view(), a.cu_seqlens_k = cu_k.view();
      const int32_t cq[] = {0, 3, 7}, ck[] = {0, 9, 9};
      for (int i = 0; i < 3; ++i) cu_q.set(i, cq[i]), cu_k.set(i, ck[i]);
    }
    a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
    opt = AttentionOptions();
    opt.backend = Backend::cpu_flash;
  }

  std::vector<std::vector<uint8_t>> snapshot() {
    std::vector<std::vector<uint8_t>> s;
    for (HostTensor* t : outputs()) {
      const uint8_t* p = static_cast<const uint8_t*>(t->data());
      s.emplace_back(p, p + t->bytes());
    }
    return s;
  }
};

bool names_argument(const std::string& msg, const std::string& name) { return msg.rfind(name + ":", 0) == 0; }

// Runs forward and backward on a mutated call: both must fail, name `arg`, and leave the outputs untouched.
void expect_rejected(Call& c, const std::string& arg, bool forward = true, bool backward = true) {
  const auto before = c.snapshot();
  if (forward) {
    const Status st = attention_forward(c.a, c.opt);
    EXPECT_EQ(st.code, ErrorCode::invalid_argument) << arg << ": " << st.message;
    EXPECT_TRUE(names_argument(st.message, arg)) << "forward message does not name " << arg << ": " << st.message;
  }
  if (backward) {
    const Status st = attention_backward(c.a, c.opt);
    EXPECT_EQ(st.code, ErrorCode::invalid_argument) << arg << ": " << st.message;
    EXPECT_TRUE(names_argument(st.message, arg)) << "backward message does not name " << arg << ": " << st.message;
  }
  EXPECT_TRUE(before == c.snapshot()) << arg << ": an output was written by a rejected call";
}

TEST(Validation, ValidCallsRun) {
  for (bool varlen : {false, true}) {
    Call c(varlen);
    EXPECT_TRUE(attention_backward(c.a, c.opt).ok());
    c.a.lse = TensorView();  // the forward may skip the LSE
    EXPECT_TRUE(attention_forward(c.a, c.opt).ok());
  }
}

TEST(Validation, AlibiSlopes) {
  for (bool varlen : {false, true}) {
    Call c(varlen);
    const int64_t b = 2, hq = 4;
    HostTensor per_head(DType::f32, {hq}), per_batch(DType::f32, {b, hq});
    for (int64_t i = 0; i < hq; ++i) per_head.set(i, 0.25 * double(i));
    for (int64_t i = 0; i < b * hq; ++i) per_batch.set(i, 0.1 * double(i));
    for (HostTensor* ok : {&per_head, &per_batch}) {
      c.a.alibi_slopes = ok->view();
      EXPECT_TRUE(attention_backward(c.a, c.opt).ok());
    }
    struct Bad {
      std::vector<int64_t> shape;
      DType dtype;
      double value;
    };
    const Bad bad[] = {{{hq + 1}, DType::f32, 0.5}, {{b + 1, hq}, DType::f32, 0.5}, {{b, hq, 1}, DType::f32, 0.5},
                       {{hq}, DType::f64, 0.5},     {{hq}, DType::f32, NAN},        {{b, hq}, DType::f32, INFINITY},
                       {{hq}, DType::f32, -INFINITY}};
    for (const Bad& x : bad) {
      HostTensor t(x.dtype, x.shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, i == 1 ? x.value : 0.5);
      c.a.alibi_slopes = t.view();
      expect_rejected(c, "alibi_slopes");
    }
    HostTensor strided(DType::f32, {hq}, {}, 0);
    TensorView view = strided.view();
    view.stride[0] = 2, view.shape[0] = 2;  // a view of every other slope: 2 slopes for 4 heads, strided
    c.a.alibi_slopes = view;
    expect_rejected(c, "alibi_slopes");
    c.a.alibi_slopes = TensorView();
  }
}

TEST(Validation, DropoutRng) {
  Call c(false);
  uint64_t state[3] = {11, 4, 0};
  auto rng = [&](void* data, DType dt, std::vector<int64_t> shape) {
    return make_contiguous_view(data, dt, Device{}, int(shape.size()), shape.data());
  };
  c.opt.dropout_p = 0.2;
  c.a.dropout_rng = rng(state, DType::i64, {2});
  EXPECT_TRUE(attention_backward(c.a, c.opt).ok());
  c.a.dropout_rng = rng(state, DType::i32, {2});
  expect_rejected(c, "dropout_rng");
  c.a.dropout_rng = rng(state, DType::i64, {3});
  expect_rejected(c, "dropout_rng");
  c.a.dropout_rng = rng(state, DType::i64, {1, 2});
  expect_rejected(c, "dropout_rng");
  c.a.dropout_rng = rng(reinterpret_cast<uint8_t*>(state) + 4, DType::i64, {2});  // not 8-byte aligned
  expect_rejected(c, "dropout_rng");
  TensorView strided = rng(state, DType::i64, {2});
  strided.stride[0] = 2;
  c.a.dropout_rng = strided;
  expect_rejected(c, "dropout_rng");
  c.a.dropout_rng = rng(state, DType::i64, {2});
  c.a.dropout_rng.device = Device{DeviceType::cuda, 0};  // not on q's device
  expect_rejected(c, "dropout_rng");
  c.a.dropout_rng = rng(state, DType::i64, {2});
  c.opt.dropout_p = 0;  // it keys nothing without dropout
  expect_rejected(c, "dropout_rng");
}

TEST(Validation, MismatchedShapes) {
  struct M {
    const char* arg;
    std::function<void(BackwardArgs&)> f;
  } cases[] = {
      {"k", [](BackwardArgs& a) { a.k.shape[0] = 3; }},      // batch
      {"v", [](BackwardArgs& a) { a.v.shape[1] = 5; }},      // seqlen_k
      {"k", [](BackwardArgs& a) { a.k.shape[3] = 16; }},     // head dim of K != Q
      {"out", [](BackwardArgs& a) { a.out.shape[1] = 4; }},  // seqlen_q
      {"out", [](BackwardArgs& a) { a.out.shape[3] = 8; }},  // d_v
      {"lse", [](BackwardArgs& a) { a.lse.shape[2] = 4; }},
      {"v", [](BackwardArgs& a) { a.v.shape[2] = 1; }},      // heads of V != K
      {"q", [](BackwardArgs& a) { a.q.shape[1] = -1; }},
      {"q", [](BackwardArgs& a) { a.q.rank = 3; }},
      {"k", [](BackwardArgs& a) { a.k.rank = 2; }},
      {"out", [](BackwardArgs& a) { a.out.rank = 0; }},      // undefined: required
  };
  for (const M& m : cases) {
    Call c(false);
    m.f(c.a);
    expect_rejected(c, m.arg);
  }
  struct G {
    const char* arg;
    std::function<void(BackwardArgs&)> f;
  } grads[] = {
      {"dout", [](BackwardArgs& a) { a.dout.shape[3] = 8; }}, {"dq", [](BackwardArgs& a) { a.dq.shape[1] = 6; }},
      {"dk", [](BackwardArgs& a) { a.dk.shape[2] = 4; }},     {"dv", [](BackwardArgs& a) { a.dv.shape[0] = 1; }},
      {"dout", [](BackwardArgs& a) { a.dout = TensorView(); }}, {"dq", [](BackwardArgs& a) { a.dq = TensorView(); }},
      {"lse", [](BackwardArgs& a) { a.lse = TensorView(); }},
  };
  for (const G& g : grads) {
    Call c(false);
    g.f(c.a);
    expect_rejected(c, g.arg, /*forward=*/false, /*backward=*/true);
  }
}

TEST(Validation, MismatchedDtypesAndDevices) {
  {
    Call c(false);
    c.a.k.dtype = DType::f64;
    expect_rejected(c, "k");
  }
  {
    Call c(false);
    c.a.out.dtype = DType::bf16;
    expect_rejected(c, "out");
  }
  {
    Call c(false);
    c.a.lse.dtype = DType::f16;
    expect_rejected(c, "lse");
  }
  {
    Call c(false);
    c.a.q.dtype = DType::i32;  // not a floating type
    expect_rejected(c, "q");
  }
  {
    Call c(false);
    c.a.dk.dtype = DType::f16;
    expect_rejected(c, "dk", false, true);
  }
  {
    Call c(false);
    c.a.v.device = Device{DeviceType::cuda, 0};
    expect_rejected(c, "v");
  }
  {
    Call c(false);
    c.a.dv.device = Device{DeviceType::cuda, 1};
    expect_rejected(c, "dv", false, true);
  }
}

TEST(Validation, HeadsAndHeadDims) {
  {
    Call c(false);  // 4 query heads over 3 KV heads
    c.a.k.shape[2] = 3, c.a.v.shape[2] = 3, c.a.dk.shape[2] = 3, c.a.dv.shape[2] = 3;
    expect_rejected(c, "k");
  }
  for (int64_t d : {int64_t(0), kMaxHeadDim + 1}) {
    Call c(false);
    for (TensorView* t : {&c.a.q, &c.a.k, &c.a.dq, &c.a.dk}) t->shape[3] = d;
    expect_rejected(c, "q");
  }
  for (int64_t d : {int64_t(0), kMaxHeadDimV + 1}) {
    Call c(false);
    for (TensorView* t : {&c.a.v, &c.a.out, &c.a.dout, &c.a.dv}) t->shape[3] = d;
    expect_rejected(c, "v");
  }
  {
    Call c(false);
    for (TensorView* t : {&c.a.k, &c.a.v, &c.a.dk, &c.a.dv}) t->shape[2] = 0;
    expect_rejected(c, "k");
  }
}

TEST(Validation, StridesAndPointers) {
  const char* names[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
  for (int n = 0; n < 9; ++n) {
    const bool fwd = n < 5;
    {
      Call c(false);
      TensorView* views[] = {&c.a.q, &c.a.k, &c.a.v, &c.a.out, &c.a.lse, &c.a.dout, &c.a.dq, &c.a.dk, &c.a.dv};
      views[n]->stride[views[n]->rank - 1] = 2;  // last dimension not contiguous
      expect_rejected(c, names[n], fwd, true);
    }
    {
      Call c(false);
      TensorView* views[] = {&c.a.q, &c.a.k, &c.a.v, &c.a.out, &c.a.lse, &c.a.dout, &c.a.dq, &c.a.dk, &c.a.dv};
      views[n]->data = nullptr;
      expect_rejected(c, names[n], fwd, true);
    }
    {
      Call c(false);
      TensorView* views[] = {&c.a.q, &c.a.k, &c.a.v, &c.a.out, &c.a.lse, &c.a.dout, &c.a.dq, &c.a.dk, &c.a.dv};
      views[n]->stride[0] = -5;
      expect_rejected(c, names[n], fwd, true);
    }
  }
}

TEST(Validation, CuSeqlens) {
  {
    Call c(true);
    c.a.cu_seqlens_k = TensorView();  // one without the other
    expect_rejected(c, "cu_seqlens_k");
  }
  {
    Call c(true);
    c.a.cu_seqlens_q = TensorView();
    expect_rejected(c, "cu_seqlens_q");
  }
  {
    Call c(true);
    c.cu_q.set(1, 8);  // 0, 8, 7: decreasing
    expect_rejected(c, "cu_seqlens_q");
  }
  {
    Call c(true);
    c.cu_k.set(2, 8);  // last entry != total_k (9)
    expect_rejected(c, "cu_seqlens_k");
  }
  {
    Call c(true);
    c.cu_q.set(0, 1);  // must start at 0
    expect_rejected(c, "cu_seqlens_q");
  }
  {
    Call c(true);
    c.a.cu_seqlens_q.dtype = DType::f32;
    expect_rejected(c, "cu_seqlens_q");
  }
  {
    Call c(true);
    c.a.cu_seqlens_k.shape[0] = 2;  // batch + 1 entries like cu_seqlens_q
    expect_rejected(c, "cu_seqlens_k");
  }
  {
    Call c(true);
    c.a.cu_seqlens_q.shape[0] = 0;  // not even one entry: no batch size at all
    c.a.cu_seqlens_k.shape[0] = 0;
    expect_rejected(c, "cu_seqlens_q");
  }
  {
    Call c(true);
    c.a.max_seqlen_q = 3;  // the longest query sequence has 4 rows
    expect_rejected(c, "max_seqlen_q");
  }
  {
    Call c(true);
    c.a.max_seqlen_k = -1;
    expect_rejected(c, "max_seqlen_k");
  }
}

TEST(Validation, Options) {
  struct O {
    const char* arg;
    std::function<void(AttentionOptions&)> f;
  } cases[] = {
      {"window_left", [](AttentionOptions& o) { o.window_left = -2; }},
      {"window_right", [](AttentionOptions& o) { o.window_right = -7; }},
      {"attention_chunk", [](AttentionOptions& o) { o.attention_chunk = -1; }},
      {"softcap", [](AttentionOptions& o) { o.softcap = -1; }},
      {"dropout_p", [](AttentionOptions& o) { o.dropout_p = 1.0; }},
      {"dropout_p", [](AttentionOptions& o) { o.dropout_p = -0.25; }},
      {"dropout_p", [](AttentionOptions& o) { o.dropout_p = NAN; }},
      {"softcap", [](AttentionOptions& o) { o.softcap = INFINITY; }},
      {"softmax_scale", [](AttentionOptions& o) { o.softmax_scale = NAN; }},
      {"softmax_scale", [](AttentionOptions& o) { o.softmax_scale = 1e300; }},  // finite, but inf in fp32
      {"softcap", [](AttentionOptions& o) { o.softcap = 1e39; }},
      {"num_threads", [](AttentionOptions& o) { o.num_threads = -1; }},
      {"backend", [](AttentionOptions& o) { o.backend = Backend(42); }},
  };
  for (const O& m : cases) {
    Call c(false);
    m.f(c.opt);
    expect_rejected(c, m.arg);
  }
}

// Random mutations of valid calls. A mutation may make the call invalid (then it must be rejected with a message
// naming an argument, outputs untouched) or leave it valid (then, if the views still lie inside their buffers,
// it must run). Mutations never make a view claim memory its buffer lacks for a tensor validation itself reads
// (cu_seqlens), since no validator can detect that lie.
class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  int64_t pick(int64_t n) { return int64_t(rng_() % uint64_t(n)); }

  int64_t weird_size(int64_t current) {
    const int64_t options[] = {-1, 0, 1, 2, current - 1, current + 1, 300, int64_t(1) << 40, -(int64_t(1) << 40)};
    return options[pick(9)];
  }

  void mutate(Call& c) {
    TensorView* views[] = {&c.a.q, &c.a.k, &c.a.v, &c.a.out, &c.a.lse, &c.a.dout, &c.a.dq, &c.a.dk, &c.a.dv};
    TensorView* cu[] = {&c.a.cu_seqlens_q, &c.a.cu_seqlens_k};
    switch (pick(12)) {
      case 0: {
        TensorView* t = views[pick(9)];
        if (t->rank > 0) {
          const int i = int(pick(t->rank));
          t->shape[i] = weird_size(t->shape[i]);
        }
        break;
      }
      case 1: {
        TensorView* t = views[pick(9)];
        if (t->rank > 0) {
          const int i = int(pick(t->rank));
          const int64_t options[] = {-1, 0, 2, t->stride[i] * 2, int64_t(1) << 40};
          t->stride[i] = options[pick(5)];
        }
        break;
      }
      case 2: views[pick(9)]->dtype = DType(pick(5)); break;
      case 3: views[pick(9)]->rank = int(pick(5)); break;
      case 4: views[pick(9)]->data = nullptr; break;
      case 5: views[pick(9)]->device = Device{pick(2) ? DeviceType::cuda : DeviceType::cpu, int(pick(2))}; break;
      case 6: *views[pick(9)] = TensorView(); break;
      case 7: {  // cu_seqlens contents
        HostTensor* t = pick(2) ? &c.cu_q : &c.cu_k;
        if (c.a.cu_seqlens_q.defined()) t->set(pick(3), double(pick(13) - 3));
        break;
      }
      case 8: {  // cu_seqlens views, never larger than their buffers
        TensorView* t = cu[pick(2)];
        const int kind = int(pick(5));
        if (kind == 0) *t = TensorView();
        if (kind == 1) t->shape[0] = pick(3);  // 0..2 of the 3 entries
        if (kind == 2) t->dtype = DType(pick(5));
        if (kind == 3) t->data = nullptr;
        if (kind == 4) t->rank = int(pick(2)) * 2;
        break;
      }
      case 9: {
        const int64_t options[] = {-5, -1, 0, 2, 100};
        (pick(2) ? c.a.max_seqlen_q : c.a.max_seqlen_k) = options[pick(5)];
        break;
      }
      case 10: {
        const int64_t w[] = {-9, -2, -1, 0, 1, 3, 1000};
        (pick(2) ? c.opt.window_left : c.opt.window_right) = w[pick(7)];
        c.opt.causal = pick(2) == 1;
        if (pick(3) == 0) c.opt.attention_chunk = w[pick(7)];
        break;
      }
      case 11: {
        const double vals[] = {-1.0, 0.0, 0.5, NAN, INFINITY};
        if (pick(2)) c.opt.softcap = vals[pick(5)];
        else c.opt.softmax_scale = vals[pick(5)];
        c.opt.num_threads = pick(2) ? -1 : 1;  // invalid, or one thread (thousands of tiny runs)
        c.opt.backend = Backend(pick(7));
        break;
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

// True when every non-empty view lies inside the buffer it came from (so running an accepted call is safe).
bool views_in_bounds(Call& c) {
  struct P {
    const TensorView* v;
    const HostTensor* t;
  } pairs[] = {{&c.a.q, &c.q},   {&c.a.k, &c.k},   {&c.a.v, &c.v},   {&c.a.out, &c.out}, {&c.a.lse, &c.lse},
               {&c.a.dout, &c.dout}, {&c.a.dq, &c.dq}, {&c.a.dk, &c.dk}, {&c.a.dv, &c.dv}};
  for (const P& p : pairs) {
    if (!p.v->defined() || p.v->numel() == 0) continue;
    if (p.v->data != p.t->data()) return false;
    int64_t last = 0;
    for (int i = 0; i < p.v->rank; ++i) {
      if (p.v->shape[i] < 0 || p.v->stride[i] < 0 || p.v->shape[i] > (int64_t(1) << 30) || p.v->stride[i] > (int64_t(1) << 30)) return false;
      last += (p.v->shape[i] - 1) * p.v->stride[i];
    }
    if (size_t(last + 1) * dtype_size(p.v->dtype) > p.t->bytes()) return false;
  }
  return true;
}

TEST(Validation, RandomMutationsNeverCrashNorWrite) {
  const char* known[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k",
                         "max_seqlen_q", "max_seqlen_k", "softmax_scale", "softcap", "window_left", "window_right",
                         "attention_chunk", "num_threads", "backend"};
  Mutator m(20261129);
  int rejected = 0, ran = 0;
  Call calls[2] = {Call(false), Call(true)};
  for (int iter = 0; iter < 3000; ++iter) {
    Call& c = calls[iter % 2];
    c.restore(iter % 2 == 1);
    c.opt.num_threads = 1;
    const int mutations = 1 + int(m.pick(3));
    for (int k = 0; k < mutations; ++k) m.mutate(c);
    for (bool backward : {false, true}) {
      const auto before = c.snapshot();  // an accepted forward just above may have written
      Status st;
      if (backward) {
        BwdParams p;
        st = make_backward_params(c.a, c.opt, &p);
      } else {
        FwdParams p;
        st = make_forward_params(c.a, c.opt, &p);
      }
      if (!st.ok()) {
        ++rejected;
        EXPECT_FALSE(st.message.empty());
        if (st.code == ErrorCode::invalid_argument) {
          bool named = false;
          for (const char* n : known) named = named || names_argument(st.message, n);
          EXPECT_TRUE(named) << "iteration " << iter << ": message names no argument: " << st.message;
        }
        const Status run = backward ? attention_backward(c.a, c.opt) : attention_forward(c.a, c.opt);
        EXPECT_FALSE(run.ok()) << "iteration " << iter << ": validation rejected but the call ran";
        EXPECT_TRUE(before == c.snapshot()) << "iteration " << iter << ": a rejected call wrote an output";
      } else if (views_in_bounds(c) && c.a.q.device.type == DeviceType::cpu) {
        const Status run = backward ? attention_backward(c.a, c.opt) : attention_forward(c.a, c.opt);
        // Valid CPU input: the only acceptable failure is a backend that does not run CPU tensors.
        if (!run.ok()) EXPECT_EQ(run.code, ErrorCode::unsupported) << "iteration " << iter << ": " << run.message;
        ++ran;
      }
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(ran, 100);
}

}  // namespace
}  // namespace flashattn::test

// The CPU kernels' instruction-set level: named, and capped by FLASHATTN_CPU_ISA when it names a level the CPU
// supports (the suite runs once per level with it set: tests/CMakeLists.txt).
TEST(CpuIsa, LevelIsNamedAndTheCapApplies) {
  const std::string level = flashattn::cpu_isa();
  EXPECT_TRUE(level == "baseline" || level == "avx2" || level == "avx512" || level == "avx512_bf16" ||
              level == "native")
      << level;
  const char* cap = std::getenv("FLASHATTN_CPU_ISA");
  if (cap == nullptr || *cap == '\0') return;
  const std::string want = cap;
  const bool supported = want == "baseline" || (want == "avx2" && __builtin_cpu_supports("x86-64-v3")) ||
                         (want == "avx512" && __builtin_cpu_supports("x86-64-v4")) ||
                         (want == "avx512_bf16" && __builtin_cpu_supports("x86-64-v4") &&
                          __builtin_cpu_supports("avx512bf16"));
  if (supported) {
    EXPECT_EQ(level, want);
  } else {
    EXPECT_NE(level, want);
  }
}
