#!/usr/bin/env bash
# One GPU run for the Python layers over the kernels: build the Python module (all cores), the CUDA cases of the
# transformers backend, the benchmark command and context parallelism (processes sharing the GPU over gloo),
# then `python -m flashattn.bench` over a grid into $OUT (table, JSON, PNG). Logs go to $OUT; a summary last.
#   PY_BENCH="<flashattn.bench args>" (empty: none; default: the quick grid, every pass); PY_TESTS_K: pytest -k.
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/py-out
build_python_tree /tmp/build-py -DFLASHATTN_BUILD_TESTS=OFF -- _C
export PYTHONPATH=/tmp/build-py/python
(cd /tmp && timeout 240 python3 -m pytest -q -p no:cacheprovider -rs "$R/tests/python/test_transformers.py" \
   "$R/tests/python/test_bench.py" "$R/tests/python/test_distributed.py" ${PY_TESTS_K:+-k "$PY_TESTS_K"} > "$OUT/pytest.log" 2>&1;
 echo "pytest rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUT/pytest.log")
bench_args=${PY_BENCH-"--grid quick --pass forward backward decode"}
if [ -n "$bench_args" ]; then
  (cd /tmp && timeout 300 python3 -m flashattn.bench $bench_args --no-progress --json "$OUT/bench.json" \
     --png "$OUT/bench.png" > "$OUT/bench.md" 2> "$OUT/bench.err")
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUT/bench.err"
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
tail -8 "$OUT/pytest.log"; grep -E "^FAILED|^E  " "$OUT/pytest.log" | head -20
[ -f "$OUT/bench.md" ] && { cat "$OUT/bench.md"; tail -3 "$OUT/bench.err"; }
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
