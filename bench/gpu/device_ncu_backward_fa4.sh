#!/usr/bin/env bash
# Nsight Compute on every kernel of one backward call, ours and FlashAttention-4's Hopper kernels side by side
# (bench/gpu/backward_kernel_times.py: one profiled backward after three warm-up ones, bf16, B·S = 16k tokens,
# H·D = 2048), under ncu's locked base clocks: duration, instructions issued, issue-slot and tensor-pipe use, warp
# states, shared-memory and L2 traffic of the main kernel and of the small ones around it.
# Runs after bench/gpu/device_fa4_grid.sh on the same machine (FA4 in /tmp/fa4site, our module in $BUILD).
#   NCU_BWD_CELLS="64,16384,0 128,16384,0" (head dim, S, causal)   NCU_BWD_LIBS="ours fa4"
# Reports in $OUT/ncu/<lib>_<cell>.txt; the lines worth comparing are printed.
set -uo pipefail
OUT=${OUT:-/tmp/ncu-bwd-out}
mkdir -p "$OUT/ncu"
BUILD=${BUILD:-/tmp/build-fa4}
sections=(--print-details all --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy
  --section MemoryWorkloadAnalysis)
base_metrics=gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
extra_metrics=${NCU_BWD_METRICS:-sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active}
profile() {  # profile LIB D S CAUSAL METRICS > report
  local causal_flag=()
  [ "$4" = 1 ] && causal_flag=(--causal)
  timeout 200 ncu --profile-from-start off "${sections[@]}" --metrics "$5" \
    env PYTHONPATH="$BUILD/python" python3 bench/gpu/with_fa4.py bench/gpu/backward_kernel_times.py \
    --lib "$1" --hd "$2" --seqlen "$3" "${causal_flag[@]}"
}
for cell in ${NCU_BWD_CELLS:-64,16384,0 128,16384,0}; do
  IFS=, read -r d s c <<< "$cell"
  for lib in ${NCU_BWD_LIBS:-ours fa4}; do
    report=$OUT/ncu/${lib}_${d}_${s}_${c}.txt
    profile "$lib" "$d" "$s" "$c" "$base_metrics,$extra_metrics" > "$report" 2>&1
    rc=$?
    if grep -q "Failed to find metric\|invalid metric" "$report"; then  # an older ncu: the base metrics only
      profile "$lib" "$d" "$s" "$c" "$base_metrics" > "$report" 2>&1
      rc=$?
    fi
    echo "$lib $cell rc=$rc"
  done
done
for f in "$OUT"/ncu/*.txt; do
  echo "== $(basename "$f")"
  grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|\
Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Registers Per|Dynamic Shared Memory \
Per Block|Block Size|Grid Size|Cluster Size|Warp Cycles Per Issued|Executed Instructions  |pipe_xu|gmma|\
inst_executed.sum|Mem Busy|Max Bandwidth|Stall" "$f" | head -60
done
