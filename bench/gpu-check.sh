#!/usr/bin/env bash
# The one script for the lent GPU machine: builds ladle there, runs the test suite with a
# GPU present, checks numerics, runs compute-sanitizer, times, and prints one short table
# last. Full logs go to $OUT (or ./gpu-out). Run from the repository root:
#   bench/gpu-check.sh [runtime|all]
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
[ -d .deps/root/usr ] && prefix="-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr"
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
  note "ctest (GPU machine): FAILURES"; grep -E "Failed|FAILED|\*\*\*" "$log" | tail -20
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
echo
echo "=================== summary ==================="
cat "$summary"
