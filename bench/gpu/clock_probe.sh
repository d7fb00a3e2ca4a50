#!/usr/bin/env bash
# One device call: the Hopper forward at 16k (hd 128 and 256) as it is, without K/V loads and without loads or
# softmax (bench/gpu/sm90_experiments/), each run for ~5 s while nvidia-smi samples the SM clock and the board
# power. Tells a cost paid in clock (power) from one paid in cycles. Run from the repository root.
set -uo pipefail
SM90V_DIR=bench/gpu/sm90_experiments SM90V_VARIANTS="noload gemm_only" SM90V_PASSES=1 \
  bash bench/gpu/device_variants_sm90.sh > /dev/null 2>&1
for v in base noload gemm_only; do
  for cell in persistent,128,16384,0 persistent,256,16384,0; do
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > /tmp/smi.txt &
    pid=$!
    "/tmp/bench_v_$v" --only "$cell" --iters 1500 | tail -1
    kill "$pid"
    echo "$v $cell: $(tail -n +5 /tmp/smi.txt | head -n -2 |
      awk -F, '{c+=$1; p+=$2; n++} END {printf "sm clock %.0f MHz, power %.0f W (%d samples)", c/n, p/n, n}')"
  done
done
