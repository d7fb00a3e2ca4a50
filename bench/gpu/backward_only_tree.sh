#!/usr/bin/env bash
# Copies the working tree to $1 and trims it to the library + the sm80 backward + its GPU test, so that the
# backward can be built and checked on the device while other kernels of the tree are mid-edit: the other
# CUDA entry points become stubs that report unsupported.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
dst=$1
rm -rf "$dst" && mkdir -p "$dst"
(cd "$src" && tar --exclude='./build*' --exclude='./.git' --exclude='./.gtest-src' -cf - .) | (cd "$dst" && tar -xf -)
cat > "$dst/cmake/cuda_sources.cmake" <<'CMK'
set(FLASHATTN_CUDA_SOURCES
  src/cuda/runtime.cu
  src/cuda/sm80/supports.cpp
  src/cuda/sm80/backward.cu
  src/cuda/sm80/backward_hd64.cu
  src/cuda/sm80/backward_hd128.cu
  src/cuda/sm80/backward_hd256.cu
  src/cuda/bwd_only_stubs.cpp
)
CMK
cat > "$dst/src/cuda/bwd_only_stubs.cpp" <<'CPP'
#include "backend.h"
namespace flashattn::detail {
Status cuda_sm80_forward(const FwdParams&) { return Status::unsupported("not in this backward-only build"); }
Status cuda_sm90_supports(const FwdParams&, bool) { return Status::unsupported("not in this backward-only build"); }
Status cuda_sm90_forward(const FwdParams&) { return Status::unsupported("not in this backward-only build"); }
Status cuda_sm90_backward(const BwdParams&) { return Status::unsupported("not in this backward-only build"); }
}  // namespace flashattn::detail
CPP
cat > "$dst/tests/gpu/sources.cmake" <<'CMK'
set(FLASHATTN_GPU_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sm80_backward.cpp)
CMK
