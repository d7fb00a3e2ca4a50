// The sm90 check build (CMakeLists.txt beside this) leaves the sm80 kernels out; dispatch then hears why.
#include "backend.h"

namespace flashattn::detail {
namespace {
Status not_built() { return Status::unsupported("cuda_sm80: not part of the sm90 check build (bench/gpu/sm90_check)"); }
}  // namespace

Status cuda_sm80_supports(const FwdParams&, bool) { return not_built(); }
Status cuda_sm80_forward(const FwdParams&) { return not_built(); }
Status cuda_sm80_backward(const BwdParams&) { return not_built(); }

}  // namespace flashattn::detail
