# The context-parallel GLA forward and backward, each phase's time (LADLE_CP_PHASES=1), on $CP_P GPUs
# (default 2) at T = $CP_TOKENS (default 262144), H16 K=V=128 bf16: bench/RESULTS.md, "Issue 39".
#   CP_P=4 OUT=... bash bench/cp-phases.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
out=${OUT:-$PWD/cp-out}
mkdir -p "$out"
. bench/build.sh "$out/build.log" example-context-parallel
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-$(mktemp -d)} LADLE_AUTOTUNE=heuristic
ex=$build/examples/context_parallel/example-context-parallel
P=${CP_P:-2}
id=$(mktemp -u /tmp/cpid.XXXX)
for ((r = 0; r < P; r++)); do
  CUDA_VISIBLE_DEVICES=$r LADLE_CP_PHASES=1 "$ex" --ranks "$P" --rank "$r" --id-file "$id" --tokens "${CP_TOKENS:-262144}" \
    --heads 16 --dim 128 --time 2 > "$out/r$r.txt" 2>&1 &
done
wait
grep -E "tokens/s|FAILED" "$out/r0.txt"
for ((r = 0; r < P; r++)); do echo "-- rank $r"; grep " ms$" "$out/r$r.txt" | grep forward | tail -5; done
