// Stream-ordered scratch memory for the CUDA kernels (the sm80 backward's D, LSE·log2e and dQ accumulator; the
// Hopper forward's tile counter). One pool per device, owned by the library and kept between calls (release
// threshold unlimited): the device's default pool returns freed memory to the driver at every
// synchronisation (threshold 0), so each call after one would map its workspace again (measured ~40 µs a call
// at hd 256, S = 2k on the H200: bench/results/hopper-forward.md, 0bfa611). release_cached_memory() (flashattn.h) trims
// it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "flashattn/types.h"

namespace flashattn::detail {

// bytes of workspace on `device` for work on `stream`; freed with workspace_free on the same stream. Both are
// capturable in a CUDA graph.
Status workspace_alloc(void** ptr, size_t bytes, int device, cudaStream_t stream);
Status workspace_free(void* ptr, cudaStream_t stream);

}  // namespace flashattn::detail
