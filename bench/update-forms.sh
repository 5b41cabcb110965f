# The update forms (issue 14) on the GPU beside fla, in one call: ops-update_forms on the GPU
# backend (the fp64 oracle), ladle's forward of delta_rule, gated_delta_rule and rwkv6 at
# B8 T4096 H16 K=V=128 bf16 (ladle-bench-recurrent, device tensors, CUDA events; --algo given,
# default recurrent), Nsight Compute on ladle's gated delta rule kernel, and fla 0.6's chunk and
# fused-recurrent kernels of the same ops (bench/fla_bench.py). Needs .deps and .whl carried.
#   bash bench/update-forms.sh [tests] [sanitizer] [bench] [ncu] [fla]     (no argument: all but sanitizer)
# Environment: LADLE_ALGO (chunked recurrent), LADLE_SHAPE (BxTxHxKxV), LADLE_NCU_OP (gated_delta_rule),
# FLA_OPS (fla's ops, one process each).
set -u
steps=${*:-tests bench ncu fla}
algos=${LADLE_ALGO:-chunked recurrent}
shape=${LADLE_SHAPE:-8x4096x16x128x128}
IFS=x read -r B T H K V <<< "$shape"
. bench/build.sh /tmp/update-forms-build.log ladle-bench-recurrent ops-update_forms
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle-cache}
nvidia-smi --query-gpu=name --format=csv,noheader
for step in $steps; do
  case $step in
    tests)
      echo "== ops-update_forms (CPU and GPU backends)"
      timeout 300 "$build/tests/ops-update_forms" 2>&1 | tail -4 ;;
    sanitizer)
      echo "== compute-sanitizer memcheck: ops-update_forms [chunked]"
      LADLE_AUTOTUNE=heuristic timeout 400 compute-sanitizer --tool memcheck --print-limit 5 "$build/tests/ops-update_forms" "[chunked]" 2>&1 | tail -4 ;;
    bench)
      for algo in $algos; do
        echo "== ladle, --algo $algo, $shape"
        for op in delta_rule gated_delta_rule rwkv6; do
          LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} timeout 150 "$bench" --algo "$algo" --op "$op" -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 20 \
            ${LADLE_TILES:-} | grep -v copy_bandwidth
        done
      done ;;
    ncu)
      algo=${algos%% *}
      op=${LADLE_NCU_OP:-gated_delta_rule}
      echo "== ncu: ladle $op, --algo $algo"
      LADLE_AUTOTUNE=heuristic timeout 200 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        --kernel-name regex:ladle_ -c 3 "$bench" --algo "$algo" --op "$op" -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 1 \
        > /tmp/update-forms-ncu.txt 2>&1
      grep -E "ladle_|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued" /tmp/update-forms-ncu.txt | head -40
      echo "== kernel times at the GPU's own clocks (ncu --clock-control none): ladle $op"
      LADLE_AUTOTUNE=heuristic timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --kernel-name regex:ladle_ -c 6 \
        "$bench" --algo "$algo" --op "$op" -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 1 2>&1 | grep -E "ladle_|gpu__time_duration" | head -12 ;;
    fla)
      echo "== fla"
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1 || tail -5 /tmp/fla-install.log
      # One process an op: a kernel fault in one (fla's fused_recurrent_gated_delta_rule faulted here once) spares the others.
      for op in ${FLA_OPS:-chunk_delta_rule chunk_gated_delta_rule chunk_rwkv6 fused_recurrent_rwkv6 fused_recurrent_delta_rule}; do
        PYTHONPATH=/tmp/site timeout 200 python3 bench/fla_bench.py --shapes "$shape" --ops "$op" 2>&1 | grep -v copy_bandwidth | tail -2
      done ;;
  esac
done
