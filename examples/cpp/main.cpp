// A minimal inference engine on flashattn's C++ API, built against the installed package: a prefill over a
// prompt (grouped-query attention, causal) and then decode steps that append one token's K/V to a paged cache
// and attend over it, each checked against attention computed here in double. Exits non-zero on any mismatch or
// error. CPU tensors (the engine's own memory); the same calls take CUDA pointers with Device{DeviceType::cuda}.
#include <flashattn/flashattn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using flashattn::DType;
using flashattn::TensorView;

constexpr int64_t kHeadsQ = 8, kHeadsKV = 2, kDim = 64, kPrompt = 40, kSteps = 5, kPage = 16, kPages = 8;

TensorView view(float* data, std::initializer_list<int64_t> shape) {
  return flashattn::make_contiguous_view(data, DType::f32, {}, int(shape.size()), shape.begin());
}
TensorView view_i32(int32_t* data, std::initializer_list<int64_t> shape) {
  return flashattn::make_contiguous_view(data, DType::i32, {}, int(shape.size()), shape.begin());
}

// softmax(q k^T / sqrt(d)) v for one query row over keys [0, n) of one KV head; keys row-major [n, kHeadsKV, d].
std::vector<double> attend(const float* q, const std::vector<float>& keys, const std::vector<float>& values,
                           int64_t n, int64_t hk) {
  std::vector<double> s(static_cast<size_t>(n)), out(static_cast<size_t>(kDim), 0.0);
  double m = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < kDim; ++c) dot += double(q[c]) * keys[size_t((j * kHeadsKV + hk) * kDim + c)];
    s[size_t(j)] = dot / std::sqrt(double(kDim));
    m = std::max(m, s[size_t(j)]);
  }
  for (int64_t j = 0; j < n; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < kDim; ++c) out[size_t(c)] += s[size_t(j)] / sum * values[size_t((j * kHeadsKV + hk) * kDim + c)];
  return out;
}

double max_error(const float* got, const std::vector<double>& want) {
  double e = 0;
  for (size_t c = 0; c < want.size(); ++c) e = std::max(e, std::fabs(double(got[c]) - want[c]));
  return e;
}

}  // namespace

int main() {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  auto fill = [&](std::vector<float>& v) { for (float& x : v) x = normal(rng); };
  std::printf("flashattn %s, CPU kernels: %s\n", flashattn::version(), flashattn::cpu_isa());
  double worst = 0;

  // Prefill: the prompt's causal attention, K/V kept as the sequence's history.
  std::vector<float> q(kPrompt * kHeadsQ * kDim), k(kPrompt * kHeadsKV * kDim), v(k.size()), out(q.size());
  fill(q), fill(k), fill(v);
  flashattn::ForwardArgs fa;
  fa.q = view(q.data(), {1, kPrompt, kHeadsQ, kDim});
  fa.k = view(k.data(), {1, kPrompt, kHeadsKV, kDim});
  fa.v = view(v.data(), {1, kPrompt, kHeadsKV, kDim});
  fa.out = view(out.data(), {1, kPrompt, kHeadsQ, kDim});
  flashattn::AttentionOptions opt;
  opt.causal = true;
  flashattn::Status st = flashattn::attention_forward(fa, opt);
  if (!st.ok()) return std::fprintf(stderr, "prefill failed: %s\n", st.message.c_str()), 1;
  for (int64_t i = 0; i < kPrompt; ++i)
    for (int64_t h = 0; h < kHeadsQ; ++h)
      worst = std::max(worst, max_error(&out[size_t((i * kHeadsQ + h) * kDim)],
                                        attend(&q[size_t((i * kHeadsQ + h) * kDim)], k, v, i + 1, h / (kHeadsQ / kHeadsKV))));

  // The paged cache: pages in a shuffled order, the prompt's K/V copied in.
  std::vector<float> k_cache(kPages * kPage * kHeadsKV * kDim), v_cache(k_cache.size());
  std::vector<int32_t> table(kPages);
  for (int32_t i = 0; i < kPages; ++i) table[size_t(i)] = (i * 5 + 3) % kPages;
  auto row_at = [&](std::vector<float>& cache, int64_t row) {
    return &cache[size_t(((table[size_t(row / kPage)] * kPage + row % kPage) * kHeadsKV) * kDim)];
  };
  for (int64_t j = 0; j < kPrompt; ++j) {
    std::copy_n(&k[size_t(j * kHeadsKV * kDim)], kHeadsKV * kDim, row_at(k_cache, j));
    std::copy_n(&v[size_t(j * kHeadsKV * kDim)], kHeadsKV * kDim, row_at(v_cache, j));
  }

  // Decode: each step appends one token's K/V at cache_seqlens and attends its query over the whole history.
  int32_t length = kPrompt;
  for (int step = 0; step < kSteps; ++step, ++length) {
    std::vector<float> q1(kHeadsQ * kDim), k1(kHeadsKV * kDim), v1(k1.size()), o1(q1.size());
    fill(q1), fill(k1), fill(v1);
    flashattn::KVCacheArgs ka;
    ka.q = view(q1.data(), {1, 1, kHeadsQ, kDim});
    ka.k_cache = view(k_cache.data(), {kPages, kPage, kHeadsKV, kDim});
    ka.v_cache = view(v_cache.data(), {kPages, kPage, kHeadsKV, kDim});
    ka.k_new = view(k1.data(), {1, 1, kHeadsKV, kDim});
    ka.v_new = view(v1.data(), {1, 1, kHeadsKV, kDim});
    ka.cache_seqlens = view_i32(&length, {1});
    ka.block_table = view_i32(table.data(), {1, kPages});
    ka.out = view(o1.data(), {1, 1, kHeadsQ, kDim});
    st = flashattn::attention_with_kvcache(ka, opt);
    if (!st.ok()) return std::fprintf(stderr, "decode step %d failed: %s\n", step, st.message.c_str()), 1;
    k.insert(k.end(), k1.begin(), k1.end());
    v.insert(v.end(), v1.begin(), v1.end());
    for (int64_t h = 0; h < kHeadsQ; ++h)
      worst = std::max(worst, max_error(&o1[size_t(h * kDim)], attend(&q1[size_t(h * kDim)], k, v, length + 1,
                                                                       h / (kHeadsQ / kHeadsKV))));
  }

  // A bad call is an error naming the argument, not a crash.
  flashattn::KVCacheArgs bad;
  bad.q = view(q.data(), {1, 1, kHeadsQ, kDim});
  bad.k_cache = view(k_cache.data(), {kPages, kPage, 3, kDim});  // 8 query heads over 3 KV heads
  bad.v_cache = bad.k_cache;
  bad.out = bad.q;
  st = flashattn::attention_with_kvcache(bad, opt);
  std::printf("bad call: %s\n", st.message.c_str());
  const bool ok = !st.ok() && st.message.rfind("k_cache", 0) == 0 && worst < 1e-4;
  std::printf("prefill + %d decode steps: max |error| %.3g -> %s\n", kSteps, worst, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
