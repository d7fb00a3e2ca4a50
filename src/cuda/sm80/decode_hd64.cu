// The head-dim 64 split-KV decode kernels (fp16, bf16; 16-bit or float8_e4m3fn inputs); see decode_launch.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/decode_launch.cuh"

namespace flashattn::cuda::sm80 {
template Status launch_decode<__half, 64, false>(const FwdParams&, int);
template Status launch_decode<__nv_bfloat16, 64, false>(const FwdParams&, int);
template Status launch_decode<__half, 64, true>(const FwdParams&, int);
template Status launch_decode<__nv_bfloat16, 64, true>(const FwdParams&, int);
}  // namespace flashattn::cuda::sm80
