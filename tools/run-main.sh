#!/usr/bin/env bash
# The main job on a fresh machine: set up, build, then generate and compile kernels through
# NVRTC (PTX, and cubin with resource usage), run them (on the GPU when there is one, else
# on the CPU), and verify every result. Exit status 0 only when everything verified.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh
build=${LADLE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j"$(nproc)"
for job in "$build"/examples/*/example-*; do
  [ -x "$job" ] || continue
  echo "== $(basename "$job")"
  "$job"
done
echo "== the GLA kernel ladle generates, compiled for Hopper (resources)"
"$build"/tools/ladle-dump/ladle-dump --op gla --arch sm_90a --only resources
echo "== ladle-dump --op gla --algo chunked (the tensor-core family; resources for sm_90a and sm_80)"
"$build"/tools/ladle-dump/ladle-dump --op gla --algo chunked --arch sm_90a --only resources
"$build"/tools/ladle-dump/ladle-dump --op gla --algo chunked --arch sm_80 --only resources
echo "== ladle-dump --op gla --algo chunked --backward (the backward's generated kernels, resources for sm_90a)"
"$build"/tools/ladle-dump/ladle-dump --op gla --algo chunked --backward --arch sm_90a --only resources
echo "== ladle-dump of a hand-written kernel (resources for sm_90a)"
"$build"/tools/ladle-dump/ladle-dump tools/ladle-dump/sample.cu --arch sm_90a --only resources
echo "== ladle-dump --op attention (causal, and sliding window + soft cap; resources for sm_90a and sm_80)"
"$build"/tools/ladle-dump/ladle-dump --op attention --mask causal --dtype bf16 -D 128 --arch sm_90a --only resources
"$build"/tools/ladle-dump/ladle-dump --op attention --mask window --mods softcap --dtype bf16 -D 128 --arch sm_90a --only resources
"$build"/tools/ladle-dump/ladle-dump --op attention --mask causal --dtype bf16 -D 128 --arch sm_80 --only resources
