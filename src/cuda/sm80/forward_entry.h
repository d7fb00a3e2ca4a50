// The sm80 forward with a shared-memory budget, for tests: a budget below the device's makes any GPU run the
// tiles of a smaller one (the compact tiles of ~99 KB GPUs, forward_config.h). Dispatch calls
// cuda_sm80_forward (backend.h), which is this with the device's budget.
#pragma once

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// smem_limit: bytes of shared memory a block may use; 0 = what the device allows.
Status cuda_sm80_forward_limited(const FwdParams& p, int smem_limit);

}  // namespace flashattn::detail
