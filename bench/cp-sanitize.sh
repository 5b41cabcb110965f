# compute-sanitizer (memcheck) over the context-parallel GPU tests (ops-context_parallel "[gpu]"):
# the fold, sum and add kernels, the thread group's device copies, the one-pass forward's hook.
set -uo pipefail
out=${OUT:-$PWD/cp-out}
mkdir -p "$out"
. bench/build.sh "$out/build.log" ops-context_parallel
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-$(mktemp -d)} LADLE_AUTOTUNE=heuristic
timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/ops-context_parallel" "${1:-[gpu]}" 2>&1 | tail -15
echo "exit: ${PIPESTATUS[0]}"
