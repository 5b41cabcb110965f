#!/usr/bin/env bash
# The chunked family on the lent GPU in one call (issue 11): builds only what it needs, runs
# the chunked op tests with the GPU present (the heuristic tile: the split form), times ladle
# (tiles from LADLE_CHUNKED_TILES, else the list below, plus the heuristic) beside fla's
# chunk_gla / chunk_simple_gla at the three benchmark shapes (tuned: LADLE_AUTOTUNE=force, the
# chosen tile in tune-*.log; the fused-recurrent GLA beside fla's fused_recurrent_gla), and
# profiles the heuristic's kernels at B8 T4096 with Nsight Compute. Logs and JSON lines go to
# $OUT (or ./gpu-out).
#   bench/chunked-sweep.sh [tests|bench|ncu|all]      (carry .deps and .whl)
# LADLE_CHUNKED_SHAPES="8x4096 2x16384" narrows the shapes, LADLE_NO_FLA=1 skips fla, LADLE_NO_TUNE=1 the
# tuned runs, LADLE_TEST_SUBSET="[ws]" narrows the tests, LADLE_NCU_OPS="simple_gla" the profiled ops.
set -uo pipefail
what=${1:-all}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/chunked.log"
: > "$log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$log"
. bench/build.sh "$log" ladle-bench-recurrent ops-recurrent ladle-dump ladle-tune
export LADLE_CACHE_DIR=$(mktemp -d)

if [ "$what" = tests ] || [ "$what" = all ]; then
  subset=${LADLE_TEST_SUBSET:-"[chunked]"}  # e.g. "[ws]"
  echo "== chunked op tests with the GPU (heuristic tile): $subset"
  LADLE_AUTOTUNE=heuristic timeout ${LADLE_TEST_TIMEOUT:-480} "$build/tests/ops-recurrent" "$subset" -d yes > "$out/ops-chunked.txt" 2>&1
  echo "ops-recurrent $subset rc=$? $(tail -2 "$out/ops-chunked.txt" | tr '\n' ' ')"
  grep -m 20 -B3 -A8 "FAILED" "$out/ops-chunked.txt"
  # compute-sanitizer on subsets sized to finish (the kernels are already in the compile cache
  # from the run above, so the time goes to the checked launches): the serial form with the
  # prefetch (hard resets: every gate kind, forward and reverse, partial chunks), the split form, and
  # the state update on wgmma (sm_90a tiles). LADLE_SANITIZE_SUBSETS="[wgmma]" narrows them.
  for subset in ${LADLE_SANITIZE_SUBSETS:-"chunked: hard resets*" "[split]" "[wgmma]"}; do
    for tool in memcheck racecheck; do
      name=$(echo "$subset" | tr -cd 'a-z')
      LADLE_AUTOTUNE=heuristic timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/ops-recurrent" "$subset" \
        > "$out/sanitizer-$name-$tool.txt" 2>&1
      echo "compute-sanitizer $tool ($subset): rc=$? $(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$name-$tool.txt") $(grep -m1 'RACECHECK SUMMARY' "$out/sanitizer-$name-$tool.txt") $(grep -m1 -o 'All tests passed.*' "$out/sanitizer-$name-$tool.txt")"
    done
  done
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$log" 2>&1
    export PYTHONPATH=/tmp/site
  fi
  tiles=${LADLE_CHUNKED_TILES:-"128,64,64,8 128,32,128,8 128,64,128,8 128,64,32,8 128,32,64,8 128,64,64,8,64,64,4"}
  : > "$out/chunked-ladle.jsonl"
  for bt in ${LADLE_CHUNKED_SHAPES:-"32x1024" "8x4096" "2x16384"}; do
    set -- ${bt/x/ }
    for op in gla simple_gla; do
      args=""
      for t in $tiles; do args="$args --tile $t"; done
      LADLE_AUTOTUNE=heuristic "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 $args >> "$out/chunked-ladle.jsonl" 2>> "$log"
      LADLE_AUTOTUNE=heuristic "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 >> "$out/chunked-ladle.jsonl" 2>> "$log"
      [ -n "${LADLE_NO_TUNE:-}" ] || LADLE_AUTOTUNE=force "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2> "$out/tune-$op-$bt.log" |
        sed 's/"tile":"heuristic"/"tile":"tuned"/' >> "$out/chunked-ladle.jsonl"
    done
    LADLE_AUTOTUNE=heuristic "$bench" --algo recurrent --op gla -B $1 -T $2 -H 16 -K 128 -V 128 >> "$out/chunked-ladle.jsonl" 2>> "$log"
  done
  [ -n "${LADLE_NO_FLA:-}" ] || PYTHONUNBUFFERED=1 timeout 300 python3 bench/fla_bench.py --ops chunk_gla,chunk_simple_gla,fused_recurrent_gla \
    --shapes 32x1024x16x128x128,8x4096x16x128x128,2x16384x16x128x128 > "$out/chunked-fla.jsonl" 2>> "$log"
  cat "$out"/chunked-*.jsonl | python3 bench/table.py
fi

if [ "$what" = ncu ] || [ "$what" = all ]; then
  echo "== Nsight Compute: the heuristic's kernels, GLA B8 T4096"
  for op in ${LADLE_NCU_OPS:-gla simple_gla}; do
    LADLE_AUTOTUNE=heuristic timeout 200 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum \
      -k regex:ladle_chunked --launch-count 1 \
      "$bench" --algo chunked --op $op -B 8 -T 4096 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-$op.txt" 2>&1
    echo "== $op"
    grep -E "ladle_chunked|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Compute \(SM\) Throughput|Eligible Warps|No Eligible|Dynamic Shared|Issue Slots Busy|Grid Size|Block Size|pipe_tensor" "$out/ncu-$op.txt"
  done
fi
