#!/usr/bin/env bash
# SASS-level profile of the attention kernel on the lent GPU (issue 12): Nsight Compute's
# SourceCounters for each case in CASES at B8 T4096 H16 D128 bf16 and each tile in TILES
# (default: the heuristic's), summed by opcode by bench/sass_phases.py. Carry .deps.
#   CASES="causal window_softcap" TILES="heuristic 128,128,8,2,ws" bash bench/attention-sass.sh
set -uo pipefail
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
: > "$out/build.log"
. bench/build.sh "$out/build.log" ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$(mktemp -d)
for tile in ${TILES:-heuristic}; do
  for c in ${CASES:-causal window_softcap}; do
    name="$c-$(echo "$tile" | tr ',' '_')"
    args=""; [ "$tile" != heuristic ] && args="--tile $tile"
    "$bench_bin" --case $c -B 8 -T 4096 -H 16 -D 128 $args 2>&1 | grep -o '"ms":[0-9.]*' | sed "s/^/$name /"
    timeout 240 ncu --section SourceCounters --section SpeedOfLight --section WarpStateStats \
      -k regex:ladle_attention --launch-skip 1 --launch-count 1 -o "$out/sass-$name" "$bench_bin" --case $c -B 8 -T 4096 \
      -H 16 -D 128 --reps 1 $args > "$out/ncu-$name.txt" 2>&1
    ncu --import "$out/sass-$name.ncu-rep" --page source --csv --print-source sass > "$out/sass-$name.csv" 2>&1
    python3 bench/sass_phases.py "$out/sass-$name.csv" > "$out/phases-$name.txt" 2>&1
    gzip -f "$out/sass-$name.csv"; rm -f "$out/sass-$name.ncu-rep"
    echo "== $name"; grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$out/ncu-$name.txt"
    sed -n '/by opcode/,$p' "$out/phases-$name.txt" | head -32
  done
done
