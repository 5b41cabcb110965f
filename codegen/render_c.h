// Renders one IR expression as a C/CUDA float expression, so that a generated kernel
// computes gate math inline, next to the loads it needs (logsigmoid(x) / 16 costs no pass
// over memory). The caller names each input load; everything else is plain C math
// (expf, log1pf, fminf, ...) that both nvcc/NVRTC and a host C compiler accept.
// logsigmoid and softplus use forms that neither overflow nor lose the small tail for
// large |x|: logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

namespace ladle::ir {

// Returns the C expression that reads `input` (variant.inputs[index]) at the current
// token, head and feature index, e.g. "load_f32(g, off + i)" or "x_t[i]".
using LoadFn = std::function<std::string(const Input& input, std::int32_t index)>;

std::string render_c(const Variant& variant, const Expr& expr, const LoadFn& load);

// Returns the C expression of an attention leaf (Op::score, Op::query_index, ...) at the
// current (query, key) pair, e.g. "s" or "(float)(q_row + i)".
using LeafFn = std::function<std::string(Op leaf)>;
// The device function a family calls for tanh (default: tanhf; the attention family names its
// fast form, ladle_tanh).
struct RenderFunctions {
  std::string tanh = "tanhf";
};
// Any expression over `inputs`, attention leaves included; comparisons and logic render as
// 1.0f / 0.0f.
std::string render_c(const std::vector<Input>& inputs, const Expr& expr, const LoadFn& load, const LeafFn& leaf,
                     const RenderFunctions& functions = {});

// A float as a C literal that reads back exactly: 0.0625f, -2.5f, 1e-10f. Finite values only.
std::string render_c_literal(float value);

}  // namespace ladle::ir
