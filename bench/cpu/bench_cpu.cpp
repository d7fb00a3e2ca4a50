// CPU benchmark: the flash path (Backend::cpu_flash) against the naive reference (Backend::cpu_reference) over
// sequence lengths, forward and backward, reporting time, FLOP/s and the peak heap memory each call allocates.
// A program, not a test: bench/cpu/compare_torch.py runs it beside PyTorch's SDPA and writes bench/results/.
//
//   flashattn_bench_cpu [--seqlens 256,1024,4096] [--dims 64,128] [--batch 1] [--heads 8] [--causal 0,1]
//                       [--dtype float32] [--threads 0] [--min-time 0.5] [--naive-max-seconds 20]
//                       [--naive 1] [--layout bshd|bhsd] [--json out.json]
//
// FLOPs as issue 2 counts them: 4·b·h·s_q·s_k·d for the forward (half for causal), 2.5x that for the backward.
// Each measurement is the fastest of repeated calls (one warm-up, then until --min-time has passed; a first call
// of a second or more counts as it is) because other work on a shared machine only ever makes a call slower. The
// naive reference runs (unless --naive 0) while its predicted time (from the previous length, scaling as s²)
// stays under --naive-max-seconds.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "cpu/heap_counter.h"  // replaces operator new / delete in this program: peak heap bytes per call
#include "flashattn/flashattn.h"

using namespace flashattn;
using flashattn::test::HostTensor;

namespace {

struct Options {
  std::vector<int64_t> seqlens = {256, 512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int64_t> dims = {64, 128};
  std::vector<int64_t> causal = {0, 1};
  int64_t batch = 1, heads = 8;
  DType dtype = DType::f32;
  int threads = 0;
  double min_time = 0.5;
  double naive_max_seconds = 20;
  bool naive = true;
  bool bhsd = false;
  std::string json;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "flashattn_bench_cpu: %s\n(see the header of bench/cpu/bench_cpu.cpp for the options)\n", msg);
  std::exit(2);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x < 0) usage(("bad list entry: " + item).c_str());
    v.push_back(x);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--seqlens") o.seqlens = parse_list(next());
    else if (a == "--dims") o.dims = parse_list(next());
    else if (a == "--causal") o.causal = parse_list(next());
    else if (a == "--batch") o.batch = parse_list(next()).at(0);
    else if (a == "--heads") o.heads = parse_list(next()).at(0);
    else if (a == "--threads") o.threads = int(parse_list(next()).at(0));
    else if (a == "--min-time") o.min_time = std::atof(next());
    else if (a == "--naive-max-seconds") o.naive_max_seconds = std::atof(next());
    else if (a == "--naive") o.naive = parse_list(next()).at(0) != 0;
    else if (a == "--json") o.json = next();
    else if (a == "--layout") {
      const std::string l = next();
      if (l != "bshd" && l != "bhsd") usage("--layout: bshd or bhsd");
      o.bhsd = l == "bhsd";
    } else if (a == "--dtype") {
      const std::string t = next();
      if (t == "float32") o.dtype = DType::f32;
      else if (t == "float64") o.dtype = DType::f64;
      else if (t == "float16") o.dtype = DType::f16;
      else if (t == "bfloat16") o.dtype = DType::bf16;
      else usage("--dtype: float32, float64, float16 or bfloat16");
    } else if (a == "--help" || a == "-h") {
      usage("options: --seqlens --dims --batch --heads --causal --dtype --threads --min-time --naive-max-seconds --naive --layout --json");
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  return o;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Timing {
  double seconds = 0;    // fastest call
  int64_t peak_bytes = 0;  // heap bytes the call allocated at its peak (measured on the first call)
  int calls = 0;
};

// Fastest of repeated calls: the first (also the memory measurement) is a warm-up unless it took a second or
// more, in which case it is the measurement.
Timing time_call(const std::function<Status()>& f, double min_time) {
  Timing t;
  Status st;
  double first = now();
  t.peak_bytes = heap_counter::peak_extra_bytes([&] { st = f(); });
  first = now() - first;
  if (!st.ok()) {
    std::fprintf(stderr, "call failed: %s\n", st.message.c_str());
    std::exit(1);
  }
  t.seconds = first;
  t.calls = 1;
  if (first >= std::max(min_time, 1.0)) return t;
  t.seconds = 1e30;
  const double start = now();
  do {
    const double t0 = now();
    f();
    t.seconds = std::min(t.seconds, now() - t0);
    ++t.calls;
  } while (now() - start < min_time && t.calls < 50);
  return t;
}

struct Row {
  int64_t s, d;
  bool causal;
  double flops_fwd;
  Timing flash_fwd, flash_bwd, naive_fwd, naive_bwd;
  bool naive = false;
};

std::string json_row(const Options& o, const Row& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"batch\": %lld, \"heads\": %lld, \"seqlen\": %lld, \"head_dim\": %lld, \"causal\": %s, "
                "\"dtype\": \"%s\", \"layout\": \"%s\", \"flops_forward\": %.6g, \"flops_backward\": %.6g, "
                "\"flash_forward_s\": %.6g, \"flash_backward_s\": %.6g, \"flash_forward_peak_bytes\": %lld, "
                "\"flash_backward_peak_bytes\": %lld",
                (long long)o.batch, (long long)o.heads, (long long)r.s, (long long)r.d, r.causal ? "true" : "false",
                dtype_name(o.dtype), o.bhsd ? "bhsd" : "bshd", r.flops_fwd, 2.5 * r.flops_fwd, r.flash_fwd.seconds,
                r.flash_bwd.seconds, (long long)r.flash_fwd.peak_bytes, (long long)r.flash_bwd.peak_bytes);
  std::string s = buf;
  if (r.naive) {
    std::snprintf(buf, sizeof buf,
                  ", \"naive_forward_s\": %.6g, \"naive_backward_s\": %.6g, \"naive_forward_peak_bytes\": %lld, "
                  "\"naive_backward_peak_bytes\": %lld",
                  r.naive_fwd.seconds, r.naive_bwd.seconds, (long long)r.naive_fwd.peak_bytes,
                  (long long)r.naive_bwd.peak_bytes);
    s += buf;
  }
  return s + "}";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  std::printf("# flashattn %s CPU benchmark: batch %lld, heads %lld, %s, %s layout, %d threads\n", version(),
              (long long)o.batch, (long long)o.heads, dtype_name(o.dtype), o.bhsd ? "[b, h, s, d]" : "[b, s, h, d]",
              threads);
  std::printf("%6s %4s %6s | %10s %8s %10s %8s | %9s %9s | %10s %10s %9s\n", "s", "d", "causal", "flash fwd", "GF/s",
              "flash bwd", "GF/s", "fwd MiB", "bwd MiB", "naive fwd", "naive bwd", "nv MiB");
  std::vector<Row> rows;
  for (int64_t d : o.dims) {
    for (int64_t causal : o.causal) {
      double naive_per_s2 = 0;  // seconds per s² of the last naive run (fwd + bwd)
      for (int64_t s : o.seqlens) {
        std::vector<int> perm;
        if (o.bhsd) perm = {0, 2, 1, 3};
        const std::vector<int64_t> shape = {o.batch, s, o.heads, d};
        HostTensor q(o.dtype, shape, perm), k(o.dtype, shape, perm), v(o.dtype, shape, perm), out(o.dtype, shape, perm);
        HostTensor dout(o.dtype, shape, perm), dq(o.dtype, shape, perm), dk(o.dtype, shape, perm), dv(o.dtype, shape, perm);
        HostTensor lse(DType::f32, {o.batch, o.heads, s});
        std::mt19937_64 rng(uint64_t(s * 131 + d));
        for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
        BackwardArgs a;
        a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view();
        a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
        AttentionOptions opt;
        opt.causal = causal != 0;
        opt.num_threads = threads;

        Row r;
        r.s = s, r.d = d, r.causal = causal != 0;
        r.flops_fwd = 4.0 * double(o.batch * o.heads) * double(s) * double(s) * double(d) / (causal ? 2 : 1);
        opt.backend = Backend::cpu_flash;
        r.flash_fwd = time_call([&] { return attention_forward(a, opt); }, o.min_time);
        r.flash_bwd = time_call([&] { return attention_backward(a, opt); }, o.min_time);
        const double predicted = naive_per_s2 * double(s) * double(s);
        if (o.naive && (naive_per_s2 == 0 || predicted <= o.naive_max_seconds)) {
          opt.backend = Backend::cpu_reference;
          r.naive_fwd = time_call([&] { return attention_forward(a, opt); }, 0);
          r.naive_bwd = time_call([&] { return attention_backward(a, opt); }, 0);
          r.naive = true;
          naive_per_s2 = (r.naive_fwd.seconds + r.naive_bwd.seconds) / (double(s) * double(s));
        }
        const double mib = 1.0 / (1 << 20);
        std::printf("%6lld %4lld %6s | %8.2fms %8.1f %8.2fms %8.1f | %9.2f %9.2f | ", (long long)s, (long long)d,
                    causal ? "yes" : "no", 1e3 * r.flash_fwd.seconds, r.flops_fwd / r.flash_fwd.seconds / 1e9,
                    1e3 * r.flash_bwd.seconds, 2.5 * r.flops_fwd / r.flash_bwd.seconds / 1e9,
                    r.flash_fwd.peak_bytes * mib, r.flash_bwd.peak_bytes * mib);
        if (r.naive) {
          std::printf("%8.1fms %8.1fms %9.2f\n", 1e3 * r.naive_fwd.seconds, 1e3 * r.naive_bwd.seconds,
                      std::max(r.naive_fwd.peak_bytes, r.naive_bwd.peak_bytes) * mib);
        } else {
          std::printf("%10s %10s %9s\n", "-", "-", "-");
        }
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
  }
  if (!o.json.empty()) {
    FILE* f = std::fopen(o.json.c_str(), "w");
    if (!f) usage(("cannot write " + o.json).c_str());
    std::fprintf(f, "{\"threads\": %d, \"version\": \"%s\", \"rows\": [\n", threads, version());
    for (size_t i = 0; i < rows.size(); ++i) std::fprintf(f, "  %s%s\n", json_row(o, rows[i]).c_str(), i + 1 < rows.size() ? "," : "");
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
