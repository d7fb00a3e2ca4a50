// The Hopper forward's kernel and its launcher, shared by the 16-bit (forward_sm90.cu) and e4m3
// (forward_sm90_fp8.cu) entry points, each of which instantiates its own element types: the kernel's roles,
// budgets and preconditions are in forward_sm90.cu's header.
#pragma once

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
#include "cuda/device_attribute.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_mainloop.cuh"
#include "cuda/sm90/forward_sm90.h"
#include "cuda/sm90/forward_tiles.cuh"
#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/workspace.h"

namespace flashattn::cuda::sm90 {

// TOut: O's element type (T, or fp16 / bf16 for e4m3 inputs).
template <typename T, typename Cfg, bool kExtras, typename TOut = T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    forward_kernel(const __grid_constant__ ForwardKernelArgs args, const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
  // Chunked attention runs in the extras kernels and in the e4m3 kernel (one kernel for every e4m3 call).
  constexpr bool kChunks = kExtras || Cfg::kElemBytes == 1;
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
        const BlockWork w = block_work<Cfg, kChunks>(args, seq.tile, int(cta_rank()));
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
        BlockWork w = block_work<Cfg, kChunks>(args, seq.tile, int(rank));
        if (!w.has_rows) continue;
        // In varlen the key-tile range comes from loads of cu_seqlens, which the compiler cannot see are equal in
        // every lane; broadcast it so the loop counters and ring positions stay warp-uniform (uniform registers
        // for the descriptors; TileSequence does the same for the tile number).
        w.n_begin = __shfl_sync(0xffffffffu, w.n_begin, 0);
        w.n_end = __shfl_sync(0xffffffffu, w.n_end, 0);
        Consumer<T, Cfg, kExtras, decltype(dropout)::value, TOut> c(sm, w, args, consumer);
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


}  // namespace flashattn::cuda::sm90

namespace flashattn::detail::sm90_forward {

// The operand the V tensor map reads: V itself (16-bit inputs), or V_t (e4m3: fp8_v_layout.h) in its own layout.
struct VOperand {
  const void* base;
  int64_t dims[4];     // innermost first
  int64_t strides[3];  // elements
};

// Launches the plan's kernel on validated params (sm90_forward_supports); v_t: the e4m3 forward's V_t (null: V).
template <typename T, typename TOut, typename Plan, bool kExtras>
Status launch(const FwdParams& p, Sm90Grid grid, const VOperand* v_t = nullptr) {
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
    Status st = make_tensor_map_sw128(&tm_q, p.q, p.dtype, dims, strides, Cfg::kBlockM, Cfg::kQKPanelBytes);
    if (!st.ok()) return st;
  }
  {
    const int64_t dims[4] = {p.head_dim, rows_k, p.heads_kv, batch_dim};
    const int64_t strides[3] = {p.k_row_stride, p.k_head_stride, batch_stride(p.k_batch_stride, p.k_row_stride, rows_k)};
    // Each CTA of a cluster loads its part of every K / V tile (produce).
    Status st = make_tensor_map_sw128(&tm_k, k_base, p.dtype, dims, strides, Cfg::kKVPartRows, Cfg::kQKPanelBytes);
    if (!st.ok()) return st;
    if (v_t) {
      // V_t: a box is kHeadDim rows of one 128-key panel (produce).
      st = make_tensor_map_sw128(&tm_v, v_t->base, p.dtype, v_t->dims, v_t->strides, Cfg::kHeadDim);
    } else {
      const int64_t vdims[4] = {p.head_dim_v, rows_k, p.heads_kv, batch_dim};
      const int64_t vstrides[3] = {p.v_row_stride, p.v_head_stride,
                                   batch_stride(p.v_batch_stride, p.v_row_stride, rows_k)};
      st = make_tensor_map_sw128(&tm_v, v_base, p.dtype, vdims, vstrides, Cfg::kKVPartRows);
    }
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
  a.attention_chunk = int(MaskSpec::narrowest_chunk(p.attention_chunk, p.seqlen_k));
  a.alibi_slopes = p.alibi_slopes;
  a.alibi_batch_stride = p.alibi_slopes_batch_stride;
  a.dropout_p = p.dropout_p, a.dropout_rng = DropoutRng::of(p);
  a.q_descale = p.q_descale, a.k_descale = p.k_descale, a.v_descale = p.v_descale;
  for (int i = 0; i < 2; ++i) {
    a.q_descale_strides[i] = p.q_descale_strides[i];
    a.k_descale_strides[i] = p.k_descale_strides[i];
    a.v_descale_strides[i] = p.v_descale_strides[i];
  }
  a.num_m_tiles = int(m_tiles);
  a.num_heads = int(p.heads_q);
  a.num_tiles = int(num_tiles);

  auto kernel = cuda::sm90::forward_kernel<T, Cfg, kExtras, TOut>;
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


}  // namespace flashattn::detail::sm90_forward
