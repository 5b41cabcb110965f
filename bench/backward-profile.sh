# The recurrent backward on the GPU: the backward tests, then each kernel's duration under Nsight Compute
# for one forward + backward of each op at B8 T4096 H16 K=V=128 bf16 (the first call's kernels).
#   bash bench/backward-profile.sh [ops...]   (default: gla simple_gla)
set -u
. bench/build.sh /tmp/backward-build.log ops-backward ops-gpu ladle-bench-recurrent
if [ -z "${SKIP_TESTS:-}" ]; then
  "$build/tests/ops-gpu" "[backward]" | tail -2
  "$build/tests/ops-backward" "[recurrent]" 2>&1 | grep -E "relative error|FAILED|passed|failed" | head -40
fi
for op in "${@:-gla simple_gla}"; do
  for one in $op; do
    LADLE_AUTOTUNE=heuristic timeout 200 ncu --metrics gpu__time_duration.sum --csv \
      "$bench" --backward --algo chunked --op "$one" --reps 1 2>/dev/null > /tmp/ncu-$one.csv
    python3 - "$one" /tmp/ncu-$one.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[2]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
name, value = head.index("Kernel Name"), head.index("Metric Value")
seen, total = [], 0.0
for r in body:
    us = float(r[value].replace(",", "")) / 1000.0
    seen.append((r[name][:60], us))
# the first call: forward then backward; print its kernels (after the fills, up to the forward's next call)
start = next(i for i in range(len(seen)) if not seen[i][0].startswith("fill"))
first = seen[start][0]
cut = next((i for i in range(start + 1, len(seen)) if seen[i][0] == first), len(seen))
for k, us in seen[start:cut]:
    total += us
    print(f"{sys.argv[1]:>10} {us:9.1f} us  {k}")
print(f"{sys.argv[1]:>10} {total:9.1f} us  total of the first call's kernels")
PY
  done
done
