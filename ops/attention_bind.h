// Argument checking for every softmax-attention op: binds q, k, v, the named inputs, the
// run options and the outputs to a variant, checks each against docs/operations.md's shapes, and
// builds the canonical arguments every backend reads (the CPU path and the GPU launcher):
//   attention: bias has shape [2,8,64,65], expected one that broadcasts to [B,H,Tq,Tk] = [2,8,64,64] ...
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <ladle/codegen/attention_args.h>

#include "attention.h"

namespace ladle::ops {

// The canonical arguments every backend reads (codegen/attention_args.h).
using AttentionArgs = cpu::AttentionArgs;

// Checks inputs and options; throws InvalidArgument("<op>: ...") at the first problem.
AttentionArgs bind_attention(std::string_view op, const ir::AttentionVariant& variant, const TensorView& q,
                             const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                             const AttentionRunOptions& options);

// Checks the outputs against the bound inputs and adds them to `args`.
void bind_attention_outputs(std::string_view op, const AttentionRunOptions& options, const AttentionOutputs& outputs,
                            AttentionArgs& args);

}  // namespace ladle::ops
