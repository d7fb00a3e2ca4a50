#!/usr/bin/env bash
# Copies the working tree to $1 and trims it to the library + the sm80 forward + its GPU test, so that the
# forward can be built and checked on the device while other kernels of the tree are mid-edit: the other
# CUDA backends' entry points become stubs that report unsupported.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
dst=$1
rm -rf "$dst" && mkdir -p "$dst"
(cd "$src" && tar --exclude='./build*' --exclude='./.git' --exclude='./.gtest-src' -cf - .) | (cd "$dst" && tar -xf -)
cat > "$dst/cmake/cuda_sources.cmake" <<'CMK'
set(FLASHATTN_CUDA_SOURCES
  src/cuda/runtime.cu
  src/cuda/sm80/supports.cpp
  src/cuda/sm80/forward.cu
  src/cuda/sm80/forward_hd64.cu
  src/cuda/sm80/forward_hd128.cu
  src/cuda/sm80/forward_hd256.cu
  src/cuda/fwd_only_stubs.cpp
)
CMK
cat > "$dst/src/cuda/fwd_only_stubs.cpp" <<'CPP'
#include "backend.h"
namespace flashattn::detail {
Status cuda_sm80_backward(const BwdParams&) { return Status::unsupported("not in this forward-only build"); }
Status cuda_sm90_supports(const FwdParams&, bool) { return Status::unsupported("not in this forward-only build"); }
Status cuda_sm90_forward(const FwdParams&) { return Status::unsupported("not in this forward-only build"); }
Status cuda_sm90_backward(const BwdParams&) { return Status::unsupported("not in this forward-only build"); }
}  // namespace flashattn::detail
CPP
cat > "$dst/tests/gpu/sources.cmake" <<'CMK'
set(FLASHATTN_GPU_TEST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sm80_forward.cpp)
CMK
