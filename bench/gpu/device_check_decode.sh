#!/usr/bin/env bash
# One GPU run for the KV-cache path (src/cuda/kv_cache.cu, src/cuda/sm80/decode*): build with the Python module
# (all cores), the KV-cache GPU tests on both backends, compute-sanitizer memcheck / racecheck / synccheck on
# small cases (clamped index values included), the KV-cache pytest cases on CUDA, and the decode benchmark
# against cuDNN (bench/gpu/decode_bench.py). Logs go to $OUT; a summary is printed last.
#   DEC_TESTS=<gtest filter>; DEC_BENCH="<decode_bench.py args>" (empty string: no benchmark);
#   DEC_SANITIZE=0 skips compute-sanitizer; DEC_PYTEST=0 skips the pytest cases; DEC_FULL=1 also runs the whole GPU suite; DEC_PYTHON=0 builds
#   without the Python module (no pytest, no benchmark).
#   DEC_BASE=.ab/old: also builds a baseline module (the tree with that folder's files laid over it, carried) in
#   parallel, and runs the benchmark for baseline, tree, baseline, tree (cuDNN in every run is the common anchor).
#   DEC_VARIANTS="a b": more builds, each the tree with .ab/<name>'s files laid over it (a copy of the tree's
#   build directory, so only what those files touch recompiles), timed in the same rotation.
#   DEC_PREBUILT=1: no build; the tests and the Python module come from .devbin (bench/tools/prebuild_for_device.sh,
#   carried), the baseline module, if any, from .devbase/python.tar.xz (the same script's package of another tree),
#   the variants' modules from .devbin too (device_common.sh unpack_prebuilt_variant).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/dec-out
py=${DEC_PYTHON:-1}
base=${DEC_BASE:-}
tree_build=/tmp/build-dec
base_build=/tmp/build-base
if [ "${DEC_PREBUILT:-0}" = 1 ]; then
  unpack_prebuilt >> "$log"
  tree_build=/tmp/prebuilt
  base=""
  unpack_prebuilt_base >> "$log" && base_build=/tmp/prebuilt-base
elif [ -n "$base" ]; then
  copy_tree /tmp/base-src && cp -r "$base/." /tmp/base-src/
  (build_tree /tmp/base-src /tmp/build-base -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF \
     -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_CLI=OFF -- _C > "$OUT/build-base.log" 2>&1
   echo "base build rc=$?" >> "$OUT/build-base.log") &
fi
if [ "$tree_build" = /tmp/build-dec ]; then
  build_tree . /tmp/build-dec -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=$([ "$py" = 1 ] && echo ON || echo OFF) \
    -DFLASHATTN_BUILD_BENCH=OFF $prefix >> "$log" 2>&1
  echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
  wait
  [ -n "$base" ] && { grep "base build rc" "$OUT/build-base.log" >> "$log"; grep -E "error" "$OUT/build-base.log" | head -5 >> "$log"; }
  cuobjdump --dump-resource-usage /tmp/build-dec/CMakeFiles/flashattn.dir/src/cuda/sm80/decode_hd128.cu.o \
    > "$OUT/resources.txt" 2>&1
  t=/tmp/build-dec/tests/flashattn_gpu_tests
else
  t=/tmp/prebuilt/flashattn_gpu_tests
fi
timeout ${DEC_TEST_TIMEOUT:-300} $t --gtest_filter="${DEC_TESTS:-*KVCache*}" > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
: > "$san"
if [ "${DEC_SANITIZE:-1}" = 1 ]; then
  small='*GpuKVCacheClamps*:*GpuKVCache.MatchesOracle/bfloat16_b2_sq4_h8x2_d64_cap300_page16_new3*'
  small+=':*GpuKVCache.MatchesOracle/bfloat16_b3_sq4_h8x2_d64_cap300_page16_new4_rot32i_causal_varnew*'
  small+=':*GpuKVCache.MatchesOracle/bfloat16_b32_sq4_h32x8_d128_cap300*'  # a grid that keeps the rows16 plan
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool $t --gtest_filter="$small" >> "$san" 2>&1
  done
fi
export PYTHONPATH=$tree_build/python
[ "$py" = 1 ] && [ "${DEC_PYTEST:-1}" = 1 ] && (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider "$R/tests/python" -m cuda -k "kvcache or paged or block_table" \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?" >> "$OUT/pytest.log")
if [ "${DEC_FULL:-0}" = 1 ]; then
  timeout 300 $t > "$OUT/full.log" 2>&1; echo "full rc=$?" >> "$OUT/full.log"
fi
bench_args=${DEC_BENCH-"--eager"}
if [ -n "$bench_args" ] && [ "$py" = 1 ]; then
  builds=(); names=()
  [ -n "$base" ] || [ "$base_build" = /tmp/prebuilt-base ] && { builds+=("$base_build"); names+=(base); }
  builds+=("$tree_build"); names+=(tree)
  for v in ${DEC_VARIANTS:-}; do
    if [ "${DEC_PREBUILT:-0}" = 1 ]; then
      unpack_prebuilt_variant "$v" || { echo "variant $v: no prebuilt module carried" >> "$log"; continue; }
    else
      cp -a "$tree_build" /tmp/build-$v && cp -a src /tmp/src-orig && cp -r ".ab/$v/." .
      ninja -C /tmp/build-$v _C >> "$OUT/build-variants.log" 2>&1
      echo "variant $v build rc=$?" >> "$log"
      rm -rf src && mv /tmp/src-orig src
    fi
    builds+=(/tmp/build-$v); names+=($v)
  done
  if [ ${#builds[@]} = 1 ]; then
    timeout 400 python3 bench/gpu/decode_bench.py --out "$OUT/decode.json" --md "$OUT/decode.md" $bench_args \
      > "$OUT/bench.log" 2>&1
    echo "bench rc=$?" >> "$OUT/bench.log"
  else
    for round in 1 2; do
      for i in "${!builds[@]}"; do
        run=${names[$i]}$round
        PYTHONPATH=${builds[$i]}/python timeout ${DEC_BENCH_TIMEOUT:-150} python3 bench/gpu/decode_bench.py \
          --out "$OUT/decode_$run.json" --md "$OUT/decode_$run.md" $bench_args > "$OUT/bench_$run.log" 2>&1
        echo "bench $run rc=$?" >> "$OUT/bench.log"
      done
    done
  fi
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"; grep -E "error" "$log" | head -10
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.log" | head -40
grep -E "Failure|Expected|Which is|out: |lse: |first differing|Value of|Actual" "$OUT/tests.log" | head -20
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$san"
grep -E "REG|STACK|LOCAL" "$OUT/resources.txt" 2>/dev/null | head -8
[ -f "$OUT/pytest.log" ] && { tail -5 "$OUT/pytest.log"; grep -E "FAILED|Error" "$OUT/pytest.log" | head -10; }
[ -f "$OUT/full.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|full rc" "$OUT/full.log" | head -20
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log" | tail -40
for f in "$OUT"/decode*.md; do [ -f "$f" ] && { echo "== $(basename "$f")"; cat "$f"; }; done
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
