#!/usr/bin/env bash
# One run that checks the whole project on a GPU: builds everything (library, CLI, C++ suites, Python
# module) with 16 cores, runs every GPU test, memcheck on small cases, the Python suite on CUDA, the
# side-by-side benchmark against PyTorch SDPA and the long-sequence memory check through the CLI.
# Results go to $OUT (summary.txt, bench.*, the logs in logs.tgz); the summary is printed last.
#
#   bash bench/gpu/device_full_check.sh          (carry .gtest-src when the device has no googletest)
#   FULL_QUICK=1   benchmark only S in {2k, 16k};  FULL_MEMCHECK=0 skips compute-sanitizer;
#   FULL_{TEST,BENCH,PYTEST}_TIMEOUT=seconds bound each step
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/full-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
say() { printf '\n==== %s\n' "$*" | tee -a "$summary"; }
t_start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }

say "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$summary"
{ git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null; } | tee -a "$summary"

source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)

say "build ($(elapsed))"
build_tree . /tmp/build -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF $prefix > "$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc ($(elapsed))" | tee -a "$summary"
[ $rc -eq 0 ] || { grep -E "error|Error" "$OUT/build.log" | head -30; tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/build/python

say "C++ GPU suite ($(elapsed))"
timeout ${FULL_TEST_TIMEOUT:-240} /tmp/build/tests/flashattn_gpu_tests > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$summary"
grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]" "$OUT/gpu_tests.log" | head -40 | tee -a "$summary"

say "benchmark vs PyTorch SDPA ($(elapsed))"
quick=()
[ "${FULL_QUICK:-0}" = 1 ] && quick=(--quick)
timeout ${FULL_BENCH_TIMEOUT:-240} python3 bench/gpu/bench_vs_torch.py --out "$OUT/bench" "${quick[@]}" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$summary"
grep -E "^\| |^## " "$OUT/bench.md" 2>/dev/null | tee -a "$summary" >/dev/null
say "CLI: 128k-token single sequence, head dim 128 ($(elapsed))"
timeout 60 /tmp/build/flashattn run --batch 1 --seqlen 131072 --heads 16 --head-dim 128 --causal \
  --warmup 1 --iters 3 > "$OUT/cli_128k.txt" 2>&1
cat "$OUT/cli_128k.txt" | tee -a "$summary"

say "Python suite on CUDA ($(elapsed))"
(cd /tmp && timeout ${FULL_PYTEST_TIMEOUT:-200} python3 -m pytest -q -x -p no:cacheprovider "$OLDPWD/tests/python" -m cuda) > "$OUT/pytest_cuda.log" 2>&1
tail -5 "$OUT/pytest_cuda.log" | tee -a "$summary"

if [ "${FULL_MEMCHECK:-1}" = 1 ]; then
say "memcheck on small cases ($(elapsed))"
timeout 150 compute-sanitizer --tool memcheck /tmp/build/tests/flashattn_gpu_tests \
  --gtest_filter='*TinyAllPaths*:Sm90ForwardSupport.*:*smem99k_0*:*smem99k_5*:*Sm90Forward*f16_d64_causal_sq_lt_sk*:*Sm90Forward*bf16_d64_gqa*' \
  > "$OUT/memcheck.log" 2>&1
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$OUT/memcheck.log" | tee -a "$summary"
say "racecheck on small cases ($(elapsed))"
timeout 150 compute-sanitizer --tool racecheck /tmp/build/tests/flashattn_gpu_tests \
  --gtest_filter='*TinyAllPaths/float16*:*Sm90Forward*bf16_d128_causal_tail*:*smem99k_0*:*Sm90Forward*f16_d64_causal_sq_lt_sk*' \
  > "$OUT/racecheck.log" 2>&1
grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$OUT/racecheck.log" | tee -a "$summary"

fi

echo "done ($(elapsed))" | tee -a "$summary"

# The device tool returns only a few files per call: the logs travel as one archive beside the summary and the
# benchmark's outputs.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log cli_128k.txt 2>/dev/null)

echo; echo "================ SUMMARY"; cat "$summary"
