// The sm80 backward kernels (mma.sync m16n8k16 + ldmatrix + cp.async), one set per dtype x head-dim bucket.
//
//   bwd_preprocess_kernel  D[h][row] = Σ_c dO·O (fp32) and the LSE in log2 units, a group of threads per (row,
//                          head) reading 16 bytes per access where aligned (backward_rows.cu picks the group).
//   bwd_dkdv_kernel        one thread block per (key block of N keys, KV head, batch entry). K and V stay in
//                          shared memory; the block loops over the query heads of its KV group and, for each,
//                          over the query blocks of M rows that see any of its keys (MaskSpec::
//                          query_range_for_keys), with Q and dO double-buffered by cp.async (whole tiles by
//                          load_full_tile, tails by load_tile). Per query block:
//                            S = Q Kᵀ; P = exp2(S·scale·log2e − LSE·log2e) -> shared memory (as T), before
//                            dP = dO Vᵀ; dS = P∘(dP − D) [∘(1 − tanh²) with softcap] -> shared memory
//                                                                      (S, dP in registers, fp32; P never
//                                                                       reaches global memory)
//                            dQ += dS K  -> fp32 vector reductions into the workspace (skipped in
//                                           deterministic mode), then dV += Pᵀ dO, dK += dSᵀ Q
//                                                                      (registers, fp32, whole block lifetime)
//                          dK/dV of a KV head therefore sum over its query heads with no atomics and no extra
//                          memory. Epilogue: dK·scale and dV stored as T. Two barriers per query block: after
//                          the tiles land (before the next prefetch), and after P and dS are stored.
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
// streamed tiles are then loaded and waited for at the top of each iteration). GPUs with 99 KB per block run
// the compact tiles (kCompact, backward_config.h: hd64 90,624 bytes, hd128 88,576) with one stage.
// Preconditions (checked by the launcher): head_dim, head_dim_v <= D; fp16 or bf16; the LSE comes from a
// forward with the same scale, softcap and mask (a row whose LSE is -inf saw no key and gets dQ = 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

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
  return row < seq.len_q ? a.lse_log2[h * a.ws_head_stride + seq.ws_row0 + row] : INFINITY;
}

__device__ __forceinline__ float dsum_of(const BwdKernelArgs& a, const SeqExtent& seq, int h, int row) {
  return row < seq.len_q ? a.dsum[h * a.ws_head_stride + seq.ws_row0 + row] : 0.f;
}

// One query block against one key block, for one warp's S/dP sub-tile (rows row0.., keys col0.. of the tile
// whose origin is (m0, n0)), up to P and dS in shared memory (as T, pitch C::kLdN):
//   S = Q Kᵀ;  P = exp2(S·scale·log2e − LSE·log2e), 0 for masked keys  -> sP (when kStoreP)
//   dP = dO Vᵀ;  dS = P∘(dP − D) [∘(1 − tanh²) with softcap]             -> sdS
// (dropout: P∘Z to sP and dS = P∘(Z∘dP − D), Z regenerated from the seed: common/dropout.h)
// P is finished and stored before dP is computed, and softcap and masking are template flags (the caller
// branches once per tile), so each variant is one straight-line block in which the compiler interleaves the
// exponentials and shared stores with the dP mma.sync instead of leaving the tensor cores idle behind them.
// Only P·(1 − tanh²) stays in registers across the dP product: P itself is needed in fp32 by nothing else.
// sq, sdo: the warp's first rows of the staged Q and dO tiles; sk, sv: the warp's first keys of K and V.
template <typename C, typename T, bool kStoreP, bool kSoftcap, bool kMask, bool kExtras>
__device__ __forceinline__ void scores_to_grads_impl(const T* sq, const T* sdo, const T* sk, const T* sv,
                                                     const float (&lse_l2)[C::kSdPWarpM / 16][2],
                                                     const float (&dsum)[C::kSdPWarpM / 16][2],
                                                     const BwdKernelArgs& a,
                                                     const BasicMaskSpec<int64_t, kExtras>& mask,
                                                     const BwdAlibi& alibi, const BwdDropout& drop, int m0, int n0,
                                                     int row0, int col0, T* sP, T* sdS, int lane) {
  constexpr int MI = C::kSdPWarpM / 16, NI = C::kSdPWarpN / 8;
  static_assert(2 * NI <= 32, "one keep bit per score of a warp row");
  // Dropout (masked variant only): bit 2 ni + e of kept[mi][half] says whether that score was kept.
  uint32_t kept[MI][2];
  constexpr int kLdD = C::kLdD, kLdN = C::kLdN;
  float acc_s[MI][NI][4];
  zero_acc(acc_s);
  warp_mma<T, MI, NI, C::kD / 16, false, false>(acc_s, sq, kLdD, sk, kLdD, lane);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + acc_row(mi, half, lane);
      int key_lo = 0, key_hi = 0;  // visible keys of the row, relative to n0
      float alibi_base = 0.f;      // the row's diagonal minus the key of its column ni = 0, e = 0
      if constexpr (kMask) {
        int64_t lo, hi;
        mask.key_range(m0 + row, &lo, &hi);
        lo -= n0, hi -= n0;
        key_lo = int(lo < 0 ? 0 : (lo > 1 << 30 ? 1 << 30 : lo));
        key_hi = int(hi < 0 ? 0 : (hi > 1 << 30 ? 1 << 30 : hi));
        if constexpr (kExtras) alibi_base = float(int64_t(m0 + row) + alibi.shift - n0 - (col0 + acc_col(0, lane)));
      }
      uint32_t draws[4] = {0, 0, 0, 0};
      kept[mi][half] = ~0u;
      (void)draws;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = col0 + acc_col(ni, lane);
        // This lane's keys n0 + col0 + 8 ni + 2q (+1): one Philox group per 32-key span (n0 is a multiple of 32).
        const int key8 = n0 + col0 + 8 * ni;
        if constexpr (kMask && kExtras) {
          if (drop.spec.active() && (ni == 0 || (key8 & 31) == 0))
            drop.spec.draws(m0 + row, DropoutSpec::group_of(key8 + 2 * (lane & 3)), draws);
        }
        float p[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = acc_s[mi][ni][half * 2 + e];
          float dscale = 1.f;
          // ALiBi's bias folded into the subtracted LSE (0 without ALiBi): exp2(s + b - lse) with b < 0.
          float lse = lse_l2[mi][half];
          if constexpr (kMask && kExtras) lse = fmaf(alibi.slope2, fabsf(alibi_base - float(ni * 8 + e)), lse);
          if constexpr (kSoftcap) {
            const TanhParts t = tanh_parts(x * (a.tanh_scale * kTanhExp2));
            p[e] = fast_exp2(scaled_tanh(t, 1.f) * a.softcap_log2 - lse);
            dscale = tanh_slope(t);
          } else {
            p[e] = fast_exp2(x * a.scale_log2 - lse);
          }
          if constexpr (kMask) {
            if (col + e < key_lo || col + e >= key_hi) p[e] = 0.f;
          }
          x = kSoftcap ? p[e] * dscale : p[e];
          if constexpr (kMask && kExtras) {
            // P ∘ Z for dV: kept ones scaled by 1 / (1 - p), dropped ones 0.
            if (drop.spec.active()) {
              const bool keep = drop.spec.kept(draws, 2 * ((key8 >> 3) & 3) + e);
              if (!keep) kept[mi][half] &= ~(1u << (2 * ni + e));
              p[e] = keep ? p[e] * drop.keep_scale : 0.f;
            }
          }
        }
        if constexpr (kStoreP) {
          *reinterpret_cast<uint32_t*>(sP + row * kLdN + col) = pack_pair<T>(p[0], p[1]);
        }
      }
    }
  }
  float acc_dp[MI][NI][4];
  zero_acc(acc_dp);
  warp_mma<T, MI, NI, C::kD / 16, false, false>(acc_dp, sdo, kLdD, sv, kLdD, lane);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + acc_row(mi, half, lane);
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = col0 + acc_col(ni, lane);
        float dp0 = acc_dp[mi][ni][half * 2], dp1 = acc_dp[mi][ni][half * 2 + 1];
        if constexpr (kMask && kExtras) {
          // dS = P ∘ (Z ∘ dP - D).
          if (drop.spec.active()) {
            dp0 = (kept[mi][half] >> (2 * ni)) & 1u ? dp0 * drop.keep_scale : 0.f;
            dp1 = (kept[mi][half] >> (2 * ni + 1)) & 1u ? dp1 * drop.keep_scale : 0.f;
          }
        }
        const float ds0 = acc_s[mi][ni][half * 2] * (dp0 - dsum[mi][half]);
        const float ds1 = acc_s[mi][ni][half * 2 + 1] * (dp1 - dsum[mi][half]);
        *reinterpret_cast<uint32_t*>(sdS + row * kLdN + col) = pack_pair<T>(ds0, ds1);
      }
    }
  }
}

// kExtras: ALiBi, dropout and chunks compiled in (ALiBi and dropout in the masked variant, which then runs on every
// tile).
template <typename C, typename T, bool kStoreP, bool kExtras>
__device__ __forceinline__ void scores_to_grads(const T* sq, const T* sdo, const T* sk, const T* sv,
                                                const float (&lse_l2)[C::kSdPWarpM / 16][2],
                                                const float (&dsum)[C::kSdPWarpM / 16][2], const BwdKernelArgs& a,
                                                const BasicMaskSpec<int64_t, kExtras>& mask, const BwdAlibi& alibi,
                                                const BwdDropout& drop,
                                                bool need_mask, int m0, int n0, int row0, int col0, T* sP, T* sdS,
                                                int lane) {
  // The masked variant also adds ALiBi's bias and applies dropout.
  if constexpr (kExtras) need_mask = need_mask || alibi.slope2 != 0.f || drop.spec.active();
  if (a.softcap > 0.f) {
    if (need_mask) {
      scores_to_grads_impl<C, T, kStoreP, true, true, kExtras>(sq, sdo, sk, sv, lse_l2, dsum, a, mask,
                                                                 alibi, drop, m0, n0, row0, col0, sP, sdS, lane);
    } else {
      scores_to_grads_impl<C, T, kStoreP, true, false, kExtras>(sq, sdo, sk, sv, lse_l2, dsum, a, mask,
                                                                 alibi, drop, m0, n0, row0, col0, sP, sdS, lane);
    }
  } else {
    if (need_mask) {
      scores_to_grads_impl<C, T, kStoreP, false, true, kExtras>(sq, sdo, sk, sv, lse_l2, dsum, a, mask,
                                                                 alibi, drop, m0, n0, row0, col0, sP, sdS, lane);
    } else {
      scores_to_grads_impl<C, T, kStoreP, false, false, kExtras>(sq, sdo, sk, sv, lse_l2, dsum, a, mask,
                                                                 alibi, drop, m0, n0, row0, col0, sP, sdS, lane);
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
// The (query head h, query row r) that one group of 2^group_log2 consecutive threads (at most a warp) of the
// row-wise kernels owns, with the row's batch entry b and position i for addressing the tensors (padded:
// r = b * seqlen_q + i; varlen: r is the packed row, b = 0) and its workspace row ws (ws_sequence_start; r itself
// when sequences are not realigned). lane: the thread's index in its group; mask: the group's lanes in the warp
// (a group leaves or stays as a whole, so its shuffles name only its own lanes).
struct RowGroup {
  int h, lane;
  unsigned mask;
  int64_t r, b, i, ws;
};
// The batch entry whose packed rows hold row r: the last b with cu[b] <= r (empty entries share a start).
__device__ __forceinline__ int batch_of_packed_row(const int32_t* cu, int batch, int64_t r) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
__device__ __forceinline__ bool row_group(const BwdKernelArgs& a, int group_log2, RowGroup* w) {
  const int64_t group_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> group_log2;
  const int64_t groups = a.rows_q * a.heads_q;
  if (group_id >= groups) return false;
  const int group = 1 << group_log2;
  w->lane = threadIdx.x & (group - 1);
  w->mask = group == 32 ? 0xffffffffu : ((1u << group) - 1) << ((threadIdx.x & 31) & ~(group - 1));
  if (groups <= int64_t(UINT32_MAX)) {
    // 32-bit quotients wherever the (row, head) pairs fit (the same for every thread of the launch): each 64-bit
    // division by a runtime divisor tests both operands and branches to a 32-bit path or a call, three per group,
    // in a kernel that ncu found issue-bound (the preprocess at hd 64, B·S = 16k: 76% of issue slots, DRAM 63%).
    const uint32_t g = uint32_t(group_id), heads = uint32_t(a.heads_q), seqlen = uint32_t(max(a.seqlen_q, 1));
    const uint32_t r = g / heads;
    w->h = int(g - r * heads);
    w->r = r;
    w->b = a.cu_seqlens_q ? 0 : r / seqlen;
    w->i = a.cu_seqlens_q ? r : r - uint32_t(w->b) * seqlen;
  } else {
    w->h = int(group_id % a.heads_q);
    w->r = group_id / a.heads_q;
    w->b = a.cu_seqlens_q ? 0 : w->r / a.seqlen_q;
    w->i = a.cu_seqlens_q ? w->r : w->r % a.seqlen_q;
  }
  w->ws = w->r;
  if (a.ws_seq_align != 1) {
    if (a.cu_seqlens_q) {
      const int b = batch_of_packed_row(a.cu_seqlens_q, a.batch, w->r);
      w->ws = ws_sequence_start(a.cu_seqlens_q[b], b, a.ws_seq_align) + (w->r - a.cu_seqlens_q[b]);
    } else {
      w->ws = ws_sequence_start(w->b * a.seqlen_q, w->b, a.ws_seq_align) + w->i;
    }
  }
  return true;
}

// The row-wise kernels move kRowChunk consecutive elements (16 bytes of T) per thread and access where the
// launcher found every base and stride 16-byte aligned and the row length a multiple of it (vec_rows), else one
// element per thread and access.
constexpr int kRowChunk = 8;

// Σ x·y over 8 elements of T packed in 16 bytes each.
template <typename T>
__device__ __forceinline__ float dot_chunk(const uint4& x, const uint4& y) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 a = unpack_pair<T>(xs[k]), b = unpack_pair<T>(ys[k]);
    acc = fmaf(a.x, b.x, fmaf(a.y, b.y, acc));
  }
  return acc;
}

template <typename T>
__global__ void __launch_bounds__(256) bwd_preprocess_kernel(const BwdKernelArgs a, int group_log2, bool vec_rows) {
  RowGroup w;
  if (!row_group(a, group_log2, &w)) return;
  const int h = w.h, lane = w.lane, group = 1 << group_log2;
  const int64_t r = w.ws, b = w.b, i = w.i;
  const T* o = static_cast<const T*>(a.o) + b * a.o_batch_stride + i * a.o_row_stride + h * a.o_head_stride;
  const T* d = static_cast<const T*>(a.dout) + b * a.do_batch_stride + i * a.do_row_stride + h * a.do_head_stride;
  float acc = 0.f;
  if (vec_rows) {
    for (int c = kRowChunk * lane; c < a.head_dim_v; c += kRowChunk * group)
      acc += dot_chunk<T>(*reinterpret_cast<const uint4*>(o + c), *reinterpret_cast<const uint4*>(d + c));
  } else {
    for (int c = lane; c < a.head_dim_v; c += group) acc += float(o[c]) * float(d[c]);
  }
  for (int off = group / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(w.mask, acc, off);
  if (lane == 0) {
    a.dsum[h * a.ws_head_stride + r] = acc;
    const float lse = a.lse[b * a.lse_batch_stride + h * a.lse_head_stride + i];
    a.lse_log2[h * a.ws_head_stride + r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert_kernel(const BwdKernelArgs a, int group_log2, bool vec_rows) {
  RowGroup w;
  if (!row_group(a, group_log2, &w)) return;
  const int h = w.h, lane = w.lane, group = 1 << group_log2;
  const int64_t r = w.ws, b = w.b, i = w.i;
  T* dq = static_cast<T*>(a.dq) + b * a.dq_batch_stride + i * a.dq_row_stride + h * a.dq_head_stride;
  const float* src = a.dq_accum + (h * a.ws_head_stride + r) * a.dq_accum_ld;
  if (vec_rows) {
    for (int c = kRowChunk * lane; c < a.head_dim; c += kRowChunk * group) {
      const float4 lo = *reinterpret_cast<const float4*>(src + c), hi = *reinterpret_cast<const float4*>(src + c + 4);
      *reinterpret_cast<uint4*>(dq + c) =
          make_uint4(pack_pair<T>(lo.x * a.scale, lo.y * a.scale), pack_pair<T>(lo.z * a.scale, lo.w * a.scale),
                     pack_pair<T>(hi.x * a.scale, hi.y * a.scale), pack_pair<T>(hi.z * a.scale, hi.w * a.scale));
    }
  } else {
    for (int c = lane; c < a.head_dim; c += group) dq[c] = to_elem<T>(src[c] * a.scale);
  }
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int kD, bool kCompact, bool kExtras>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_dkdv_kernel(const BwdKernelArgs a) {
  using C = BwdConfig<kD, kCompact>;
  constexpr int kM = C::kM, kN = C::kN, kLdD = C::kLdD, kLdN = C::kLdN;
  constexpr int kMiS = C::kSdPWarpM / 16;
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
  const auto mask = seq_mask<kExtras>(a, seq);
  int64_t q_lo, q_hi;
  mask.query_range_for_keys(n0, n0 + n_valid, &q_lo, &q_hi);
  const int m_first = int(q_lo / kM);
  const int n_m = q_hi > q_lo ? int((q_hi + kM - 1) / kM) - m_first : 0;
  const int iters = n_m * a.group;
  // Key blocks start their sweep at different query blocks, so that the dQ reductions of the blocks running
  // at once spread over the rows instead of all hitting one query block's lines in L2 together. An iteration's
  // position is (g, j): query head g of the KV group, step j of the sweep; advanced by one step per iteration,
  // so the loop has no integer division.
  const int m_rot = n_m > 0 ? n_block % n_m : 0;
  auto m0_at = [&](int j) {
    const int r = j + m_rot;
    return (m_first + (r >= n_m ? r - n_m : r)) * kM;
  };

  // Warp sub-tiles of the three product shapes.
  const int s_row0 = (warp / C::kSdPWarpsN) * C::kSdPWarpM, s_col0 = (warp % C::kSdPWarpsN) * C::kSdPWarpN;
  const int kv_row0 = (warp / C::kdKVWarpsD) * C::kdKVWarpN, kv_col0 = (warp % C::kdKVWarpsD) * C::kdKVWarpD;
  const int q_row0 = (warp / C::kdQWarpsD) * C::kdQWarpM, q_col0 = (warp % C::kdQWarpsD) * C::kdQWarpD;

  const T* q_base = static_cast<const T*>(a.q) + b * a.q_batch_stride + seq.start_q * a.q_row_stride;
  const T* do_base = static_cast<const T*>(a.dout) + b * a.do_batch_stride + seq.start_q * a.do_row_stride;
  // Query blocks with every row present and full-width aligned rows take load_full_tile.
  const bool q_whole_rows = a.vec_q && a.head_dim == kD, do_whole_rows = a.vec_do && a.head_dim_v == kD;
  // The rows' LSE and D ride in the same cp.async group as Q and dO, so their latency hides behind an iteration
  // too: thread tid < kM copies LSE row tid, thread kM + r copies D row r.
  static_assert(2 * kM <= kBwdThreads, "one thread per LSE and per D entry");
  const int vec_row = tid < kM ? tid : tid - kM;
  const float* vec_src = (tid < kM ? a.lse_log2 : a.dsum) + seq.ws_row0 + vec_row;
  float* vec_dst = (tid < kM ? sLse : sDsum) + vec_row;
  auto load_q_do = [&](int h, int m0, int stage) {
    const T* q = q_base + m0 * a.q_row_stride + h * a.q_head_stride;
    const T* dout = do_base + m0 * a.do_row_stride + h * a.do_head_stride;
    T* sq = sQ + stage * kM * kLdD;
    T* sdo = sdO + stage * kM * kLdD;
    const bool rows_present = m0 + kM <= seq.len_q;
    if (q_whole_rows && rows_present) {
      load_full_tile<T, kM, kD, kBwdThreads>(sq, kLdD, q, a.q_row_stride, tid);
    } else {
      load_tile<T, kM, kD, kBwdThreads>(sq, kLdD, q, a.q_row_stride, seq.len_q - m0, a.head_dim, a.vec_q, tid);
    }
    if (do_whole_rows && rows_present) {
      load_full_tile<T, kM, kD, kBwdThreads>(sdo, kLdD, dout, a.do_row_stride, tid);
    } else {
      load_tile<T, kM, kD, kBwdThreads>(sdo, kLdD, dout, a.do_row_stride, seq.len_q - m0, a.head_dim_v, a.vec_do,
                                        tid);
    }
    if (tid < 2 * kM) {
      // A row past the end reads row m0 (which exists) and is zero-filled.
      const float* src = vec_src + h * a.ws_head_stride + m0;
      const bool valid = m0 + vec_row < seq.len_q;
      cp_async_4(vec_dst + stage * kM, valid ? src : src - vec_row, valid);
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
    load_q_do(hk * a.group, m0_at(0), 0);
    cp_async_commit();
  }

  float acc_dk[kMiKV][kNiKV][4], acc_dv[kMiKV][kNiKV][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);

  for (int it = 0, g = 0, j = 0; it < iters; ++it) {
    const int stage = stages == 2 ? it & 1 : 0;
    const int h = hk * a.group + g;
    const int m0 = m0_at(j);
    const bool sweep_ends = j + 1 == n_m;
    const int g_next = sweep_ends ? g + 1 : g, j_next = sweep_ends ? 0 : j + 1;
    const T* sQs = sQ + stage * kM * kLdD;
    const T* sdOs = sdO + stage * kM * kLdD;

    if (stages == 2) {
      // This iteration's tiles have landed, and every warp is done with the previous iteration's P, dS and the
      // other stage, which the prefetch below overwrites.
      cp_async_wait<0>();
      __syncthreads();
      if (it + 1 < iters) load_q_do(hk * a.group + g_next, m0_at(j_next), stage ^ 1);
      cp_async_commit();
    } else {
      // One stage: once every warp is done with the previous tiles, load this iteration's and wait for them.
      if (it > 0) {
        __syncthreads();
        load_q_do(h, m0, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
      __syncthreads();
    }
    g = g_next, j = j_next;

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

    const bool need_mask =
        n0 + kN > seq.len_k || !mask.tile_fully_visible(m0, min(m0 + kM, seq.len_q), n0, n0 + kN);
    scores_to_grads<C, T, true, kExtras>(sQs + s_row0 * kLdD, sdOs + s_row0 * kLdD, sK + s_col0 * kLdD,
                                         sV + s_col0 * kLdD,
                                lse_l2, dsum, a, mask, seq_alibi(a, seq, b, h), seq_dropout(a, b, h), need_mask, m0, n0,
                                s_row0, s_col0, sP, sdS, lane);
    __syncthreads();

    // dQ += dS K (fp32 reductions into the workspace), dV += Pᵀ dO, dK += dSᵀ Q; the transposes come from
    // ldmatrix.trans on the staged tiles. kRowTest: the query block has rows past the end, whose dQ must not be
    // written; a whole block (every block but a sequence's last) compiles without the test.
    auto dq_dkdv = [&](auto row_test) {
      constexpr bool kRowTest = decltype(row_test)::value;
      auto dq_reduce = [&] {
        float acc_dq[kMiQ][kNiQ][4];
        zero_acc(acc_dq);
        warp_mma<T, kMiQ, kNiQ, kN / 16, false, true>(acc_dq, sdS + q_row0 * kLdN, kLdN, sK + q_col0, kLdD, lane);
        // The workspace rows are kD floats apart (backward_launch.cuh), a compile-time pitch: every reduction of
        // a lane addresses one base register plus an immediate offset.
        float* dq_lane = a.dq_accum + (h * a.ws_head_stride + seq.ws_row0 + m0 + q_row0) * kD + q_col0 +
                         acc_row(0, 0, lane) * kD + acc_col(0, lane);
        const int rows_left = seq.len_q - m0 - q_row0 - acc_row(0, 0, lane);
#pragma unroll
        for (int mi = 0; mi < kMiQ; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = acc_row(mi, half, 0);
#pragma unroll
            for (int ni = 0; ni < kNiQ; ++ni) {
              atomic_add_pair_if(dq_lane + row * kD + acc_col(ni, 0), acc_dq[mi][ni][half * 2],
                                 acc_dq[mi][ni][half * 2 + 1], !kRowTest || row < rows_left);
            }
          }
      };
      auto dv_product = [&] {
        warp_mma<T, kMiKV, kNiKV, kM / 16, true, true>(acc_dv, sP + kv_row0, kLdN, sdOs + kv_col0, kLdD, lane);
      };
      if constexpr (C::kDqBesideDv) {
        // The reductions and the dV product in one block of straight-line code (the deterministic-mode branch
        // goes around both), so the reductions issue between dV's mma.sync instead of in one burst that fills
        // the memory pipeline's queue.
        if (a.accumulate_dq) {
          dq_reduce();
          dv_product();
        } else {
          dv_product();
        }
      } else {
        if (a.accumulate_dq) dq_reduce();
        dv_product();
      }
      warp_mma<T, kMiKV, kNiKV, kM / 16, true, true>(acc_dk, sdS + kv_row0, kLdN, sQs + kv_col0, kLdD, lane);
    };
    if (m0 + kM <= seq.len_q) {
      dq_dkdv(std::false_type{});
    } else {
      dq_dkdv(std::true_type{});
    }
  }

  // Keys of this block that no query sees still get their (zero) gradients written here.
  const int64_t key_row = seq.start_k + n0 + kv_row0;
  T* dk = static_cast<T*>(a.dk) + b * a.dk_batch_stride + key_row * a.dk_row_stride + hk * a.dk_head_stride + kv_col0;
  T* dv = static_cast<T*>(a.dv) + b * a.dv_batch_stride + key_row * a.dv_row_stride + hk * a.dv_head_stride + kv_col0;
  store_acc<T>(acc_dk, a.scale, dk, a.dk_row_stride, n_valid - kv_row0, a.head_dim - kv_col0, a.pair_dk, lane);
  store_acc<T>(acc_dv, 1.f, dv, a.dv_row_stride, n_valid - kv_row0, a.head_dim_v - kv_col0, a.pair_dv, lane);
}

// ---------------------------------------------------------------------------------------------------------------
template <typename T, int kD, bool kCompact, bool kExtras>
__global__ void __launch_bounds__(kBwdThreads, 1) bwd_dq_kernel(const BwdKernelArgs a) {
  using C = BwdConfig<kD, kCompact>;
  constexpr int kM = C::kM, kN = C::kN, kLdD = C::kLdD, kLdN = C::kLdN;
  constexpr int kMiS = C::kSdPWarpM / 16;
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
  const auto mask = seq_mask<kExtras>(a, seq);
  const BwdAlibi alibi = seq_alibi(a, seq, b, h);
  const BwdDropout drop = seq_dropout(a, b, h);
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
  // Key blocks with every key present and full-width aligned rows take load_full_tile.
  const bool k_whole_rows = a.vec_k && a.head_dim == kD, v_whole_rows = a.vec_v && a.head_dim_v == kD;
  auto load_kv = [&](int it, int stage) {
    const int n0 = (n_first + it) * kN;
    T* sk = sK + stage * kN * kLdD;
    T* sv = sV + stage * kN * kLdD;
    const bool rows_present = n0 + kN <= seq.len_k;
    if (k_whole_rows && rows_present) {
      load_full_tile<T, kN, kD, kBwdThreads>(sk, kLdD, k_base + n0 * a.k_row_stride, a.k_row_stride, tid);
    } else {
      load_tile<T, kN, kD, kBwdThreads>(sk, kLdD, k_base + n0 * a.k_row_stride, a.k_row_stride, seq.len_k - n0,
                                        a.head_dim, a.vec_k, tid);
    }
    if (v_whole_rows && rows_present) {
      load_full_tile<T, kN, kD, kBwdThreads>(sv, kLdD, v_base + n0 * a.v_row_stride, a.v_row_stride, tid);
    } else {
      load_tile<T, kN, kD, kBwdThreads>(sv, kLdD, v_base + n0 * a.v_row_stride, a.v_row_stride, seq.len_k - n0,
                                        a.head_dim_v, a.vec_v, tid);
    }
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

    const bool need_mask =
        n0 + kN > seq.len_k || !mask.tile_fully_visible(m0, m0 + m_valid, n0, n0 + kN);
    scores_to_grads<C, T, false, kExtras>(sQ + s_row0 * kLdD, sdO + s_row0 * kLdD, sKs + s_col0 * kLdD,
                                          sVs + s_col0 * kLdD,
                                 lse_l2, dsum, a, mask, alibi, drop, need_mask, m0, n0, s_row0, s_col0, nullptr, sdS,
                                 lane);
    __syncthreads();
    warp_mma<T, kMiQ, kNiQ, kN / 16, false, true>(acc_dq, sdS + q_row0 * kLdN, kLdN, sKs + q_col0, kLdD, lane);
  }

  T* dq = static_cast<T*>(a.dq) + b * a.dq_batch_stride + (seq.start_q + m0 + q_row0) * a.dq_row_stride +
          h * a.dq_head_stride + q_col0;
  store_acc<T>(acc_dq, a.scale, dq, a.dq_row_stride, m_valid - q_row0, a.head_dim - q_col0, a.pair_dq, lane);
}

}  // namespace flashattn::cuda::sm80
