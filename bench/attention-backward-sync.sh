#!/usr/bin/env bash
# Issue 38: the attention backward past D = 128 (ws, the warpgroups splitting the columns) and for f32
# inputs (the sync form, mma.sync) on the lent
# GPU, in one call: its gradients against fp64 and against the CPU backward, the NVRTC resource
# check, compute-sanitizer memcheck over the fp64 test, and ladle's causal forward + backward at
# D = 256 beside PyTorch's (SDPA flash / cuDNN / efficient, FlexAttention). From the repository
# root with .deps carried:
#   bash bench/attention-backward-sync.sh [tests] [sanitize] [bench]     (default: all three)
# LADLE_SYNC_SHAPES "BxT ..." (default 2x4096), H16 bf16 causal; LADLE_SYNC_DIMS (default "256 128").
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/attention-backward-sync.log"
: > "$log"
. bench/build.sh "$log" ops-backward codegen-cuda_attention_backward ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for what in ${*:-tests sanitize bench}; do
  case $what in
  tests)
    echo "== ops-backward: the GPU backward against fp64 (f32, D 256) and against the CPU backward"
    timeout 300 "$build/tests/ops-backward" "the attention backward on the GPU: f32 and head dims to 256 against fp64" 2>&1 | grep -E "against fp64|passed|failed|FAILED|error" | head -30
    timeout 300 "$build/tests/ops-backward" "the attention backward on the GPU matches the CPU backward" 2>&1 | tail -4
    echo "== codegen-cuda_attention_backward [nvrtc]"
    timeout 120 "$build/tests/codegen-cuda_attention_backward" "[nvrtc]" 2>&1 | grep -E "^sm_90a|^backward sync|passed|failed|FAILED" | head -30
    ;;
  sanitize)
    echo "== compute-sanitizer memcheck: the fp64 test"
    timeout 240 compute-sanitizer --tool memcheck "$build/tests/ops-backward" "the attention backward on the GPU: f32 and head dims to 256 against fp64" 2>&1 | tail -4
    ;;
  bench)
    for shape in ${LADLE_SYNC_SHAPES:-2x4096}; do
      IFS=x read -r B T <<< "$shape"
      for D in ${LADLE_SYNC_DIMS:-256 128}; do
        echo "== ladle causal B$B T$T H16 D$D: forward, backward, forward + backward"
        timeout 200 "$bench_bin" --backward --case causal -B "$B" -T "$T" -D "$D" --reps 20 2>&1 | tee -a "$out/bench.jsonl"
        echo "== peers D$D (fwd + bwd, then fwd)"
        timeout 300 python3 bench/attention_bench.py --backward --cases causal --shapes "$B"x"$T" --dim "$D" 2>&1 | tee -a "$out/bench.jsonl" | tail -8
      done
    done
    ;;
  esac
done
