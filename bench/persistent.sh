#!/usr/bin/env bash
# Issue 38: the persistent ws forward (LADLE_ATTENTION_PERSISTENT=1) against the default, a block per
# row block (LADLE_ATTENTION_PERSISTENT=0), on the lent GPU, in one call (carry .deps):
#   bash bench/persistent.sh [tests] [ab] [ncu]
# tests: ops-attention on the GPU (the library's tiles, 3 parallel parts, LADLE_TEST_TIMEOUT s).
# ab:    ladle-bench-attention, the two forms alternating process by process (LADLE_AB_ROUNDS rounds),
#        each process timing the heuristic tile 3 times back to back (the last two are sustained),
#        at every case of LADLE_AB_CASES ("case BxT ...": default causal 8x4096, causal 2x16384,
#        causal 1x4096, window_softcap 8x4096, sinks_gqa 8x4096), H16 D128 bf16.
# ncu:   Nsight Compute on the persistent causal kernel at B8 T4096, then the grid form's.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/persistent.log"
: > "$log"
. bench/build.sh "$log" ops-attention ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
for what in "$@"; do
  case $what in
  tests)
    "$build/tests/ops-attention" --list-test-names-only | grep -v "^$" | grep -v "test cases" | sed 's/\([][,]\)/\\\1/g' > "$out/names.txt"
    for part in 0 1 2; do
      awk -v p=$part 'NR % 3 == p' "$out/names.txt" > "$out/names-$part.txt"
      LADLE_CACHE_DIR=$(mktemp -d) timeout "${LADLE_TEST_TIMEOUT:-240}" "$build/tests/ops-attention" -f "$out/names-$part.txt" > "$out/ops-attention-$part.txt" 2>&1 &
    done
    wait
    for part in 0 1 2; do echo "ops-attention part $part:"; tail -2 "$out/ops-attention-$part.txt"; grep -A12 FAILED "$out/ops-attention-$part.txt" | head -30; done
    ;;
  ab)
    cases=${LADLE_AB_CASES:-"causal 8x4096 causal 2x16384 causal 1x4096 window_softcap 8x4096 sinks_gqa 8x4096"}
    set -- $cases
    while [ $# -ge 2 ]; do
      c=$1 shape=$2; shift 2
      B=${shape%x*}; T=${shape#*x}
      for round in $(seq ${LADLE_AB_ROUNDS:-3}); do
        for mode in 1 0; do
          ms=$(LADLE_ATTENTION_PERSISTENT=$mode "$bench_bin" --case $c -B $B -T $T -H 16 -D 128 --tile default --tile default --tile default 2>> "$log" |
               grep -o '"ms":[0-9.]*' | cut -d: -f2 | tr '\n' ' ')
          echo "{\"case\":\"$c\",\"shape\":\"B$B T$T\",\"persistent\":$mode,\"round\":$round,\"ms\":\"$ms\"}" | tee -a "$out/ab.jsonl"
        done
      done
    done
    ;;
  ncu)
    for mode in 1 0; do
      LADLE_ATTENTION_PERSISTENT=$mode timeout 200 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum \
        -k regex:ladle_attention --launch-skip 2 --launch-count 1 "$bench_bin" --case causal -B 8 -T 4096 -H 16 -D 128 --reps 1 \
        > "$out/ncu-persistent-$mode.txt" 2>&1
      echo "== ncu, persistent=$mode: rc=$?"
      grep -E "Duration|Grid Size|Registers|Achieved Occupancy|DRAM Throughput|Compute \(SM\)|No Eligible|Issued Warp|tensor_cycles|inst_executed.sum" "$out/ncu-persistent-$mode.txt" | head -14
    done
    ;;
  esac
done
