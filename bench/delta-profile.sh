# Profile of the chunked delta rule's kernels on the GPU (bench/RESULTS.md, issue 14): the timing, then
# for each kernel Nsight Compute's warp states and its 25 SASS instructions with the most stall
# samples (where the time goes), at B8 T4096 H16 K=V=128 bf16.
#   bash bench/delta-profile.sh [kernel regex, default ladle_delta]
. bench/build.sh /tmp/b.log ladle-bench-recurrent >/dev/null
export LADLE_CACHE_DIR=/tmp/pc LADLE_AUTOTUNE=heuristic
args="--algo chunked --op gated_delta_rule -B 8 -T 4096 -H 16 -K 128 -V 128"
$bench $args --reps 5 | grep -v copy
for kernel in ${1:-prepare states outputs}; do
  ncu --section WarpStateStats --section SourceCounters --page source --print-source sass --csv -k regex:ladle_delta_$kernel -c 1 \
    $bench $args --reps 1 > /tmp/src-$kernel.csv 2>/tmp/src-$kernel.err
  [ -n "${OUT:-}" ] && cp /tmp/src-$kernel.csv /tmp/src-$kernel.err "$OUT"/ 2>/dev/null
  python3 - "$kernel" /tmp/src-$kernel.csv <<'PY'
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[2]) if l.startswith('"')))
while rows and "Source" not in rows[0]: rows = rows[1:]  # a kernel-name row comes first
head = rows[0] if rows else []; data = rows[1:]
cols = [i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")]
srcs = [i for i, h in enumerate(head) if h == "Source"]
if not cols or not srcs:
    print("no stall-sampling column; header:", head[:12]); sys.exit(0)
col, src = cols[0], srcs[0]
total = sum(float(r[col] or 0) for r in data)
print(f"== {sys.argv[1]}: {len(data)} SASS lines, {total:.0f} stall samples")
for r in sorted(data, key=lambda r: -float(r[col] or 0))[:25]:
    print(f"{float(r[col] or 0) / total * 100:5.1f}%  {r[src][:110]}")
PY
done
