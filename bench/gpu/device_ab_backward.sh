#!/usr/bin/env bash
# One GPU run for a change to the Hopper backward: builds the tree (library, GPU suite, Python module) and a
# baseline (the tree with the files under $AB_BASE laid over it: the code before the change) side by side with
# every core; runs the GPU suite on the tree, compute-sanitizer (memcheck, racecheck, synccheck) on the backward's
# small cases, and times both builds' backward against cuDNN in alternating bursts (burst_grid.py --backward, one
# process per build). Summary last; logs in $OUT/logs.tgz, timing tables as ab_*.md.
#
#   AB_BASE=.ab/old bash bench/gpu/device_ab_backward.sh      (carry .ab and, without a system googletest, .gtest-src)
#   AB_TESTS=<gtest filter> (default: all), AB_SANITIZE=0, AB_HD="64 128", AB_SEQLENS="2048 16384", AB_REPEATS=2,
#   AB_SECONDS=0.5, AB_SKIP_BASE=1 (time the tree alone)
#   AB_PREBUILT=1: no builds; the tree's programs and module from .devbin, the baseline's module from
#   .devbase/python.tar.xz (bench/tools/prebuild_for_device.sh, both carried) and each variant's from
#   .devbin/python-<name>.tar.xz or .devbin/_C-<name>.patch (timed, not tested); AB_KERNEL_TIMES="128:2048:1 ...":
#   each build's kernels of one backward at those hd:seqlen:causal cells under Nsight Compute
#   AB_VARIANTS="a b": more builds, each the tree with .ab/<name>'s files laid over it (a copy of the tree's build
#   directory: only what those files touch recompiles), their GPU suite run too (AB_VARIANT_TESTS, default
#   AB_TESTS) and timed after the tree, at the head dims in .ab/<name>.hd, else AB_VARIANT_HD, else AB_HD
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ab-out}
mkdir -p "$OUT"
t_start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }
summary=$OUT/summary.txt
say() { printf '\n==== %s (%s)\n' "$*" "$(elapsed)" | tee -a "$summary"; }

source bench/gpu/device_common.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$summary"
t=/tmp/build/tests/flashattn_gpu_tests
tree_py=/tmp/build/python
base_py=/tmp/build-base/python
if [ "${AB_PREBUILT:-0}" = 1 ]; then
  say "prebuilt: $(unpack_prebuilt)"
  t=/tmp/prebuilt/flashattn_gpu_tests
  tree_py=/tmp/prebuilt/python
  base_py=/tmp/prebuilt-base/python
  unpack_prebuilt_base | tee -a "$summary"
  # Variants: their modules only (unpack_prebuilt_variant); the suite runs on the tree.
  for v in ${AB_VARIANTS:-}; do
    unpack_prebuilt_variant "$v" || echo "variant $v: no prebuilt module carried" | tee -a "$summary"
  done
fi
[ "${AB_PREBUILT:-0}" = 1 ] || {
prefix=$(gtest_prefix_flag)
say "build (tree and baseline in parallel)"
(build_tree . /tmp/build -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF $prefix > "$OUT/build.log" 2>&1
 echo "build rc=$?" >> "$OUT/build.log") &
if [ "${AB_SKIP_BASE:-0}" != 1 ]; then
  copy_tree /tmp/base-src && cp -r "${AB_BASE:-.ab/old}/." /tmp/base-src/
  (build_tree /tmp/base-src /tmp/build-base -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF \
     -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_CLI=OFF -- _C > "$OUT/build-base.log" 2>&1
   echo "build rc=$?" >> "$OUT/build-base.log") &
fi
wait
for v in ${AB_VARIANTS:-}; do
  # One at a time: each lays its files over the source tree, builds, and puts the tree's files back.
  cp -a /tmp/build /tmp/build-$v && cp -a src /tmp/src-orig && cp -r ".ab/$v/." .
  ninja -C /tmp/build-$v _C flashattn_gpu_tests > "$OUT/build-$v.log" 2>&1
  echo "build rc=$? (variant $v)" >> "$OUT/build-$v.log"
  rm -rf src && mv /tmp/src-orig src
done
grep -h "build rc" "$OUT"/build*.log | tee -a "$summary"
grep -hE "\(C75[0-9]+\)|error" "$OUT"/build*.log | head -20 | tee -a "$summary"
}

say "GPU suite"
timeout "${AB_TEST_TIMEOUT:-330}" $t --gtest_filter="${AB_TESTS:-*}" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$summary"
grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]" "$OUT/gpu_tests.log" | head -40 | tee -a "$summary"
grep -E "Failure|Which is|error|worst" "$OUT/gpu_tests.log" | head -30 | tee -a "$summary"
for v in ${AB_VARIANTS:-}; do
  [ "${AB_PREBUILT:-0}" = 1 ] && continue
  timeout "${AB_TEST_TIMEOUT:-330}" /tmp/build-$v/tests/flashattn_gpu_tests \
    --gtest_filter="${AB_VARIANT_TESTS:-${AB_TESTS:-*}}" \
    > "$OUT/gpu_tests_$v.log" 2>&1
  echo "gpu tests rc=$? (variant $v)" | tee -a "$summary"
  grep -E "^\[  PASSED  \]|^\[  FAILED  \]" "$OUT/gpu_tests_$v.log" | head -10 | tee -a "$summary"
done

if [ "${AB_SANITIZE:-1}" = 1 ]; then
  say "compute-sanitizer on the backward's small cases"
  for tool in memcheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool $t \
      --gtest_filter='Paths/GpuBackward.TinyAllPaths/bfloat16_auto:Paths/GpuBackward.HeadDims/float16_auto' \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | head -2 | tr '\n' ' ')" |
      tee -a "$summary"
  done
fi

burst() {  # burst BUILD NAME [HEAD DIMS]
  PYTHONPATH=$1 timeout 200 python3 bench/gpu/burst_grid.py --backward --hd ${3:-${AB_HD:-64 128}} \
    --seqlens ${AB_SEQLENS:-2048 16384} --repeats "${AB_REPEATS:-2}" --seconds "${AB_SECONDS:-0.5}" \
    > "$OUT/ab_$2.md" 2>&1
}
say "backward against cuDNN in bursts: baseline, then the tree"
[ "${AB_SKIP_BASE:-0}" != 1 ] && burst "$base_py" base
burst "$tree_py" tree
for v in ${AB_VARIANTS:-}; do burst /tmp/build-$v/python "$v" "$(cat .ab/$v.hd 2>/dev/null || echo "${AB_VARIANT_HD:-}")"; done
for cell in ${AB_KERNEL_TIMES:-}; do
  IFS=: read -r hd seqlen causal <<< "$cell"
  name=${hd}_${seqlen}_$causal
  for build in base tree; do
    [ $build = base ] && [ "${AB_SKIP_BASE:-0}" = 1 ] && continue
    py=$tree_py; [ $build = base ] && py=$base_py
    PYTHONPATH=$py timeout 120 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python3 bench/gpu/backward_kernel_times.py --lib ours --hd "$hd" --seqlen "$seqlen" \
      $([ "$causal" = 1 ] && echo --causal) > "$OUT/kt_${build}_$name.csv" 2> "$OUT/kt_${build}_$name.log"
    { echo "-- kernels of one backward, $build, hd $hd, S $seqlen, causal $causal"
      python3 bench/gpu/backward_kernel_times.py --summarize "$OUT/kt_${build}_$name.csv"; } | tee -a "$summary"
  done
done
for f in "$OUT"/ab_*.md; do echo "-- $(basename "$f")"; cat "$f"; done | tee -a "$summary"
echo "done ($(elapsed))" | tee -a "$summary"
# The csv files of the kernel times go in with the logs: at most 8 files come back from a run.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log $(ls ./*.csv 2>/dev/null) 2>/dev/null)
