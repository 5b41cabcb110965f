// The CPU path of the recurrent family: runs any lowered ir::Variant, not only the named
// ops, so an application without a GPU gets correct results and CI checks every variant.
// Threads split the (sequence, head) pairs; each keeps its state [K,V] in fp32; inputs may
// be f32, f16 or bf16 (converted on load), the output is stored in its own type.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ladle/dsl/ir.h>

#include <ladle/tensor/tensor_view.h>

namespace ladle::cpu {

// The state (and normaliser) entering every `interval`-token chunk of every (sequence, head): the
// forward writes them when asked, and the backward starts each chunk from them instead of running
// the forward again. Chunk c of sequence n, head h, at values[((first_chunk[n] + c) * H + h) * (K * V + K)]:
// K * V state values, then K normaliser values.
struct RecurrentCheckpoints {
  std::int64_t interval = 64;
  std::vector<std::int64_t> first_chunk;  // [N + 1]
  std::vector<float> values;
  // Sized for these sequences (cu_seqlens, or batch sequences of `tokens`) and dimensions.
  void allocate(std::int64_t batch, std::int64_t tokens, const std::vector<std::int64_t>& cu_seqlens, std::int64_t heads,
                std::int64_t key_dim, std::int64_t value_dim);
};

// Everything a run needs, already checked (the ops' argument checking builds this).
struct RecurrentArgs {
  // One entry per variant.inputs, by index. Tensors use canonical ranks:
  //   token_key / token_value [B,T,Hx,D], token_head [B,T,Hx], head [B,H] (stride 0 over B
  //   broadcasts an [H] parameter). An input with Hx heads serves query head h at h*Hx/H.
  // Scalar inputs take their value from `scalars` (the tensor entry is unused).
  std::vector<TensorView> tensors;
  std::vector<float> scalars;
  std::int64_t batch = 0, tokens = 0, heads = 0, key_dim = 0, value_dim = 0;
  // Packed sequences: offsets [N+1] into the token axis of batch row 0; empty: each batch
  // row is one sequence (N = B).
  std::vector<std::int64_t> cu_seqlens;
  std::optional<TensorView> initial_state;  // [N,H,K,V], any floating type
  bool reverse = false;
  TensorView output;                       // [B,T,H,V]
  std::optional<TensorView> final_state;   // [N,H,K,V], f32
  int threads = 0;                         // 0: one per hardware thread
  RecurrentCheckpoints* checkpoints = nullptr;  // the forward fills it (allocated) when given
};

void run_recurrent(const ir::Variant& variant, const RecurrentArgs& args);

// What the backward of a recurrence reads besides the forward's arguments, and where it writes.
struct RecurrentGrads {
  TensorView d_output;                      // [B,T,H,V], any floating type: dL/do
  std::optional<TensorView> d_final_state;  // [N,H,K,V]: dL/d final_state (absent: 0)
  // Per variant input, by index: where its gradient is added (f32, the canonical view of
  // RecurrentArgs::tensors, so an [H] parameter broadcast over B sums over B); absent: not wanted
  // (scalars never have one). The caller zeroes them.
  std::vector<std::optional<TensorView>> d_tensors;
  std::optional<TensorView> d_initial_state;  // [N,H,K,V] f32: dL/d initial_state (written)
  const RecurrentCheckpoints* checkpoints = nullptr;  // the forward's (required)
};

// The backward of run_recurrent on the CPU, derived from the variant: the recurrence is walked
// back from the last token with its states recomputed from the forward's checkpoints (every 64
// tokens), the
// gradient of each slot (q, k, v features, the decays, the scale, the normaliser) is formed per
// token, and reaches the inputs through each slot's derivative expressions (ir::derivative).
// Threads take (sequence, group of heads that share k and v) items, whose gradients are disjoint;
// gradients of per-head inputs are summed per thread and added at the end.
void run_recurrent_backward(const ir::Variant& variant, const RecurrentArgs& args, const RecurrentGrads& grads);

// The backward by composition (ops' run_variant_backward on the GPU) works on the slots as tensors:
// every slot of every token, row-major [B,T,H,D] over the query heads (D = K or V; the scale
// [B,T,H]). log_a is the key side's log decay with the head decay added; log_b the value side's.
struct RecurrentSlotTensors {
  std::vector<float> q, k, v, log_a, log_b, scale;
};
// The slots of the call, evaluated from the variant's expressions.
RecurrentSlotTensors materialize_slots(const ir::Variant& variant, const RecurrentArgs& args);
// Given the slots' gradients in that layout (log_a: d L / d log a per key feature), adds the
// inputs' gradients into d_tensors (as RecurrentGrads::d_tensors) through ir::derivative.
void chain_slot_gradients(const ir::Variant& variant, const RecurrentArgs& args, const RecurrentSlotTensors& slot_grads,
                          const std::vector<std::optional<TensorView>>& d_tensors);

}  // namespace ladle::cpu
