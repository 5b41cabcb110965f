#!/usr/bin/env bash
# The one script for the lent GPU machine: builds ladle there, runs the test suite with a
# GPU present, checks numerics, runs compute-sanitizer, times, and prints one short table
# last. Full logs go to $OUT (or ./gpu-out). Run from the repository root:
#   bench/gpu-check.sh [runtime|recurrent|chunked|tune|attention|all]
# Needs .deps (shared/device/deps.sh) carried along; fla's wheels in .whl for the
# comparisons of the attention benchmarks.
set -uo pipefail
what=${1:-all}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/gpu-check.log"
: > "$log"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
step() { echo "== $*" | tee -a "$log"; }

step "configure + build"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >> "$log" 2>&1
prefix=""
[ -d .deps/root/usr ] && prefix="-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr -DLADLE_FMT_HEADER_ONLY=ON"  # no libfmt9 installed there
if ! { cmake -S . -B build-gpu -G Ninja $prefix -DCMAKE_BUILD_TYPE=Release >> "$log" 2>&1 &&
       cmake --build build-gpu -j"$(nproc)" >> "$log" 2>&1; }; then
  tail -40 "$log"; echo "BUILD FAILED"; exit 1
fi
bin=build-gpu/tools/ladle-bench

step "tests with a GPU present"
export LADLE_CACHE_DIR=$(mktemp -d)
if ctest --test-dir build-gpu --output-on-failure -j4 >> "$log" 2>&1; then
  note "ctest (GPU machine): all passed"
else
  note "ctest (GPU machine): FAILURES"; grep -E "Failed|FAILED|\*\*\*|with expansion|error" -A3 "$log" | tail -40
fi

if [ "$what" = runtime ] || [ "$what" = all ]; then
  step "runtime: cold cache, then three warm processes"
  export LADLE_CACHE_DIR=$(mktemp -d)
  "$bin/ladle-bench-runtime" --t0-ns "$(date +%s%N)" > "$out/runtime-cold.txt" 2>&1
  cold_rc=$?
  for i in 1 2 3; do
    "$bin/ladle-bench-runtime" --t0-ns "$(date +%s%N)" > "$out/runtime-warm$i.txt" 2>&1
  done
  cat "$out/runtime-cold.txt" >> "$log"; cat "$out/runtime-warm3.txt" >> "$log"
  step "compute-sanitizer memcheck on the runtime bench"
  if compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/ladle-bench-runtime" --quick >> "$out/sanitizer.txt" 2>&1; then
    note "compute-sanitizer memcheck (runtime): clean"
  else
    note "compute-sanitizer memcheck (runtime): ERRORS (see sanitizer.txt)"; tail -20 "$out/sanitizer.txt"
  fi
  note ""
  note "runtime, cold cache (rc=$cold_rc):"; grep -E "check|compile|module|start|launch|vector_add 2|driver init" "$out/runtime-cold.txt" | tee -a "$summary"
  note ""
  note "runtime, warm cache (3rd warm process):"; grep -E "check|compile|module|per kernel|start|launch|driver init" "$out/runtime-warm3.txt" | tee -a "$summary"
  note "warm start -> first launch, processes 1..3: $(grep -h 'process start' "$out"/runtime-warm*.txt | awk '{print $(NF-1)}' | paste -sd' ') ms"
fi
if [ "$what" = recurrent ] || [ "$what" = all ]; then
  step "recurrent: compute-sanitizer memcheck on the fused-recurrent family (GPU op test)"
  if compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/ops-gpu "without a driver*" > "$out/sanitizer-recurrent.txt" 2>&1; then
    note "compute-sanitizer memcheck (fused recurrent): clean"
  else
    note "compute-sanitizer memcheck (fused recurrent): ERRORS"; tail -30 "$out/sanitizer-recurrent.txt"
  fi
  step "recurrent: GLA forward, ladle (tile sweep) and fla in one run"
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$log" 2>&1
    export PYTHONPATH=/tmp/site
  fi
  shape=${LADLE_BENCH_SHAPE:-"-B 8 -T 4096 -H 16 -K 128 -V 128"}
  LADLE_AUTOTUNE=heuristic "$bin/ladle-bench-recurrent" $shape ${LADLE_BENCH_TILES:---tile 128,64,8 --tile 128,128,16 --tile 128,32,16 --tile 128,32,8} > "$out/recurrent-ladle.jsonl" 2>> "$log"
  LADLE_AUTOTUNE=heuristic "$bin/ladle-bench-recurrent" $shape > "$out/recurrent-ladle-heuristic.jsonl" 2>> "$log"
  # The autotuner: a forced tuning (first call = tuning wall time), then a new process that
  # reuses the stored result (first call without tuning).
  LADLE_AUTOTUNE=force "$bin/ladle-bench-recurrent" $shape > "$out/recurrent-ladle-tuned.jsonl" 2>> "$log"
  LADLE_AUTOTUNE=cached "$bin/ladle-bench-recurrent" $shape > "$out/recurrent-ladle-cached.jsonl" 2>> "$log"
  PYTHONUNBUFFERED=1 python3 bench/fla_bench.py --ops fused_recurrent_gla --shapes 8x4096x16x128x128 > "$out/recurrent-fla.jsonl" 2>> "$log"
  cat "$out"/recurrent-*.jsonl | python3 bench/table.py | tee -a "$summary"
fi

if [ "$what" = chunked ] || [ "$what" = all ]; then
  step "chunked: compute-sanitizer memcheck and racecheck on the chunked op tests"
  for tool in memcheck racecheck; do
    if timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/ops-recurrent "chunked: every gate*" > "$out/sanitizer-chunked-$tool.txt" 2>&1; then
      note "compute-sanitizer $tool (chunked, 64 kernels): clean ($(grep -c 'ERROR SUMMARY: 0' "$out/sanitizer-chunked-$tool.txt") summaries)"
    else
      note "compute-sanitizer $tool (chunked): ERRORS or timeout"; grep -m5 -E "ERROR|Race|Invalid" "$out/sanitizer-chunked-$tool.txt" | tee -a "$summary"; tail -5 "$out/sanitizer-chunked-$tool.txt"
    fi
  done
  step "chunked: ladle vs fla chunk_gla / chunk_simple_gla, H16 K=V=128 bf16"
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$log" 2>&1
    export PYTHONPATH=/tmp/site
  fi
  for bt in "32 1024" "8 4096" "2 16384"; do
    set -- $bt
    for op in gla simple_gla user; do
      LADLE_AUTOTUNE=heuristic "$bin/ladle-bench-recurrent" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 ${LADLE_CHUNKED_TILES:-} >> "$out/chunked-ladle.jsonl" 2>> "$log"
    done
  done
  PYTHONUNBUFFERED=1 timeout 400 python3 bench/fla_bench.py --ops chunk_gla,chunk_simple_gla \
    --shapes 32x1024x16x128x128,8x4096x16x128x128,2x16384x16x128x128 > "$out/chunked-fla.jsonl" 2>> "$log"
  cat "$out"/chunked-*.jsonl | python3 bench/table.py | tee -a "$summary"
fi

if [ "$what" = tune ] || [ "$what" = all ]; then
  # Issue 5: the chunked GLA forward tuned at the three benchmark shapes (the first call's
  # wall time is the tuning), a second process that reuses the stored config (no tuning:
  # its first call is a compile-cache hit), and the heuristic beside both.
  step "tune: chunked GLA, heuristic vs tuned (forced) vs a second process (cached)"
  export LADLE_CACHE_DIR=$(mktemp -d)
  : > "$out/tune.jsonl"
  for bt in "32 1024" "8 4096" "2 16384"; do
    set -- $bt
    shape="--algo chunked --op gla -B $1 -T $2 -H 16 -K 128 -V 128"
    LADLE_AUTOTUNE=heuristic "$bin/ladle-bench-recurrent" $shape >> "$out/tune.jsonl" 2>> "$log"
    LADLE_AUTOTUNE=force "$bin/ladle-bench-recurrent" $shape 2> "$out/tune-progress-$1x$2.txt" | sed 's/"tile"/"policy":"force","tile"/' >> "$out/tune.jsonl"
    LADLE_AUTOTUNE=cached "$bin/ladle-bench-recurrent" $shape 2> "$out/tune-reuse-$1x$2.txt" | sed 's/"tile"/"policy":"cached","tile"/' >> "$out/tune.jsonl"
    note "tune B$1 T$2: $(grep -c 'tuning' "$out/tune-reuse-$1x$2.txt") tuning lines in the second process (expect 0); last progress: $(grep 'tuning' "$out/tune-progress-$1x$2.txt" | tail -1)"
  done
  "build-gpu/tools/ladle-tune/ladle-tune" --op gla --algo chunked -B 8 -T 4096 -H 16 -K 128 -V 128 > "$out/tune-table-8x4096.txt" 2>&1
  cat "$out/tune-table-8x4096.txt" >> "$summary"
  python3 bench/table.py < "$out/tune.jsonl" | tee -a "$summary"
fi

if [ "$what" = attention ] || [ "$what" = all ]; then
  step "attention: the op tests and the family's emulation/NVRTC tests with the GPU present"
  for t in ops-attention codegen-cuda_attention; do
    if build-gpu/tests/$t > "$out/attention-$t.txt" 2>&1; then
      note "$t (GPU machine): all passed"
    else
      note "$t (GPU machine): FAILURES"; grep -E "FAILED|with expansion|error" -A3 "$out/attention-$t.txt" | tail -30
    fi
  done
  step "attention: compute-sanitizer memcheck on the attention op tests (GPU kernels)"
  if timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/ops-attention > "$out/sanitizer-attention.txt" 2>&1; then
    note "compute-sanitizer memcheck (attention): clean"
  else
    note "compute-sanitizer memcheck (attention): ERRORS or timeout"; grep -m5 -E "ERROR|Invalid" "$out/sanitizer-attention.txt" | tee -a "$summary"
  fi
  step "attention: ladle vs PyTorch SDPA (flash, cuDNN) and FlexAttention, H16 D128 bf16"
  : > "$out/attention.jsonl"
  for bt in "8 4096" "2 16384"; do
    set -- $bt
    for c in causal window_softcap sinks_gqa; do
      LADLE_AUTOTUNE=heuristic "$bin/ladle-bench-attention" --case $c -B $1 -T $2 -H 16 -D 128 ${LADLE_ATTENTION_TILES:---tile 128,64,8,2 --tile 128,128,8,2 --tile 64,64,4,2 --tile 128,32,8,2 --tile 128,64,8,2,wgmma --tile 128,128,8,1,wgmma --tile 128,128,8,2,wgmma} >> "$out/attention.jsonl" 2>> "$log"
    done
  done
  PYTHONUNBUFFERED=1 timeout 900 python3 bench/attention_bench.py --shapes 8x4096,2x16384 >> "$out/attention.jsonl" 2>> "$log"
  python3 bench/attention_bench.py --table < "$out/attention.jsonl" | tee -a "$summary"
fi

echo
echo "=================== summary ==================="
cat "$summary"
