#include "cli_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace flashattn::cli {
namespace {

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_int_list(const std::string& s, std::vector<int64_t>* out) {
  out->clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t v;
    if (!parse_int(item, &v) || v < 0) return false;
    out->push_back(v);
  }
  return !out->empty();
}

}  // namespace

const char* main_usage() {
  return "usage: flashattn <command> [options]\n"
         "\n"
         "commands:\n"
         "  run     run attention on random inputs, check it against the reference, report time and memory\n"
         "  info    show the build, the CUDA devices and the backends\n"
         "  bench   the side-by-side benchmark against PyTorch SDPA (runs `python -m flashattn.bench`, which\n"
         "          needs the Python package; `flashattn bench --help` lists its options)\n"
         "\n"
         "`flashattn run --help` lists the options of run.\n";
}

const char* run_usage() {
  return "usage: flashattn run [options]\n"
         "\n"
         "Runs the forward (and with --backward the backward) on random inputs on the best device available,\n"
         "checks sampled rows against the double-precision reference, and prints the time, the achieved\n"
         "FLOP/s (4*b*h*s_q*s_k*d forward, half for causal, 2.5x for the backward), the extra memory used and\n"
         "the memory a naive implementation would need.\n"
         "\n"
         "shape:\n"
         "  --batch N            batch size (default: 1 on the CPU, 4 on CUDA)\n"
         "  --seqlen N           query and key length (default: 1024 on the CPU, 4096 on CUDA)\n"
         "  --seqlen-q N         query length\n"
         "  --seqlen-k N         key/value length\n"
         "  --heads N            query heads (default: 8 on the CPU, 16 on CUDA)\n"
         "  --heads-kv N         key/value heads, a divisor of --heads (default: --heads; fewer = GQA/MQA)\n"
         "  --head-dim N         head dim of Q and K, 1..256 (default: 64 on the CPU, 128 on CUDA)\n"
         "  --head-dim-v N       head dim of V and O (default: --head-dim)\n"
         "  --varlen L1,L2,...   variable-length batch: query lengths of each sequence (packed, cu_seqlens)\n"
         "  --varlen-k L1,L2,... key lengths of each sequence (default: as --varlen)\n"
         "  --layout bshd|bhsd   storage order of Q, K, V, O (default bshd)\n"
         "  --dtype T            bf16, fp16, fp32 or fp64 (default: bf16 on CUDA, fp32 on the CPU)\n"
         "\n"
         "attention:\n"
         "  --causal             causal mask, aligned bottom-right\n"
         "  --window L,R         sliding window left,right (-1 = unbounded)\n"
         "  --attention-chunk N  chunked attention: a row sees only its diagonal's chunk of N keys (0 = off)\n"
         "  --softcap X          scores = X * tanh(scores / X)\n"
         "  --scale X            softmax scale (default 1/sqrt(head dim))\n"
         "\n"
         "execution:\n"
         "  --backward           also run and time the backward\n"
         "  --deterministic      deterministic backward\n"
         "  --device D           auto, cpu or cuda (default auto: cuda when a device is present)\n"
         "  --backend B          auto, cpu_reference, cpu_flash, cuda_sm80, cuda_sm90 (default auto)\n"
         "  --threads N          CPU threads (default: all)\n"
         "  --warmup N           untimed runs first (default: 1 on the CPU, 3 on CUDA)\n"
         "  --iters N            timed runs, median reported (default: 3 on the CPU, 20 on CUDA)\n"
         "  --check-rows N       query rows checked against the reference (default 8, 0 = no check)\n"
         "  --seed N             random seed (default 0)\n"
         "  --json               print one JSON object instead of the table\n"
         "  -h, --help           this help\n";
}

bool parse_run_options(const std::vector<std::string>& args, RunOptions* o, std::string* error) {
  auto need_value = [&](size_t i) -> bool {
    if (i + 1 >= args.size()) {
      *error = "option " + args[i] + " needs a value";
      return false;
    }
    return true;
  };
  auto bad = [&](const std::string& opt, const std::string& value, const char* what) {
    *error = "option " + opt + ": '" + value + "' is not " + what;
    return false;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    int64_t* int_target = nullptr;
    int64_t min_value = 1;
    if (a == "--batch") int_target = &o->batch, min_value = 0;
    else if (a == "--seqlen-q") int_target = &o->seqlen_q, min_value = 0;
    else if (a == "--seqlen-k") int_target = &o->seqlen_k, min_value = 0;
    else if (a == "--heads") int_target = &o->heads;
    else if (a == "--heads-kv") int_target = &o->heads_kv;
    else if (a == "--head-dim") int_target = &o->head_dim;
    else if (a == "--head-dim-v") int_target = &o->head_dim_v;
    if (int_target) {
      if (!need_value(i)) return false;
      int64_t v;
      if (!parse_int(args[i + 1], &v) || v < min_value) {
        return bad(a, args[i + 1], min_value == 0 ? "an integer >= 0" : "an integer >= 1");
      }
      *int_target = v;
      ++i;
      continue;
    }
    if (a == "--seqlen") {
      if (!need_value(i)) return false;
      int64_t v;
      if (!parse_int(args[i + 1], &v) || v < 0) return bad(a, args[i + 1], "an integer >= 0");
      o->seqlen_q = o->seqlen_k = v;
      ++i;
    } else if (a == "--varlen" || a == "--varlen-k") {
      if (!need_value(i)) return false;
      std::vector<int64_t>& target = a == "--varlen" ? o->varlen_q : o->varlen_k;
      if (!parse_int_list(args[i + 1], &target)) return bad(a, args[i + 1], "a comma-separated list of lengths >= 0");
      ++i;
    } else if (a == "--layout") {
      if (!need_value(i)) return false;
      o->layout = args[++i];
      if (o->layout != "bshd" && o->layout != "bhsd") return bad(a, o->layout, "bshd or bhsd");
    } else if (a == "--dtype") {
      if (!need_value(i)) return false;
      o->dtype = args[++i];
      if (o->dtype != "bf16" && o->dtype != "fp16" && o->dtype != "fp32" && o->dtype != "fp64") {
        return bad(a, o->dtype, "bf16, fp16, fp32 or fp64");
      }
    } else if (a == "--causal") {
      o->attn.causal = true;
    } else if (a == "--window") {
      if (!need_value(i)) return false;
      std::vector<int64_t> w;
      std::stringstream ss(args[i + 1]);
      std::string item;
      while (std::getline(ss, item, ',')) {
        int64_t v;
        if (!parse_int(item, &v) || v < -1) return bad(a, args[i + 1], "LEFT,RIGHT with values >= -1");
        w.push_back(v);
      }
      if (w.size() != 2) return bad(a, args[i + 1], "LEFT,RIGHT with values >= -1");
      o->attn.window_left = w[0];
      o->attn.window_right = w[1];
      ++i;
    } else if (a == "--attention-chunk") {
      if (!need_value(i)) return false;
      int64_t v;
      if (!parse_int(args[i + 1], &v) || v < 0) return bad(a, args[i + 1], "an integer >= 0 (0 = off)");
      o->attn.attention_chunk = v;
      ++i;
    } else if (a == "--softcap" || a == "--scale") {
      if (!need_value(i)) return false;
      double v;
      if (!parse_double(args[i + 1], &v) || v < 0) return bad(a, args[i + 1], "a finite number >= 0");
      (a == "--softcap" ? o->attn.softcap : o->attn.softmax_scale) = v;
      ++i;
    } else if (a == "--backward") {
      o->backward = true;
    } else if (a == "--deterministic") {
      o->attn.deterministic = true;
    } else if (a == "--device") {
      if (!need_value(i)) return false;
      o->device = args[++i];
      if (o->device != "auto" && o->device != "cpu" && o->device != "cuda") return bad(a, o->device, "auto, cpu or cuda");
    } else if (a == "--backend") {
      if (!need_value(i)) return false;
      if (!parse_backend(args[i + 1], &o->attn.backend)) {
        return bad(a, args[i + 1], "auto, cpu_reference, cpu_flash, cuda_sm80 or cuda_sm90");
      }
      ++i;
    } else if (a == "--threads" || a == "--warmup" || a == "--iters" || a == "--check-rows") {
      if (!need_value(i)) return false;
      int64_t v;
      const int64_t lo = a == "--iters" ? 1 : 0;
      if (!parse_int(args[i + 1], &v) || v < lo || v > 1000000) {
        return bad(a, args[i + 1], lo == 1 ? "an integer >= 1" : "an integer >= 0");
      }
      if (a == "--threads") o->attn.num_threads = int(v);
      if (a == "--warmup") o->warmup = int(v);
      if (a == "--iters") o->iters = int(v);
      if (a == "--check-rows") o->check_rows = int(v);
      ++i;
    } else if (a == "--seed") {
      if (!need_value(i)) return false;
      int64_t v;
      if (!parse_int(args[i + 1], &v) || v < 0) return bad(a, args[i + 1], "an integer >= 0");
      o->seed = uint64_t(v);
      ++i;
    } else if (a == "--json") {
      o->json = true;
    } else {
      *error = "unknown option '" + a + "' (see flashattn run --help)";
      return false;
    }
  }
  if (!o->varlen_k.empty() && o->varlen_q.empty()) {
    *error = "option --varlen-k needs --varlen";
    return false;
  }
  if (!o->varlen_k.empty() && o->varlen_k.size() != o->varlen_q.size()) {
    *error = "options --varlen and --varlen-k must list the same number of sequences";
    return false;
  }
  return true;
}

}  // namespace flashattn::cli
