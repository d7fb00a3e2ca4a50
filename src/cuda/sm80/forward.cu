// Placeholder until the sm80 forward kernel lands (in progress this session): reports unsupported.
#include "backend.h"
namespace flashattn::detail {
Status cuda_sm80_forward(const FwdParams&) { return Status::unsupported("cuda_sm80: forward not implemented yet"); }
}  // namespace flashattn::detail
