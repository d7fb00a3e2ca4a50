// The KV-cache call on the CUDA backends (the split-KV decode kernel, the append and rotary kernels) against the
// oracle over the gathered keys, on the grid of tests/common/kv_cache_case.h (both backends where the device
// runs them), plus long caches with many splits, clamped index values, and a CUDA-graph-captured decode loop.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend.h"
#include "common/kv_cache_case.h"
#include "cuda/sm80/decode_config.h"
#include "gpu/device_tensor.h"

namespace flashattn::test {
namespace {

// The case's tensors on the device, and a call over them.
struct DeviceKV {
  std::vector<std::unique_ptr<DeviceTensor>> tensors;
  std::vector<TensorView> views;
  explicit DeviceKV(KVCase& c) {
    for (HostTensor* t : kv_tensors(c)) {
      if (t->shape().empty()) {
        tensors.push_back(nullptr);
        views.push_back(TensorView{});
      } else {
        tensors.push_back(std::make_unique<DeviceTensor>(*t));
        views.push_back(tensors.back()->view(*t));
      }
    }
  }
  void download(KVCase& c) {
    std::vector<HostTensor*> host = kv_tensors(c);
    for (size_t i = 0; i < host.size(); ++i)
      if (tensors[i]) tensors[i]->download(*host[i]);
  }
};

bool backend_runs(Backend b) {
  if (!have_gpu()) return false;
  return b == Backend::cuda_sm80 || cuda_compute_capability(0) == 90;
}

struct GpuKVParam {
  KVCaseSpec spec;
  Backend backend;
};

class GpuKVCache : public ::testing::TestWithParam<GpuKVParam> {};

void run_case(KVCase& c, Backend backend, bool check_values = true) {
  const KVExpected want = expected_kv(c);
  DeviceKV dev(c);
  KVCacheArgs a = kv_args(c, dev.views);
  a.check_index_values = check_values;
  const Status st = attention_with_kvcache(a, kv_options(c.spec, backend));
  ASSERT_TRUE(st.ok()) << st.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download(c);
  check_kv_results(c, want, DType::f32);
}

TEST_P(GpuKVCache, MatchesOracle) {
  FA_REQUIRE_GPU();
  if (!backend_runs(GetParam().backend)) GTEST_SKIP() << backend_name(GetParam().backend) << " needs another GPU";
  KVCase c = make_kv_case(GetParam().spec);
  run_case(c, GetParam().backend);
}

std::vector<GpuKVParam> gpu_grid() {
  std::vector<GpuKVParam> out;
  for (const KVCaseSpec& s : kv_case_grid(true)) {
    out.push_back({s, Backend::cuda_sm90});
    out.push_back({s, Backend::cuda_sm80});
  }
  // Long caches: many key tiles per split, the split heuristic and forced split counts.
  for (int splits : {0, 1, 7, 64}) {
    KVCaseSpec s;
    s.batch = 2, s.h_q = 32, s.h_kv = 8, s.d = 128, s.d_v = 128, s.capacity = 9000, s.page_size = 16;
    s.full = true, s.num_splits = splits, s.s_new = 1, s.rotary_dim = 128, s.interleaved = false, s.causal = true;
    s.seed = 100 + uint64_t(splits);
    out.push_back({s, Backend::cuda_sm90});
  }
  // Grids that fill the GPU without splitting the keys run the rows16 plan, smaller ones rows16_wide
  // (decode_launch.cuh launch_decode; every case above is small): 48 x 8 and 32 x 8 row blocks at d 64 and 128 reach
  // 80% of an H100's / H200's block slots (3 and 2 rows16 blocks per SM); random lengths past a tile, dense and paged,
  // one query row and four.
  for (int d : {64, 128}) {
    KVCaseSpec s;
    s.batch = d == 64 ? 48 : 32, s.h_q = 32, s.h_kv = 8, s.d = d, s.d_v = d, s.capacity = 300;
    s.page_size = d == 64 ? 0 : 16, s.s_q = d == 64 ? 1 : 4, s.causal = d == 128, s.s_new = 1;
    s.seed = 300 + uint64_t(d);
    out.push_back({s, Backend::cuda_sm90});
  }
  // Packed rows past one m16 tile (s_q x group > 16) over caches large enough for the 64-row plan
  // (decode_launch.cuh decode_tall_rows; each case is at or above its threshold): one partial block, several blocks, exactly one, one row into
  // the second warp; pages of powers of two and not (3, 48: the division path), leftpads off the page grid,
  // every head-dim bucket.
  auto tall = [&](KVCaseSpec s, uint64_t seed) {
    s.seed = 200 + seed;
    out.push_back({s, Backend::cuda_sm90});
  };
  {
    KVCaseSpec s;
    s.h_q = 32, s.h_kv = 8, s.d = 128, s.d_v = 128, s.s_q = 16, s.page_size = 16, s.capacity = 4096;
    s.causal = true, s.full = true;
    tall(s, 1);
    s.d = 256, s.d_v = 256, s.h_q = 8, s.h_kv = 4, s.s_q = 20, s.page_size = 48, s.capacity = 12288, s.full = false;
    s.window_left = 30, s.window_right = 0, s.num_splits = 3;
    tall(s, 2);
    s = KVCaseSpec{};
    s.h_q = 16, s.h_kv = 1, s.s_q = 9, s.page_size = 3, s.capacity = 16384, s.leftpad = true, s.batch_idx = true;
    s.softcap = 15, s.num_splits = 0;
    tall(s, 3);
    s = KVCaseSpec{};
    s.h_q = 8, s.h_kv = 8, s.d = 128, s.d_v = 96, s.s_q = 64, s.capacity = 16384, s.s_new = 5, s.rotary_dim = 64;
    s.causal = true;
    tall(s, 4);
    s.dtype = DType::f16, s.s_q = 17, s.page_size = 16, s.capacity = 8192, s.s_new = 0, s.rotary_dim = 0;
    s.leftpad = true, s.num_splits = 7;
    tall(s, 5);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuKVCache, ::testing::ValuesIn(gpu_grid()),
                         [](const ::testing::TestParamInfo<GpuKVParam>& i) {
                           return i.param.spec.name() + "_" + backend_name(i.param.backend);
                         });

// A GPU whose blocks hold less shared memory than rows16_wide's 3 stages at d 128 (A100: 163 KB of 196) runs the
// plan's lean 2-stage form (decode_config.h; decode_launch.cuh launch_decode): small grids through an A100's
// budget on this GPU, dense and paged, splits from the heuristic and forced; d 64, whose rows16_wide fits, beside.
TEST(GpuKVCacheLean, SmallerBlockSharedMemoryRunsTheLeanWidePlan) {
  using cuda::sm80::DecodePlan, cuda::sm80::decode_smem_bytes, cuda::sm80::kDecodeLeanSmemBytes;
  static_assert(decode_smem_bytes(128, DecodePlan::rows16_wide) > kDecodeLeanSmemBytes &&
                    decode_smem_bytes(128, DecodePlan::rows16_wide_lean) <= kDecodeLeanSmemBytes &&
                    decode_smem_bytes(64, DecodePlan::rows16_wide) <= kDecodeLeanSmemBytes,
                "the cases below run the lean plan at d 128 and rows16_wide at d 64");
  FA_REQUIRE_GPU();
  std::vector<KVCaseSpec> specs;
  for (int splits : {0, 3}) {
    KVCaseSpec s;
    s.batch = 2, s.h_q = 32, s.h_kv = 8, s.d = 128, s.d_v = 128, s.capacity = 5000, s.s_new = 1;
    s.page_size = splits ? 16 : 0, s.rotary_dim = 128, s.interleaved = false, s.causal = true, s.full = splits == 0;
    s.num_splits = splits, s.seed = 500 + uint64_t(splits);
    specs.push_back(s);
  }
  KVCaseSpec small;
  small.batch = 3, small.s_q = 4, small.h_q = 8, small.h_kv = 2, small.capacity = 700, small.page_size = 64;
  small.leftpad = true, small.seed = 510;
  specs.push_back(small);
  for (const KVCaseSpec& spec : specs) {
    SCOPED_TRACE(spec.name());
    KVCase c = make_kv_case(spec);
    const KVExpected want = expected_kv(c);
    DeviceKV dev(c);
    KVCacheParams kp;
    ASSERT_TRUE(make_kvcache_params(kv_args(c, dev.views), kv_options(spec, Backend::cuda_sm80), &kp).ok());
    const Status st = detail::cuda_kvcache(
        kp, [](const FwdParams& p) { return detail::cuda_decode_forward(p, kDecodeLeanSmemBytes); });
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.download(c);
    check_kv_results(c, want, DType::f32);
  }
}

// The case's call with the host check off (as under capture), its results downloaded into c.
void run_unchecked(KVCase& c) {
  DeviceKV dev(c);
  KVCacheArgs a = kv_args(c, dev.views);
  a.check_index_values = false;
  ASSERT_TRUE(attention_with_kvcache(a, kv_options(c.spec, Backend::automatic)).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download(c);
}

// Index values out of range with the host check off (as under capture): no fault, nothing outside written
// (run under compute-sanitizer by bench/gpu/device_check_*.sh).
TEST(GpuKVCacheClamps, OutOfRangeValuesStayInBounds) {
  FA_REQUIRE_GPU();
  KVCaseSpec s;
  s.page_size = 16, s.s_new = 2, s.rotary_dim = 16, s.batch = 3, s.batch_idx = true;
  KVCase c = make_kv_case(s);
  c.seqlens.set(0, 1e6);
  c.seqlens.set(1, -50);
  c.block_table.set(1, -3);
  c.block_table.set(2, INT32_MAX);  // past the pages: the decode kernel's unsigned range check (PagedLoad::whole32)
  c.batch_idx.set(2, 1000);
  run_unchecked(c);
  // The sequence with no valid entry sees no key: O = 0, LSE = -inf.
  for (int64_t h = 0; h < s.h_q; ++h) EXPECT_EQ(c.lse.get(c.lse.offset({2, h, 0})), -INFINITY);
}

// Packed new rows with offsets out of range (decreasing, past the rows, negative) and the host check off: the
// append kernel stays inside k_new and the caches (run under compute-sanitizer), and every call completes.
TEST(GpuKVCacheClamps, VarlenNewRowOffsetsStayInBounds) {
  FA_REQUIRE_GPU();
  KVCaseSpec s;
  s.page_size = 16, s.s_new = 3, s.varlen_new = true, s.rotary_dim = 16, s.rotary_base = true, s.batch = 3;
  KVCase c = make_kv_case(s);
  c.cu_new.set(1, 1e6);
  c.cu_new.set(2, -40);
  c.rotary_seqlens.set(0, 1e7);
  run_unchecked(c);
}

// A decode loop captured once in a CUDA graph and replayed with new lengths and rows gives what eager calls give,
// with the splits merged in one cluster (4 on Hopper) and by the combine kernel launched behind the decode
// kernel (12: past kMaxClusterSplits).
class GpuKVCacheGraph : public ::testing::TestWithParam<int> {};

TEST_P(GpuKVCacheGraph, CapturedDecodeLoopMatchesEager) {
  FA_REQUIRE_GPU();
  const int splits = GetParam();
  KVCaseSpec s;
  s.batch = 4, s.h_q = 32, s.h_kv = 8, s.d = 128, s.d_v = 128, s.capacity = 512, s.page_size = 16, s.s_new = 1;
  s.rotary_dim = 64, s.causal = true, s.full = false;
  KVCase eager = make_kv_case(s);
  for (int64_t b = 0; b < s.batch; ++b) eager.seqlens.set(b, double(10 * b));
  KVCase graphed = eager;
  DeviceKV de(eager), dg(graphed);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  AttentionOptions opt = kv_options(s, Backend::automatic);
  opt.stream = stream;
  KVCacheArgs ag = kv_args(graphed, dg.views);
  ag.check_index_values = false;
  ag.num_splits = splits;  // fixed: the graph's grid must not depend on the lengths
  KVCacheArgs ae = kv_args(eager, de.views);
  ae.num_splits = splits;

  // Warm-up outside capture (first-use attribute setting and the workspace pool).
  ASSERT_TRUE(attention_with_kvcache(ag, opt).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  dg.tensors[1]->upload(graphed.k_cache);
  dg.tensors[2]->upload(graphed.v_cache);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = attention_with_kvcache(ag, opt);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.message;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  std::mt19937_64 rng(7);
  HostTensor seqlens = eager.seqlens;
  for (int step = 0; step < 100; ++step) {
    eager.k_new.fill_normal(rng);
    eager.v_new.fill_normal(rng);
    eager.q.fill_normal(rng);
    // The step's inputs (q, k_new, v_new, cache_seqlens), the same in both.
    for (int i : {0, 5, 6}) {
      de.tensors[size_t(i)]->upload(*kv_tensors(eager)[size_t(i)]);
      dg.tensors[size_t(i)]->upload(*kv_tensors(eager)[size_t(i)]);
    }
    de.tensors[9]->upload(seqlens);
    dg.tensors[9]->upload(seqlens);
    ASSERT_TRUE(attention_with_kvcache(ae, opt).ok());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    HostTensor oe = eager.out, og = graphed.out;
    de.tensors[3]->download(oe);
    dg.tensors[3]->download(og);
    ASSERT_EQ(std::memcmp(oe.data(), og.data(), oe.bytes()), 0) << "step " << step;
    for (int64_t b = 0; b < s.batch; ++b)
      seqlens.set(b, double(std::min<int64_t>(int64_t(seqlens.get(b)) + 1 + b, eager.capacity - 1)));
  }
  HostTensor ke = eager.k_cache, kg = graphed.k_cache;
  de.tensors[1]->download(ke);
  dg.tensors[1]->download(kg);
  EXPECT_EQ(std::memcmp(ke.data(), kg.data(), ke.bytes()), 0) << "the caches diverged";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Splits, GpuKVCacheGraph, ::testing::Values(4, 12),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "splits"; });

}  // namespace
}  // namespace flashattn::test
