#!/usr/bin/env bash
# One device call for the sm80 forward: build (forward-only tree, sm_90, all cores), GPU tests, compute-sanitizer
# memcheck + racecheck on the tiny cases, resource usage, our timings and PyTorch's flash backend side by side.
# Logs go to $OUT; a short summary is printed last. Needs googletest: the system's, or sources in .gtest-src.
set -uo pipefail
OUT=${OUT:-/tmp/fwd-out}
mkdir -p "$OUT"
root=$(pwd)
jobs=$(nproc)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
prefix=""
if [ ! -f /usr/include/gtest/gtest.h ] && [ -d .gtest-src ]; then
  (cmake -S .gtest-src -B /tmp/gtest-build -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gtest -DBUILD_GMOCK=OFF &&
   ninja -C /tmp/gtest-build install) > "$OUT/gtest.log" 2>&1
  prefix=-DCMAKE_PREFIX_PATH=/tmp/gtest
fi
bench/gpu/forward_only_tree.sh /tmp/fwdsrc
t0=$(date +%s)
{ cmake -S /tmp/fwdsrc -B /tmp/build-fwd -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DFLASHATTN_CUDA=ON \
    -DFLASHATTN_BUILD_CLI=OFF $prefix && ninja -C /tmp/build-fwd -j"$jobs" flashattn_gpu_tests; } > "$OUT/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/build.log"
nvcc -O2 -std=c++17 -arch=sm_90 -Iinclude bench/gpu/forward_bench.cu /tmp/build-fwd/libflashattn.a -Xcompiler -fopenmp \
  -o /tmp/forward_bench > "$OUT/bench_build.log" 2>&1 &
bench_pid=$!
for f in /tmp/build-fwd/CMakeFiles/flashattn.dir/src/cuda/sm80/forward_hd*.o; do
  echo "== $f"; cuobjdump --dump-resource-usage "$f" | grep -E "Function|REG"
done > "$OUT/resources.txt" 2>&1
t=/tmp/build-fwd/tests/flashattn_gpu_tests
timeout 240 $t --gtest_brief=1 > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log"
timeout 150 compute-sanitizer --tool memcheck $t --gtest_filter='*tiny_*:*RejectsWhat*' > "$OUT/memcheck.log" 2>&1
timeout 120 compute-sanitizer --tool racecheck $t --gtest_filter='*tiny_len17*:*tiny_varlen*:*tiny_misaligned*' \
  > "$OUT/racecheck.log" 2>&1
wait $bench_pid
timeout 120 /tmp/forward_bench 1024 4096 16384 > "$OUT/bench.txt" 2>&1
timeout 120 python3 bench/gpu/torch_flash_fwd.py 1024 4096 16384 > "$OUT/torch.txt" 2>&1
echo "==== summary"; cat "$OUT/gpu.txt"; tail -1 "$OUT/build.log"
grep -E "^\[  (PASSED|FAILED) |tests rc|^\[==========\]" "$OUT/tests.log" | head -30
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log"
grep -E "REG" "$OUT/resources.txt" | head -6
cat "$OUT/bench.txt"; cat "$OUT/torch.txt" | tail -25
