// The cases of the update forms' recurrent backward (codegen/cuda/update_backward.h) that run on the
// host emulation (update_backward_emit writes their kernels at build time;
// cuda_update_backward-test.cpp runs them against an fp64 reference): KDA (the delta rule with a key
// decay, L2-normalised, packed sequences one of them empty, initial and final states' gradients), the
// gated delta rule reversed with a per-token scale, RWKV6 (a read before the update with a key decay
// and a bonus, packed), a read before the update with a head decay alone, reversed, and the plain
// delta rule (no decay) over three checkpoints. K is not always a multiple of 32 (padding rows) nor
// V of block_v (masked columns); sequences span checkpoints (64 steps) and end in a partial chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/codegen/cuda/update_backward.h>

namespace update_backward_cases {

struct Case {
  std::string name;
  ladle::cuda::UpdateBackwardSpec spec;
  std::vector<std::int64_t> cu_seqlens;  // empty: B sequences of T tokens
  std::int64_t B = 1, T = 0, H = 2, K = 0, V = 0;
  double decay_scale = 1.0;  // log decays drawn in decay_scale (-1, -0.01)
};

inline std::vector<Case> all() {
  std::vector<Case> cases;
  {
    Case c;
    c.name = "kda_packed_initial_final";
    c.spec.delta = true, c.spec.key_decay = true, c.spec.beta = true, c.spec.l2 = true;
    c.spec.varlen = true, c.spec.initial_state = true, c.spec.d_final = true, c.spec.block_v = 8;
    c.cu_seqlens = {0, 70, 70, 150};
    c.T = 150, c.K = 40, c.V = 20;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "gated_delta_scale_table_reverse";
    c.spec.delta = true, c.spec.head_decay = true, c.spec.beta = true, c.spec.scale_table = true, c.spec.reverse = true;
    c.spec.block_v = 16;
    c.B = 2, c.T = 65, c.K = 32, c.V = 32;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "rwkv6_packed_initial_final";
    c.spec.delta = false, c.spec.key_decay = true, c.spec.bonus = true;
    c.spec.varlen = true, c.spec.initial_state = true, c.spec.d_final = true, c.spec.block_v = 8;
    c.cu_seqlens = {0, 30, 100};
    c.T = 100, c.K = 64, c.V = 16;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "read_before_head_decay_reverse";
    c.spec.delta = false, c.spec.head_decay = true, c.spec.reverse = true, c.spec.block_v = 32;
    c.B = 2, c.T = 70, c.K = 32, c.V = 40;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "delta_rule_three_checkpoints";
    c.spec.delta = true, c.spec.beta = true, c.spec.l2 = true, c.spec.block_v = 8;
    c.T = 150, c.K = 16, c.V = 12;
    cases.push_back(c);
  }
  // The chunked WY form (spec.chunked): the gated delta rule packed, one sequence empty, with initial
  // and final states and a partial chunk, K and V padded (40 of 64 key rows, 20 of 64 columns); the
  // delta rule reversed with a per-token scale over two value slices and 128 key rows; the gated delta
// rule over four value slices; KDA (a per-feature decay) packed with states, and reversed with a
// per-token scale under strong decay (log decays to -25 a step: every block's references tested).
  {
    Case c;
    c.name = "wy_gated_delta_packed_initial_final";
    c.spec.delta = true, c.spec.head_decay = true, c.spec.beta = true, c.spec.l2 = true;
    c.spec.varlen = true, c.spec.initial_state = true, c.spec.d_final = true, c.spec.chunked = true, c.spec.block_k = 64;
    c.cu_seqlens = {0, 70, 70, 150};
    c.T = 150, c.K = 40, c.V = 20;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "wy_delta_scale_table_reverse";
    c.spec.delta = true, c.spec.beta = true, c.spec.scale_table = true, c.spec.reverse = true, c.spec.chunked = true;
    c.spec.block_k = 128;
    c.B = 2, c.T = 65, c.K = 72, c.V = 72;
    cases.push_back(c);
  }
  {
    Case c;  // four value slices (V 200 of 256 columns), the last partial
    c.name = "wy_gated_delta_wide_values";
    c.spec.delta = true, c.spec.head_decay = true, c.spec.beta = true, c.spec.l2 = true, c.spec.d_final = true;
    c.spec.chunked = true, c.spec.block_k = 64;
    c.T = 130, c.H = 1, c.K = 64, c.V = 200;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "wy_kda_packed_initial_final";
    c.spec.delta = true, c.spec.key_decay = true, c.spec.beta = true, c.spec.l2 = true;
    c.spec.varlen = true, c.spec.initial_state = true, c.spec.d_final = true, c.spec.chunked = true, c.spec.block_k = 64;
    c.cu_seqlens = {0, 70, 70, 150};
    c.T = 150, c.K = 40, c.V = 20;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "wy_kda_strong_decay_reverse";
    c.spec.delta = true, c.spec.key_decay = true, c.spec.beta = true, c.spec.scale_table = true, c.spec.reverse = true;
    c.spec.d_final = true, c.spec.chunked = true, c.spec.block_k = 128;
    c.T = 130, c.H = 1, c.K = 72, c.V = 72, c.decay_scale = 25.0;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace update_backward_cases
