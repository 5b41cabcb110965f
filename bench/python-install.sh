# Sourced by the GPU scripts that run the Python package (python-check.sh, sustained.sh): installs
# the build tools named as arguments from .whl/py (no registry on the GPU machine), then the package
# with `pip install .` against .deps; logs under $out, exits on a failure. Sets $repo.
#   . bench/python-install.sh nanobind scikit-build-core [pytest]
repo=$PWD
python3 -m pip install -q --no-index --find-links .whl/py "$@" > "$out/pip-tools.log" 2>&1 ||
  { tail -5 "$out/pip-tools.log"; echo "PIP (tools) FAILED"; exit 1; }
ladle_pip_start=$(date +%s)
if ! python3 -m pip install --no-index --no-build-isolation -q \
     -C cmake.define.CMAKE_PREFIX_PATH="$repo/.deps/root/usr" -C build-dir=/tmp/ladle-wheel . > "$out/pip-install.log" 2>&1; then
  tail -30 "$out/pip-install.log"; echo "PIP INSTALL FAILED"; exit 1
fi
echo "pip install .: $(( $(date +%s) - ladle_pip_start )) s"
