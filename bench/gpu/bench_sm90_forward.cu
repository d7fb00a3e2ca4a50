// Times the Hopper forward (cuda_sm90) on the FlashAttention benchmark grid: B·S = 16k tokens, H·D = 2048,
// bf16, head dims 64/128/256, S = 512 to 16k, causal and not. CUDA events around each launch; median of the
// timed launches after warm-up. FLOPs: 4·B·H·S²·D, half of that under a causal mask.
//
// The planned kernel of each head dim (forward_config.h, KernelPlan) is timed on each grid (Sm90Grid:
// persistent, as dispatched, and one CTA per tile).
//
//   bench_sm90_forward [--iters N] [--csv] [--grid GRID] [--only GRID,HD,S,CAUSAL]
// --grid times one grid's cells (persistent, one_cta_per_tile); --only times one cell (e.g.
// `--only persistent,128,16384,0`): for profiling one launch under ncu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "cuda/sm90/forward_sm90.h"
#include "flashattn/flashattn.h"

int main(int argc, char** argv) {
  int iters = 20;
  bool csv = false;
  std::string only;      // empty: every cell
  std::string only_grid;  // empty: every grid
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--csv")) csv = true;
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--grid") && i + 1 < argc) only_grid = argv[++i];
  }
  constexpr int64_t kTokens = 16384, kModelDim = 2048;
  const size_t elems = size_t(kTokens) * kModelDim;
  void *q, *k, *v, *o;
  float* lse;
  CHECK(cudaMalloc(&q, elems * 2));
  CHECK(cudaMalloc(&k, elems * 2));
  CHECK(cudaMalloc(&v, elems * 2));
  CHECK(cudaMalloc(&o, elems * 2));
  CHECK(cudaMalloc(&lse, size_t(kTokens) * (kModelDim / 64) * sizeof(float)));
  uint32_t seed = 1;
  for (void* t : {q, k, v}) fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(t), elems, seed++);
  CHECK(cudaGetLastError());
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));

  std::printf(csv ? "grid,hd,seqlen,causal,ms,tflops\n" : "%20s %4s %6s %6s %9s %8s\n", "grid", "hd", "seqlen",
              "causal", "ms", "TFLOP/s");
  using flashattn::detail::Sm90Grid;
  for (Sm90Grid grid : flashattn::detail::kSm90Grids)
  for (int64_t hd : {64, 128, 256})
    for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true}) {
        const int64_t b = kTokens / s, h = kModelDim / hd;
        const int64_t lse_shape[3] = {b, h, s};
        flashattn::ForwardArgs a;
        a.q = view4(q, b, s, h, hd);
        a.k = view4(k, b, s, h, hd);
        a.v = view4(v, b, s, h, hd);
        a.out = view4(o, b, s, h, hd);
        a.lse = flashattn::make_contiguous_view(lse, flashattn::DType::f32,
                                                flashattn::Device{flashattn::DeviceType::cuda, 0}, 3, lse_shape);
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
        if (!only_grid.empty() && only_grid != vname) continue;
        if (!only.empty() && only != vname + "," + std::to_string(hd) + "," + std::to_string(s) + "," +
                                          std::to_string(int(causal)))
          continue;
        for (int w = 0; w < 3; ++w) st = flashattn::detail::sm90_forward_run(p, grid);
        CHECK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int it = 0; it < iters && st.ok(); ++it) {
          CHECK(cudaEventRecord(start));
          st = flashattn::detail::sm90_forward_run(p, grid);
          CHECK(cudaEventRecord(stop));
          CHECK(cudaEventSynchronize(stop));
          float t = 0;
          CHECK(cudaEventElapsedTime(&t, start, stop));
          ms.push_back(t);
        }
        CHECK(cudaGetLastError());
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
