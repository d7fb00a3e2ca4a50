// sm_90a test kernels, one per primitive of src/cuda/sm90/primitives_sm90.cuh (see sm90_primitive_kernels.h).
// Built with -gencode=arch=compute_90a,code=sm_90a only. Each kernel is a plain single-block program whose
// result the host compares with a reference computed on the CPU. Also a comparison kernel for the forward's
// stress test (count_differing_words).
#include "sm90_primitive_kernels.h"

#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/warpgroup.h"

namespace flashattn::test::sm90 {
namespace {

using namespace flashattn::cuda;
using namespace flashattn::cuda::sm90;

cudaError_t finish(cudaError_t launch) {
  if (launch != cudaSuccess) return launch;
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

// Copies a row-major [rows x cols] matrix of 16-bit values into a swizzled shared tile (generic proxy), then
// fences so that wgmma (async proxy) sees the stores after the next barrier.
__device__ void stage_swizzled(uint8_t* tile, const uint16_t* src, int rows, int cols) {
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int r = i / cols, c = i % cols;
    *reinterpret_cast<uint16_t*>(tile + swizzled_offset(r, c, rows)) = src[i];
  }
  fence_async_shared();
}

// Thread t's (row, col) of accumulator element 4j + e (layout in primitives_sm90.cuh).
__device__ void accumulator_coord(int j, int e, int* row, int* col) {
  const int t = threadIdx.x % kWarpgroupThreads;
  const int warp = t / 32, g = (t % 32) / 4, q = t % 4;
  *row = 16 * warp + g + ((e & 2) ? 8 : 0);
  *col = 8 * j + 2 * q + (e & 1);
}

template <int kRegs>
__device__ void store_accumulator(const float (&d)[kRegs], float* c, int ldc) {
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int r, col;
      accumulator_coord(j, e, &r, &col);
      c[r * ldc + col] = d[4 * j + e];
    }
}

// ---- TMA + swizzle ----
__global__ void tma_dump_kernel(const __grid_constant__ CUtensorMap map, int col0, int row0, int box_rows, int panels,
                                uint8_t* dump) {
  extern __shared__ uint8_t raw[];
  uint8_t* tile = align_to_swizzle_atom(raw);
  __shared__ uint64_t bar;
  const int panel_bytes = box_rows * kSwizzleBytes;
  if (threadIdx.x == 0) {
    mbarrier_init(&bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, uint32_t(panels * panel_bytes));
    for (int p = 0; p < panels; ++p) tma_load_4d(tile + p * panel_bytes, &map, col0 + p * kPanelCols, row0, 0, 0, &bar);
  }
  mbarrier_wait(&bar, 0);
  for (int i = threadIdx.x; i < panels * panel_bytes; i += blockDim.x) dump[i] = tile[i];
}

// ---- wgmma, both operands in shared memory ----
template <typename T, int N, int K>
__global__ void wgmma_ss_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  extern __shared__ uint8_t raw[];
  uint8_t* sa = align_to_swizzle_atom(raw);
  uint8_t* sb = sa + kWgmmaRows * K * 2;
  stage_swizzled(sa, a, kWgmmaRows, K);
  stage_swizzled(sb, b, N, K);
  __syncthreads();
  const uint32_t a_addr = smem_address(sa), b_addr = smem_address(sb);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / kWgmmaK; ++kk) {
    // k-step kk: panel kk / 4, then 32 bytes per step inside the 128-byte row.
    const uint32_t step = (kk % 4) * kWgmmaK * 2;
    const uint64_t da = make_desc_k_major(a_addr + (kk / 4) * kWgmmaRows * kSwizzleBytes + step);
    const uint64_t db = make_desc_k_major(b_addr + (kk / 4) * N * kSwizzleBytes + step);
    wgmma_ss<T, N, 0>(d, da, db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(d);
  store_accumulator(d, c, N);
}

// ---- wgmma, A from registers, B N-major in shared memory ----
__device__ uint32_t load_pair(const uint16_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 16); }

template <typename T, int N, int K>
__global__ void wgmma_rs_kernel(const uint16_t* a, const uint16_t* b, float* c) {
  extern __shared__ uint8_t raw[];
  uint8_t* sb = align_to_swizzle_atom(raw);
  stage_swizzled(sb, b, K, N);  // rows = K, columns = N: the N-major layout
  __syncthreads();
  const int t = threadIdx.x, warp = t / 32, g = (t % 32) / 4, q = t % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  uint32_t frag[K / kWgmmaK][4];
#pragma unroll
  for (int kk = 0; kk < K / kWgmmaK; ++kk) {
    const int c0 = kWgmmaK * kk + 2 * q;
    frag[kk][0] = load_pair(a + r0 * K + c0);
    frag[kk][1] = load_pair(a + r1 * K + c0);
    frag[kk][2] = load_pair(a + r0 * K + c0 + 8);
    frag[kk][3] = load_pair(a + r1 * K + c0 + 8);
  }
  const uint32_t b_addr = smem_address(sb);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / kWgmmaK; ++kk) {
    // 16 K-rows of 128 bytes per step; the next 64 columns of N sit one panel (K rows) further.
    const uint64_t db = make_desc_mn_major(b_addr + kk * kWgmmaK * kSwizzleBytes, K * kSwizzleBytes);
    wgmma_rs<T, N, 1>(d, frag[kk], db, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(d);
  store_accumulator(d, c, N);
}

// ---- S = Q Kᵀ, then O = S V with S converted in registers ----
template <typename T, int N, int D>
__global__ void wgmma_chain_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o) {
  extern __shared__ uint8_t raw[];
  uint8_t* sq = align_to_swizzle_atom(raw);
  uint8_t* sk = sq + kWgmmaRows * D * 2;
  uint8_t* sv = sk + N * D * 2;
  stage_swizzled(sq, q, kWgmmaRows, D);
  stage_swizzled(sk, k, N, D);
  stage_swizzled(sv, v, N, D);
  __syncthreads();
  float s[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / kWgmmaK; ++kk) {
    const uint32_t step = (kk % 4) * kWgmmaK * 2;
    wgmma_ss<T, N, 0>(s, make_desc_k_major(smem_address(sq) + (kk / 4) * kWgmmaRows * kSwizzleBytes + step),
                      make_desc_k_major(smem_address(sk) + (kk / 4) * N * kSwizzleBytes + step), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(s);
  float acc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.f;
  // Every fragment is converted before the fence: a register write between two wgmmas would make the
  // compiler insert a fence there and serialise them.
  uint32_t frag[N / kWgmmaK][4];
#pragma unroll
  for (int kk = 0; kk < N / kWgmmaK; ++kk) accumulator_to_a_fragment<T>(frag[kk], s, kk);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < N / kWgmmaK; ++kk) {
    wgmma_rs<T, D, 1>(acc, frag[kk], make_desc_mn_major(smem_address(sv) + kk * kWgmmaK * kSwizzleBytes, N * kSwizzleBytes),
                      kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(acc);
  store_accumulator(acc, o, D);
}

// ---- warp-specialised TMA ring with setmaxnreg ----
constexpr int kRingStages = 2;
constexpr int kRingRows = 64;
constexpr int kRingTileBytes = kRingRows * kSwizzleBytes;
constexpr int kRingConsumerWarps = 8;
constexpr int kRingThreads = 3 * kWarpgroupThreads;

__global__ void __launch_bounds__(kRingThreads, 1)
    tma_ring_kernel(const __grid_constant__ CUtensorMap map, int tiles, uint16_t* out) {
  extern __shared__ uint8_t raw[];
  uint8_t* ring = align_to_swizzle_atom(raw);
  __shared__ uint64_t full[kRingStages], empty[kRingStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRingStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kRingConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / kWarpgroupThreads;
  if (wg == 0) {
    setmaxnreg_decrease<24>();
    if (threadIdx.x == 0) {
      RingPosition<kRingStages> pos;
      for (int t = 0; t < tiles; ++t) {
        mbarrier_wait(&empty[pos.index], pos.phase ^ 1u);
        mbarrier_arrive_expect_tx(&full[pos.index], kRingTileBytes);
        tma_load_4d(ring + pos.index * kRingTileBytes, &map, 0, t * kRingRows, 0, 0, &full[pos.index]);
        pos.advance();
      }
    }
  } else {
    setmaxnreg_increase<240>();
    const int ct = threadIdx.x - kWarpgroupThreads;  // 0..255 across both consumer warpgroups
    RingPosition<kRingStages> pos;
    for (int t = 0; t < tiles; ++t) {
      mbarrier_wait(&full[pos.index], pos.phase);
      const uint8_t* tile = ring + pos.index * kRingTileBytes;
      for (int i = ct; i < kRingRows * kPanelCols; i += 2 * kWarpgroupThreads) {
        const int r = i / kPanelCols, c = i % kPanelCols;
        out[(size_t(t) * kRingRows + r) * kPanelCols + c] =
            *reinterpret_cast<const uint16_t*>(tile + swizzled_offset(r, c, kRingRows));
      }
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbarrier_arrive(&empty[pos.index]);
      pos.advance();
    }
  }
}

template <typename T, int N, int K>
cudaError_t launch_ss(const uint16_t* a, const uint16_t* b, float* c) {
  const int smem = (kWgmmaRows + N) * K * 2 + kSwizzleAtomBytes;
  cudaError_t e = cudaFuncSetAttribute(wgmma_ss_kernel<T, N, K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  wgmma_ss_kernel<T, N, K><<<1, kWarpgroupThreads, smem>>>(a, b, c);
  return finish(cudaSuccess);
}

template <typename T, int N, int K>
cudaError_t launch_rs(const uint16_t* a, const uint16_t* b, float* c) {
  // Whole panels of 64 columns: at N = 96 the product reads half of the second panel's rows.
  const int smem = K * ((N + kPanelCols - 1) / kPanelCols) * kSwizzleBytes + kSwizzleAtomBytes;
  cudaError_t e = cudaFuncSetAttribute(wgmma_rs_kernel<T, N, K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  wgmma_rs_kernel<T, N, K><<<1, kWarpgroupThreads, smem>>>(a, b, c);
  return finish(cudaSuccess);
}

template <typename T, int N, int D>
cudaError_t launch_chain(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o) {
  const int smem = (kWgmmaRows + 2 * N) * D * 2 + kSwizzleAtomBytes;
  cudaError_t e =
      cudaFuncSetAttribute(wgmma_chain_kernel<T, N, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  wgmma_chain_kernel<T, N, D><<<1, kWarpgroupThreads, smem>>>(q, k, v, o);
  return finish(cudaSuccess);
}

// ---- thread-block clusters: TMA multicast, remote stores and arrivals ----
// A cluster of two CTAs. Each loads its half of a [2 * half_rows x 64] box (rows [rank * half_rows, ...)) into the
// same offset of both CTAs, whose barrier expects the whole tile; each then dumps its tile to dump[rank]. Rank 0
// also posts `token` into rank 1's shared memory and arrives on rank 1's barrier; rank 1 echoes it to *echo and
// arrives back on rank 0's, which rank 0 waits for before both leave through the cluster barrier.
__global__ void cluster_multicast_kernel(const __grid_constant__ CUtensorMap map, int half_rows, uint32_t token,
                                         uint8_t* dump, uint32_t* echo) {
  extern __shared__ uint8_t raw[];
  uint8_t* tile = align_to_swizzle_atom(raw);
  __shared__ uint64_t full, posted, acked;
  __shared__ uint32_t slot;
  const uint32_t rank = cluster_cta_rank();
  const int tile_bytes = 2 * half_rows * kSwizzleBytes;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    mbarrier_init(&posted, 1);
    mbarrier_init(&acked, 1);
    mbarrier_init_fence();
  }
  cluster_sync();  // both CTAs' barriers exist before either's loads or arrivals reach them
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, uint32_t(tile_bytes));
    tma_load_4d_multicast(tile + rank * half_rows * kSwizzleBytes, &map, 0, int(rank) * half_rows, 0, 0, &full,
                          uint16_t(0x3));
    if (rank == 0) {
      st_shared_cluster(cluster_shared_address(&slot, 1), token);
      mbarrier_arrive_cluster(cluster_shared_address(&posted, 1));
      mbarrier_wait_cluster(&acked, 0);
    } else {
      mbarrier_wait_cluster(&posted, 0);
      *echo = slot;
      mbarrier_arrive_cluster(cluster_shared_address(&acked, 0));
    }
  }
  mbarrier_wait(&full, 0);
  for (int i = threadIdx.x; i < tile_bytes; i += blockDim.x) dump[rank * tile_bytes + i] = tile[i];
  cluster_sync();  // no CTA leaves while the other may still write into it or arrive on its barriers
}

__global__ void count_differing_words_kernel(const uint32_t* a, const uint32_t* b, size_t words, unsigned* count) {
  unsigned differ = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    differ += a[i] != b[i];
  if (differ) atomicAdd(count, differ);
}

}  // namespace

cudaError_t count_differing_words(const void* a, const void* b, size_t bytes, unsigned* count) {
  constexpr int kThreads = 256, kBlocks = 1024;
  count_differing_words_kernel<<<kBlocks, kThreads>>>(static_cast<const uint32_t*>(a),
                                                      static_cast<const uint32_t*>(b), bytes / 4, count);
  return cudaGetLastError();
}

cudaError_t tma_load_and_dump(const CUtensorMap& map, int col0, int row0, int box_rows, int panels, uint8_t* dump) {
  const int smem = panels * box_rows * kSwizzleBytes + kSwizzleAtomBytes;
  cudaError_t e = cudaFuncSetAttribute(tma_dump_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  tma_dump_kernel<<<1, kWarpgroupThreads, smem>>>(map, col0, row0, box_rows, panels, dump);
  return finish(cudaSuccess);
}

cudaError_t cluster_multicast(const CUtensorMap& map, int half_rows, uint32_t token, uint8_t* dump, uint32_t* echo) {
  const int smem = 2 * half_rows * kSwizzleBytes + kSwizzleAtomBytes;
  cudaError_t e = cudaFuncSetAttribute(cluster_multicast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.gridDim = dim3(2);
  config.blockDim = dim3(kWarpgroupThreads);
  config.dynamicSmemBytes = smem;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return finish(cudaLaunchKernelEx(&config, cluster_multicast_kernel, map, half_rows, token, dump, echo));
}

// The shapes the forward kernel uses (N = 64/128/256; K = 64/128), in both 16-bit types.
cudaError_t wgmma_ss_product(bool bf16, int n, int k, const uint16_t* a, const uint16_t* b, float* c) {
  if (bf16 && n == 64 && k == 64) return launch_ss<__nv_bfloat16, 64, 64>(a, b, c);
  if (bf16 && n == 128 && k == 128) return launch_ss<__nv_bfloat16, 128, 128>(a, b, c);
  if (bf16 && n == 256 && k == 64) return launch_ss<__nv_bfloat16, 256, 64>(a, b, c);
  if (!bf16 && n == 128 && k == 128) return launch_ss<__half, 128, 128>(a, b, c);
  return cudaErrorInvalidValue;
}

cudaError_t wgmma_rs_product(bool bf16, int n, int k, const uint16_t* a, const uint16_t* b, float* c) {
  if (bf16 && n == 64 && k == 128) return launch_rs<__nv_bfloat16, 64, 128>(a, b, c);
  if (bf16 && n == 128 && k == 64) return launch_rs<__nv_bfloat16, 128, 64>(a, b, c);
  if (bf16 && n == 96 && k == 64) return launch_rs<__nv_bfloat16, 96, 64>(a, b, c);
  if (!bf16 && n == 96 && k == 128) return launch_rs<__half, 96, 128>(a, b, c);
  if (bf16 && n == 256 && k == 128) return launch_rs<__nv_bfloat16, 256, 128>(a, b, c);
  if (!bf16 && n == 128 && k == 128) return launch_rs<__half, 128, 128>(a, b, c);
  return cudaErrorInvalidValue;
}

cudaError_t wgmma_chain(bool bf16, int n, int d, const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o) {
  if (bf16 && n == 128 && d == 128) return launch_chain<__nv_bfloat16, 128, 128>(q, k, v, o);
  if (bf16 && n == 64 && d == 256) return launch_chain<__nv_bfloat16, 64, 256>(q, k, v, o);
  if (!bf16 && n == 128 && d == 64) return launch_chain<__half, 128, 64>(q, k, v, o);
  return cudaErrorInvalidValue;
}

cudaError_t tma_ring_copy(const CUtensorMap& map, int tiles, uint16_t* out) {
  const int smem = kRingStages * kRingTileBytes + kSwizzleAtomBytes;
  cudaError_t e = cudaFuncSetAttribute(tma_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  tma_ring_kernel<<<1, kRingThreads, smem>>>(map, tiles, out);
  return finish(cudaSuccess);
}

__global__ void quad_transpose_kernel(const uint32_t* in, uint32_t* out) {
  uint32_t w[4];
  for (int i = 0; i < 4; ++i) w[i] = in[4 * threadIdx.x + i];
  quad_transpose(w, int(threadIdx.x % 4));
  for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = w[i];
}

cudaError_t quad_transpose_words(const uint32_t* in, uint32_t* out) {
  quad_transpose_kernel<<<1, 32>>>(in, out);
  return finish(cudaSuccess);
}

// CTA c's parts: element i of each is c + 1 + i % 7.
__global__ void turn_ordered_tiles_kernel(int tiles, float* sums, int* turns) {
  constexpr int kFloats = kTurnTestParts * kTurnTestPartFloats;
  __shared__ alignas(16) float parts[kFloats];
  for (int i = int(threadIdx.x); i < kFloats; i += int(blockDim.x))
    parts[i] = float(int(blockIdx.x) + 1 + i % kTurnTestPartFloats % 7);
  fence_async_shared();
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int turn = int(blockIdx.x);
  for (int t = 0; t < tiles; ++t) {
    float* tile = sums + size_t(t) * kFloats;
    take_bulk_turn(turns + t, turn);
    for (int p = 0; p < kTurnTestParts; ++p) {
      float* dst = tile + p * kTurnTestPartFloats;
      const float* src = parts + p * kTurnTestPartFloats;
      if (turn == 0)
        bulk_store_f32(dst, src, kTurnTestPartFloats * 4);
      else
        bulk_reduce_add_f32(dst, src, kTurnTestPartFloats * 4);
      bulk_commit();
    }
    pass_bulk_turn(turns + t);
  }
}

cudaError_t turn_ordered_tiles(int ctas, int tiles, float* sums, int* turns) {
  turn_ordered_tiles_kernel<<<ctas, 128>>>(tiles, sums, turns);
  return finish(cudaSuccess);
}

int descriptor_advance_mismatches(uint32_t* first_base, uint32_t* first_bytes) {
  constexpr uint32_t kWindowBytes = 227 * 1024, kMaxStep = 64 * 1024, kAddressLimit = 1u << 18;
  // MN-major leading offsets in use (V panels of 80-, 128- and 176-key tiles).
  constexpr uint32_t kPanelBytes[] = {80 * kSwizzleBytes, 128 * kSwizzleBytes, 176 * kSwizzleBytes};
  int mismatches = 0;
  for (uint32_t base = 0; base < kWindowBytes; base += kSwizzleAtomBytes)
    for (uint32_t bytes = 0; bytes <= kMaxStep && base + bytes < kAddressLimit; bytes += 16) {
      bool same = desc_advance(make_desc_k_major(base), bytes) == make_desc_k_major(base + bytes);
      for (uint32_t panel : kPanelBytes)
        same = same && desc_advance(make_desc_mn_major(base, panel), bytes) == make_desc_mn_major(base + bytes, panel);
      if (!same && mismatches++ == 0) *first_base = base, *first_bytes = bytes;
    }
  return mismatches;
}

}  // namespace flashattn::test::sm90
