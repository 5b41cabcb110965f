#!/usr/bin/env bash
# Issue 13's attention backward on the lent GPU, in one call: the gradient tests (the GPU backward
# against the CPU backward, the CPU backward against finite differences), the emulation test's NVRTC
# part, compute-sanitizer memcheck over the GPU comparison, ladle's forward, backward and forward +
# backward beside PyTorch's (SDPA cuDNN, SDPA flash, FlexAttention), and Nsight Compute on the
# backward's main kernel. From the repository root with .deps carried:
#   bash bench/attention-backward.sh [tests] [bench] [ncu] [ab]     (default: the first three)
# LADLE_BWD_SHAPES "BxT ..." (default 8x4096), H16 D128 bf16, causal.
# ab: the same bench for a baseline source tree (LADLE_BASE, default .base: e.g. `git archive HEAD`
# unpacked there and carried), built in /tmp/build-base, alternated with this tree's twice in the
# same call; LADLE_BWD_STAGES (e.g. "2,3") times this tree's backward at those stages.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/attention-backward.log"
: > "$log"
base=${LADLE_BASE:-.base}
if [[ " $* " == *" ab "* ]]; then
  [ -d "$base" ] || { echo "ab: no baseline tree at $base"; exit 1; }
  # The baseline builds beside this tree's (its own log), with the header dependencies of this one.
  (cd "$base" && rm -rf .deps && ln -s "$OLDPWD/.deps" .deps && LADLE_GPU_BUILD=/tmp/build-base . bench/build.sh "$out/base-build.log" ladle-bench-attention) &
  base_pid=$!
fi
. bench/build.sh "$log" ops-backward ops-attention codegen-cuda_attention_backward ladle-bench-attention
if [ -n "${base_pid:-}" ] && ! wait "$base_pid"; then echo "ab: the baseline did not build"; exit 1; fi
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
    echo "== ops-attention (the GPU forward against the CPU path and the fp64 reference)"
    timeout 300 "$build/tests/ops-attention" 2>&1 | tail -4
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
  ab)
    for round in 1 2; do
      for tree in base this; do
        bin=$bench_bin extra=(--bwd-stages "${LADLE_BWD_STAGES:-0}")
        [ $tree = base ] && bin=/tmp/build-base/tools/ladle-bench/ladle-bench-attention extra=()
        echo "== $tree (round $round): causal B8 T4096 H16 D128"
        timeout 200 "$bin" --backward --case causal --reps 20 "${extra[@]}" 2>&1 | sed "s/\"impl\":\"ladle\"/\"impl\":\"ladle-$tree\"/" |
          tee -a "$out/bench.jsonl"
      done
    done
    ;;
  ncu)
    echo "== Nsight Compute: the backward's main kernel (causal B8 T4096)"
    timeout 240 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats -k regex:ladle_attention_bwd_[0-9a-f] -c 1 \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum" \
      "$bench_bin" --backward --case causal --reps 1 > "$out/ncu.txt" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Issued Ipc|No Eligible|One or More" "$out/ncu.txt" | head -30
    # The stall reasons, largest first (warps per issued instruction), and the L2 and tensor-pipe counters.
    grep -E "issue_stalled|lts__t_sectors" "$out/ncu.txt" | awk '{print $NF, $1}' | sort -gr | head -16
    ;;
  esac
done
