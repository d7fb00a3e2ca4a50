// The Hopper backward of float8_e4m3fn inputs (backward_sm90_fp8.cu): Q, K, V and dO as 16-bit copies (V and dO
// dequantised, Q's and K's descales applied to the scores by the kernel), then the 16-bit backward kernel.
#pragma once

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// p with e4m3 Q, K, V, dO (validated; gradients in p.out_dtype) staged as p.out_dtype copies in stream-ordered
// workspace, then `run16` (the 16-bit backward) on params pointed at them, q_descale and k_descale kept.
// Asynchronous on p.stream.
using Sm90BackwardFn = Status (*)(const BwdParams&);
Status sm90_fp8_backward_run(const BwdParams& p, Sm90BackwardFn run16);

}  // namespace flashattn::detail
