# Issue 34 on the GPU machine: what NVRTC's fast-compile levels cost a kernel at run time and save
# at its first call. For each level (none, mid, max) on a fresh cache: GLA forward and forward +
# backward (B8 T4096 H16 K=V=128 bf16, heuristic policy), their first call and steady times; then
# ops-backward's GPU case with the level, against the CPU backward. Needs .deps carried.
#   bash bench/fast-compile.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
. bench/build.sh "$out/build.log" ladle-bench-recurrent ops-backward
echo "build done: $SECONDS s"
shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
for level in none max mid; do
  flags=""; [ $level != none ] && flags="--Ofast-compile=$level"
  for args in "--op gla --algo chunked $shape --reps 20" "--op gla --algo chunked $shape --reps 20 --backward" "--op gated_delta_rule --algo chunked $shape --reps 20"; do
    cache=$(mktemp -d)
    line=$(env LADLE_CACHE_DIR=$cache LADLE_AUTOTUNE=heuristic LADLE_LOG=debug LADLE_NVRTC_FLAGS="$flags" $bench $args 2> "$out/stderr-$level.txt" | tail -1)
    echo "$level | $args | $(echo "$line" | grep -oE '"(first_call_ms|ms|forward_ms|backward_ms|total_ms)":[0-9.]+' | tr '\n' ' ') | $(grep -oE "compiled [a-z_0-9]+\.cu for sm_90a in [0-9.]+ ms" "$out/stderr-$level.txt" | awk '{print $2, $6}' | tr '\n' ' ')"
  done
done
LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$(mktemp -d) LADLE_NVRTC_FLAGS=--Ofast-compile=max LADLE_TEST_PRINT_ERRORS=1 \
  timeout 200 "$build/tests/ops-backward" "the GPU backward on the tensor cores*" 2>&1 | tail -30
echo "all done: $SECONDS s"
