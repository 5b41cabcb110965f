#!/usr/bin/env bash
# SASS-level profile of the chunked family's serial kernel on the lent GPU (issue 11): Nsight
# Compute's SourceCounters (warp stall samples and executed instructions per SASS instruction)
# for each op in OPS at one shape and tile, exported as CSV (sass-<op>-<tile>.csv.gz), then
# summed between the kernel's barriers by bench/sass_phases.py (phases-<op>-<tile>.txt).
#   OPS="gla simple_gla" SHAPE=8x4096 TILES="128,32,128,8" bash bench/sass-profile.sh   (carry .deps)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
: > "$out/build.log"
. bench/build.sh "$out/build.log" ladle-bench-recurrent
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$(mktemp -d)
shape=${SHAPE:-8x4096}
set -- ${shape/x/ }
for tile in ${TILES:-128,32,128,8}; do
  for op in ${OPS:-gla simple_gla}; do
    name="$op-$(echo "$tile" | tr ',' '_')"
    "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 --tile $tile 2>&1 | grep -o '"ms":[0-9.]*' | sed "s/^/$name B$1 T$2 /"
    timeout 240 ncu --section SourceCounters --section SpeedOfLight --section Occupancy --section WarpStateStats \
      -k regex:ladle_chunked --launch-count 1 -o "$out/sass-$name" "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 \
      -K 128 -V 128 --reps 1 --tile $tile > "$out/ncu-$name.txt" 2>&1
    ncu --import "$out/sass-$name.ncu-rep" --page source --csv --print-source sass > "$out/sass-$name.csv" 2>&1
    python3 bench/sass_phases.py "$out/sass-$name.csv" > "$out/phases-$name.txt" 2>&1
    gzip -f "$out/sass-$name.csv"; rm -f "$out/sass-$name.ncu-rep"
    echo "== $name"; grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" "$out/ncu-$name.txt"
    head -60 "$out/phases-$name.txt"
  done
done
