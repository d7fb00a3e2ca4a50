// The cuda_sm90 backend's entry points, as dispatch sees them. The forward runs the Hopper TMA + wgmma kernel
// (forward_sm90.cu) where sm90_forward_supports accepts the call; everything else answers unsupported with the
// reason, so dispatch falls back to cuda_sm80 (which runs on Hopper too).
#include "backend.h"
#include "cuda/sm90/forward_sm90.h"

namespace flashattn::detail {

Status cuda_sm90_supports(const FwdParams& p, bool backward) {
  if (backward) return Status::unsupported("cuda_sm90: the Hopper backward is not implemented yet; cuda_sm80 runs it");
  return sm90_forward_supports(p);
}

Status cuda_sm90_forward(const FwdParams& p) { return sm90_forward_run(p); }

Status cuda_sm90_backward(const BwdParams&) {
  return Status::unsupported("cuda_sm90: the Hopper backward is not implemented yet; cuda_sm80 runs it");
}

}  // namespace flashattn::detail
