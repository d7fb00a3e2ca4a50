#!/usr/bin/env bash
# One GPU run for merge_attention_states (src/cuda/merge.cu) and the ring attention built on it: build the Python
# module and the GPU suite (all cores), GpuMerge under compute-sanitizer memcheck, the CUDA cases of test_merge.py,
# test_distributed.py (ring attention with processes sharing the GPU), test_fp8_cuda.py and the backward cases of
# test_cuda.py, then bench/gpu/merge_bench.py and the ALiBi / dropout cost (bench/gpu/alibi_bench.py).
#   ALIBI_ARGS="<alibi_bench.py grid args>" (empty: no ALiBi / dropout benchmark).
#   MERGE_PYTEST="<files under tests/python>" (default: test_merge.py test_distributed.py test_fp8_cuda.py);
#   SKIP_BACKWARD_PYTEST=1: not test_cuda.py's backward cases.
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/merge-out
build_python_tree /tmp/build-m -DFLASHATTN_BUILD_TESTS=ON -- _C flashattn_gpu_tests
export PYTHONPATH=/tmp/build-m/python
timeout 120 compute-sanitizer --tool memcheck /tmp/build-m/tests/flashattn_gpu_tests --gtest_filter='GpuMerge*' \
  > "$OUT/gtest-merge.log" 2>&1
echo "gtest-merge rc=$?" >> "$OUT/gtest-merge.log"
pytest_files=${MERGE_PYTEST-"test_merge.py test_distributed.py test_fp8_cuda.py"}
(cd /tmp && timeout 300 python3 -m pytest -q -p no:cacheprovider $(for f in $pytest_files; do echo "$R/tests/python/$f"; done) \
   > "$OUT/pytest.log" 2>&1
 echo "pytest rc=$?" >> "$OUT/pytest.log")
if [ -z "${SKIP_BACKWARD_PYTEST:-}" ]; then
  (cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider "$R/tests/python/test_cuda.py" -k backward \
     > "$OUT/pytest-backward.log" 2>&1
   echo "pytest-backward rc=$?" >> "$OUT/pytest-backward.log")
fi
timeout 120 python3 bench/gpu/merge_bench.py > "$OUT/merge-bench.md" 2> "$OUT/bench.err"
echo "merge bench rc=$?" >> "$OUT/bench.err"
alibi_args=${ALIBI_ARGS-"--hd 64 128 256 --seqlens 2048 8192 --repeats 3 --seconds 0.25 --sdpa-max 0"}
if [ -n "$alibi_args" ]; then
  for feature in alibi dropout; do
    timeout 150 python3 bench/gpu/alibi_bench.py --feature $feature $alibi_args > "$OUT/$feature-bench.md" 2>> "$OUT/bench.err"
    echo "$feature bench rc=$?" >> "$OUT/bench.err"
  done
fi
echo "==== summary $(( $(date +%s) - t0 )) s"; head -2 "$log"; grep "build rc" "$log"; grep -E " error" "$log" | head
grep -E "ERROR SUMMARY|PASSED|FAILED|rc=" "$OUT/gtest-merge.log" | tail -5
for f in pytest pytest-backward; do [ -f "$OUT/$f.log" ] && tail -3 "$OUT/$f.log" && grep -E "^FAILED" "$OUT/$f.log" | head; done
cat "$OUT/merge-bench.md"
for feature in alibi dropout; do [ -f "$OUT/$feature-bench.md" ] && cat "$OUT/$feature-bench.md"; done
tail -4 "$OUT/bench.err"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
