#!/usr/bin/env bash
# NVRTC time per generated kernel (cold: a fresh compile cache each call), a baseline build's
# ladle-dump against this build's, alternated over three rounds; the median per kernel and tree.
#   bash bench/compile-time.sh BASE_BUILD THIS_BUILD
set -uo pipefail
base=${1:?usage: compile-time.sh BASE_BUILD THIS_BUILD}
this=${2:?usage: compile-time.sh BASE_BUILD THIS_BUILD}
calls=(
  "--op gla --algo chunked -K 128 -V 128 -B 8 -T 4096 -H 16"
  "--op gla --algo chunked -K 128 -V 128 -B 8 -T 4096 -H 16 --tile 128,32,128,8,wgmma"
  "--op gla --algo recurrent -K 128 -V 128 -B 8 -T 4096 -H 16"
  "--op delta_rule --algo chunked -K 128 -V 128 -B 8 -T 4096 -H 16"
  "--op rwkv6 --algo chunked -K 64 -V 64 -B 8 -T 4096 -H 16"
  "--op gla --algo chunked -K 128 -V 128 -B 8 -T 4096 -H 16 --backward"
  "--op attention -D 128 -B 8 -T 4096 -H 16 --mask causal"
  "--op attention -D 128 -B 8 -T 4096 -H 16 --mask window --mods softcap"
  "--op attention -D 128 -B 8 -T 4096 -H 16 --mask causal --backward"
)
out=$(mktemp)
for round in 1 2 3; do
  for call in "${calls[@]}"; do
    for tree in base this; do
      dir=$this; [ $tree = base ] && dir=$base
      LADLE_LOG=debug LADLE_CACHE_DIR=$(mktemp -d) "$dir/tools/ladle-dump/ladle-dump" $call --arch sm_90a --only resources 2>&1 |
        grep -oE "compiled ladle_[a-z_]+[0-9a-f_]*[a-z0-9]*\.cu for sm_90a in [0-9.]+ ms" |
        sed -E "s/compiled (ladle_[a-z_]+)_?[0-9a-f]*\.cu for sm_90a in ([0-9.]+) ms/\1 \2/" | sed "s/^/$tree /" >> "$out"
    done
  done
done
python3 - "$out" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    tree, kernel, ms = line.split()
    t.setdefault(kernel, {}).setdefault(tree, []).append(float(ms))
print("kernel family | base ms | this ms | this/base (median of each kernel's cold compiles)")
for k, v in sorted(t.items()):
    b, n = statistics.median(v.get("base", [0])), statistics.median(v.get("this", [0]))
    print(f"{k} | {b:.0f} | {n:.0f} | {n / b if b else 0:.2f}")
PY
