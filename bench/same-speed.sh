#!/usr/bin/env bash
# Issue 35 ("the same speed"): every family's benchmark for a baseline tree and this tree, built
# on the GPU machine and alternated in one call on one card, three rounds, heuristic policy. The
# baseline is a source tree at $LADLE_BASE (default .base: `git archive <commit> | tar -x -C .base`
# here, carried with .deps). Prints one line per benchmark, tree and round, then the medians:
#   bash bench/same-speed.sh            (from the repository root on the GPU machine)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
base=${LADLE_BASE:-.base}
[ -d "$base" ] || { echo "no baseline tree at $base"; exit 1; }
targets="ladle-bench-recurrent ladle-bench-attention ladle-dump"
(cd "$base" && rm -rf .deps && ln -s "$OLDPWD/.deps" .deps && LADLE_GPU_BUILD=/tmp/build-base . bench/build.sh "$out/base-build.log" $targets) &
base_pid=$!
. bench/build.sh "$out/build.log" $targets
wait "$base_pid" || { echo "the baseline did not build"; tail -20 "$out/base-build.log"; exit 1; }
echo "built: $SECONDS s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export LADLE_AUTOTUNE=heuristic
shape="-B 8 -T 4096 -H 16 -K 128 -V 128"
cases=(
  "rec|gla fwd|--op gla --algo chunked $shape"
  "rec|simple_gla fwd|--op simple_gla --algo chunked $shape"
  "rec|delta_rule fwd|--op delta_rule --algo chunked $shape"
  "rec|gated_delta_rule fwd|--op gated_delta_rule --algo chunked $shape"
  "rec|rwkv6 fwd|--op rwkv6 --algo chunked -B 8 -T 4096 -H 16 -K 64 -V 64"
  "rec|gla fwd+bwd|--op gla --algo chunked $shape --backward"
  "rec|gla fwd B2 T16384 (segmented)|--op gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128"
  "rec|simple_gla fwd B2 T16384 (segmented)|--op simple_gla --algo chunked -B 2 -T 16384 -H 16 -K 128 -V 128"
  "att|causal fwd, fwd+bwd|--case causal -B 8 -T 4096 -H 16 -D 128 --backward"
  "att|window+softcap fwd, fwd+bwd|--case window_softcap -B 8 -T 4096 -H 16 -D 128 --backward"
)
for tree in base this; do mkdir -p "/tmp/cache-$tree"; done
for round in 1 2 3; do
  for entry in "${cases[@]}"; do
    IFS='|' read -r kind label args <<< "$entry"
    for tree in base this; do
      dir=$build; [ $tree = base ] && dir=/tmp/build-base
      bin=$dir/tools/ladle-bench/ladle-bench-recurrent; [ $kind = att ] && bin=$dir/tools/ladle-bench/ladle-bench-attention
      LADLE_CACHE_DIR=/tmp/cache-$tree timeout 120 $bin $args --reps 20 2>/dev/null | grep '"impl":"ladle' |
        sed "s/^/$tree|$round|$label|/" | tee -a "$out/same-speed.txt"
    done
  done
done
python3 - "$out/same-speed.txt" <<'PY'
import json, re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tree, rnd, label, text = line.rstrip("\n").split("|", 3)
    d = json.loads(text)
    for k, v in d.items():
        if k.endswith("ms") and k != "first_call_ms" and k != "floor_ms" and isinstance(v, (int, float)):
            rows.setdefault((label, d.get("op", ""), k), {}).setdefault(tree, []).append(v)
print("\nmedians over 3 rounds (ms): benchmark | op | field | base | this | this/base")
for (label, op, k), t in rows.items():
    b, n = statistics.median(t.get("base", [0])), statistics.median(t.get("this", [0]))
    print(f"{label} | {op} | {k} | {b:.4f} | {n:.4f} | {n / b if b else 0:.3f}")
PY
# Registers and spills of each launched kernel, both trees (NVRTC, sm_90a).
for tree in base this; do
  dir=$build; [ $tree = base ] && dir=/tmp/build-base
  for op in "gla --algo chunked -K 128 -V 128" "gla --algo chunked -K 128 -V 128 --backward" "rwkv6 --algo chunked -K 64 -V 64" "delta_rule --algo chunked -K 128 -V 128" "attention --mask causal -D 128" "attention --mask window --mods softcap -D 128" "attention --mask causal -D 128 --backward"; do
    LADLE_CACHE_DIR=/tmp/cache-$tree $dir/tools/ladle-dump/ladle-dump --op $op -B 8 -T 4096 -H 16 --arch sm_90a --only resources 2>&1 | grep -E "^ladle_" | sed "s/^/$tree: /"
  done
done > "$out/resources.txt"
echo "resources: $(sort -u "$out/resources.txt" | wc -l) lines"
echo "all done: $SECONDS s"
