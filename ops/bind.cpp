#include "bind.h"

#include <cstring>
#include <string>
#include <vector>

#include <ladle/runtime/error.h>

#include "detail/checks.h"

namespace ladle::ops {

using namespace detail;

std::vector<std::int64_t> RecurrentDims::output_shape() const {
  if (packed) return {T, H, V};
  return {B, T, H, V};
}

std::vector<std::int64_t> RecurrentDims::state_shape() const { return {N, H, K, V}; }

namespace {

std::string names_read(const ir::Variant& variant) {
  std::string out;
  for (const ir::Input& in : variant.inputs) out += (out.empty() ? "" : ", ") + in.name;
  return out;
}

}  // namespace

BoundInputs bind_inputs(std::string_view op, const ir::Variant& variant, const TensorView& q,
                        const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                        const RunOptions& options, bool variant_validated) {
  const Checker check(op);
  if (!variant_validated) check.well_formed(ir::validate(variant));
  if (options.chunked_segment_tokens && *options.chunked_segment_tokens < 0)
    check.fail("chunked_segment_tokens = " + std::to_string(*options.chunked_segment_tokens) + ", expected >= 0 (0: whole sequences)");
  if (options.chunked_segment_tokens && *options.chunked_segment_tokens > 0 && options.chunked_tile && options.chunked_tile->split())
    check.fail("chunked_segment_tokens = " + std::to_string(*options.chunked_segment_tokens) + " with a split chunked_tile (" +
               cuda::to_string(*options.chunked_tile) + "): the split form runs whole sequences (name a serial tile, or 0 segments)");

  // dtypes: q, k, v share one of f32, f16, bf16.
  check.floating("q", q);
  check.type("k", k, q.type, "the dtype of q");
  check.type("v", v, q.type, "the dtype of q");

  // Ranks: [B,T,H,D], or [T,H,D] for packed sequences.
  BoundInputs bound;
  RecurrentDims& d = bound.dims;
  const bool varlen = options.cu_seqlens.has_value();
  if (q.rank() == 3 && !varlen)
    check.fail("q has shape " + shape_text(q.shape) + ", expected [B,T,H,K] (the 3-dimensional [T,H,K] needs cu_seqlens)");
  if (q.rank() != 4 && q.rank() != 3)
    check.fail("q has shape " + shape_text(q.shape) + ", expected [B,T,H,K]" + (varlen ? " or [T,H,K]" : ""));
  d.packed = q.rank() == 3;
  d.type = q.type;
  d.B = d.packed ? 1 : q.shape[0];
  d.T = q.shape[q.rank() - 3];
  d.H = q.shape[q.rank() - 2];
  d.K = q.shape[q.rank() - 1];
  const auto token_pattern = [&](std::int64_t heads, const char* heads_name, std::int64_t features,
                                 const char* features_name) {
    Pattern p;
    if (!d.packed) p.push_back({"B", d.B});
    p.push_back({"T", d.T});
    p.push_back({heads_name, heads});
    if (features_name) p.push_back({features_name, features});
    return p;
  };
  check.shape("q", q, token_pattern(-1, "H", -1, "K"));
  check.shape("k", k, token_pattern(-1, "H_k", d.K, "K"));
  check.shape("v", v, token_pattern(-1, "H_v", -1, "V"));
  d.V = v.shape[v.rank() - 1];
  // Heads: GQA (k and v share H_kv heads, a divisor of q's H) or grouped value heads (fla's GVA: q
  // and k share H heads, v has HV, a multiple of H). The recurrence runs one state per head of the
  // most: o, the state and every per-token input take that many heads.
  const std::int64_t Hq = d.H, Hk = k.shape[k.rank() - 2], Hv = v.shape[v.rank() - 2];
  const auto heads_text = [&] {
    return "q has " + std::to_string(Hq) + " heads, k " + std::to_string(Hk) + " and v " + std::to_string(Hv);
  };
  if (Hv > Hq) {
    if (Hk != Hq)
      check.fail(heads_text() + ": grouped value heads (v with more heads than q) need k with q's heads (" + std::to_string(Hq) + ")");
    if (Hv % Hq != 0)
      check.fail(heads_text() + ": grouped value heads need HV a multiple of H (v's " + std::to_string(Hv) + " heads, q's " +
                 std::to_string(Hq) + ")");
    d.H = Hv, d.H_kv = Hq;
  } else {
    if (Hk != Hv)
      check.fail(heads_text() + ": k and v share their heads (GQA), or v has more heads than q (grouped value heads)");
    if (Hq % Hk != 0)
      check.fail("q has " + std::to_string(Hq) + " heads, which the " + std::to_string(Hk) +
                 " heads of k and v do not divide (GQA needs H % H_kv == 0)");
    d.H_kv = Hk;
  }
  check.data("q", q);
  check.data("k", k);
  check.data("v", v);

  // cu_seqlens [N+1]: batch 1, starts at 0, non-decreasing, ends at T.
  cpu::RecurrentArgs& args = bound.args;
  d.N = d.B;
  if (varlen) {
    if (d.B != 1)
      check.fail("cu_seqlens needs batch 1, but q has batch " + std::to_string(d.B) +
                 " (pack the sequences into [1,total,H,K])");
    args.cu_seqlens = read_offsets(check, "cu_seqlens", *options.cu_seqlens, d.T, "T");
    const std::vector<std::int64_t>& offsets = args.cu_seqlens;
    d.N = static_cast<std::int64_t>(offsets.size()) - 1;
  }

  // The variant's inputs: q, k, v by role, the rest by name.
  args.tensors.resize(variant.inputs.size());
  args.scalars.assign(variant.inputs.size(), 0.0f);
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    const char* name = in.name.c_str();
    if (in.role == ir::Role::query) args.tensors[i] = q;
    if (in.role == ir::Role::key) args.tensors[i] = k;
    if (in.role == ir::Role::value) args.tensors[i] = v;
    if (in.role != ir::Role::other) {
      args.tensors[i] = lead_with_ones(args.tensors[i], 4);
      continue;
    }
    if (in.kind == ir::InputKind::scalar) {
      args.scalars[i] = named_scalar(check, in.name, inputs.scalars, inputs.tensors);
      continue;
    }
    const TensorView& view =
        named_tensor(check, in.name, ir::shape_of(in.kind, in.role), inputs.scalars, inputs.tensors);
    check.floating(name, view);
    switch (in.kind) {
      case ir::InputKind::token_key: check.shape(name, view, token_pattern(d.H, "H", d.K, "K")); break;
      case ir::InputKind::token_value: check.shape(name, view, token_pattern(d.H, "H", d.V, "V")); break;
      case ir::InputKind::token_head: check.shape(name, view, token_pattern(d.H, "H", 0, nullptr)); break;
      case ir::InputKind::head: check.shape_either(name, view, {{"H", d.H}}, {{"B", d.B}, {"H", d.H}}); break;
      case ir::InputKind::head_key:
        check.shape_either(name, view, {{"H", d.H}, {"K", d.K}}, {{"B", d.B}, {"H", d.H}, {"K", d.K}});
        break;
      case ir::InputKind::scalar:
      case ir::InputKind::pair: break;  // validate() keeps pair inputs out of recurrences
    }
    check.data(name, view);
    if (in.kind == ir::InputKind::head_key) {
      args.tensors[i] = head_key_view(view, d.B, d.T);
      continue;
    }
    const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
    args.tensors[i] = lead_with_ones(view, rank);
    if (in.kind == ir::InputKind::head) args.tensors[i].shape[0] = d.B;  // [H] broadcasts over B
  }
  const auto known = [&](const std::string& name) {
    const int index = variant.find_input(name);
    if (index < 0) check.fail(name + " is not an input of the variant (it reads " + names_read(variant) + ")");
    if (variant.inputs[index].role != ir::Role::other)
      check.fail(name + " is given among the named inputs, but the variant takes it as " +
                 ir::role_name(variant.inputs[index].role) + " (the q, k, v arguments)");
  };
  for (const auto& entry : inputs.tensors) known(entry.first);
  for (const auto& entry : inputs.scalars) known(entry.first);

  if (options.initial_state) {
    const TensorView& h0 = *options.initial_state;
    check.floating("initial_state", h0);
    check.shape("initial_state", h0, {{"N", d.N}, {"H", d.H}, {"K", d.K}, {"V", d.V}});
    check.data("initial_state", h0);
    args.initial_state = h0;
  }

  args.batch = d.B;
  args.tokens = d.T;
  args.heads = d.H;
  args.key_dim = d.K;
  args.value_dim = d.V;
  args.reverse = options.reverse;
  args.threads = options.threads;
  return bound;
}

void bind_outputs(std::string_view op, const RunOptions& options, const RecurrentOutputs& outputs,
                  BoundInputs& bound) {
  const Checker check(op);
  const RecurrentDims& d = bound.dims;
  // q's dtype, or f32 for 16-bit inputs (the backward's recurrences keep their outputs in fp32).
  if (d.type == DType::f32) check.type("o", outputs.o, d.type, "the dtype of q");
  else if (outputs.o.type != d.type && outputs.o.type != DType::f32)
    check.fail(std::string("o has dtype ") + dtype_name(outputs.o.type) + ", expected the dtype of q (" +
               dtype_name(d.type) + ") or f32");
  Pattern o_pattern;
  if (!d.packed) o_pattern.push_back({"B", d.B});
  o_pattern.insert(o_pattern.end(), {{"T", d.T}, {"H", d.H}, {"V", d.V}});
  check.shape("o", outputs.o, o_pattern);
  check.data("o", outputs.o);
  bound.args.output = lead_with_ones(outputs.o, 4);
  if (options.return_state && !outputs.final_state)
    check.fail("return_state is set but no final_state output was given");
  if (outputs.final_state) {
    const TensorView& ht = *outputs.final_state;
    check.type("final_state", ht, DType::f32, "the fp32 state");
    check.shape("final_state", ht, {{"N", d.N}, {"H", d.H}, {"K", d.K}, {"V", d.V}});
    check.data("final_state", ht);
    bound.args.final_state = ht;
  }
}

void bind_backward(std::string_view op, const BoundInputs& bound, const TensorView& d_output,
                   const std::optional<TensorView>& d_final_state) {
  const Checker check(op);
  const RecurrentDims& d = bound.dims;
  check.floating("d_output", d_output);
  const std::vector<std::int64_t> out_shape = d.output_shape();
  if (d_output.shape != out_shape)
    check.fail("d_output has shape " + shape_text(d_output.shape) + ", expected the output's shape " +
               std::string(d.packed ? "[T,H,V] = " : "[B,T,H,V] = ") + shape_text(out_shape));
  check.data("d_output", d_output);
  if (d_final_state) {
    check.floating("d_final_state", *d_final_state);
    check.shape("d_final_state", *d_final_state, {{"N", d.N}, {"H", d.H}, {"K", d.K}, {"V", d.V}});
    check.data("d_final_state", *d_final_state);
  }
}

}  // namespace ladle::ops
