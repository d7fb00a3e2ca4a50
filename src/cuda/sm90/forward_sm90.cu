// Hopper forward: O = softmax(Q Kᵀ · scale) V and LSE, fp16/bf16 in, fp32 accumulation, for head dims d and d_v
// that are multiples of 8 up to 256, in buckets of 64, 128, 192, 256, 128 / 64 and 192 / 128 (d_v in the bucket
// below d's; support_checks.h: columns past d / d_v are TMA's zeros), with causal / sliding-window masks, softcap,
// ALiBi, dropout, GQA, varlen and arbitrary tails.
// ALiBi and dropout run in a kernel of their own (kExtras), so that the plain kernel's registers stay as they were.
//
// Work: tiles of kBlockM = 64 · (consumer warpgroups) query rows of one (batch, head), numbered head-major
// (forward_tiles.cuh). A CTA runs kPipelines independent pipelines (forward_config.h; one, or three at hd 64 on
// short sequences), each with its own buffers, barriers and tile sequence. A persistent grid of kCtasPerSm CTAs
// per SM (two with a single consumer warpgroup, else one) whose pipelines claim the next tile from a global
// counter as they finish one (TileSequence), or, when forced (Sm90Grid, forward_sm90.h), a pipeline per tile.
// Clusters (kClusterCtas = 2, hd 64's pipelines): a tile is two blocks, one per CTA of the cluster, which share
// each K / V tile: every CTA TMA-multicasts its half of it into both (half the L2 reads per product); rank 0's
// producer claims the tiles and posts them into both CTAs' tile rings.
// Warp roles (128 · (1 + consumer warpgroups of all pipelines) threads):
//   warpgroup 0  producer: gives registers away (setmaxnreg); lane 0 of warp p issues pipeline p's TMA loads of
//                each tile's Q block and of its K and V tiles into a kStages-deep shared-memory ring (full/empty
//                mbarriers; Q has its own full/empty pair so the next Q loads once the last S has landed); in a
//                persistent grid it also claims the pipeline's next tile and posts it to its consumers.
//   warpgroups 1..  consumers (setmaxnreg), 64 query rows each, pipeline by pipeline: per key tile S = Q Kᵀ
//                (wgmma, both from shared memory), mask + softcap, online softmax in registers (exp2 with scale·log2e
//                folded into one FFMA), then O += P V (wgmma with P from registers, V from shared memory, N-major).
//                After the last key tile: O / rowsum written to global memory in 16-byte runs (the quad's lanes swap
//                column pairs first), LSE = (m·scale·log2e + log2 l)·ln2.
// The consumers' steps overlap (forward_mainloop.cuh): S of tile n is issued with P V of tile n+1 and the
// softmax runs under P V, the consumer warpgroups taking turns to issue on named barriers where the plan says so
// (IssueOrder). KernelPlan (forward_config.h) picks the tile set per head dim and mask, and by key count where a
// plan names a ShortKeysPlan (launch_plan_for_keys).
// Key tiles run from the last one down, so the masked diagonal tiles of a causal block come first; a head's
// heaviest query blocks (largest index, most keys under a causal mask) start first.
//
// Shared memory and tile sizes: forward_config.h (120 to 224 KB per CTA). Files: this one (kernel, host launcher,
// support check), forward_tiles.cuh (arguments, shared-memory carve-up, a tile's work), forward_mainloop.cuh
// (producer, consumer steps and their order, epilogue), primitives_sm90.cuh.
// Preconditions (sm90_forward_supports): compute capability 9.0, fp16/bf16, d and d_v multiples of 8 up to 256,
// every row/head/batch stride of Q, K, V, O a multiple of 8 elements and 16-byte aligned bases (TMA's rules).
// Rows past a sequence's end are loaded (zeros past the tensor, the next sequence's rows in varlen) but masked
// as keys and never written as queries.
#include <type_traits>

#include "backend.h"
#include "cuda/check.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_launch.cuh"
#include "cuda/sm90/forward_sm90.h"
#include "cuda/sm90/fp8_v_layout.h"
#include "cuda/sm90/support_checks.h"

namespace flashattn::detail {
namespace {

using sm90_checks::aligned;
using sm90_checks::tma_stride_ok;
using sm90_forward::launch;

template <typename T, typename Plan, bool kExtras>
Status launch_plan_for_keys(const FwdParams& p, Sm90Grid grid) {
  if constexpr (!std::is_void_v<typename Plan::ShortKeysPlan>) {
    if (p.seqlen_k <= Plan::kShortKeys) return launch<T, T, typename Plan::ShortKeysPlan, kExtras>(p, grid);
  }
  return launch<T, T, Plan, kExtras>(p, grid);
}

template <typename T, typename Plan>
Status launch_plan_for_extras(const FwdParams& p, Sm90Grid grid) {
  return p.has_extras() ? launch_plan_for_keys<T, Plan, true>(p, grid) : launch_plan_for_keys<T, Plan, false>(p, grid);
}

// A plan whose V and O are narrower than the bucket (kHeadDimV < kHeadDim) has no ALiBi / dropout kernels:
// launch_planned_values sends those calls to the bucket's plan.
template <typename T, int kHeadDim, int kHeadDimV = kHeadDim>
Status launch_planned(const FwdParams& p, Sm90Grid grid) {
  using Masked = cuda::sm90::KernelPlan<kHeadDim, true, kHeadDimV>;
  using Unmasked = cuda::sm90::KernelPlan<kHeadDim, false, kHeadDimV>;
  if constexpr (kHeadDimV == kHeadDim) {
    return p.has_mask() ? launch_plan_for_extras<T, Masked>(p, grid) : launch_plan_for_extras<T, Unmasked>(p, grid);
  } else {
    return p.has_mask() ? launch_plan_for_keys<T, Masked, false>(p, grid)
                        : launch_plan_for_keys<T, Unmasked, false>(p, grid);
  }
}

// The bucket's plan, or, where d_v fits kHeadDimV (the bucket below: 128 / 64, MLA's 192 / 128), the plan whose V
// and O stop there (forward_config.h); ALiBi, dropout and chunked attention keep the bucket's extras kernels rather
// than compile two more per dtype.
template <typename T, int kHeadDim, int kHeadDimV>
Status launch_planned_values(const FwdParams& p, Sm90Grid grid) {
  if (p.head_dim_v <= kHeadDimV && !p.has_extras()) return launch_planned<T, kHeadDim, kHeadDimV>(p, grid);
  return launch_planned<T, kHeadDim>(p, grid);
}

template <typename T>
Status launch_head_dim(const FwdParams& p, Sm90Grid grid) {
  switch (sm90_checks::head_dim_bucket(p.head_dim, p.head_dim_v)) {
    case 64: return launch_planned<T, 64>(p, grid);
    case 128: return launch_planned_values<T, 128, 64>(p, grid);
    case 192: return launch_planned_values<T, 192, 128>(p, grid);
    default: return launch_planned<T, 256>(p, grid);  // sm90_forward_supports passed: the bucket is 256
  }
}

}  // namespace

Status sm90_forward_supports(const FwdParams& p) {
  Status common = sm90_checks::common(p);
  if (!common.ok()) return common;
  const bool varlen = p.is_varlen();
  const bool fp8 = p.dtype == DType::e4m3;
  if (fp8 && (p.alibi_slopes != nullptr || p.dropout_p > 0))
    return Status::unsupported("cuda_sm90: float8_e4m3fn inputs with ALiBi or dropout are not supported yet");
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride,
                             varlen ? 0 : p.q_batch_stride, varlen ? 0 : p.k_batch_stride,
                             varlen ? 0 : p.v_batch_stride, varlen ? 0 : p.o_batch_stride};
  for (int64_t s : strides)
    if (!tma_stride_ok(s))
      return Status::unsupported("cuda_sm90: TMA needs every row/head/batch stride to be a multiple of 8 elements");
  // TMA's unit is 16 bytes: 16 e4m3 elements of Q and K (V reaches the kernel as V_t: fp8_v_layout.h).
  const int64_t qk_strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                                varlen ? 0 : p.q_batch_stride, varlen ? 0 : p.k_batch_stride};
  for (int64_t s : qk_strides)
    if (fp8 && s % 16 != 0)
      return Status::unsupported("cuda_sm90: TMA needs float8_e4m3fn q and k strides that are multiples of 16 elements");
  if (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.o, 16))
    return Status::unsupported("cuda_sm90: TMA needs 16-byte aligned Q, K, V, O");
  // V_t's slots are numbered in int (fp8_v_layout.h).
  if (fp8 && cuda::sm90::fp8_v_row_slots(varlen, p.seqlen_k, p.total_k, p.batch) >= (int64_t(1) << 31))
    return Status::unsupported("cuda_sm90: float8_e4m3fn keys past 2^31 slots of V_t");
  if (p.heads_q > 65535 || p.batch > 65535) return Status::unsupported("cuda_sm90: more than 65535 heads or batches");
  // The kernel's mask arithmetic is 32-bit (MaskSpec32): a row's diagonal and window edges, with the edges narrowed
  // to the lengths, stay below 2^31 when the lengths add up to less (a tile of padding rows to spare).
  if (p.seqlen_q + p.seqlen_k > (int64_t(1) << 31) - 1024)
    return Status::unsupported("cuda_sm90: seqlen_q + seqlen_k past 2^31 - 1024 (the forward's 32-bit mask arithmetic)");
  // Tiles are numbered in int (the kernel adds the grid size to a tile number); counted at the smallest kBlockM.
  const int64_t kMaxTiles = int64_t(1) << 30;
  if ((p.seqlen_q + cuda::sm90::kWgmmaRows - 1) / cuda::sm90::kWgmmaRows * p.heads_q * p.batch >= kMaxTiles)
    return Status::unsupported("cuda_sm90: more than 2^30 query tiles (batch x heads x query blocks)");
  return Status::success();
}

Status sm90_forward_run(const FwdParams& p, Sm90Grid grid) {
  Status st = sm90_forward_supports(p);
  if (!st.ok()) return st;
  DeviceGuard guard(p.device.index);
  FA_CUDA_TRY(guard.status());
  if (p.dtype == DType::e4m3) return sm90_fp8_forward_launch(p, grid);
  return p.dtype == DType::bf16 ? launch_head_dim<__nv_bfloat16>(p, grid) : launch_head_dim<__half>(p, grid);
}

}  // namespace flashattn::detail
