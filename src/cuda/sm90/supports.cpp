// The cuda_sm90 backend's entry points, as dispatch sees them: the Hopper TMA + wgmma forward (forward_sm90.cu)
// and backward (backward_sm90.cu) where their support checks accept the call; everything else answers
// unsupported with the reason, so dispatch falls back to cuda_sm80 (which runs on Hopper too).
#include <string>

#include "backend.h"
#include "cuda/sm90/backward_sm90.h"
#include "cuda/sm90/forward_sm90.h"

namespace flashattn::detail {

namespace {
// KV-cache calls, and plain forwards of few query rows (cuda_decode_runs), run the split-KV decode kernel
// (src/cuda/sm80/decode_kernel.cuh) on Hopper too: decode reads pages through a cp.async gather at any page size,
// as FA3's decode does, and small query tiles waste less work than wgmma's 64-row minimum.
Status decode_supports(const FwdParams& p) {
  const int cc = cuda_compute_capability_impl(p.device.index);
  if (cc != 90) {
    return Status::unsupported("cuda_sm90: needs compute capability 9.0, device " + std::to_string(p.device.index) +
                               " has " + std::to_string(cc / 10) + "." + std::to_string(cc % 10));
  }
  return cuda_decode_supports(p);
}
}  // namespace

Status cuda_sm90_supports(const FwdParams& p) {
  return cuda_decode_runs(p) ? decode_supports(p) : sm90_forward_supports(p);
}

Status cuda_sm90_backward_supports(const BwdParams& p) { return sm90_backward_supports(p); }

Status cuda_sm90_forward(const FwdParams& p) {
  return cuda_decode_runs(p) ? cuda_decode_forward(p) : sm90_forward_run(p);
}

Status cuda_sm90_backward(const BwdParams& p) { return sm90_backward_run(p); }

}  // namespace flashattn::detail
