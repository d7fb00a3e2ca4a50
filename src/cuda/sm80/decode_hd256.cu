// The head-dim 256 split-KV decode kernels (fp16, bf16; 16-bit or float8_e4m3fn inputs); see decode_launch.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/decode_launch.cuh"

namespace flashattn::cuda::sm80 {
template Status launch_decode<__half, 256, false>(const FwdParams&, int);
template Status launch_decode<__nv_bfloat16, 256, false>(const FwdParams&, int);
template Status launch_decode<__half, 256, true>(const FwdParams&, int);
template Status launch_decode<__nv_bfloat16, 256, true>(const FwdParams&, int);
}  // namespace flashattn::cuda::sm80
