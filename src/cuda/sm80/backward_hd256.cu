// sm80 backward kernels of head-dim bucket 256 (fp16 and bf16); see backward_kernels.cuh.
#define FA_SM80_BACKWARD_INSTANTIATE
#include "cuda/sm80/backward_launch.cuh"

namespace flashattn::detail {

Status sm80_backward_hd256(const cuda::sm80::BwdKernelArgs& a, const BwdParams& p, cudaStream_t s, int max_smem,
                          int stages) {
  return sm80_backward_bucket<256>(a, p, s, max_smem, stages);
}

}  // namespace flashattn::detail
