#!/usr/bin/env bash
# One GPU run for the CUDA backward (the sm80 kernels and the Hopper kernel, src/cuda/sm80/backward*,
# src/cuda/sm90/backward_sm90.cu): build (sm_90 + sm_90a, all cores), the backward GPU tests with the sm80
# kernels forced and through dispatch (which must pick cuda_sm90 where it supports the call), compute-sanitizer
# memcheck / racecheck / synccheck on the tiny cases, resource usage, the timing program on each backend and
# (BWD_TORCH=1) PyTorch's flash backward beside it. Logs go to $OUT (logs.tgz); a summary is printed last. Needs
# googletest: the system's, or sources in .gtest-src (carried).
#   BWD_TESTS=<gtest filter> narrows the tests; BWD_SEQS="1024 16384" the benchmark lengths;
#   BWD_SANITIZE=0 skips compute-sanitizer; BWD_BACKENDS="cuda_sm90" times only the listed backends.
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
link_bench_program bench/gpu/backward_bench.cu /tmp/build-bwd/libflashattn.a /tmp/backward_bench >> "$log" 2>&1 &
bench_pid=$!
cuobjdump --dump-resource-usage /tmp/build-bwd/CMakeFiles/flashattn_sm90a.dir/src/cuda/sm90/backward_sm90.cu.o \
  > "$OUT/resources.txt" 2>&1
t=/tmp/build-bwd/tests/flashattn_gpu_tests
timeout ${BWD_TEST_TIMEOUT:-240} $t --gtest_filter="${BWD_TESTS:-*GpuBackward*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
: > "$san"
if [ "${BWD_SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool $tool $t --gtest_filter='*GpuBackward.TinyAllPaths/bfloat16_auto' >> "$san" 2>&1
  done
fi
wait $bench_pid
for b in ${BWD_BACKENDS:-cuda_sm90 cuda_sm80}; do
  FA_BWD_BACKEND=$b timeout 150 /tmp/backward_bench ${BWD_SEQS:-1024 4096 16384} >> "$OUT/bench.txt" 2>&1
done
[ "${BWD_TORCH:-0}" = 1 ] && timeout 120 python3 bench/gpu/torch_flash_bwd.py ${BWD_SEQS:-1024 4096 16384} \
  > "$OUT/torch.txt" 2>&1
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -40
grep -E "Failure|Expected|Which is|error \(emulation|Value of|Actual" "$OUT/tests.log" | head -16
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$san"
grep -E "REG|STACK|LOCAL" "$OUT/resources.txt" | head -8
cat "$OUT/bench.txt"; [ -f "$OUT/torch.txt" ] && tail -20 "$OUT/torch.txt"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
