# Issue 34 on the GPU machine, in one call: the test programs' times with a GPU (each <= 120 s?),
# a cache prebuilt on a machine without a GPU loaded read only (zero compiles?), and the cold first
# call and tuning times per op. Needs .deps and .prebuilt carried (.prebuilt: `ladle-cache prebuild`
# run here, see bench/RESULTS.md). Writes $OUT/ctest.log, $OUT/first-calls.txt.
#   bash bench/start-fast.sh [tests] [first] [prebuilt] [interim] [backward]
# interim: cold first calls as a user makes them (--algo auto): the fused recurrent kernel runs the
# call while the chunked kernels compile behind it; beside each, LADLE_BACKGROUND_COMPILE=0 (waits).
# backward: the same for forward + backward (the fused-recurrent backward as the backward's interim form).
# LADLE_TARGETS (default all) names what to build, LADLE_TESTS a ctest -R regex (default every test).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
what=${*:-tests first}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
. bench/build.sh "$out/build.log" ${LADLE_TARGETS:-all}
echo "build done: $SECONDS s"
bench=$build/tools/ladle-bench/ladle-bench-recurrent
# One ladle-bench-recurrent process with empty caches, ladle's and NVRTC's own (CUDA 12.9+ keeps one
# across processes in CUDA_CACHE_PATH): label, env..., -- its arguments. Prints the first call, the
# compile behind it, the call after it, the steady time, and the NVRTC compiles in the log.
cold_row() {
  local label=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local line=$(env LADLE_CACHE_DIR=$(mktemp -d) CUDA_CACHE_PATH=$(mktemp -d) LADLE_LOG=debug "${envs[@]}" "$bench" "$@" 2> "$out/stderr.txt" | tail -1)
  local compiles=$(grep -c "compiled .* in .* ms" "$out/stderr.txt")
  echo "$label | $(echo "$line" | grep -oE '"(first_call_ms|interim|background_ms|second_call_ms|ms|total_ms)":[a-z0-9.]+' | tr '\n' ' ')| $compiles NVRTC compiles"
}
if [[ $what == *tests* ]]; then
  # Each program alone on the GPU (-j1 for the GPU programs' own times; the emulation and NVRTC
  # programs, which need no GPU, beside them would only slow them).
  export LADLE_CACHE_DIR=$(mktemp -d)
  ctest --test-dir "$build" -LE full -j6 --timeout 300 -E "^codegen-" -R "${LADLE_TESTS:-.}" > "$out/ctest.log" 2>&1
  grep -E "tests passed|tests failed|Failed|Timeout" "$out/ctest.log" | head -20
  grep -E "Test +#" "$out/ctest.log" | awk '{print $(NF-1), $4}' | sort -rn | head -12
  echo "tests done: $SECONDS s"
fi
if [[ $what == *first* ]]; then
  shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
  first() { cold_row "$@"; }
  {
    for op in gla simple_gla rwkv6 gated_delta_rule; do
      first "cold, heuristic, $op fwd B8 T4096" LADLE_AUTOTUNE=heuristic -- --op $op --algo chunked $shape --reps 5
    done
    first "cold, heuristic, gla fwd B2 T16384" LADLE_AUTOTUNE=heuristic -- --op gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 5
    first "cold, heuristic, gla fwd+bwd B8 T4096" LADLE_AUTOTUNE=heuristic -- --op gla --algo chunked $shape --reps 5 --backward
    first "prebuilt read-only cache, gla fwd B8 T4096" LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$PWD/.prebuilt LADLE_CACHE_READONLY=1 -- --op gla --algo chunked $shape --reps 5
    first "prebuilt read-only cache, gla fwd B2 T16384" LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$PWD/.prebuilt LADLE_CACHE_READONLY=1 -- --op gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 5
    # Tuning, cold, into one tuned cache that ladle-cache then lists (the picks and the heuristic's time).
    tuned=$(mktemp -d)
    for run in 1 2; do
      first "tuning (cold, cached policy) $run, gla fwd B8 T4096" LADLE_CACHE_DIR=$tuned/$run -- --op gla --algo chunked $shape --reps 20
      first "tuning (cold, cached policy) $run, gla fwd B2 T16384" LADLE_CACHE_DIR=$tuned/$run -- --op gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 20
      first "heuristic again $run, gla fwd B8 T4096" LADLE_AUTOTUNE=heuristic -- --op gla --algo chunked $shape --reps 20
      LADLE_CACHE_DIR=$tuned/$run "$build/tools/ladle-cache/ladle-cache" tuned
    done
  } | tee "$out/first-calls.txt"
fi
if [[ $what == *interim* ]]; then
  shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
  row() { cold_row "$1" LADLE_AUTOTUNE=heuristic "${@:2}"; }  # the heuristic unless the row names a policy
  {
    for rep in 1 2; do
      for op in gla simple_gla rwkv6 gated_delta_rule delta_rule kda; do
        row "cold, auto, $op fwd B8 T4096 ($rep)" -- --op $op --algo auto $shape --reps 20
        row "cold, auto, waits, $op fwd B8 T4096 ($rep)" LADLE_BACKGROUND_COMPILE=0 -- --op $op --algo auto $shape --reps 20
      done
      row "cold, auto, gla fwd B2 T16384 ($rep)" -- --op gla --algo auto -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 20
      row "cold, auto, waits, gla fwd B2 T16384 ($rep)" LADLE_BACKGROUND_COMPILE=0 -- --op gla --algo auto -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 20
      # The default policy (cached) on a shape not tuned yet: the candidates compile behind the first
      # call; the second call times them (second_call_ms). Waiting: the first call compiles and times.
      row "tuning, cached policy, gla fwd B8 T4096 ($rep)" LADLE_AUTOTUNE=cached -- --op gla --algo auto $shape --reps 20
      row "tuning, cached policy, waits, gla fwd B8 T4096 ($rep)" LADLE_AUTOTUNE=cached LADLE_BACKGROUND_COMPILE=0 -- --op gla --algo auto $shape --reps 20
      row "tuning, cached policy, gla fwd B2 T16384 ($rep)" LADLE_AUTOTUNE=cached -- --op gla --algo auto -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 20
      row "tuning, cached policy, waits, gla fwd B2 T16384 ($rep)" LADLE_AUTOTUNE=cached LADLE_BACKGROUND_COMPILE=0 -- --op gla --algo auto -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 20
      row "cold, auto, gla fwd+bwd B8 T4096 ($rep)" -- --op gla --algo auto $shape --reps 5 --backward
      row "cold, auto, waits, gla fwd+bwd B8 T4096 ($rep)" LADLE_BACKGROUND_COMPILE=0 -- --op gla --algo auto $shape --reps 5 --backward
    done
  } | tee "$out/interim.txt"
fi
if [[ $what == *backward* ]]; then
  # Forward + backward, cold, as a user makes the calls (--algo auto): the fused-recurrent forward and
  # backward run while the chunked forms' programs compile behind them; beside each, waiting.
  shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
  row() { cold_row "$1" LADLE_AUTOTUNE=heuristic "${@:2}"; }
  {
    for rep in 1 2; do
      for op in gla simple_gla rwkv6 gated_delta_rule delta_rule kda; do
        row "cold, auto, $op fwd+bwd B8 T4096 ($rep)" -- --op $op --algo auto $shape --reps 5 --backward
        row "cold, auto, waits, $op fwd+bwd B8 T4096 ($rep)" LADLE_BACKGROUND_COMPILE=0 -- --op $op --algo auto $shape --reps 5 --backward
      done
    done
  } | tee "$out/interim-backward.txt"
fi
if [[ $what == *prebuilt* ]]; then
  # Only the prebuilt cache's rows (made here without a GPU: the forward for both shapes and GLA's
  # backward, `ladle-cache prebuild --backward`): zero compiles of the op's kernels expected.
  bench=$build/tools/ladle-bench/ladle-bench-recurrent
  shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
  for args in "--op gla --algo chunked $shape --reps 5" "--op gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128 --reps 5" \
              "--op gla --algo chunked $shape --reps 5 --backward"; do
    line=$(LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$PWD/.prebuilt LADLE_CACHE_READONLY=1 LADLE_LOG=debug $bench $args 2> "$out/stderr.txt" | tail -1)
    echo "prebuilt read-only: $args | $(echo "$line" | grep -oE '"first_call_ms":[0-9.]+') | compiled: $(grep -oE "compiled [a-z_]+[0-9a-f_]*" "$out/stderr.txt" | tr '\n' ' ')"
  done | tee "$out/prebuilt.txt"
fi
echo "all done: $SECONDS s"
