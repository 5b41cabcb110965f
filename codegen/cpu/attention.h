// The CPU path of softmax attention: runs any lowered ir::AttentionVariant, so that an
// application without a GPU gets correct results and CI checks every mask and modifier.
// Threads split (sequence, head, block of query rows); scores, softmax and accumulation are
// fp32 (inputs f32, f16 or bf16 are widened on load); o is stored in its own type. Only the
// keys a structured mask (causal, window) leaves are visited, as the GPU kernel does.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ladle/dsl/attention_ir.h>

#include "../attention_args.h"

namespace ladle::cpu {

void run_attention(const ir::AttentionVariant& variant, const AttentionArgs& args);

// Where the backward of an attention call reads dL/do and adds its gradients (f32, the caller
// zeroes them): canonical views like AttentionArgs' q, k, v and tensors (a broadcast axis has
// stride 0, so its gradient sums over it); an absent entry is not wanted.
struct AttentionGrads {
  TensorView d_output;                               // [B,Tq,H,Dv], any floating type
  TensorView dq, dk, dv;                             // [B,Tq,H,D], [B,Tk,H_kv,D], [B,Tk,H_kv,Dv]
  std::vector<std::optional<TensorView>> d_tensors;  // per variant input: pair [B,H,Tq,Tk], head [B,H]
  std::optional<TensorView> d_softmax_aux;           // [H,S]: the sinks' logits
};

// The backward of run_attention on the CPU: per query row the logits and the softmax are
// formed again, dP = do . v_j (times the same dropout keep), dlogit = p (dP - sum p dP), and the
// logits' gradient reaches the raw score q_i . k_j and every input of the score expression through
// ir::derivative of that expression. Threads take (sequence, k/v head) items; gradients that
// several items share (broadcast inputs, sinks) are summed per thread and added at the end.
void run_attention_backward(const ir::AttentionVariant& variant, const AttentionArgs& args, const AttentionGrads& grads);

// The keys [begin, end) that query i of a sequence may see under the variant's causal and
// window masks (offset = Tk - Tq of the sequence); empty when begin >= end.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
};
KeyRange key_range(const ir::AttentionVariant& variant, std::int64_t i, std::int64_t q_length, std::int64_t k_length,
                   std::int64_t window_left, std::int64_t window_right);

// The dropout draw of ops/attention.h: u in [0, 1) for (seed, sequence, head, i, j).
double dropout_uniform(std::uint64_t seed, std::uint64_t sequence, std::uint64_t head, std::uint64_t i,
                       std::uint64_t j);

}  // namespace ladle::cpu
