// The KV-cache path of the CPU backends (kv_cache.cpp): append + rotary, and the dense view of paged caches.
#pragma once

#include "backend.h"

namespace flashattn::detail {

// Appends kp's new rows (K rotated), rotates Q into scratch when rotary is set, then runs `run` on the cache.
Status cpu_kvcache(const KVCacheParams& kp, ForwardFn run);

// Runs `run` on p, with a paged cache first gathered into dense per-sequence rows (the CPU kernels read strided
// rows only). Dense caches run as they are.
Status cpu_forward_dense_cache(const FwdParams& p, ForwardFn run);

}  // namespace flashattn::detail
