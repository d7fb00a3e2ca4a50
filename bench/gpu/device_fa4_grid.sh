#!/usr/bin/env bash
# Our forward and backward beside cuDNN and FlashAttention-4's Hopper kernels (flash_attn.cute) on the warm-card
# grid (burst_grid.py: B·S = 16k tokens, H·D = 2048, alternating bursts in one process), for the issues that name
# FA4 as the anchor. FA4 arrives in two parts (../shared/tools/fa4-anchor/README.md): a first command carrying
# [".fa4a"] runs `xz -dc .fa4a/ir.so.xz > /tmp/fa4stage.so`, and this script runs in the command right after it
# (the machine keeps /tmp for about 30 s), carrying [".fa4b"]; it installs FA4, builds our Python module and
# times the grid. Later commands on the same machine find FA4 installed and skip that part.
#   FA4_HD="64 128 256" FA4_SEQLENS="2048 16384" FA4_REPEATS=2 FA4_SECONDS=0.3 FA4_BACKWARD=1 (0: forward only)
# Output: $OUT/forward.md, $OUT/backward.md, logs; the tables are printed last.
set -uo pipefail
source bench/gpu/device_common.sh
start_device_run /tmp/fa4-out
if [ ! -d /tmp/fa4site ]; then
  bash .fa4b/install.sh >> "$log" 2>&1 || { echo "FA4 install failed"; tail -5 "$log"; exit 1; }
fi
build_python_tree /tmp/build-fa4 -- _C
grep -q "build rc=0" "$log" || { grep -E "error" "$log" | head -20; exit 1; }
grid() {  # burst_grid.py with FA4 importable
  PYTHONPATH=/tmp/build-fa4/python python3 bench/gpu/with_fa4.py bench/gpu/burst_grid.py \
    --hd ${FA4_HD:-64 128 256} --seqlens ${FA4_SEQLENS:-2048 16384} --causal 0 1 --repeats ${FA4_REPEATS:-2} \
    --seconds ${FA4_SECONDS:-0.3} "$@"
}
timeout 280 bash -c "$(declare -f grid); grid" > "$OUT/forward.md" 2> "$OUT/forward.log"
echo "forward rc=$?" >> "$OUT/forward.log"
if [ "${FA4_BACKWARD:-1}" = 1 ]; then
  timeout 280 bash -c "$(declare -f grid); grid --backward" > "$OUT/backward.md" 2> "$OUT/backward.log"
  echo "backward rc=$?" >> "$OUT/backward.log"
fi
echo "==== summary $(( $(date +%s) - t0 )) s"; head -2 "$log"; grep -E "build rc" "$log"
for f in forward backward; do
  [ -f "$OUT/$f.md" ] && { echo "== $f"; cat "$OUT/$f.md"; tail -2 "$OUT/$f.log"; }
done
