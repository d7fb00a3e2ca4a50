#!/usr/bin/env bash
# FlashAttention-3's own test suite (hopper/test_flash_attn.py) against flashattn.fa3 on the GPU: a fixed random
# sample of its cases, failures counted by message (bench/results/test-quality.md has the CPU run). The suite is
# not part of this tree: carry [".fa3suite"], a directory holding that file with its test_util.py and padding.py
# (Dao-AILab/flash-attention 0251105a), a one-line flash_attn_interface.py re-exporting flashattn.fa3, a pure-torch
# stand-in for flash_attn.layers.rotary.apply_rotary_emb, einops under site/, and sample.txt (the case ids).
#   FA3_SUITE_SECONDS=400 (the pytest run's limit; cases run in sample.txt's shuffled order)
# Output: $OUT/fa3_suite.log, $OUT/summary.txt (printed).
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/fa3-suite-out
[ -d .fa3suite ] || { echo "carry [\".fa3suite\"]: FA3's test files and the sample (see this script's header)"; exit 2; }
build_python_tree /tmp/build-fa3suite -- _C
grep -q "build rc=0" "$log" || { grep -E "error" "$log" | head -20; exit 1; }
cd .fa3suite
PYTHONPATH="$PWD/site:$PWD:/tmp/build-fa3suite/python" timeout "${FA3_SUITE_SECONDS:-400}" \
  python3 -m pytest -q -p no:cacheprovider --tb=line $(cat sample.txt) > "$OUT/fa3_suite.log" 2>&1
echo "pytest rc=$?" >> "$OUT/fa3_suite.log"
cd - > /dev/null
{
  echo "==== FA3 suite sample ($(wc -l < .fa3suite/sample.txt) cases), $(( $(date +%s) - t0 )) s"
  grep -E "passed|failed" "$OUT/fa3_suite.log" | tail -1
  grep -E "^E " "$OUT/fa3_suite.log" | cut -c1-160 | sort | uniq -c | sort -rn | head -25
  tail -1 "$OUT/fa3_suite.log"
} | tee "$OUT/summary.txt"
