# KDA's forward beside fla's in one GPU call (issue 37): ladle's fused-recurrent form (the chunked
# one is not built yet) and fla 0.6's chunk_kda and fused_recurrent_kda, at B8 T4096 H16 K=V=128 bf16
# and the shapes given (g = logsigmoid(x)/16 [B,T,H,K], beta = sigmoid(x), q and k L2-normalised in
# the kernel). Needs .deps carried, and fla's wheels in .whl for the fla rows.
#   bash bench/kda.sh [BxTxHxKxV ...]
set -u
. bench/build.sh /tmp/kda-build.log ladle-bench-recurrent
shapes=${*:-8x4096x16x128x128}
for shape in $shapes; do
  IFS=x read -r B T H K V <<< "$shape"
  LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} timeout 150 "$bench" --algo recurrent --op kda -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 20
done
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
  PYTHONPATH=/tmp/site timeout 400 python3 bench/fla_bench.py --ops chunk_kda,fused_recurrent_kda --shapes "$(echo $shapes | tr ' ' ',')"
fi
