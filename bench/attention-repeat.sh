#!/usr/bin/env bash
# Run-order check on the lent GPU (issue 12): the same attention tile timed several times in one
# process and in fresh processes, to tell a kernel's speed from the order it was timed in.
#   CASE=causal SHAPE=8x4096 TILE="128,128,8,2,ws 128,128,8,3,ws" bash bench/attention-repeat.sh   (carry .deps)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
: > "$out/build.log"
. bench/build.sh "$out/build.log" ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=$(mktemp -d)
shape=${SHAPE:-8x4096}; B=${shape%x*}; T=${shape#*x}; tile=${TILE:-128,128,8,2,ws}
for round in 1 2; do
  echo "== process $round: the heuristic, then each of $tile three times"
  "$bench_bin" --case ${CASE:-causal} -B $B -T $T -H 16 -D 128 | grep -o '"tile":"[^"]*","ms":[0-9.]*'
  for t in $tile; do
    "$bench_bin" --case ${CASE:-causal} -B $B -T $T -H 16 -D 128 --tile $t --tile $t --tile $t | grep -o '"tile":"[^"]*","ms":[0-9.]*'
  done
done
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv
