// The chunked delta-rule kernels (codegen/cuda/chunked_delta.h) the codegen-cuda_chunked_delta test
// runs on the host emulation: every delta-rule case of cuda_cases.h (plain, gated, L2-normalised, a
// user's gates as expressions, GQA, masked K and V, packed with an empty sequence, reverse), over
// sequences of several 64-token chunks and a partial one. chunked_delta_emit renders them.
#pragma once

#include <ladle/codegen/cuda/chunked_delta.h>

#include <limits>

#include "cuda_cases.h"

namespace chunked_delta_cases {

struct Case {
  cuda_cases::Case c;
  bool vector_loads = false;  // q, k, v 16 bytes at a time (16-bit, contiguous, K and V multiples of 8)
  ladle::cuda::ChunkedDeltaSpec spec(ladle::cuda::ChunkedDeltaPhase phase) const {
    ladle::cuda::ChunkedDeltaSpec s = ladle::cuda::chunked_delta_spec(c.spec, c.K, c.V, phase);
    s.vector_loads = vector_loads;
    return s;
  }
};

inline std::vector<Case> all() {
  std::vector<Case> cases;
  for (cuda_cases::Case c : cuda_cases::all()) {
    if (c.variant.update != ladle::ir::Update::delta) continue;
    if (c.cu_seqlens.empty()) c.T = 150, c.B = 2;
    else c.cu_seqlens = {0, 70, 70, 200}, c.T = 200;
    cases.push_back({c});
    // The same with 16-byte loads where the case allows them (the tensors are contiguous).
    const bool sixteen = c.spec.input_types[0] != ladle::DType::f32;
    if (sixteen && c.K % 8 == 0 && c.V % 8 == 0) {
      c.name += ", 16-byte loads";
      cases.push_back({c, true});
    }
  }
  for (const Case& base : std::vector<Case>(cases)) {  // KDA under strong decay and hard resets
    if (base.c.name.rfind("KDA, a precomputed gate", 0) != 0 || base.vector_loads) continue;
    Case strong = base;  // g around -8 a token: every diagonal block of the scores element by element
    strong.c.name = "KDA, strong decay (g around -8), K=32 V=40";
    strong.c.gate_level = -8, strong.c.K = 32, strong.c.V = 40;
    cases.push_back(strong);
    Case medium = base;  // g around -1.5: the diagonal blocks fit their references, the chunk would not
    medium.c.name = "KDA, decay around -1.5, K=128 V=64, no packing";
    medium.c.gate_level = -1.5, medium.c.K = 128, medium.c.V = 64, medium.c.cu_seqlens.clear(), medium.c.spec.varlen = false;
    medium.c.B = 1, medium.c.T = 150, medium.c.H = 2, medium.c.H_kv = 1;
    cases.push_back(medium);
    Case resets = base;  // -inf gates where cuda_cases::hard_reset_at says
    resets.c.name = "KDA, hard resets, K=64 V=24";
    resets.c.hard_reset = -std::numeric_limits<double>::infinity(), resets.c.K = 64, resets.c.V = 24;
    cases.push_back(resets);
  }
  {  // V over two value blocks and a partial third, K between 64 and 128
    Case wide = cases.front();
    wide.vector_loads = false;
    wide.c.name = "delta rule, K=72 V=150 (three value blocks), states";
    wide.c.K = 72, wide.c.V = 150, wide.c.T = 70, wide.c.H = 2, wide.c.H_kv = 1;
    cases.push_back(wide);
  }
  return cases;
}

}  // namespace chunked_delta_cases
