#!/usr/bin/env bash
# A/B of decode pipeline depths on the GPU: builds the Python module, then for each entry of DEC_STAGES (K/V
# tiles in flight for the head-dim 128 bucket) rewrites decode_config.h in place, rebuilds (only the decode
# objects change), runs the KV-cache GPU tests of that plan and a reduced decode benchmark; the first
# plan runs again last to bracket clock drift. decode_config.h is restored at the end. Output: $OUT/plans.log.
set -uo pipefail
OUT=${OUT:-/tmp/decvar-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
cfg=src/cuda/sm80/decode_config.h
cp $cfg /tmp/decode_config.h.orig
build_tree . /tmp/build-var -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF \
  $prefix > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/build-var/python
plans=(${DEC_STAGES:-3})
first=${plans[0]}
for plan in "${plans[@]}" "$first"; do
  cp /tmp/decode_config.h.orig $cfg
  sed -i "s/bucket == 128 ? 3 :/bucket == 128 ? $plan :/" $cfg
  grep -o "bucket == 128 ? [0-9]* :" $cfg >> "$OUT/plans.log"
  ninja -C /tmp/build-var -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { echo "plan $plan: build failed" >> "$OUT/plans.log"; continue; }
  timeout 120 /tmp/build-var/tests/flashattn_gpu_tests --gtest_filter="${DEC_TESTS:-*GpuKVCache*d128*:*Graph*}" 2>&1 \
    | grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" | head -5 >> "$OUT/plans.log"
  timeout 200 python3 bench/gpu/decode_bench.py --out /tmp/var.json ${DEC_BENCH_ARGS:---batches 1 8 64 --contexts 1024 16384 131072 --pages 16 --calls 10 --reps 5 --rounds 2} \
    >> "$OUT/plans.log" 2>&1
done
cp /tmp/decode_config.h.orig $cfg
cat "$OUT/plans.log"
