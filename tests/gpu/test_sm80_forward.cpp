// The sm80 forward kernel against the oracle (tests/common/oracle.h), over a grid of lengths, s_q != s_k,
// GQA/MQA, head dims (odd ones and d_v != d), both layouts, padded rows, misaligned pointers and strides, causal /
// window / softcap, softmax scales of the caller's, varlen with empty sequences, fully masked rows, fp16 and bf16.
//
// Tolerance (FA3's rule): err(ours) <= 2 * err(naive attention in the same low precision) + atol, errors being
// ‖x − O_exact‖ / ‖O_exact‖ over the whole output. The naive low-precision attention stores P in the input
// dtype (as the kernel feeds P to the tensor cores), accumulates P·V exactly and rounds O to the dtype; the
// exact O comes from the same inputs in double precision. Per element, as for the Hopper forward
// (test_sm90_forward.cpp): |O − O_exact| ≤ 4u (|O_exact| + terms), plus 2^-22 per visible key with fp16. LSE is fp32 from fp32 scores: within 1e-3 absolute
// (the scores are O(10)), and -inf exactly where the reference has -inf. Outputs are poisoned (NaN) before
// each run, so an unwritten element fails; padding around the outputs must stay poisoned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/oracle.h"
#include "cuda/sm80/forward_entry.h"
#include "flashattn/flashattn.h"
#include "gpu/device_tensor.h"

namespace flashattn::test {
namespace {

struct Case {
  std::string name;
  DType dtype = DType::bf16;
  int64_t batch = 1, sq = 64, sk = 64, hq = 2, hkv = 2, d = 64, dv = 64;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  int64_t chunk = 0;       // attention_chunk (0: none)
  double softcap = 0;
  double softmax_scale = 0;  // 0: 1/√d
  bool bhsd = false;       // storage [b, h, s, d] viewed as [b, s, h, d]
  int64_t pad = 0;         // extra elements after every row of every tensor
  bool misalign = false;   // every data pointer one element past a 16-byte boundary, odd strides
  std::vector<int> lens_q, lens_k;  // non-empty: varlen with these sequence lengths
  bool with_lse = true;
  int smem_limit = 0;      // > 0: run as if a block could use only this much shared memory (compact tiles)
};

// One tensor argument: host storage (with layout, padding and misalignment), its device mirror, and views.
class Arg {
 public:
  Arg(DType t, std::vector<int64_t> shape, bool bhsd, int64_t pad, bool misalign) : shape_(shape) {
    std::vector<int64_t> storage_shape = shape;
    if (misalign) storage_shape.back() += 1;  // the view starts one element in
    std::vector<int> perm(shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    if (bhsd && shape.size() == 4) perm = {0, 2, 1, 3};
    if (bhsd && shape.size() == 3) perm = {1, 0, 2};
    host_ = HostTensor(t, storage_shape, perm, pad);
    offset_ = misalign ? 1 : 0;
  }
  HostTensor& host() { return host_; }
  const HostTensor& host() const { return host_; }
  void upload() { dev_ = std::make_unique<DeviceTensor>(host_); }
  void download() { dev_->download(host_); }

  TensorView view(bool on_device) const {
    TensorView v = on_device ? dev_->view(host_) : host_.view();
    v.data = static_cast<char*>(v.data) + offset_ * int64_t(dtype_size(host_.dtype()));
    for (size_t i = 0; i < shape_.size(); ++i) v.shape[i] = shape_[i];
    return v;
  }

  // Storage offset of every logical element, row-major.
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out;
    std::vector<int64_t> idx(shape_.size(), 0);
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    for (int64_t e = 0; e < n; ++e) {
      int64_t off = offset_;
      for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * host_.strides()[i];
      out.push_back(off);
      for (int dd = int(shape_.size()) - 1; dd >= 0; --dd) {
        if (++idx[size_t(dd)] < shape_[size_t(dd)]) break;
        idx[size_t(dd)] = 0;
      }
    }
    return out;
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for (int64_t off : offsets()) v.push_back(host_.get(off));
    return v;
  }
  void fill(std::mt19937_64& rng) { host_.fill_normal(rng); }

 private:
  std::vector<int64_t> shape_;
  HostTensor host_;
  std::unique_ptr<DeviceTensor> dev_;
  int64_t offset_ = 0;
};

struct Problem {
  Case c;
  bool varlen;
  int64_t total_q = 0, total_k = 0;
  std::unique_ptr<Arg> q, k, v, o, lse;
  HostTensor cu_q, cu_k;
  std::unique_ptr<DeviceTensor> cu_q_dev, cu_k_dev;

  explicit Problem(const Case& cs, uint64_t seed) : c(cs), varlen(!cs.lens_q.empty()) {
    std::mt19937_64 rng(seed);
    const DType t = c.dtype;
    if (varlen) {
      const int64_t b = int64_t(c.lens_q.size());
      cu_q = cu_seqlens_of(c.lens_q);
      cu_k = cu_seqlens_of(c.lens_k);
      total_q = int64_t(cu_q.get(b)), total_k = int64_t(cu_k.get(b));
      q = std::make_unique<Arg>(t, std::vector<int64_t>{total_q, c.hq, c.d}, c.bhsd, c.pad, c.misalign);
      k = std::make_unique<Arg>(t, std::vector<int64_t>{total_k, c.hkv, c.d}, c.bhsd, c.pad, c.misalign);
      v = std::make_unique<Arg>(t, std::vector<int64_t>{total_k, c.hkv, c.dv}, c.bhsd, c.pad, c.misalign);
      o = std::make_unique<Arg>(t, std::vector<int64_t>{total_q, c.hq, c.dv}, c.bhsd, c.pad, c.misalign);
      lse = std::make_unique<Arg>(DType::f32, std::vector<int64_t>{c.hq, total_q}, false, 0, false);
      cu_q_dev = std::make_unique<DeviceTensor>(cu_q);
      cu_k_dev = std::make_unique<DeviceTensor>(cu_k);
    } else {
      q = std::make_unique<Arg>(t, std::vector<int64_t>{c.batch, c.sq, c.hq, c.d}, c.bhsd, c.pad, c.misalign);
      k = std::make_unique<Arg>(t, std::vector<int64_t>{c.batch, c.sk, c.hkv, c.d}, c.bhsd, c.pad, c.misalign);
      v = std::make_unique<Arg>(t, std::vector<int64_t>{c.batch, c.sk, c.hkv, c.dv}, c.bhsd, c.pad, c.misalign);
      o = std::make_unique<Arg>(t, std::vector<int64_t>{c.batch, c.sq, c.hq, c.dv}, c.bhsd, c.pad, c.misalign);
      lse = std::make_unique<Arg>(DType::f32, std::vector<int64_t>{c.batch, c.hq, c.sq}, false, 0, false);
    }
    q->fill(rng), k->fill(rng), v->fill(rng);
    q->upload(), k->upload(), v->upload();
  }

  ForwardArgs args(bool on_device) const {
    ForwardArgs a;
    a.q = q->view(on_device), a.k = k->view(on_device), a.v = v->view(on_device), a.out = o->view(on_device);
    if (c.with_lse) a.lse = lse->view(on_device);
    if (varlen) {
      a.cu_seqlens_q = on_device ? cu_q_dev->view(cu_q) : cu_q.view();
      a.cu_seqlens_k = on_device ? cu_k_dev->view(cu_k) : cu_k.view();
    }
    return a;
  }

  AttentionOptions options(Backend b) const {
    AttentionOptions opt;
    opt.causal = c.causal, opt.window_left = c.wl, opt.window_right = c.wr, opt.softcap = c.softcap;
    opt.attention_chunk = c.chunk;
    opt.softmax_scale = c.softmax_scale;
    opt.backend = b;
    return opt;
  }

  // Poisons O and LSE, runs the sm80 forward, downloads both.
  Status run_gpu() {
    o->host().poison(), lse->host().poison();
    o->upload(), lse->upload();
    Status st;
    if (c.smem_limit > 0) {
      FwdParams p;
      st = make_forward_params(args(true), options(Backend::cuda_sm80), &p);
      if (st.ok()) st = detail::cuda_sm80_forward_limited(p, c.smem_limit);
    } else {
      st = attention_forward(args(true), options(Backend::cuda_sm80));
    }
    if (!st.ok()) return st;
    if (cudaDeviceSynchronize() != cudaSuccess) return Status::device("kernel failed");
    o->download(), lse->download();
    return st;
  }
};

struct Reference {
  std::vector<double> out, out_lowp, lse, out_bound;  // logical row-major order of O and LSE
};

// The exact O and LSE, the naive low-precision O (P rounded to the dtype before P V) and the per-element bound.
Reference reference(const Problem& pb) {
  const Case& c = pb.c;
  AttnSpec spec;
  spec.causal = c.causal, spec.window_left = c.wl, spec.window_right = c.wr, spec.softcap = c.softcap;
  spec.attention_chunk = c.chunk;
  spec.softmax_scale = c.softmax_scale;
  spec.lens_q.assign(c.lens_q.begin(), c.lens_q.end());
  spec.lens_k.assign(c.lens_k.begin(), c.lens_k.end());
  const AttnShape shape{c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.dv};
  const std::vector<double> q = pb.q->values(), k = pb.k->values(), v = pb.v->values();
  const AttnResult exact = textbook_attention<double>(shape, q, k, v, nullptr, spec);
  const AttnResult lowp = textbook_attention<double>(shape, q, k, v, nullptr, spec, Rounding{c.dtype, true});
  Reference r{exact.o, lowp.o, exact.lse, {}};
  const double u = unit_roundoff(c.dtype);
  const int64_t batches = pb.varlen ? int64_t(c.lens_q.size()) : c.batch;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t sq = pb.varlen ? c.lens_q[size_t(b)] : c.sq, sk = pb.varlen ? c.lens_k[size_t(b)] : c.sk;
    for (int64_t i = 0; i < sq; ++i) {
      int64_t keys = 0;
      if (c.dtype == DType::f16)
        for (int64_t j = 0; j < sk; ++j) keys += spec.sees(i, j, sq, sk);
      for (int64_t x = 0; x < c.hq * c.dv; ++x) {
        const size_t e = r.out_bound.size();
        r.out_bound.push_back(4 * u * (std::fabs(exact.o[e]) + exact.o_mag[e]) + 0x1p-22 * double(keys));
      }
    }
  }
  return r;
}

// Storage elements outside the view must still hold the poison after the run.
void expect_padding_untouched(const Arg& a, const char* what) {
  const HostTensor& h = a.host();
  std::vector<char> covered(size_t(h.storage_elems()), 0);
  for (int64_t off : a.offsets()) covered[size_t(off)] = 1;
  int64_t touched = 0;
  for (int64_t off = 0; off < h.storage_elems(); ++off) {
    if (!covered[size_t(off)] && !std::isnan(h.get(off))) ++touched;
  }
  EXPECT_EQ(touched, 0) << what << ": elements outside the tensor were written";
}

void check_case(const Case& c) {
  Problem pb(c, std::hash<std::string>()(c.name));
  Status st = pb.run_gpu();
  ASSERT_TRUE(st.ok()) << st.message;
  const Reference ref = reference(pb);

  const std::vector<double> ours = pb.o->values();
  const double err = relative_error(ours, ref.out);
  const double err_lowp = relative_error(ref.out_lowp, ref.out);
  const double atol = 0.25 * unit_roundoff(c.dtype);
  EXPECT_LE(err, 2 * err_lowp + atol) << "O: relative error " << err << " vs naive low-precision " << err_lowp;
  std::printf("[ errors ] %-28s O %.2e (naive low precision %.2e)\n", c.name.c_str(), err, err_lowp);
  std::string worst;
  EXPECT_EQ(count_outside(ours, ref.out, ref.out_bound, &worst), 0)
      << "O elements outside 4u(|O_exact| + terms); worst " << worst;
  expect_padding_untouched(*pb.o, "out");

  const std::vector<double> lse = pb.lse->values();
  if (c.with_lse) {
    double worst = 0;
    int64_t bad_inf = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(ref.lse[i]) || std::isinf(lse[i]) || std::isnan(lse[i])) {
        bad_inf += lse[i] != ref.lse[i];
        continue;
      }
      worst = std::max(worst, std::fabs(lse[i] - ref.lse[i]));
    }
    EXPECT_EQ(bad_inf, 0) << "LSE: -inf / NaN where the reference disagrees";
    EXPECT_LE(worst, 1e-3) << "LSE: max abs error";
  } else {
    for (double x : lse) ASSERT_TRUE(std::isnan(x)) << "LSE written although lse was not passed";
  }
}

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Sm80Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Sm80Forward, MatchesReference) {
  FA_REQUIRE_GPU();
  check_case(GetParam());
}

Case mk(std::string name) {
  Case c;
  c.name = std::move(name);
  return c;
}

std::vector<Case> grid() {
  std::vector<Case> v;
  // Lengths, square and not, with and without causal. "tiny_" cases also run under compute-sanitizer.
  for (int64_t s : {1, 2, 17, 127, 1000}) {
    for (bool causal : {false, true}) {
      Case c = mk(std::string(s <= 17 ? "tiny_" : "") + "len" + std::to_string(s) + (causal ? "_causal" : ""));
      c.sq = c.sk = s, c.causal = causal;
      v.push_back(c);
    }
  }
  {
    Case c = mk("long2048_causal_hd128");
    c.sq = c.sk = 2048, c.d = c.dv = 128, c.hq = c.hkv = 2, c.causal = true;
    v.push_back(c);
    c = mk("long1536_fp16_hd64_batch2");
    c.sq = c.sk = 1536, c.batch = 2, c.dtype = DType::f16;
    v.push_back(c);
  }
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{100, 300}, {300, 100}, {1, 513}, {513, 1}, {129, 64}}) {
    for (bool causal : {false, true}) {
      Case c = mk("sq" + std::to_string(sq) + "_sk" + std::to_string(sk) + (causal ? "_causal" : ""));
      c.sq = sq, c.sk = sk, c.causal = causal;  // causal with sq > sk: the first rows see no key
      v.push_back(c);
    }
  }
  // GQA / MQA.
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 1}, {4, 2}, {8, 8}}) {
    Case c = mk("gqa" + std::to_string(hq) + "_" + std::to_string(hkv));
    c.hq = hq, c.hkv = hkv, c.sq = 200, c.sk = 333, c.causal = hq == 4;
    v.push_back(c);
  }
  // Head dims, every bucket, odd ones, d_v != d.
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{8, 8}, {40, 40}, {64, 64}, {72, 72}, {96, 96}, {128, 128},
                       {160, 160}, {256, 256}, {64, 128}, {128, 40}, {256, 8}, {3, 5}, {1, 1}, {200, 256}}) {
    for (DType t : {DType::bf16, DType::f16}) {
      Case c = mk("hd" + std::to_string(d) + "_" + std::to_string(dv) + (t == DType::f16 ? "_fp16" : "_bf16"));
      c.d = d, c.dv = dv, c.dtype = t, c.sq = 150, c.sk = 190, c.causal = d % 2 == 0;
      v.push_back(c);
    }
  }
  // The 99 KB of a compute capability 8.6 / 8.9 block: d = 256 runs its compact tile (64 query rows), the other
  // buckets their regular ones. Lengths around the compact tile's 64 rows, masks, GQA, varlen, d_v != d.
  constexpr int kConsumerGpuSmem = 99 * 1024;
  for (int variant = 0; variant < 6; ++variant) {
    Case c = mk("smem99k_" + std::to_string(variant));
    c.smem_limit = kConsumerGpuSmem;
    c.d = c.dv = 256, c.sq = 65 + 60 * variant, c.sk = 130 + 33 * variant, c.causal = variant % 2 == 1;
    if (variant == 1) c.dtype = DType::f16;
    if (variant == 2) c.d = 200, c.dv = 176, c.hq = 4, c.hkv = 1;
    if (variant == 3) c.wl = 40, c.wr = 10, c.softcap = 30;
    if (variant == 4) c.d = c.dv = 128;
    if (variant == 5) c.lens_q = {64, 0, 131}, c.lens_k = {100, 3, 131}, c.d = c.dv = 64;
    v.push_back(c);
  }
  // Layouts: [b, h, s, d] storage, padded rows (aligned and not), misaligned pointers.
  for (int variant = 0; variant < 6; ++variant) {
    Case c = mk("layout" + std::to_string(variant));
    c.sq = 177, c.sk = 145, c.hq = 4, c.hkv = 2, c.batch = 2, c.causal = variant % 2 == 1;
    c.bhsd = variant >= 3;
    c.pad = variant % 3 == 1 ? 8 : variant % 3 == 2 ? 3 : 0;
    c.misalign = variant == 5 || variant == 2;
    if (variant == 4) c.d = c.dv = 128;
    v.push_back(c);
  }
  {
    Case c = mk("tiny_misaligned_hd40");
    c.sq = 9, c.sk = 70, c.d = c.dv = 40, c.misalign = true, c.pad = 1;
    v.push_back(c);
  }
  // Windows, with and without causal; softcap.
  struct W {
    int64_t wl, wr;
    bool causal;
  };
  for (W w : {W{32, 0, false}, W{16, 16, false}, W{64, -1, true}, W{0, 0, false}, W{-1, 5, false}, W{100, 3, true}}) {
    Case c = mk("window" + std::to_string(w.wl + 1) + "_" + std::to_string(w.wr + 1) + (w.causal ? "_causal" : ""));
    c.sq = 300, c.sk = 400, c.wl = w.wl, c.wr = w.wr, c.causal = w.causal, c.d = c.dv = 96;
    v.push_back(c);
  }
  // Chunked attention (the extras kernels): with causal, a window, s_q > s_k, GQA, varlen.
  for (int variant = 0; variant < 4; ++variant) {
    Case c = mk("chunk" + std::to_string(variant));
    c.sq = 300, c.sk = variant == 1 ? 200 : 400, c.d = c.dv = variant == 2 ? 256 : 64;
    c.chunk = variant == 0 ? 48 : variant == 1 ? 70 : variant == 2 ? 129 : 9;
    c.causal = variant != 1, c.wl = variant == 2 ? 40 : -1;
    if (variant == 3) c.hq = 4, c.hkv = 2, c.lens_q = {90, 0, 130}, c.lens_k = {140, 7, 200};
    v.push_back(c);
  }
  // A caller's softmax scale (not 1/√d), forward with masks, softcap, GQA and varlen.
  for (int variant = 0; variant < 3; ++variant) {
    Case c = mk("scale" + std::to_string(variant));
    c.softmax_scale = variant == 0 ? 0.3 : variant == 1 ? 0.02 : 1.5;
    c.sq = 190, c.sk = 250, c.causal = variant != 1, c.d = c.dv = variant == 2 ? 80 : 128;
    if (variant == 1) c.softcap = 5, c.hq = 4, c.hkv = 1, c.lens_q = {90, 0, 130}, c.lens_k = {40, 7, 200};
    if (variant == 2) c.dtype = DType::f16, c.wl = 30;
    v.push_back(c);
  }
  for (double cap : {30.0, 2.0}) {
    Case c = mk("softcap" + std::to_string(int(cap)));
    c.softcap = cap, c.sq = c.sk = 257, c.causal = cap > 10, c.d = c.dv = 128;
    v.push_back(c);
    c.name += "_fp16", c.dtype = DType::f16;
    v.push_back(c);
  }
  // Varlen with empty sequences (q empty, k empty: its rows see nothing), causal and not, both layouts.
  for (int variant = 0; variant < 4; ++variant) {
    Case c = mk(std::string(variant == 0 ? "tiny_" : "") + "varlen" + std::to_string(variant));
    c.lens_q = {0, 5, 130, 0, 77, 3, 260};
    c.lens_k = {3, 0, 200, 0, 77, 300, 128};
    c.causal = variant % 2 == 1, c.bhsd = variant >= 2, c.hq = 4, c.hkv = 2;
    if (variant == 3) c.d = 64, c.dv = 200, c.pad = 3;
    v.push_back(c);
  }
  // A whole sequence of fully masked rows: causal with s_q > s_k and a zero left window.
  {
    Case c = mk("tiny_masked_rows");
    c.sq = 40, c.sk = 8, c.causal = true, c.wl = 0;
    v.push_back(c);
    c = mk("no_lse");
    c.with_lse = false, c.sq = 70, c.sk = 90;
    v.push_back(c);
    c = mk("empty_keys");
    c.sq = 33, c.sk = 0;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, Sm80Forward, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Same input, many runs: bitwise equal outputs (a moving result would mean a race).
TEST(Sm80ForwardRuns, Deterministic) {
  FA_REQUIRE_GPU();
  Case c = mk("deterministic");
  c.sq = c.sk = 700, c.causal = true, c.d = c.dv = 128, c.hq = 4;
  Problem pb(c, 7);
  ASSERT_TRUE(pb.run_gpu().ok());
  const std::vector<double> first = pb.o->values();
  for (int run = 1; run < 10; ++run) {
    ASSERT_TRUE(pb.run_gpu().ok());
    const std::vector<double> again = pb.o->values();
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(double)), 0) << "run " << run;
  }
}

// Bad cases return a Status with the reason; nothing crashes.
TEST(Sm80ForwardRuns, RejectsWhatItCannotRun) {
  FA_REQUIRE_GPU();
  // Self-attention arguments (Q = K = V) of the given shape on the GPU, with the tensors they view.
  struct SelfAttention {
    HostTensor q, o;
    DeviceTensor dq, dout;
    ForwardArgs args;
    SelfAttention(DType t, std::vector<int64_t> shape) : q(t, shape), o(t, shape), dq(q), dout(o) {
      args.q = args.k = args.v = dq.view(q);
      args.out = dout.view(o);
    }
  };
  SelfAttention f32(DType::f32, {1, 16, 2, 64});
  const ForwardArgs& a = f32.args;
  AttentionOptions opt;
  opt.backend = Backend::cuda_sm80;
  Status st = attention_forward(a, opt);
  EXPECT_EQ(st.code, ErrorCode::unsupported);
  EXPECT_NE(st.message.find("float16"), std::string::npos) << st.message;

  opt.backend = Backend::automatic;
  st = attention_forward(a, opt);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(st.message.empty());

  // An odd byte address cannot hold 2-byte elements: unsupported, not a fault.
  HostTensor q16(DType::bf16, {1, 16, 2, 64});
  void* dbuf = nullptr;
  ASSERT_EQ(cudaMalloc(&dbuf, q16.bytes() + 64), cudaSuccess);
  ForwardArgs b;
  b.q = b.k = b.v = b.out = q16.view(Device{DeviceType::cuda, 0}, static_cast<char*>(dbuf) + 1);
  opt.backend = Backend::cuda_sm80;
  st = attention_forward(b, opt);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  cudaFree(dbuf);

  // Less shared memory than even the compact d = 256 tile needs: unsupported, saying how much it needs.
  SelfAttention hd256(DType::bf16, {1, 16, 2, 256});
  FwdParams p;
  ASSERT_TRUE(make_forward_params(hd256.args, opt, &p).ok());
  st = detail::cuda_sm80_forward_limited(p, 64 * 1024);
  EXPECT_EQ(st.code, ErrorCode::unsupported) << st.message;
  EXPECT_NE(st.message.find("needs 96 KB"), std::string::npos) << st.message;
}

}  // namespace
}  // namespace flashattn::test
