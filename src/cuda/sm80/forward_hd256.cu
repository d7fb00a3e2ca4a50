// The head-dim bucket 256 of the sm80 forward, both dtypes (one file per bucket so they compile in parallel).
#include "cuda/sm80/forward_launch.cuh"

namespace flashattn::cuda::sm80 {
template Status launch_forward<__half, 256>(const FwdParams&, int);
template Status launch_forward<__nv_bfloat16, 256>(const FwdParams&, int);
}  // namespace flashattn::cuda::sm80
