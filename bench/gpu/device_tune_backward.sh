#!/usr/bin/env bash
# One GPU run for tuning the sm80 backward: build this tree (all cores), the backward GPU tests and
# racecheck on the tiny cases, then variants of the backward objects linked into copies of the library so that
# the timing program compares them on the same machine and clocks, and Nsight Compute on one bwd_dkdv launch
# per profile target (and on PyTorch's FlashAttention-2 kernel for the same shape). Logs go to $OUT.
#   BWD_VARIANTS="name:srcroot:nvcc-flags ..."  srcroot holds include/ and src/ of another tree (empty: this
#                                               one); flags comma-separated, e.g. "base:.base-src: m2::-DA=2,-DB=1"
#   BWD_NCU="variant:headdim ..."                profile targets ("new" is this tree), e.g. "new:128 base:128"
#   BWD_NCU_FA2="128"                           head dims of the FA2 profiles ("" for none)
#   BWD_SEQS="2048 16384"                       lengths of the timing table; BWD_TESTS: gtest filter
set -uo pipefail
OUT=${OUT:-/tmp/bwd-out}
mkdir -p "$OUT"
log=$OUT/log.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$log" 2>&1
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
t0=$(date +%s)
build_tree . /tmp/build-bwd -DFLASHATTN_BUILD_CLI=OFF $prefix -- flashattn_gpu_tests > /tmp/build.txt 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" >> "$log"
tail -5 /tmp/build.txt >> "$log"
lib=/tmp/build-bwd/libflashattn.a
bench_src=bench/gpu/backward_bench.cu
link_bench() { link_bench_program "$bench_src" "$1" "$2"; }

# Variants, compiled (all at once) while the GPU runs the tests.
variants() {
  link_bench "$lib" /tmp/bench_new || echo "link new failed"
  local pids=() spec name rest root flags dir f
  for spec in ${BWD_VARIANTS:-}; do
    name=${spec%%:*} rest=${spec#*:}
    root=${rest%%:*} flags=${rest#*:}
    root=${root:-.}
    dir=/tmp/var-$name
    mkdir -p "$dir"
    for f in backward backward_hd64 backward_hd128 backward_hd256; do
      [ "$root" = . ] && [ "$f" = backward ] && continue
      nvcc -DFLASHATTN_WITH_CUDA -DNDEBUG -O3 -std=c++17 "--generate-code=arch=compute_90,code=[compute_90,sm_90]" \
        --expt-relaxed-constexpr -lineinfo -Xcompiler=-fPIC -I"$root/include" -I"$root/src" ${flags//,/ } \
        -x cu -c "$root/src/cuda/sm80/$f.cu" -o "$dir/$f.cu.o" &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p" || echo "a variant compile failed"; done
  for spec in ${BWD_VARIANTS:-}; do
    name=${spec%%:*}
    dir=/tmp/var-$name
    cp "$lib" "$dir/lib.a" && ar r "$dir/lib.a" "$dir"/backward*.cu.o && link_bench "$dir/lib.a" "/tmp/bench_$name" ||
      echo "variant $name: link failed"
    cuobjdump --dump-resource-usage "$dir"/backward_hd*.cu.o | grep -E "bwd_dkdv|bwd_dq_kernel" -A1 |
      grep -oE "Li[0-9]+E|REG:[0-9]+ STACK:[0-9]+" | paste - - | sed "s/^/$name /" | sort -u
  done
}
variants > /tmp/variants.txt 2>&1 &
var_pid=$!
for f in /tmp/build-bwd/CMakeFiles/flashattn.dir/src/cuda/sm80/backward_hd*.o; do
  cuobjdump --dump-resource-usage "$f" | grep -E "bwd_dkdv|bwd_dq_kernel" -A1 |
    grep -oE "Li[0-9]+E|REG:[0-9]+ STACK:[0-9]+" | paste - - | sed "s/^/new /" | sort -u
done >> "$log" 2>&1

t=/tmp/build-bwd/tests/flashattn_gpu_tests
timeout 200 $t --gtest_filter="${BWD_TESTS:-*GpuBackward*}" > "$OUT/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests.txt"
timeout 120 compute-sanitizer --tool racecheck $t --gtest_filter='*TinyAllPaths/float16*' > "$OUT/san.txt" 2>&1
[ -n "${BWD_MEMCHECK:-}" ] && timeout 120 compute-sanitizer --tool memcheck $t --gtest_filter='*TinyAllPaths/bfloat16*' >> "$OUT/san.txt" 2>&1
wait $var_pid
cat /tmp/variants.txt >> "$log"

seqs=${BWD_SEQS:-2048 16384}
: > "$OUT/bench.txt"
for b in /tmp/bench_new $(for s in ${BWD_VARIANTS:-}; do echo "/tmp/bench_${s%%:*}"; done); do
  echo "## ${b#/tmp/bench_}" >> "$OUT/bench.txt"
  timeout 100 "$b" $seqs >> "$OUT/bench.txt" 2>&1
done

ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section Occupancy
  --section LaunchStats --section InstructionStats --section SourceCounters"
: > "$OUT/ncu.txt"
for target in ${BWD_NCU:-}; do
  name=${target%%:*} d=${target#*:}
  echo "######## $name hd$d" >> "$OUT/ncu.txt"
  timeout 90 "$ncu_bin" --clock-control none --kernel-name-base mangled \
    --kernel-name "regex:bwd_dkdv_kernelI13__nv_bfloat16Li${d}E" --launch-count 1 $sections \
    -o "/tmp/ncu_${name}_$d" -f "/tmp/bench_$name" 2048 > /dev/null 2>> "$OUT/ncu.txt"
  "$ncu_bin" --import "/tmp/ncu_${name}_$d.ncu-rep" --page details >> "$OUT/ncu.txt" 2>&1
  "$ncu_bin" --import "/tmp/ncu_${name}_$d.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/src_${name}_$d.csv" 2>&1
done
for d in ${BWD_NCU_FA2-128}; do
  echo "######## fa2 hd$d" >> "$OUT/ncu.txt"
  timeout 120 "$ncu_bin" --clock-control none --kernel-name regex:flash_bwd_dq_dk_dv --launch-count 1 $sections \
    -o "/tmp/ncu_fa2_$d" -f python3 bench/gpu/torch_flash_bwd.py --one "$d" 2048 > /dev/null 2>> "$OUT/ncu.txt"
  "$ncu_bin" --import "/tmp/ncu_fa2_$d.ncu-rep" --page details >> "$OUT/ncu.txt" 2>&1
  "$ncu_bin" --import "/tmp/ncu_fa2_$d.ncu-rep" --page source --csv --print-source sass > "$OUT/src_fa2_$d.csv" 2>&1
done
[ -n "${BWD_TORCH:-}" ] && timeout 150 python3 bench/gpu/torch_flash_bwd.py $seqs > "$OUT/torch.txt" 2>&1

echo "==== summary"; cat "$log"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc|^\[==========\]" "$OUT/tests.txt" | head -30
grep -E "Failure|Expected|Which is" "$OUT/tests.txt" | head -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$OUT/san.txt"
grep -E "^##|\| (2048|16384) " "$OUT/bench.txt"
grep -E "^########|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Executed Ipc A" "$OUT/ncu.txt" | head -60
[ -f "$OUT/torch.txt" ] && tail -14 "$OUT/torch.txt"
true
