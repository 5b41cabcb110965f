#!/usr/bin/env bash
# Context parallelism on the lent GPU machine (issue 39). Builds the test and the example, then:
#   test      ops-context_parallel with a GPU present (one GPU cut into ranks by a device ThreadGroup)
#   threads   the example's default run (GPU 0 cut into 2 ranks)
#   nccl      the example over NCCL, one process per GPU, every GPU of the machine: outputs and
#             gradients against the whole call (T = $CP_CHECK_TOKENS)
#   time      tokens per second at T in $CP_TOKENS (default 262144 524288 1048576), H16 K=V=128 bf16,
#             forward and forward + backward, on 1 GPU and on every GPU count up to the machine's
#   attention causal softmax attention: the check over NCCL (T 16384), then the times at T in
#             $CP_ATTENTION_TOKENS (default 32768 131072), H16 D=128 bf16 (the 1-GPU row: one rank)
# Parts joined by '+' (default test+threads+nccl+time). Logs in $OUT (or ./cp-out).
#   bash bench/context-parallel.sh test+threads
set -uo pipefail
parts=${1:-test+threads+nccl+time}
out=${OUT:-$PWD/cp-out}
mkdir -p "$out"
log="$out/context-parallel.log"
: > "$log"
has() { [[ "+$parts+" == *"+$1+"* ]]; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
. bench/build.sh "$log" ops-context_parallel example-context-parallel
export LADLE_CACHE_DIR=${LADLE_CACHE_DIR:-$(mktemp -d)} LADLE_AUTOTUNE=heuristic
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$log"
example="$build/examples/context_parallel/example-context-parallel"

if has test; then
  echo "== ops-context_parallel (GPU present)"
  timeout 300 "$build/tests/ops-context_parallel" 2>&1 | tail -25
fi
if has threads; then
  echo "== example, 2 thread ranks on GPU 0"
  timeout 120 "$example" 2>&1 | tail -12
fi
# P processes of the example, one per GPU; extra arguments passed on.
ranks() {
  local P=$1; shift
  local id; id=$(mktemp -u /tmp/ladle-cp-id.XXXX)
  local pids=()
  for ((r = 0; r < P; r++)); do
    CUDA_VISIBLE_DEVICES=$r timeout 300 "$example" --ranks "$P" --rank "$r" --id-file "$id" "$@" > "$out/rank$r.txt" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  rm -f "$id"
  return $rc
}
if has nccl; then
  for ((P = 2; P <= gpus; P *= 2)); do
    echo "== example over NCCL, $P processes, T = ${CP_CHECK_TOKENS:-16384}"
    ranks "$P" --tokens "${CP_CHECK_TOKENS:-16384}" --heads 8 --dim 128
    for ((r = 0; r < P; r++)); do grep -E "relative error|context_parallel:" "$out/rank$r.txt" | sed "s/^/[rank $r] /" | tail -6; done
  done
fi
if has time; then
  for T in ${CP_TOKENS:-262144 524288 1048576}; do
    for ((P = 1; P <= gpus; P *= 2)); do
      echo "== T = $T on $P GPU(s)"
      ranks "$P" --tokens "$T" --heads 16 --dim 128 --time "${CP_REPEATS:-5}"
      grep -E "tokens/s|FAILED|error" "$out/rank0.txt" | head -3
    done
  done
fi
if has attention; then
  for ((P = 2; P <= gpus; P *= 2)); do
    echo "== attention over NCCL, $P processes, T = 16384"
    ranks "$P" --attention --tokens 16384 --heads 8 --dim 128
    for ((r = 0; r < P; r++)); do grep -E "relative error|context_parallel:" "$out/rank$r.txt" | sed "s/^/[rank $r] /" | tail -2; done
  done
  for T in ${CP_ATTENTION_TOKENS:-32768 131072}; do
    for ((P = 1; P <= gpus; P *= 2)); do
      echo "== attention, T = $T on $P GPU(s)"
      ranks "$P" --attention --tokens "$T" --heads 16 --dim 128 --time "${CP_REPEATS:-3}"
      grep -E "tokens/s|FAILED|error" "$out/rank0.txt" | head -3
    done
  done
fi
