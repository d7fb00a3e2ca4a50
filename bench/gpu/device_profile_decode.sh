#!/usr/bin/env bash
# ncu profile of the decode kernel on one cell (GQA 32/8, d 128, bf16, one query row; b = DEC_B (64), DEC_CTX keys
# (16384), dense and pages of 16 or DEC_PAGES, num_splits DEC_SPLITS or the heuristic's): every kernel of one call
# (the split combine too), then the tile-plan A/B of device_decode_variants.sh for DEC_PLANS. DEC_BUILD: a build of
# this tree with the Python module, used instead of building one. DEC_SOURCE=1: also the decode kernel's stalls per SASS
# instruction (ncu --set full, bench/gpu/ncu_source_summary.py). DEC_CUDNN=1: also every kernel of one dense call of
# ours and one of PyTorch's cuDNN backend on the same cell, warm, between cudaProfilerStart / Stop (their durations
# without launch gaps, to split a time difference into kernel time and the rest). DEC_BUILD=/tmp/prebuilt takes the
# package that unpack_prebuilt (device_common.sh) unpacked. Output: $OUT/ncu_<pages>.txt, $OUT/stalls.txt,
# $OUT/ncu_vs_cudnn.txt, $OUT/plans.log.
set -uo pipefail
OUT=${OUT:-/tmp/decprof-out}
mkdir -p "$OUT"
source bench/gpu/device_common.sh
if [ -z "${DEC_BUILD:-}" ]; then
  prefix=$(gtest_prefix_flag)
  build_tree . /tmp/build-var -DFLASHATTN_BUILD_CLI=OFF -DFLASHATTN_BUILD_PYTHON=ON -DFLASHATTN_BUILD_BENCH=OFF \
    $prefix > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
export PYTHONPATH=${DEC_BUILD:-/tmp/build-var}/python
cat > /tmp/one_cell.py <<'PY'
import os, sys
import torch, flashattn
b, ctx, page = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[1])
k = torch.randn(b, ctx, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
s = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
kw = {"num_splits": int(sys.argv[4])} if len(sys.argv) > 4 else {}
if page:
    kw["block_table"] = torch.randperm(b * ctx // page, device="cuda").to(torch.int32).view(b, -1)
    k, v = k.view(-1, page, 8, 128), v.view(-1, page, 8, 128)
ours = lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=s, check_index_values=False, **kw)
if os.environ.get("VS_CUDNN"):
    # Warm, then one call of ours and one of cuDNN's on the same dense cache between cudaProfilerStart / Stop.
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    for _ in range(3):
        ours(); cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    ours(); cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
else:
    for _ in range(5):
        ours()
    torch.cuda.synchronize()
PY
for page in ${DEC_PAGES:-0 16}; do
  timeout 150 ncu --kernel-name regex:'decode|combine' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis python3 /tmp/one_cell.py $page ${DEC_B:-64} \
    ${DEC_CTX:-16384} ${DEC_SPLITS:-} > "$OUT/ncu_$page.txt" 2>&1
done
if [ "${DEC_CUDNN:-0}" = 1 ]; then
  VS_CUDNN=1 timeout 90 ncu --profile-from-start off --section LaunchStats \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum python3 /tmp/one_cell.py 0 ${DEC_B:-64} ${DEC_CTX:-16384} \
    > "$OUT/ncu_vs_cudnn.txt" 2>&1
  grep -E "^  [a-zA-Z_].*\(|gpu__time|inst_executed|Grid Size|Block Size|Cluster Size" "$OUT/ncu_vs_cudnn.txt" | cut -c1-150
fi
if [ "${DEC_SOURCE:-0}" = 1 ]; then  # where the decode kernel's warps stall, per SASS instruction (first page size)
  page=${DEC_PAGES:-0}; page=${page%% *}
  timeout 200 ncu --kernel-name regex:decode_kernel --launch-skip 2 --launch-count 1 --set full --import-source yes \
    -o /tmp/decode-src -f python3 /tmp/one_cell.py $page ${DEC_B:-64} ${DEC_CTX:-16384} ${DEC_SPLITS:-} \
    > "$OUT/ncu_source.log" 2>&1
  ncu -i /tmp/decode-src.ncu-rep --page source --csv --print-source sass > /tmp/decode-src.csv 2>/dev/null
  python3 bench/gpu/ncu_source_summary.py /tmp/decode-src.csv --top ${DEC_TOP:-40} > "$OUT/stalls.txt" 2>&1
fi
grep -E "^  [a-z_].*\(|Duration|Throughput|Warp Cycles|Issued|Eligible|Stall|Achieved|Registers|Shared Memory|L2 Hit|Mem Busy|Max Bandwidth|No Eligible|One or More|Active Warps|Grid Size|Block Size|Cluster Size" "$OUT"/ncu_*.txt | cut -c1-160 | head -${DEC_LINES:-80}
[ -f "$OUT/stalls.txt" ] && head -${DEC_TOP_LINES:-60} "$OUT/stalls.txt"
[ -n "${DEC_PLANS:-}" ] && bash bench/gpu/device_decode_variants.sh
