#!/usr/bin/env bash
# The Python entry on the GPU machine (issue 40), in one call: `pip install .` (scikit-build-core and
# nanobind from .whl/py, no registry there), the pytest suite with torch and the GPU (every test
# marked torch or gpu runs), then bench/torch_entry.py beside fla (.whl/*.whl). Logs under $OUT.
# Carry .deps and .whl:  bash bench/python-check.sh [tests|bench|overhead|all, or several joined by +] [torch_entry.py arguments]
set -uo pipefail
what=${1:-all}
shift || true
wants() { [ "$what" = all ] || [[ "+$what+" == *"+$1+"* ]]; }  # e.g. tests+overhead
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
. bench/python-install.sh nanobind scikit-build-core pytest
export LADLE_CACHE_DIR=$(mktemp -d)
if wants tests; then
  (cd /tmp && timeout ${PYTEST_TIMEOUT:-400} python3 -m pytest -q -rs "$repo/python/tests" > "$out/pytest.txt" 2>&1)
  echo "pytest rc=$? $(tail -1 "$out/pytest.txt")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/pytest.txt" | head -20
fi
if wants bench; then
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
  fi
  (cd /tmp && LADLE_AUTOTUNE=${LADLE_AUTOTUNE:-heuristic} PYTHONPATH=/tmp/site timeout ${BENCH_TIMEOUT:-400} python3 "$repo/bench/torch_entry.py" "$@" > "$out/torch_entry.jsonl" 2> "$out/torch_entry.err")
  echo "torch_entry rc=$?"; cat "$out/torch_entry.jsonl"; tail -5 "$out/torch_entry.err"
fi
if wants overhead; then
  (cd /tmp && timeout 200 python3 "$repo/bench/torch_overhead.py" > "$out/overhead.jsonl" 2>&1); cat "$out/overhead.jsonl"
  if command -v nsys > /dev/null; then
    (cd /tmp && timeout 200 nsys profile -q -t cuda,osrt -o /tmp/overhead -f true python3 "$repo/bench/torch_overhead.py" --only native_run --n 500 > /dev/null 2>&1
     nsys stats -q -r cuda_api_sum,osrt_sum /tmp/overhead.nsys-rep > "$out/overhead-nsys.txt" 2>&1)
    head -45 "$out/overhead-nsys.txt"
  else
    echo "no nsys on this machine"
  fi
fi
