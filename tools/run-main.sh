#!/usr/bin/env bash
# The main job on a fresh machine: set up, build what it runs (the library, the examples and
# ladle-dump), then generate and compile kernels through NVRTC (PTX, and cubin with resource
# usage), run them (on the GPU when there is one, else on the CPU), and verify every result.
# Every step runs even when an earlier one failed; the last line is one verdict, and the exit
# status is 0 only when everything verified. It configures the build directory exactly as
# tools/run-tests.sh does (same flags, tests off), so the test command afterwards builds only
# the tests.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${LADLE_BUILD_DIR:-build}
failures=()

# step "what it does" "how long it takes": a line before each step.
step() {
  echo "== $1 [$2]"
}
fail() {
  failures+=("$1")
  echo "!! failed: $1"
}
# verdict "what held": the one line the job ends with, and its exit status.
verdict() {
  if [ ${#failures[@]} -eq 0 ]; then
    echo "main job: $1: ok"
    exit 0
  fi
  local joined
  joined=$(printf '%s; ' "${failures[@]}")
  echo "main job: $1: FAILED (${joined%; })"
  exit 1
}

step "installing missing build dependencies with apt-get" "seconds when present, a few minutes otherwise"
tools/setup-deps.sh || fail "tools/setup-deps.sh"
step "configuring $build (Release, warnings as errors, no tests)" "seconds"
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLADLE_WERROR=ON \
  -DLADLE_BUILD_TESTS=OFF -DLADLE_BUILD_TOOLS=ON -DLADLE_BUILD_EXAMPLES=ON -DLADLE_BUILD_PYTHON=OFF -DLADLE_FMT_HEADER_ONLY=OFF > /dev/null; then
  fail "cmake configure"
  verdict "nothing built"
fi
step "building the library, the examples and ladle-dump ($(nproc) jobs)" \
  "about 3 minutes on 2 cores the first time, seconds when up to date"
start=$SECONDS
cmake --build "$build" -j"$(nproc)" --target ladle-examples ladle-dump -- -k 0 || fail "build"
echo "   built in $((SECONDS - start)) s"

# Each example checks its own result against a plain loop (or the CPU path) and ends with a
# verdict line; its exit status says whether it held.
examples=0
verified=0
step "running the examples: each compiles its kernels through NVRTC, runs them and checks the result" \
  "a few seconds each"
for dir in examples/*/; do
  [ -f "$dir/CMakeLists.txt" ] || continue
  name=example-$(basename "$dir" | tr _ -)
  examples=$((examples + 1))
  job="$build/examples/$(basename "$dir")/$name"
  echo "-- $name"
  if [ ! -x "$job" ]; then
    fail "$name was not built"
  elif "$job"; then
    verified=$((verified + 1))
  else
    fail "$name"
  fi
done

# The generated kernels compiled for each arch, with their resource usage (no GPU needed).
dump="$build/tools/ladle-dump/ladle-dump"
archs=()
dump_step() {
  local what=$1 arch=$2
  shift 2
  echo "-- $what, compiled for $arch"
  if "$dump" "$@" --arch "$arch" --only resources; then
    [[ " ${archs[*]} " == *" $arch "* ]] || archs+=("$arch")
  else
    fail "ladle-dump $* --arch $arch"
  fi
}
step "compiling the kernels ladle generates for Hopper and Ampere with ladle-dump (resources)" \
  "a few seconds"
dump_step "the GLA kernel ladle generates" sm_90a --op gla
dump_step "ladle-dump --op gla --algo chunked (the tensor-core family)" sm_90a --op gla --algo chunked
dump_step "ladle-dump --op gla --algo chunked (the tensor-core family)" sm_80 --op gla --algo chunked
dump_step "ladle-dump --op gla --algo chunked --backward (the backward's generated kernels)" sm_90a \
  --op gla --algo chunked --backward
dump_step "ladle-dump of a hand-written kernel" sm_90a tools/ladle-dump/sample.cu
dump_step "ladle-dump --op attention, causal" sm_90a --op attention --mask causal --dtype bf16 -D 128
dump_step "ladle-dump --op attention, sliding window + soft cap" sm_90a \
  --op attention --mask window --mods softcap --dtype bf16 -D 128
dump_step "ladle-dump --op attention, causal" sm_80 --op attention --mask causal --dtype bf16 -D 128

summary="$verified examples verified"
[ "$verified" -eq "$examples" ] || summary="$verified of $examples examples verified"
if [ ${#archs[@]} -eq 0 ]; then
  summary+=", no kernels compiled"
else
  arch_list=$(printf '%s and ' "${archs[@]}")
  summary+=", kernels compiled for ${arch_list% and }"
fi
verdict "$summary"
