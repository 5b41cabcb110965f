// The chunked delta-rule kernels (codegen/cuda/chunked_delta.h) the codegen-cuda_chunked_delta test
// runs on the host emulation: every delta-rule case of cuda_cases.h (plain, gated, L2-normalised, a
// user's gates as expressions, GQA, masked K and V, packed with an empty sequence, reverse), over
// sequences of several 64-token chunks and a partial one. chunked_delta_emit renders them.
#pragma once

#include <ladle/codegen/cuda/chunked_delta.h>

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
    if (c.variant.has(ladle::ir::Slot::log_decay_k)) continue;  // KDA: the fused-recurrent kernels only, for now
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
