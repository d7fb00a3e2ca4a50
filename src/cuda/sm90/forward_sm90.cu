// Hopper forward: O = softmax(Q Kᵀ · scale) V and LSE, fp16/bf16 in, fp32 accumulation, for head dims 64, 128,
// 256 (d_v == d), with causal / sliding-window masks, softcap, GQA, varlen and arbitrary tails.
//
// Warp roles (one CTA = one block of kBlockM = 128 query rows of one (batch, head), 384 threads):
//   warpgroup 0  producer: gives registers away (setmaxnreg 24); one thread issues TMA loads of the Q block
//                (once) and of K and V tiles into a kStages-deep shared-memory ring (full/empty mbarriers).
//   warpgroups 1, 2  consumers (setmaxnreg 240), 64 query rows each: per key tile S = Q Kᵀ (wgmma, both from
//                shared memory), mask + softcap, online softmax in registers (exp2 with scale·log2e folded into
//                one FFMA), then O += P V (wgmma with P from registers, V from shared memory, N-major). After
//                the last tile: O / rowsum written to global memory, LSE = (m·scale·log2e + log2 l)·ln2.
// Key tiles run from the last one down, so the masked diagonal tiles of a causal block come first.
// The CTAs of the heaviest query blocks (largest index, most keys under a causal mask) are launched first.
//
// Shared memory and tile sizes: forward_config.h (112 / 160 / 192 KB for hd 64 / 128 / 256).
// Preconditions (sm90_forward_supports): compute capability 9.0, fp16/bf16, d == d_v in {64, 128, 256}, every
// row/head/batch stride of Q, K, V, O a multiple of 8 elements and 16-byte aligned bases (TMA's rules).
// Rows past a sequence's end are loaded (zeros past the tensor, the next sequence's rows in varlen) but masked
// as keys and never written as queries.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend.h"
#include "common/mask.h"
#include "cuda/check.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_sm90.h"
#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {
namespace {

// What the kernel reads besides the tensor maps; lengths and strides in elements.
struct ForwardArgs {
  void* o;
  float* lse;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  const int32_t* cu_seqlens_q;  // null: padded batch
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // padded batch only
  int heads_per_kv;        // GQA group size
  float scale_log2;        // softmax_scale * log2(e), or log2(e) when softcap folds the scale in
  float softcap;           // 0 = off
  float softcap_in_scale;  // softmax_scale / softcap
  bool causal;
  int window_left, window_right;
};

template <int kHeadDim>
struct SharedStorage {
  using Cfg = ForwardConfig<kHeadDim>;
  uint8_t* q;
  uint8_t* k;  // kStages tiles
  uint8_t* v;
  uint64_t* q_full;
  uint64_t* k_full;
  uint64_t* v_full;
  uint64_t* empty;    // the stage's K (and, in the serial ordering, its V) may be overwritten
  uint64_t* empty_v;  // overlapped ordering only: the stage's V may be overwritten

  __device__ explicit SharedStorage(uint8_t* raw) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw);
    uint8_t* base = reinterpret_cast<uint8_t*>((p + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));
    q = base;
    k = q + Cfg::kQBytes;
    v = k + Cfg::kStages * Cfg::kKVTileBytes;
    q_full = reinterpret_cast<uint64_t*>(v + Cfg::kStages * Cfg::kKVTileBytes);
    k_full = q_full + 1;
    v_full = k_full + Cfg::kStages;
    empty = v_full + Cfg::kStages;
    empty_v = empty + Cfg::kStages;
  }
};

// The (batch, head, query block) a CTA owns and the key tiles it visits.
struct BlockWork {
  int batch, head, m_block;
  int q_row0, k_row0;  // first row of this sequence in the Q / K tensors' row dimension
  int batch_coord;     // TMA batch coordinate (0 in varlen, where the row dimension is the packed one)
  int seqlen_q, seqlen_k;
  int n_begin, n_end;  // key tiles [n_begin, n_end)
  MaskSpec mask;
};

template <int kHeadDim>
__device__ BlockWork block_work(const ForwardArgs& a) {
  using Cfg = ForwardConfig<kHeadDim>;
  BlockWork w;
  w.batch = blockIdx.z;
  w.head = blockIdx.y;
  w.m_block = gridDim.x - 1 - blockIdx.x;  // heaviest (causal) blocks first
  if (a.cu_seqlens_q) {
    w.q_row0 = a.cu_seqlens_q[w.batch];
    w.k_row0 = a.cu_seqlens_k[w.batch];
    w.seqlen_q = a.cu_seqlens_q[w.batch + 1] - w.q_row0;
    w.seqlen_k = a.cu_seqlens_k[w.batch + 1] - w.k_row0;
    w.batch_coord = 0;
  } else {
    w.q_row0 = w.k_row0 = 0;
    w.seqlen_q = a.seqlen_q;
    w.seqlen_k = a.seqlen_k;
    w.batch_coord = w.batch;
  }
  w.mask = MaskSpec::make(w.seqlen_q, w.seqlen_k, a.causal, a.window_left, a.window_right);
  w.n_begin = w.n_end = 0;
  const int row_begin = w.m_block * Cfg::kBlockM;
  if (row_begin < w.seqlen_q) {
    const int row_end = min(row_begin + Cfg::kBlockM, w.seqlen_q);
    int64_t lo, hi;
    w.mask.key_range_for_rows(row_begin, row_end, &lo, &hi);
    if (hi > lo) {
      w.n_begin = int(lo / Cfg::kBlockN);
      w.n_end = int((hi + Cfg::kBlockN - 1) / Cfg::kBlockN);
    }
  }
  return w;
}

// ---- producer: one thread streams Q once, then K/V tiles through the ring ----
// kSplitRelease: K and V of a stage are freed separately (empty / empty_v), as the overlapped ordering frees
// K as soon as S has landed but V only after P V; the serial ordering frees both at once through `empty`.
template <int kHeadDim, bool kSplitRelease>
__device__ void produce(const SharedStorage<kHeadDim>& sm, const BlockWork& w, int kv_head, const CUtensorMap* tm_q,
                        const CUtensorMap* tm_k, const CUtensorMap* tm_v) {
  using Cfg = ForwardConfig<kHeadDim>;
  constexpr int kPanels = kHeadDim / kPanelCols;
  mbarrier_arrive_expect_tx(sm.q_full, Cfg::kQBytes);
#pragma unroll
  for (int p = 0; p < kPanels; ++p)
    tma_load_4d(sm.q + p * Cfg::kBlockM * kSwizzleBytes, tm_q, p * kPanelCols, w.q_row0 + w.m_block * Cfg::kBlockM,
                w.head, w.batch_coord, sm.q_full);
  RingPosition<Cfg::kStages> pos;
  for (int n = w.n_end - 1; n >= w.n_begin; --n) {
    mbarrier_wait(&sm.empty[pos.index], pos.phase ^ 1u);
    const int row = w.k_row0 + n * Cfg::kBlockN;
    uint8_t* k_tile = sm.k + pos.index * Cfg::kKVTileBytes;
    uint8_t* v_tile = sm.v + pos.index * Cfg::kKVTileBytes;
    mbarrier_arrive_expect_tx(&sm.k_full[pos.index], Cfg::kKVTileBytes);
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
      tma_load_4d(k_tile + p * Cfg::kBlockN * kSwizzleBytes, tm_k, p * kPanelCols, row, kv_head, w.batch_coord,
                  &sm.k_full[pos.index]);
    if constexpr (kSplitRelease) mbarrier_wait(&sm.empty_v[pos.index], pos.phase ^ 1u);
    mbarrier_arrive_expect_tx(&sm.v_full[pos.index], Cfg::kKVTileBytes);
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
      tma_load_4d(v_tile + p * Cfg::kBlockN * kSwizzleBytes, tm_v, p * kPanelCols, row, kv_head, w.batch_coord,
                  &sm.v_full[pos.index]);
    pos.advance();
  }
}

// ---- consumer: one warpgroup, 64 query rows ----
// The per-warpgroup state and the steps of one key tile; the two drivers below order them differently.
template <typename T, int kHeadDim>
struct Consumer {
  using Cfg = ForwardConfig<kHeadDim>;
  static constexpr int kN = Cfg::kBlockN;
  using Scores = float[kN / 2];                    // S (then P) of one tile: accumulator layout
  using PFragments = uint32_t[kN / kWgmmaK][4];    // P as the A operand of P V, 16 keys per fragment

  const SharedStorage<kHeadDim>& sm;
  const BlockWork& w;
  const ForwardArgs& a;
  int lane, quad;
  int row[2];  // this thread's two rows (accumulator layout), relative to the sequence start
  int64_t key_lo[2], key_hi[2];
  int block_row_begin, block_row_end;
  uint32_t q_addr;
  float o[kHeadDim / 2];
  float row_max[2] = {-INFINITY, -INFINITY};  // in score units (after softcap), not yet scaled to log2
  float row_sum[2] = {0.f, 0.f};              // this thread's part; the quad's four parts add up at the end

  __device__ Consumer(const SharedStorage<kHeadDim>& sm_, const BlockWork& w_, const ForwardArgs& a_, int wg)
      : sm(sm_), w(w_), a(a_) {
    const int t = threadIdx.x % kWarpgroupThreads;
    const int warp = t / 32;
    lane = t % 32;
    quad = lane % 4;
    row[0] = w.m_block * Cfg::kBlockM + wg * kWgmmaRows + 16 * warp + lane / 4;
    row[1] = row[0] + 8;
    for (int r = 0; r < 2; ++r) w.mask.key_range(row[r], &key_lo[r], &key_hi[r]);
    block_row_begin = w.m_block * Cfg::kBlockM;
    block_row_end = min(block_row_begin + Cfg::kBlockM, w.seqlen_q);
    q_addr = smem_address(sm.q) + wg * kWgmmaRows * kSwizzleBytes;
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  }

  // S = Q Kᵀ, issued and committed (not waited for). K-major operands; k-step kk is panel kk / 4, 32 bytes
  // further per step inside a row.
  __device__ void issue_qk(Scores& s, int stage) {
    const uint32_t k_addr = smem_address(sm.k + stage * Cfg::kKVTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kWgmmaK; ++kk) {
      const uint32_t step = (kk % 4) * kWgmmaK * 2;
      wgmma_ss<T, kN, 0>(s, make_desc_k_major(q_addr + (kk / 4) * Cfg::kBlockM * kSwizzleBytes + step),
                         make_desc_k_major(k_addr + (kk / 4) * kN * kSwizzleBytes + step), kk > 0);
    }
    wgmma_commit();
  }

  // O += P V, issued and committed. V is N-major: one panel (kN rows) per 64 columns of head dim. P is
  // converted before the fence: a register write between two wgmmas would make the compiler serialise them.
  __device__ void issue_pv(const PFragments& p, int stage) {
    const uint32_t v_addr = smem_address(sm.v + stage * Cfg::kKVTileBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / kWgmmaK; ++kk)
      wgmma_rs<T, kHeadDim, 1>(o, p[kk], make_desc_mn_major(v_addr + kk * kWgmmaK * kSwizzleBytes, kN * kSwizzleBytes),
                               true);
    wgmma_commit();
  }

  // Softcap, then the mask (only on tiles that cross a mask edge or the end of the keys).
  __device__ void transform_scores(Scores& s, int n) {
    if (a.softcap > 0.f) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) s[i] = a.softcap * tanhf(s[i] * a.softcap_in_scale);
    }
    const int key0 = n * kN;
    const bool needs_mask =
        key0 + kN > w.seqlen_k || !w.mask.tile_fully_visible(block_row_begin, block_row_end, key0, key0 + kN);
    if (needs_mask) {
#pragma unroll
      for (int j = 0; j < kN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * j + 2 * quad + (e & 1);
          const int r = e >> 1;
          if (key < key_lo[r] || key >= key_hi[r]) s[4 * j + e] = -INFINITY;
        }
    }
  }

  // Online softmax: raises the running maxima, turns S into P in place, updates the row sums and returns in
  // `rescale` the factor O must still be multiplied by. A row whose maximum is still -inf (nothing visible yet)
  // subtracts 0, so exp2(-inf) = 0 and the factor exp2(-inf) = 0 clears nothing that was not already 0.
  __device__ void softmax(Scores& s, float (&rescale)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = quad_max(mx);
      const float base = mx == -INFINITY ? 0.f : mx * a.scale_log2;
      rescale[r] = exp2_approx(row_max[r] * a.scale_log2 - base);
      row_max[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        // One FFMA and one MUFU.EX2 per score: exp(scale·s - scale·m) = 2^(s·scale·log2e - m·scale·log2e).
        const float p0 = exp2_approx(fmaf(s[4 * j + 2 * r], a.scale_log2, -base));
        const float p1 = exp2_approx(fmaf(s[4 * j + 2 * r + 1], a.scale_log2, -base));
        s[4 * j + 2 * r] = p0;
        s[4 * j + 2 * r + 1] = p1;
        sum += p0 + p1;
      }
      row_sum[r] = row_sum[r] * rescale[r] + sum;
    }
  }

  __device__ void rescale_o(const float (&rescale)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= rescale[e >> 1];
  }

  __device__ static void to_fragments(PFragments& p, const Scores& s) {
#pragma unroll
    for (int kk = 0; kk < kN / kWgmmaK; ++kk) accumulator_to_a_fragment<T>(p[kk], s, kk);
  }

  // Both tiles of a stage are consumed: one arrival per warp (the wgmma reads completed for the whole
  // warpgroup once this warp's wait returned). release_v is the overlapped ordering's separate V release.
  __device__ void release(int stage) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.empty[stage]);
  }
  __device__ void release_v(int stage) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&sm.empty_v[stage]);
  }

  // Normalise, write O (16-bit pairs) and the LSE of the rows inside the sequence.
  __device__ void epilogue() {
    constexpr float kLn2 = 0.69314718055994530942f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = quad_sum(row_sum[r]);
      const float inv = total > 0.f ? 1.f / total : 0.f;
      if (row[r] >= w.seqlen_q) continue;
      const int64_t grow = int64_t(w.q_row0) + row[r];
      T* out = static_cast<T*>(a.o) + grow * a.o_row_stride + int64_t(w.head) * a.o_head_stride +
               (a.cu_seqlens_q ? 0 : int64_t(w.batch) * a.o_batch_stride);
#pragma unroll
      for (int j = 0; j < kHeadDim / 8; ++j) {
        const uint32_t bits = pack_pair<T>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * quad) = bits;
      }
      if (a.lse && quad == 0) {
        const float lse = total > 0.f ? (row_max[r] * a.scale_log2 + log2f(total)) * kLn2 : -INFINITY;
        float* dst = a.cu_seqlens_q ? a.lse + int64_t(w.head) * a.lse_head_stride + grow
                                    : a.lse + int64_t(w.batch) * a.lse_batch_stride +
                                          int64_t(w.head) * a.lse_head_stride + row[r];
        *dst = lse;
      }
    }
  }
};

// v1 order: per tile, S = Q Kᵀ and wait, softmax, O += P V and wait. The two consumer warpgroups overlap
// each other only as the warp schedulers happen to interleave them.
template <typename T, int kHeadDim>
__device__ void consume_serial(Consumer<T, kHeadDim>& c) {
  using C = Consumer<T, kHeadDim>;
  const BlockWork& w = c.w;
  if (w.n_end <= w.n_begin) return;
  mbarrier_wait(c.sm.q_full, 0);
  RingPosition<C::Cfg::kStages> pos;
  for (int n = w.n_end - 1; n >= w.n_begin; --n) {
    typename C::Scores s;
    mbarrier_wait(&c.sm.k_full[pos.index], pos.phase);
    c.issue_qk(s, pos.index);
    wgmma_wait<0>();
    fence_registers(s);
    c.transform_scores(s, n);
    float rescale[2];
    c.softmax(s, rescale);
    c.rescale_o(rescale);
    typename C::PFragments p;
    C::to_fragments(p, s);
    mbarrier_wait(&c.sm.v_full[pos.index], pos.phase);
    c.issue_pv(p, pos.index);
    wgmma_wait<0>();
    fence_registers(c.o);
    c.release(pos.index);
    pos.advance();
  }
}

// Ping-pong between the two consumer warpgroups: each issues its matrix products only in its turn (a named
// barrier per warpgroup; the other arrives on it after issuing), so one warpgroup's softmax runs while the
// other's products occupy the tensor cores.
__device__ __forceinline__ void pingpong_wait_turn(int wg) { named_barrier_sync(kPingPongBarrier0 + wg, 2 * kWarpgroupThreads); }
__device__ __forceinline__ void pingpong_pass_turn(int wg) {
  named_barrier_arrive(kPingPongBarrier0 + (1 - wg), 2 * kWarpgroupThreads);
}

// v2 order (intra-warpgroup overlap + ping-pong): the products of tile n, S_n = Q K_nᵀ and O += P_{n+1} V_{n+1}
// (the previous tile, keys run downwards), are issued together; the softmax of S_n runs while P V is still on
// the tensor cores, and O is rescaled once that product has landed. K_n is released as soon as S_n has landed
// and V_{n+1} after its product, so the producer refills a K slot one iteration before it is needed.
template <typename T, int kHeadDim>
__device__ void consume_overlapped(Consumer<T, kHeadDim>& c, int wg) {
  using C = Consumer<T, kHeadDim>;
  const BlockWork& w = c.w;
  if (w.n_end <= w.n_begin) return;
  if (wg == 1) pingpong_pass_turn(wg);  // warpgroup 0 goes first
  mbarrier_wait(c.sm.q_full, 0);
  RingPosition<C::Cfg::kStages> pos;
  typename C::Scores s;
  typename C::PFragments p;
  float rescale[2];
  // First tile: S only.
  mbarrier_wait(&c.sm.k_full[pos.index], pos.phase);
  pingpong_wait_turn(wg);
  c.issue_qk(s, pos.index);
  pingpong_pass_turn(wg);
  wgmma_wait<0>();
  fence_registers(s);
  c.release(pos.index);
  c.transform_scores(s, w.n_end - 1);
  c.softmax(s, rescale);  // O is still 0: nothing to rescale
  C::to_fragments(p, s);
  int prev = pos.index;
  uint32_t prev_phase = pos.phase;
  pos.advance();
  for (int n = w.n_end - 2; n >= w.n_begin; --n) {
    mbarrier_wait(&c.sm.k_full[pos.index], pos.phase);
    mbarrier_wait(&c.sm.v_full[prev], prev_phase);
    pingpong_wait_turn(wg);
    c.issue_qk(s, pos.index);
    c.issue_pv(p, prev);
    pingpong_pass_turn(wg);
    wgmma_wait<1>();  // S_n has landed (groups complete in order); P V may still run
    fence_registers(s);
    c.release(pos.index);
    c.transform_scores(s, n);
    c.softmax(s, rescale);
    wgmma_wait<0>();
    fence_registers(c.o);
    c.rescale_o(rescale);
    c.release_v(prev);
    C::to_fragments(p, s);
    prev = pos.index;
    prev_phase = pos.phase;
    pos.advance();
  }
  // Last tile's P V.
  mbarrier_wait(&c.sm.v_full[prev], prev_phase);
  pingpong_wait_turn(wg);
  c.issue_pv(p, prev);
  pingpong_pass_turn(wg);
  wgmma_wait<0>();
  fence_registers(c.o);
  c.release_v(prev);
}

template <typename T, int kHeadDim, bool kOverlap>
__global__ void __launch_bounds__(ForwardConfig<kHeadDim>::kThreads, 1)
    forward_kernel(const __grid_constant__ ForwardArgs args, const __grid_constant__ CUtensorMap tm_q,
                   const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
  using Cfg = ForwardConfig<kHeadDim>;
  extern __shared__ uint8_t smem_raw[];
  const BlockWork w = block_work<kHeadDim>(args);
  if (w.m_block * Cfg::kBlockM >= w.seqlen_q) return;  // a varlen sequence shorter than the longest: no rows
  SharedStorage<kHeadDim> sm(smem_raw);
  if (threadIdx.x == 0) {
    mbarrier_init(sm.q_full, 1);
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbarrier_init(&sm.k_full[s], 1);
      mbarrier_init(&sm.v_full[s], 1);
      mbarrier_init(&sm.empty[s], Cfg::kConsumerWarps);
      mbarrier_init(&sm.empty_v[s], Cfg::kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / kWarpgroupThreads;
  if (wg == 0) {
    setmaxnreg_decrease<Cfg::kProducerRegisters>();
    if (threadIdx.x == 0 && w.n_end > w.n_begin) {
      tma_prefetch_map(&tm_q);
      tma_prefetch_map(&tm_k);
      tma_prefetch_map(&tm_v);
      produce<kHeadDim, kOverlap>(sm, w, w.head / args.heads_per_kv, &tm_q, &tm_k, &tm_v);
    }
  } else {
    setmaxnreg_increase<Cfg::kConsumerRegisters>();
    Consumer<T, kHeadDim> c(sm, w, args, wg - 1);
    if constexpr (kOverlap)
      consume_overlapped(c, wg - 1);
    else
      consume_serial(c);
    c.epilogue();
  }
}

}  // namespace
}  // namespace flashattn::cuda::sm90

namespace flashattn::detail {
namespace {

using cuda::sm90::ForwardConfig;

bool stride_ok(int64_t s) { return s % 8 == 0; }  // 16 bytes of 16-bit elements: TMA's stride unit
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename T, int kHeadDim>
Status launch(const FwdParams& p, Sm90ForwardVariant variant) {
  using Cfg = ForwardConfig<kHeadDim>;
  const bool varlen = p.is_varlen();
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t batch_dim = varlen ? 1 : p.batch;
  const dim3 grid(unsigned((p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM), unsigned(p.heads_q), unsigned(p.batch));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return Status::success();
  // In varlen the batch dimension has extent 1 and is never stepped; any valid stride will do.
  auto batch_stride = [&](int64_t s, int64_t row_stride, int64_t rows) {
    return varlen ? row_stride * std::max<int64_t>(rows, 1) : s;
  };
  // With no keys at all the kernel never reads K or V (every row is empty), but the maps still need an address.
  const void* k_base = rows_k > 0 ? p.k : p.q;
  const void* v_base = rows_k > 0 ? p.v : p.q;
  CUtensorMap tm_q, tm_k, tm_v;
  {
    const int64_t dims[4] = {kHeadDim, rows_q, p.heads_q, batch_dim};
    const int64_t strides[3] = {p.q_row_stride, p.q_head_stride, batch_stride(p.q_batch_stride, p.q_row_stride, rows_q)};
    Status st = make_tensor_map_sw128(&tm_q, p.q, p.dtype, dims, strides, Cfg::kBlockM);
    if (!st.ok()) return st;
  }
  {
    const int64_t dims[4] = {kHeadDim, rows_k, p.heads_kv, batch_dim};
    const int64_t strides[3] = {p.k_row_stride, p.k_head_stride, batch_stride(p.k_batch_stride, p.k_row_stride, rows_k)};
    Status st = make_tensor_map_sw128(&tm_k, k_base, p.dtype, dims, strides, Cfg::kBlockN);
    if (!st.ok()) return st;
    const int64_t vstrides[3] = {p.v_row_stride, p.v_head_stride, batch_stride(p.v_batch_stride, p.v_row_stride, rows_k)};
    st = make_tensor_map_sw128(&tm_v, v_base, p.dtype, dims, vstrides, Cfg::kBlockN);
    if (!st.ok()) return st;
  }

  cuda::sm90::ForwardArgs a{};
  a.o = p.o;
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
  a.window_left = int(p.window_left);
  a.window_right = int(p.window_right);

  auto kernel = variant == Sm90ForwardVariant::overlapped ? cuda::sm90::forward_kernel<T, kHeadDim, true>
                                                         : cuda::sm90::forward_kernel<T, kHeadDim, false>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, static_cast<cudaStream_t>(p.stream)>>>(a, tm_q, tm_k, tm_v);
  return cuda_status(cudaGetLastError(), "cuda_sm90 forward launch");
}

template <typename T>
Status launch_head_dim(const FwdParams& p, Sm90ForwardVariant variant) {
  switch (p.head_dim) {
    case 64: return launch<T, 64>(p, variant);
    case 128: return launch<T, 128>(p, variant);
    case 256: return launch<T, 256>(p, variant);
    default: return Status::unsupported("cuda_sm90: head dim " + std::to_string(p.head_dim) + " (runs 64, 128, 256)");
  }
}

}  // namespace

Status sm90_forward_supports(const FwdParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return Status::unsupported(std::string("cuda_sm90: runs float16 and bfloat16; got ") + dtype_name(p.dtype));
  const int cc = cuda_compute_capability_impl(p.device.index);
  if (cc != 90)
    return Status::unsupported("cuda_sm90: needs compute capability 9.0 (sm_90a code), device " +
                               std::to_string(p.device.index) + " has " + std::to_string(cc / 10) + "." +
                               std::to_string(cc % 10));
  if (p.head_dim != p.head_dim_v)
    return Status::unsupported("cuda_sm90: head_dim_v != head_dim is not implemented (cuda_sm80 runs it)");
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return Status::unsupported("cuda_sm90: head dim " + std::to_string(p.head_dim) + " (runs 64, 128, 256)");
  const bool varlen = p.is_varlen();
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride,
                             varlen ? 0 : p.q_batch_stride, varlen ? 0 : p.k_batch_stride,
                             varlen ? 0 : p.v_batch_stride, varlen ? 0 : p.o_batch_stride};
  for (int64_t s : strides)
    if (!stride_ok(s))
      return Status::unsupported("cuda_sm90: TMA needs every row/head/batch stride to be a multiple of 8 elements");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return Status::unsupported("cuda_sm90: TMA needs 16-byte aligned Q, K, V, O");
  const int64_t kInt32Max = 2147483647;
  if (p.seqlen_q > kInt32Max || p.seqlen_k > kInt32Max || p.total_q > kInt32Max || p.total_k > kInt32Max)
    return Status::unsupported("cuda_sm90: sequence lengths past 2^31");
  if (p.heads_q > 65535 || p.batch > 65535) return Status::unsupported("cuda_sm90: more than 65535 heads or batches");
  return Status::success();
}

Status sm90_forward_run(const FwdParams& p, Sm90ForwardVariant variant) {
  Status st = sm90_forward_supports(p);
  if (!st.ok()) return st;
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  return p.dtype == DType::bf16 ? launch_head_dim<__nv_bfloat16>(p, variant) : launch_head_dim<__half>(p, variant);
}

}  // namespace flashattn::detail
