#!/usr/bin/env bash
# One device call: the whole C++ GPU suite, then Nsight Compute on one launch of the Hopper backward's main kernel
# (head dim 128, S = 4096, non-causal, from bench/gpu/backward_bench.cu): speed of light, warp states, scheduler,
# and the SASS lines where warps stall most. Logs in $OUT (logs.tgz); summary printed last. Carry .gtest-src.
set -uo pipefail
OUT=${OUT:-/tmp/prof-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
build_tree . /tmp/build-prof -DFLASHATTN_BUILD_CLI=OFF $prefix -- flashattn_gpu_tests > "$OUT/build.log" 2>&1
echo "build rc=$?"
nvcc -O2 -std=c++17 -arch=sm_90 -lineinfo -Iinclude bench/gpu/backward_bench.cu /tmp/build-prof/libflashattn.a \
  -Xcompiler -fopenmp -o /tmp/backward_bench >> "$OUT/build.log" 2>&1 &
bench_pid=$!
timeout ${PROF_TEST_TIMEOUT:-200} /tmp/build-prof/tests/flashattn_gpu_tests > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"
grep -E "^\[==========\]|^\[  PASSED  \]|^\[  FAILED  \]" "$OUT/gpu_tests.log" | head -20
wait $bench_pid
# backward_bench with one length runs, per head dim, non-causal then causal (22 launches each, deterministic
# unsupported on cuda_sm90): launch 44 of backward_kernel is the first timed-shape launch at head dim 128.
FA_BWD_BACKEND=cuda_sm90 timeout 150 ncu --launch-skip 44 --launch-count 1 -k regex:backward_kernel \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section SourceCounters --section LaunchStats --section Occupancy /tmp/backward_bench 4096 > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "backward_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Stall|stall|Warp Cycles|Issued Warp|No Eligible|Active Warps|Eligible Warps|Executed Ipc|SM Busy|Pipe|Warning|Estimated Speedup|Local" "$OUT/ncu.txt" | head -70
sed -n '/Source Counters/,$p' "$OUT/ncu.txt" | head -60
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
