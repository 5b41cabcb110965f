#!/usr/bin/env bash
# Sets up a fresh machine and runs every test that needs no GPU: the Catch2 suite, the Python
# package (pip install . and pytest on the CPU path), then an install and an application built
# against the installed package (find_package(ladle)).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's line carries the time since the start (minutes:seconds), so a run shows where its time went.
stage() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
stage "build dependencies (apt-get where missing)"
tools/setup-deps.sh
build=${LADLE_BUILD_DIR:-build}
# The same flags as tools/run-main.sh (whose build this reuses), with the tests turned back on; the
# options named, since `pip install .` below configures this directory with its own (pyproject.toml).
configure() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLADLE_WERROR=ON -DLADLE_BUILD_TESTS=ON \
    -DLADLE_BUILD_TOOLS=ON -DLADLE_BUILD_EXAMPLES=ON -DLADLE_BUILD_PYTHON=OFF -DLADLE_FMT_HEADER_ONLY=OFF "$@"
}
# The Python stage's virtual environment is set up in the background while the C++ build and ctest run
# (torch from PyPI is about 5.4 GB with its CUDA libraries), at low priority and without byte-compiling
# what it installs (Python compiles what it imports); the Python stage waits for it. Measured on 2 cores
# (stop 60): at normal priority it finished in 3 minutes and lengthened the build by 2.4 (9:51 against
# 7:28); at nice 15, byte-compiling, it ended a minute after ctest. torch is installed when the disk has room, so that its tests run here on
# the CPU path; without it they are reported as skipped, each with its reason (-rs). The tests that
# need a GPU run on the GPU machine (bench/python-check.sh). LADLE_TEST_TORCH=0 skips it.
venv="$PWD/$build/python-venv"
mkdir -p "$build"
python_setup() {
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" 2> /dev/null || {
      sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv > /dev/null
      python3 -m venv "$venv"
    }
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-compile nanobind scikit-build-core pytest numpy
  free_kb=$(df --output=avail -k "$build" | tail -1)
  if [ "${LADLE_TEST_TORCH:-1}" = 1 ] && [ "$free_kb" -gt 12000000 ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check --no-compile torch ||
      echo "torch could not be installed from PyPI: the torch tests are reported as skipped below"
  else
    echo "torch not installed (LADLE_TEST_TORCH=${LADLE_TEST_TORCH:-1}, $((free_kb / 1000000)) GB free): the torch tests are reported as skipped below"
  fi
}
python_log="$build/python-setup.log"
nice -n 15 bash -c "set -euo pipefail; $(declare -f python_setup); venv='$venv' build='$build' python_setup" > "$python_log" 2>&1 &
python_setup_pid=$!
trap 'kill "$python_setup_pid" 2> /dev/null || true' EXIT  # a stage that fails ends it too

stage "configure and build: the library, tools, examples and test programs (7.5-10 minutes on 2 cores)"
configure
cmake --build "$build" -j"$(nproc)"
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-$PWD/$build/test-cache}
# The default set; the full emulation sweep (label `full`) runs with `ctest --test-dir build -L full`.
# --timeout: no test may run past 240 s (the suite's programs take at most about 140 s here).
stage "ctest: the default set (about 6 minutes on 2 cores)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -LE full --timeout 240

stage "the Python package: pip install . into a venv (scikit-build-core, nanobind), then its tests"
if ! wait "$python_setup_pid"; then
  cat "$python_log"
  echo "setting up the Python virtual environment failed (above)"
  exit 1
fi
cat "$python_log"
# Built in this build directory: the library's objects compile with the same lines in both
# configurations (CMakeLists.txt), so only the extension compiles here (a separate build directory
# compiled the library again: about 5 minutes on 2 cores). fmt as libfmt here, as in the C++ build (the
# wheel's default is header-only, pyproject.toml): the same lines again.
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation -C build-dir="$(cd "$build" && pwd)" \
  -C cmake.define.LADLE_WERROR=ON -C cmake.define.LADLE_FMT_HEADER_ONLY=OFF .
configure > /dev/null  # back to this command's configuration (pip's has no tests, tools or examples)
(cd "$build" && "$venv/bin/python" -m pytest -q -rs "$OLDPWD/python/tests")

stage "install, then build an application against the installed package"
rm -rf "$build/install" "$build/embed"
cmake --install "$build" --prefix "$build/install" > /dev/null
cmake -S examples/embed_runtime -B "$build/embed" -G Ninja -DCMAKE_PREFIX_PATH="$(cd "$build" && pwd)/install" > /dev/null
cmake --build "$build/embed"
"$build/embed/example-embed-runtime"
stage "all tests passed"
