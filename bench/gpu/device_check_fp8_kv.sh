#!/usr/bin/env bash
# One GPU run for float8_e4m3fn KV caches on the split-KV decode kernel (src/cuda/sm80/decode_kernel.cuh, kFp8):
# the FP8 KV-cache cases of test_fa3.py on CUDA, the 16-bit KV-cache CUDA cases (test_kvcache.py), the decode
# benchmark with our FP8 caches beside the bf16 ones and cuDNN (bench/gpu/decode_bench.py --fp8), then
# compute-sanitizer memcheck on the FP8 cases. Logs go to $OUT; a summary is printed last.
#   PREBUILT=<build dir> (carried; its python/ holds flashattn/_C) skips the build: this tree's Python files are
#   copied over the build's. DECODE_ARGS="<decode_bench.py args>" (empty: no benchmark). PROFILE=1: ncu of the
#   decode kernel (GQA 32 / 8, d 128) at b 64, 32k keys (e4m3 and bf16 caches) and b 1, 1k keys (bf16)
#   ($OUT/ncu_*.txt).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/fp8kv-out
if [ -n "${PREBUILT:-}" ]; then
  cp -r "$R/python/flashattn/." "$R/$PREBUILT/python/flashattn/"
  export PYTHONPATH=$R/$PREBUILT/python
  echo "prebuilt $PREBUILT" >> "$log"
else
  build_python_tree /tmp/build-kv -- _C
  export PYTHONPATH=/tmp/build-kv/python
fi
(cd /tmp && timeout 150 python3 -m pytest -q -p no:cacheprovider "$R/tests/python/test_fa3.py" -k "fp8_kvcache" \
   > "$OUT/pytest-fp8.log" 2>&1
 echo "pytest-fp8 rc=$?" >> "$OUT/pytest-fp8.log")
(cd /tmp && timeout 150 python3 -m pytest -q -x -p no:cacheprovider "$R/tests/python/test_kvcache.py" -m cuda \
   > "$OUT/pytest-kv16.log" 2>&1
 echo "pytest-kv16 rc=$?" >> "$OUT/pytest-kv16.log")
decode_args=${DECODE_ARGS-"--batches 1 8 64 --contexts 4096 32768 --pages 16 --fp8 --rounds 2"}
if [ -n "$decode_args" ]; then
  timeout 120 python3 bench/gpu/decode_bench.py $decode_args --out "$OUT/decode.json" --md "$OUT/decode.md" \
    > "$OUT/decode.log" 2>&1
  echo "decode bench rc=$?" >> "$OUT/decode.log"
fi
if [ -n "${PROFILE:-}" ]; then
  cat > /tmp/one_cell.py <<'PY'
import sys, torch, flashattn
from flashattn import fa3
dtype, b, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
k = torch.randn(b, ctx, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
s = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
for _ in range(3):
    if dtype == "fp8":
        f8 = torch.float8_e4m3fn
        fa3.flash_attn_with_kvcache(q.to(f8), k.to(f8), v.to(f8), cache_seqlens=s)
    else:
        flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=s, check_index_values=False)
torch.cuda.synchronize()
PY
  for cell in "fp8 64 32768" "bf16 64 32768" "bf16 1 1024"; do
    timeout 120 ncu --kernel-name regex:decode_kernel --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section InstructionStats --section MemoryWorkloadAnalysis python3 /tmp/one_cell.py $cell \
      > "$OUT/ncu_${cell// /_}.txt" 2>&1
  done
fi
pytest_memcheck "$OUT/memcheck.log" test_fa3.py "fp8_kvcache and cuda"
echo "==== summary $(( $(date +%s) - t0 )) s"; head -2 "$log"; grep -E "build rc|prebuilt" "$log"; grep -E " error" "$log" | head
for f in pytest-fp8 pytest-kv16; do tail -3 "$OUT/$f.log"; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head; done
[ -f "$OUT/decode.md" ] && cat "$OUT/decode.md"
[ -f "$OUT/decode.log" ] && tail -3 "$OUT/decode.log"
grep -E "ERROR SUMMARY|passed|failed|rc=" "$OUT/memcheck.log" | tail -3
for f in "$OUT"/ncu_*.txt; do
  [ -f "$f" ] && { echo "== $f"; grep -E "Duration|Throughput|Pipe|Issue Slots|Warp Cycles|Eligible|Registers|Achieved Occ|L1/TEX Hit|Executed Ipc" "$f" | head -30; }
done
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
