// The FP8 forward's V_t (fp8_v_layout.h), written from p's e4m3 V (fp8_v_transpose.cu).
#pragma once

#include <cstdint>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// Writes V_t of p.v into `vt`: batch (1 in varlen) x heads_kv x head_dim_v rows of `row_slots` bytes
// (cuda::sm90::fp8_v_row_slots), every slot a sequence's tiles can read. Asynchronous on p.stream.
Status sm90_fp8_transpose_v(const FwdParams& p, void* vt, int64_t row_slots);

}  // namespace flashattn::detail
