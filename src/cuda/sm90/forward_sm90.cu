// Hopper forward: O = softmax(Q Kᵀ · scale) V and LSE, fp16/bf16 in, fp32 accumulation, for head dims d and d_v
// that are multiples of 8 up to 256, in buckets of 64, 128, 192, 256 (support_checks.h: columns past d / d_v are
// TMA's zeros), with causal / sliding-window masks, softcap, ALiBi, dropout, GQA, varlen and arbitrary tails.
// ALiBi and dropout run in a kernel of their own (kExtras), so that the plain kernel's registers stay as they were.
//
// Work: tiles of kBlockM = 64 · (consumer warpgroups) query rows of one (batch, head), numbered head-major
// (forward_tiles.cuh). A CTA runs kPipelines independent pipelines (forward_config.h; one, or three at hd 64 on
// short sequences), each with its own buffers, barriers and tile sequence. A persistent grid of kCtasPerSm CTAs
// per SM (two with a single consumer warpgroup, else one) whose pipelines claim the next tile from a global
// counter as they finish one (TileSequence), or, when forced (Sm90Grid, forward_sm90.h), a pipeline per tile.
// Clusters (kClusterCtas = 2, hd 64's pipelines): a tile is two blocks, one per CTA of the cluster, which share
// each K / V tile: every CTA TMA-multicasts its half of it into both (half the L2 reads per product); rank 0's
// producer claims the tiles and posts them into both CTAs' tile rings.
// Warp roles (128 · (1 + consumer warpgroups of all pipelines) threads):
//   warpgroup 0  producer: gives registers away (setmaxnreg); lane 0 of warp p issues pipeline p's TMA loads of
//                each tile's Q block and of its K and V tiles into a kStages-deep shared-memory ring (full/empty
//                mbarriers; Q has its own full/empty pair so the next Q loads once the last S has landed); in a
//                persistent grid it also claims the pipeline's next tile and posts it to its consumers.
//   warpgroups 1..  consumers (setmaxnreg), 64 query rows each, pipeline by pipeline: per key tile S = Q Kᵀ
//                (wgmma, both from shared memory), mask + softcap, online softmax in registers (exp2 with scale·log2e
//                folded into one FFMA), then O += P V (wgmma with P from registers, V from shared memory, N-major).
//                After the last key tile: O / rowsum written to global memory in 16-byte runs (the quad's lanes swap
//                column pairs first), LSE = (m·scale·log2e + log2 l)·ln2.
// The consumers' steps overlap (forward_mainloop.cuh): S of tile n is issued with P V of tile n+1 and the
// softmax runs under P V, the consumer warpgroups taking turns to issue on named barriers where the plan says so
// (IssueOrder). KernelPlan (forward_config.h) picks the tile set per head dim and mask, and by key count where a
// plan names a ShortKeysPlan (launch_plan_for_keys).
// Key tiles run from the last one down, so the masked diagonal tiles of a causal block come first; a head's
// heaviest query blocks (largest index, most keys under a causal mask) start first.
//
// Shared memory and tile sizes: forward_config.h (120 to 224 KB per CTA). Files: this one (kernel, host launcher,
// support check), forward_tiles.cuh (arguments, shared-memory carve-up, a tile's work), forward_mainloop.cuh
// (producer, consumer steps and their order, epilogue), primitives_sm90.cuh.
// Preconditions (sm90_forward_supports): compute capability 9.0, fp16/bf16, d and d_v multiples of 8 up to 256,
// every row/head/batch stride of Q, K, V, O a multiple of 8 elements and 16-byte aligned bases (TMA's rules).
// Rows past a sequence's end are loaded (zeros past the tensor, the next sequence's rows in varlen) but masked
// as keys and never written as queries.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend.h"
#include "common/mask.h"
#include "cuda/check.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_mainloop.cuh"
#include "cuda/sm90/forward_sm90.h"
#include "cuda/sm90/forward_tiles.cuh"
#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/support_checks.h"
#include "cuda/sm90/tensor_map.h"
#include "cuda/workspace.h"

namespace flashattn::cuda::sm90 {
namespace {

template <typename T, typename Cfg, bool kExtras>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    forward_kernel(const __grid_constant__ ForwardKernelArgs args, const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t rank = Cfg::kClusterCtas == 1 ? 0u : cluster_cta_rank();
  if (threadIdx.x == 0) {
    for (int pipeline = 0; pipeline < Cfg::kPipelines; ++pipeline) {
      const SharedStorage<Cfg> sm(smem_raw, pipeline);
      mbarrier_init(sm.q_full(), 1);
      mbarrier_init(sm.q_empty(), Cfg::kConsumerWarps);
      for (int s = 0; s < Cfg::kStages; ++s) {
        mbarrier_init(&sm.k_full()[s], 1);
        mbarrier_init(&sm.v_full()[s], 1);
        mbarrier_init(&sm.k_empty()[s], Cfg::kKVReleases);
        mbarrier_init(&sm.v_empty()[s], Cfg::kKVReleases);
      }
      // Only rank 0's tile_empty is used in a cluster (TileSequence).
      for (int s = 0; s < kTileRing; ++s) {
        mbarrier_init(&sm.tile_full()[s], 1);
        mbarrier_init(&sm.tile_empty()[s], rank == 0 ? Cfg::kTileReleases : 1);
      }
    }
    mbarrier_init_fence();
  }
  // In a cluster the other CTAs' producers and consumers use this CTA's barriers: none may start before all are
  // initialised.
  if constexpr (Cfg::kClusterCtas > 1)
    cluster_sync();
  else
    __syncthreads();

  // A tile with no rows (a varlen sequence shorter than the longest) is skipped by every thread alike.
  const int wg = warpgroup_index();
  PipelineState<Cfg::kStages> st;
  if (wg == 0) {
    setmaxnreg_decrease<Cfg::kProducerRegisters>();
    // Lane 0 of warp p is pipeline p's producer (a single pipeline's index is a constant: its registers are few).
    const int pipeline = Cfg::kPipelines == 1 ? 0 : int(threadIdx.x) / 32;
    if (int(threadIdx.x) == 32 * pipeline && pipeline < Cfg::kPipelines) {
      const SharedStorage<Cfg> sm(smem_raw, pipeline);
      tma_prefetch_map(&tm_q);
      tma_prefetch_map(&tm_k);
      tma_prefetch_map(&tm_v);
      // The rank is read where it is used, not held (cluster_cta_rank): the producer's 32 registers have none to
      // spare in a cluster.
      auto cta_rank = [] { return Cfg::kClusterCtas == 1 ? 0u : cluster_cta_rank(); };
      for (TileSequence<Cfg> seq(pipeline); seq.valid(args); seq.next_for_producer(args, sm, cta_rank())) {
        const BlockWork w = block_work<Cfg>(args, seq.tile, int(cta_rank()));
        if (!w.has_rows) continue;
        produce<Cfg>(sm, w, w.head / args.heads_per_kv, &tm_q, &tm_k, &tm_v, st, cta_rank());
      }
    }
  } else {
    setmaxnreg_increase<Cfg::kConsumerRegisters>();
    const int pipeline = Cfg::kPipelines == 1 ? 0 : (wg - 1) / Cfg::kConsumerWarpgroups;
    const int consumer = Cfg::kPipelines == 1 ? wg - 1 : (wg - 1) % Cfg::kConsumerWarpgroups;
    const SharedStorage<Cfg> sm(smem_raw, pipeline);
    if (consumer == Cfg::kConsumerWarpgroups - 1) pass_turn<Cfg>(consumer);
    auto run = [&](auto dropout) {
      for (TileSequence<Cfg> seq(pipeline); seq.valid(args); seq.next_for_consumer(args, sm, rank)) {
        BlockWork w = block_work<Cfg>(args, seq.tile, int(rank));
        if (!w.has_rows) continue;
        // In varlen the key-tile range comes from loads of cu_seqlens, which the compiler cannot see are equal in
        // every lane; broadcast it so the loop counters and ring positions stay warp-uniform (uniform registers
        // for the descriptors; TileSequence does the same for the tile number).
        w.n_begin = __shfl_sync(0xffffffffu, w.n_begin, 0);
        w.n_end = __shfl_sync(0xffffffffu, w.n_end, 0);
        Consumer<T, Cfg, kExtras, decltype(dropout)::value> c(sm, w, args, consumer);
        consume(c, consumer, st);
        c.epilogue();
      }
    };
    if constexpr (kExtras) {
      if (args.dropout_p > 0)
        run(std::true_type{});
      else
        run(std::false_type{});
    } else {
      run(std::false_type{});
    }
  }
  // The other CTAs of a cluster still arrive on this CTA's barriers (their last K / V releases, tile ring reads)
  // and their loads write into its shared memory until they are done: no CTA exits before every one is.
  if constexpr (Cfg::kClusterCtas > 1) cluster_sync();
}

}  // namespace
}  // namespace flashattn::cuda::sm90

namespace flashattn::detail {
namespace {

using sm90_checks::aligned;
using sm90_checks::tma_stride_ok;

// An attribute of the current device (the launcher runs under DeviceGuard), or `fallback` if it cannot be read.
int device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, value = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess || value <= 0)
    return fallback;
  return value;
}

template <typename T, typename Plan, bool kExtras>
Status launch(const FwdParams& p, Sm90Grid grid) {
  using Cfg = typename Plan::Config;
  const bool varlen = p.is_varlen();
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t batch_dim = varlen ? 1 : p.batch;
  const int64_t m_tiles = (p.seqlen_q + Cfg::kTileRows - 1) / Cfg::kTileRows;
  const int64_t num_tiles = m_tiles * p.heads_q * p.batch;
  if (num_tiles == 0) return Status::success();
  const bool persistent = grid == Sm90Grid::persistent;
  // In varlen the batch dimension has extent 1 and is never stepped; any valid stride will do.
  auto batch_stride = [&](int64_t s, int64_t row_stride, int64_t rows) {
    return varlen ? row_stride * std::max<int64_t>(rows, 1) : s;
  };
  // With no keys at all the kernel never reads K or V (every row is empty), but the maps still need an address.
  const void* k_base = rows_k > 0 ? p.k : p.q;
  const void* v_base = rows_k > 0 ? p.v : p.q;
  CUtensorMap tm_q, tm_k, tm_v;
  {
    // The true head dims, not the bucket's: TMA loads zeros past them (support_checks.h, head_dim_bucket).
    const int64_t dims[4] = {p.head_dim, rows_q, p.heads_q, batch_dim};
    const int64_t strides[3] = {p.q_row_stride, p.q_head_stride, batch_stride(p.q_batch_stride, p.q_row_stride, rows_q)};
    Status st = make_tensor_map_sw128(&tm_q, p.q, p.dtype, dims, strides, Cfg::kBlockM);
    if (!st.ok()) return st;
  }
  {
    const int64_t dims[4] = {p.head_dim, rows_k, p.heads_kv, batch_dim};
    const int64_t strides[3] = {p.k_row_stride, p.k_head_stride, batch_stride(p.k_batch_stride, p.k_row_stride, rows_k)};
    // Each CTA of a cluster loads its part of every K / V tile (produce).
    Status st = make_tensor_map_sw128(&tm_k, k_base, p.dtype, dims, strides, Cfg::kKVPartRows);
    if (!st.ok()) return st;
    const int64_t vdims[4] = {p.head_dim_v, rows_k, p.heads_kv, batch_dim};
    const int64_t vstrides[3] = {p.v_row_stride, p.v_head_stride, batch_stride(p.v_batch_stride, p.v_row_stride, rows_k)};
    st = make_tensor_map_sw128(&tm_v, v_base, p.dtype, vdims, vstrides, Cfg::kKVPartRows);
    if (!st.ok()) return st;
  }

  cuda::sm90::ForwardKernelArgs a{};
  a.o = p.o;
  a.head_dim_v = int(p.head_dim_v);
  a.lse = p.lse;
  a.o_batch_stride = p.o_batch_stride;
  a.o_row_stride = p.o_row_stride;
  a.o_head_stride = p.o_head_stride;
  a.lse_batch_stride = p.lse_batch_stride;
  a.lse_head_stride = p.lse_head_stride;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqlen_q = int(p.seqlen_q);
  a.seqlen_k = int(p.seqlen_k);
  a.heads_per_kv = int(p.heads_q / p.heads_kv);
  constexpr double kLog2e = 1.4426950408889634;
  a.softcap = p.softcap;
  a.softcap_in_scale = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  a.scale_log2 = float(p.softcap > 0.f ? kLog2e : double(p.softmax_scale) * kLog2e);
  a.causal = p.causal;
  // 32-bit window arguments: the narrowest edges that mean the same (a window past 2^31 would truncate).
  a.window_left = int(MaskSpec::narrowest_left(p.window_left, p.seqlen_k));
  a.window_right = int(MaskSpec::narrowest_right(p.window_right, p.seqlen_q));
  a.alibi_slopes = p.alibi_slopes;
  a.alibi_batch_stride = p.alibi_slopes_batch_stride;
  a.dropout_p = p.dropout_p, a.dropout_seed = p.dropout_seed, a.dropout_offset = p.dropout_offset;
  a.num_m_tiles = int(m_tiles);
  a.num_heads = int(p.heads_q);
  a.num_tiles = int(num_tiles);

  auto kernel = cuda::sm90::forward_kernel<T, Cfg, kExtras>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  // All of L1 as shared memory, so that kCtasPerSm CTAs fit on an SM.
  FA_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = Cfg::kClusterCtas;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = Cfg::kClusterCtas > 1 ? 1 : 0;  // a cluster of one CTA: an ordinary launch
  // Each cluster runs kPipelines tile sequences (forward_config.h); num_tiles < 2^30 (sm90_forward_supports), so
  // a cluster per tile always fits the grid.
  const int64_t tile_clusters = (num_tiles + Cfg::kPipelines - 1) / Cfg::kPipelines;
  int64_t clusters = tile_clusters;
  if (persistent) {
    int resident = Cfg::kCtasPerSm * device_attribute(cudaDevAttrMultiProcessorCount, 1);
    if constexpr (Cfg::kClusterCtas > 1) {
      // Clusters are placed within a GPC, whose SMs may not pair up: the driver says how many fit at once. Asked
      // once per kernel and device (static storage starts at 0, "not asked"): the answer does not change.
      constexpr int kCachedDevices = 64;
      static std::atomic<int> asked[kCachedDevices];
      const int dev = p.device.index;
      int fit = dev >= 0 && dev < kCachedDevices ? asked[dev].load(std::memory_order_relaxed) : 0;
      if (fit == 0) {
        config.gridDim = dim3(unsigned(Cfg::kClusterCtas));
        FA_CUDA_TRY(cudaOccupancyMaxActiveClusters(&fit, kernel, &config));
        if (fit < 1) return Status::unsupported("cuda_sm90: no cluster of this forward kernel fits the device");
        if (dev >= 0 && dev < kCachedDevices) asked[dev].store(fit, std::memory_order_relaxed);
      }
      resident = fit;
    }
    clusters = std::min<int64_t>(tile_clusters, resident);
  }
  config.gridDim = dim3(unsigned(clusters * Cfg::kClusterCtas));
  // A persistent grid claims tiles from a counter: 4 bytes of workspace (cuda/workspace.h), zeroed and freed on
  // the stream (capturable in a CUDA graph, and private to this call, so concurrent calls cannot interfere).
  a.tile_counter = nullptr;
  if (clusters * Cfg::kPipelines < num_tiles) {
    void* counter = nullptr;
    Status got = workspace_alloc(&counter, sizeof(unsigned), p.device.index, stream);
    if (!got.ok()) return got;
    a.tile_counter = static_cast<unsigned*>(counter);
  }
  Status st = cuda_status(a.tile_counter ? cudaMemsetAsync(a.tile_counter, 0, sizeof(unsigned), stream)
                                         : cudaSuccess,
                          "cudaMemsetAsync(sm90 tile counter)");
  if (st.ok()) st = cuda_status(cudaLaunchKernelEx(&config, kernel, a, tm_q, tm_k, tm_v), "cuda_sm90 forward launch");
  if (a.tile_counter) {
    Status freed = workspace_free(a.tile_counter, stream);
    if (st.ok()) st = freed;
  }
  return st;
}

template <typename T, typename Plan, bool kExtras>
Status launch_plan_for_keys(const FwdParams& p, Sm90Grid grid) {
  if constexpr (!std::is_void_v<typename Plan::ShortKeysPlan>) {
    if (p.seqlen_k <= Plan::kShortKeys) return launch<T, typename Plan::ShortKeysPlan, kExtras>(p, grid);
  }
  return launch<T, Plan, kExtras>(p, grid);
}

template <typename T, typename Plan>
Status launch_plan_for_extras(const FwdParams& p, Sm90Grid grid) {
  return p.alibi_slopes != nullptr || p.dropout_p > 0 ? launch_plan_for_keys<T, Plan, true>(p, grid)
                                   : launch_plan_for_keys<T, Plan, false>(p, grid);
}

template <typename T, int kHeadDim>
Status launch_planned(const FwdParams& p, Sm90Grid grid) {
  const bool masked = p.causal || p.window_left >= 0 || p.window_right >= 0;
  return masked ? launch_plan_for_extras<T, cuda::sm90::KernelPlan<kHeadDim, true>>(p, grid)
                : launch_plan_for_extras<T, cuda::sm90::KernelPlan<kHeadDim, false>>(p, grid);
}

template <typename T>
Status launch_head_dim(const FwdParams& p, Sm90Grid grid) {
  switch (sm90_checks::head_dim_bucket(p.head_dim, p.head_dim_v)) {
    case 64: return launch_planned<T, 64>(p, grid);
    case 128: return launch_planned<T, 128>(p, grid);
    case 192: return launch_planned<T, 192>(p, grid);
    default: return launch_planned<T, 256>(p, grid);  // sm90_forward_supports passed: the bucket is 256
  }
}

}  // namespace

Status sm90_forward_supports(const FwdParams& p) {
  Status common = sm90_checks::common(p);
  if (!common.ok()) return common;
  const bool varlen = p.is_varlen();
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride,
                             varlen ? 0 : p.q_batch_stride, varlen ? 0 : p.k_batch_stride,
                             varlen ? 0 : p.v_batch_stride, varlen ? 0 : p.o_batch_stride};
  for (int64_t s : strides)
    if (!tma_stride_ok(s))
      return Status::unsupported("cuda_sm90: TMA needs every row/head/batch stride to be a multiple of 8 elements");
  if (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.o, 16))
    return Status::unsupported("cuda_sm90: TMA needs 16-byte aligned Q, K, V, O");
  if (p.heads_q > 65535 || p.batch > 65535) return Status::unsupported("cuda_sm90: more than 65535 heads or batches");
  // The kernel's mask arithmetic is 32-bit (MaskSpec32): a row's diagonal and window edges, with the edges narrowed
  // to the lengths, stay below 2^31 when the lengths add up to less (a tile of padding rows to spare).
  if (p.seqlen_q + p.seqlen_k > (int64_t(1) << 31) - 1024)
    return Status::unsupported("cuda_sm90: seqlen_q + seqlen_k past 2^31 - 1024 (the forward's 32-bit mask arithmetic)");
  // Tiles are numbered in int (the kernel adds the grid size to a tile number); counted at the smallest kBlockM.
  const int64_t kMaxTiles = int64_t(1) << 30;
  if ((p.seqlen_q + cuda::sm90::kWgmmaRows - 1) / cuda::sm90::kWgmmaRows * p.heads_q * p.batch >= kMaxTiles)
    return Status::unsupported("cuda_sm90: more than 2^30 query tiles (batch x heads x query blocks)");
  return Status::success();
}

Status sm90_forward_run(const FwdParams& p, Sm90Grid grid) {
  Status st = sm90_forward_supports(p);
  if (!st.ok()) return st;
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  return p.dtype == DType::bf16 ? launch_head_dim<__nv_bfloat16>(p, grid) : launch_head_dim<__half>(p, grid);
}

}  // namespace flashattn::detail
