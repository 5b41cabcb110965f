#!/usr/bin/env bash
# Decode attention (issue 38) on the GPU, in one call: the op tests' decode cases and the emulation
# test's decode kernels with the GPU present, then ladle beside its peers, interleaved: ladle's
# decode form and (for the "before") its mma.sync forward tile, PyTorch SDPA (flash, cuDNN,
# efficient), FlexAttention and flash_attn_with_kvcache (bench/decode_bench.py), ladle again; the
# byte floor as torch.sum over K and V. Needs .deps carried.
#   bash bench/decode.sh [test] [sanitize] [time] [ncu]      (default: test time)
#   SHAPES="64x1x8192 64x4x8192" HEADS=32 KV_HEADS=8 DIM=128 TILES="default 16,32,1,4,decode ..." (ladle's tiles)
set -u
what=${*:-test time}
. bench/build.sh /tmp/decode-build.log ladle-bench-attention ops-attention codegen-cuda_attention
attn="$build/tools/ladle-bench/ladle-bench-attention"
shapes=${SHAPES:-64x1x8192}
H=${HEADS:-32} HKV=${KV_HEADS:-8} D=${DIM:-128}
if [[ " $what " == *" test "* ]]; then
  echo "== tests"
  LADLE_AUTOTUNE=heuristic timeout 200 "$build/tests/ops-attention" "[decode]" 2>&1 | tail -3
  timeout 200 "$build/tests/codegen-cuda_attention" "attention: every kernel*,*decode kernels*" 2>&1 | tail -3
fi
if [[ " $what " == *" sanitize "* ]] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck over the decode cases"
  {
    LADLE_AUTOTUNE=heuristic timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/ops-attention" "[decode]" 2>&1 | tail -3
  }
fi
tiles=""
for t in ${TILES:-default 64,64,4,2}; do tiles="$tiles --tile $t"; done
ladle() {  # B Tq Tk
  LADLE_AUTOTUNE=heuristic timeout 120 "$attn" --case decode -B "$1" --tq "$2" -T "$3" -H "$H" --hkv "$HKV" -D "$D" --reps 50 $tiles
}
if [[ " $what " == *" time "* ]]; then
  echo "== timings (boost clocks, medians of 50, interleaved)"
  for shape in $shapes; do
    IFS=x read -r B Tq Tk <<< "$shape"
    ladle "$B" "$Tq" "$Tk"
    timeout 300 python3 bench/decode_bench.py --shapes "$shape" --heads "$H" --kv-heads "$HKV" --dim "$D"
    ladle "$B" "$Tq" "$Tk"
  done
fi
if [[ " $what " == *" ncu "* ]] && command -v ncu > /dev/null; then
  IFS=x read -r B Tq Tk <<< "${shapes%% *}"
  LADLE_AUTOTUNE=heuristic timeout 200 ncu --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    -k regex:ladle_attention --launch-count 4 "$attn" --case decode -B "$B" --tq "$Tq" -T "$Tk" -H "$H" --hkv "$HKV" -D "$D" --reps 1 2>&1 |
    grep -E "ladle_attention|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers|Block Limit|Theoretical Occ|Compute \(SM\)" | head -60
fi
