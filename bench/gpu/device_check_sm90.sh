#!/usr/bin/env bash
# One GPU run for the Hopper forward: build the tree (sm_90 + sm_90a, all cores), the sm90 GPU
# tests (primitives, the forward grid on every launch grid, dispatch), compute-sanitizer memcheck / racecheck /
# synccheck on a few small cases, the resource report of the forward kernels, bench_sm90_forward (the planned
# kernels on each grid) and, with SM90_TORCH=quick|full, the side-by-side benchmark against PyTorch SDPA
# (bench_vs_torch.py: forward and backward). Logs go to $OUT (logs.tgz); a summary is printed last. Needs
# googletest: the system's, or sources in .gtest-src (carried).
#   SM90_TESTS=<gtest filter> narrows the tests; SM90_SANITIZE=0 skips compute-sanitizer; SM90_ITERS=N timed
#   launches per cell (20).
set -uo pipefail
OUT=${OUT:-/tmp/sm90-out}
mkdir -p "$OUT"
log=$OUT/build.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$log" 2>&1
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
t0=$(date +%s)
python=OFF
[ "${SM90_TORCH:-0}" != 0 ] && python=ON
build_tree . /tmp/build-sm90 -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=$python $prefix >> "$log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
link_bench_program bench/gpu/bench_sm90_forward.cu /tmp/build-sm90/libflashattn.a /tmp/bench_sm90_forward >> "$log" 2>&1 &
bench_pid=$!
cuobjdump --dump-resource-usage /tmp/build-sm90/CMakeFiles/flashattn_sm90a.dir/src/cuda/sm90/forward_sm90.cu.o \
  > "$OUT/resources.txt" 2>&1
t=/tmp/build-sm90/tests/flashattn_gpu_tests
timeout 240 $t --gtest_filter="${SM90_TESTS:-Sm90*:*Sm90Forward*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
: > "$san"
if [ "${SM90_SANITIZE:-1}" = 1 ]; then
  small='*Sm90Forward*bf16_d128_causal_tail*:*Sm90Forward*f16_d64_varlen_window*:Sm90Primitives.Accumulator*'
  for tool in memcheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool $t --gtest_filter="$small" >> "$san" 2>&1
  done
fi
wait $bench_pid
timeout 200 /tmp/bench_sm90_forward --iters "${SM90_ITERS:-20}" > "$OUT/bench_sm90.txt" 2>&1
if [ "${SM90_TORCH:-0}" != 0 ]; then
  quick=()
  [ "$SM90_TORCH" = quick ] && quick=(--quick)
  PYTHONPATH=/tmp/build-sm90/python timeout 300 python3 bench/gpu/bench_vs_torch.py --out "$OUT/bench" "${quick[@]}" \
    > "$OUT/bench_torch.log" 2>&1
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -30
grep -E "Failure|Expected|Which is|relative error|got .* want" "$OUT/tests.log" | head -16
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$san"
grep -E "STACK|LOCAL" "$OUT/resources.txt" | sort | uniq -c | head -8
cat "$OUT/bench_sm90.txt"
[ -f "$OUT/bench.md" ] && grep -E "^\| |^## " "$OUT/bench.md"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
