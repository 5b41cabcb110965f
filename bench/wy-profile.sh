#!/usr/bin/env bash
# SASS-level profile of the chunked WY backward's kernels (issue 36) on the lent GPU: Nsight
# Compute's SourceCounters for each kernel in KERNELS (prepare, states, gradients) of one op's
# backward at B8 T4096 H16 K=V=128 bf16, summed between the kernel's barriers by
# bench/sass_phases.py (phases-<op>-<kernel>.txt under $OUT, with the gzipped CSV).
#   OP=kda KERNELS="gradients prepare" bash bench/wy-profile.sh     (carry .deps)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
: > "$out/build.log"
. bench/build.sh "$out/build.log" ladle-bench-recurrent
export LADLE_AUTOTUNE=heuristic LADLE_UPDATE_BWD_FORM=chunked LADLE_CACHE_DIR=$(mktemp -d)
op=${OP:-kda}
"$bench" --backward --algo chunked --op "$op" -B 8 -T 4096 -H 16 -K 128 -V 128 --reps 3 2>&1 | grep fwd_bwd
for kernel in ${KERNELS:-gradients prepare}; do
  name="$op-$kernel"
  timeout 240 ncu --section SourceCounters --section SpeedOfLight --section Occupancy --section WarpStateStats \
    -k regex:ladle_bwd_wy_$kernel --launch-count 1 -o "$out/sass-$name" "$bench" --backward --algo chunked --op "$op" -B 8 -T 4096 \
    -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-$name.txt" 2>&1
  ncu --import "$out/sass-$name.ncu-rep" --page source --csv --print-source sass > "$out/sass-$name.csv" 2>&1
  python3 bench/sass_phases.py "$out/sass-$name.csv" > "$out/phases-$name.txt" 2>&1
  gzip -f "$out/sass-$name.csv"; rm -f "$out/sass-$name.ncu-rep"
  echo "== $name"; grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" "$out/ncu-$name.txt"
  head -${LINES_SHOWN:-70} "$out/phases-$name.txt"
done
