// Hopper forward: what one CTA works on and where its tiles live. The kernel arguments besides the tensor
// maps, the shared-memory carve-up (forward_config.h has the sizes), and the (batch, head, query block) of a
// CTA with the range of key tiles its mask lets it see. Included by forward_sm90.cu only.
#pragma once

#include <cstdint>

#include "common/dropout.h"
#include "common/mask.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/fp8_v_layout.h"
#include "cuda/sm90/primitives_sm90.cuh"
#include "cuda/sm90/swizzle.h"

namespace flashattn::cuda::sm90 {

// What the kernel reads besides the tensor maps; lengths and strides in elements.
struct ForwardKernelArgs {
  void* o;
  int head_dim_v;  // O's columns: at most the plan's kHeadDimV, a multiple of 8 (the epilogue's 16-byte runs)
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
  int attention_chunk;  // 0: none; narrowed like the window (MaskSpec::narrowest_chunk); kChunks kernels only
  // ALiBi and dropout run only in the kernel with kExtras (forward_sm90.cu), each when asked for.
  const float* alibi_slopes;  // null: no ALiBi; slope of (b, h) at b * alibi_batch_stride + h
  int64_t alibi_batch_stride;
  float dropout_p;            // 0: no dropout (common/dropout.h)
  DropoutRng dropout_rng;
  // e4m3 inputs: descales of (sequence, KV head) at [b * strides[0] + h_kv * strides[1]] (null: 1).
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_strides[2], k_descale_strides[2], v_descale_strides[2];
  // Tiles: num_m_tiles query tiles (kTileRows rows: a block per CTA of a cluster) x num_heads x batch, numbered
  // head-major (every query tile of one head, heaviest first under a causal mask, then the next head: CTAs
  // running at once share K/V in L2). Pipeline p of cluster c (ForwardConfig::kPipelines, kClusterCtas; a
  // cluster of one CTA unless the plan says otherwise) starts with tile c + p * clusters.
  // With a pipeline per tile that is all. In a persistent grid (fewer pipelines than tiles) a pipeline that
  // finishes a tile claims the next unclaimed one from tile_counter (zeroed before the launch; claims count from
  // clusters * kPipelines), so tiles start in order however unequal their costs. A static stride (c, c +
  // gridDim.x, ...) instead left up to 1.8x the mean work on one CTA at 16k causal (bench/results/hopper-forward.md,
  // 941cb61-17568a4).
  int num_m_tiles, num_heads;
  int num_tiles;  // below 2^30 (sm90_forward_supports), so tile + gridDim.x * kPipelines cannot overflow
  unsigned* tile_counter;  // null: static tiles, clusters * kPipelines apart
};

// One base pointer; every region is a constant offset from it (forward_config.h has the sizes), so the
// producer's 24 registers hold one address, not one per region.
template <typename Cfg>
struct SharedStorage {
  uint8_t* base;

  // The region of one of the CTA's pipelines (ForwardConfig::kPipelines).
  __device__ SharedStorage(uint8_t* raw, int pipeline)
      : base(align_to_swizzle_atom(raw) + pipeline * Cfg::kPipelineStride) {}
  static constexpr int kKOffset = Cfg::kQBytes;
  static constexpr int kVOffset = kKOffset + Cfg::kStages * Cfg::kKTileBytes;
  static constexpr int kBarrierOffset = kVOffset + Cfg::kStages * Cfg::kVTileBytes;
  __device__ uint64_t* barriers() const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset); }

  __device__ uint8_t* q() const { return base; }
  __device__ uint8_t* k() const { return base + kKOffset; }  // kStages tiles
  __device__ uint8_t* v() const { return base + kVOffset; }
  __device__ uint64_t* q_full() const { return barriers(); }
  // The consumers have finished reading Q: the next tile's Q may be loaded.
  __device__ uint64_t* q_empty() const { return barriers() + 1; }
  __device__ uint64_t* k_full() const { return barriers() + 2; }
  __device__ uint64_t* v_full() const { return k_full() + Cfg::kStages; }
  // The stage's K / V tile may be overwritten.
  __device__ uint64_t* k_empty() const { return v_full() + Cfg::kStages; }
  __device__ uint64_t* v_empty() const { return k_empty() + Cfg::kStages; }
  // Persistent grid: kTileRing claimed tile numbers; full = the slot holds the next number, empty = every
  // reader has taken it.
  static constexpr int kTileSlotWords = (kTileRing * int(sizeof(int)) + 7) / 8;  // the slots, in 8-byte words
  __device__ int* tile_slot() const { return reinterpret_cast<int*>(v_empty() + Cfg::kStages); }
  __device__ uint64_t* tile_full() const { return v_empty() + Cfg::kStages + kTileSlotWords; }
  __device__ uint64_t* tile_empty() const { return tile_full() + kTileRing; }
};

// The (batch, head, query block) of one tile and the key tiles it visits.
struct BlockWork {
  int batch, head, m_block;
  int q_row0, k_row0;  // first row of this sequence in the Q / K tensors' row dimension
  int batch_coord;     // TMA batch coordinate (0 in varlen, where the row dimension is the packed one)
  int seqlen_q, seqlen_k;
  int n_begin, n_end;  // key tiles [n_begin, n_end)
  int vt_slot0;        // e4m3: the sequence's first slot in V_t's rows (fp8_v_layout.h)
  bool has_rows;       // the tile has query rows (this CTA's block may not, in a cluster: block_work)
  // 32-bit: sm90_forward_supports bounds the lengths, the launcher narrows the window edges and the chunk. The
  // chunk is 0 (a constant) in the kernels without chunks.
  MaskSpec32 mask;
};

// Tile t as seen by the CTA of cluster rank `rank`: a tile is Cfg::kClusterCtas blocks of kBlockM rows, this
// CTA's the rank-th; the key tiles are those any row of the tile sees, the same for every CTA of the cluster
// (they share each K/V tile). A tile past a sequence's end (varlen, or rows padded to whole tiles) has no rows
// and no key tiles; a CTA whose own block is past the end still takes part in its tile's K/V stream.
template <typename Cfg, bool kChunks>
__device__ BlockWork block_work(const ForwardKernelArgs& a, int t, int rank) {
  BlockWork w;
  // CTAs start roughly in tile order, so t's order is the order in which tiles start.
  const int m_tiles = a.num_m_tiles, heads = a.num_heads;
  const int m_tile = m_tiles - 1 - t % m_tiles;  // heaviest (causal) tiles of a head first
  w.m_block = m_tile * Cfg::kClusterCtas + rank;
  const int bh = t / m_tiles;
  w.head = int(bh % heads);
  w.batch = int(bh / heads);
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
  if constexpr (Cfg::kElemBytes == 1) w.vt_slot0 = int(fp8_v_slot0(a.cu_seqlens_q != nullptr, w.k_row0, w.batch));
  w.mask = MaskSpec32::make(w.seqlen_q, w.seqlen_k, a.causal, a.window_left, a.window_right,
                            kChunks ? a.attention_chunk : 0);
  w.n_begin = w.n_end = 0;
  const int row_begin = m_tile * Cfg::kTileRows;
  w.has_rows = row_begin < w.seqlen_q;
  if (w.has_rows) {
    const int row_end = min(row_begin + Cfg::kTileRows, w.seqlen_q);
    int lo, hi;
    w.mask.key_range_for_rows(row_begin, row_end, &lo, &hi);
    if (hi > lo) {
      w.n_begin = int(lo / Cfg::kBlockN);
      w.n_end = int((hi + Cfg::kBlockN - 1) / Cfg::kBlockN);
    }
  }
  return w;
}

// mbarrier_wait for a tile ring's full barrier, on which, in a cluster (kClusterCtas > 1), rank 0's producer
// arrives after storing the tile number into this CTA: the store must be seen (cluster-scope acquire). Barriers
// that other CTAs only arrive on once they have read a buffer need no more than mbarrier_wait (the arrival is
// mbarrier_arrive_cluster_after_reads): a cluster-scope acquire costs an L1 invalidation (CCTL.IVALL).
template <typename Cfg>
__device__ __forceinline__ void pipeline_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (Cfg::kClusterCtas > 1)
    mbarrier_wait_cluster(bar, parity);
  else
    mbarrier_wait(bar, parity);
}

// The sequence of tiles one pipeline of a CTA runs (ForwardKernelArgs::tile_counter); pipeline p of every CTA of a
// cluster runs the same one. Static: tiles (clusters x kPipelines) apart, computed on each side. Claimed
// (persistent grid): the TMA thread of the pipeline in cluster rank 0 claims each next tile from the global counter
// and posts it through the tile ring of the pipeline in every CTA of the cluster; the consumer warps, and in the
// other ranks the TMA thread, read it there. Rank 0's tile_empty collects every reader's arrival.
template <typename Cfg>
struct TileSequence {
  int tile;
  unsigned posts = 0;  // tiles passed through the ring so far: slot posts % kTileRing, parity its pass's

  // A cluster's pipelines are `clusters()` apart in the first tiles, so that the grid starts on tiles 0, 1, ... .
  __device__ explicit TileSequence(int pipeline) : tile(int(blockIdx.x) / Cfg::kClusterCtas + pipeline * clusters()) {}
  __device__ static int clusters() { return int(gridDim.x) / Cfg::kClusterCtas; }
  // Tiles the grid's pipelines start on; claims count on from there.
  __device__ static int first_claim() { return clusters() * Cfg::kPipelines; }
  __device__ int slot() const { return int(posts % kTileRing); }
  __device__ uint32_t parity() const { return (posts / kTileRing) & 1u; }
  __device__ bool valid(const ForwardKernelArgs& a) const { return tile < a.num_tiles; }

  // The TMA thread, once it has issued the current tile's loads. A number past the end is posted too: it ends
  // the consumers' loops.
  __device__ void next_for_producer(const ForwardKernelArgs& a, const SharedStorage<Cfg>& sm, uint32_t rank) {
    if (!a.tile_counter) {
      tile += first_claim();
      return;
    }
    if (rank == 0) {
      tile = int(first_claim() + atomicAdd(a.tile_counter, 1u));
      mbarrier_wait(&sm.tile_empty()[slot()], parity() ^ 1u);
      sm.tile_slot()[slot()] = tile;
      mbarrier_arrive(&sm.tile_full()[slot()]);
      for (uint32_t r = 1; r < uint32_t(Cfg::kClusterCtas); ++r) {
        st_shared_cluster(cluster_shared_address(&sm.tile_slot()[slot()], r), uint32_t(tile));
        mbarrier_arrive_cluster(cluster_shared_address(&sm.tile_full()[slot()], r));
      }
    } else {
      pipeline_wait<Cfg>(&sm.tile_full()[slot()], parity());
      tile = take_posted(sm, rank);
    }
    ++posts;
  }

  // Every thread of the consumer warpgroups (one arrival per warp frees the slot).
  __device__ void next_for_consumer(const ForwardKernelArgs& a, const SharedStorage<Cfg>& sm, uint32_t rank) {
    if (!a.tile_counter) {
      tile += first_claim();
      return;
    }
    pipeline_wait<Cfg>(&sm.tile_full()[slot()], parity());
    // Lane 0 reads the slot and frees it (its arrival orders its own read before the producer's next write) and
    // broadcasts the number: the shuffle also tells the compiler that every lane holds the same tile, so the
    // loop bounds, ring positions and descriptors derived from it stay in uniform registers.
    const bool leader = threadIdx.x % 32 == 0;
    const int claimed = leader ? take_posted(sm, rank) : 0;
    tile = __shfl_sync(0xffffffffu, claimed, 0);
    ++posts;
  }

  // One reader's turn at the current slot, whose full barrier has completed: the posted tile number, and the
  // reader's arrival on rank 0's tile_empty (rank 0's producer posts every CTA's numbers). The arrival lets rank 0
  // overwrite the slot, in another CTA remotely: there the read must have returned first (ld_shared_acquire_cluster);
  // in rank 0 read and arrival are ordered at CTA scope.
  __device__ int take_posted(const SharedStorage<Cfg>& sm, uint32_t rank) const {
    int* posted = &sm.tile_slot()[slot()];
    if (rank == 0) {
      const int t = *posted;
      mbarrier_arrive(&sm.tile_empty()[slot()]);
      return t;
    }
    const int t = ld_shared_acquire_cluster(posted);
    mbarrier_arrive_cluster_after_reads(cluster_shared_address(&sm.tile_empty()[slot()], 0));
    return t;
  }
};

}  // namespace flashattn::cuda::sm90
