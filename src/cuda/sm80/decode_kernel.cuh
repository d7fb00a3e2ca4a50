// Split-KV decode: attention of a few query rows per sequence over a dense or paged KV cache, on mma.sync.
// Runs on sm80 and later (the cuda_sm80 and cuda_sm90 backends both launch it for KV-cache calls).
//
// What it computes: one thread block takes one (split, packed-row block, KV head, batch entry). Packed rows are
// the (query row i, query head of the KV group) pairs r = i * group + g, so that the query heads sharing a KV
// head read its K/V once (FA2's "seqlen_q x ngroups" view, done in the kernel for every s_q). The split takes an
// equal share of the key blocks the rows can see; with one split the block writes O and LSE itself, otherwise it
// writes its normalised partial O and LSE (fp32) for decode_combine_kernel.
//
// Warp roles: none. All threads issue the cp.async copies; each warp computes S = Q Kᵀ and O += P V for its
// block_n / warps keys of every tile with its own online softmax, and the warps merge (max, sum, O) once at the
// end through shared memory.
//
// Shared memory (decode_config.h): Q tile (block_m x D) + stages x (K + V tiles, block_n x D each), swizzled
// (tile_io.cuh); the merge reuses the K/V buffers. K/V rows come from KVCacheLayout's addressing (any page size,
// pages in any order; rows of a page out of range read as zeros), by the cheapest of three loaders (load_kv).
//
// Preconditions (checked by the launcher, decode.cu): fp16 or bf16; head dims <= D; 2-byte aligned pointers;
// `vec` flags only for 16-byte aligned tensors with strides and head dims that are multiples of 8 elements;
// capacity and packed rows below 2^31 - block_n.
#pragma once

#include <cstdint>

#include "common/alibi.h"
#include "common/kv_cache.h"
#include "common/mask.h"
#include "cuda/primitives.cuh"
#include "cuda/sm80/decode_config.h"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/softmax.cuh"
#include "cuda/sm80/tile_io.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace flashattn::cuda::sm80 {

struct DecodeKernelArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;           // null: not written (single split)
  float* partial_o;     // [splits, rows_total, heads_q, head_dim_v] fp32 (splits > 1)
  float* partial_lse;   // [splits, rows_total, heads_q]
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;  // null: padded queries
  KVCacheLayout cache;
  int seqlen_q;  // padded: every sequence's; varlen: the maximum
  int rows_total;  // batch x seqlen_q, or total_q: the partials' row count
  int heads_q, head_group;
  int head_dim, head_dim_v;
  int num_splits;
  bool causal;
  int64_t window_left, window_right;
  float scale_log2, unit_scale, softcap_pre;  // as in ForwardKernelArgs
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  bool q_vec, k_vec, v_vec, o_vec;
};

// One 16-byte chunk (8 elements) of a tile row: from src + col, or zeros when src is null; columns past
// cols_valid read as zeros. `fallback` is any valid global address: a zero-filled chunk passes it to cp.async,
// which does not read it. The slow path (not 16-byte aligned) gathers element by element.
template <typename T>
__device__ __forceinline__ void copy_chunk(T* dst, const T* src, const T* fallback, int col, int cols_valid,
                                           bool vec) {
  const bool in = col < cols_valid && src != nullptr;
  if (vec) {
    cp_async_16(dst, in ? src + col : fallback, in);
    return;
  }
  *reinterpret_cast<uint4*>(dst) = gather_chunk((in ? src : fallback) + col, col, cols_valid, in);
}

// Copies kRows rows x kD columns into the swizzled tile `s`; row r comes from row_ptr(r) (null: zeros).
// kThreads threads (thread t = threadIdx.x % kThreads) copy rows first_row .. first_row + kRows - 1.
template <int kRows, int kD, int kThreads, typename T, typename RowPtr>
__device__ __forceinline__ void gather_tile(T* s, RowPtr row_ptr, const T* fallback, int cols_valid, bool vec,
                                            int first_row = 0) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  const int t = int(threadIdx.x) % kThreads;
  const int row0 = t / kChunksPerRow;
  const int col = (t % kChunksPerRow) * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const int row = first_row + row0 + i * kRowsPerPass;
    copy_chunk(s + swizzle<kD>(row, col), row_ptr(row), fallback, col, cols_valid, vec);
  }
}

// K and V tiles of a paged cache whose page size is a power of two (1 << page_shift) and a multiple of the rows
// one pass copies, with the tile's first row (first_row, an absolute cache row) on a pass boundary: every pass
// lies inside one page, so each pass costs one block-table read that all threads share, issued for all passes
// before the first copy. Rows from rows_valid on, and rows of pages out of range, read as zeros.
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_paged_kv_tiles(T* sk, T* sv, const T* k_base, const T* v_base,
                                                    int64_t k_page_stride, int64_t k_row_stride,
                                                    int64_t v_page_stride, int64_t v_row_stride,
                                                    const int32_t* table_row, int64_t num_pages, int page_shift,
                                                    int first_row, int rows_valid, int k_cols, int v_cols, bool k_vec,
                                                    bool v_vec) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  const int row0 = int(threadIdx.x) / kChunksPerRow;
  const int col = (int(threadIdx.x) % kChunksPerRow) * 8;
  const int in_page_mask = (1 << page_shift) - 1;
  int page[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    page[i] = i * kRowsPerPass < rows_valid ? table_row[(first_row + i * kRowsPerPass) >> page_shift] : -1;
  }
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = row0 + i * kRowsPerPass;
    const bool in = row < rows_valid && page[i] >= 0 && page[i] < num_pages;
    const int64_t in_page = ((first_row + i * kRowsPerPass) & in_page_mask) + row0;
    const T* k_src = in ? k_base + int64_t(page[i]) * k_page_stride + in_page * k_row_stride : nullptr;
    const T* v_src = in ? v_base + int64_t(page[i]) * v_page_stride + in_page * v_row_stride : nullptr;
    copy_chunk(sk + swizzle<kD>(row, col), k_src, k_base, col, k_cols, k_vec);
    copy_chunk(sv + swizzle<kD>(row, col), v_src, v_base, col, v_cols, v_vec);
  }
}

// K and V tiles of the same rows: row r's sources come from kv_rows(r, &k, &v) (null: zeros). Every row's
// addresses are computed before the first copy is issued, so that the block-table reads of a paged cache overlap
// one another instead of each delaying its row's copy.
template <int kRows, int kD, int kThreads, typename T, typename RowPtrs>
__device__ __forceinline__ void gather_kv_tiles(T* sk, T* sv, RowPtrs kv_rows, const T* k_fallback,
                                                const T* v_fallback, int k_cols, int v_cols, bool k_vec, bool v_vec) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  const int row0 = int(threadIdx.x) / kChunksPerRow;
  const T* k_src[kPasses];
  const T* v_src[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) kv_rows(row0 + i * kRowsPerPass, &k_src[i], &v_src[i]);
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = row0 + i * kRowsPerPass;
    gather_tile<1, kD, kChunksPerRow>(sk, [&](int) { return k_src[i]; }, k_fallback, k_cols, k_vec, row);
    gather_tile<1, kD, kChunksPerRow>(sv, [&](int) { return v_src[i]; }, v_fallback, v_cols, v_vec, row);
  }
}

template <typename T, int kD>
struct DecodeKernel {
  static constexpr DecodeTile kTile = decode_tile(kD);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kStages = kTile.stages;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpKeys = kBlockN / kWarps;
  static constexpr int kNTiles = kWarpKeys / 8;  // n-tiles of the warp's S
  static constexpr int kDTiles = kD / 8;
  static constexpr int kSmemBytes = decode_smem_bytes(kD);
  static_assert(kBlockM == 16, "one m16 tile of packed rows, shared by every warp");
  static_assert(kWarpKeys % 16 == 0, "whole k16 steps of P per warp");

  __device__ static void run(const DecodeKernelArgs& a, unsigned char* smem) {
    T* sQ = reinterpret_cast<T*>(smem);
    T* sK = sQ + kBlockM * kD;
    T* sV = sK + kStages * kBlockN * kD;
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int split = int(blockIdx.x), m_block = int(blockIdx.y);
    const int hk = int(blockIdx.z) % (a.heads_q / a.head_group), b = int(blockIdx.z) / (a.heads_q / a.head_group);

    int64_t start_q = 0;
    int len_q = a.seqlen_q;
    if (a.cu_seqlens_q != nullptr) {
      // Clamped into [0, rows_total] and to seqlen_q rows: the offsets may be unchecked (graph capture).
      start_q = min(max(a.cu_seqlens_q[b], 0), a.rows_total);
      const int end_q = min(max(int(a.cu_seqlens_q[b + 1]), int(start_q)), a.rows_total);
      len_q = min(end_q - int(start_q), a.seqlen_q);
    }
    const int packed_rows = len_q * a.head_group;
    const int r0 = m_block * kBlockM;
    if (r0 >= packed_rows) return;
    const int rows = min(kBlockM, packed_rows - r0);
    const int64_t entry = a.cache.entry(b);
    int64_t key_begin, key_end;
    a.cache.rows(b, &key_begin, &key_end);
    const int len_k = int(key_end - key_begin);

    // Keys the block's query rows see, split into equal runs of whole tiles.
    const MaskSpec mask = MaskSpec::make(len_q, len_k, a.causal, a.window_left, a.window_right);
    const int i_first = r0 / a.head_group, i_last = (r0 + rows - 1) / a.head_group;
    int64_t key_lo, key_hi;
    mask.key_range_for_rows(i_first, i_last + 1, &key_lo, &key_hi);
    const int n_block_min = int(key_lo / kBlockN);
    const int n_block_end = key_hi > key_lo ? int((key_hi + kBlockN - 1) / kBlockN) : n_block_min;
    const int per_split = (n_block_end - n_block_min + a.num_splits - 1) / a.num_splits;
    const int split_begin = min(n_block_end, n_block_min + split * per_split);
    const int split_end = min(n_block_end, split_begin + per_split);
    const int n_iters = split_end - split_begin;

    auto q_row = [&](int r) -> const T* {
      if (r >= rows) return nullptr;
      const int pr = r0 + r, i = pr / a.head_group, h = hk * a.head_group + pr % a.head_group;
      return static_cast<const T*>(a.q) + b * a.q_batch_stride + (start_q + i) * a.q_row_stride + h * a.q_head_stride;
    };
    // Tile it covers keys [n0, n0 + kBlockN) of the sequence, i.e. cache rows key_begin + n0 ... Three ways to
    // load it, chosen once per block: a dense cache is strided rows (load_tile steps one pointer per pass); a
    // paged cache whose passes each fall inside one page reads the block table once per pass; anything else
    // (pages of 1-4 rows, other sizes, a leftpad off the pass grid) computes each row's address.
    constexpr int kRowsPerPass = kThreads / (kD / 8);
    const T* k_base = static_cast<const T*>(a.k) + hk * a.k_head_stride;
    const T* v_base = static_cast<const T*>(a.v) + hk * a.v_head_stride;
    const bool paged = a.cache.paged();
    const int page_size = int(a.cache.page_size);
    const int page_shift = paged && page_size >= kRowsPerPass && (page_size & (page_size - 1)) == 0
                               ? __ffs(page_size) - 1 : -1;
    const bool page_per_pass = page_shift >= 0 && key_begin % kRowsPerPass == 0;
    const int32_t* table_row = paged && entry >= 0 ? a.cache.block_table + entry * a.cache.block_table_stride : nullptr;
    auto load_kv = [&](int it) {
      if (it < n_iters) {
        const int n0 = (split_begin + it) * kBlockN;
        const int stage = it % kStages;
        T* sk = sK + stage * kBlockN * kD;
        T* sv = sV + stage * kBlockN * kD;
        if (!paged) {
          const int64_t row = key_begin + n0;
          load_tile<kBlockN, kD, kThreads>(sk, k_base + entry * a.k_batch_stride + row * a.k_row_stride,
                                           a.k_row_stride, len_k - n0, a.head_dim, a.k_vec);
          load_tile<kBlockN, kD, kThreads>(sv, v_base + entry * a.v_batch_stride + row * a.v_row_stride,
                                           a.v_row_stride, len_k - n0, a.head_dim_v, a.v_vec);
        } else if (page_per_pass) {
          load_paged_kv_tiles<kBlockN, kD, kThreads>(sk, sv, k_base, v_base, a.k_batch_stride, a.k_row_stride,
                                                     a.v_batch_stride, a.v_row_stride, table_row, a.cache.num_pages,
                                                     page_shift, int(key_begin) + n0, len_k - n0, a.head_dim,
                                                     a.head_dim_v, a.k_vec, a.v_vec);
        } else {
          auto kv_rows = [&](int r, const T** k_row, const T** v_row) {
            const int j = n0 + r;
            *k_row = *v_row = nullptr;
            if (j >= len_k) return;
            const int row = int(key_begin) + j;
            const int slot = row / page_size;
            const int64_t page = table_row[slot];
            if (page < 0 || page >= a.cache.num_pages) return;
            const int in_page = row - slot * page_size;
            *k_row = k_base + page * a.k_batch_stride + int64_t(in_page) * a.k_row_stride;
            *v_row = v_base + page * a.v_batch_stride + int64_t(in_page) * a.v_row_stride;
          };
          gather_kv_tiles<kBlockN, kD, kThreads>(sk, sv, kv_rows, k_base, v_base, a.head_dim, a.head_dim_v, a.k_vec,
                                                 a.v_vec);
        }
      }
      cp_async_commit();
    };

    float acc_o[1][kDTiles][4];
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
    OnlineSoftmax<1> softmax;
    softmax.init();
    const int g = lane >> 2, q = lane & 3;
    // ALiBi: the thread's two packed rows have their own query rows and heads, so their own slopes and diagonals
    // (distances count over the sequence's used keys).
    const bool alibi = a.alibi_slopes != nullptr;
    float alibi_slope_u[1][2] = {{0.f, 0.f}};
    int alibi_diag[2] = {0, 0};
    if (alibi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pr = min(r0 + g + 8 * half, packed_rows - 1), h = hk * a.head_group + pr % a.head_group;
        const Alibi32 bias = Alibi32::make(a.alibi_slopes, a.alibi_batch_stride, b, h, len_q, len_k);
        alibi_slope_u[0][half] = bias.slope_in(a.unit_scale);
        alibi_diag[half] = pr / a.head_group + bias.shift - 2 * q;
      }
    }

    gather_tile<kBlockM, kD, kThreads>(sQ, q_row, static_cast<const T*>(a.q), a.head_dim, a.q_vec);
    for (int s = 0; s < kStages - 1; ++s) load_kv(s);  // the first group also carries Q
    for (int it = 0; it < n_iters; ++it) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile it visible to all; every warp is done with the buffer refilled next
      load_kv(it + kStages - 1);
      const int stage = it % kStages;
      const int key0 = (split_begin + it) * kBlockN + warp * kWarpKeys;

      float s[1][kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][nt][e] = 0.f;
      warp_gemm_qk<T, kD, 1, kNTiles>(s, sQ, sK + stage * kBlockN * kD + warp * kWarpKeys * kD, lane);
      if (a.softcap_pre != 0.f) apply_softcap(s, a.softcap_pre);
      if (alibi) {
        const float base[1][2] = {{float(alibi_diag[0] - key0), float(alibi_diag[1] - key0)}};
        apply_alibi_rows(s, alibi_slope_u, base);
      }
      // Per-element masking only where the tile crosses a mask edge or the last key.
      if (key0 + kWarpKeys > len_k || !mask.tile_fully_visible(i_first, i_last + 1, key0, key0 + kWarpKeys)) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = min(r0 + g + 8 * half, packed_rows - 1) / a.head_group;
          int64_t lo, hi;
          mask.key_range(i, &lo, &hi);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t j = key0 + nt * 8 + 2 * q + e;
              if (j < lo || j >= hi) s[0][nt][2 * half + e] = -INFINITY;
            }
          }
        }
      }
      float factor[1][2];
      softmax.update(s, a.scale_log2, factor);
      OnlineSoftmax<1>::rescale(acc_o, factor);
      warp_gemm_pv<T, kD, 1, kNTiles>(acc_o, s, sV + stage * kBlockN * kD + warp * kWarpKeys * kD, lane);
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the K/V buffers: the merge reuses them

    // Merge the warps: each publishes its rows' (max, sum) and unnormalised O; every thread then combines a
    // slice of the block's outputs.
    float* sMerge = reinterpret_cast<float*>(smem);
    float* sMax = sMerge + kWarps * kBlockM * kD;
    float* sSum = sMax + kWarps * kBlockM;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = g + 8 * half;
      const float sum = quad_sum(softmax.row_sum[0][half]);
      if (q == 0) {
        sMax[warp * kBlockM + row] = softmax.row_max[0][half];
        sSum[warp * kBlockM + row] = sum;
      }
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        float* dst = sMerge + (warp * kBlockM + row) * kD + dt * 8 + 2 * q;
        dst[0] = acc_o[0][dt][2 * half];
        dst[1] = acc_o[0][dt][2 * half + 1];
      }
    }
    __syncthreads();

    const bool single = a.num_splits == 1;
    for (int idx = int(threadIdx.x); idx < rows * kD; idx += kThreads) {
      const int row = idx / kD, c = idx % kD;
      if (c >= a.head_dim_v) continue;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, sMax[w * kBlockM + row]);
      const float sub = m == -INFINITY ? 0.f : m * a.scale_log2;
      float sum = 0.f, o = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = fast_exp2(sMax[w * kBlockM + row] * a.scale_log2 - sub);
        sum += sSum[w * kBlockM + row] * f;
        o += sMerge[(w * kBlockM + row) * kD + c] * f;
      }
      const float out = sum > 0.f ? o / sum : 0.f;
      const float lse = sum > 0.f ? m * a.unit_scale + logf(sum) : -INFINITY;
      const int pr = r0 + row, i = pr / a.head_group, h = hk * a.head_group + pr % a.head_group;
      if (single) {
        T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + (start_q + i) * a.o_row_stride + h * a.o_head_stride;
        go[c] = from_float<T>(out);
        if (c == 0 && a.lse != nullptr) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + start_q + i] = lse;
      } else {
        const int64_t prow = (a.cu_seqlens_q != nullptr ? start_q : int64_t(b) * a.seqlen_q) + i;
        const int64_t slot = (int64_t(split) * a.rows_total + prow) * a.heads_q + h;
        a.partial_o[slot * a.head_dim_v + c] = out;
        if (c == 0) a.partial_lse[slot] = lse;
      }
    }
  }
};

template <typename T, int kD>
__global__ void __launch_bounds__(DecodeKernel<T, kD>::kThreads, decode_tile(kD).min_blocks_sm)
    decode_kernel(const __grid_constant__ DecodeKernelArgs args) {
  extern __shared__ __align__(128) unsigned char smem[];
  DecodeKernel<T, kD>::run(args, smem);
}

// Merges the splits' partial outputs: per (packed query row, head) one warp reads every split's LSE, weighs the
// splits by exp(lse_s - lse), lse = log Σ exp(lse_s), and writes O in T and the LSE. A row no split saw gives
// O = 0 and LSE = -inf.
struct DecodeCombineArgs {
  const float* partial_o;
  const float* partial_lse;
  void* o;
  float* lse;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;
  int seqlen_q, rows_total, batch, heads_q, head_dim_v, num_splits;
};

template <typename T>
__global__ void decode_combine_kernel(const __grid_constant__ DecodeCombineArgs a) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);  // (row, head)
  if (item >= int64_t(a.rows_total) * a.heads_q) return;
  const int64_t prow = item / a.heads_q;
  const int h = int(item % a.heads_q);
  // The row's sequence and position: padded rows are b * seqlen_q + i; varlen rows are found by binary search.
  int b, i;
  if (a.cu_seqlens_q == nullptr) {
    b = int(prow / a.seqlen_q);
    i = int(prow % a.seqlen_q);
  } else {
    int lo = 0, hi = a.batch;  // the last b with cu_seqlens_q[b] <= prow
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (a.cu_seqlens_q[mid] <= prow) lo = mid; else hi = mid;
    }
    b = lo;
    i = int(prow - a.cu_seqlens_q[b]);
  }
  const int64_t split_stride = int64_t(a.rows_total) * a.heads_q;
  float m = -INFINITY;
  for (int s = lane; s < a.num_splits; s += 32) m = fmaxf(m, a.partial_lse[s * split_stride + item]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int s = lane; s < a.num_splits; s += 32) sum += expf(a.partial_lse[s * split_stride + item] - m);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float lse = sum > 0.f ? m + logf(sum) : -INFINITY;
  // As in the main kernel: varlen tensors have no batch stride (0) and rows start at cu_seqlens_q[b].
  const int64_t row = (a.cu_seqlens_q == nullptr ? 0 : a.cu_seqlens_q[b]) + i;
  T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + row * a.o_row_stride + h * a.o_head_stride;
  for (int c = lane; c < a.head_dim_v; c += 32) {
    float o = 0.f;
    if (sum > 0.f) {
      for (int s = 0; s < a.num_splits; ++s) {
        const float w = expf(a.partial_lse[s * split_stride + item] - lse);
        if (w > 0.f) o += w * a.partial_o[(s * split_stride + item) * a.head_dim_v + c];
      }
    }
    go[c] = from_float<T>(o);
  }
  if (lane == 0 && a.lse != nullptr) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + row] = lse;
}

}  // namespace flashattn::cuda::sm80
