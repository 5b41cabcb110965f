// Random inputs of an attention_cases::Case, bound as the op binds them (ops::bind_attention), with the
// fp64 reference's view of the same values: what the forward's and the backward's emulation tests share.
#pragma once

#include <cmath>
#include <cstring>
#include <deque>
#include <random>

#include <ladle/ops/attention_bind.h>

#include "attention_cases.h"
#include "reference/attention_reference.h"
#include "support/tensors.h"

namespace attention_binding {

using namespace ladle;
using attention_cases::Case;

// Random inputs of a case, bound as the op binds them, and the fp64 reference's view of them.
struct Bound {
  std::deque<Tensor> store;
  ops::AttentionArgs args;
  reference::Attention ref;
  Tensor o, lse;
  TensorView o_view;  // what the kernel writes: o's view, or (o_wide_rows) a view into a wider tensor
  // o as written, dense.
  Tensor dense_o() const { return Tensor::copy_of(o_view, Location::host()); }
};

inline Tensor integers(DType type, std::vector<std::int64_t> shape, const std::vector<std::int64_t>& values) {
  Tensor t(type, std::move(shape), 0.0f);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == DType::i64) std::memcpy(static_cast<char*>(t.data()) + 8 * i, &values[i], 8);
    else {
      const std::int32_t v = static_cast<std::int32_t>(values[i]);
      std::memcpy(static_cast<char*>(t.data()) + 4 * i, &v, 4);
    }
  }
  return t;
}

inline Bound bind(const Case& c, std::uint64_t seed) {
  Bound bound;
  std::mt19937_64 rng(seed);
  auto& ref = bound.ref;
  ref.B = c.B, ref.Tq = c.Tq, ref.Tk = c.Tk, ref.H = c.H, ref.H_kv = c.H_kv, ref.D = c.D, ref.Dv = c.Dv;
  const auto keep = [&](test::Filled f, std::vector<double>* values) {
    if (values) *values = std::move(f.values);
    return bound.store.emplace_back(std::move(f.tensor)).view();
  };
  const TensorView q = keep(test::normal(rng, c.type, {c.B, c.Tq, c.H, c.D}), &ref.q);
  const TensorView k = keep(test::normal(rng, c.type, {c.B, c.Tk, c.H_kv, c.D}), &ref.k);
  const TensorView v = keep(test::normal(rng, c.type, {c.B, c.Tk, c.H_kv, c.Dv}), &ref.v);
  VariantInputs inputs;
  AttentionRunOptions options;
  const float scale = (c.negative_scale ? -1.5f : 1.5f) / std::sqrt(static_cast<float>(c.D));  // logits of a few units
  ref.scale = scale;
  std::vector<double> slopes;
  for (const ir::Input& in : c.variant.inputs) {
    if (in.name == "scale") inputs.scalars["scale"] = scale;
    if (in.name == "logits_soft_cap") inputs.scalars[in.name] = 2.0f, ref.soft_cap = 2.0f;
    if (in.name == "bias") inputs.tensors[in.name] = keep(test::normal(rng, DType::f32, {c.B, c.H, c.Tq, c.Tk}), &ref.bias);
    if (in.name == "slope") {
      inputs.tensors[in.name] = keep(test::filled(DType::f32, {c.H}, [&, h = 0]() mutable { return c.slope_step * ++h; }), &slopes);
      ref.score_mod = [slopes](double s, int, int h, int i, int j) { return s - static_cast<float>(slopes[h]) * static_cast<float>(i - j); };
      ref.keep = [](int b, int h, int i, int j) { return j < 2 * i + 3 || h + b == 1; };
    }
    if (in.name == "attention_mask") {
      std::bernoulli_distribution attend(0.8);
      Tensor mask(DType::u8, {c.B, 1, c.Tq, c.Tk}, 0.0f);
      auto* bytes = static_cast<unsigned char*>(mask.data());
      ref.mask.assign(std::size_t(c.B) * c.H * c.Tq * c.Tk, false);
      for (std::int64_t e = 0; e < mask.numel(); ++e) bytes[e] = attend(rng) ? 1 : 0;
      for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
          for (std::int64_t e = 0; e < std::int64_t(c.Tq) * c.Tk; ++e)
            ref.mask[(std::size_t(b) * c.H + h) * c.Tq * c.Tk + e] = bytes[b * std::int64_t(c.Tq) * c.Tk + e] != 0;
      inputs.tensors[in.name] = bound.store.emplace_back(std::move(mask)).view();
    }
  }
  if (c.variant.window) options.window_left = c.window_left, options.window_right = c.window_right;
  ref.window = c.variant.window, ref.window_left = c.window_left, ref.window_right = c.window_right;
  ref.causal = c.variant.causal;
  if (c.variant.segment_ids) {
    const auto segments = [&](int T, int run) {
      std::vector<std::int64_t> ids;
      for (int b = 0; b < c.B; ++b)
        for (int t = 0; t < T; ++t) ids.push_back(t / run + b);
      return ids;
    };
    ref.q_segment_ids = segments(c.Tq, 20), ref.kv_segment_ids = segments(c.Tk, 20);
    options.q_segment_ids = bound.store.emplace_back(integers(c.segment_type, {c.B, c.Tq}, ref.q_segment_ids)).view();
    options.kv_segment_ids = bound.store.emplace_back(integers(c.segment_type, {c.B, c.Tk}, ref.kv_segment_ids)).view();
  }
  if (c.variant.sinks) {
    options.softmax_aux = keep(test::normal(rng, DType::f32, {c.H, c.sinks}), &ref.sinks);
    ref.S = c.sinks;
  }
  if (c.variant.dropout) {
    options.dropout_p = c.dropout_p, options.seed = seed * 7 + 1;
    ref.dropout_p = c.dropout_p, ref.seed = options.seed;
  }
  if (!c.cu_seqlens_q.empty()) {
    const auto n = static_cast<std::int64_t>(c.cu_seqlens_q.size());
    options.cu_seqlens_q = bound.store.emplace_back(integers(DType::i64, {n}, c.cu_seqlens_q)).view();
    options.cu_seqlens_k = bound.store.emplace_back(integers(DType::i64, {n}, c.cu_seqlens_k)).view();
    ref.cu_seqlens_q = c.cu_seqlens_q, ref.cu_seqlens_k = c.cu_seqlens_k;
  }
  options.return_lse = c.lse;
  bound.args = ops::bind_attention(c.name, c.variant, q, k, v, inputs, options);
  bound.o = Tensor(c.type, bound.args.output_shape());  // NaN: a skipped element stands out
  bound.o_view = bound.o.view();
  if (c.o_wide_rows) {  // rows Dv + 1 elements apart: o's column pairs are not aligned, the kernel stores elements
    const std::vector<std::int64_t> shape = bound.args.output_shape();
    const std::int64_t wide = shape.back() + 1;
    std::vector<std::int64_t> padded = shape;
    padded.back() = wide;
    bound.o_view = bound.store.emplace_back(c.type, padded).view();
    bound.o_view.shape = shape;
  }
  AttentionOutputs outputs{bound.o_view, std::nullopt};
  if (c.lse) {
    bound.lse = Tensor(DType::f32, bound.args.lse_shape());
    outputs.lse = bound.lse.view();
  }
  ops::bind_attention_outputs(c.name, options, outputs, bound.args);
  return bound;
}

}  // namespace attention_binding
