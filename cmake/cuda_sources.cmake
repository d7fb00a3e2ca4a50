# CUDA sources of the library. The sm80 kernels compile for every arch in CMAKE_CUDA_ARCHITECTURES
# (80 and 90 by default, so they also run natively on Hopper).
set(FLASHATTN_CUDA_SOURCES
  src/cuda/runtime.cu
  src/cuda/kv_cache.cu
  src/cuda/merge.cu
  src/cuda/sm80/supports.cpp
  src/cuda/sm80/forward.cu
  src/cuda/sm80/forward_hd64.cu
  src/cuda/sm80/forward_hd128.cu
  src/cuda/sm80/forward_hd256.cu
  src/cuda/sm80/backward.cu
  src/cuda/sm80/backward_hd64.cu
  src/cuda/sm80/backward_hd128.cu
  src/cuda/sm80/backward_hd256.cu
  src/cuda/sm80/backward_rows.cu
  src/cuda/sm80/decode.cu
  src/cuda/sm80/decode_hd64.cu
  src/cuda/sm80/decode_hd128.cu
  src/cuda/sm80/decode_hd256.cu
  src/cuda/sm90/unavailable.cpp
)

# Hopper kernels (wgmma, setmaxnreg) exist only for the arch-specific sm_90a target, so they build in their own
# object library for exactly that target, whatever CMAKE_CUDA_ARCHITECTURES says. They use CCCL's cuda::ptx
# bulk tensor copies to shared::cta (CUDA >= 12.8); older toolkits build src/cuda/sm90/unavailable.cpp instead.
if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  add_library(flashattn_sm90a OBJECT ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/forward_sm90.cu
              ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/forward_sm90_fp8.cu
              ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/fp8_v_transpose.cu
              ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/backward_sm90.cu
              ${CMAKE_CURRENT_LIST_DIR}/../src/cuda/sm90/backward_sm90_fp8.cu)
  set_target_properties(flashattn_sm90a PROPERTIES CUDA_ARCHITECTURES 90a-real POSITION_INDEPENDENT_CODE ON)
  target_include_directories(flashattn_sm90a PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../include
                             ${CMAKE_CURRENT_LIST_DIR}/../src)
  target_compile_options(flashattn_sm90a PRIVATE --expt-relaxed-constexpr -lineinfo)
  list(REMOVE_ITEM FLASHATTN_CUDA_SOURCES src/cuda/sm90/unavailable.cpp)
  list(APPEND FLASHATTN_CUDA_SOURCES $<TARGET_OBJECTS:flashattn_sm90a> src/cuda/sm90/tensor_map.cpp
       src/cuda/sm90/supports.cpp)
endif()
