// The sm80 backward kernels (mma.sync m16n8k16 + ldmatrix + cp.async), one set per dtype x head-dim bucket.
//
//   bwd_preprocess_kernel  D[h][row] = Σ_c dO·O (fp32) and the LSE in log2 units, one warp per (row, head).
//   bwd_dkdv_kernel        one thread block per (key block of N keys, KV head, batch entry). K and V stay in
//                          shared memory; the block loops over the query heads of its KV group and, for each,
//                          over the query blocks of M rows that see any of its keys (MaskSpec::
//                          query_range_for_keys), with Q and dO double-buffered by cp.async. Per query block:
//                            S = Q Kᵀ, dP = dO Vᵀ                     (registers, fp32)
//                            P = exp2(S·scale·log2e − LSE·log2e), dS = P∘(dP − D) [∘(1 − tanh²) with softcap]
//                            P, dS -> shared memory (as T) — P never reaches global memory
//                            dV += Pᵀ dO, dK += dSᵀ Q                 (registers, fp32, whole block lifetime)
//                            dQ += dS K  -> fp32 atomics into the workspace (skipped in deterministic mode)
//                          dK/dV of a KV head therefore sum over its query heads with no atomics and no extra
//                          memory. Epilogue: dK·scale and dV stored as T.
//   bwd_dq_kernel          deterministic mode: one thread block per (query block, query head, batch entry);
//                          Q, dO resident, K and V double-buffered over the key blocks the rows see; recomputes
//                          S, dP, dS and accumulates dQ in registers in a fixed order: bitwise reproducible.
//   bwd_dq_convert_kernel  dQ = dq_accum · scale as T (non-deterministic mode).
//
// Warp roles: all 8 warps do the same work on different sub-tiles; the sub-tile grids per product are in
// backward_config.h. Shared memory (elements of T, rows padded by kSmemPad): main kernel
//   K, V [N][D+8] each; Q, dO [2][M][D+8] each; P, dS [M][N+8] each; LSE, D [2][M] fp32 (hd128: 175,104 bytes)
// dQ kernel: Q, dO [M][D+8]; K, V [2][N][D+8]; dS [M][N+8]. Pipeline depth 2 (cp.async groups, waited at the
// top of each iteration before the next tile is issued), or 1 where shared memory is smaller (A100: the
// streamed tiles are then loaded and waited for at the top of each iteration).
// Preconditions (checked by the launcher): head_dim, head_dim_v <= D; fp16 or bf16; the LSE comes from a
// forward with the same scale, softcap and mask (a row whose LSE is -inf saw no key and gets dQ = 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/primitives.cuh"
#include "cuda/sm80/backward_args.cuh"
#include "cuda/sm80/backward_config.h"
#include "cuda/sm80/backward_tiles.cuh"

namespace flashattn::cuda::sm80 {

constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ T to_elem(float x) {
  return T(x);
}

// LSE of a query row in log2 units, as the preprocess stored it: a row that saw no key has LSE = -inf and is
// stored as +inf, which makes every exp2(s - lse) exactly 0, so such a row contributes nothing (no NaN from
// -inf - -inf). Rows past the end of the sequence get the same treatment, so tails need no per-element test.
__device__ __forceinline__ float lse_log2_of(const BwdKernelArgs& a, const SeqExtent& seq, int h, int row) {
  return row < seq.len_q ? a.lse_log2[h * a.rows_q + seq.ws_row0 + row] : INFINITY;
}

__device__ __forceinline__ float dsum_of(const BwdKernelArgs& a, const SeqExtent& seq, int h, int row) {
  return row < seq.len_q ? a.dsum[h * a.rows_q + seq.ws_row0 + row] : 0.f;
}

// Turns one warp's S and dP accumulators (rows m0 + row0 + ..., keys n0 + col0 + ...) into P and dS and stores
// them as T at sP / sdS (tile-local coordinates, pitch ldn). Masked keys get P = 0, so dS = 0 too. Softcap and
// masking are template flags of this step only (the caller branches once per tile), so the hot variant is
// straight-line code: one FFMA + EX2 per score, no per-element branch.
template <typename T, int MI, int NI, bool kStoreP, bool kSoftcap, bool kMask>
__device__ __forceinline__ void softmax_grad_tile_impl(const float (&s)[MI][NI][4], const float (&dp)[MI][NI][4],
                                                       const float (&lse_l2)[MI][2], const float (&dsum)[MI][2],
                                                       const BwdKernelArgs& a, const MaskSpec& mask, int m0, int n0,
                                                       int row0, int col0, T* sP, T* sdS, int ldn, int lane) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + acc_row(mi, half, lane);
      int key_lo = 0, key_hi = 0;  // visible keys of the row, relative to n0
      if constexpr (kMask) {
        int64_t lo, hi;
        mask.key_range(m0 + row, &lo, &hi);
        lo -= n0, hi -= n0;
        key_lo = int(lo < 0 ? 0 : (lo > 1 << 30 ? 1 << 30 : lo));
        key_hi = int(hi < 0 ? 0 : (hi > 1 << 30 ? 1 << 30 : hi));
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = col0 + acc_col(ni, lane);
        float p[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[mi][ni][half * 2 + e];
          float pe, dscale = 1.f;
          if constexpr (kSoftcap) {
            const float t = tanhf(x * a.tanh_scale);
            pe = fast_exp2(t * a.softcap_log2 - lse_l2[mi][half]);
            dscale = 1.f - t * t;
          } else {
            pe = fast_exp2(x * a.scale_log2 - lse_l2[mi][half]);
          }
          if constexpr (kMask) {
            if (col + e < key_lo || col + e >= key_hi) pe = 0.f;
          }
          p[e] = pe;
          ds[e] = pe * dscale * (dp[mi][ni][half * 2 + e] - dsum[mi][half]);
        }
        if constexpr (kStoreP) {
          *reinterpret_cast<uint32_t*>(sP + row * ldn + col) = pack_pair<T>(p[0], p[1]);
        }
        *reinterpret_cast<uint32_t*>(sdS + row * ldn + col) = pack_pair<T>(ds[0], ds[1]);
      }
    }
  }
}

template <typename T, int MI, int NI, bool kStoreP>
__device__ __forceinline__ void softmax_grad_tile(const float (&s)[MI][NI][4], const float (&dp)[MI][NI][4],
                                                  const float (&lse_l2)[MI][2], const float (&dsum)[MI][2],
                                                  const BwdKernelArgs& a, const MaskSpec& mask, bool need_mask,
                                                  int m0, int n0, int row0, int col0, T* sP, T* sdS, int ldn,
                                                  int lane) {
  if (a.softcap > 0.f) {
    if (need_mask) {
      softmax_grad_tile_impl<T, MI, NI, kStoreP, true, true>(s, dp, lse_l2, dsum, a, mask, m0, n0, row0, col0, sP,
                                                             sdS, ldn, lane);
    } else {
      softmax_grad_tile_impl<T, MI, NI, kStoreP, true, false>(s, dp, lse_l2, dsum, a, mask, m0, n0, row0, col0, sP,
                                                              sdS, ldn, lane);
    }
  } else {
    if (need_mask) {
      softmax_grad_tile_impl<T, MI, NI, kStoreP, false, true>(s, dp, lse_l2, dsum, a, mask, m0, n0, row0, col0, sP,
                                                              sdS, ldn, lane);
    } else {
      softmax_grad_tile_impl<T, MI, NI, kStoreP, false, false>(s, dp, lse_l2, dsum, a, mask, m0, n0, row0, col0,
                                                               sP, sdS, ldn, lane);
    }
  }
}

// Stores a warp's accumulator tile (origin `base`, pitch row_stride) times `mul` as T; rows >= rows_valid and
// columns >= cols_valid (relative to the warp tile) are skipped. `pair_ok`: two adjacent elements may be written
// as one 32-bit store (4-byte aligned tensor).
template <typename T, int MI, int NI>
__device__ __forceinline__ void store_acc(const float (&acc)[MI][NI][4], float mul, T* base, int64_t row_stride,
                                          int rows_valid, int cols_valid, bool pair_ok, int lane) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = acc_row(mi, half, lane);
      if (row >= rows_valid) continue;
      T* dst = base + row * row_stride;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = acc_col(ni, lane);
        const float x = acc[mi][ni][half * 2] * mul, y = acc[mi][ni][half * 2 + 1] * mul;
        if (pair_ok && col + 1 < cols_valid) {
          *reinterpret_cast<uint32_t*>(dst + col) = pack_pair<T>(x, y);
        } else {
          if (col < cols_valid) dst[col] = to_elem<T>(x);
          if (col + 1 < cols_valid) dst[col + 1] = to_elem<T>(y);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const BwdKernelArgs a) {
  const int64_t warp_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= a.rows_q * a.heads_q) return;
  const int h = int(warp_id % a.heads_q);
  const int64_t r = warp_id / a.heads_q;
  // Padded: workspace row r = b * seqlen_q + i. Varlen: r is the packed row and the batch stride is 0.
  const int64_t b = a.cu_seqlens_q ? 0 : r / a.seqlen_q;
  const int64_t i = a.cu_seqlens_q ? r : r % a.seqlen_q;
  const T* o = static_cast<const T*>(a.o) + b * a.o_batch_stride + i * a.o_row_stride + h * a.o_head_stride;
  const T* d = static_cast<const T*>(a.dout) + b * a.do_batch_stride + i * a.do_row_stride + h * a.do_head_stride;
  float acc = 0.f;
  for (int c = lane; c < a.head_dim_v; c += 32) acc += float(o[c]) * float(d[c]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    a.dsum[h * a.rows_q + r] = acc;
    const float lse = a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + i];
    a.lse_log2[h * a.rows_q + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert_kernel(const BwdKernelArgs a) {
  const int64_t warp_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= a.rows_q * a.heads_q) return;
  const int h = int(warp_id % a.heads_q);
  const int64_t r = warp_id / a.heads_q;
  const int64_t b = a.cu_seqlens_q ? 0 : r / a.seqlen_q;
  const int64_t i = a.cu_seqlens_q ? r : r % a.seqlen_q;
  T* dq = static_cast<T*>(a.dq) + b * a.dq_batch_stride + i * a.dq_row_stride + h * a.dq_head_stride;
  const float* src = a.dq_accum + (h * a.rows_q + r) * a.dq_accum_ld;
  for (int c = lane; c < a.head_dim; c += 32) dq[c] = to_elem<T>(src[c] * a.scale);
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int kD>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_dkdv_kernel(const BwdKernelArgs a) {
  using C = BwdConfig<kD>;
  constexpr int kM = C::kM, kN = C::kN, kLdD = C::kLdD, kLdN = C::kLdN;
  constexpr int kMiS = C::kSdPWarpM / 16, kNiS = C::kSdPWarpN / 8;
  constexpr int kMiKV = C::kdKVWarpN / 16, kNiKV = C::kdKVWarpD / 8;
  constexpr int kMiQ = C::kdQWarpM / 16, kNiQ = C::kdQWarpD / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + kN * kLdD;
  const int stages = a.stages;
  T* sQ = sV + kN * kLdD;            // [stages][kM][kLdD]
  T* sdO = sQ + stages * kM * kLdD;  // [stages][kM][kLdD]
  T* sP = sdO + stages * kM * kLdD;  // [kM][kLdN]
  T* sdS = sP + kM * kLdN;           // [kM][kLdN]
  float* sLse = reinterpret_cast<float*>(sdS + kM * kLdN);  // [stages][kM], log2 units
  float* sDsum = sLse + stages * kM;                        // [stages][kM]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqExtent seq = seq_extent(a, b);
  const int n0 = n_block * kN;
  if (n0 >= seq.len_k) return;
  const int n_valid = min(kN, seq.len_k - n0);
  const MaskSpec mask = seq_mask(a, seq);
  int64_t q_lo, q_hi;
  mask.query_range_for_keys(n0, n0 + n_valid, &q_lo, &q_hi);
  const int m_first = int(q_lo / kM);
  const int n_m = q_hi > q_lo ? int((q_hi + kM - 1) / kM) - m_first : 0;
  const int iters = n_m * a.group;
  // Key blocks start their sweep at different query blocks, so that the dQ reductions of the blocks running
  // at once spread over the rows instead of all hitting one query block's lines in L2 together.
  const int m_rot = n_m > 0 ? n_block % n_m : 0;
  auto m0_of = [&](int it) {
    const int j = it % n_m + m_rot;
    return (m_first + (j >= n_m ? j - n_m : j)) * kM;
  };

  // Warp sub-tiles of the three product shapes.
  const int s_row0 = (warp / C::kSdPWarpsN) * C::kSdPWarpM, s_col0 = (warp % C::kSdPWarpsN) * C::kSdPWarpN;
  const int kv_row0 = (warp / C::kdKVWarpsD) * C::kdKVWarpN, kv_col0 = (warp % C::kdKVWarpsD) * C::kdKVWarpD;
  const int q_row0 = (warp / C::kdQWarpsD) * C::kdQWarpM, q_col0 = (warp % C::kdQWarpsD) * C::kdQWarpD;

  const T* q_base = static_cast<const T*>(a.q) + b * a.q_batch_stride + seq.start_q * a.q_row_stride;
  const T* do_base = static_cast<const T*>(a.dout) + b * a.do_batch_stride + seq.start_q * a.do_row_stride;
  auto load_q_do = [&](int it, int stage) {
    const int h = hk * a.group + it / n_m;
    const int m0 = m0_of(it);
    load_tile<T, kM, kD, kBwdThreads>(sQ + stage * kM * kLdD, kLdD, q_base + m0 * a.q_row_stride + h * a.q_head_stride,
                                      a.q_row_stride, seq.len_q - m0, a.head_dim, a.vec_q, tid);
    load_tile<T, kM, kD, kBwdThreads>(sdO + stage * kM * kLdD, kLdD,
                                      do_base + m0 * a.do_row_stride + h * a.do_head_stride, a.do_row_stride,
                                      seq.len_q - m0, a.head_dim_v, a.vec_do, tid);
    // The rows' LSE and D ride in the same cp.async group, so their latency hides behind an iteration too.
    static_assert(2 * kM <= kBwdThreads, "one thread per LSE and per D entry");
    if (tid < 2 * kM) {
      const int r = tid < kM ? tid : tid - kM;
      const float* src = (tid < kM ? a.lse_log2 : a.dsum) + h * a.rows_q + seq.ws_row0 + m0;
      const bool valid = m0 + r < seq.len_q;
      cp_async_4((tid < kM ? sLse : sDsum) + stage * kM + r, valid ? src + r : src, valid);
    }
  };

  if (iters > 0) {
    const int64_t k_row = seq.start_k + n0;
    load_tile<T, kN, kD, kBwdThreads>(
        sK, kLdD,
        static_cast<const T*>(a.k) + b * a.k_batch_stride + k_row * a.k_row_stride + hk * a.k_head_stride,
        a.k_row_stride, n_valid, a.head_dim, a.vec_k, tid);
    load_tile<T, kN, kD, kBwdThreads>(
        sV, kLdD,
        static_cast<const T*>(a.v) + b * a.v_batch_stride + k_row * a.v_row_stride + hk * a.v_head_stride,
        a.v_row_stride, n_valid, a.head_dim_v, a.vec_v, tid);
    load_q_do(0, 0);
    cp_async_commit();
  }

  float acc_dk[kMiKV][kNiKV][4], acc_dv[kMiKV][kNiKV][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);

  for (int it = 0; it < iters; ++it) {
    const int stage = stages == 2 ? it & 1 : 0;
    const int h = hk * a.group + it / n_m;
    const int m0 = m0_of(it);
    const T* sQs = sQ + stage * kM * kLdD;
    const T* sdOs = sdO + stage * kM * kLdD;

    if (stages == 2) {
      // This iteration's tiles have landed, and every warp is done with the previous iteration's P, dS and the
      // other stage, which the prefetch below overwrites.
      cp_async_wait<0>();
      __syncthreads();
      if (it + 1 < iters) load_q_do(it + 1, stage ^ 1);
      cp_async_commit();
    } else {
      // One stage: once every warp is done with the previous tiles, load this iteration's and wait for them.
      if (it > 0) {
        __syncthreads();
        load_q_do(it, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
      __syncthreads();
    }

    // Rows past the end: +inf (P = 0), D = 0 (zero-filled).
    float lse_l2[kMiS][2], dsum[kMiS][2];
#pragma unroll
    for (int mi = 0; mi < kMiS; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = s_row0 + acc_row(mi, half, lane);
        lse_l2[mi][half] = m0 + r < seq.len_q ? sLse[stage * kM + r] : INFINITY;
        dsum[mi][half] = sDsum[stage * kM + r];
      }

    float acc_s[kMiS][kNiS][4], acc_dp[kMiS][kNiS][4];
    zero_acc(acc_s);
    zero_acc(acc_dp);
    warp_mma<T, kMiS, kNiS, kD / 16, false, false>(acc_s, sQs + s_row0 * kLdD, kLdD, sK + s_col0 * kLdD, kLdD, lane);
    warp_mma<T, kMiS, kNiS, kD / 16, false, false>(acc_dp, sdOs + s_row0 * kLdD, kLdD, sV + s_col0 * kLdD, kLdD,
                                                   lane);

    const bool need_mask =
        n0 + kN > seq.len_k || !mask.tile_fully_visible(m0, min(m0 + kM, seq.len_q), n0, n0 + kN);
    softmax_grad_tile<T, kMiS, kNiS, true>(acc_s, acc_dp, lse_l2, dsum, a, mask, need_mask, m0, n0, s_row0, s_col0,
                                           sP, sdS, kLdN, lane);
    __syncthreads();

    if (a.accumulate_dq) {
      float acc_dq[kMiQ][kNiQ][4];
      zero_acc(acc_dq);
      warp_mma<T, kMiQ, kNiQ, kN / 16, false, true>(acc_dq, sdS + q_row0 * kLdN, kLdN, sK + q_col0, kLdD, lane);
      float* dq_rows = a.dq_accum + (h * a.rows_q + seq.ws_row0 + m0 + q_row0) * a.dq_accum_ld + q_col0;
      const int rows_left = seq.len_q - m0 - q_row0;
#pragma unroll
      for (int mi = 0; mi < kMiQ; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = acc_row(mi, half, lane);
          if (row < rows_left) {
#pragma unroll
            for (int ni = 0; ni < kNiQ; ++ni) {
              atomic_add_pair(dq_rows + row * a.dq_accum_ld + acc_col(ni, lane), acc_dq[mi][ni][half * 2],
                              acc_dq[mi][ni][half * 2 + 1]);
            }
          }
        }
    }
    // dV += Pᵀ dO and dK += dSᵀ Q: the transposes come from ldmatrix.trans on the staged tiles.
    warp_mma<T, kMiKV, kNiKV, kM / 16, true, true>(acc_dv, sP + kv_row0, kLdN, sdOs + kv_col0, kLdD, lane);
    warp_mma<T, kMiKV, kNiKV, kM / 16, true, true>(acc_dk, sdS + kv_row0, kLdN, sQs + kv_col0, kLdD, lane);
  }

  // Keys of this block that no query sees still get their (zero) gradients written here.
  const int64_t key_row = seq.start_k + n0 + kv_row0;
  T* dk = static_cast<T*>(a.dk) + b * a.dk_batch_stride + key_row * a.dk_row_stride + hk * a.dk_head_stride + kv_col0;
  T* dv = static_cast<T*>(a.dv) + b * a.dv_batch_stride + key_row * a.dv_row_stride + hk * a.dv_head_stride + kv_col0;
  store_acc<T>(acc_dk, a.scale, dk, a.dk_row_stride, n_valid - kv_row0, a.head_dim - kv_col0, a.pair_dk, lane);
  store_acc<T>(acc_dv, 1.f, dv, a.dv_row_stride, n_valid - kv_row0, a.head_dim_v - kv_col0, a.pair_dv, lane);
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int kD>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_dq_kernel(const BwdKernelArgs a) {
  using C = BwdConfig<kD>;
  constexpr int kM = C::kM, kN = C::kN, kLdD = C::kLdD, kLdN = C::kLdN;
  constexpr int kMiS = C::kSdPWarpM / 16, kNiS = C::kSdPWarpN / 8;
  constexpr int kMiQ = C::kdQWarpM / 16, kNiQ = C::kdQWarpD / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kM][kLdD]
  T* sdO = sQ + kM * kLdD;                 // [kM][kLdD]
  const int stages = a.stages;
  T* sK = sdO + kM * kLdD;            // [stages][kN][kLdD]
  T* sV = sK + stages * kN * kLdD;    // [stages][kN][kLdD]
  T* sdS = sV + stages * kN * kLdD;   // [kM][kLdN]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / a.group;
  const SeqExtent seq = seq_extent(a, b);
  const int m0 = m_block * kM;
  if (m0 >= seq.len_q) return;
  const int m_valid = min(kM, seq.len_q - m0);
  const MaskSpec mask = seq_mask(a, seq);
  int64_t k_lo, k_hi;
  mask.key_range_for_rows(m0, m0 + m_valid, &k_lo, &k_hi);
  const int n_first = int(k_lo / kN);
  const int n_n = k_hi > k_lo ? int((k_hi + kN - 1) / kN) - n_first : 0;

  const int s_row0 = (warp / C::kSdPWarpsN) * C::kSdPWarpM, s_col0 = (warp % C::kSdPWarpsN) * C::kSdPWarpN;
  const int q_row0 = (warp / C::kdQWarpsD) * C::kdQWarpM, q_col0 = (warp % C::kdQWarpsD) * C::kdQWarpD;

  const T* k_base = static_cast<const T*>(a.k) + b * a.k_batch_stride + seq.start_k * a.k_row_stride +
                    hk * a.k_head_stride;
  const T* v_base = static_cast<const T*>(a.v) + b * a.v_batch_stride + seq.start_k * a.v_row_stride +
                    hk * a.v_head_stride;
  auto load_kv = [&](int it, int stage) {
    const int n0 = (n_first + it) * kN;
    load_tile<T, kN, kD, kBwdThreads>(sK + stage * kN * kLdD, kLdD, k_base + n0 * a.k_row_stride, a.k_row_stride,
                                      seq.len_k - n0, a.head_dim, a.vec_k, tid);
    load_tile<T, kN, kD, kBwdThreads>(sV + stage * kN * kLdD, kLdD, v_base + n0 * a.v_row_stride, a.v_row_stride,
                                      seq.len_k - n0, a.head_dim_v, a.vec_v, tid);
  };
  if (n_n > 0) {
    load_tile<T, kM, kD, kBwdThreads>(
        sQ, kLdD,
        static_cast<const T*>(a.q) + b * a.q_batch_stride + (seq.start_q + m0) * a.q_row_stride + h * a.q_head_stride,
        a.q_row_stride, m_valid, a.head_dim, a.vec_q, tid);
    load_tile<T, kM, kD, kBwdThreads>(sdO, kLdD,
                                      static_cast<const T*>(a.dout) + b * a.do_batch_stride +
                                          (seq.start_q + m0) * a.do_row_stride + h * a.do_head_stride,
                                      a.do_row_stride, m_valid, a.head_dim_v, a.vec_do, tid);
    load_kv(0, 0);
    cp_async_commit();
  }

  float lse_l2[kMiS][2], dsum[kMiS][2];
#pragma unroll
  for (int mi = 0; mi < kMiS; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = m0 + s_row0 + acc_row(mi, half, lane);
      lse_l2[mi][half] = lse_log2_of(a, seq, h, row);
      dsum[mi][half] = dsum_of(a, seq, h, row);
    }

  float acc_dq[kMiQ][kNiQ][4];
  zero_acc(acc_dq);
  for (int it = 0; it < n_n; ++it) {
    const int stage = stages == 2 ? it & 1 : 0;
    const int n0 = (n_first + it) * kN;
    const T* sKs = sK + stage * kN * kLdD;
    const T* sVs = sV + stage * kN * kLdD;
    if (stages == 2) {
      cp_async_wait<0>();
      __syncthreads();
      if (it + 1 < n_n) load_kv(it + 1, stage ^ 1);
      cp_async_commit();
    } else {
      if (it > 0) {
        __syncthreads();
        load_kv(it, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
      __syncthreads();
    }

    float acc_s[kMiS][kNiS][4], acc_dp[kMiS][kNiS][4];
    zero_acc(acc_s);
    zero_acc(acc_dp);
    warp_mma<T, kMiS, kNiS, kD / 16, false, false>(acc_s, sQ + s_row0 * kLdD, kLdD, sKs + s_col0 * kLdD, kLdD, lane);
    warp_mma<T, kMiS, kNiS, kD / 16, false, false>(acc_dp, sdO + s_row0 * kLdD, kLdD, sVs + s_col0 * kLdD, kLdD,
                                                   lane);
    const bool need_mask =
        n0 + kN > seq.len_k || !mask.tile_fully_visible(m0, m0 + m_valid, n0, n0 + kN);
    softmax_grad_tile<T, kMiS, kNiS, false>(acc_s, acc_dp, lse_l2, dsum, a, mask, need_mask, m0, n0, s_row0, s_col0,
                                            nullptr, sdS, kLdN, lane);
    __syncthreads();
    warp_mma<T, kMiQ, kNiQ, kN / 16, false, true>(acc_dq, sdS + q_row0 * kLdN, kLdN, sKs + q_col0, kLdD, lane);
  }

  T* dq = static_cast<T*>(a.dq) + b * a.dq_batch_stride + (seq.start_q + m0 + q_row0) * a.dq_row_stride +
          h * a.dq_head_stride + q_col0;
  store_acc<T>(acc_dq, a.scale, dq, a.dq_row_stride, m_valid - q_row0, a.head_dim - q_col0, a.pair_dq, lane);
}

}  // namespace flashattn::cuda::sm80
