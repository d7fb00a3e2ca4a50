#!/usr/bin/env bash
# One GPU run for the Hopper kernels' head-dim buckets (support_checks.h: any d, d_v multiple of 8 up to 256):
# build with the Python module, the sm90 forward suite, the backward suite (sm80 forced and automatic), the
# ALiBi / dropout suite, compute-sanitizer memcheck on small cases of the new head dims, then optionally the rest
# of the GPU suite and the CUDA pytest cases, and bench/gpu/head_dims_bench.py. Logs go to $OUT; a summary last.
#   HD_FILTER / HD_SANITIZE: gtest filters of the suites / the sanitizer run; HD_SUITES=0 skips both; HD_FULL=1 adds the rest of the suite and pytest -m cuda;
#   HD_BENCH="<head_dims_bench.py args>" (empty: none).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/hd-out
build_python_tree /tmp/build-hd
t=/tmp/build-hd/tests/flashattn_gpu_tests
suites=${HD_FILTER:-'*Sm90Forward*:*GpuBackward*:*GpuAlibi*'}
san=$OUT/sanitizer.log
: > "$san" ; : > "$OUT/tests.log"
if [ "${HD_SUITES:-1}" = 1 ]; then
  timeout 300 $t --gtest_filter="$suites" > "$OUT/tests.log" 2>&1
  echo "tests rc=$? in $(( $(date +%s) - t0 )) s" >> "$OUT/tests.log"
  timeout 120 compute-sanitizer --tool memcheck $t \
    --gtest_filter="${HD_SANITIZE:-*Sm90Forward*d96_varlen*:*Sm90Forward*d192_v128_varlen*:*Sm90Forward*d40_v24*}" >> "$san" 2>&1
fi
export PYTHONPATH=/tmp/build-hd/python
[ "${HD_FULL:-0}" = 1 ] && run_rest_of_suite "$t" "$suites"
bench_args=${HD_BENCH-"--models"}
if [ -n "$bench_args" ]; then
  timeout 240 python3 bench/gpu/head_dims_bench.py $bench_args > "$OUT/bench.md" 2> "$OUT/bench.err"
  echo "bench rc=$?" >> "$OUT/bench.err"
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  FAILED  \]|tests rc|^\[==========\]|^\[  PASSED  \]" "$OUT/tests.log" | head -40
grep -E "Failure|Expected|Which is|error \(|Actual|at \[" "$OUT/tests.log" | head -30
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$san"
[ -f "$OUT/full.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|full rc" "$OUT/full.log" | head -20
[ -f "$OUT/pytest-cuda.log" ] && { tail -12 "$OUT/pytest-cuda.log"; grep -E "^FAILED|^E  " "$OUT/pytest-cuda.log" | head -20; }
[ -f "$OUT/bench.md" ] && { cat "$OUT/bench.md"; tail -3 "$OUT/bench.err"; }
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
