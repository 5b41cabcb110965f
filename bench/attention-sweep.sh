#!/usr/bin/env bash
# Issue 12 on the lent GPU, in one call: the attention op tests with the tiles the library picks
# (on sm_90a the ws pipeline), compute-sanitizer on a subset, the benchmark beside PyTorch SDPA
# (cuDNN, FA2) and FlexAttention, and Nsight Compute on the heuristic kernel. Run from the
# repository root with .deps carried:
#   bench/attention-sweep.sh tests bench ncu      (any of them, in that order; also sass, repeat)
# sass: Nsight Compute's SourceCounters per SASS instruction, summed by opcode (bench/sass_phases.py),
#   at B8 T4096 for each case in LADLE_SASS_CASES (default "causal window_softcap") and tile in
#   LADLE_SASS_TILES (default "heuristic").
# repeat: the heuristic, then each tile of LADLE_REPEAT_TILES three times in one process, twice over
#   (case LADLE_REPEAT_CASE, shape LADLE_REPEAT_SHAPE): a kernel's sustained speed against the first
#   timing after an idle compile, and the clocks and power after it.
# LADLE_ATTENTION_SHAPES   "BxT ..." (default "8x4096 2x16384"), H16 D128 bf16
# LADLE_ATTENTION_TILES    tiles timed beside the heuristic's (default: a ws sweep and the mma.sync best)
# LADLE_NO_PEERS=1         skip the PyTorch peers
# LADLE_SANITIZE           a Catch filter of ops-attention run under memcheck and racecheck (empty: none)
# LADLE_TEST_TIMEOUT       seconds for ops-attention (default 300)
# LADLE_NCU_CASES          cases profiled by ncu (default "causal"; also window_softcap, sinks_gqa)
# LADLE_TUNED=1            also time the tile the autotuner picks (LADLE_AUTOTUNE=force, a fresh cache)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/attention-sweep.log"
: > "$log"
. bench/build.sh "$log" ops-attention codegen-cuda_attention ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_CACHE_DIR=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

for what in "$@"; do
  case $what in
  tests)
    # The op tests compile a kernel per variant and dtype on the GPU machine: three processes,
    # each with its own cache, share the test cases round-robin. They run the heuristic's tiles
    # (under the default policy every new variant would first tune 42 candidates).
    export LADLE_AUTOTUNE=heuristic
    echo "== ops-attention (GPU, the library's tiles), in 3 parallel parts"
    "$build/tests/ops-attention" --list-test-names-only | grep -v "^$" | grep -v "test cases" | sed 's/\([][,]\)/\\\1/g' > "$out/names.txt"
    for part in 0 1 2; do
      awk -v p=$part 'NR % 3 == p' "$out/names.txt" > "$out/names-$part.txt"
      LADLE_CACHE_DIR=$(mktemp -d) timeout "${LADLE_TEST_TIMEOUT:-300}" "$build/tests/ops-attention" -f "$out/names-$part.txt" > "$out/ops-attention-$part.txt" 2>&1 &
    done
    if [ -n "${LADLE_SANITIZE:-}" ]; then  # beside the parts, on the same GPU
      for tool in memcheck racecheck; do
        LADLE_CACHE_DIR=$(mktemp -d) timeout "${LADLE_TEST_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 \
          "$build/tests/ops-attention" "$LADLE_SANITIZE" > "$out/sanitize-$tool.txt" 2>&1 &
      done
    fi
    wait
    if [ -n "${LADLE_SANITIZE:-}" ]; then
      for tool in memcheck racecheck; do
        echo "== compute-sanitizer $tool on ops-attention \"$LADLE_SANITIZE\""
        grep -m5 -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Hazard|Error" "$out/sanitize-$tool.txt"; tail -2 "$out/sanitize-$tool.txt"
      done
    fi
    for part in 0 1 2; do
      echo "part $part:"; tail -2 "$out/ops-attention-$part.txt"
      grep -E "FAILED" -A12 "$out/ops-attention-$part.txt" | head -40
    done
    echo "== codegen-cuda_attention [nvrtc]"
    timeout 300 "$build/tests/codegen-cuda_attention" "[nvrtc]" > "$out/codegen-attention.txt" 2>&1
    echo "rc=$?"; tail -2 "$out/codegen-attention.txt"
    ;;
  bench)
    echo "== ladle (heuristic first, then the named tiles) and the peers, H16 D128 bf16"
    : > "$out/attention.jsonl"
    tiles=${LADLE_ATTENTION_TILES:-"128,128,8,2,ws 128,128,8,3,ws 128,64,8,2,ws 128,64,8,3,ws 64,128,4,2,ws 128,64,8,2"}
    for shape in ${LADLE_ATTENTION_SHAPES:-8x4096 2x16384}; do
      B=${shape%x*}; T=${shape#*x}
      for c in causal window_softcap sinks_gqa; do
        LADLE_AUTOTUNE=heuristic "$bench_bin" --case $c -B "$B" -T "$T" -H 16 -D 128 | sed 's/"impl":"ladle"/"impl":"ladle-heur"/' >> "$out/attention.jsonl" 2>> "$log"
        args=""
        for t in $tiles; do args="$args --tile $t"; done
        LADLE_AUTOTUNE=heuristic "$bench_bin" --case $c -B "$B" -T "$T" -H 16 -D 128 $args >> "$out/attention.jsonl" 2>> "$log"
        if [ -n "${LADLE_TUNED:-}" ]; then  # the tuner's pick under the default budget, timed like the rest
          LADLE_AUTOTUNE=force LADLE_CACHE_DIR=$(mktemp -d) "$bench_bin" --case $c -B "$B" -T "$T" -H 16 -D 128 \
            | sed 's/"impl":"ladle"/"impl":"ladle-tuned"/' >> "$out/attention.jsonl" 2>> "$out/tune.log"
        fi
      done
    done
    if [ -z "${LADLE_NO_PEERS:-}" ]; then
      shapes=$(echo ${LADLE_ATTENTION_SHAPES:-8x4096 2x16384} | tr ' ' ',')
      PYTHONUNBUFFERED=1 timeout 400 python3 bench/attention_bench.py --shapes "$shapes" >> "$out/attention.jsonl" 2>> "$log"
    fi
    python3 bench/attention_bench.py --table < "$out/attention.jsonl"
    ;;
  ncu)
    for c in ${LADLE_NCU_CASES:-causal}; do
      echo "== Nsight Compute: the heuristic kernel, $c B8 T4096"
      LADLE_AUTOTUNE=heuristic timeout 300 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed.sum \
        -k regex:ladle_attention --launch-skip 3 --launch-count 1 "$bench_bin" --case $c -B 8 -T 4096 -H 16 -D 128 --reps 1 \
        > "$out/ncu-$c.txt" 2>&1
      echo "rc=$?"; grep -E "Duration|Registers|Theoretical Occupancy|Achieved Occupancy|DRAM Throughput|Compute \(SM\)|Eligible|No Eligible|gmma|tensor|pipe_xu|inst_executed.sum|Block Size|Dynamic Shared" "$out/ncu-$c.txt" | head -30
    done
    ;;
  sass)
    for tile in ${LADLE_SASS_TILES:-heuristic}; do
      for c in ${LADLE_SASS_CASES:-causal window_softcap}; do
        name="$c-$(echo "$tile" | tr ',' '_')"
        args=""; [ "$tile" != heuristic ] && args="--tile $tile"
        LADLE_AUTOTUNE=heuristic "$bench_bin" --case $c -B 8 -T 4096 -H 16 -D 128 $args 2>&1 | grep -o '"ms":[0-9.]*' | sed "s/^/$name /"
        LADLE_AUTOTUNE=heuristic timeout 240 ncu --section SourceCounters --section SpeedOfLight --section WarpStateStats \
          -k regex:ladle_attention --launch-skip 1 --launch-count 1 -o "$out/sass-$name" "$bench_bin" --case $c -B 8 -T 4096 \
          -H 16 -D 128 --reps 1 $args > "$out/ncu-$name.txt" 2>&1
        ncu --import "$out/sass-$name.ncu-rep" --page source --csv --print-source sass > "$out/sass-$name.csv" 2>&1
        python3 bench/sass_phases.py "$out/sass-$name.csv" > "$out/phases-$name.txt" 2>&1
        gzip -f "$out/sass-$name.csv"; rm -f "$out/sass-$name.ncu-rep"
        echo "== $name"; grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$out/ncu-$name.txt"
        sed -n '/by opcode/,$p' "$out/phases-$name.txt" | head -32
      done
    done
    ;;
  repeat)
    shape=${LADLE_REPEAT_SHAPE:-8x4096}; B=${shape%x*}; T=${shape#*x}; c=${LADLE_REPEAT_CASE:-causal}
    for round in 1 2; do
      echo "== process $round: the heuristic, then each of ${LADLE_REPEAT_TILES:-128,128,8,2,ws} three times ($c B$B T$T)"
      LADLE_AUTOTUNE=heuristic "$bench_bin" --case $c -B $B -T $T -H 16 -D 128 | grep -o '"tile":"[^"]*","ms":[0-9.]*'
      for t in ${LADLE_REPEAT_TILES:-128,128,8,2,ws}; do
        LADLE_AUTOTUNE=heuristic "$bench_bin" --case $c -B $B -T $T -H 16 -D 128 --tile $t --tile $t --tile $t | grep -o '"tile":"[^"]*","ms":[0-9.]*'
      done
    done
    nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv
    ;;
  esac
done
