// The cases of the recurrent backward's generated kernels that run on the host emulation
// (backward_emit writes their sources at build time; cuda_backward-test.cpp runs them): a key gate
// with a head decay folded in, reversed; a user gate logsigmoid(x) / tau with a per-token read scale
// sigmoid(s), packed sequences and GQA; every gate kind with K != V. Every slot is written (nothing
// read in place, no folded scale, no gradient written by a recurrence), fp32 throughout.
#pragma once

#include <string>
#include <vector>

#include <ladle/codegen/cuda/backward.h>
#include <ladle/dsl/dsl.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>

namespace backward_cases {

struct Case {
  std::string name;
  ladle::ir::Variant variant;
  bool reverse = false;
  std::vector<std::int64_t> cu_seqlens;  // empty: B sequences of T tokens
  std::int64_t B = 2, T = 70, H = 2, H_kv = 2, K = 8, V = 8;
};

inline std::vector<Case> all() {
  namespace dsl = ladle::dsl;
  std::vector<Case> cases;
  {
    Case c;
    c.name = "gla_g_gamma_reverse", c.variant = ladle::gla_variant(true);
    c.reverse = true;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "user_gate_token_scale_packed_gqa";
    c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")),
                                     dsl::q, dsl::sigmoid(dsl::token_head("s"))),
                           "user_gate");
    c.cu_seqlens = {0, 30, 30, 100};
    c.B = 1, c.T = 100, c.H = 4, c.H_kv = 2;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "every_gate_k_ne_v", c.variant = ladle::recurrent_variant(true, true, true, true);
    c.K = 8, c.V = 5;
    cases.push_back(c);
  }
  return cases;
}

inline ladle::cuda::BackwardKernelSpec spec(const Case& c, ladle::cuda::BackwardPhase phase) {
  ladle::cuda::BackwardKernelSpec spec;
  for (std::size_t i = 0; i < c.variant.inputs.size(); ++i) spec.input_types.push_back(ladle::DType::f32);
  spec.output_type = ladle::DType::f32;
  spec.reverse = c.reverse;
  spec.varlen = !c.cu_seqlens.empty();
  spec.phase = phase;
  spec.slot_type = spec.d_output_type = ladle::DType::f32;
  spec.write_first = true;  // the decays at each sequence's first step (for d initial_state)
  return spec;
}

inline constexpr ladle::cuda::BackwardPhase phases[] = {ladle::cuda::BackwardPhase::slots, ladle::cuda::BackwardPhase::chain};

}  // namespace backward_cases
