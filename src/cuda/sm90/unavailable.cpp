// Built instead of supports.cpp when the CUDA toolkit is too old for the Hopper kernels (they need CUDA >= 12.8
// for CCCL's bulk tensor copies to shared::cta; see cmake/cuda_sources.cmake). Dispatch is told so with the
// reason and runs cuda_sm80 on Hopper; forcing backend=cuda_sm90 gives this message as the error.
#include "backend.h"

namespace flashattn::detail {
namespace {
Status not_built() {
  return Status::unsupported(
      "cuda_sm90: the Hopper TMA/wgmma kernels are not in this build (CUDA toolkit older than 12.8); cuda_sm80 runs "
      "on Hopper");
}
}  // namespace

Status cuda_sm90_supports(const FwdParams&) { return not_built(); }
Status cuda_sm90_backward_supports(const BwdParams&) { return not_built(); }
Status cuda_sm90_forward(const FwdParams&) { return not_built(); }
Status cuda_sm90_backward(const BwdParams&) { return not_built(); }

}  // namespace flashattn::detail
