#!/usr/bin/env bash
# The chunked family's segmented form on the lent GPU in one call (issue 11): its op tests, then
# ladle at the benchmark shapes with the segments by shape (auto) beside whole sequences (0) and
# other segment lengths, then each kernel's time under Nsight Compute at GLA B2 T16384.
#   bench/segmented.sh [tests] [bench] [ncu]     (carry .deps; LADLE_SEGMENTS="0 2048 4096")
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/segmented.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
. bench/build.sh "$log" ladle-bench-recurrent ops-recurrent
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
for what in ${@:-tests bench ncu}; do
  case $what in
  tests)
    timeout 240 "$build/tests/ops-recurrent" "[segmented]" > "$out/ops-segmented.txt" 2>&1
    echo "ops-recurrent [segmented] rc=$? $(tail -2 "$out/ops-segmented.txt" | tr '\n' ' ')"
    grep -m 10 -B3 -A8 "FAILED" "$out/ops-segmented.txt" ;;
  bench)
    segs=""
    for s in ${LADLE_SEGMENTS:-"0 2048 4096 8192"}; do segs="$segs --segment-tokens $s"; done
    for bt in ${LADLE_CHUNKED_SHAPES:-"8x4096" "2x16384"}; do
      set -- ${bt/x/ }
      for op in gla simple_gla; do
        "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 >> "$out/segmented.jsonl" 2>> "$log"
        "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 $segs >> "$out/segmented.jsonl" 2>> "$log"
      done
    done
    cut -c1-200 "$out/segmented.jsonl" ;;
  ncu)
    for op in gla simple_gla; do
      timeout 120 ncu --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size -k regex:ladle_chunked \
        "$bench" --algo chunked --op $op -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-seg-$op.txt" 2>&1
      echo "== $op B2 T16384"; grep -E "ladle_chunked|gpu__time|registers|grid_size" "$out/ncu-seg-$op.txt" | head -24
    done ;;
  esac
done
