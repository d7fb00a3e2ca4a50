#!/usr/bin/env bash
# One GPU run for the Hopper FP8 forward and backward (src/cuda/sm90/forward_sm90_fp8.cu, backward_sm90_fp8.cu):
# build the Python module (all cores), the FP8 pytest cases (tests/python/test_fp8_cuda.py and the FP8 cases of the
# FA3 and SDPA suites; the backward cases print their errors), compute-sanitizer memcheck on the small and varlen
# cases, and the benchmarks (bench/gpu/fp8_bench.py). Logs go to $OUT; a summary is printed last.
#   FP8_BENCH="<fp8_bench.py args>" (empty string: no forward benchmark).
#   FP8_BWD_BENCH="<fp8_bench.py args>" (the backward's, --backward added; unset or empty: none).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/fp8-out
build_python_tree /tmp/build-fp8 -- _C
export PYTHONPATH=/tmp/build-fp8/python
fp8_pytest "$OUT/pytest.log"
pytest_memcheck "$OUT/memcheck.log" test_fp8_cuda.py \
  "one_row or one_query_row or varlen or hd32 or hd64_causal or backward_empty or 16_bit_backward"
bench_args=${FP8_BENCH-"--hd 128 256 64 --seqlens 1024 4096 16384 --repeats 2 --seconds 0.2 --accuracy"}
if [ -n "$bench_args" ]; then
  timeout 240 python3 bench/gpu/fp8_bench.py $bench_args > "$OUT/bench.md" 2> "$OUT/bench.err"
  echo "bench rc=$?" >> "$OUT/bench.err"
fi
if [ -n "${FP8_BWD_BENCH:-}" ]; then
  timeout 240 python3 bench/gpu/fp8_bench.py --backward $FP8_BWD_BENCH > "$OUT/bench-backward.md" 2>> "$OUT/bench.err"
  echo "backward bench rc=$?" >> "$OUT/bench.err"
fi
echo "==== summary $(( $(date +%s) - t0 )) s"; head -2 "$log"; grep "build rc" "$log"; grep -E " error" "$log" | head
tail -2 "$OUT/pytest.log"; grep -E "^FAILED" "$OUT/pytest.log" | head; grep -oE "fp8 backward .*" "$OUT/pytest.log" | head -30
grep -E "ERROR SUMMARY|passed|failed|rc=" "$OUT/memcheck.log" | tail -3
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"
[ -f "$OUT/bench-backward.md" ] && cat "$OUT/bench-backward.md"
[ -f "$OUT/bench.err" ] && tail -3 "$OUT/bench.err"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
