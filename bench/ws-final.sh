#!/usr/bin/env bash
# Issue 11's table in one call on the lent GPU (eighth and ninth steps): ladle's chunked GLA and simple GLA
# by the heuristic at B32 T1024, B8 T4096 and B2 T16384 (H16 K=V=128 bf16), the tuner's pick at B8 T4096
# for both (LADLE_AUTOTUNE=force), other segment lengths at B2 (LADLE_SEGMENT_SWEEP), the fused-recurrent GLA, then fla 0.6's chunk_gla, chunk_simple_gla and
# fused_recurrent_gla at the same shapes, as one table (bench/table.py).   (carry .deps and .whl)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log="$out/ws-final.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log"
. bench/build.sh "$log" ladle-bench-recurrent
export LADLE_CACHE_DIR=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$log" 2>&1
export PYTHONPATH=/tmp/site
: > "$out/ladle.jsonl"
for bt in 32x1024 8x4096 2x16384; do
  set -- ${bt/x/ }
  for op in gla simple_gla; do
    LADLE_AUTOTUNE=heuristic timeout 60 "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | tee -a "$out/ladle.jsonl"
    [ "$bt" = 8x4096 ] && LADLE_AUTOTUNE=force timeout 120 "$bench" --algo chunked --op $op -B $1 -T $2 -H 16 -K 128 -V 128 2> "$out/tune-$op.log" |
      sed 's/"tile":"tuned(force)"/"tile":"tuned"/' | tee -a "$out/ladle.jsonl"
    # LADLE_SEGMENT_SWEEP="2048 8192": B2 T16384 in segments of other lengths beside the heuristic's 4096.
    [ "$bt" = 2x16384 ] && [ -n "${LADLE_SEGMENT_SWEEP:-}" ] && LADLE_AUTOTUNE=heuristic timeout 60 "$bench" --algo chunked --op $op \
      -B $1 -T $2 -H 16 -K 128 -V 128 $(for s in $LADLE_SEGMENT_SWEEP; do echo --segment-tokens $s; done) 2>> "$log" | tee -a "$out/ladle.jsonl"
  done
  LADLE_AUTOTUNE=heuristic timeout 60 "$bench" --algo recurrent --op gla -B $1 -T $2 -H 16 -K 128 -V 128 2>> "$log" | tee -a "$out/ladle.jsonl"
done
grep -h "chose\|best\|winner" "$out"/tune-*.log | tail -4
PYTHONUNBUFFERED=1 timeout 200 python3 bench/fla_bench.py --ops chunk_gla,chunk_simple_gla,fused_recurrent_gla \
  --shapes 32x1024x16x128x128,8x4096x16x128x128,2x16384x16x128x128 > "$out/fla.jsonl" 2>> "$log"
cat "$out/ladle.jsonl" "$out/fla.jsonl" | python3 bench/table.py
