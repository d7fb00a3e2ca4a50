// Entry points of the Hopper forward (forward_sm90.cu). Dispatch reaches them through cuda_sm90_supports /
// cuda_sm90_forward once the kernel has passed its tests on the device; the GPU tests call them directly.
#pragma once

#include <string>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// ok, or unsupported with the reason (dtype, head dim, strides/alignment TMA cannot express, device).
Status sm90_forward_supports(const FwdParams& p);

// The grid the planned kernel (forward_config.h, KernelPlan) runs on: persistent, which dispatch uses, or one CTA
// per tile (the GPU tests run both on every case; the benchmark times both).
//   persistent:       one CTA per multiprocessor (fewer if there are fewer tiles); each claims its next tile from
//                     a counter as it finishes one, and its producer loads the next tile's K and Q while the
//                     consumers finish the current one.
//   one_cta_per_tile: a CTA per (batch, head, query block) tile; the hardware starts the next as one ends.
enum class Sm90Grid { persistent, one_cta_per_tile };
constexpr Sm90Grid kSm90Grids[] = {Sm90Grid::persistent, Sm90Grid::one_cta_per_tile};
inline const char* sm90_grid_name(Sm90Grid g) {
  switch (g) {
    case Sm90Grid::one_cta_per_tile: return "one_cta_per_tile";
    case Sm90Grid::persistent: return "persistent";
  }
  return "?";
}

// Runs validated params for which sm90_forward_supports is ok. Asynchronous on p.stream.
Status sm90_forward_run(const FwdParams& p, Sm90Grid grid = Sm90Grid::persistent);

// sm90_forward_run's e4m3 inputs (forward_sm90_fp8.cu): V_t into workspace (fp8_v_transpose.h), then the kernel.
Status sm90_fp8_forward_launch(const FwdParams& p, Sm90Grid grid);

}  // namespace flashattn::detail
