// Hopper forward: what one CTA works on and where its tiles live. The kernel arguments besides the tensor
// maps, the shared-memory carve-up (forward_config.h has the sizes), and the (batch, head, query block) of a
// CTA with the range of key tiles its mask lets it see. Included by forward_sm90.cu only.
#pragma once

#include <cstdint>

#include "common/mask.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/swizzle.h"

namespace flashattn::cuda::sm90 {

// What the kernel reads besides the tensor maps; lengths and strides in elements.
struct ForwardKernelArgs {
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
  // Order of the CTAs' (batch, head, query block) tiles. 0: head-major (every query block of one head, heaviest
  // first, then the next head): neighbouring CTAs share K/V in L2. k > 0: heads in sections of k, and inside a
  // section the heaviest query blocks of all k heads first (longest-processing-time order, for masks whose
  // blocks differ in cost), so the last wave holds the cheapest blocks; k is sized so that a section's K/V fit
  // in L2 (forward_sm90.cu).
  int heads_per_section;
  // Tiles: num_m_blocks query blocks x num_heads x batch, numbered in the order above. CTA c takes tiles c,
  // c + gridDim.x, ...: one tile per CTA when the grid has a CTA per tile, several in a persistent grid.
  int num_m_blocks, num_heads;
  int64_t num_tiles;
};

template <typename Cfg>
struct SharedStorage {
  uint8_t* q;
  uint8_t* k;  // kStages tiles
  uint8_t* v;
  uint64_t* q_full;
  uint64_t* q_empty;  // the consumers have finished reading Q: the next tile's Q may be loaded
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
    q_empty = q_full + 1;
    k_full = q_empty + 1;
    v_full = k_full + Cfg::kStages;
    empty = v_full + Cfg::kStages;
    empty_v = empty + Cfg::kStages;
  }
};

// The (batch, head, query block) of one tile and the key tiles it visits.
struct BlockWork {
  int batch, head, m_block;
  int q_row0, k_row0;  // first row of this sequence in the Q / K tensors' row dimension
  int batch_coord;     // TMA batch coordinate (0 in varlen, where the row dimension is the packed one)
  int seqlen_q, seqlen_k;
  int n_begin, n_end;  // key tiles [n_begin, n_end)
  MaskSpec mask;
};

template <typename Cfg>
__device__ BlockWork block_work(const ForwardKernelArgs& a, int64_t t) {
  BlockWork w;
  // CTAs start roughly in block order, and a persistent CTA walks its tiles upwards, so t's order is the
  // order in which tiles start.
  const int m_blocks = a.num_m_blocks, heads = a.num_heads;
  const int64_t num_bh = a.num_tiles / m_blocks;
  int64_t bh;
  if (a.heads_per_section == 0) {
    w.m_block = m_blocks - 1 - int(t % m_blocks);  // heaviest (causal) blocks of a head first
    bh = t / m_blocks;
  } else {
    const int64_t section_tiles = int64_t(m_blocks) * a.heads_per_section;
    const int64_t section = t / section_tiles, within = t % section_tiles;
    const int64_t in_section = min(int64_t(a.heads_per_section), num_bh - section * a.heads_per_section);
    w.m_block = m_blocks - 1 - int(within / in_section);
    bh = section * a.heads_per_section + within % in_section;
  }
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

}  // namespace flashattn::cuda::sm90
