#!/usr/bin/env bash
# A/B of FP8 forward variants on one GPU, from prebuilt Python packages (bench/tools/prebuild_for_device.sh packs the
# baseline into .devbin/python.tar.xz; each variant travels as .devbin/_C-NAME.patch, device_common.sh's
# unpack_prebuilt_variant): fp8_bench.py in one process per build, the builds in rotation (base, variants..., then
# again), so that each cell's rounds of every build share the card's state; then the FP8 pytest cases (test_fp8_cuda.py
# and the FP8 cases of the FA3 and SDPA suites) and memcheck on the small ones, for each variant in FP8AB_CHECK.
#   FP8AB_VARIANTS="v1 v2"   the variants (names of the patches)
#   FP8AB_CHECK="v1"         the variants whose tests run (unset: all; empty: none)
#   FP8AB_BENCH="<fp8_bench.py args>"   (default: hd 128, 1k / 4k / 16k, causal and not, 2 repeats of 0.2 s)
#   FP8AB_ROUNDS=2
# Output under $OUT: bench-<round>-<build>.md, pytest-<variant>.log, memcheck-<variant>.log; a summary is printed.
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/fp8ab-out
unpack_prebuilt
base_path=$PYTHONPATH
variants=(${FP8AB_VARIANTS:?names of the variants})
for v in "${variants[@]}"; do unpack_prebuilt_variant "$v" || echo "variant $v: not unpacked" >> "$log"; done
bench_args=${FP8AB_BENCH:-"--hd 128 --seqlens 1024 4096 16384 --causal 0 1 --repeats 2 --seconds 0.2"}
for round in $(seq 1 "${FP8AB_ROUNDS:-2}"); do
  for build in base "${variants[@]}"; do
    path=$base_path
    [ "$build" = base ] || path=/tmp/build-$build/python
    PYTHONPATH=$path timeout 120 python3 bench/gpu/fp8_bench.py $bench_args > "$OUT/bench-$round-$build.md" 2>&1
  done
done
checked=(${FP8AB_CHECK-${variants[@]}})
for v in "${checked[@]}"; do
  export PYTHONPATH=/tmp/build-$v/python
  fp8_pytest "$OUT/pytest-$v.log"
  pytest_memcheck "$OUT/memcheck-$v.log" test_fp8_cuda.py "one_row or varlen or hd128_causal_sq or hd256_window"
done
echo "==== summary $(( $(date +%s) - t0 )) s"; head -2 "$log"; grep -v "^$" "$log" | tail -n +3 | head
for f in "$OUT"/bench-*.md; do echo "--- $(basename "$f")"; grep -E "^\| [0-9]|ceiling|Error" "$f"; done
for v in "${checked[@]}"; do
  echo "--- $v"; tail -2 "$OUT/pytest-$v.log"; grep -E "^FAILED" "$OUT/pytest-$v.log" | head
  grep -E "ERROR SUMMARY|passed|failed|rc=" "$OUT/memcheck-$v.log" | tail -3
done
