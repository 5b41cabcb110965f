// The generated CUDA kernels the codegen-cuda_recurrent test checks: every gate
// combination, 16-bit types, packed sequences with states, GQA, masked K and V, several
// tiles, user variants, awkward input names. cuda_emit renders them at build time for the
// host emulation; the test renders them again for nvcc and checks the names agree.
#pragma once

#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/dsl/dsl.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/update_forms.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace cuda_cases {

struct Case {
  std::string name;
  ladle::ir::Variant variant;
  ladle::cuda::RecurrentKernelSpec spec;
  int B = 2, T = 7, H = 4, H_kv = 2, K = 8, V = 12;
  std::vector<std::int64_t> cu_seqlens;  // packed sequences when not empty (then B = 1)
  double gate_level = 0;                 // not 0: log gates within 2 of this per token (g_gamma: this)
  double hard_reset = 0;                 // not 0: gates of this value (-inf: a hard reset) where hard_reset_at says
};

// Where a hard_reset case plants its gate value (case_binding.h): at tokens that start, split
// and end chunks of 16, 32 and 64 (0, 16, 32, 64, 128; 9, 40, 100; 15, 31, 47, 63, 127, 149)
// and runs of consecutive tokens (0-2, 31-33, 70-72); there, in the key or value dimensions i
// with (t + i) % 3 != 1, and in all of them at tokens 33 and 70-72. Token t counts along the
// tensor's T axis (packed: across sequences).
inline bool hard_reset_at(std::int64_t t, std::int64_t i) {
  static const std::int64_t tokens[] = {0, 1, 2, 9, 15, 16, 31, 32, 33, 40, 47, 63, 64, 70, 71, 72, 100, 127, 128, 149};
  bool listed = false;
  for (std::int64_t x : tokens) listed = listed || x == t;
  return listed && ((t + i) % 3 != 1 || t == 33 || (t >= 70 && t <= 72));
}

inline std::vector<Case> all() {
  using namespace ladle;
  using E = DType;
  std::vector<Case> cases;
  // Fills the spec's types (q, k, v and o in `io`, other tensors in `gates`) and the tile.
  const auto add = [&](Case c, E io, E gates, const cuda::RecurrentTile* tile = nullptr) {
    c.spec.input_types.clear();
    for (const ir::Input& in : c.variant.inputs)
      c.spec.input_types.push_back(in.kind == ir::InputKind::scalar ? E::f32 : in.role == ir::Role::other ? gates : io);
    c.spec.output_type = io;
    c.spec.tile = tile ? *tile : cuda::default_tile(c.K, c.V);
    c.spec.varlen = !c.cu_seqlens.empty();
    if (c.spec.varlen) c.B = 1, c.T = static_cast<int>(c.cu_seqlens.back());
    cases.push_back(std::move(c));
  };

  for (unsigned gates = 0; gates < 16; ++gates) {
    Case c;
    c.name = "recurrent gates " + std::to_string(gates);
    c.variant = recurrent_variant(gates & 1, gates & 2, gates & 4, gates & 8);
    c.spec.reverse = gates % 2 == 1;
    c.spec.initial_state = c.spec.final_state = gates % 3 == 0;
    add(c, E::f32, E::f32);
  }
  {
    Case c;
    c.name = "f16, packed, i32 offsets, states";
    c.variant = recurrent_variant(true, true, true, true);
    c.cu_seqlens = {0, 3, 3, 9};
    c.spec.cu_seqlens_type = E::i32;
    c.spec.initial_state = c.spec.final_state = true;
    add(c, E::f16, E::f16);
    c.name = "bf16, packed, reverse, bf16 initial state";
    c.spec.cu_seqlens_type = E::i64;
    c.spec.reverse = true;
    c.spec.initial_state_type = E::bf16;
    add(c, E::bf16, E::f32);
  }
  {
    const cuda::RecurrentTile one_warp{16, 8, 1}, wide{32, 32, 2}, one_group{16, 64, 2}, tall{64, 4, 1};
    Case c;
    c.variant = recurrent_variant(true, false, true, true);
    c.spec.initial_state = c.spec.final_state = true;
    c.name = "GQA 6/3, K=5 V=7 masked, one warp";
    c.H = 6, c.H_kv = 3, c.K = 5, c.V = 7;
    add(c, E::f32, E::f32, &one_warp);
    c.name = "K=32 V=40 over two value blocks";
    c.H = 2, c.H_kv = 1, c.K = 32, c.V = 40;
    add(c, E::f32, E::bf16, &wide);
    c.name = "one row group";
    c.K = 16, c.V = 20;
    add(c, E::bf16, E::bf16, &one_group);
    c.name = "more key rows than threads";
    c.K = 40, c.V = 6;
    c.spec.reverse = true;
    add(c, E::f16, E::f32, &tall);
  }
  {
    const auto x = dsl::token_key("x");
    const auto tau = dsl::head_param("tau");
    Case c;
    c.name = "custom gate logsigmoid(x) / tau";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau), dsl::q, dsl::scalar("scale")), "custom_gate");
    add(c, E::f32, E::f32);
    add(c, E::bf16, E::f32);
  }
  {
    Case c;
    c.name = "feature maps, normalised read, packed";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::elu(dsl::k) + 1, dsl::v).decay_k(dsl::token_key("g")), dsl::elu(dsl::q) + 1,
                                     dsl::scalar("scale"))
                               .normalized(1e-6f),
                           "normalised");
    c.cu_seqlens = {0, 4, 10};
    c.spec.final_state = true;
    add(c, E::f32, E::f32);
  }
  {
    Case c;
    c.name = "token gate per head, value-side raw gate, per-head and per-token scale";
    const auto u = dsl::token_value("u");
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v * dsl::sigmoid(u))
                                         .decay_head(dsl::token_head("g_t"))
                                         .decay_v(-dsl::softplus(dsl::token_value("y"))),
                                     dsl::q, dsl::scalar("scale") * dsl::head_param("s") * dsl::exp(dsl::token_head("g_t"))),
                           "mixed");
    c.spec.initial_state = true;
    add(c, E::f32, E::f16);
  }
  {
    Case c;
    c.name = "input names that clash with the template or C++";
    c.variant = dsl::lower(
        dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("state") / dsl::head_param("int") + dsl::token_key("x-y") * 0),
                  dsl::q, dsl::scalar("read_scale")),
        "clashing");
    add(c, E::f32, E::f32);
  }
  {
    // Hard resets: log gates of -inf (exp(-inf) = 0 wipes the state), planted by
    // hard_reset_at, directly and through gate expressions.
    Case c;
    c.T = 40;
    c.hard_reset = -std::numeric_limits<double>::infinity();
    c.name = "hard resets: -inf in g, gk, gv, and g_gamma of head 0";
    c.variant = recurrent_variant(true, true, true, true);
    c.spec.initial_state = c.spec.final_state = true;
    add(c, E::f32, E::f32);
    c.name = "hard resets: -inf in g, gk, gv, g_gamma, bf16, reverse";
    c.spec.reverse = true;
    add(c, E::bf16, E::bf16);
    c.name = "hard resets: -inf in g and gv, f16";
    c.variant = recurrent_variant(true, false, true, false);
    c.spec.reverse = false;
    add(c, E::f16, E::f16);
    c.spec.initial_state = c.spec.final_state = false;
    c.spec.reverse = true;
    c.name = "hard resets through logsigmoid(x) / tau at x = -inf, reverse";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")),
                                     dsl::q, dsl::scalar("scale")),
                           "custom_gate");
    add(c, E::bf16, E::f32);
    c.name = "hard resets: a per-token head gate of -inf, -softplus(y) at y = +inf";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v)
                                         .decay_head(dsl::token_head("g_t"))
                                         .decay_v(-dsl::softplus(dsl::token_value("y"))),
                                     dsl::q, dsl::scalar("scale")),
                           "head_gate");
    c.spec.initial_state = true;
    c.spec.reverse = false;
    add(c, E::f32, E::f16);
  }
  {
    // The update forms (ops/update_forms.h): the delta rule, gated and L2-normalised, a user's
    // gated delta rule with gates as expressions, RWKV6's bonus read, a read before the update alone.
    const cuda::RecurrentTile one_warp{16, 8, 1}, most_groups{16, 16, 16}, tall{64, 4, 1};
    Case c;
    c.name = "delta rule, states";
    c.variant = delta_rule_variant(false, false);
    c.spec.initial_state = c.spec.final_state = true;
    add(c, E::f32, E::f32);
    c.name = "gated delta rule, L2-normalised q and k, packed, reverse, bf16";
    c.variant = delta_rule_variant(true, true);
    c.cu_seqlens = {0, 5, 5, 11, 12};
    c.spec.reverse = true;
    add(c, E::bf16, E::f32);
    c.cu_seqlens.clear();
    c.spec.reverse = false;
    c.name = "gated delta rule, L2, 32 row groups a column (shuffles over a whole warp)";
    c.K = 16, c.V = 16;
    add(c, E::f16, E::f16, &most_groups);
    c.name = "gated delta rule, GQA 6/3, K=5 V=7 masked, one warp";
    c.H = 6, c.H_kv = 3, c.K = 5, c.V = 7;
    add(c, E::f32, E::f32, &one_warp);
    c.name = "user gated delta rule: beta = sigmoid(b), g = -exp(A) softplus(a), silu features, more rows than threads";
    c.H = 4, c.H_kv = 2, c.K = 40, c.V = 6;
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::silu(dsl::k), dsl::v)
                                         .decay_head(-dsl::exp(dsl::head_param("A")) * dsl::softplus(dsl::token_head("a")))
                                         .delta(dsl::sigmoid(dsl::token_head("b"))),
                                     dsl::silu(dsl::q), dsl::scalar("scale"))
                               .l2_normalized(),
                           "user_gdn");
    add(c, E::f32, E::f32, &tall);
    c.name = "KDA: the delta rule under a key-side decay -exp(A_log) softplus(g + dt_bias), sigmoid beta, L2, more rows than threads";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v)
                                         .decay_k(-dsl::exp(dsl::head_param("A_log")) *
                                                  dsl::softplus(dsl::token_key("g") + dsl::head_key("dt_bias")))
                                         .delta(dsl::sigmoid(dsl::token_head("b"))),
                                     dsl::q, dsl::scalar("scale"))
                               .l2_normalized(),
                           "kda_gate");
    add(c, E::f32, E::f32, &tall);
    c.K = 8, c.V = 12;
    c.name = "KDA, a precomputed gate, packed, reverse, states, bf16";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("g")).delta(dsl::token_head("beta")), dsl::q,
                                     dsl::scalar("scale")),
                           "kda");
    c.cu_seqlens = {0, 4, 4, 10};
    c.spec.reverse = true;
    add(c, E::bf16, E::f32);
    c.cu_seqlens.clear();
    c.spec.reverse = false;
    c.name = "rwkv6, states";
    c.variant = rwkv6_variant();
    add(c, E::f32, E::f32);
    c.name = "rwkv6, packed, reverse, bf16, GQA 4/1";
    c.H_kv = 1;
    c.cu_seqlens = {0, 4, 4, 10};
    c.spec.reverse = true;
    add(c, E::bf16, E::bf16);
    c.cu_seqlens.clear();
    c.spec.reverse = false;
    c.H_kv = 2;
    c.name = "read before the update, a bonus per token sigmoid(x) u, a key gate";
    c.variant = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("w")), dsl::q, dsl::scalar("scale"))
                               .bonus(dsl::sigmoid(dsl::token_key("x")) * dsl::head_key("u")),
                           "token_bonus");
    add(c, E::f32, E::f32);
    c.name = "read before the update, no bonus, head decay";
    c.variant = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_head(dsl::token_head("g_t")), dsl::q, dsl::scalar("scale")),
                           "read_before");
    add(c, E::f32, E::f32, &one_warp);
  }
  return cases;
}

}  // namespace cuda_cases
