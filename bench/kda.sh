# KDA's forward beside fla's in one GPU call (issue 37): ladle's chunked form (the chunked delta
# kernels with per-feature gates) and fused-recurrent form, and fla 0.6's chunk_kda and
# fused_recurrent_kda, at B8 T4096 H16 K=V=128 bf16 and the shapes given (and ladle's chunked form with
# grouped value heads, HV = 2H, beside 2H heads) (g = logsigmoid(x)/16
# [B,T,H,K], beta = sigmoid(x), q and k L2-normalised in the kernel); then each ladle kernel's time
# under Nsight Compute (gpu__time_duration, fixed clocks). Needs .deps carried, and fla's wheels in
# .whl for the fla rows.
#   bash bench/kda.sh [BxTxHxKxV ...]
set -u
. bench/build.sh /tmp/kda-build.log ladle-bench-recurrent
shapes=${*:-8x4096x16x128x128}
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
fi
for shape in $shapes; do
  IFS=x read -r B T H K V <<< "$shape"
  for algo in chunked recurrent; do
    LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} timeout 150 "$bench" --algo $algo --op kda -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 20
  done
  # Grouped value heads: twice the value heads on the same q and k, beside twice the heads.
  for heads in "-H $H --HV $((2 * H))" "-H $((2 * H))"; do
    LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} timeout 150 "$bench" --algo chunked --op kda -B "$B" -T "$T" $heads -K "$K" -V "$V" --reps 20
  done
  if [ -d /tmp/site ]; then
    PYTHONPATH=/tmp/site timeout 400 python3 bench/fla_bench.py --ops chunk_kda,fused_recurrent_kda --shapes "$shape"
  fi
  if command -v ncu > /dev/null; then
    LADLE_AUTOTUNE=heuristic timeout 200 ncu --metrics gpu__time_duration.sum --csv -k regex:ladle_delta "$bench" --algo chunked --op kda \
      -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 1 2> /dev/null | grep ladle_delta | awk -F'","' '{print $5, $(NF)}' | sort | uniq -c | head -12
  fi
done
