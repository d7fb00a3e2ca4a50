#!/usr/bin/env bash
# One GPU run: Nsight Compute on our forward kernel and on cuDNN's (PyTorch SDPA) at the same cells, one
# launch each under the same locked clocks, so that their pipe use (tensor, MUFU), L2 traffic, warp states and
# launch shapes can be read side by side. Optionally a gtest filter first (NCU_TESTS, carry .gtest-src), also
# under racecheck (NCU_RACECHECK: a second filter).
#   NCU_CELLS="64,2048,1 64,2048,0" (head dim, S, causal; B * S = 16k tokens, H * D = 2048, bf16)
# Logs in $OUT/ncu/ (ours_<cell>.txt, cudnn_<cell>.txt); a short table is printed.
set -uo pipefail
OUT=${OUT:-/tmp/ncu-out}
mkdir -p "$OUT/ncu"
source bench/gpu/device_common.sh
targets=(flashattn)
[ "${NCU_TESTS:-}" ] && targets+=(flashattn_gpu_tests)
build_tree . /tmp/build-ncu -DFLASHATTN_BUILD_CLI=OFF $(gtest_prefix_flag) -- "${targets[@]}" > "$OUT/ncu/build.log" 2>&1
echo "build rc=$?"
link_bench_program bench/gpu/bench_sm90_forward.cu /tmp/build-ncu/libflashattn.a /tmp/ncu_bench -lineinfo \
  >> "$OUT/ncu/build.log" 2>&1
echo "bench build rc=$?"
if [ "${NCU_TESTS:-}" ]; then
  timeout 200 /tmp/build-ncu/tests/flashattn_gpu_tests --gtest_filter="$NCU_TESTS" > "$OUT/ncu/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/ncu/tests.log" | head
fi
if [ "${NCU_RACECHECK:-}" ]; then
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 1 /tmp/build-ncu/tests/flashattn_gpu_tests \
    --gtest_filter="$NCU_RACECHECK" > "$OUT/ncu/racecheck.log" 2>&1
  echo "racecheck rc=$?"; grep -E "SUMMARY" "$OUT/ncu/racecheck.log" | tail -1
fi
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy)
metrics=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,gpu__time_duration.sum
for cell in ${NCU_CELLS:-64,2048,1 64,2048,0}; do
  IFS=, read -r d s c <<< "$cell"
  timeout 120 ncu "${sections[@]}" --metrics "$metrics" -k regex:forward_kernel --launch-skip 3 --launch-count 1 \
    /tmp/ncu_bench --iters 3 --only "persistent,$d,$s,$c" > "$OUT/ncu/ours_${d}_${s}_${c}.txt" 2>&1
  echo "ours $cell rc=$?"
  timeout 150 ncu "${sections[@]}" --metrics "$metrics" -k regex:'sdpa|fprop|flash' --launch-skip 1 --launch-count 1 \
    python3 bench/gpu/cudnn_kernels.py "$s" "$d,$c" > "$OUT/ncu/cudnn_${d}_${s}_${c}.txt" 2>&1
  echo "cudnn $cell rc=$?"
done
# The lines worth reading side by side.
for f in "$OUT"/ncu/ours_*.txt "$OUT"/ncu/cudnn_*.txt; do
  echo "== $(basename "$f")"
  grep -E "^  [a-z_]+.*(forward_kernel|sdpa|fprop|flash)|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Registers Per|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Block Size|Grid Size|Cluster Size|Warp Cycles Per Issued|pipe_xu|lts__t_bytes|gpu__time_duration|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$f" | head -40
done
