#!/usr/bin/env bash
# Builds the CUDA programs on this machine (nvcc, no GPU) and packs them for a GPU run, so that the run spends its
# device time testing and timing instead of compiling (a full build there took about 4 minutes of it; here it takes
# about 6 on 2 cores, incremental ones less). Binaries built on Debian 12 ran on the GPU machines on 2026-12-05
# (their glibc and libstdc++ are newer).
#
#   bash bench/tools/prebuild_for_device.sh [BUILD_DIR]      (default /tmp/device-build)
#   PYTHON312=/path/to/python3.12 with nanobind importable: also the Python package with its CUDA module (the GPU
#   machines' python3 is CPython 3.12; the module uses the stable ABI)
#
# Writes .devbin/ in the repository root (ignored: add `/.devbin/` to .git/info/exclude), xz-compressed to fit the
# device tool's carry limit: flashattn_gpu_tests, backward_bench, and python.tar.xz (python/flashattn). Carry
# [".devbin"] and start the command with `source bench/gpu/device_common.sh; unpack_prebuilt` (programs in
# /tmp/prebuilt, PYTHONPATH set).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-/tmp/device-build}
python_flags=(-DFLASHATTN_BUILD_PYTHON=OFF)
targets=(flashattn_gpu_tests)
if [ -n "${PYTHON312:-}" ]; then
  python_flags=(-DFLASHATTN_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$PYTHON312")
  targets+=(_C)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_BENCH=OFF "${python_flags[@]}" > "$build.configure.log"
ninja -C "$build" -j"$(nproc)" "${targets[@]}"
source bench/gpu/device_common.sh
link_bench_program bench/gpu/backward_bench.cu "$build/libflashattn.a" "$build/backward_bench"
rm -rf .devbin && mkdir -p .devbin
xz -T0 -3 -c "$build/tests/flashattn_gpu_tests" > .devbin/flashattn_gpu_tests.xz
xz -T0 -3 -c "$build/backward_bench" > .devbin/backward_bench.xz
[ -n "${PYTHON312:-}" ] && tar -C "$build" -cJf .devbin/python.tar.xz python/flashattn
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include python || echo ' + uncommitted changes')" \
  > .devbin/COMMIT
du -sh .devbin
