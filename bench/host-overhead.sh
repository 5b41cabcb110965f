#!/usr/bin/env bash
# ladle's host-side cost a call, measured without a GPU (issue 40: a cached call from Python under
# 30 us). Builds the stand-in driver (bench/host-overhead/fake_cuda.c) and a program that calls
# gla_into and attention_into on "device" tensors through it, against the build directory's library.
#   bench/host-overhead.sh [build-dir] [calls] [case]     then, for a profile:
#   LADLE_CUDA_DRIVER_LIBRARY=/tmp/ladle-host/libcuda.so.1 perf record -g /tmp/ladle-host/host-overhead 2000 chunked
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=/tmp/ladle-host
mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
cc -O2 -shared -fPIC -I"$cuda/include" bench/host-overhead/fake_cuda.c -o "$out/libcuda.so.1"
# The library links Debian's libfmt unless the build took fmt header-only (LADLE_FMT_HEADER_ONLY).
fmt_lib=-lfmt
grep -q "^LADLE_FMT_HEADER_ONLY:BOOL=ON" "$build/CMakeCache.txt" 2> /dev/null && fmt_lib=""
c++ -O2 -g -std=c++20 -DFMT_HEADER_ONLY=1 -I"$build/include" -I"$cuda/include" bench/host-overhead/host_overhead.cpp \
  "$build/libladle.a" $fmt_lib -ldl -lpthread -o "$out/host-overhead"
export LADLE_CUDA_DRIVER_LIBRARY="$out/libcuda.so.1" LADLE_AUTOTUNE=heuristic
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-$out/cache}
"$out/host-overhead" "${2:-2000}" "${3:-}"
