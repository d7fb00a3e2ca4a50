// Times the CUDA backward through the public API on the issue-3 shapes: B·S = 16k tokens, H·D = 2048, bf16,
// head dims 64/128/256, causal and not. FLOPs 2.5 × 4·B·H·S²·D, half for causal. Inputs are random (never
// zeros); O is random and the LSE is the value a random-score row would have (log of its visible key count
// + 1/2), so P has realistic magnitudes without depending on the forward kernel. Median of per-call event
// pairs around back-to-back calls (workspace allocation included, as users call it).
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -Iinclude bench/gpu/backward_bench.cu <build>/libflashattn.a \
//     -Xcompiler -fopenmp -o backward_bench && ./backward_bench [S ...]
// FA_BWD_BACKEND=cuda_sm80 (default) | cuda_sm90 | auto picks the backend; calls it does not support are listed
// as such.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_common.cuh"
#include "flashattn/flashattn.h"

using namespace flashattn;

// lse[b][h][i] = log(keys visible to row i) + 0.5 (the LSE of unit-variance scores).
__global__ void fill_lse(float* lse, int64_t rows, int64_t s, bool causal) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = r % s;
    lse[r] = logf(float(causal ? i + 1 : s)) + 0.5f;
  }
}

double time_backward(const BwdParams& p, Backend backend, int reps) {
  for (int i = 0; i < 2; ++i) {
    Status st = run_backward(p, backend);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.message.c_str());
      std::exit(1);
    }
  }
  CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * reps));
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(ev[2 * i]));
    run_backward(p, backend);
    CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaGetLastError());
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) CHECK(cudaEventElapsedTime(&ms[size_t(i)], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<int64_t> seqs;
  for (int i = 1; i < argc; ++i) seqs.push_back(std::atoll(argv[i]));
  if (seqs.empty()) seqs = {1024, 4096, 16384};
  Backend backend = Backend::cuda_sm80;
  const char* backend_env = std::getenv("FA_BWD_BACKEND");
  if (backend_env && !parse_backend(backend_env, &backend)) {
    std::fprintf(stderr, "FA_BWD_BACKEND: unknown backend %s\n", backend_env);
    return 2;
  }
  const int64_t tokens = 16384, hidden = 2048;
  const size_t n = size_t(tokens * hidden);  // elements of each of q, k, v, o, dout, dq, dk, dv (all shapes)
  void* buf[8];
  for (int t = 0; t < 8; ++t) {
    CHECK(cudaMalloc(&buf[t], n * 2));
    fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(buf[t]), n, uint32_t(t + 1) * 0x9e3779b9u);
  }
  float* lse;
  CHECK(cudaMalloc(&lse, size_t(tokens) * 256 * 4));
  CHECK(cudaGetLastError());

  std::printf("backend %s\n| S | B | H | D | causal | mode | ms | TFLOP/s |\n|---|---|---|---|---|---|---|---|\n",
              backend_name(backend));
  for (int64_t d : {64, 128, 256}) {
    for (int64_t s : seqs) {
      for (bool causal : {false, true}) {
        for (bool det : {false, true}) {
          // Deterministic mode once per head dim, at the largest length without causal: it is not the fast path.
          if (det && (causal || s != seqs.back())) continue;
          const int64_t b = tokens / s, h = hidden / d;
          fill_lse<<<1024, 256>>>(lse, b * h * s, s, causal);
          BackwardArgs a;
          a.q = view4(buf[0], b, s, h, d), a.k = view4(buf[1], b, s, h, d), a.v = view4(buf[2], b, s, h, d);
          a.out = view4(buf[3], b, s, h, d), a.dout = view4(buf[4], b, s, h, d);
          a.dq = view4(buf[5], b, s, h, d), a.dk = view4(buf[6], b, s, h, d), a.dv = view4(buf[7], b, s, h, d);
          const int64_t lshape[3] = {b, h, s};
          a.lse = make_contiguous_view(lse, DType::f32, Device{DeviceType::cuda, 0}, 3, lshape);
          AttentionOptions opt;
          opt.causal = causal;
          opt.deterministic = det;
          opt.backend = backend;
          BwdParams p;
          Status st = make_backward_params(a, opt, &p);
          if (!st.ok()) {
            std::fprintf(stderr, "%s\n", st.message.c_str());
            return 1;
          }
          const BackendChoice choice = choose_backend(p, backend);
          if (!choice.status.ok()) {
            std::printf("| %lld | %lld | %lld | %lld | %d | %s | unsupported: %s | |\n", (long long)s, (long long)b,
                        (long long)h, (long long)d, int(causal), det ? "deterministic" : "atomic dQ",
                        choice.status.message.c_str());
            continue;
          }
          const double ms = time_backward(p, backend, det ? 5 : 20);
          const double flops = 2.5 * 4.0 * b * h * double(s) * double(s) * d / (causal ? 2 : 1);
          std::printf("| %lld | %lld | %lld | %lld | %d | %s | %.3f | %.1f |\n", (long long)s, (long long)b,
                      (long long)h, (long long)d, int(causal), det ? "deterministic" : "atomic dQ", ms,
                      flops / (ms * 1e-3) / 1e12);
          std::fflush(stdout);
        }
      }
    }
  }
  for (void* p : buf) cudaFree(p);
  cudaFree(lse);
  return 0;
}
