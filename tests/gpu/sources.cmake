# The store-rounding kernels are plain CUDA, built for the library's architectures.
add_library(flashattn_gpu_test_kernels OBJECT ${CMAKE_CURRENT_LIST_DIR}/store_kernels.cu)
target_include_directories(flashattn_gpu_test_kernels PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
                           ${PROJECT_SOURCE_DIR}/tests)

set(FLASHATTN_GPU_TEST_SOURCES
  $<TARGET_OBJECTS:flashattn_gpu_test_kernels>
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_smoke.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_stores.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_sm80_forward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_kvcache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_alibi_dropout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_decode_splits.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_merge.cpp
)

# Hopper tests: the primitive test kernels are sm_90a code, built like the library's sm_90a objects.
if(TARGET flashattn_sm90a)
  add_library(flashattn_sm90a_test_kernels OBJECT ${CMAKE_CURRENT_LIST_DIR}/sm90_primitive_kernels.cu)
  set_target_properties(flashattn_sm90a_test_kernels PROPERTIES CUDA_ARCHITECTURES 90a-real)
  target_include_directories(flashattn_sm90a_test_kernels PRIVATE ${PROJECT_SOURCE_DIR}/include
                             ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  list(APPEND FLASHATTN_GPU_TEST_SOURCES
    $<TARGET_OBJECTS:flashattn_sm90a_test_kernels>
    ${CMAKE_CURRENT_LIST_DIR}/test_sm90_primitives.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_sm90_forward.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_sm90_backward.cpp
  )
endif()
