// Context parallelism for the recurrent family: one long sequence cut along its tokens across ranks
// (GPUs over NCCL, or threads: runtime/communicator.h). Each rank passes its slice of q, k, v and
// every per-token input, in rank order along the sequence, and gets its slice of o (and, from the
// backward, of every per-token gradient). The method is LASP-2's (fla's KCP):
//   1. each rank summarises the piece of each sequence it passes on: its own final state from zero,
//      L, and its total decay, D (on the GPU the chunked family's segmented state pass: k, v and the
//      gates are read once, no output is formed);
//   2. one all-gather of these fixed-size summaries, whatever the sequence length
//      (B x H x K x V floats per rank, and the decays);
//   3. a generated kernel folds the earlier ranks' summaries, S = 2^D S + L, into the state each of
//      the rank's pieces starts from (codegen/cuda/context_parallel.h);
//   4. the rank runs its slice from those states as run_variant would (every family, tile and form).
// The backward folds the other way: each rank's dL/d(entry state) from its own tokens, all-gathered and
// folded in reverse, is the d final_state its slice starts from; then run_variant_backward_into.
//
//   ladle::NcclCommunicator group(comm);   // the caller's ncclComm_t, rank r of P
//   // q, k, v, g: this rank's tokens [r T/P, (r+1) T/P) of every sequence, [B, T/P, H, D] on its GPU
//   ladle::context_parallel::run_variant_into(variant, q, k, v, {{{"g", g}}}, {}, {o}, group);
//
// Contract, checked on every rank (a refusal on one rank is reported on all, so none waits forever):
//   - every rank passes the same variant, dtype, B, H, H_kv, K, V, scalars, reverse, initial_state's
//     presence, return_state, and at least one token; slices may differ in length;
//   - options.initial_state [N,H,K,V] is the whole call's, the same on every rank (the rank that
//     holds each sequence's first token reads it);
//   - options.cu_seqlens [N+1] is the whole call's packed offsets over all ranks' tokens in rank
//     order (its last offset the sum of the slices), the same on every rank; sequences may cross any
//     number of rank boundaries;
//   - return_state: every rank gets the whole call's final_state [N,H,K,V];
//   - per-head inputs (g_gamma, a user's [H] parameter) are the same on every rank;
//   - the tensors live where the communicator's buffers do (NCCL: its device; a ThreadGroup: the host
//     or its device);
//   - the update forms (delta rule, gated delta rule, KDA) move the state by a K x K matrix, not a
//     diagonal decay: S_after = M S_before + L. Their summaries come from two runs of the slice (from
//     zero, and from the identity with zero v: M itself), folded by a matrix kernel; the backward folds
//     dS by M^T (each slice's backward where it runs: the CPU, or the GPU's fused-recurrent form).
//     Normalised reads are refused by name.
#pragma once

#include <ladle/runtime/communicator.h>

#include "attention.h"
#include "gla.h"
#include "recurrent.h"
#include "update_forms.h"
#include "variant.h"

namespace ladle::context_parallel {

// The forward on this rank's slice (see above). outputs.o: this slice's o; outputs.final_state: the
// whole call's final state (every rank), given when options.return_state is set.
void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                      Communicator& group);
RecurrentResult run_variant(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                            const VariantInputs& inputs, const RunOptions& options, Communicator& group);

// The backward from the forward's own arguments (as ladle::run_variant_backward_into): d_output is this
// slice's dL/do; d_final_state, where given, the whole call's dL/d final_state (the same on every rank).
// Writes this slice's dq, dk, dv and per-token inputs' gradients; per-head inputs' gradients and
// d initial_state are the whole call's, summed over the ranks (every rank holds them).
void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               Communicator& group);

// The named ops' forward, each rank on its slice (their variants and inputs as recurrent(), gla() and
// attention() build them): the same contract as run_variant above, and as run_attention below.
// Their backward: run_variant_backward_into of named_variant("gla") (or "recurrent" with its gates) and
// run_attention_backward_into, with the inputs by their names ("g", "g_gamma", "scale").
RecurrentResult recurrent(const TensorView& q, const TensorView& k, const TensorView& v, const RecurrentOptions& options,
                          Communicator& group);
RecurrentResult gla(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const GlaOptions& options,
                    Communicator& group);
AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options,
                          Communicator& group);
// The update forms by name (update_forms.h's arguments; their K x K transitions, above).
RecurrentResult delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                           const UpdateFormOptions& options, Communicator& group);
RecurrentResult gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                 const TensorView& beta, const UpdateFormOptions& options, Communicator& group);
RecurrentResult rwkv6(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                      const UpdateFormOptions& options, Communicator& group);
RecurrentResult kda(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                    const KdaOptions& options, Communicator& group);

// Causal softmax attention, by all-gather of k and v with the load-balanced split: the sequence of T
// tokens is cut into 2P chunks of T / (2P); rank r holds chunks r and 2P-1-r, concatenated, in q, k, v
// [B, T/P, H, D] (attention_slice gives the tokens). Each rank gathers every rank's k and v (2 x B T
// H_kv D elements), then runs each of its chunks' queries against the keys up to the chunk's end
// (the masks align the last query with the last key, so the rows see what they see in the whole
// call); under the causal mask every rank forms the same number of scores, 2P c^2 with c = T / (2P).
// Any score expression that reads no positions, with causal or window masks, a soft cap, sinks and
// GQA; not dropout, segment ids, pair inputs (bias, mask) or cu_seqlens. o [B, T/P, H, Dv] and lse
// [B, H, T/P] in the same layout.
struct AttentionSlice {
  std::int64_t first_begin, first_end, second_begin, second_end;  // this rank's two chunks' tokens
};
AttentionSlice attention_slice(std::int64_t tokens, int ranks, int rank);

void run_attention_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                        const VariantInputs& inputs, const AttentionRunOptions& options, const AttentionOutputs& outputs,
                        Communicator& group);
AttentionResult run_attention(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                              const VariantInputs& inputs, const AttentionRunOptions& options, Communicator& group);

// The backward from the forward's arguments and its o and lse (return_lse): this rank's dq, dk, dv
// (f32, contiguous, the shapes of q, k, v). The keys' gradients from every rank's queries are summed
// over the ranks (one all-reduce of B T H_kv (D + Dv) floats). Not for variants with tensor inputs
// beyond q, k, v or sinks (their gradients would be summed over the ranks: not built yet).
struct AttentionGradientViews {
  TensorView dq, dk, dv;
};
void run_attention_backward_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                 const VariantInputs& inputs, const AttentionRunOptions& options, const TensorView& o,
                                 const TensorView& lse, const TensorView& d_output, const AttentionGradientViews& gradients,
                                 Communicator& group);

}  // namespace ladle::context_parallel
