// Hopper FP8 forward: O = softmax(Q Kᵀ · scale) V and LSE from float8_e4m3fn Q, K, V with FA3's optional descales
// (fp32 [batch, heads_kv]), O in bf16 or fp16. The forward kernel of forward_launch.cuh with e4m3 operands: S and
// P V in FP8 wgmma (twice the 16-bit rate), Q's and K's descales folded into the softmax's scale, V's into the
// normaliser, P quantised to e4m3 as P · 2^6 (forward_mainloop.cuh, Consumer). Every mask, softcap, GQA and varlen
// as in 16 bits; not ALiBi or dropout (sm90_forward_supports).
// V first goes through fp8_v_transpose.cu into V_t (fp8_v_layout.h), stream-ordered workspace of (keys rounded up
// to 128 per sequence) x d_v x heads_kv bytes, because FP8 wgmma reads P V's B operand K-major only: one read and
// one write of V, against the kernel's pass over every (query tile, key tile) pair.
// Tiles: forward_config.h (Fp8KernelPlan); head dims in buckets of 64, 128, 256 (support_checks.h,
// fp8_head_dim_bucket).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend.h"
#include "cuda/check.h"
#include "cuda/sm90/forward_config.h"
#include "cuda/sm90/forward_launch.cuh"
#include "cuda/sm90/forward_sm90.h"
#include "cuda/sm90/fp8_v_layout.h"
#include "cuda/sm90/fp8_v_transpose.h"
#include "cuda/sm90/support_checks.h"
#include "cuda/workspace.h"

namespace flashattn::detail {
namespace {

using cuda::sm90::Fp8;
using sm90_forward::launch;
using sm90_forward::VOperand;

template <typename TOut, int kHeadDim>
Status launch_fp8_planned(const FwdParams& p, Sm90Grid grid, const VOperand& v_t) {
  return p.has_mask() ? launch<Fp8, TOut, cuda::sm90::Fp8KernelPlan<kHeadDim, true>, false>(p, grid, &v_t)
                      : launch<Fp8, TOut, cuda::sm90::Fp8KernelPlan<kHeadDim, false>, false>(p, grid, &v_t);
}

template <typename TOut>
Status launch_fp8_head_dim(const FwdParams& p, Sm90Grid grid, const VOperand& v_t) {
  switch (sm90_checks::fp8_head_dim_bucket(p.head_dim, p.head_dim_v)) {
    case 64: return launch_fp8_planned<TOut, 64>(p, grid, v_t);
    case 128: return launch_fp8_planned<TOut, 128>(p, grid, v_t);
    default: return launch_fp8_planned<TOut, 256>(p, grid, v_t);  // sm90_forward_supports passed: 256
  }
}

}  // namespace

Status sm90_fp8_forward_launch(const FwdParams& p, Sm90Grid grid) {
  const bool varlen = p.is_varlen();
  // No query rows: nothing to write (and no grid to launch the transpose on).
  if (p.batch == 0 || p.heads_q == 0 || (varlen ? p.total_q : p.seqlen_q) == 0) return Status::success();
  // With no keys the kernel never reads V_t, but its tensor map still needs an address and nonzero strides: one
  // span per row at least.
  const int64_t slots =
      std::max<int64_t>(cuda::sm90::fp8_v_row_slots(varlen, p.seqlen_k, p.total_k, p.batch), cuda::sm90::kFp8KeyPad);
  const int64_t batch_dim = varlen ? 1 : p.batch;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const size_t bytes = size_t(slots * p.head_dim_v * p.heads_kv * batch_dim);
  void* v_t = nullptr;
  Status st = workspace_alloc(&v_t, bytes, p.device.index, stream);
  if (!st.ok()) return st;
  st = sm90_fp8_transpose_v(p, v_t, slots);
  if (st.ok()) {
    const VOperand op{v_t,
                      {slots, p.head_dim_v, p.heads_kv, batch_dim},
                      {slots, slots * p.head_dim_v, slots * p.head_dim_v * p.heads_kv}};
    st = p.out_dtype == DType::f16 ? launch_fp8_head_dim<__half>(p, grid, op)
                                   : launch_fp8_head_dim<__nv_bfloat16>(p, grid, op);
  }
  Status freed = workspace_free(v_t, stream);
  return st.ok() ? freed : st;
}

}  // namespace flashattn::detail
