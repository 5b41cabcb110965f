#!/usr/bin/env bash
# The split form of the chunked family on the lent GPU, kernel by kernel (issue 11): the op's
# time (ladle-bench-recurrent) and each kernel's (Nsight Compute gpu__time_duration: the state
# pass, then the output pass) for every tile in TILES and shape in SHAPES; with SASS=<tile>, the
# output pass's SourceCounters at GLA B8 T4096 (src.csv.gz: bench/RESULTS.md says how it was read).
#   TILES="128,64,64,8,64,64,4" SHAPES="8x4096 2x16384" OPS="gla simple_gla" bash bench/split-profile.sh
set -uo pipefail
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
: > "$out/build.log"
. bench/build.sh "$out/build.log" ladle-bench-recurrent
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$(mktemp -d)
for tile in ${TILES-128,64,64,8,64,64,4}; do
  for bt in ${SHAPES:-8x4096 2x16384}; do
    set -- ${bt/x/ }
    for op in ${OPS:-gla}; do
      ms=$("$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 --tile $tile 2>&1 | grep -o '"ms":[0-9.]*')
      kernels=$(ncu --metrics gpu__time_duration.sum -k regex:ladle_chunked --launch-count 2 "$bench" --algo chunked --op $op \
        -B $1 -T $2 -H 16 -K 128 -V 128 --reps 1 --tile $tile 2>&1 | grep gpu__time_duration | awk '{print $(NF-1), $NF}' | tr '\n' ' ')
      echo "$tile $op B$1 T$2 $ms states, outputs: $kernels"
    done
  done
done
if [ -n "${SASS:-}" ]; then
  timeout 200 ncu --section SourceCounters --section SpeedOfLight --section Occupancy --section WarpStateStats \
    -k regex:ladle_chunked_outputs --launch-count 1 -o "$out/src" "$bench" --algo chunked --op gla -B 8 -T 4096 -H 16 \
    -K 128 -V 128 --reps 1 --tile "$SASS" > "$out/ncu.txt" 2>&1
  ncu --import "$out/src.ncu-rep" --page source --csv --print-source sass > "$out/src.csv" 2>&1 && gzip -f "$out/src.csv"
  ncu --import "$out/src.ncu-rep" | grep -E "Duration|Registers|Occupancy|Throughput|Eligible|Issued"
fi
