#!/usr/bin/env bash
# The segmented form's state pass on the lent GPU in one call (issue 11, eighth step): the
# segmented op tests and compute-sanitizer on them, then ladle at B2 T16384 (and B8 T4096, which
# runs unsegmented) with the state pass in its suffix form at 64- or 32-token chunks and 1 to 8
# pieces per earlier segment or by the library's rule (LADLE_STATE_CONFIGS="chunk:pieces ..."),
# beside the split form's state pass (old), then each kernel's time under Nsight Compute.
#   bench/state-pass.sh [tests] [bench] [ncu]      (carry .deps)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/state-pass.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
. bench/build.sh "$log" ladle-bench-recurrent ops-recurrent
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
for what in ${@:-tests bench ncu}; do
  case $what in
  tests)
    timeout 300 "$build/tests/ops-recurrent" "[segmented]" > "$out/ops-segmented.txt" 2>&1
    echo "ops-recurrent [segmented] rc=$? $(tail -2 "$out/ops-segmented.txt" | tr '\n' ' ')"
    grep -m 10 -B3 -A8 "FAILED" "$out/ops-segmented.txt"
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/ops-recurrent" "[segmented]" > "$out/sanitizer-$tool.txt" 2>&1
      echo "compute-sanitizer $tool [segmented]: rc=$? $(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 'RACECHECK SUMMARY' "$out/sanitizer-$tool.txt") $(grep -m1 -o 'All tests passed.*' "$out/sanitizer-$tool.txt")"
    done ;;
  bench)
    : > "$out/state-pass.jsonl"
    for bt in ${LADLE_CHUNKED_SHAPES:-"2x16384" "8x4096"}; do
      set -- ${bt/x/ }
      for op in gla simple_gla; do
        for config in ${LADLE_STATE_CONFIGS:-"64:" "64:1" "64:2" "64:4" "64:8" "old"}; do  # chunk:pieces (empty: the rule)
          if [ "$config" = old ]; then env=(LADLE_SUFFIX_STATES=0 LADLE_STATE_PIECES=1)
          else env=(LADLE_SUFFIX_CHUNK=${config%:*} LADLE_STATE_PIECES=${config#*:}); fi
          echo -n "$op B$1 T$2 chunk:pieces=$config " >> "$out/state-pass.jsonl"
          env "${env[@]}" "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | cut -c1-300 >> "$out/state-pass.jsonl"
          [ "$1" = 8 ] && break  # unsegmented: the pieces do not apply
        done
      done
    done
    cat "$out/state-pass.jsonl" ;;
  ncu)
    for op in gla simple_gla; do
      for pieces in ${LADLE_NCU_CONFIGS:-"" old}; do
        if [ "$pieces" = old ]; then env=(LADLE_SUFFIX_STATES=0 LADLE_STATE_PIECES=1); else env=(LADLE_SUFFIX_CHUNK=${pieces%:*} LADLE_STATE_PIECES=${pieces#*:}); fi
        env "${env[@]}" timeout 120 ncu --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum \
          -k regex:ladle_chunked -c 3 "$bench" --algo chunked --op $op -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 1 > "$out/ncu-$op-${pieces:-rule}.txt" 2>&1
        echo "== $op B2 T16384 state pass ${pieces:-suffix, pieces by rule}"
        grep -E "  ladle_chunked|gpu__time|registers|grid_size|warps_active|dram__|inst_executed" "$out/ncu-$op-${pieces:-rule}.txt" | head -24
      done
    done ;;
  esac
done
