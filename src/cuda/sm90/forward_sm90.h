// Entry points of the Hopper forward (forward_sm90.cu). Dispatch reaches them through cuda_sm90_supports /
// cuda_sm90_forward once the kernel has passed its tests on the device; the GPU tests call them directly.
#pragma once

#include <string>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// ok, or unsupported with the reason (dtype, head dim, strides/alignment TMA cannot express, device).
Status sm90_forward_supports(const FwdParams& p);

// The grid the planned kernel (forward_config.h, KernelPlan) runs on: as planned, or forced either way (the
// GPU tests run both on every case; the benchmark times both).
//   one_cta_per_tile: a CTA per (batch, head, query block) tile; the hardware starts the next as one ends.
//   persistent:       one CTA per multiprocessor; each claims its next tile from a counter as it finishes one,
//                     and its producer loads the next tile's K and Q while the consumers finish the current one.
enum class Sm90Grid { planned, one_cta_per_tile, persistent };
constexpr Sm90Grid kSm90Grids[] = {Sm90Grid::planned, Sm90Grid::one_cta_per_tile, Sm90Grid::persistent};
inline const char* sm90_grid_name(Sm90Grid g) {
  switch (g) {
    case Sm90Grid::planned: return "planned";
    case Sm90Grid::one_cta_per_tile: return "one_cta_per_tile";
    case Sm90Grid::persistent: return "persistent";
  }
  return "?";
}

// Runs validated params for which sm90_forward_supports is ok. Asynchronous on p.stream.
Status sm90_forward_run(const FwdParams& p, Sm90Grid grid = Sm90Grid::planned);

}  // namespace flashattn::detail
