#!/usr/bin/env bash
# One device call for issue 4 (Hopper forward): runs the sm90 GPU tests (primitives + forward grid), then
# times the sm90 forward (the planned kernels on each grid, two passes) and cuDNN (PyTorch SDPA) on the benchmark grid, prints the
# table, then runs compute-sanitizer memcheck / racecheck / synccheck on small subsets. Logs go to $OUT.
#
# Prepare here (no GPU needed), then run this on the device with build-sm90/carry carried:
#   cmake -S bench/gpu/sm90_check -B build-sm90 -G Ninja && ninja -C build-sm90 -j1
#   bench/gpu/device_check_sm90.sh --stage      # copies binaries, libgomp and googletest into build-sm90/carry
# On the device: bench/gpu/device_check_sm90.sh   (SM90_SKIP_SANITIZER=1 / SM90_SKIP_CUDNN=1 to skip steps)
# If the carried binaries do not start there, it builds them there (16 cores) from bench/gpu/sm90_check.
set -uo pipefail
cd "$(dirname "$0")/../.."
carry=build-sm90/carry

if [ "${1:-}" = "--stage" ]; then
  mkdir -p "$carry/lib"
  cp build-sm90/sm90_tests build-sm90/bench_sm90_forward "$carry/"
  cp /lib/x86_64-linux-gnu/libgomp.so.1 "$carry/lib/" 2>/dev/null || true
  [ -d "$carry/googletest" ] || cp -r /usr/src/googletest "$carry/googletest"
  du -sh "$carry"
  exit 0
fi

OUT=${OUT:-/tmp/sm90-out}
mkdir -p "$OUT"
say() { printf '\n==== %s\n' "$*" | tee -a "$OUT/summary.txt"; }
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/$carry/lib"

say "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$OUT/summary.txt"
nvcc --version 2>&1 | tail -2

TESTS=$carry/sm90_tests
BENCH=$carry/bench_sm90_forward
if ! "$TESTS" --gtest_list_tests >/dev/null 2>&1; then
  say "carried binaries do not start here; building on the device"
  prefix=()
  if [ ! -f /usr/include/gtest/gtest.h ]; then
    cmake -S "$carry/googletest" -B /tmp/gtest-build -G Ninja -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX=/tmp/gtest \
      >"$OUT/gtest_build.log" 2>&1 && ninja -C /tmp/gtest-build install >>"$OUT/gtest_build.log" 2>&1
    prefix=(-DCMAKE_PREFIX_PATH=/tmp/gtest)
  fi
  cmake -S bench/gpu/sm90_check -B /tmp/sm90-build -G Ninja "${prefix[@]}" >"$OUT/build.log" 2>&1 &&
    ninja -C /tmp/sm90-build -j16 >>"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  TESTS=/tmp/sm90-build/sm90_tests
  BENCH=/tmp/sm90-build/bench_sm90_forward
fi

say "GPU tests (primitives + forward grid)"
# Separate processes per group, so that a sticky CUDA error in one group cannot fail the others.
tests_rc=0
: >"$OUT/tests.log"
for filter in 'GpuSmoke.*:Sm90Primitives.Swizzle*:Sm90Primitives.Tma*' '*Wgmma*' 'Sm90Primitives.WarpSpecialised*' \
              '*Sm90Forward*'; do
  timeout 60 "$TESTS" --gtest_color=no --gtest_filter="$filter" >>"$OUT/tests.log" 2>&1
  rc=$?
  echo "tests [$filter] exit code $rc" | tee -a "$OUT/summary.txt"
  [ "$rc" = 124 ] && tests_rc=124
done
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|error|Failure" "$OUT/tests.log" | head -40 | tee -a "$OUT/summary.txt"

if [ "$tests_rc" = 124 ]; then
  # A hang in one kernel should not cost the whole call: time what runs (the bench prints as it goes, under
  # its own timeout), skip the sanitizers.
  say "the tests timed out (a kernel hangs?): timing anyway, no sanitizers"
  tail -20 "$OUT/tests.log"
  SM90_SKIP_SANITIZER=1
  SM90_ONE_PASS=1
fi

say "sm90 forward timing (bf16, B*S = 16k, H*D = 2048)"
timeout "$([ "${SM90_ONE_PASS:-0}" = 1 ] && echo 40 || echo 90)" "$BENCH" --csv >"$OUT/bench_sm90.csv" 2>&1
echo "bench exit code $?" >>"$OUT/summary.txt"
cat "$OUT/bench_sm90.csv" >>"$OUT/summary.txt"

if [ "${SM90_SKIP_CUDNN:-0}" != 1 ]; then
  say "cuDNN (PyTorch SDPA) on the same grid"
  timeout 90 python3 bench/gpu/sdpa_cudnn_grid.py >"$OUT/bench_cudnn.csv" 2>&1
  cat "$OUT/bench_cudnn.csv" >>"$OUT/summary.txt"
fi

if [ "${SM90_ONE_PASS:-0}" != 1 ]; then
  say "sm90 forward timing, second pass (run-to-run spread)"
  timeout 60 "$BENCH" --csv >"$OUT/bench_sm90_b.csv" 2>&1
  echo "bench (second pass) exit code $?" >>"$OUT/summary.txt"
fi

say "table: TFLOP/s per grid (rows) and shape (columns: hd/S-in-k/causal), both passes, cuDNN"
python3 - "$OUT/bench_sm90.csv" "$OUT/bench_sm90_b.csv" "$OUT/bench_cudnn.csv" <<'PY' | tee -a "$OUT/summary.txt"
import csv, sys
def load(p):
    try:
        return {(r["hd"], r["seqlen"], r["causal"]): r for r in csv.DictReader(l for l in open(p) if "," in l and not l.startswith("#"))}
    except Exception:
        return {}
def ours(p):
    d, names, shapes = {}, [], []
    try:
        for line in open(p):
            f = line.strip().split(",")
            if len(f) == 6 and f[0] != "grid":
                key = (f[1], f[2], f[3])
                d[(f[0], key)] = float(f[5])
                if f[0] not in names: names.append(f[0])
                if key not in shapes: shapes.append(key)
    except Exception:
        pass
    return d, names, shapes
a, names, shapes = ours(sys.argv[1])
b, _, _ = ours(sys.argv[2])
cudnn = load(sys.argv[3])
head = "".join(f"{k[0]}/{int(k[1]) // 1024}k/{k[2]}".rjust(11) for k in shapes)
for label, d in (("pass 1", a), ("pass 2", b)):
    print(f"{label:<28}" + head)
    for n in names:
        print(f"{n:<28}" + "".join((f"{d[(n, k)]:.0f}" if (n, k) in d else "-").rjust(11) for k in shapes))
print(f"{'cuDNN':<28}" + "".join(str(cudnn.get(k, {}).get("tflops", "-")).split(".")[0].rjust(11) for k in shapes))
print("best per shape (the lower of its two passes), planned and cuDNN:")
for k in shapes:
    score = lambda n: min(a.get((n, k), 0), b.get((n, k), a.get((n, k), 0)))
    best = max(names, key=score)
    print(f"  {k[0]:>3} {k[1]:>6} causal={k[2]}: {best:<26} {score(best):6.0f}   planned {score('planned'):6.0f}   cuDNN {cudnn.get(k, {}).get('tflops', '-')}")
PY
# One launch per listed cell under Nsight Compute (SM90_NCU="grid,hd,S,causal ..."; empty: none):
# where the issue slots and stalls go. The full report is in $OUT; the lines that name the limiter are printed.
for cell in ${SM90_NCU:-}; do
  say "ncu: $cell"
  log="$OUT/ncu_$(echo "$cell" | tr ',+' '__').txt"
  timeout 120 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy \
    -k regex:forward_kernel --launch-skip 3 --launch-count 1 "$BENCH" --iters 1 --only "$cell" >"$log" 2>&1
  echo "ncu exit code $?" | tee -a "$OUT/summary.txt"
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Stall|Registers Per|Warp Cycles Per Issued|Eligible Warps|Active Warps Per" "$log" | head -30 | tee -a "$OUT/summary.txt"
done

if [ "${SM90_SKIP_SANITIZER:-0}" != 1 ]; then
  say "compute-sanitizer memcheck (small subset)"
  timeout 30 compute-sanitizer --tool memcheck --print-limit 10 "$TESTS" --gtest_color=no \
    --gtest_filter='*TmaRing*:*bf16_d128_causal_tail*:*varlen_causal*:*bf16_d256_window*:*d64_causal_many_tiles*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck exit code $?" | tee -a "$OUT/summary.txt"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | tail -8 | tee -a "$OUT/summary.txt"
  for tool in racecheck synccheck; do
    say "compute-sanitizer $tool (ring + two forward cases)"
    timeout 25 compute-sanitizer --tool "$tool" --print-limit 10 "$TESTS" --gtest_color=no \
      --gtest_filter='*WarpSpecialised*:*bf16_d128_causal_tail*:*bf16_d64_ring_wraps*:*d64_causal_many_tiles*' >"$OUT/$tool.log" 2>&1
    echo "$tool exit code $?" | tee -a "$OUT/summary.txt"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/$tool.log" | tail -4 | tee -a "$OUT/summary.txt"
  done
fi

grep -E "^\[  (PASSED|FAILED) " "$OUT/tests.log" | tail -3
# The device tool returns only a few files per call: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
