#!/usr/bin/env bash
# Issue 11, ninth step: the ws form of a key-side gate (GLA) on the lent GPU in one call. Builds; runs
# the ws and segmented op tests and NVRTC's ws checks; compute-sanitizer (memcheck, racecheck) on the
# key-gate ws tests; times GLA and simple GLA by the heuristic at B32 T1024, B8 T4096 and B2 T16384
# (and GLA on the seventh step's wgmma tile at B8), fla 0.6's chunk_gla and chunk_simple_gla beside
# them; then Nsight Compute on the GLA ws kernel at B8 T4096.
#   bench/gla-ws.sh [tests] [sanitize] [bench] [ncu]      (carry .deps and .whl)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/gla-ws.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
. bench/build.sh "$log" ladle-bench-recurrent ops-recurrent ops-gpu
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
for what in ${@:-tests sanitize bench ncu}; do
  case $what in
  tests)
    for subset in "[ws]" "[segmented]"; do
      name=$(echo "$subset" | tr -cd 'a-z')
      timeout 240 "$build/tests/ops-recurrent" "$subset" > "$out/ops-$name.txt" 2>&1
      echo "ops-recurrent $subset rc=$? $(tail -2 "$out/ops-$name.txt" | tr '\n' ' ')"
      grep -m 5 -B3 -A12 "FAILED" "$out/ops-$name.txt"
    done
    timeout 120 "$build/tests/ops-gpu" "[ws]" > "$out/ops-gpu-ws.txt" 2>&1
    echo "ops-gpu [ws] rc=$? $(tail -2 "$out/ops-gpu-ws.txt" | tr '\n' ' ')"
    grep -m 5 -B3 -A12 "FAILED" "$out/ops-gpu-ws.txt" ;;
  sanitize)
    for tool in memcheck racecheck; do
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/ops-recurrent" "${LADLE_SANITIZE_SUBSET:-[ws-key]}" > "$out/sanitizer-$tool.txt" 2>&1
      echo "compute-sanitizer $tool: rc=$? $(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 'RACECHECK SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 -o 'All tests passed.*' "$out/sanitizer-$tool.txt")"
    done ;;
  bench)
    : > "$out/ladle.jsonl"
    for bt in 32x1024 8x4096 2x16384; do
      set -- ${bt/x/ }
      for op in gla simple_gla; do
        timeout 60 "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | tee -a "$out/ladle.jsonl" | cut -c1-250
      done
      [ "$bt" = 8x4096 ] && timeout 60 "$bench" --algo chunked --op gla -B $1 -T $2 -H 16 -K 128 -V 128 --tile 128,32,128,8,wgmma 2>> "$log" |
        tee -a "$out/ladle.jsonl" | cut -c1-250
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$log" 2>&1
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 150 python3 bench/fla_bench.py --ops chunk_gla,chunk_simple_gla \
      --shapes 32x1024x16x128x128,8x4096x16x128x128,2x16384x16x128x128 > "$out/fla.jsonl" 2>> "$log"
    cat "$out/ladle.jsonl" "$out/fla.jsonl" | python3 bench/table.py ;;
  ncu)
    timeout 150 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
      -k regex:ladle_chunked_ws -c 1 "$bench" --algo chunked --op gla -B 8 -T 4096 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-gla-b8.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|gmma|pipe_xu|No Eligible|Issued Warp" "$out/ncu-gla-b8.txt" | head -20
    timeout 100 ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed -k regex:ladle_chunked -c 3 \
      "$bench" --algo chunked --op gla -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-gla-b2.txt" 2>&1
    grep -E "  ladle_chunked|gpu__time|dram__" "$out/ncu-gla-b2.txt" | head -12 ;;
  esac
done
