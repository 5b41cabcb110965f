# Sourced by the GPU bench scripts: configures and builds ladle in $LADLE_GPU_BUILD (default
# /tmp/build-gpu; against .deps/root/usr where deps.sh unpacked the header dependencies), for the
# targets given, logging to the file given first. Sets $build and $bench (ladle-bench-recurrent);
# on a failed build prints the log's tail and exits.
#   . bench/build.sh "$log" ladle-bench-recurrent ops-recurrent
ladle_build_log=$1
shift
build=${LADLE_GPU_BUILD:-/tmp/build-gpu}
ladle_prefix=""
[ -d .deps/root/usr ] && ladle_prefix="-DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr -DLADLE_FMT_HEADER_ONLY=ON"  # no libfmt9 installed there
if ! { cmake -S . -B "$build" -G Ninja $ladle_prefix -DCMAKE_BUILD_TYPE=Release >> "$ladle_build_log" 2>&1 &&
       cmake --build "$build" -j"$(nproc)" --target "$@" >> "$ladle_build_log" 2>&1; }; then
  tail -40 "$ladle_build_log"; echo "BUILD FAILED"; exit 1
fi
bench="$build/tools/ladle-bench/ladle-bench-recurrent"
