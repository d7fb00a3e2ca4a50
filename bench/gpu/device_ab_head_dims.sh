#!/usr/bin/env bash
# One GPU run for a change to the head-dim buckets, from prebuilt programs (bench/tools/prebuild_for_device.sh:
# the tree in .devbin, the baseline's module in .devbase; carry both): the GPU suite's filter on the tree,
# compute-sanitizer memcheck on its small cases, then bench/gpu/head_dims_bench.py once per build (each against
# cuDNN in its own process, so the two builds compare through their ratios to the same anchor). Summary last.
#   HDAB_TESTS=<gtest filter>, HDAB_SANITIZE=<gtest filter> (empty: none), HDAB_BENCH="<head_dims_bench.py args>"
#   (several runs: separated by " ; "), HDAB_VARIANTS="a b": more modules timed the same way (.devbin/_C-<name>.patch
#   or .devbin/python-<name>.tar.xz, unpack_prebuilt_variant), not tested; HDAB_PYTEST="<pytest args>": pytest on the
#   tree's module
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_common.sh
OUT=${OUT:-/tmp/hdab-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$summary"
# Not through a pipe: unpack_prebuilt exports PYTHONPATH.
unpack_prebuilt >> "$summary"
tree_py=/tmp/prebuilt/python
unpack_prebuilt_base >> "$summary" || echo "no baseline module carried" >> "$summary"
t=/tmp/prebuilt/flashattn_gpu_tests
t0=$(date +%s)
timeout 300 $t --gtest_filter="${HDAB_TESTS:-*Sm90Primitives*:*GpuBackward*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$summary"
grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[==========\]" "$OUT/tests.log" | tail -12 >> "$summary"
grep -E "Failure|Expected|Which is|error \(" "$OUT/tests.log" | head -20 >> "$summary"
if [ -n "${HDAB_SANITIZE-*GpuBackward.ModelHeadDims/*bf16*auto*}" ]; then
  timeout 200 compute-sanitizer --tool memcheck $t \
    --gtest_filter="${HDAB_SANITIZE-*GpuBackward.ModelHeadDims/*bf16*auto*}" > "$OUT/sanitizer.log" 2>&1
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$OUT/sanitizer.log" | tee -a "$summary"
fi
if [ -n "${HDAB_PYTEST:-}" ]; then
  PYTHONPATH=$tree_py timeout 300 python3 -m pytest -q $HDAB_PYTEST > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?" >> "$summary"
  tail -3 "$OUT/pytest.log" >> "$summary"
  grep -E "^FAILED|^E  " "$OUT/pytest.log" | head -20 >> "$summary"
fi
for v in ${HDAB_VARIANTS:-}; do
  unpack_prebuilt_variant "$v" || echo "variant $v: no prebuilt module carried" >> "$summary"
done
bench_runs=${HDAB_BENCH-"--grid --hd 80 96 --seqlens 2048 4096 16384 --repeats 2 --seconds 0.2"}
if [ -n "$bench_runs" ]; then
  IFS=';' read -ra runs <<< "$bench_runs"
  for build in tree base ${HDAB_VARIANTS:-}; do
    case $build in
      tree) py=$tree_py ;;
      base) py=/tmp/prebuilt-base/python ;;
      *) py=/tmp/build-$build/python ;;
    esac
    [ -d "$py" ] || continue
    echo "==== $build" >> "$summary"
    for args in "${runs[@]}"; do
      PYTHONPATH=$py timeout 240 python3 bench/gpu/head_dims_bench.py $args >> "$OUT/bench-$build.md" \
        2>> "$OUT/bench-$build.err"
      echo "bench $build ($args) rc=$?" >> "$summary"
    done
    cat "$OUT/bench-$build.md" >> "$summary"
    tail -3 "$OUT/bench-$build.err" >> "$summary"
  done
fi
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
cat "$summary"
