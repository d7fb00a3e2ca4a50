// sm80 fused attention forward: O = softmax(Q Kᵀ · scale) V and LSE, FlashAttention-2 style, on mma.sync.
//
// What it computes: for one (query-row block, query head, batch entry) per thread block, the exact attention
// output of block_m query rows over every key they can see, with an online softmax, and the natural-log LSE;
// softcap and the ALiBi bias are applied to the scores where the mask is, dropout to the probabilities before
// P V (the row sums and the LSE keep the undropped ones).
// Masked-out key tiles (above the causal diagonal, outside the window) are never loaded; only tiles crossing a
// mask edge or the last key are masked per element.
//
// Warp roles: none; every warp owns block_m / warps consecutive query rows (16 or 32) and computes them
// end to end: S = Q Kᵀ (Q fragments re-read from shared memory each tile, K by ldmatrix), mask, online
// softmax in registers, O += P V with P reused from the S registers (V by ldmatrix.trans). All threads share
// the cp.async copies.
//
// Shared memory (forward_config.h): Q tile (block_m x D) + stages x (K tile + V tile) (block_n x D each),
// swizzled (tile_io.cuh); 80 KB (D = 64), 96 KB (128), 128 KB (256), or 96 KB with D = 256's compact tile
// (64 query rows, for GPUs with 99 KB per block). The Q tile is reused for the O epilogue.
//
// Pipeline (cp.async groups, one per tile): the K and V tiles alternate, FA2 style, so each load overlaps the
// other half of an iteration: V[i + stages - 1] is issued when QKᵀ of tile i starts, K[i + stages] when its
// softmax starts. With stages = 2 every load has a whole iteration to land. Tiles run from the last key block
// to the first, so the masked diagonal tiles come first. Two barriers per iteration.
//
// Preconditions (checked by the launcher, forward_launch.cuh): fp16 or bf16; head dims <= D; every pointer
// 2-byte aligned; the `vec` flags set only for 16-byte aligned pointers with strides and head dims that are
// multiples of 8 elements; sequence lengths < 2^31 - block_m.
#pragma once

#include <cstdint>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/primitives.cuh"
#include "cuda/sm80/forward_config.h"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/softmax.cuh"
#include "cuda/sm80/tile_io.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace flashattn::cuda::sm80 {

// What the kernel reads: FwdParams reduced to device-side values, with the derived scales and flags.
struct ForwardKernelArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // null: not written
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;  // both null (padded batch) or both set (varlen)
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // padded lengths (varlen: unused, the offsets give each sequence's)
  int head_group;          // heads_q / heads_kv
  int head_dim, head_dim_v;
  int num_m_blocks;
  bool causal;
  int64_t window_left, window_right;
  int64_t attention_chunk;  // 0: none; taken by the kExtras kernels only (FwdParams::has_extras)
  float scale_log2;    // unit_scale · log2(e)
  float unit_scale;    // natural score per score unit: softmax_scale, or softcap
  float softcap_pre;   // softmax_scale / softcap; 0 = no softcap
  const float* alibi_slopes;  // null: no ALiBi; else slope of (b, h) at b * alibi_batch_stride + h
  int64_t alibi_batch_stride;
  float dropout_p;  // 0: no dropout (common/dropout.h)
  DropoutRng dropout_rng;
  bool q_vec, k_vec, v_vec, o_vec;  // 16-byte cp.async / stores allowed (tile_io.cuh)
};

// kExtras: ALiBi, dropout and chunked attention compiled in.
template <typename T, int kD, bool kCompact, bool kExtras>
struct ForwardKernel {
  static constexpr ForwardTile kTile = forward_tile(kD, kCompact);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kStages = kTile.stages;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kNTiles = kBlockN / 8;  // n-tiles of S
  static constexpr int kDTiles = kD / 8;       // n-tiles of O
  static constexpr int kSmemBytes = forward_smem_bytes(kD, kCompact);
  static_assert(kWarpRows % 16 == 0 && kBlockN % 16 == 0, "whole m16 tiles per warp, whole k16 steps of P");
  static_assert(kSmemBytes == (kBlockM + 2 * kStages * kBlockN) * kD * int(sizeof(T)), "config and kernel agree");

  __device__ static void run(const ForwardKernelArgs& a, unsigned char* smem) {
    T* sQ = reinterpret_cast<T*>(smem);
    T* sK = sQ + kBlockM * kD;
    T* sV = sK + kStages * kBlockN * kD;
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;

    // Longest first: with causal masks the last query blocks see the most keys, so they launch first.
    const int m_block = a.num_m_blocks - 1 - int(blockIdx.x);
    const int h = int(blockIdx.y), b = int(blockIdx.z);
    int64_t start_q = 0, start_k = 0;
    int len_q = a.seqlen_q, len_k = a.seqlen_k;
    if (a.cu_seqlens_q != nullptr) {
      start_q = a.cu_seqlens_q[b];
      start_k = a.cu_seqlens_k[b];
      len_q = int(a.cu_seqlens_q[b + 1] - start_q);
      len_k = int(a.cu_seqlens_k[b + 1] - start_k);
    }
    const int m0 = m_block * kBlockM;
    if (m0 >= len_q) return;
    const int rows = min(kBlockM, len_q - m0);

    const auto mask = make_mask<int64_t, kExtras>(len_q, len_k, a.causal, a.window_left, a.window_right,
                                                  a.attention_chunk);
    const Alibi32 alibi = Alibi32::make(a.alibi_slopes, a.alibi_batch_stride, b, h, len_q, len_k);
    const float alibi_slope_u = alibi.slope_in(a.unit_scale);
    const DropoutSpec dropout = DropoutSpec::make(a.dropout_p, a.dropout_rng, b, h);
    int64_t key_lo, key_hi;
    mask.key_range_for_rows(m0, m0 + rows, &key_lo, &key_hi);
    const int n_block_min = int(key_lo / kBlockN);
    const int n_block_max = key_hi > key_lo ? int((key_hi + kBlockN - 1) / kBlockN) : n_block_min;
    const int n_iters = n_block_max - n_block_min;

    const int hk = h / a.head_group;
    const T* gq = static_cast<const T*>(a.q) + b * a.q_batch_stride + (start_q + m0) * a.q_row_stride +
                  h * a.q_head_stride;
    const T* gk = static_cast<const T*>(a.k) + b * a.k_batch_stride + start_k * a.k_row_stride + hk * a.k_head_stride;
    const T* gv = static_cast<const T*>(a.v) + b * a.v_batch_stride + start_k * a.v_row_stride + hk * a.v_head_stride;

    // Tile i of the loop is key block n_block_max - 1 - i. Out-of-range tiles commit an empty group, so the
    // wait counts below stay the same on every iteration.
    auto load_k = [&](int i) {
      if (i < n_iters) {
        const int n0 = (n_block_max - 1 - i) * kBlockN;
        load_tile<kBlockN, kD, kThreads>(sK + (i % kStages) * kBlockN * kD, gk + n0 * a.k_row_stride, a.k_row_stride,
                                         len_k - n0, a.head_dim, a.k_vec);
      }
      cp_async_commit();
    };
    auto load_v = [&](int i) {
      if (i < n_iters) {
        const int n0 = (n_block_max - 1 - i) * kBlockN;
        load_tile<kBlockN, kD, kThreads>(sV + (i % kStages) * kBlockN * kD, gv + n0 * a.v_row_stride, a.v_row_stride,
                                         len_k - n0, a.head_dim_v, a.v_vec);
      }
      cp_async_commit();
    };

    float acc_o[kMTiles][kDTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
    OnlineSoftmax<kMTiles> softmax;
    softmax.init();

    const int warp_row0 = warp * kWarpRows;  // within the block
    const T* sQw = sQ + warp_row0 * kD;

    if (n_iters > 0) {
      // Prologue, in the order the loop consumes them: [Q, K0], V0, K1, ..., V[stages-2], K[stages-1].
      load_tile<kBlockM, kD, kThreads>(sQ, gq, a.q_row_stride, rows, a.head_dim, a.q_vec);
      load_k(0);
      for (int i = 0; i + 1 < kStages; ++i) {
        load_v(i);
        load_k(i + 1);
      }
      // Groups committed after K[i] when iteration i starts, and after V[i] when its P·V starts.
      constexpr int kInFlight = 2 * (kStages - 1);

      // One copy of the loop for every head dim of the bucket: columns past d / d_v are zero-filled and go
      // through the mma. (A second, step-skipping copy for small dims was tried on 2026-11-29: ptxas then spilled
      // inside the full-width copy too and every shape lost ~12%; see bench/results/sm80.md, 3c0b9e6.)
      for (int i = 0; i < n_iters; ++i) {
        const int stage = i % kStages;
        const int n0 = (n_block_max - 1 - i) * kBlockN;
        cp_async_wait<kInFlight>();
        __syncthreads();  // K[i] visible to all; every warp is done with V[i - 1]'s buffer
        load_v(i + kStages - 1);

        float s[kMTiles][kNTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
        warp_gemm_qk<T, kD, kMTiles, kNTiles>(s, sQw, sK + stage * kBlockN * kD, lane);

        if (a.softcap_pre != 0.f) apply_softcap(s, a.softcap_pre);
        if (kExtras && alibi_slope_u != 0.f)
          apply_alibi(s, alibi_slope_u, int64_t(m0 + warp_row0) + alibi.shift - n0, lane);
        if (tile_needs_mask(mask, m0, m0 + rows, n0, kBlockN)) apply_mask(s, mask, m0 + warp_row0, n0, lane);

        cp_async_wait<kInFlight>();
        __syncthreads();  // V[i] visible to all; every warp is done with K[i]'s buffer
        load_k(i + kStages);

        float factor[kMTiles][2];
        softmax.update(s, a.scale_log2, factor);
        // After the row sums took the undropped probabilities: P ∘ keep enters P V.
        if (kExtras && dropout.active()) apply_dropout(s, dropout, m0 + warp_row0, n0, lane);
        OnlineSoftmax<kMTiles>::rescale(acc_o, factor);
        warp_gemm_pv<T, kD, kMTiles, kNTiles>(acc_o, s, sV + stage * kBlockN * kD, lane);
      }
    }
    cp_async_wait<0>();  // only empty groups can be pending here, but leave none behind

    // Epilogue: normalise, round, stage the warp's rows in its own part of the Q tile, store coalesced.
    float inv_sum[kMTiles][2], lse[kMTiles][2];
    softmax.finalize(a.unit_scale, inv_sum, lse);
    if (kExtras && dropout.active()) {
      const float keep_scale = 1.f / (1.f - a.dropout_p);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) inv_sum[mt][0] *= keep_scale, inv_sum[mt][1] *= keep_scale;
    }
    __syncwarp();  // every lane's last ldmatrix of its Q rows is done before they are overwritten
    T* sOw = sQ + warp_row0 * kD;
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t v = pack_pair<T>(acc_o[mt][dt][2 * r] * inv_sum[mt][r], acc_o[mt][dt][2 * r + 1] * inv_sum[mt][r]);
          *reinterpret_cast<uint32_t*>(sOw + swizzle<kD>(mt * 16 + g + 8 * r, dt * 8 + 2 * q)) = v;
        }
      }
    }
    __syncwarp();
    T* go = static_cast<T*>(a.o) + b * a.o_batch_stride + (start_q + m0 + warp_row0) * a.o_row_stride +
            h * a.o_head_stride;
    store_tile_warp<kWarpRows, kD>(go, a.o_row_stride, sOw, rows - warp_row0, a.head_dim_v, a.o_vec, lane);

    if (a.lse != nullptr && q == 0) {
      float* glse = a.lse + b * a.lse_batch_stride + h * a.lse_head_stride + start_q + m0 + warp_row0;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = mt * 16 + g + 8 * r;
          if (warp_row0 + row < rows) glse[row] = lse[mt][r];
        }
      }
    }
  }
};

template <typename T, int kD, bool kCompact, bool kExtras>
__global__ void __launch_bounds__(ForwardKernel<T, kD, kCompact, kExtras>::kThreads,
                                  forward_tile(kD, kCompact).min_blocks_sm)
    forward_kernel(const __grid_constant__ ForwardKernelArgs args) {
  extern __shared__ __align__(128) unsigned char smem[];
  ForwardKernel<T, kD, kCompact, kExtras>::run(args, smem);
}

}  // namespace flashattn::cuda::sm80
