# Builds the given test programs on the GPU machine and prints only their failed assertions and
# their totals (Catch2's compact reporter). The tuner's log lines, which can fill a call's output,
# go to $OUT/<test>.stderr. Set LADLE_AUTOTUNE=heuristic to take the tuner's choice of tile out of a
# failure. Needs .deps carried.
#   bash bench/failures.sh ops-recurrent ops-attention
set -u
. bench/build.sh /tmp/failures-build.log "$@"
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle-cache}
for t in "$@"; do
  echo "== $t"
  timeout "${LADLE_TEST_TIMEOUT:-240}" "$build/tests/$t" -r compact 2> "${OUT:-/tmp}/$t.stderr" |
    grep -v -E "^Passed|: passed:" | cut -c1-800 | head -"${LADLE_LINES:-20}"
done
