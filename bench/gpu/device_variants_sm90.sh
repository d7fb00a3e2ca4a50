#!/usr/bin/env bash
# A/B timing of Hopper kernel variants in one GPU run (the forward's tile plans, or with SM90V_KERNEL=backward
# the backward kernel). Each $SM90V_DIR/<name>.sed edits a copy of src/cuda/sm90/forward_config.h (a <name>.patch
# instead applies to a copy of the tree with patch -p1, for changes beyond the config: e.g. the previous version
# of the kernel); only the kernel's unit (forward_sm90.cu or backward_sm90.cu) is recompiled for it and linked
# ahead of the main build's library (whose own object for that unit the linker then leaves out), so a variant
# costs one compile, all of them in parallel. bench_sm90_forward (the persistent grid, as dispatched) then runs
# for the baseline and every variant, SM90V_PASSES times in rotation (the spread between passes is the noise to
# read differences against).
# Results: $OUT/variants.txt (one column per build, the lower of the passes) and the raw CSVs.
#   The variant name "tree" builds the working tree unedited, the same way as every variant (the base binary comes
#   from the CMake build and has shown a bias of a few per cent against variant builds).
#   SM90V_DIR: where the variants are (default bench/gpu/sm90_variants). The tree holds no variants: write the
#   .sed / .patch files of an experiment there (or anywhere, and point SM90V_DIR at it). With none, the run times
#   the base (and "tree" when SM90V_VARIANTS names it). The variants and ceiling patches measured so far (tile
#   plans, turns, pipelines, clusters, no-load / no-softmax / no-store ceilings, the clock probe) are at git tag
#   results-archive-2026-12-01 under bench/gpu/sm90_*/, with their results in bench/results/hopper-forward.md.
#   SM90V_VARIANTS="a b" (default: every .sed and .patch there); SM90V_PASSES=2; SM90V_GRID=persistent; SM90V_ITERS=20;
#   SM90V_TESTS=<gtest filter> also builds and runs those GPU tests on the baseline (carry .gtest-src).
#   SM90V_SUSTAINED="persistent,64,2048,1:3000 ..." (cell:launches) adds SM90V_ROUNDS (3) rounds of sustained
#   timing per build, after the passes (SM90V_PASSES=0 for sustained only): $OUT/sustained.txt and its summary.
#   SM90V_KERNEL=backward: variants recompile src/cuda/sm90/backward_sm90.cu instead and are timed with
#   backward_bench (FA_BWD_BACKEND=cuda_sm90) at SM90V_SEQS (default "1024 2048 4096 16384"); a variant's
#   .patch then edits the backward sources, and the "causal" column reads "det" for the deterministic rows.
set -uo pipefail
OUT=${OUT:-/tmp/sm90v-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
log=$OUT/build.log
targets=(flashattn)
tests=OFF
if [ "${SM90V_TESTS:-}" ]; then tests=ON; targets+=(flashattn_gpu_tests); fi
build_tree . /tmp/build-v -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_TESTS=$tests $(gtest_prefix_flag) -- \
  "${targets[@]}" > "$log" 2>&1 || { tail -30 "$log"; exit 1; }
lib=/tmp/build-v/libflashattn.a
dir=${SM90V_DIR:-bench/gpu/sm90_variants}
variants=${SM90V_VARIANTS:-$(ls "$dir" 2>/dev/null | grep -E '\.(sed|patch)$' | sed -E 's/\.(sed|patch)$//')}
kernel=${SM90V_KERNEL:-forward}
unit=src/cuda/sm90/${kernel}_sm90.cu
[ -f "$unit" ] || { echo "SM90V_KERNEL=$kernel: no $unit"; exit 1; }
bench_src=bench/gpu/bench_sm90_forward.cu
[ "$kernel" = backward ] && bench_src=bench/gpu/backward_bench.cu
# The library's flags for its sm_90a units (CMakeLists.txt: Release, -lineinfo), so that the variant "tree" (the
# working tree unedited) builds the base's code: compare variants with it, not with the base binary.
cuda_flags=(-O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] --expt-relaxed-constexpr -std=c++17 -lineinfo)
bench_flags=(-O2 -std=c++17 -arch=sm_90 -Iinclude -Isrc "$bench_src")
nvcc "${bench_flags[@]}" "$lib" -Xcompiler -fopenmp -o /tmp/bench_v_base >> "$log" 2>&1 &
for v in $variants; do
  (
    rm -rf "/tmp/v-$v" && mkdir -p "/tmp/v-$v" && cp -r src include "/tmp/v-$v/" &&
      if [ "$v" = tree ]; then
        true
      elif [ -f "$dir/$v.sed" ]; then
        sed -i -f "$dir/$v.sed" "/tmp/v-$v/src/cuda/sm90/forward_config.h" &&
          # A sed whose lines no longer match the config would time the tree under the variant's name.
          if cmp -s src/cuda/sm90/forward_config.h "/tmp/v-$v/src/cuda/sm90/forward_config.h"; then
            echo "variant $v: its sed changed nothing in forward_config.h (written for an older config?)" >> "$log"
            false
          fi
      else
        patch -s -p1 -d "/tmp/v-$v" < "$dir/$v.patch"
      fi &&
      nvcc "${cuda_flags[@]}" -I"/tmp/v-$v/include" -I"/tmp/v-$v/src" -c "/tmp/v-$v/$unit" \
        -o "/tmp/v-$v/${kernel}_sm90.o" -Xptxas -v > "/tmp/v-$v/ptxas.log" 2>&1 &&
      nvcc "${bench_flags[@]}" "/tmp/v-$v/${kernel}_sm90.o" "$lib" -Xcompiler -fopenmp -o "/tmp/bench_v_$v" \
        >> "/tmp/v-$v/ptxas.log" 2>&1
    echo "variant $v build rc=$?" >> "$log"
    grep -E "spill" "/tmp/v-$v/ptxas.log" | sort | uniq -c >> "$log"
    # ptxas serialising a kernel's wgmmas (C7510: a call, C7511: registers, C7515: accumulator writes) costs
    # 10-30%: a variant's timing means nothing until these are gone.
    grep -oE "C75[0-9]+[^']*'[^']*'" "/tmp/v-$v/ptxas.log" | sed -E 's/_ZN.*forward_kernel|_ZN.*backward_kernel//' |
      sort | uniq -c | sed "s/^/variant $v serialised: /" >> "$log"
    diff <(cat src/cuda/sm90/forward_config.h) "/tmp/v-$v/src/cuda/sm90/forward_config.h" >> "$log"
  ) &
done
wait
if [ "${SM90V_TESTS:-}" ]; then  # the baseline's tests, while nothing else runs on the GPU
  timeout 200 /tmp/build-v/tests/flashattn_gpu_tests --gtest_filter="$SM90V_TESTS" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT/tests.log"
fi
builds=(base $variants)
for pass in $(seq 1 "${SM90V_PASSES:-2}"); do
  for v in "${builds[@]}"; do
    [ -x "/tmp/bench_v_$v" ] || continue
    if [ "$kernel" = backward ]; then
      FA_BWD_BACKEND=cuda_sm90 timeout 150 "/tmp/bench_v_$v" ${SM90V_SEQS:-1024 2048 4096 16384} \
        > "$OUT/$v.pass$pass.md" 2>&1
    else
      timeout 120 "/tmp/bench_v_$v" --csv --grid "${SM90V_GRID:-persistent}" --iters "${SM90V_ITERS:-20}" \
        > "$OUT/$v.pass$pass.csv" 2>&1
    fi
  done
done
python3 - "$OUT" "${builds[@]}" > "$OUT/variants.txt" <<'PY'
import csv, glob, os, sys
out, builds = sys.argv[1], sys.argv[2:]
def rows(f):
    if f.endswith(".csv"):
        return csv.DictReader(open(f))
    # backward_bench's markdown: | S | B | H | D | causal | mode | ms | TFLOP/s |
    out = []
    for line in open(f):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) == 8 and c[0].isdigit():
            out.append({"hd": c[3], "seqlen": c[0], "causal": "-1" if c[5] == "deterministic" else c[4], "tflops": c[7]})
    return out
best = {}
for b in builds:
    for f in glob.glob(os.path.join(out, b + ".pass*.csv")) + glob.glob(os.path.join(out, b + ".pass*.md")):
        for r in rows(f):
            try:
                key = (int(r["hd"]), int(r["seqlen"]), int(r["causal"]))
                t = float(r["tflops"])
            except (KeyError, ValueError, TypeError):
                continue
            best.setdefault(b, {}).setdefault(key, []).append(t)
keys = sorted({k for v in best.values() for k in v})
widths = [max(14, len(b) + 2) for b in builds]
print("hd     S  causal " + "".join(f"{b:>{w}}" for b, w in zip(builds, widths)))
for k in keys:
    cells = []
    for b in builds:
        ts = best.get(b, {}).get(k)
        cells.append(f"{min(ts):8.0f} ({max(ts) - min(ts):3.0f})" if ts else f"{'-':>14}")
    print(f"{k[0]:3d} {k[1]:6d} {'det' if k[2] < 0 else k[2]:>4}   " + "".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
print("(TFLOP/s: the lower pass, and in brackets the spread between passes)")
PY
# Sustained timing (forward only): each cell's reading is the median of many back-to-back launches (about a
# second), so the card runs at the clock its power draw allows; rounds rotate the builds. Readings repeat within
# 1% where 20-launch passes spread by 5-15% (bench/results/hopper-forward.md, "Timing on this card").
if [ "${SM90V_SUSTAINED:-}" ] && [ "$kernel" = forward ]; then
  for round in $(seq 1 "${SM90V_ROUNDS:-3}"); do
    for v in "${builds[@]}"; do
      [ -x "/tmp/bench_v_$v" ] || continue
      for cell in $SM90V_SUSTAINED; do  # GRID,HD,S,CAUSAL:LAUNCHES
        printf '%s %s %s\n' "$round" "$v" \
          "$(timeout 60 "/tmp/bench_v_$v" --csv --only "${cell%%:*}" --iters "${cell##*:}" | tail -1)"
      done
    done
  done > "$OUT/sustained.txt"
  sort -k2,2 -s "$OUT/sustained.txt" | awk -F'[ ,]' '{print $2, $3 "," $4 "," $5 "," $6, $8}' |
    awk '{k = $1 " " $2; v[k] = v[k] " " $3} END {for (k in v) print k ":" v[k]}' | sort > "$OUT/sustained_summary.txt"
fi
grep -E "rc=|spill|serialised" "$log"
if [ -f "$OUT/sustained_summary.txt" ]; then
  echo "sustained TFLOP/s per round (build cell: rounds):"
  cat "$OUT/sustained_summary.txt"
fi
# The base's own ptxas lines (the variants' are summarised above as "serialised").
grep -oE "^ptxas.*\(C75[0-9]+\)" "$log" | sort | uniq -c | sed 's/^/base build: wgmma serialised /'
[ -f "$OUT/tests.log" ] && grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|Failure" "$OUT/tests.log" | head -20
cat "$OUT/variants.txt"
