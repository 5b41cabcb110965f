#!/usr/bin/env bash
# The plain form's block kernel (ladle_bwd_block_bf16, issue 36) on the GPU machine, in one call:
#   test:      ops-backward's tensor-core case against the CPU backward, every gate mode, the errors printed;
#   time:      forward + backward at B8 T4096 H16 K=V=128 bf16, the block kernel (boundary_blocks) and the
#              recurrences it replaces (boundary_states) interleaved, per op (OPS);
#   precision: ladle's gradients against the fp64 oracle at B1 T1000 H4 K=V=128 in both modes (no fla;
#              bench/grad-precision.sh has fla beside it on the same inputs);
#   fla:       GLA's gradients in both modes beside fla 0.6 on the same inputs (fla's wheels carried in .whl;
#              its first backward autotunes for minutes);
#   ncu:       Nsight Compute's SASS phases of the block kernel (one launch) and the backward's kernels' times.
# Needs .deps carried.
#   bash bench/block-backward.sh [test+time+precision+fla+ncu]
set -u
what=${1:-test+time+precision+ncu}
wants() { [[ "+$what+" == *"+$1+"* ]]; }
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle-cache}
. bench/build.sh /tmp/block-backward-build.log ladle-bench-recurrent ladle-bench-precision ops-backward ops-gpu
if wants test; then
  "$build/tests/ops-gpu" "NVRTC compiles ladle_bwd_block_bf16*" 2>&1 | grep -E "registers|passed|failed"
  LADLE_TEST_PRINT_ERRORS=1 timeout 300 "$build/tests/ops-backward" "the GPU backward on the tensor cores agrees with the CPU backward" \
    > /tmp/block-test.log 2>&1
  grep -E " mode 1: d" /tmp/block-test.log | sed "s/^ *//" | head -${ERRORS_SHOWN:-40}  # the block kernel's errors against the CPU backward
  grep -E "FAILED|CHECK\(|relative error" /tmp/block-test.log | head -20
  tail -3 /tmp/block-test.log
fi
if wants fla; then  # GLA's gradients in both modes beside fla 0.6 on the same inputs (carry fla's wheels in .whl)
  dirs=()
  for mode in boundary_states boundary_blocks; do
    dir=/tmp/precision/gla-fla-$mode
    timeout 120 "$build/tools/ladle-bench/ladle-bench-precision" --op gla -B 1 -T 1000 -H 4 -K 128 -V 128 --gate-gradients "$mode" \
      --out "$dir" > /dev/null && dirs+=("$dir")
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/fla-install.log 2>&1
  PYTHONPATH=/tmp/site timeout ${FLA_TIMEOUT:-450} python3 bench/grad_precision.py --fla-ops gla "${dirs[@]}" 2>&1 | grep -E "^\||fla "
fi
if wants time; then
  for op in ${OPS:-gla simple_gla user}; do
    for mode in boundary_states boundary_blocks boundary_states boundary_blocks; do
      timeout 120 "$bench" --backward --algo chunked --op "$op" -B ${B:-8} -T ${T:-4096} -H ${H:-16} -K 128 -V 128 --reps ${REPS:-10} \
        --gate-gradients "$mode" 2>&1 | grep -o '"op".*' | grep -oE '"(op|gate_gradients|forward_ms|backward_ms|total_ms)":[^,]*' | paste -sd' ' 
    done
  done
fi
if wants precision; then
  dirs=()
  for op in gla simple_gla g_gamma user; do
    for mode in boundary_states boundary_blocks; do
      dir=/tmp/precision/$op-$mode
      timeout 120 "$build/tools/ladle-bench/ladle-bench-precision" --op "$op" -B 1 -T 1000 -H 4 -K 128 -V 128 --gate-gradients "$mode" \
        --out "$dir" > /dev/null && dirs+=("$dir")
    done
  done
  timeout 200 python3 bench/grad_precision.py --fla-ops "" "${dirs[@]}" | grep "^|"
fi
if wants ncu; then
  out=${OUT:-$PWD/gpu-out}; mkdir -p "$out"
  args=(--backward --algo chunked --op gla -B 8 -T 4096 -H 16 -K 128 -V 128 --reps 1 --gate-gradients boundary_blocks)
  timeout 240 ncu --section SourceCounters --section SpeedOfLight --section Occupancy --section WarpStateStats -k regex:ladle_bwd_block \
    --launch-count 1 -o "$out/sass-block" "$bench" "${args[@]}" > "$out/ncu-block.txt" 2>&1
  ncu --import "$out/sass-block.ncu-rep" --page source --csv --print-source sass > "$out/sass-block.csv" 2>&1
  python3 bench/sass_phases.py "$out/sass-block.csv" > "$out/phases-block.txt" 2>&1
  gzip -f "$out/sass-block.csv"; rm -f "$out/sass-block.ncu-rep"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|DRAM Throughput|Compute \(SM\)" "$out/ncu-block.txt"
  head -${LINES_SHOWN:-60} "$out/phases-block.txt"
  ncu --metrics gpu__time_duration.sum -k regex:ladle_ "$bench" "${args[@]}" 2>&1 | grep -E "^  ladle_|gpu__time" | paste - - |
    awk '{print $1, $(NF)}' | sort | uniq -c | tail -20
fi
