#!/usr/bin/env bash
# ncu profile of the decode kernel on one cell (b=64, 16k keys, GQA 32/8, d 128, bf16, dense), then the tile-plan
# A/B of device_decode_variants.sh for DEC_PLANS. Output: $OUT/ncu.txt, $OUT/plans.log.
set -uo pipefail
OUT=${OUT:-/tmp/decprof-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
prefix=$(gtest_prefix_flag)
build_tree . /tmp/build-var -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF \
  $prefix > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=/tmp/build-var/python
cat > /tmp/one_cell.py <<'PY'
import torch, flashattn
b, ctx, page = 64, 16384, int(__import__("sys").argv[1])
k = torch.randn(b, ctx, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
s = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
kw = {}
if page:
    kw["block_table"] = torch.randperm(b * ctx // page, device="cuda").to(torch.int32).view(b, -1)
    k, v = k.view(-1, page, 8, 128), v.view(-1, page, 8, 128)
for _ in range(3):
    flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=s, check_index_values=False, **kw)
torch.cuda.synchronize()
PY
for page in 0 16; do
  timeout 150 ncu --kernel-name regex:decode_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis python3 /tmp/one_cell.py $page > "$OUT/ncu_$page.txt" 2>&1
done
grep -E "Duration|Throughput|Warp Cycles|Issued|Eligible|Stall|Achieved|Registers|Shared Memory|L2 Hit|Mem Busy|Max Bandwidth|No Eligible|One or More|Active Warps" "$OUT"/ncu_*.txt | head -80
[ -n "${DEC_PLANS:-}" ] && bash bench/gpu/device_decode_variants.sh
