// The cuda_sm90 backend's entry points, as dispatch sees them: the Hopper TMA + wgmma forward (forward_sm90.cu)
// and backward (backward_sm90.cu) where their support checks accept the call; everything else answers
// unsupported with the reason, so dispatch falls back to cuda_sm80 (which runs on Hopper too).
#include "backend.h"
#include "cuda/sm90/backward_sm90.h"
#include "cuda/sm90/forward_sm90.h"

namespace flashattn::detail {

Status cuda_sm90_supports(const FwdParams& p) { return sm90_forward_supports(p); }

Status cuda_sm90_backward_supports(const BwdParams& p) { return sm90_backward_supports(p); }

Status cuda_sm90_forward(const FwdParams& p) { return sm90_forward_run(p); }

Status cuda_sm90_backward(const BwdParams& p) { return sm90_backward_run(p); }

}  // namespace flashattn::detail
