#!/usr/bin/env bash
# One GPU run for the KV-cache path (src/cuda/kv_cache.cu, src/cuda/sm80/decode*): build with the Python module
# (all cores), the KV-cache GPU tests on both backends, compute-sanitizer memcheck / racecheck / synccheck on
# small cases (clamped index values included), the KV-cache pytest cases on CUDA, and the decode benchmark
# against cuDNN (bench/gpu/decode_bench.py). Logs go to $OUT; a summary is printed last.
#   DEC_TESTS=<gtest filter>; DEC_BENCH="<decode_bench.py args>" (empty string: no benchmark);
#   DEC_SANITIZE=0 skips compute-sanitizer; DEC_FULL=1 also runs the whole GPU suite; DEC_PYTHON=0 builds
#   without the Python module (no pytest, no benchmark).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/dec-out
py=${DEC_PYTHON:-1}
build_tree . /tmp/build-dec -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=$([ "$py" = 1 ] && echo ON || echo OFF) \
  -DFLASHATTN_BUILD_BENCH=OFF $prefix >> "$log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
cuobjdump --dump-resource-usage /tmp/build-dec/CMakeFiles/flashattn.dir/src/cuda/sm80/decode_hd128.cu.o \
  > "$OUT/resources.txt" 2>&1
t=/tmp/build-dec/tests/flashattn_gpu_tests
timeout ${DEC_TEST_TIMEOUT:-300} $t --gtest_filter="${DEC_TESTS:-*KVCache*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
: > "$san"
if [ "${DEC_SANITIZE:-1}" = 1 ]; then
  small='*GpuKVCacheClamps*:*GpuKVCache.MatchesOracle/bfloat16_b2_sq4_h8x2_d64_cap300_page16_new3*'
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool $t --gtest_filter="$small" >> "$san" 2>&1
  done
fi
export PYTHONPATH=/tmp/build-dec/python
[ "$py" = 1 ] && (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider "$R/tests/python" -m cuda -k "kvcache or paged or block_table" \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest.log")
if [ "${DEC_FULL:-0}" = 1 ]; then
  timeout 300 $t > "$OUT/full.log" 2>&1; echo "full rc=$?" >> "$OUT/full.log"
fi
bench_args=${DEC_BENCH-"--eager"}
if [ -n "$bench_args" ] && [ "$py" = 1 ]; then
  timeout 400 python3 bench/gpu/decode_bench.py --out "$OUT/decode.json" --md "$OUT/decode.md" $bench_args \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$?" >> "$OUT/bench.log"
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -40
grep -E "Failure|Expected|Which is|out: |lse: |first differing|Value of|Actual" "$OUT/tests.log" | head -20
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$san"
grep -E "REG|STACK|LOCAL" "$OUT/resources.txt" | head -8
[ -f "$OUT/pytest.log" ] && { tail -5 "$OUT/pytest.log"; grep -E "FAILED|Error" "$OUT/pytest.log" | head -10; }
[ -f "$OUT/full.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|full rc" "$OUT/full.log" | head -20
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log" | tail -40
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
