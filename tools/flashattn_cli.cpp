// `flashattn`: runs attention on random inputs, checks sampled rows against the double-precision reference,
// and reports time, FLOP/s and memory. `flashattn --help` for usage.
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#ifdef FLASHATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "cli_options.h"
#include "common/host_tensor.h"
#include "common/mask.h"
#include "cpu/reference.h"
#include "flashattn/flashattn.h"

// ---- heap accounting: the CPU path's extra memory is the heap peak during a call minus the heap before it ----
namespace {
std::atomic<int64_t> g_heap_now{0}, g_heap_peak{0};
constexpr size_t kHeader = alignof(std::max_align_t);

void* counted_alloc(size_t n) {
  void* p = std::malloc(n + kHeader);
  if (!p) return nullptr;
  *static_cast<size_t*>(p) = n;
  const int64_t now = g_heap_now.fetch_add(int64_t(n)) + int64_t(n);
  int64_t peak = g_heap_peak.load();
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now)) {
  }
  return static_cast<char*>(p) + kHeader;
}
void counted_free(void* p) {
  if (!p) return;
  char* base = static_cast<char*>(p) - kHeader;
  g_heap_now.fetch_sub(int64_t(*reinterpret_cast<size_t*>(base)));
  std::free(base);
}
}  // namespace

void* operator new(size_t n) {
  void* p = counted_alloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) {
  void* p = counted_alloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

namespace flashattn::cli {
namespace {

using test::HostTensor;

struct Problem {
  bool cuda = false;
  DType dtype = DType::f32;
  int64_t batch = 0, sq = 0, sk = 0, h = 0, hkv = 0, d = 0, dv = 0;
  std::vector<int64_t> lens_q, lens_k;  // per sequence (padded: all equal)
  bool varlen = false;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

// Uniform values of unit variance from a hash of (seed, index): reproducible and fast to fill in parallel.
void fill_random(HostTensor& t, uint64_t seed) {
  const int64_t n = t.storage_elems();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = double(z >> 11) * 0x1p-53;  // [0, 1)
    t.set(i, (2 * u - 1) * 1.7320508075688772);  // sqrt(3): unit variance
  }
}

// A tensor of logical shape `shape` ([b, s, h, d] or varlen [total, h, d]) stored per --layout.
HostTensor make_tensor(const RunOptions& o, const Problem& pb, std::vector<int64_t> shape) {
  std::vector<int> perm;
  if (o.layout == "bhsd") perm = pb.varlen ? std::vector<int>{1, 0, 2} : std::vector<int>{0, 2, 1, 3};
  return HostTensor(pb.dtype, std::move(shape), perm);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

class Runner {
 public:
  explicit Runner(bool cuda) : cuda_(cuda) {}
  ~Runner() {
#ifdef FLASHATTN_WITH_CUDA
    for (auto& b : buffers_) cudaFree(b.ptr);
#endif
  }

  // Device (or host) memory holding `t`'s storage; returns the view to pass to the API.
  TensorView place(HostTensor& t) {
    if (!cuda_) return t.view();
#ifdef FLASHATTN_WITH_CUDA
    DeviceBuffer b;
    b.bytes = t.bytes();
    if (cudaMalloc(&b.ptr, std::max<size_t>(b.bytes, 1)) != cudaSuccess) {
      std::fprintf(stderr, "flashattn: cudaMalloc of %s failed\n", human_bytes(double(b.bytes)).c_str());
      std::exit(1);
    }
    cudaMemcpy(b.ptr, t.data(), b.bytes, cudaMemcpyHostToDevice);
    buffers_.push_back(b);
    return t.view(Device{DeviceType::cuda, 0}, b.ptr);
#else
    return t.view();
#endif
  }

  void fetch(const TensorView& v, HostTensor& t) {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) cudaMemcpy(t.data(), v.data, t.bytes(), cudaMemcpyDeviceToHost);
#else
    (void)v, (void)t;
#endif
  }

  void synchronize() {
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) cudaDeviceSynchronize();
#endif
  }

  // Extra memory of one call: the CPU heap peak above the level before it, or on CUDA the high-water mark of
  // the device's default stream-ordered pool (the library allocates its workspaces there).
  void reset_peak() {
    heap_before_ = g_heap_now.load();
    g_heap_peak.store(heap_before_);
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
        uint64_t zero = 0;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
      }
    }
#endif
  }
  double peak_extra() {
    double extra = double(g_heap_peak.load() - heap_before_);
#ifdef FLASHATTN_WITH_CUDA
    if (cuda_) {
      cudaMemPool_t pool;
      uint64_t high = 0;
      if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess &&
          cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) == cudaSuccess) {
        extra = double(high);
      }
    }
#endif
    return extra;
  }

  // Median seconds of `iters` runs of f after `warmup` runs.
  template <typename F>
  double time(F&& f, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) f();
    synchronize();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
#ifdef FLASHATTN_WITH_CUDA
      if (cuda_) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        cudaEventRecord(a);
        f();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        cudaEventDestroy(a), cudaEventDestroy(b);
        t.push_back(ms * 1e-3);
        continue;
      }
#endif
      const double t0 = now_seconds();
      f();
      t.push_back(now_seconds() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

 private:
  bool cuda_;
  std::vector<DeviceBuffer> buffers_;
  int64_t heap_before_ = 0;
};

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16") return DType::f16;
  if (s == "fp64") return DType::f64;
  return DType::f32;
}

// Visible (query, key) pairs of every head: exact, so causal, window and chunk FLOPs count what is computed.
double visible_pairs(const Problem& pb, const AttentionOptions& a) {
  double pairs = 0;
  for (size_t b = 0; b < pb.lens_q.size(); ++b) {
    const MaskSpec m = MaskSpec::make(pb.lens_q[b], pb.lens_k[b], a.causal, a.window_left, a.window_right,
                                      a.attention_chunk);
    for (int64_t i = 0; i < pb.lens_q[b]; ++i) {
      int64_t lo, hi;
      m.key_range(i, &lo, &hi);
      pairs += double(hi - lo);
    }
  }
  return pairs;
}

struct CheckResult {
  int rows = 0;
  double rel_err = 0;  // norm-wise over the checked values
  double lse_max_abs = 0;
  bool pass = true;
  std::string what;
};

// Norm-wise relative error accumulator.
struct ErrAcc {
  double num = 0, den = 0;
  bool bad = false;
  void add(double ours, double ref) {
    if (std::isnan(ours) || std::isnan(ref)) bad = true;
    num += (ours - ref) * (ours - ref);
    den += ref * ref;
  }
  double rel() const { return bad ? INFINITY : std::sqrt(num) / std::max(std::sqrt(den), 1e-30); }
};

constexpr double kLseTolerance = 1e-3;

double tolerance(DType t, bool gradient) {
  // Kernels accumulate in fp32 at least, so the storage rounding dominates; gradients go through one more
  // low-precision product (P and dS are rounded before their matrix products on the GPU).
  const double u = std::max(test::unit_roundoff(t), 0x1p-20);
  return (gradient ? 16 : 8) * u;
}

int run_command(const std::vector<std::string>& args) {
  RunOptions o;
  std::string err;
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(run_usage(), stdout);
      return 0;
    }
  }
  if (!parse_run_options(args, &o, &err)) {
    std::fprintf(stderr, "flashattn run: %s\n", err.c_str());
    return 2;
  }

  Problem pb;
  const int gpus = cuda_device_count();
  if (o.device == "cuda" && gpus == 0) {
    std::fprintf(stderr, "flashattn run: --device cuda, but %s\n",
                 built_with_cuda() ? "no CUDA device is present" : "this build has no CUDA support");
    return 2;
  }
  pb.cuda = o.device == "cuda" || (o.device == "auto" && gpus > 0);
  pb.dtype = o.dtype.empty() ? (pb.cuda ? DType::bf16 : DType::f32) : parse_dtype(o.dtype);
  pb.h = o.heads > 0 ? o.heads : (pb.cuda ? 16 : 8);
  pb.hkv = o.heads_kv > 0 ? o.heads_kv : pb.h;
  pb.d = o.head_dim > 0 ? o.head_dim : (pb.cuda ? 128 : 64);
  pb.dv = o.head_dim_v > 0 ? o.head_dim_v : pb.d;
  pb.varlen = !o.varlen_q.empty();
  if (pb.varlen) {
    pb.lens_q = o.varlen_q;
    pb.lens_k = o.varlen_k.empty() ? o.varlen_q : o.varlen_k;
    pb.batch = int64_t(pb.lens_q.size());
    pb.sq = *std::max_element(pb.lens_q.begin(), pb.lens_q.end());
    pb.sk = *std::max_element(pb.lens_k.begin(), pb.lens_k.end());
  } else {
    pb.batch = o.batch >= 0 ? o.batch : (pb.cuda ? 4 : 1);
    pb.sq = o.seqlen_q >= 0 ? o.seqlen_q : (pb.cuda ? 4096 : 1024);
    pb.sk = o.seqlen_k >= 0 ? o.seqlen_k : pb.sq;
    pb.lens_q.assign(size_t(pb.batch), pb.sq);
    pb.lens_k.assign(size_t(pb.batch), pb.sk);
  }
  const int warmup = o.warmup >= 0 ? o.warmup : (pb.cuda ? 3 : 1);
  const int iters = o.iters > 0 ? o.iters : (pb.cuda ? 20 : 3);

  // ---- tensors ----
  int64_t total_q = 0, total_k = 0;
  for (size_t b = 0; b < pb.lens_q.size(); ++b) total_q += pb.lens_q[b], total_k += pb.lens_k[b];
  if (!pb.varlen && pb.batch == 0) {
    std::fprintf(stderr, "flashattn run: --batch 0 leaves nothing to run\n");
    return 2;
  }
  // Logical shapes: [b, s, h, d], or [total, h, d] for varlen.
  auto shape = [&](int64_t s, int64_t total, int64_t heads, int64_t dim) {
    return pb.varlen ? std::vector<int64_t>{total, heads, dim} : std::vector<int64_t>{pb.batch, s, heads, dim};
  };
  const std::vector<int64_t> qs = shape(pb.sq, total_q, pb.h, pb.d), ks = shape(pb.sk, total_k, pb.hkv, pb.d);
  const std::vector<int64_t> vs = shape(pb.sk, total_k, pb.hkv, pb.dv), os = shape(pb.sq, total_q, pb.h, pb.dv);
  HostTensor q = make_tensor(o, pb, qs), k = make_tensor(o, pb, ks), v = make_tensor(o, pb, vs);
  HostTensor out = make_tensor(o, pb, os);
  HostTensor lse(DType::f32, pb.varlen ? std::vector<int64_t>{pb.h, total_q} : std::vector<int64_t>{pb.batch, pb.h, pb.sq});
  HostTensor cu_q, cu_k;
  fill_random(q, o.seed * 4 + 1);
  fill_random(k, o.seed * 4 + 2);
  fill_random(v, o.seed * 4 + 3);

  Runner run(pb.cuda);
  ForwardArgs fa;
  fa.q = run.place(q), fa.k = run.place(k), fa.v = run.place(v), fa.out = run.place(out), fa.lse = run.place(lse);
  if (pb.varlen) {
    cu_q = test::cu_seqlens_of(pb.lens_q);
    cu_k = test::cu_seqlens_of(pb.lens_k);
    fa.cu_seqlens_q = run.place(cu_q), fa.cu_seqlens_k = run.place(cu_k);
    fa.max_seqlen_q = pb.sq, fa.max_seqlen_k = pb.sk;
  }

  FwdParams fp;
  Status st = make_forward_params(fa, o.attn, &fp);
  if (!st.ok()) {
    std::fprintf(stderr, "flashattn run: %s\n", st.message.c_str());
    return 2;
  }
  const BackendChoice choice_fwd = choose_backend(fp, o.attn.backend, false);
  if (!choice_fwd.status.ok()) {
    std::fprintf(stderr, "flashattn run: %s\n", choice_fwd.status.message.c_str());
    return 1;
  }

  // ---- forward ----
  run.reset_peak();
  st = run_forward(fp, o.attn.backend);
  run.synchronize();
  const double fwd_extra = run.peak_extra();
  if (!st.ok()) {
    std::fprintf(stderr, "flashattn run: forward failed: %s\n", st.message.c_str());
    return 1;
  }
  const double fwd_s = run.time([&] { run_forward(fp, o.attn.backend); }, warmup, iters);
  run.fetch(fa.out, out);
  run.fetch(fa.lse, lse);

  // ---- backward ----
  HostTensor dout, dq, dk, dv;
  BackwardArgs ba;
  double bwd_s = 0, bwd_extra = 0;
  BackendChoice choice_bwd;
  BwdParams bp;
  if (o.backward) {
    dout = make_tensor(o, pb, os);
    dq = make_tensor(o, pb, qs), dk = make_tensor(o, pb, ks), dv = make_tensor(o, pb, vs);
    fill_random(dout, o.seed * 4 + 4);
    static_cast<ForwardArgs&>(ba) = fa;
    ba.dout = run.place(dout), ba.dq = run.place(dq), ba.dk = run.place(dk), ba.dv = run.place(dv);
    st = make_backward_params(ba, o.attn, &bp);
    if (!st.ok()) {
      std::fprintf(stderr, "flashattn run: %s\n", st.message.c_str());
      return 2;
    }
    choice_bwd = choose_backend(bp, o.attn.backend);
    run.reset_peak();
    st = run_backward(bp, o.attn.backend);
    run.synchronize();
    bwd_extra = run.peak_extra();
    if (!st.ok()) {
      std::fprintf(stderr, "flashattn run: backward failed: %s\n", st.message.c_str());
      return 1;
    }
    bwd_s = run.time([&] { run_backward(bp, o.attn.backend); }, warmup, iters);
    run.fetch(ba.dq, dq), run.fetch(ba.dk, dk), run.fetch(ba.dv, dv);
  }

  // ---- check sampled rows against the reference (on host copies of the inputs) ----
  CheckResult fwd_check, bwd_check;
  if (o.check_rows > 0 && total_q > 0) {
    BackwardArgs host_args;
    host_args.q = q.view(), host_args.k = k.view(), host_args.v = v.view(), host_args.out = out.view();
    host_args.lse = lse.view();
    if (pb.varlen) host_args.cu_seqlens_q = cu_q.view(), host_args.cu_seqlens_k = cu_k.view();
    host_args.max_seqlen_q = pb.sq, host_args.max_seqlen_k = pb.sk;
    if (o.backward) host_args.dout = dout.view(), host_args.dq = dq.view(), host_args.dk = dk.view(), host_args.dv = dv.view();
    AttentionOptions host_opt = o.attn;
    host_opt.backend = Backend::cpu_reference;
    host_opt.stream = nullptr;
    BwdParams hp;
    if (o.backward) {
      st = make_backward_params(host_args, host_opt, &hp);
    } else {
      st = make_forward_params(host_args, host_opt, &hp);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "flashattn run: internal error preparing the check: %s\n", st.message.c_str());
      return 1;
    }
    std::mt19937_64 rng(o.seed + 99);
    ErrAcc eo, eq;
    std::vector<std::array<int64_t, 3>> picks;
    for (int r = 0; r < o.check_rows; ++r) {
      int64_t b = int64_t(rng() % uint64_t(pb.batch));
      for (int tries = 0; pb.lens_q[size_t(b)] == 0 && tries < 64; ++tries) b = int64_t(rng() % uint64_t(pb.batch));
      if (pb.lens_q[size_t(b)] == 0) continue;
      picks.push_back({b, int64_t(rng() % uint64_t(pb.h)), int64_t(rng() % uint64_t(pb.lens_q[size_t(b)]))});
    }
    std::vector<detail::ReferenceRow> rows(picks.size());
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < int64_t(picks.size()); ++r) {
      detail::reference_row(hp, picks[size_t(r)][0], picks[size_t(r)][1], picks[size_t(r)][2], o.backward, &rows[size_t(r)]);
    }
    for (size_t r = 0; r < picks.size(); ++r) {
      const int64_t b = picks[r][0], h = picks[r][1], i = picks[r][2];
      int64_t row = i;
      for (int64_t bb = 0; pb.varlen && bb < b; ++bb) row += pb.lens_q[size_t(bb)];
      const detail::ReferenceRow& ref = rows[r];
      for (int64_t c = 0; c < pb.dv; ++c) {
        const int64_t off = pb.varlen ? out.offset({row, h, c}) : out.offset({b, i, h, c});
        eo.add(out.get(off), ref.out[size_t(c)]);
      }
      const int64_t loff = pb.varlen ? lse.offset({h, row}) : lse.offset({b, h, i});
      const double l = lse.get(loff);
      if (std::isinf(ref.lse) || std::isinf(l)) {
        if (l != ref.lse) fwd_check.lse_max_abs = INFINITY;
      } else {
        fwd_check.lse_max_abs = std::max(fwd_check.lse_max_abs, std::fabs(l - ref.lse));
      }
      if (o.backward) {
        for (int64_t c = 0; c < pb.d; ++c) {
          const int64_t off = pb.varlen ? dq.offset({row, h, c}) : dq.offset({b, i, h, c});
          eq.add(dq.get(off), ref.dq[size_t(c)]);
        }
      }
    }
    fwd_check.rows = bwd_check.rows = int(picks.size());
    fwd_check.rel_err = eo.rel();
    // The LSE is fp32 from inputs that are exact in their dtype, so only fp32 rounding separates it from the
    // reference: 1e-3 absolute is a sanity bound, far above that rounding and far below any real error.
    fwd_check.pass = fwd_check.rel_err <= tolerance(pb.dtype, false) && fwd_check.lse_max_abs <= kLseTolerance;
    fwd_check.what = "O and LSE of " + std::to_string(picks.size()) + " sampled query rows";
    if (o.backward) {
      bwd_check.rel_err = eq.rel();
      bwd_check.pass = bwd_check.rel_err <= tolerance(pb.dtype, true);
      bwd_check.what = "dQ of the same rows";
    }
  }

  // ---- report ----
  const double pairs = visible_pairs(pb, o.attn) * double(pb.h);
  const double fwd_flops = 2.0 * pairs * double(pb.d + pb.dv);
  const double bwd_flops = 2.5 * fwd_flops;
  const double elem = double(dtype_size(pb.dtype));
  double full_pairs = 0;
  for (size_t b = 0; b < pb.lens_q.size(); ++b) full_pairs += double(pb.lens_q[b]) * double(pb.lens_k[b]);
  // A naive implementation materialises the scores S and the probabilities P, b*h*s_q*s_k each, in the input
  // dtype; its backward also needs dP and dS of the same size.
  const double naive_fwd = 2.0 * full_pairs * double(pb.h) * elem;
  const double naive_bwd = 2.0 * naive_fwd;
  const char* dev = pb.cuda ? "cuda" : "cpu";
  const bool ok = fwd_check.pass && (!o.backward || bwd_check.pass);

  if (o.json) {
    std::printf("{\"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %" PRId64 ", \"seqlen_q\": %" PRId64
                ", \"seqlen_k\": %" PRId64 ", \"heads\": %" PRId64 ", \"heads_kv\": %" PRId64 ", \"head_dim\": %" PRId64
                ", \"head_dim_v\": %" PRId64 ", \"varlen\": %s, \"causal\": %s, \"window\": [%" PRId64 ", %" PRId64
                "], \"attention_chunk\": %" PRId64 ", \"softcap\": %g, \"layout\": \"%s\", \"backend_forward\": \"%s\", \"forward_ms\": %.6f, "
                "\"forward_tflops\": %.4f, \"forward_extra_bytes\": %.0f, \"naive_forward_bytes\": %.0f",
                dev, dtype_name(pb.dtype), pb.batch, pb.sq, pb.sk, pb.h, pb.hkv, pb.d, pb.dv, pb.varlen ? "true" : "false",
                o.attn.causal ? "true" : "false", o.attn.window_left, o.attn.window_right,
                o.attn.attention_chunk, o.attn.softcap, o.layout.c_str(), backend_name(choice_fwd.backend), fwd_s * 1e3, fwd_flops / fwd_s * 1e-12, fwd_extra,
                naive_fwd);
    if (o.backward) {
      std::printf(", \"backend_backward\": \"%s\", \"backward_ms\": %.6f, \"backward_tflops\": %.4f, "
                  "\"backward_extra_bytes\": %.0f, \"naive_backward_bytes\": %.0f",
                  backend_name(choice_bwd.backend), bwd_s * 1e3, bwd_flops / bwd_s * 1e-12, bwd_extra, naive_bwd);
    }
    std::printf(", \"checked_rows\": %d, \"forward_rel_err\": %.3e, \"lse_max_abs_err\": %.3e", fwd_check.rows,
                fwd_check.rel_err, fwd_check.lse_max_abs);
    if (o.backward) std::printf(", \"dq_rel_err\": %.3e", bwd_check.rel_err);
    std::printf(", \"check_passed\": %s}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
  }

  std::printf("flashattn %s  device %s  dtype %s\n", version(), dev, dtype_name(pb.dtype));
  if (pb.varlen) {
    std::printf("shape     varlen batch %" PRId64 " (total q %" PRId64 ", total k %" PRId64 ", max %" PRId64 "/%" PRId64
                ")  heads %" PRId64 "/%" PRId64 "  head dim %" PRId64 "/%" PRId64 "  layout %s\n",
                pb.batch, total_q, total_k, pb.sq, pb.sk, pb.h, pb.hkv, pb.d, pb.dv, o.layout.c_str());
  } else {
    std::printf("shape     batch %" PRId64 "  seqlen %" PRId64 "/%" PRId64 "  heads %" PRId64 "/%" PRId64
                "  head dim %" PRId64 "/%" PRId64 "  layout %s\n",
                pb.batch, pb.sq, pb.sk, pb.h, pb.hkv, pb.d, pb.dv, o.layout.c_str());
  }
  std::printf("mask      causal %s  window (%" PRId64 ", %" PRId64 ")  chunk %" PRId64 "  softcap %g  scale %g\n",
              o.attn.causal ? "yes" : "no", o.attn.window_left, o.attn.window_right, o.attn.attention_chunk,
              o.attn.softcap, double(fp.softmax_scale));
  std::printf("backend   forward: %s (%s)\n", backend_name(choice_fwd.backend), choice_fwd.reason.c_str());
  if (o.backward) std::printf("          backward: %s (%s)\n", backend_name(choice_bwd.backend), choice_bwd.reason.c_str());
  // GPUs run at TFLOP/s, CPUs at GFLOP/s: print the unit that keeps the number readable.
  const double unit = pb.cuda ? 1e-12 : 1e-9;
  std::printf("\n%-9s %12s %12s %16s %16s\n", "pass", "time (ms)", pb.cuda ? "TFLOP/s" : "GFLOP/s", "extra memory",
              "naive would need");
  std::printf("%-9s %12.3f %12.2f %16s %16s\n", "forward", fwd_s * 1e3, fwd_flops / fwd_s * unit,
              human_bytes(fwd_extra).c_str(), human_bytes(naive_fwd).c_str());
  if (o.backward) {
    std::printf("%-9s %12.3f %12.2f %16s %16s\n", "backward", bwd_s * 1e3, bwd_flops / bwd_s * unit,
                human_bytes(bwd_extra).c_str(), human_bytes(naive_bwd).c_str());
  }
  std::printf("(median of %d runs after %d warm-up; FLOPs count visible query-key pairs)\n", iters, warmup);
  if (o.check_rows > 0) {
    std::printf("\ncheck     %s vs the float64 reference: rel err %.2e, LSE max abs err %.2e  %s\n",
                fwd_check.what.c_str(), fwd_check.rel_err, fwd_check.lse_max_abs, fwd_check.pass ? "PASS" : "FAIL");
    if (o.backward) {
      std::printf("          %s: rel err %.2e (tolerance %.1e)  %s\n", bwd_check.what.c_str(), bwd_check.rel_err,
                  tolerance(pb.dtype, true), bwd_check.pass ? "PASS" : "FAIL");
    }
  } else {
    std::printf("\ncheck     skipped (--check-rows 0)\n");
  }
  return ok ? 0 : 1;
}

int info_command() {
  std::printf("flashattn %s\n", version());
  std::printf("CUDA support: %s\n", built_with_cuda() ? "built in" : "not built (no nvcc at configure time)");
  const int n = cuda_device_count();
  std::printf("CUDA devices: %d\n", n);
  for (int i = 0; i < n; ++i) {
    const int cc = cuda_compute_capability(i);
    std::printf("  cuda:%d  compute capability %d.%d\n", i, cc / 10, cc % 10);
  }
  std::printf("backends: cpu_reference, cpu_flash%s\n", built_with_cuda() ? ", cuda_sm80, cuda_sm90" : "");
  std::printf("CPU kernels: %s (FLASHATTN_CPU_ISA caps the level)\n", cpu_isa());
  return 0;
}

// `flashattn bench` is the Python package's benchmark (python -m flashattn.bench): it compares against PyTorch,
// which only Python runs. The interpreter is $FLASHATTN_PYTHON, else python3 on the PATH; the options pass through.
int bench_command(const std::vector<std::string>& args) {
  const char* chosen = std::getenv("FLASHATTN_PYTHON");
  const std::string python = chosen && *chosen ? chosen : "python3";
  std::vector<std::string> words = {python, "-m", "flashattn.bench"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execvp(argv[0], argv.data());
  std::fprintf(stderr,
               "flashattn bench: cannot run '%s' (%s): the benchmark is `python -m flashattn.bench`, which needs the "
               "flashattn Python package and PyTorch; FLASHATTN_PYTHON names the interpreter\n",
               python.c_str(), std::strerror(errno));
  return 2;
}

}  // namespace
}  // namespace flashattn::cli

int main(int argc, char** argv) {
  using namespace flashattn::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(main_usage(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("flashattn %s\n", flashattn::version());
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "run") return run_command(args);
  if (cmd == "info") return info_command();
  if (cmd == "bench") return bench_command(args);
  std::fprintf(stderr, "flashattn: unknown command '%s'\n\n%s", cmd.c_str(), main_usage());
  return 2;
}
