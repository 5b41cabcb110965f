#!/usr/bin/env bash
# The update forms' GPU backward (issue 36) on the GPU machine, in one call: the GPU test against the
# CPU backward (each form where it runs: the recurrence with each value-column width a block,
# LADLE_UPDATE_BWD_BLOCK_V 8 and 16, and the delta rule's chunked WY form), forward + backward
# times at B8 T4096 H16 K=V=128 bf16 per op and form (FORMS: chunked, recurrent; the recurrence at
# its default width, or each of WIDTHS), then Nsight Compute on the chunked form's kernels (NCU_OP).
# Needs .deps carried.
#   bash bench/update-backward.sh [test+time+ncu]
set -u
what=${1:-test+time+ncu}
wants() { [[ "+$what+" == *"+$1+"* ]]; }
export LADLE_AUTOTUNE=heuristic LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-/tmp/ladle-cache}
. bench/build.sh /tmp/update-backward-build.log ladle-bench-recurrent ops-backward
if wants test; then
  for width in ${TEST_WIDTHS:-default 8 16}; do
    [ "$width" = default ] && width=""
    LADLE_UPDATE_BWD_BLOCK_V=$width timeout 200 "$build/tests/ops-backward" "the update forms' GPU backward agrees with the CPU backward" 2>&1 |
      tail -2 | sed "s/^/block_v ${width:-default}: /"
  done
fi
if wants time; then
  for op in ${OPS:-gated_delta_rule delta_rule kda rwkv6}; do
    for form in ${FORMS:-chunked recurrent}; do
      for width in ${WIDTHS:-default}; do
        [ "$width" = default ] && width=""
        LADLE_UPDATE_BWD_FORM=$form LADLE_UPDATE_BWD_BLOCK_V=$width timeout 120 "$bench" --backward --algo chunked --op "$op" \
          -B ${B:-8} -T ${T:-4096} -H ${H:-16} -K 128 -V 128 --reps ${REPS:-5} 2>&1 | grep fwd_bwd | sed "s/^/$form ${width:-}: /"
      done
    done
  done
fi
if wants ncu && command -v ncu > /dev/null; then
  LADLE_UPDATE_BWD_FORM=chunked timeout 300 ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
    -k regex:ladle_bwd_ --launch-count ${NCU_COUNT:-4} "$bench" --backward --algo chunked --op ${NCU_OP:-gated_delta_rule} -B 8 -T 4096 -H 16 \
    -K 128 -V 128 --reps 1 2>&1 | grep -vE "^==PROF==|^\{" |
    grep -E "Duration|Throughput|Occupancy|Registers|Block Limit|Warp Cycles|Issue|Eligible|Active Warps|ladle_bwd|stall" | head -${NCU_LINES:-80}
fi
