// Entry points of the Hopper forward (forward_sm90.cu). Dispatch reaches them through cuda_sm90_supports /
// cuda_sm90_forward once the kernel has passed its tests on the device; the GPU tests call them directly.
#pragma once

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// ok, or unsupported with the reason (dtype, head dim, strides/alignment TMA cannot express, device).
Status sm90_forward_supports(const FwdParams& p);

// Runs validated params for which sm90_forward_supports is ok. Asynchronous on p.stream.
Status sm90_forward_run(const FwdParams& p);

}  // namespace flashattn::detail
