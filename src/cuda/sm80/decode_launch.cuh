// Host side of the split-KV decode: the plan, FwdParams -> DecodeKernelArgs, the split count, the partials'
// workspace and the launches (decode_kernel; then decode_combine_kernel when split and not merged in clusters).
// Instantiated once per head-dim bucket in decode_hd*.cu so that the buckets compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common/kv_cache.h"
#include "cuda/check.h"
#include "cuda/sm80/decode_kernel.cuh"
#include "cuda/sm80/forward_launch.cuh"
#include "cuda/workspace.h"
#include "flashattn/params.h"

namespace flashattn::cuda::sm80 {

// A launch of `grid` (blocks of `threads`, `smem_bytes` of dynamic shared memory) and its attributes: the x
// dimension in clusters of `cluster` CTAs (0: no clusters), and `early`: launched as a programmatic dependent of the
// kernel before it on the stream, for sm_90 binaries only (they wait for that kernel on the device, griddepcontrol).
struct DecodeLaunch {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t config{};

  DecodeLaunch(dim3 grid, int threads, int smem_bytes, cudaStream_t stream, int cluster, bool early) {
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(smem_bytes);
    config.stream = stream;
    config.attrs = attrs;
    if (cluster > 0) {
      cudaLaunchAttribute& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = unsigned(cluster);
      a.val.clusterDim.y = a.val.clusterDim.z = 1;
    }
    if (early) {
      cudaLaunchAttribute& a = attrs[config.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  DecodeLaunch(const DecodeLaunch&) = delete;  // config.attrs points into this object
  DecodeLaunch& operator=(const DecodeLaunch&) = delete;
};

// Whether `kernel` as it runs on `device` was compiled for sm_90 or later: only those binaries have the cluster code
// and wait for the kernel before them (griddepcontrol), so only they may be launched in clusters or as programmatic
// dependents. Asked once per device and kernel (static storage: 0 = not asked, 1 = no, 2 = yes).
template <auto kKernel>
bool sm90_binary(int device) {
  static std::atomic<int> asked[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  const int known = cached ? asked[device].load(std::memory_order_relaxed) : 0;
  if (known != 0) return known == 2;
  cudaFuncAttributes attributes{};
  const bool sm90 = cudaFuncGetAttributes(&attributes, kKernel) == cudaSuccess && attributes.binaryVersion >= 90;
  cudaGetLastError();  // a refusal above is an answer, not an error of the launch that follows
  if (cached) asked[device].store(sm90 ? 2 : 1, std::memory_order_relaxed);
  return sm90;
}

// How many clusters of `splits` CTAs of decode_kernel<T, kD, kPlan> run at once on the current device,
// `device`: 0 where the binary that runs there is older than sm_90. Asked once per device, kernel and cluster size
// (static storage: -1 stored as 0 = not asked).
template <typename T, int kD, DecodePlan kPlan, bool kFp8>
int decode_cluster_capacity(int device, int splits) {
  using Kernel = DecodeKernel<T, kD, kPlan, kFp8>;
  static std::atomic<int> asked[kMaxDevices][kMaxClusterSplits + 1];  // capacity + 1; 0: not asked
  const bool cached = device >= 0 && device < kMaxDevices && splits >= 0 && splits <= kMaxClusterSplits;
  const int known = cached ? asked[device][splits].load(std::memory_order_relaxed) : 0;
  if (known != 0) return known - 1;
  int capacity = 0;
  constexpr auto kernel = decode_kernel<T, kD, kPlan, kFp8>;
  if (sm90_binary<kernel>(device)) {
    const DecodeLaunch launch(dim3(unsigned(splits)), Kernel::kThreads, Kernel::kSmemBytes, nullptr, splits, false);
    if (cudaOccupancyMaxActiveClusters(&capacity, kernel, &launch.config) != cudaSuccess) capacity = 0;
  }
  cudaGetLastError();  // a refusal above is an answer, not an error of the launch that follows
  if (cached) asked[device][splits].store(capacity + 1, std::memory_order_relaxed);
  return capacity;
}

// The device's SMs and how many blocks of decode_kernel<T, kD, kPlan, kFp8> each holds, with the kernel's dynamic
// shared memory allowance set (it must be before a launch or an occupancy query). Asked once per device (static
// storage: 0, "not asked").
struct DecodeOccupancy {
  int sms = 1, per_sm = 1;
};
template <typename T, int kD, DecodePlan kPlan, bool kFp8>
cudaError_t decode_occupancy(int device, DecodeOccupancy* out) {
  using Kernel = DecodeKernel<T, kD, kPlan, kFp8>;
  constexpr auto kernel = decode_kernel<T, kD, kPlan, kFp8>;
  static std::atomic<int> sms_asked[kMaxDevices], per_sm_asked[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  int sms = cached ? sms_asked[device].load(std::memory_order_acquire) : 0;
  int per_sm = cached ? per_sm_asked[device].load(std::memory_order_acquire) : 0;
  if (sms == 0 || per_sm == 0) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kernel::kSmemBytes);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Kernel::kThreads, Kernel::kSmemBytes);
    }
    if (err != cudaSuccess) return err;
    sms = std::max(sms, 1), per_sm = std::max(per_sm, 1);
    if (cached) {
      per_sm_asked[device].store(per_sm, std::memory_order_release);
      sms_asked[device].store(sms, std::memory_order_release);
    }
  }
  out->sms = sms, out->per_sm = per_sm;
  return cudaSuccess;
}

// The shared memory a block of `device` may opt into, asked once per device (static storage: 0, "not asked").
inline cudaError_t decode_block_smem(int device, int* out) {
  static std::atomic<int> asked[kMaxDevices];
  const bool cached = device >= 0 && device < kMaxDevices;
  int bytes = cached ? asked[device].load(std::memory_order_acquire) : 0;
  if (bytes == 0) {
    const cudaError_t err = cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    if (cached) asked[device].store(bytes, std::memory_order_release);
  }
  *out = bytes;
  return cudaSuccess;
}

// Row blocks of one sequence and KV head: its packed query rows (s_q x the GQA group) in blocks of `block_m`.
inline int64_t decode_row_blocks(const FwdParams& p, int block_m) {
  return (p.seqlen_q * (p.heads_q / p.heads_kv) + block_m - 1) / block_m;
}

// One plan's launch; the caller (launch_decode) holds the call's device.
template <typename T, int kD, DecodePlan kPlan, bool kFp8>
Status launch_decode_plan(const FwdParams& p) {
  using Kernel = DecodeKernel<T, kD, kPlan, kFp8>;
  constexpr int kSmem = Kernel::kSmemBytes;
  DecodeKernelArgs a{};
  fill_attention_args(p, &a);
  a.cache = KVCacheLayout::of(p);
  a.rows_total = int(p.is_varlen() ? p.total_q : p.batch * p.seqlen_q);
  a.heads_q = int(p.heads_q);
  auto small = [](int64_t x) { return x >= 0 && x <= INT32_MAX; };
  a.paged_shared32 = p.is_paged() && p.k_batch_stride == p.v_batch_stride && p.k_row_stride == p.v_row_stride &&
                     small(p.k_batch_stride) && small(p.k_row_stride) && small(p.page_size * p.k_row_stride);
  if constexpr (kFp8) {  // float8 K / V tiles arrive in 16-byte copies (tile_io.cuh copy_e4m3_chunk)
    auto rows16 = [](int64_t batch, int64_t row, int64_t head) { return (batch | row | head) % 16 == 0; };
    a.k_vec = a.k_vec && rows16(p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    a.v_vec = a.v_vec && rows16(p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  }
  a.q_descale = p.q_descale, a.k_descale = p.k_descale, a.v_descale = p.v_descale;
  for (int i = 0; i < 2; ++i) {
    a.q_descale_strides[i] = p.q_descale_strides[i];
    a.k_descale_strides[i] = p.k_descale_strides[i];
    a.v_descale_strides[i] = p.v_descale_strides[i];
  }

  auto stream = static_cast<cudaStream_t>(p.stream);
  constexpr auto kernel = decode_kernel<T, kD, kPlan, kFp8>;
  DecodeOccupancy occupancy;
  FA_CUDA_TRY((decode_occupancy<T, kD, kPlan, kFp8>(p.device.index, &occupancy)));
  const int sms = occupancy.sms, per_sm = occupancy.per_sm;

  const int64_t m_blocks = decode_row_blocks(p, Kernel::kBlockM);
  const int64_t tiles = m_blocks * p.heads_kv * p.batch;
  if (p.heads_kv * p.batch > INT32_MAX) return Status::unsupported("cuda decode: batch x heads_kv above 2^31");
  // Clusters of `s` splits merge in the kernel where every cluster of the grid runs at once: a cluster waits for
  // room for all its CTAs, so a grid of more clusters than fit would run a second wave that the plain launch does
  // not (measured on the H200: b = 8, 128k keys, 4 splits 1.27x slower in clusters).
  auto cluster_fits = [&](int s) {
    return s > 1 && s <= kMaxClusterSplits &&
           tiles <= decode_cluster_capacity<T, kD, kPlan, kFp8>(p.device.index, s);
  };
  int splits = p.num_splits;
  if (splits == 0) {
    splits = decode_num_splits(tiles, (p.seqlen_k + kDecodeSplitUnit - 1) / kDecodeSplitUnit, sms, per_sm,
                               p.is_paged(), cluster_fits);
  }
  a.num_splits = splits;
  if (m_blocks > 65535) {
    return Status::unsupported("cuda decode: more than 65535 x " + std::to_string(Kernel::kBlockM) +
                               " packed query rows per sequence");
  }
  const dim3 grid(unsigned(splits), unsigned(m_blocks), unsigned(p.heads_kv * p.batch));

  // sm_90 binaries launch as programmatic dependents: the blocks start while the kernel before them finishes
  // instead of after the launch gap.
  const bool early_launch = sm90_binary<kernel>(p.device.index);
  auto launch = [&](bool clustered) {
    const DecodeLaunch l(grid, Kernel::kThreads, kSmem, stream, clustered ? splits : 0, early_launch);
    return cudaLaunchKernelEx(&l.config, kernel, a);
  };
  if (splits == 1) {
    FA_CUDA_TRY(launch(false));
    return Status::success();
  }
  if (cluster_fits(splits)) {
    a.cluster_combine = true;
    FA_CUDA_TRY(launch(true));
    return Status::success();
  }
  const int64_t slots = int64_t(a.rows_total) * p.heads_q;
  if (slots > INT32_MAX) return Status::unsupported("cuda decode: query rows x heads_q above 2^31 with split keys");
  void* ws = nullptr;
  const size_t bytes = size_t(splits) * size_t(slots) * size_t(p.head_dim_v + 1) * sizeof(float);
  Status st = detail::workspace_alloc(&ws, bytes, p.device.index, stream);
  if (!st.ok()) return st;
  a.partial_o = static_cast<float*>(ws);
  a.partial_lse = a.partial_o + size_t(splits) * size_t(slots) * size_t(p.head_dim_v);
  cudaError_t err = launch(false);
  if (err == cudaSuccess) {
    DecodeCombineArgs c{};
    c.partial_o = a.partial_o, c.partial_lse = a.partial_lse;
    c.o = p.o, c.lse = p.lse;
    c.o_batch_stride = p.o_batch_stride, c.o_row_stride = p.o_row_stride, c.o_head_stride = p.o_head_stride;
    c.lse_batch_stride = p.lse_batch_stride, c.lse_head_stride = p.lse_head_stride;
    c.cu_seqlens_q = p.cu_seqlens_q;
    c.seqlen_q = a.seqlen_q, c.rows_total = a.rows_total, c.batch = int(p.batch);
    c.heads_q = a.heads_q, c.head_dim_v = a.head_dim_v, c.num_splits = splits;
    static_assert(kD % 32 == 0, "whole columns per lane in the combine");
    constexpr auto combine = decode_combine_kernel<T, kD / 32>;
    // Programmatic dependent launch (sm_90 binaries: they wait for the decode grid on the device): the combine's
    // blocks start while the decode grid finishes, instead of the launch gap after it. Only where the combine has
    // at most one block per SM. Measured on an H100 (bench/results/decode.md, 2026-12-06): b = 1 (32 blocks),
    // 4k-16k keys, dense and paged, 0.2-0.8 us faster with it; b = 8 (256 blocks) 0.5-1.7 us slower (1k keys: 16.0
    // against 14.3 us). Not profiled; a guess: blocks started early fill whatever SMs have room then, too few of them
    // for a large grid.
    const bool early = slots <= sms && sm90_binary<combine>(p.device.index);
    const DecodeLaunch l(dim3(unsigned(slots)), kCombineWarps * 32, 0, stream, 0, early);  // a block per (row, head)
    err = cudaLaunchKernelEx(&l.config, combine, c);
  }
  st = detail::workspace_free(ws, stream);
  if (err != cudaSuccess) return detail::cuda_status(err, "decode kernel launch");
  return st;
}

// The row plan (decode_config.h): one m16 tile when every packed row of a sequence fits it. Taller rows run
// 64-row blocks once the key rows the 16-row plan would read (batch x heads_kv x capacity, once per 16 packed
// rows) pass a threshold; below it that plan's more, shorter blocks finish first. Measured on the H200 at s_q 16,
// GQA 4 (four 16-row blocks): dense caches cross between 2^19 and 2^21 rows read, paged ones between 2^16 and
// 2^18 (their loads are dearer to repeat); above, the 64-row plan reads up to 2x faster (bench/results/decode.md).
inline bool decode_tall_rows(const FwdParams& p) {
  const int64_t packed_rows = p.seqlen_q * (p.heads_q / p.heads_kv);
  if (packed_rows <= kDecodeRowsShort) return false;
  const int64_t short_blocks = (packed_rows + kDecodeRowsShort - 1) / kDecodeRowsShort;
  const double rows_read = double(p.batch) * double(p.heads_kv) * double(p.seqlen_k) * double(short_blocks);
  return rows_read >= double(p.is_paged() ? kDecodeTallPagedRowsRead : kDecodeTallRowsRead);
}

// T: the output's type (and, unless kFp8, the inputs'); kFp8: float8_e4m3fn Q, K, V. The 16-row plans
// (decode_config.h): rows16_wide where the rows16 grid would not fill the GPU without splitting the keys (the
// split heuristic's own test, decode_num_splits) and a block may hold its shared memory, else rows16_wide_lean
// where that fits, rows16 otherwise. smem_limit: the shared memory per block those plans may take; 0: the device's
// opt-in limit (tests pass an A100's to run the lean plan on a larger GPU).
template <typename T, int kD, bool kFp8>
Status launch_decode(const FwdParams& p, int smem_limit) {
  detail::DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  if (decode_tall_rows(p)) return launch_decode_plan<T, kD, DecodePlan::rows64, kFp8>(p);
  if constexpr (kD <= kDecodeWideMaxBucket) {
    DecodeOccupancy narrow;
    FA_CUDA_TRY((decode_occupancy<T, kD, DecodePlan::rows16, kFp8>(p.device.index, &narrow)));
    const int64_t tiles = decode_row_blocks(p, kDecodeRowsShort) * p.heads_kv * p.batch;
    if (decode_grid_below_gpu(tiles, narrow.sms, narrow.per_sm)) {
      int block_smem = smem_limit;
      if (block_smem <= 0) FA_CUDA_TRY(decode_block_smem(p.device.index, &block_smem));
      if (DecodeKernel<T, kD, DecodePlan::rows16_wide, kFp8>::kSmemBytes <= block_smem) {
        return launch_decode_plan<T, kD, DecodePlan::rows16_wide, kFp8>(p);
      }
      if constexpr (decode_smem_bytes(kD, DecodePlan::rows16_wide) > kDecodeLeanSmemBytes) {
        if (DecodeKernel<T, kD, DecodePlan::rows16_wide_lean, kFp8>::kSmemBytes <= block_smem) {
          return launch_decode_plan<T, kD, DecodePlan::rows16_wide_lean, kFp8>(p);
        }
      }
    }
  }
  return launch_decode_plan<T, kD, DecodePlan::rows16, kFp8>(p);
}

}  // namespace flashattn::cuda::sm80
