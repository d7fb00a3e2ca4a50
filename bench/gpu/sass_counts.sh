#!/usr/bin/env bash
# On the device, after bench/gpu/device_variants_sm90.sh: for each named variant's forward object
# (/tmp/v-<name>/forward_sm90.o), the counts of LDL / STL (spills), HGMMA, WARPGROUP.DEPBAR and WARPGROUP.ARRIVE
# in each bf16 forward kernel, named by its ForwardConfig parameters.
#   bash bench/gpu/sass_counts.sh tree variant_a variant_b
for v in "$@"; do
  o=/tmp/v-$v/forward_sm90.o
  [ -f "$o" ] || continue
  cuobjdump -sass "$o" | awk -v v="$v" '
    /Function :/ { f=$3; sub(/.*ForwardConfigI/, "", f); sub(/EEEL.*/, "", f); gsub(/Li/, "", f); gsub(/E/, "x", f); t=($3 ~ /bfloat16/) ? "bf16" : "f16"; f=t " " f }
    /LDL/ {ldl[f]++} /STL/ {stl[f]++} /HGMMA/ {hg[f]++} /WARPGROUP.DEPBAR/ {dep[f]++} /WARPGROUP.ARRIVE/ {arr[f]++}
    END { for (k in hg) if (k ~ /^bf16/) printf "%-22s %-26s LDL %3d STL %3d HGMMA %4d DEPBAR %3d ARRIVE %3d\n", v, k, ldl[k], stl[k], hg[k], dep[k], arr[k] }' | sort
done
