#include "attention_bind.h"

#include <string>

#include <fmt/format.h>

#include "detail/checks.h"

namespace ladle::ops {

using namespace detail;

namespace {

// A tensor broadcastable to [B,H,Tq,Tk] (numpy rules: missing leading axes, or size 1).
TensorView pair_view(const Checker& check, const std::string& name, const TensorView& view, const AttentionArgs& a) {
  const std::vector<std::int64_t> full = {a.B, a.H, a.Tq, a.Tk};
  const char* axes[4] = {"B", "H", "Tq", "Tk"};
  bool ok = view.rank() >= 1 && view.rank() <= 4 && view.strides.size() == view.shape.size();
  TensorView out = ok ? lead_with_ones(view, 4) : view;
  for (int d = 0; ok && d < 4; ++d) {
    if (out.shape[d] == full[d]) continue;
    if (out.shape[d] == 1) {
      out.shape[d] = full[d];
      out.strides[d] = 0;
      continue;
    }
    ok = false;
  }
  if (!ok) {
    check.fail(fmt::format("{} has shape {}, expected one that broadcasts to [{},{},{},{}] = {} (each axis its size "
                           "or 1, leading axes may be left out)",
                           name, shape_text(view.shape), axes[0], axes[1], axes[2], axes[3], shape_text(full)));
  }
  check.data(name.c_str(), view);
  return out;
}

TensorView segment_view(const Checker& check, const char* name, const TensorView& view, std::int64_t B,
                        std::int64_t T, const char* T_name, bool packed) {
  if (view.type != DType::i32 && view.type != DType::i64)
    check.fail(fmt::format("{} has dtype {}, expected i32 or i64", name, dtype_name(view.type)));
  const bool as_2d = view.rank() == 2 && view.shape[0] == B && view.shape[1] == T;
  const bool as_1d = packed && view.rank() == 1 && view.shape[0] == T;
  if (!(as_2d || as_1d) || view.strides.size() != view.shape.size())
    check.fail(fmt::format("{} has shape {}, expected [B,{}] = [{},{}]{}", name, shape_text(view.shape), T_name, B, T,
                           packed ? fmt::format(" or [{}]", T) : ""));
  check.data(name, view);
  return lead_with_ones(view, 2);
}

}  // namespace

AttentionArgs bind_attention(std::string_view op, const ir::AttentionVariant& variant, const TensorView& q,
                             const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                             const AttentionRunOptions& options) {
  const Checker check(op);
  check.well_formed(ir::validate(variant));
  check.floating("q", q);
  check.type("k", k, q.type, "the dtype of q");
  check.type("v", v, q.type, "the dtype of q");

  AttentionArgs a;
  const bool varlen = options.cu_seqlens_q.has_value() || options.cu_seqlens_k.has_value();
  if (options.cu_seqlens_q.has_value() != options.cu_seqlens_k.has_value())
    check.fail(std::string("cu_seqlens_") + (options.cu_seqlens_q ? "q" : "k") + " is given without cu_seqlens_" +
               (options.cu_seqlens_q ? "k" : "q") + "; packed sequences need both");
  if (q.rank() == 3 && !varlen)
    check.fail("q has shape " + shape_text(q.shape) + ", expected [B,Tq,H,D] (the 3-dimensional [T,H,D] needs cu_seqlens_q)");
  if (q.rank() != 4 && q.rank() != 3)
    check.fail("q has shape " + shape_text(q.shape) + ", expected [B,Tq,H,D]" + (varlen ? " or [Tq,H,D]" : ""));
  a.packed = q.rank() == 3;
  a.type = q.type;
  a.B = a.packed ? 1 : q.shape[0];
  a.Tq = q.shape[q.rank() - 3];
  a.H = q.shape[q.rank() - 2];
  a.D = q.shape[q.rank() - 1];
  const auto tokens = [&](std::int64_t T, const char* T_name, std::int64_t heads, const char* heads_name,
                          std::int64_t features, const char* features_name) {
    Pattern p;
    if (!a.packed) p.push_back({"B", a.B});
    p.insert(p.end(), {{T_name, T}, {heads_name, heads}, {features_name, features}});
    return p;
  };
  check.shape("q", q, tokens(a.Tq, "Tq", a.H, "H", a.D, "D"));
  check.shape("k", k, tokens(-1, "Tk", -1, "H_kv", -1, "D"));
  a.Tk = k.shape[k.rank() - 3];
  a.H_kv = k.shape[k.rank() - 2];
  if (k.shape[k.rank() - 1] != a.D)
    check.fail(fmt::format("k has head dim {}, but q has {} (q and k must share D)", k.shape[k.rank() - 1], a.D));
  check.shape("v", v, tokens(a.Tk, "Tk", a.H_kv, "H_kv", -1, "Dv"));
  a.Dv = v.shape[v.rank() - 1];
  if (a.H % a.H_kv != 0)
    check.fail(fmt::format("q has {} heads, which the {} heads of k and v do not divide (GQA needs H % H_kv == 0)",
                           a.H, a.H_kv));
  check.data("q", q);
  check.data("k", k);
  check.data("v", v);
  a.q = lead_with_ones(q, 4);
  a.k = lead_with_ones(k, 4);
  a.v = lead_with_ones(v, 4);

  a.N = a.B;
  if (varlen) {
    if (a.B != 1)
      check.fail(fmt::format("cu_seqlens_q needs batch 1, but q has batch {} (pack the sequences into [1,total,H,D])", a.B));
    a.cu_seqlens_q = read_offsets(check, "cu_seqlens_q", *options.cu_seqlens_q, a.Tq, "Tq");
    a.cu_seqlens_k = read_offsets(check, "cu_seqlens_k", *options.cu_seqlens_k, a.Tk, "Tk");
    if (a.cu_seqlens_q.size() != a.cu_seqlens_k.size())
      check.fail(fmt::format("cu_seqlens_q has {} sequences but cu_seqlens_k has {}; they must agree",
                             a.cu_seqlens_q.size() - 1, a.cu_seqlens_k.size() - 1));
    a.N = static_cast<std::int64_t>(a.cu_seqlens_q.size()) - 1;
  }

  // The variant's own inputs: q, k, v by role, the rest by name.
  a.tensors.resize(variant.inputs.size());
  a.scalars.assign(variant.inputs.size(), 0.0f);
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Input& in = variant.inputs[i];
    if (in.role != ir::Role::other) {
      a.tensors[i] = in.role == ir::Role::query ? a.q : in.role == ir::Role::key ? a.k : a.v;
      continue;
    }
    if (in.kind == ir::InputKind::scalar) {
      a.scalars[i] = named_scalar(check, in.name, inputs.scalars, inputs.tensors);
      continue;
    }
    const TensorView& view =
        named_tensor(check, in.name, ir::shape_of(in.kind, in.role), inputs.scalars, inputs.tensors);
    if (view.type != DType::u8) check.floating(in.name.c_str(), view);
    if (in.kind == ir::InputKind::pair) {
      a.tensors[i] = pair_view(check, in.name, view, a);
    } else {  // per head
      check.shape_either(in.name.c_str(), view, {{"H", a.H}}, {{"B", a.B}, {"H", a.H}});
      check.data(in.name.c_str(), view);
      a.tensors[i] = lead_with_ones(view, 2);
      a.tensors[i].shape[0] = a.B;  // [H] broadcasts over B
    }
  }
  const auto known = [&](const std::string& name) {
    const int index = variant.find_input(name);
    if (index < 0 || variant.inputs[index].role != ir::Role::other) {
      std::string reads;
      for (const ir::Input& in : variant.inputs)
        if (in.role == ir::Role::other) reads += (reads.empty() ? "" : ", ") + in.name;
      check.fail(name + " is not an input of the variant (it reads " + (reads.empty() ? "none besides q, k, v" : reads) + ")");
    }
  };
  for (const auto& entry : inputs.tensors) known(entry.first);
  for (const auto& entry : inputs.scalars) known(entry.first);

  // The structured parts: each given exactly when the variant has it.
  const auto given_iff = [&](bool has, bool given, const char* what, const char* feature) {
    if (has && !given) check.fail(fmt::format("the variant has {} but {} was not given", feature, what));
    if (!has && given) check.fail(fmt::format("{} was given but the variant has no {}", what, feature));
  };
  given_iff(variant.segment_ids, options.q_segment_ids.has_value(), "q_segment_ids", "segment ids");
  given_iff(variant.segment_ids, options.kv_segment_ids.has_value(), "kv_segment_ids", "segment ids");
  if (variant.segment_ids) {
    a.q_segment_ids = segment_view(check, "q_segment_ids", *options.q_segment_ids, a.B, a.Tq, "Tq", a.packed);
    a.kv_segment_ids = segment_view(check, "kv_segment_ids", *options.kv_segment_ids, a.B, a.Tk, "Tk", a.packed);
  }
  given_iff(variant.sinks, options.softmax_aux.has_value(), "softmax_aux", "sinks");
  if (variant.sinks) {
    const TensorView& aux = *options.softmax_aux;
    check.floating("softmax_aux", aux);
    if (aux.strides.size() != aux.shape.size() || !((aux.rank() == 2 && aux.shape[0] == a.H) || aux.rank() == 1) ||
        aux.shape.back() < 1)
      check.fail(fmt::format("softmax_aux has shape {}, expected [H,S] = [{},S] or [S] with S >= 1",
                             shape_text(aux.shape), a.H));
    check.data("softmax_aux", aux);
    a.softmax_aux = lead_with_ones(aux, 2);
    a.softmax_aux->shape[0] = a.H;  // [S] serves every head
    a.sinks = aux.shape.back();
  }
  if (variant.window) {
    if (options.window_left < -1)
      check.fail(fmt::format("sliding_window left = {}, expected >= 0 or -1 (unbounded)", options.window_left));
    if (options.window_right < -1)
      check.fail(fmt::format("sliding_window right = {}, expected >= 0 or -1 (unbounded)", options.window_right));
    a.window_left = options.window_left;
    a.window_right = options.window_right;
  } else if (options.window_left != -1 || options.window_right != -1) {
    check.fail("a sliding window was given but the variant has no window (use .sliding_window())");
  }
  if (!(options.dropout_p >= 0.0f && options.dropout_p < 1.0f))
    check.fail(fmt::format("dropout_p = {}, expected a rate in [0, 1)", options.dropout_p));
  if (options.dropout_p > 0 && !variant.dropout)
    check.fail("dropout_p is set but the variant has no dropout (use .dropout())");
  a.dropout_p = variant.dropout ? options.dropout_p : 0.0f;
  a.seed = options.seed;
  a.threads = options.threads;
  return a;
}

void bind_attention_outputs(std::string_view op, const AttentionRunOptions& options, const AttentionOutputs& outputs,
                            AttentionArgs& a) {
  const Checker check(op);
  check.type("o", outputs.o, a.type, "the dtype of q");
  Pattern o_pattern;
  if (!a.packed) o_pattern.push_back({"B", a.B});
  o_pattern.insert(o_pattern.end(), {{"Tq", a.Tq}, {"H", a.H}, {"Dv", a.Dv}});
  check.shape("o", outputs.o, o_pattern);
  check.data("o", outputs.o);
  a.o = lead_with_ones(outputs.o, 4);
  if (options.return_lse && !outputs.lse) check.fail("return_lse is set but no lse output was given");
  if (outputs.lse) {
    const TensorView& lse = *outputs.lse;
    check.type("lse", lse, DType::f32, "fp32");
    if (a.packed) check.shape("lse", lse, {{"H", a.H}, {"Tq", a.Tq}});
    else check.shape("lse", lse, {{"B", a.B}, {"H", a.H}, {"Tq", a.Tq}});
    check.data("lse", lse);
    a.lse = lead_with_ones(lse, 3);
  }
}

}  // namespace ladle::ops
