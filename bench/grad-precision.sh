# Issue 36's precision table in one GPU call: each op's gradients against an fp64 oracle, ladle
# beside fla 0.6 on the same inputs (bf16 q, k, v, do; fp32 gates): ladle-bench-precision writes the
# inputs and ladle's gradients, bench/grad_precision.py runs the oracle (torch autograd in fp64) and
# fla, and prints the table. First ladle alone (fast), then with fla for the ops in FLA_OPS (default
# gla: fla 0.6's simple GLA backward refuses Triton 3.4-3.7.0 on Hopper, its issue #640; fla's first
# backward compiles for minutes). Needs .deps carried, and fla's wheels in .whl for the fla column.
#   bash bench/grad-precision.sh [BxTxHxKxV ...]     (default 1x1000x4x128x128)
set -u
. bench/build.sh /tmp/precision-build.log ladle-bench-precision
shapes=${*:-1x1000x4x128x128}
dirs=()
for shape in $shapes; do
  IFS=x read -r B T H K V <<< "$shape"
  for op in gla simple_gla g_gamma user; do
    dir=/tmp/precision/$op-$shape
    timeout 120 "$build/tools/ladle-bench/ladle-bench-precision" --op "$op" -B "$B" -T "$T" -H "$H" -K "$K" -V "$V" --out "$dir" && dirs+=("$dir")
  done
done
[ ${#dirs[@]} -gt 0 ] || { echo "no precision directory was written"; exit 1; }
timeout 200 python3 bench/grad_precision.py --fla-ops "" "${dirs[@]}"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
  PYTHONPATH=/tmp/site timeout ${FLA_TIMEOUT:-600} python3 bench/grad_precision.py --fla-ops "${FLA_OPS:-gla}" "${dirs[@]}"
fi
