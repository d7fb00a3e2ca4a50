// Times the Hopper forward (cuda_sm90) on the FlashAttention benchmark grid: B·S = 16k tokens, H·D = 2048,
// bf16, head dims 64/128/256, S = 2k, 4k, 8k and 16k, causal and not. CUDA events around each launch; median of the
// timed launches after warm-up. FLOPs: 4·B·H·S²·D, half of that under a causal mask.
//
// The planned kernel of each head dim (forward_config.h, KernelPlan) is timed on each grid (Sm90Grid: as
// planned, one CTA per tile, persistent).
//
//   bench_sm90_forward [--iters N] [--csv] [--only GRID,HD,S,CAUSAL]
// --only times one cell (e.g. `--only planned,128,16384,0`): for profiling one launch under ncu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sm90/forward_sm90.h"
#include "flashattn/flashattn.h"

namespace {

#define CHECK_CUDA(x)                                                                       \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                  \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Deterministic bf16 values in about [-2, 2): random data, never zeros (zeros run faster than real data).
void fill_random_bf16(std::vector<uint16_t>& h, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = float(int32_t(x >> 40) % 4096) / 1024.f;  // [-4, 4) in steps of 1/1024
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = uint16_t((bits + 0x8000u) >> 16);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  bool csv = false;
  std::string only;  // empty: every cell
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--csv")) csv = true;
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
  }
  constexpr int64_t kTokens = 16384, kModelDim = 2048;
  const size_t elems = size_t(kTokens) * kModelDim;
  std::vector<uint16_t> host(elems);
  void *q, *k, *v, *o;
  float* lse;
  CHECK_CUDA(cudaMalloc(&q, elems * 2));
  CHECK_CUDA(cudaMalloc(&k, elems * 2));
  CHECK_CUDA(cudaMalloc(&v, elems * 2));
  CHECK_CUDA(cudaMalloc(&o, elems * 2));
  CHECK_CUDA(cudaMalloc(&lse, size_t(kTokens) * (kModelDim / 64) * sizeof(float)));
  fill_random_bf16(host, 1);
  CHECK_CUDA(cudaMemcpy(q, host.data(), elems * 2, cudaMemcpyHostToDevice));
  fill_random_bf16(host, 2);
  CHECK_CUDA(cudaMemcpy(k, host.data(), elems * 2, cudaMemcpyHostToDevice));
  fill_random_bf16(host, 3);
  CHECK_CUDA(cudaMemcpy(v, host.data(), elems * 2, cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));

  std::printf(csv ? "grid,hd,seqlen,causal,ms,tflops\n" : "%20s %4s %6s %6s %9s %8s\n", "grid", "hd", "seqlen",
              "causal", "ms", "TFLOP/s");
  using flashattn::detail::Sm90Grid;
  for (Sm90Grid grid : flashattn::detail::kSm90Grids)
  for (int64_t hd : {64, 128, 256})
    for (int64_t s : {2048, 4096, 8192, 16384})
      for (bool causal : {false, true}) {
        const int64_t b = kTokens / s, h = kModelDim / hd;
        const int64_t shape[4] = {b, s, h, hd}, lse_shape[3] = {b, h, s};
        flashattn::Device dev{flashattn::DeviceType::cuda, 0};
        flashattn::ForwardArgs a;
        a.q = flashattn::make_contiguous_view(q, flashattn::DType::bf16, dev, 4, shape);
        a.k = flashattn::make_contiguous_view(k, flashattn::DType::bf16, dev, 4, shape);
        a.v = flashattn::make_contiguous_view(v, flashattn::DType::bf16, dev, 4, shape);
        a.out = flashattn::make_contiguous_view(o, flashattn::DType::bf16, dev, 4, shape);
        a.lse = flashattn::make_contiguous_view(lse, flashattn::DType::f32, dev, 3, lse_shape);
        flashattn::AttentionOptions opt;
        opt.causal = causal;
        flashattn::FwdParams p;
        flashattn::Status st = flashattn::make_forward_params(a, opt, &p);
        if (st.ok()) st = flashattn::detail::sm90_forward_supports(p);
        if (!st.ok()) {
          std::printf("hd %lld S %lld: %s\n", (long long)hd, (long long)s, st.message.c_str());
          continue;
        }
        const std::string vname = flashattn::detail::sm90_grid_name(grid);
        if (!only.empty() && only != vname + "," + std::to_string(hd) + "," + std::to_string(s) + "," +
                                          std::to_string(int(causal)))
          continue;
        for (int w = 0; w < 3; ++w) st = flashattn::detail::sm90_forward_run(p, grid);
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int it = 0; it < iters && st.ok(); ++it) {
          CHECK_CUDA(cudaEventRecord(start));
          st = flashattn::detail::sm90_forward_run(p, grid);
          CHECK_CUDA(cudaEventRecord(stop));
          CHECK_CUDA(cudaEventSynchronize(stop));
          float t = 0;
          CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
          ms.push_back(t);
        }
        CHECK_CUDA(cudaGetLastError());
        if (!st.ok()) {
          std::printf("hd %lld S %lld: %s\n", (long long)hd, (long long)s, st.message.c_str());
          continue;
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double flops = 4.0 * double(b) * double(h) * double(s) * double(s) * double(hd) / (causal ? 2 : 1);
        std::printf(csv ? "%s,%lld,%lld,%d,%.4f,%.1f\n" : "%20s %4lld %6lld %6d %9.4f %8.1f\n", vname.c_str(), (long long)hd,
                    (long long)s,
                    int(causal), med, flops / (med * 1e-3) / 1e12);
        std::fflush(stdout);  // a later cell that hangs (killed by a timeout) keeps the lines before it
      }
  return 0;
}
