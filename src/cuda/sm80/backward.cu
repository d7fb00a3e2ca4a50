// Placeholder until the sm80 backward kernel lands (in progress this session): reports unsupported.
#include "backend.h"
namespace flashattn::detail {
Status cuda_sm80_backward(const BwdParams&) { return Status::unsupported("cuda_sm80: backward not implemented yet"); }
}  // namespace flashattn::detail
