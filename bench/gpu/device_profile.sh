#!/usr/bin/env bash
# One GPU run that profiles one launch of a Hopper kernel with Nsight Compute: speed of light, warp states,
# scheduler, then a full-set report whose per-instruction source counters are summarised by
# bench/gpu/ncu_source_summary.py (the SASS lines and opcodes where warps stall). Optionally the whole C++ GPU
# suite first. Logs in $OUT (logs.tgz; the summaries are printed). Carry .gtest-src when PROF_TESTS=1.
#   PROF_TARGET=backward (default): bench/gpu/backward_bench.cu, cuda_sm90, S = PROF_SEQ (4096), and launch
#     PROF_SKIP of backward_kernel (default 44: the first at head dim 128, non-causal; 0 = head dim 64).
#   PROF_TARGET=forward: bench/gpu/bench_sm90_forward.cu --only PROF_CELL (default persistent,128,2048,0), the
#     first launch after its 3 warm-up ones.
#   PROF_TARGET=fp8: the FP8 forward through Python (fa3.flash_attn_func on e4m3 inputs, B·S = 16k, H·D = 2048, head
#     dim PROF_HD (128), S = PROF_SEQ (4096)), the launch of forward_kernel after its 3 warm-up ones.
#   PROF_TESTS=1 runs the C++ GPU suite before profiling.
set -uo pipefail
OUT=${OUT:-/tmp/prof-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
targets=(flashattn)
[ "${PROF_TESTS:-0}" = 1 ] && targets+=(flashattn_gpu_tests)
python_flag=()
[ "${PROF_TARGET:-backward}" = fp8 ] && targets+=(_C) && python_flag=(-DFLASHATTN_BUILD_PYTHON=ON)
build_tree . /tmp/build-prof -DFLASHATTN_BUILD_CLI=OFF "${python_flag[@]}" $prefix -- "${targets[@]}" \
  > "$OUT/build.log" 2>&1
echo "build rc=$?"
lib=/tmp/build-prof/libflashattn.a
if [ "${PROF_TARGET:-backward}" = fp8 ]; then
  export PYTHONPATH=/tmp/build-prof/python
  hd=${PROF_HD:-128} seq=${PROF_SEQ:-4096}
  program=(python3 -c "
import torch
from flashattn import fa3
b, h = 16384 // $seq, 2048 // $hd
q, k, v = (torch.randn(b, $seq, h, $hd, device='cuda').to(torch.float8_e4m3fn) for _ in range(3))
for _ in range(4):
    fa3.flash_attn_func(q, k, v)
torch.cuda.synchronize()")
  kernel=forward_kernel
  skip=${PROF_SKIP:-3}
elif [ "${PROF_TARGET:-backward}" = forward ]; then
  link_bench_program bench/gpu/bench_sm90_forward.cu "$lib" /tmp/prof_program -lineinfo >> "$OUT/build.log" 2>&1
  program=(/tmp/prof_program --iters 3 --only "${PROF_CELL:-persistent,128,2048,0}")
  kernel=forward_kernel
  skip=${PROF_SKIP:-3}
else
  link_bench_program bench/gpu/backward_bench.cu "$lib" /tmp/prof_program -lineinfo >> "$OUT/build.log" 2>&1
  export FA_BWD_BACKEND=cuda_sm90
  program=(/tmp/prof_program "${PROF_SEQ:-4096}")
  kernel=backward_kernel
  skip=${PROF_SKIP:-44}
fi
echo "program build rc=$?"
# The SASS of the profiled kernels, to read the main loop beside the per-instruction counters.
case "${PROF_TARGET:-backward}" in
  forward) sass_obj=forward_sm90.cu.o ;;
  fp8) sass_obj=forward_sm90_fp8.cu.o ;;
  *) sass_obj=backward_sm90.cu.o ;;
esac
cuobjdump -sass "/tmp/build-prof/CMakeFiles/flashattn_sm90a.dir/src/cuda/sm90/$sass_obj" > "$OUT/sass.log" 2>&1
if [ "${PROF_TESTS:-0}" = 1 ]; then
  timeout ${PROF_TEST_TIMEOUT:-200} /tmp/build-prof/tests/flashattn_gpu_tests > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"
  grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]" "$OUT/gpu_tests.log" | head -20
fi
timeout 150 ncu --launch-skip "$skip" --launch-count 1 -k "regex:$kernel" \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section LaunchStats --section Occupancy "${program[@]}" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "$kernel|Duration|Compute \(SM\) Throughput|Registers Per|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible Warps|Executed Ipc|pipeline|Pipe" "$OUT/ncu.txt" | head -30
timeout 240 ncu --launch-skip "$skip" --launch-count 1 -k "regex:$kernel" --set full --import-source yes \
  -o /tmp/prof-full -f "${program[@]}" > "$OUT/ncu_full.log" 2>&1
echo "ncu full rc=$?"
ncu -i /tmp/prof-full.ncu-rep --page source --csv --print-source sass > "$OUT/source.csv" 2> "$OUT/source.err"
python3 bench/gpu/ncu_source_summary.py "$OUT/source.csv" --top 40 > "$OUT/stalls.txt" 2>&1
cat "$OUT/stalls.txt" | head -75
ncu -i /tmp/prof-full.ncu-rep --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
if len(rows) >= 3:
    for name, value in zip(rows[0], rows[2]):
        if 'smsp__average_warp' in name and 'issue_stalled' in name and 'ratio' in name:
            print(name, value)
" > "$OUT/stall_reasons.txt" 2>&1
sort -t' ' -k2 -g -r "$OUT/stall_reasons.txt" | head -14
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./source.csv 2>/dev/null)
