// Entry points of the Hopper backward (backward_sm90.cu). Dispatch reaches them through cuda_sm90_supports /
// cuda_sm90_backward_supports / cuda_sm90_backward; the GPU tests run them through dispatch.
#pragma once

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// ok, or unsupported with the reason.
Status sm90_backward_supports(const BwdParams& p);

// Runs validated params for which sm90_backward_supports is ok. Asynchronous on p.stream.
Status sm90_backward_run(const BwdParams& p);

}  // namespace flashattn::detail
