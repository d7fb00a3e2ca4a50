// Compiled instead of the CUDA backends when the build has no CUDA compiler: every CUDA entry point answers
// "unsupported" with the reason, so dispatch reports it instead of failing to link or crashing.
#include "backend.h"

namespace flashattn::detail {
namespace {
Status no_cuda() { return Status::unsupported("this build of flashattn has no CUDA support (no nvcc at configure time)"); }
}  // namespace

Status cuda_sm80_supports(const FwdParams&, bool) { return no_cuda(); }
Status cuda_sm80_forward(const FwdParams&) { return no_cuda(); }
Status cuda_sm80_backward(const BwdParams&) { return no_cuda(); }
Status cuda_sm90_supports(const FwdParams&) { return no_cuda(); }
Status cuda_sm90_backward_supports(const BwdParams&) { return no_cuda(); }
Status cuda_sm90_forward(const FwdParams&) { return no_cuda(); }
Status cuda_sm90_backward(const BwdParams&) { return no_cuda(); }
Status cuda_kvcache(const KVCacheParams&, ForwardFn) { return no_cuda(); }
Status cuda_decode_supports(const FwdParams&) { return no_cuda(); }
Status cuda_decode_forward(const FwdParams&, int) { return no_cuda(); }
bool cuda_decode_runs(const FwdParams& p) { return p.has_kv_cache(); }
Status cuda_merge(const MergeParams&) { return no_cuda(); }
int cuda_device_count_impl() { return 0; }
int cuda_compute_capability_impl(int) { return 0; }
Status cuda_copy_to_host(void*, const void*, size_t, int, void*) { return no_cuda(); }
Status release_cached_memory_impl() { return Status::success(); }  // no CUDA: nothing is held

}  // namespace flashattn::detail
