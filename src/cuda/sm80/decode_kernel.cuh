// Split-KV decode: attention of a few query rows per sequence over a dense or paged KV cache, on mma.sync.
// Runs on sm80 and later (the cuda_sm80 and cuda_sm90 backends both launch it for KV-cache calls).
//
// What it computes: one thread block takes one (split, packed-row block, KV head, batch entry). Packed rows are
// the (query row i, query head of the KV group) pairs r = i * group + g, so that the query heads sharing a KV
// head read its K/V once (FA2's "seqlen_q x ngroups" view, done in the kernel for every s_q). The split takes an
// equal share of the key blocks the rows can see; with one split the block writes O and LSE itself. With up to
// kMaxClusterSplits splits on sm_90+ the splits of a row block are one thread-block cluster and merge their
// partials through distributed shared memory (combine_in_cluster): one launch, no workspace. Otherwise each block
// writes its normalised partial O and LSE (fp32) for decode_combine_kernel.
//
// Warp roles: none. All threads issue the cp.async copies. The warps split the block's rows into m16 tiles and
// each tile's keys (decode_config.h DecodePlan: the 16-row plans have 4 or 8 warps on 16 keys each of one row tile,
// the 64-row plan one warp per row tile on all keys); each warp computes S = Q Kᵀ and O += P V for its rows and keys
// with its own online softmax, and the warps merge (max, sum, O) once at the end through shared memory.
//
// Shared memory (decode_config.h): Q tile (block_m x D) + stages x (K + V tiles, block_n x D each), swizzled
// (tile_io.cuh); the merge reuses the K/V buffers, followed by the block's partial in a cluster combine. K/V
// rows come from KVCacheLayout's addressing (any page size, pages in any order; rows of a page out of range read
// as zeros): strided rows for a dense cache, rows looked up in the block table one tile ahead for a paged one
// (PagedTileRows).
//
// float8_e4m3fn caches (kFp8: Q, K and V e4m3, T the output's 16-bit type): K / V tiles arrive by cp.async (16-byte
// chunks) and stay e4m3 in shared memory (tile_io.cuh e4m3_offset), twice as many in flight as 16-bit ones; each
// lane widens the bytes of its own mma fragments exactly (warp_gemm.cuh warp_gemm_qk_e4m3 / warp_gemm_pv_e4m3),
// Q once on its way in. The products run in float16 whatever T is (one conversion per pair, where bfloat16 would
// take three), with O's columns in the float8 V reads' order until the warps' merge puts them back. The scores are
// scaled by q_descale · k_descale and the output by v_descale (per batch entry and KV head).
//
// Preconditions (checked by the launcher, decode.cu): fp16 or bf16 (or e4m3 with an fp16 / bf16 output); head dims
// <= D; 2-byte aligned pointers (16-bit inputs);
// `vec` flags only for 16-byte aligned tensors with strides and head dims that are multiples of 8 elements (float8
// K / V: strides that are multiples of 16);
// capacity and packed rows below 2^31 - block_n.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/alibi.h"
#include "common/kv_cache.h"
#include "common/mask.h"
#include "cuda/cluster.cuh"
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
  // splits > 1 merged in the kernel: grid.x (the splits) is one cluster; partial_o / partial_lse unused.
  bool cluster_combine;
  bool causal;
  int64_t window_left, window_right;
  int64_t attention_chunk;  // 0: none
  float scale_log2, unit_scale, softcap_pre;  // as in ForwardKernelArgs
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  bool q_vec, k_vec, v_vec, o_vec;
  // Paged K and V with the same page and row strides, each below 2^31 elements, page_size * row stride too: one
  // 32-bit in-page offset and one widening multiply per row serve both (PagedLoad::whole32, with whole rows).
  bool paged_shared32;
  // float8_e4m3fn inputs: fp32 [batch, heads_kv] factors (null = 1), strides {batch, head}.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_strides[2], k_descale_strides[2], v_descale_strides[2];
};

// How a paged tile's rows are addressed, chosen once per block: the page sizes that are not powers of two
// divide; the others shift. whole32: a power-of-two page, K and V with the same small strides (paged_shared32) and
// whole rows (16-byte aligned, head dims of the bucket), the layout of every serving engine's cache: one 32-bit
// in-page offset and one widening multiply address a row of both, and each chunk is one cp.async with no column
// checks. About 16 instructions per row and pass (SASS) against the general modes' 55, which made a paged call
// execute twice the dense call's instructions (ncu, H100, b = 8, 16k keys, pages of 16).
enum class PagedLoad { divide, shift, whole32 };

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
template <int kRows, int kD, int kThreads, typename T, typename S, typename RowPtr>
__device__ __forceinline__ void gather_tile(T* s, RowPtr row_ptr, const S* fallback, int cols_valid, bool vec,
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

// This thread's rows of a paged K/V tile, one per copy pass (its chunks of kChunk columns, as load_tile assigns
// them): the page holding each (-1: none), read from the block table one tile ahead of the copies that use it
// (fetch, then copy the next time), so that the table's latency hides behind a tile of math instead of stalling
// the copies. Only the pages are kept between the two (the rows within them are recomputed): at d 256 a thread
// has 16 passes, and the registers are scarce there.
template <int kRows, int kD, int kThreads, int kChunk>
struct PagedTileRows {
  static constexpr int kChunksPerRow = kD / kChunk;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  int page[kPasses];

  // Cache row of pass i's row: the sequence's key n0 + row0 + i * kRowsPerPass, past its first row key_begin.
  __device__ __forceinline__ static int cache_row(int key_begin, int n0, int i) {
    return key_begin + n0 + int(threadIdx.x) / kChunksPerRow + i * kRowsPerPass;
  }

  // kMode != divide: page_size is 1 << page_shift. table_row null: no rows. The pages are checked where they are
  // used (copy): a check here would wait for the table's reads at once.
  template <PagedLoad kMode>
  __device__ __forceinline__ void fetch(const int32_t* table_row, int key_begin, int n0, int len_k, int page_size,
                                        int page_shift) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = cache_row(key_begin, n0, i);
      page[i] = -1;
      if (table_row != nullptr && row - key_begin < len_k) {
        page[i] = table_row[kMode != PagedLoad::divide ? row >> page_shift : row / page_size];
      }
    }
  }

  // Copies the fetched rows of tile n0 into the swizzled K and V tiles (float8: the e4m3 tiles, tile_io.cuh); rows
  // of no page, or of a page outside [0, num_pages) (num_pages clamped to INT32_MAX), read as zeros.
  template <PagedLoad kMode, typename D, typename S>
  __device__ __forceinline__ void copy(D* sk, D* sv, const S* k_base, const S* v_base, int64_t k_page_stride,
                                       int64_t k_row_stride, int64_t v_page_stride, int64_t v_row_stride,
                                       unsigned num_pages, int key_begin, int n0, int page_size, int k_cols,
                                       int v_cols, bool k_vec, bool v_vec) const {
    const int row0 = int(threadIdx.x) / kChunksPerRow;
    const int col = (int(threadIdx.x) % kChunksPerRow) * kChunk;
    static_assert(kChunk * sizeof(S) == 16, "a chunk is one 16-byte copy");
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int row = cache_row(key_begin, n0, i);
      const int tile_row = row0 + i * kRowsPerPass;
      // K's and V's tiles share the layout: one offset into both.
      const int dst = std::is_same_v<S, uint8_t> ? e4m3_offset<kD>(tile_row, col) : swizzle<kD>(tile_row, col);
      D* k_dst = sk + dst;
      D* v_dst = sv + dst;
      const bool in = unsigned(page[i]) < num_pages;
      if constexpr (kMode == PagedLoad::whole32) {
        // Unsigned 32-bit factors (every one is in [0, 2^31) here): the offset is one IMAD.WIDE.U32. Zero-filled
        // chunks read from the bases (offset 0), which cp.async does not dereference.
        const uint32_t in_page = uint32_t(row & (page_size - 1)) * uint32_t(k_row_stride) + uint32_t(col);
        const uint64_t offset = in ? uint64_t(uint32_t(page[i])) * uint32_t(k_page_stride) + in_page : 0;
        cp_async_16(k_dst, k_base + offset, in);
        cp_async_16(v_dst, v_base + offset, in);
      } else {
        const int64_t in_page =
            kMode == PagedLoad::shift ? row & (page_size - 1) : row - (row / page_size) * page_size;
        const S* k_src = in ? k_base + int64_t(page[i]) * k_page_stride + in_page * k_row_stride : nullptr;
        const S* v_src = in ? v_base + int64_t(page[i]) * v_page_stride + in_page * v_row_stride : nullptr;
        if constexpr (std::is_same_v<S, uint8_t>) {
          copy_e4m3_chunk(k_dst, k_src, k_base, col, k_cols, k_vec);
          copy_e4m3_chunk(v_dst, v_src, v_base, col, v_cols, v_vec);
        } else {
          copy_chunk(k_dst, k_src, k_base, col, k_cols, k_vec);
          copy_chunk(v_dst, v_src, v_base, col, v_cols, v_vec);
        }
      }
    }
  }
};

template <typename T, int kD, DecodePlan kPlan, bool kFp8>
struct DecodeKernel {
  using In = std::conditional_t<kFp8, uint8_t, T>;  // the element type of Q, K and V in global memory
  // The element type of the Q tile and the tensor-core products: float8 widens to float16 exactly in one conversion
  // per pair (to bfloat16 it would take three, through fp32), and P in float16 keeps more bits.
  using Mma = std::conditional_t<kFp8, __half, T>;
  static constexpr DecodeTile kTile = decode_tile(kD, kPlan);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kKeyWarps = kTile.key_warps();
  static constexpr int kStages = kTile.stages;
  // K / V tiles in flight: 16-bit, or e4m3 (half the bytes, so twice as many).
  static constexpr int kLoadStages = kFp8 ? decode_fp8_stages(kD, kPlan) : kStages;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpKeys = kBlockN / kKeyWarps;
  static constexpr int kNTiles = kWarpKeys / 8;  // n-tiles of the warp's S
  static constexpr int kDTiles = kD / 8;
  static constexpr int kSmemBytes = decode_smem_bytes(kD, kPlan);
  static_assert(!kFp8 || kBlockM * kD * 2 + 2 * kLoadStages * kBlockN * kD <= kSmemBytes,
                "the e4m3 tiles fit the 16-bit plan's shared memory");
  static_assert(kBlockM % 16 == 0 && kTile.row_warps() * kKeyWarps == kWarps, "one m16 tile of rows per warp");
  static_assert(kWarpKeys % 16 == 0, "whole k16 steps of P per warp");

  __device__ static void run(const DecodeKernelArgs& a, unsigned char* smem) {
    Mma* sQ = reinterpret_cast<Mma*>(smem);
    In* sK = reinterpret_cast<In*>(sQ + kBlockM * kD);  // kLoadStages K tiles, then as many V tiles
    In* sV = sK + kLoadStages * kBlockN * kD;
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int row_warp = warp / kKeyWarps, key_warp = warp % kKeyWarps;  // the warp's 16 rows, its keys
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

    // Keys the block's query rows see, split into equal runs of whole tiles. The mask in 32 bits, edges and chunk
    // narrowed to the lengths (cuda_decode_supports bounds s_q + s_k): half the registers of a 64-bit one, and a
    // chunk's remainder in 32 bits.
    const MaskSpec32 mask =
        MaskSpec32::make(len_q, len_k, a.causal, int(MaskSpec::narrowest_left(a.window_left, len_k)),
                         int(MaskSpec::narrowest_right(a.window_right, len_q)),
                         int(MaskSpec::narrowest_chunk(a.attention_chunk, len_k)));
    const int i_first = r0 / a.head_group, i_last = (r0 + rows - 1) / a.head_group;
    int key_lo, key_hi;
    mask.key_range_for_rows(i_first, i_last + 1, &key_lo, &key_hi);
    const int n_block_min = int(key_lo / kBlockN);
    const int n_block_end = key_hi > key_lo ? int((key_hi + kBlockN - 1) / kBlockN) : n_block_min;
    const int per_split = (n_block_end - n_block_min + a.num_splits - 1) / a.num_splits;
    const int split_begin = min(n_block_end, n_block_min + split * per_split);
    const int split_end = min(n_block_end, split_begin + per_split);
    const int n_iters = split_end - split_begin;

    auto q_row = [&](int r) -> const In* {
      if (r >= rows) return nullptr;
      const int pr = r0 + r, i = pr / a.head_group, h = hk * a.head_group + pr % a.head_group;
      return static_cast<const In*>(a.q) + b * a.q_batch_stride + (start_q + i) * a.q_row_stride + h * a.q_head_stride;
    };
    // Tile it covers keys [n0, n0 + kBlockN) of the sequence, i.e. cache rows key_begin + n0 ... A dense cache
    // is strided rows (load_tile steps one pointer per pass); a paged cache's rows are looked up in the block
    // table one tile ahead (PagedTileRows).
    const In* k_base = static_cast<const In*>(a.k) + hk * a.k_head_stride;
    const In* v_base = static_cast<const In*>(a.v) + hk * a.v_head_stride;
    // float8: the scores' factor and the output's (this block's batch entry and KV head share them).
    float qk_descale = 1.f, v_descale = 1.f;
    if constexpr (kFp8) {
      auto descale = [&](const float* d, const int64_t* strides) {
        return d != nullptr ? d[b * strides[0] + hk * strides[1]] : 1.f;
      };
      qk_descale = descale(a.q_descale, a.q_descale_strides) * descale(a.k_descale, a.k_descale_strides);
      v_descale = descale(a.v_descale, a.v_descale_strides);
    }
    const bool paged = a.cache.paged();
    const int page_size = int(a.cache.page_size);
    const int page_shift = paged && (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
    const int32_t* table_row = paged && entry >= 0 ? a.cache.block_table + entry * a.cache.block_table_stride : nullptr;
    PagedTileRows<kBlockN, kD, kThreads, kFp8 ? kE4m3Chunk : 8> paged_rows;
    const unsigned num_pages = unsigned(min(a.cache.num_pages, int64_t(INT32_MAX)));
    // Rows the full head dim wide and 16-byte aligned: dense 16-bit tiles before the last whole one copy without
    // per-row checks (load_whole_tile), paged ones without column checks (PagedLoad::whole32).
    const bool whole_rows = a.k_vec && a.v_vec && a.head_dim == kD && a.head_dim_v == kD;
    // One copy of the paged loads per PagedLoad mode, chosen outside the unrolled passes: a runtime choice
    // inside them would compute the division (and both offsets) for every row whatever the mode.
    auto paged_step = [&](auto mode, int it) {
      constexpr PagedLoad kMode = decltype(mode)::value;
      const int n0 = (split_begin + it) * kBlockN;
      if (it >= 0) {
        const int offset = (it % kLoadStages) * kBlockN * kD;
        paged_rows.template copy<kMode>(sK + offset, sV + offset, k_base, v_base, a.k_batch_stride, a.k_row_stride,
                                        a.v_batch_stride, a.v_row_stride, num_pages, int(key_begin), n0, page_size,
                                        a.head_dim, a.head_dim_v, a.k_vec, a.v_vec);
      }
      if (it + 1 < n_iters) {
        paged_rows.template fetch<kMode>(table_row, int(key_begin), n0 + kBlockN, len_k, page_size, page_shift);
      }
    };
    // it = -1: only the first tile's pages.
    auto paged_load = [&](int it) {
      using Mode = PagedLoad;
      if (page_shift < 0) {
        paged_step(std::integral_constant<Mode, Mode::divide>{}, it);
      } else if (a.paged_shared32 && whole_rows) {
        paged_step(std::integral_constant<Mode, Mode::whole32>{}, it);
      } else {
        paged_step(std::integral_constant<Mode, Mode::shift>{}, it);
      }
    };
    if (paged) paged_load(-1);
    auto load_kv = [&](int it) {
      if (it < n_iters) {
        const int n0 = (split_begin + it) * kBlockN;
        const int offset = (it % kLoadStages) * kBlockN * kD;
        if (!paged) {
          const int64_t row = key_begin + n0;
          const In* k_tile = k_base + entry * a.k_batch_stride + row * a.k_row_stride;
          const In* v_tile = v_base + entry * a.v_batch_stride + row * a.v_row_stride;
          if constexpr (kFp8) {
            load_e4m3_tile<kBlockN, kD, kThreads>(sK + offset, k_tile, a.k_row_stride, len_k - n0, a.head_dim,
                                                  a.k_vec);
            load_e4m3_tile<kBlockN, kD, kThreads>(sV + offset, v_tile, a.v_row_stride, len_k - n0, a.head_dim_v,
                                                  a.v_vec);
          } else if (whole_rows && n0 + kBlockN <= len_k) {
            load_whole_tile<kBlockN, kD, kThreads>(sK + offset, k_tile, a.k_row_stride);
            load_whole_tile<kBlockN, kD, kThreads>(sV + offset, v_tile, a.v_row_stride);
          } else {
            load_tile<kBlockN, kD, kThreads>(sK + offset, k_tile, a.k_row_stride, len_k - n0, a.head_dim, a.k_vec);
            load_tile<kBlockN, kD, kThreads>(sV + offset, v_tile, a.v_row_stride, len_k - n0, a.head_dim_v, a.v_vec);
          }
        } else {
          paged_load(it);
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
    const int warp_r0 = r0 + row_warp * 16;  // the warp's first packed row
    // ALiBi: the thread's two packed rows have their own query rows and heads, so their own slopes and diagonals
    // (distances count over the sequence's used keys).
    const bool alibi = a.alibi_slopes != nullptr;
    float alibi_slope_u[1][2] = {{0.f, 0.f}};
    int alibi_diag[2] = {0, 0};
    if (alibi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int pr = min(warp_r0 + g + 8 * half, packed_rows - 1), h = hk * a.head_group + pr % a.head_group;
        const Alibi32 bias = Alibi32::make(a.alibi_slopes, a.alibi_batch_stride, b, h, len_q, len_k);
        alibi_slope_u[0][half] = bias.slope_in(a.unit_scale);
        alibi_diag[half] = pr / a.head_group + bias.shift - 2 * q;
      }
    }

    if constexpr (kFp8) {
      load_e4m3_q<kBlockM, kD, kThreads>(sQ, q_row, a.head_dim, a.q_vec);  // read by all after the first barrier
    } else {
      // Whole rows per pass: fewer threads than the block where a pass of all of them would span more rows.
      constexpr int kQThreads = kThreads < kBlockM * kD / 8 ? kThreads : kBlockM * kD / 8;
      if (int(threadIdx.x) < kQThreads) {
        gather_tile<kBlockM, kD, kQThreads>(sQ, q_row, static_cast<const In*>(a.q), a.head_dim, a.q_vec);
      }
    }
    for (int s = 0; s < kLoadStages - 1; ++s) load_kv(s);  // the first group also carries Q
    // Q's fragments in registers for the whole loop where they fit beside O (16-bit, d <= 128: 32 registers at
    // d 128): the tile is the same for every key tile, and reading it from shared memory cost 8 ldmatrix and their
    // swizzled addresses per tile.
    constexpr bool kHoldQ = !kFp8 && kD <= 128;
    uint32_t q_held[kHoldQ ? kD / 16 : 1][1][4];
    if constexpr (kHoldQ) {
      cp_async_wait<kLoadStages - 2>();  // Q arrived with the first copy group
      __syncthreads();
      q_fragments_all<T, kD, 1>(q_held, sQ + row_warp * 16 * kD, lane);
    }
    for (int it = 0; it < n_iters; ++it) {
      cp_async_wait<kLoadStages - 2>();
      __syncthreads();  // tile it visible to all; every warp is done with the buffer refilled next
      load_kv(it + kLoadStages - 1);
      const int stage = it % kLoadStages;
      const int key0 = (split_begin + it) * kBlockN + key_warp * kWarpKeys;

      float s[1][kNTiles][4];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[0][nt][e] = 0.f;
      if constexpr (kFp8) {
        warp_gemm_qk_e4m3<kD, 1, kNTiles>(s, sQ + row_warp * 16 * kD, sK + stage * kBlockN * kD, key_warp * kWarpKeys,
                                          lane);
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[0][nt][e] *= qk_descale;
      } else if constexpr (kHoldQ) {
        warp_gemm_qk_held<T, kD, 1, kNTiles>(s, q_held, sK + stage * kBlockN * kD + key_warp * kWarpKeys * kD, lane);
      } else {
        warp_gemm_qk<T, kD, 1, kNTiles>(s, sQ + row_warp * 16 * kD,
                                        sK + stage * kBlockN * kD + key_warp * kWarpKeys * kD, lane);
      }
      if (a.softcap_pre != 0.f) apply_softcap(s, a.softcap_pre);
      if (alibi) {
        const float base[1][2] = {{float(alibi_diag[0] - key0), float(alibi_diag[1] - key0)}};
        apply_alibi_rows(s, alibi_slope_u, base);
      }
      // Per-element masking only where the tile crosses a mask edge or the last key.
      if (key0 + kWarpKeys > len_k || !mask.tile_fully_visible(i_first, i_last + 1, key0, key0 + kWarpKeys)) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = min(warp_r0 + g + 8 * half, packed_rows - 1) / a.head_group;
          int lo, hi;
          mask.key_range(i, &lo, &hi);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = key0 + nt * 8 + 2 * q + e;
              if (j < lo || j >= hi) s[0][nt][2 * half + e] = -INFINITY;
            }
          }
        }
      }
      float factor[1][2];
      softmax.update(s, a.scale_log2, factor);
      // A row whose maximum did not move has factor exactly 1 (exp2 of 0): once the first tiles have set the
      // maxima that is most tiles, and the warp skips O's kD / 2 multiplies.
      if (__any_sync(0xffffffffu, factor[0][0] != 1.f || factor[0][1] != 1.f)) {
        OnlineSoftmax<1>::rescale(acc_o, factor);
      }
      if constexpr (kFp8) {
        warp_gemm_pv_e4m3<kD, 1, kNTiles>(acc_o, s, sV + stage * kBlockN * kD, key_warp * kWarpKeys, lane);
      } else {
        warp_gemm_pv<T, kD, 1, kNTiles>(acc_o, s, sV + stage * kBlockN * kD + key_warp * kWarpKeys * kD, lane);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the K/V buffers: the merge reuses them

    // Merge the warps: each publishes its rows' (max, sum) and unnormalised O; every thread then combines a
    // slice of the block's outputs.
    float* sMerge = reinterpret_cast<float*>(smem);
    float* sMax = sMerge + kKeyWarps * kBlockM * kD;
    float* sSum = sMax + kKeyWarps * kBlockM;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_warp * 16 + g + 8 * half;
      const float sum = quad_sum(softmax.row_sum[0][half]);
      if (row >= rows) continue;  // padding rows (a GQA group below 16): nobody reads them
      if (q == 0) {
        sMax[key_warp * kBlockM + row] = softmax.row_max[0][half];
        sSum[key_warp * kBlockM + row] = sum;
      }
      float* dst = sMerge + (key_warp * kBlockM + row) * kD;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // float8: O's columns back from warp_gemm_pv_e4m3's order
          dst[kFp8 ? e4m3_o_column(dt, 2 * q + e) : dt * 8 + 2 * q + e] = acc_o[0][dt][2 * half + e];
        }
      }
    }
    __syncthreads();

    const bool single = a.num_splits == 1;
    float* sPartialO = sMerge + decode_merge_bytes(kD, kPlan) / 4;  // [kBlockM][kD] (cluster combine)
    float* sPartialLse = sPartialO + kBlockM * kD;                     // [kBlockM]
    for (int idx = int(threadIdx.x); idx < rows * kD; idx += kThreads) {
      const int row = idx / kD, c = idx % kD;
      if (c >= a.head_dim_v) continue;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) m = fmaxf(m, sMax[w * kBlockM + row]);
      const float sub = m == -INFINITY ? 0.f : m * a.scale_log2;
      float sum = 0.f, o = 0.f;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) {
        const float f = fast_exp2(sMax[w * kBlockM + row] * a.scale_log2 - sub);
        sum += sSum[w * kBlockM + row] * f;
        o += sMerge[(w * kBlockM + row) * kD + c] * f;
      }
      const float out = (sum > 0.f ? o / sum : 0.f) * v_descale;
      const float lse = sum > 0.f ? m * a.unit_scale + logf(sum) : -INFINITY;
      const int pr = r0 + row, i = pr / a.head_group, h = hk * a.head_group + pr % a.head_group;
      if (single) {
        T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + (start_q + i) * a.o_row_stride + h * a.o_head_stride;
        go[c] = from_float<T>(out);
        if (c == 0 && a.lse != nullptr) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + start_q + i] = lse;
      } else if (a.cluster_combine) {
        sPartialO[row * kD + c] = out;
        if (c == 0) sPartialLse[row] = lse;
      } else {
        const int64_t prow = (a.cu_seqlens_q != nullptr ? start_q : int64_t(b) * a.seqlen_q) + i;
        const int64_t slot = (int64_t(split) * a.rows_total + prow) * a.heads_q + h;
        a.partial_o[slot * a.head_dim_v + c] = out;
        if (c == 0) a.partial_lse[slot] = lse;
      }
    }
    if (a.cluster_combine) combine_in_cluster(a, sPartialO, sPartialLse, rows, r0, b, hk, start_q);
  }

  // The splits of this row block are the CTAs of one cluster, each with its partial (normalised O, LSE) in shared
  // memory: after one cluster barrier, CTA r merges every r-th share of the block's (row, column) outputs from all
  // of them (decode_combine_kernel's arithmetic), and a second barrier keeps every CTA's partial alive until the
  // others have read it. Every CTA of the cluster reaches both barriers (a block with no keys has LSE = -inf).
  __device__ static void combine_in_cluster(const DecodeKernelArgs& a, const float* sPartialO,
                                            const float* sPartialLse, int rows, int r0, int b, int hk,
                                            int64_t start_q) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cluster_sync();
    const int splits = a.num_splits, rank = int(cluster_cta_rank());
    for (int idx = rank * kThreads + int(threadIdx.x); idx < rows * kD; idx += splits * kThreads) {
      const int row = idx / kD, c = idx % kD;
      if (c >= a.head_dim_v) continue;
      // Every split's LSE and O value first, all loads in flight together (one distributed-shared-memory round
      // trip instead of one per split and pass); each CTA wrote both for every (row, c) it combines here.
      float split_lse[kMaxClusterSplits], split_o[kMaxClusterSplits];
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        const bool in = s < splits;
        split_lse[s] = in ? ld_shared_cluster_f32(cluster_shared_address(sPartialLse + row, s)) : -INFINITY;
        split_o[s] = in ? ld_shared_cluster_f32(cluster_shared_address(sPartialO + row * kD + c, s)) : 0.f;
      }
      float m = -INFINITY;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) m = fmaxf(m, split_lse[s]);
      float sum = 0.f;
      if (m != -INFINITY) {
#pragma unroll
        for (int s = 0; s < kMaxClusterSplits; ++s) sum += expf(split_lse[s] - m);
      }
      const float lse = sum > 0.f ? m + logf(sum) : -INFINITY;
      float o = 0.f;
      if (sum > 0.f) {
#pragma unroll
        for (int s = 0; s < kMaxClusterSplits; ++s) {
          const float w = expf(split_lse[s] - lse);
          if (w > 0.f) o += w * split_o[s];
        }
      }
      const int pr = r0 + row, i = pr / a.head_group, h = hk * a.head_group + pr % a.head_group;
      T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + (start_q + i) * a.o_row_stride + h * a.o_head_stride;
      go[c] = from_float<T>(o);
      if (c == 0 && a.lse != nullptr) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + start_q + i] = lse;
    }
    cluster_sync();
#else
    __trap();  // the launcher sets cluster_combine only for sm_90+ binaries (decode_launch.cuh)
#endif
  }
};

template <typename T, int kD, DecodePlan kPlan, bool kFp8>
__global__ void __launch_bounds__(DecodeKernel<T, kD, kPlan, kFp8>::kThreads,
                                  decode_tile(kD, kPlan).min_blocks_sm)
    decode_kernel(const __grid_constant__ DecodeKernelArgs args) {
  extern __shared__ __align__(128) unsigned char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The combine kernel that follows (launched as a programmatic dependent, decode_launch.cuh) may take its block
  // slots now and wait there for this grid's partials: its launch overlaps the decode instead of following it.
  cudaTriggerProgrammaticLaunchCompletion();
  // Launched as a programmatic dependent of the kernel before it (decode_launch.cuh), which may still be running:
  // the block's launch overlaps that kernel's tail, and nothing is read or written before it has finished.
  cudaGridDependencySynchronize();
#endif
  DecodeKernel<T, kD, kPlan, kFp8>::run(args, smem);
}

// Merges the splits' partial outputs: per (packed query row, head) one block reads every split's LSE, weighs the
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

// The split combine: one block per (row, head). Warp 0 loads every split's LSE at once (kMaxDecodeSplits / 32 per
// lane) and puts the splits' weights in shared memory; then each warp takes every kCombineWarps-th split,
// kCombineUnroll of them at a time with all their loads in flight, lane l holding the columns l, l + 32, ...
// (kCols per lane: head_dim_v <= 32 kCols); the warps' sums meet in shared memory. A read of a partial waits one
// L2 round trip, so the time goes by the number of rounds a warp makes: 16 splits at b = 1 is one round per warp
// (the loop of one warp per row over every split took 16 x 4 rounds at d 128, and only 32 warps ran it).
constexpr int kCombineWarps = 4;
constexpr int kCombineUnroll = 4;

template <typename T, int kCols>
__global__ void __launch_bounds__(kCombineWarps * 32)
    decode_combine_kernel(const __grid_constant__ DecodeCombineArgs a) {
  static_assert(kMaxDecodeSplits % 32 == 0, "whole LSE slots per lane");
  constexpr int kLseSlots = kMaxDecodeSplits / 32;
  __shared__ float s_weight[kMaxDecodeSplits];
  __shared__ float s_partial[kCombineWarps - 1][kCols * 32];
  __shared__ float s_lse;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // launched before the decode grid ended: its partials are complete past here
#endif
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t item = blockIdx.x;  // (row, head)
  if (item >= int64_t(a.rows_total) * a.heads_q) return;
  const int64_t split_stride = int64_t(a.rows_total) * a.heads_q;
  const int splits = a.num_splits;
  if (warp == 0) {
    float split_lse[kLseSlots];
#pragma unroll
    for (int j = 0; j < kLseSlots; ++j) {
      const int s = lane + 32 * j;
      split_lse[j] = s < splits ? a.partial_lse[s * split_stride + item] : -INFINITY;
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kLseSlots; ++j) m = fmaxf(m, split_lse[j]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float sum = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int j = 0; j < kLseSlots; ++j) sum += expf(split_lse[j] - m);  // exp(-inf) = 0 past the splits
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float lse = sum > 0.f ? m + logf(sum) : -INFINITY;
#pragma unroll
    for (int j = 0; j < kLseSlots; ++j) {
      const int s = lane + 32 * j;
      if (s < splits) s_weight[s] = sum > 0.f ? expf(split_lse[j] - lse) : 0.f;
    }
    if (lane == 0) s_lse = lse;
  }
  __syncthreads();

  float o[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) o[k] = 0.f;
  const float* rows = a.partial_o + item * a.head_dim_v;
  for (int s0 = warp; s0 < splits; s0 += kCombineWarps * kCombineUnroll) {
    float x[kCombineUnroll][kCols];
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kCombineWarps;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int c = lane + 32 * k;
        x[u][k] = s < splits && c < a.head_dim_v ? rows[s * split_stride * a.head_dim_v + c] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kCombineWarps;
      const float w = s < splits ? s_weight[s] : 0.f;
#pragma unroll
      for (int k = 0; k < kCols; ++k) o[k] += w > 0.f ? w * x[u][k] : 0.f;  // a weight-0 split adds nothing
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int k = 0; k < kCols; ++k) s_partial[warp - 1][lane + 32 * k] = o[k];
  }
  __syncthreads();
  if (warp > 0) return;
  const int64_t prow = item / a.heads_q;
  const int h = int(item % a.heads_q);
  // The row's sequence and position: padded rows are b * seqlen_q + i; varlen rows are found by binary search.
  int b, i;
  if (a.cu_seqlens_q == nullptr) {
    b = int(prow / a.seqlen_q);
    i = int(prow % a.seqlen_q);
  } else {
    b = varlen_sequence_of(a.cu_seqlens_q, a.batch, prow);
    i = int(prow - a.cu_seqlens_q[b]);
  }
  // As in the main kernel: varlen tensors have no batch stride (0) and rows start at cu_seqlens_q[b].
  const int64_t row = (a.cu_seqlens_q == nullptr ? 0 : a.cu_seqlens_q[b]) + i;
  T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + row * a.o_row_stride + h * a.o_head_stride;
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    const int c = lane + 32 * k;
    float sum = o[k];
#pragma unroll
    for (int w = 0; w < kCombineWarps - 1; ++w) sum += s_partial[w][c];
    if (c < a.head_dim_v) go[c] = from_float<T>(sum);
  }
  if (lane == 0 && a.lse != nullptr) a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + row] = s_lse;
}

}  // namespace flashattn::cuda::sm80
