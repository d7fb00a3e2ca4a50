#!/usr/bin/env bash
# One device call for the sm80 backward: build (whole tree, sm_90, all cores), the backward GPU tests,
# compute-sanitizer memcheck + racecheck on the tiny cases, resource usage, our timings and PyTorch's flash
# backward side by side. Logs go to $OUT; a short summary is printed last. Needs googletest: the system's, or
# sources in .gtest-src (carried).
#   BWD_TESTS=<gtest filter> to narrow the tests; BWD_SEQS="1024 16384" for the benchmark lengths.
set -uo pipefail
OUT=${OUT:-/tmp/bwd-out}
mkdir -p "$OUT"
log=$OUT/build.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$log" 2>&1
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
t0=$(date +%s)
build_tree . /tmp/build-bwd -DFLASHATTN_BUILD_CLI=OFF $prefix -- flashattn_gpu_tests >> "$log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
nvcc -O2 -std=c++17 -arch=sm_90 -Iinclude bench/gpu/backward_bench.cu /tmp/build-bwd/libflashattn.a \
  -Xcompiler -fopenmp -o /tmp/backward_bench >> "$log" 2>&1 &
bench_pid=$!
for f in /tmp/build-bwd/CMakeFiles/flashattn.dir/src/cuda/sm80/backward_hd*.o; do
  echo "== $f"; cuobjdump --dump-resource-usage "$f" | grep -E "Function|REG"
done > "$OUT/resources.txt" 2>&1
t=/tmp/build-bwd/tests/flashattn_gpu_tests
timeout 240 $t --gtest_filter="${BWD_TESTS:-*GpuBackward*}" > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
timeout 120 compute-sanitizer --tool memcheck $t --gtest_filter='*TinyAllPaths/bfloat16*' > "$san" 2>&1
timeout 120 compute-sanitizer --tool racecheck $t --gtest_filter='*TinyAllPaths/float16*' >> "$san" 2>&1
wait $bench_pid
timeout 150 /tmp/backward_bench ${BWD_SEQS:-1024 4096 16384} > "$OUT/bench.txt" 2>&1
timeout 120 python3 bench/gpu/torch_flash_bwd.py ${BWD_SEQS:-1024 4096 16384} > "$OUT/torch.txt" 2>&1
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -30
grep -E "Failure|Expected|Which is|error \(emulation" "$OUT/tests.log" | head -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$san"
grep -E "REG|STACK" "$OUT/resources.txt" | head -8
cat "$OUT/bench.txt"; tail -20 "$OUT/torch.txt"
