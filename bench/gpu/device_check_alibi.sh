#!/usr/bin/env bash
# One GPU run for ALiBi and dropout (src/common/alibi.h, dropout.h in the CUDA kernels): build with the Python
# module (all cores), their GPU tests, compute-sanitizer memcheck (and racecheck, synccheck) on small cases of both
# backends, the whole GPU suite, the CUDA pytest cases, and the cost benchmark (bench/gpu/alibi_bench.py, ALiBi then
# dropout). Logs go to $OUT; a summary is printed last.
#   ALIBI_BENCH="<alibi_bench.py args>" (empty string: no benchmark); ALIBI_FULL=0 skips the whole suites;
#   DROPOUT_BENCH="<args>" for the dropout benchmark (empty string: none).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/alibi-out
build_python_tree /tmp/build-alibi
t=/tmp/build-alibi/tests/flashattn_gpu_tests
timeout 240 $t --gtest_filter='*GpuAlibi*' > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
: > "$san"
# Small cases: dropout at hd 64 / 256 and varlen through cuda_sm80 and automatic dispatch (cuda_sm90 on Hopper),
# whose backward hands the keep bits from the producer warpgroup to the consumers through shared memory: racecheck
# and synccheck too.
small='*GpuAlibi*/22_*:*GpuAlibi*/23_*:*GpuAlibi*/31_*:*GpuAlibi*/35_*'
timeout 200 compute-sanitizer --tool memcheck $t --gtest_filter="$small" >> "$san" 2>&1
for tool in racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool $t --gtest_filter='*GpuAlibi*/23_*:*GpuAlibi*/31_*' >> "$san" 2>&1
done
export PYTHONPATH=/tmp/build-alibi/python
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider "$R/tests/python/test_alibi.py" "$R/tests/python/test_dropout.py" > "$OUT/pytest.log" 2>&1;
 echo "pytest rc=$?" >> "$OUT/pytest.log")
[ "${ALIBI_FULL:-1}" = 1 ] && run_rest_of_suite "$t" '*GpuAlibi*'
bench_args=${ALIBI_BENCH-"--repeats 3 --seconds 0.3"}
if [ -n "$bench_args" ]; then
  timeout 300 python3 bench/gpu/alibi_bench.py $bench_args > "$OUT/bench.md" 2> "$OUT/bench.err"
  echo "bench rc=$?" >> "$OUT/bench.err"
fi
dropout_args=${DROPOUT_BENCH-"--repeats 2 --seconds 0.25 --hd 64 128 --seqlens 2048 8192"}
if [ -n "$dropout_args" ]; then
  timeout 200 python3 bench/gpu/alibi_bench.py --feature dropout $dropout_args >> "$OUT/bench.md" 2>> "$OUT/bench.err"
  echo "dropout bench rc=$?" >> "$OUT/bench.err"
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -40
grep -E "Failure|Expected|Which is|error \(|Actual" "$OUT/tests.log" | head -20
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$san"
tail -3 "$OUT/pytest.log"; grep -E "^FAILED|Error" "$OUT/pytest.log" | head -10
[ -f "$OUT/full.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|full rc" "$OUT/full.log" | head -20
[ -f "$OUT/pytest-cuda.log" ] && { tail -2 "$OUT/pytest-cuda.log"; grep -E "^FAILED" "$OUT/pytest-cuda.log" | head; }
[ -f "$OUT/bench.md" ] && { cat "$OUT/bench.md"; tail -3 "$OUT/bench.err"; }
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
