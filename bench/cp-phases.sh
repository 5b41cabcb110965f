set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log=$OUT/build.log
. bench/build.sh "$log" example-context-parallel
export LADLE_CACHE_DIR=$(mktemp -d) LADLE_AUTOTUNE=heuristic
ex=$build/examples/context_parallel/example-context-parallel
run2() {
  local id=$(mktemp -u /tmp/cpid.XXXX)
  for r in 0 1; do CUDA_VISIBLE_DEVICES=$r "$@" --ranks 2 --rank $r --id-file $id > $OUT/r$r.txt 2>&1 & done; wait
}
for ws in 0; do
  echo "== LADLE_WS_KEY_STATES=$ws"
  LADLE_WS_KEY_STATES=$ws LADLE_CP_PHASES=1 run2 $ex --tokens 262144 --heads 16 --dim 128 --time 2
  grep -E "tokens/s|FAILED" $OUT/r0.txt
  grep " ms$" $OUT/r0.txt | tail -14
done
