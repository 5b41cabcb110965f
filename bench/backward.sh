# The recurrent backward on the GPU beside fla, in one call: ladle's forward + backward
# (ladle-bench-recurrent --backward, device tensors, CUDA events) and fla's chunk kernels' forward +
# backward (bench/fla_bench.py --backward, triton's do_bench), at B8 T4096 H16 K=V=128 bf16 and the
# shapes given. Needs .deps carried, and fla's wheels in .whl for the fla rows.
#   bash bench/backward.sh [BxTxHxKxV ...]
set -u
. bench/build.sh /tmp/backward-build.log ladle-bench-recurrent
shapes=${*:-8x4096x16x128x128}
for shape in $shapes; do
  IFS=x read -r B T H K V <<< "$shape"
  for op in gla simple_gla user; do
    LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} timeout 150 "$bench" --backward --algo chunked --op "$op" -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --reps 20 | grep -v copy_bandwidth
  done
done
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
  PYTHONPATH=/tmp/site timeout 300 python3 bench/fla_bench.py --backward --ops chunk_gla,chunk_simple_gla --shapes "$(echo $shapes | tr ' ' ',')" | grep -v copy_bandwidth
fi
