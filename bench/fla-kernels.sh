# fla 0.6's kernels one by one (Nsight Compute, the GPU's own clocks), beside ladle's, for one op at
# B8 T4096 H16 K=V=128 bf16: where fla's time goes, kernel by kernel. Needs .deps and .whl carried.
#   bash bench/fla-kernels.sh [fla op, default chunk_gated_delta_rule] [ladle op, default gated_delta_rule]
set -u
fla_op=${1:-chunk_gated_delta_rule}
ladle_op=${2:-gated_delta_rule}
. bench/build.sh /tmp/fla-kernels-build.log ladle-bench-recurrent
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1 || tail -5 /tmp/fla-install.log
durations() { grep -E "^  [A-Za-z_].*\(|gpu__time_duration" | paste - - | awk '{printf "  %-60s %10s %s\n", substr($1, 1, 60), $NF, $(NF-1)}'; }
echo "== fla $fla_op"
PYTHONPATH=/tmp/site ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
  python3 bench/fla_bench.py --shapes 8x4096x16x128x128 --ops "$fla_op" --profile 2>&1 | tee /tmp/fla-kernels.txt | durations
echo "== ladle $ladle_op"
LADLE_CACHE_DIR=/tmp/ladle-cache LADLE_AUTOTUNE=heuristic ncu --clock-control none --metrics gpu__time_duration.sum --kernel-name regex:ladle_ -c 3 \
  "$bench" --algo chunked --op "$ladle_op" -B 8 -T 4096 -H 16 -K 128 -V 128 --reps 1 2>&1 | durations
