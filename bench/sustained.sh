#!/usr/bin/env bash
# Issue 38's sustained timing mode on the lent GPU, in one call: `pip install .` (nanobind and
# scikit-build-core from .whl/py: carry .deps and .whl), then bench/sustained.py (ladle.torch and
# the peers in one process, interleaved, after seconds of continuous load) over the rows.
# JSON lines in $OUT/sustained.jsonl.   bash bench/sustained.sh [rows...]
# rows: causal window sinks backward decode d64 d256 (default: all)
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
. bench/python-install.sh nanobind scikit-build-core
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic}
# SUSTAINED_ARGS: more arguments for every row (e.g. "--heat 3 --rounds 5").
bench() { (cd /tmp && timeout 300 python3 "$repo/bench/sustained.py" "$@" ${SUSTAINED_ARGS:-} 2>> "$out/sustained.err" | tee -a "$out/sustained.jsonl"); }
for row in ${*:-causal window sinks backward decode d64 d256}; do
  case $row in
  causal) bench --cases causal --shapes 8x4096,2x16384 ;;
  window) bench --cases window_softcap --shapes 8x4096 ;;
  sinks) bench --cases sinks_gqa --shapes 8x4096 ;;
  backward) bench --cases causal --shapes 8x4096 --backward ;;
  decode) bench --cases decode --shapes 64x8192 --heads 32 --hkv 8 --tq 1 ;;
  d64) bench --cases causal --shapes 8x4096 --dim 64 ;;
  d256) bench --cases causal --shapes 2x4096 --dim 256; bench --cases causal --shapes 2x4096 --dim 256 --backward ;;
  esac
done
tail -5 "$out/sustained.err"
