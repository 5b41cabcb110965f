// Argument checking for every recurrent op: binds q, k, v, the named inputs, the options
// and the outputs to a variant's inputs, checks each against docs/operations.md's shapes and dtypes,
// and builds the canonical arguments of the CPU path. All checks live here so that every
// op, named or user-built, reports a bad input the same way:
//   gla: g has shape [2,64,8,64], expected [B,T,H,K] = [2,64,8,128]
#pragma once

#include <string_view>

#include <ladle/codegen/cpu/recurrent.h>

#include "variant.h"

namespace ladle::ops {

// The recurrence's sizes, once q, k, v and cu_seqlens agree.
struct RecurrentDims {
  bool packed = false;  // q is [T,H,K] (allowed with cu_seqlens)
  DType type = DType::f32;  // of q, k, v and o
  // H: the recurrence's heads (q's, or v's with grouped value heads); H_kv: the heads of k and v (GQA),
  // or of q and k (grouped value heads).
  std::int64_t B = 0, T = 0, H = 0, H_kv = 0, K = 0, V = 0, N = 0;

  std::vector<std::int64_t> output_shape() const;  // [B,T,H,V], or [T,H,V] when packed
  std::vector<std::int64_t> state_shape() const;   // [N,H,K,V]
};

struct BoundInputs {
  RecurrentDims dims;
  cpu::RecurrentArgs args;  // everything but the outputs
};

// Checks the inputs and options; throws InvalidArgument("<op>: ...") at the first problem.
// variant_validated: the caller knows ir::validate(variant) is empty (a call it has bound before:
// ops/detail/call_signature.h), so it is not run again.
BoundInputs bind_inputs(std::string_view op, const ir::Variant& variant, const TensorView& q,
                        const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                        const RunOptions& options, bool variant_validated = false);

// Checks the outputs against the bound inputs and adds them to `bound.args`.
void bind_outputs(std::string_view op, const RunOptions& options, const RecurrentOutputs& outputs,
                  BoundInputs& bound);

// Checks a backward's incoming gradients against the bound forward: d_output in the output's shape
// and d_final_state in the state's, any floating dtype and strides, with data.
void bind_backward(std::string_view op, const BoundInputs& bound, const TensorView& d_output,
                   const std::optional<TensorView>& d_final_state);

}  // namespace ladle::ops
