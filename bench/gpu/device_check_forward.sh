#!/usr/bin/env bash
# One GPU run for the sm80 forward: build (whole tree, sm_90, all cores), GPU tests, compute-sanitizer
# memcheck + racecheck on the tiny cases, resource usage, our timings and PyTorch's flash backend side by side.
# Logs go to $OUT (6 files); a short summary is printed last. Needs googletest: the system's, or sources in
# .gtest-src (carried).
set -uo pipefail
OUT=${OUT:-/tmp/fwd-out}
mkdir -p "$OUT"
log=$OUT/build.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$log" 2>&1
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
t0=$(date +%s)
build_tree . /tmp/build-fwd -DFLASHATTN_BUILD_CLI=OFF $prefix -- flashattn_gpu_tests >> "$log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
link_bench_program bench/gpu/forward_bench.cu /tmp/build-fwd/libflashattn.a /tmp/forward_bench >> "$log" 2>&1 &
bench_pid=$!
for f in /tmp/build-fwd/CMakeFiles/flashattn.dir/src/cuda/sm80/forward_hd*.o; do
  echo "== $f"; cuobjdump --dump-resource-usage "$f" | grep -E "Function|REG"
done > "$OUT/resources.txt" 2>&1
t=/tmp/build-fwd/tests/flashattn_gpu_tests
timeout 240 $t --gtest_filter="${FWD_TESTS:-*Sm80Forward*}" > "$OUT/tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/tests.log"
san=$OUT/sanitizer.log
timeout 150 compute-sanitizer --tool memcheck $t --gtest_filter='*tiny_*:*RejectsWhat*' > "$san" 2>&1
timeout 120 compute-sanitizer --tool racecheck $t --gtest_filter='*tiny_len17*:*tiny_varlen*:*tiny_misaligned*' \
  >> "$san" 2>&1
wait $bench_pid
timeout 120 /tmp/forward_bench 1024 4096 16384 > "$OUT/bench.txt" 2>&1
timeout 120 python3 bench/gpu/torch_flash_fwd.py 1024 4096 16384 > "$OUT/torch.txt" 2>&1
# Optional A/B: bench/gpu/forward_variant.sed edits forward_config.h in a second tree; only the timings run.
if [ -f bench/gpu/forward_variant.sed ]; then
  copy_tree /tmp/fwdsrc2
  sed -i -f bench/gpu/forward_variant.sed /tmp/fwdsrc2/src/cuda/sm80/forward_config.h
  { build_tree /tmp/fwdsrc2 /tmp/build-fwd2 -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_TESTS=OFF -- flashattn &&
    link_bench_program bench/gpu/forward_bench.cu /tmp/build-fwd2/libflashattn.a /tmp/forward_bench2; } >> "$log" 2>&1
  { grep -v "^#" bench/gpu/forward_variant.sed; timeout 90 /tmp/forward_bench2 4096 16384; } > "$OUT/variant.txt" 2>&1
fi
echo "==== summary"; head -2 "$log"; grep "build rc" "$log"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests rc|^\[==========\]" "$OUT/tests.log" | head -30
grep "\[ errors \]" "$OUT/tests.log" | awk '{print $6}' | sort -g | tail -1 | sed 's/^/worst O error: /'
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$san"
grep -E "REG" "$OUT/resources.txt" | head -6
cat "$OUT/bench.txt"; tail -26 "$OUT/torch.txt"; cat "$OUT/variant.txt" 2>/dev/null
