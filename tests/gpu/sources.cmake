set(FLASHATTN_GPU_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/test_gpu_smoke.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_sm80_forward.cpp
)
