#!/usr/bin/env bash
# Issue 13's attention backward on the lent GPU, in one call: the gradient tests (the GPU backward
# against the CPU backward, the CPU backward against finite differences), the emulation test's NVRTC
# part, compute-sanitizer memcheck over the GPU comparison, ladle's forward, backward and forward +
# backward beside PyTorch's (SDPA cuDNN, SDPA flash, FlexAttention), and Nsight Compute on the
# backward's main kernel. From the repository root with .deps carried:
#   bash bench/attention-backward.sh [tests] [bench] [ncu]     (default: all three)
# LADLE_BWD_SHAPES "BxT ..." (default 8x4096), H16 D128 bf16, causal.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/attention-backward.log"
: > "$log"
. bench/build.sh "$log" ops-backward codegen-cuda_attention_backward ladle-bench-attention
bench_bin="$build/tools/ladle-bench/ladle-bench-attention"
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=${*:-tests bench ncu}
for what in $steps; do
  case $what in
  tests)
    echo "== ops-backward [attention] (GPU backward vs CPU backward; CPU backward vs finite differences)"
    timeout 300 "$build/tests/ops-backward" "[attention]" 2>&1 | tail -25
    echo "== codegen-cuda_attention_backward [nvrtc]"
    timeout 120 "$build/tests/codegen-cuda_attention_backward" "[nvrtc]" 2>&1 | grep -E "^sm_90a|passed|failed|FAILED" | head -20
    echo "== compute-sanitizer memcheck: the GPU comparison"
    timeout 240 compute-sanitizer --tool memcheck "$build/tests/ops-backward" "the attention backward on the GPU matches the CPU backward" 2>&1 | tail -6
    ;;
  bench)
    for shape in ${LADLE_BWD_SHAPES:-8x4096}; do
      IFS=x read -r B T <<< "$shape"
      echo "== ladle causal B$B T$T H16 D128: forward, backward, forward + backward"
      timeout 200 "$bench_bin" --backward --case causal -B "$B" -T "$T" --reps 20 2>&1 | tee -a "$out/bench.jsonl"
    done
    echo "== peers (fwd + bwd, then fwd)"
    timeout 300 python3 bench/attention_bench.py --backward --cases causal --shapes "$(echo ${LADLE_BWD_SHAPES:-8x4096} | tr ' ' ',')" 2>&1 | tee -a "$out/bench.jsonl" | tail -8
    ;;
  ncu)
    echo "== Nsight Compute: the backward's main kernel (causal B8 T4096)"
    timeout 240 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats -k regex:ladle_attention_bwd_[0-9a-f] -c 1 \
      "$bench_bin" --backward --case causal --reps 1 > "$out/ncu.txt" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Issued Ipc|No Eligible|One or More" "$out/ncu.txt" | head -30
    ;;
  esac
done
