#!/usr/bin/env bash
# The chunked ws form on the lent GPU in one call (issue 11, eighth step): builds, runs the ws and
# segmented op tests, compute-sanitizer (memcheck, racecheck) on the ws tests, times simple GLA and
# GLA at B8 T4096 and B2 T16384 by the heuristic (B2: the ws state pass, or LADLE_SUFFIX_STATES=1 the
# suffix one), then each kernel's time at B2 T16384 under Nsight Compute.
#   bench/ws-check.sh [tests] [sanitize] [bench] [ncu]      (carry .deps)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/ws-check.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
. bench/build.sh "$log" ladle-bench-recurrent ops-recurrent
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
for what in ${@:-tests sanitize bench ncu}; do
  case $what in
  tests)
    for subset in "[ws]" "[segmented]"; do
      timeout 240 "$build/tests/ops-recurrent" "$subset" > "$out/ops-$(echo "$subset" | tr -cd 'a-z').txt" 2>&1
      echo "ops-recurrent $subset rc=$? $(tail -2 "$out/ops-$(echo "$subset" | tr -cd 'a-z').txt" | tr '\n' ' ')"
      grep -m 5 -B3 -A12 "FAILED" "$out/ops-$(echo "$subset" | tr -cd 'a-z').txt"
    done ;;
  sanitize)
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/ops-recurrent" "${LADLE_SANITIZE_SUBSET:-[ws]}" > "$out/sanitizer-$tool.txt" 2>&1
      echo "compute-sanitizer $tool: rc=$? $(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 'RACECHECK SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 -o 'All tests passed.*' "$out/sanitizer-$tool.txt")"
    done ;;
  bench)
    for bt in ${LADLE_CHUNKED_SHAPES:-"8x4096" "2x16384"}; do
      set -- ${bt/x/ }
      for op in simple_gla gla; do
        "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | cut -c1-300
        [ "$1" = 2 ] && LADLE_SUFFIX_STATES=1 "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | sed 's/"tile":"heuristic"/"tile":"heuristic, suffix state pass"/' | cut -c1-300
      done
    done ;;
  ncu)
    for op in simple_gla gla; do
      timeout 120 ncu --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        -k regex:ladle_chunked -c 3 "$bench" --algo chunked --op $op -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-b2-$op.txt" 2>&1
      echo "== $op B2 T16384"
      grep -E "  ladle_chunked|gpu__time|registers|grid_size|dram__" "$out/ncu-b2-$op.txt" | head -16
    done ;;
  esac
done
