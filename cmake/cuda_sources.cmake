# CUDA sources of the library. The sm80 kernels compile for every arch in CMAKE_CUDA_ARCHITECTURES
# (80 and 90 by default, so they also run natively on Hopper).
set(FLASHATTN_CUDA_SOURCES
  src/cuda/runtime.cu
  src/cuda/sm80/supports.cpp
  src/cuda/sm80/forward.cu
  src/cuda/sm80/forward_hd64.cu
  src/cuda/sm80/forward_hd128.cu
  src/cuda/sm80/forward_hd256.cu
  src/cuda/sm80/backward.cu
  src/cuda/sm90/unavailable.cpp
)
