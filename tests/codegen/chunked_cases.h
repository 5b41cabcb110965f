// The chunked kernels the codegen-cuda_chunked test runs on the host emulation: every case of
// cuda_cases.h the family supports (no normaliser), over sequences long enough for several
// chunks and partial ones, with a sweep of tiles; plus gates strong enough to force 16-token
// and single-token steps. chunked_emit renders them at build time.
#pragma once

#include <ladle/codegen/cuda_chunked.h>

#include "cuda_cases.h"

namespace chunked_cases {

struct Case {
  cuda_cases::Case c;  // the variant, sizes and types (c.spec.tile is not used)
  ladle::cuda::ChunkedTile tile;
  ladle::cuda::ChunkedKernelSpec spec() const {
    ladle::cuda::ChunkedKernelSpec s;
    static_cast<ladle::cuda::KernelTypes&>(s) = c.spec;
    s.tile = tile;
    return s;
  }
};

inline std::vector<Case> all() {
  using ladle::cuda::ChunkedTile;
  std::vector<Case> cases;
  int i = 0;
  for (cuda_cases::Case c : cuda_cases::all()) {
    if (!ladle::cuda::chunked_unsupported(c.variant).empty()) continue;
    if (c.cu_seqlens.empty()) c.T = 45;
    else c.cu_seqlens = {0, 37, 37, 90}, c.T = 90;
    const int block_k = (c.K + 15) / 16 * 16;
    const ChunkedTile tiles[] = {{block_k, 16, 16, 2}, {block_k, 32, 16, 2}, {block_k, 64, 32, 4}, {block_k, 32, 32, 8}};
    cases.push_back({c, tiles[i++ % 4]});
  }
  // Gate strength: near -2.5 per token a 64-token chunk no longer fits one reference token
  // (16-token steps); near -10 neither does a 16-token step (single tokens).
  const auto retype = [](cuda_cases::Case& c) {  // bf16 q, k, v and o; f32 gates
    using E = ladle::ElementType;
    c.spec.input_types.clear();
    for (const ladle::ir::Input& in : c.variant.inputs)
      c.spec.input_types.push_back(in.kind == ladle::ir::InputKind::scalar || in.role == ladle::ir::Role::other ? E::f32 : E::bf16);
    c.spec.output_type = E::bf16;
  };
  for (const double level : {-2.5, -10.0}) {
    cuda_cases::Case c = cuda_cases::all()[0];
    c.variant = ladle::recurrent_variant(true, true, true, true);  // g, gk, gv, g_gamma
    c.name = "every gate near " + std::to_string(level);
    c.gate_level = level;
    c.T = 150;
    c.spec.initial_state = c.spec.final_state = true;
    retype(c);
    cases.push_back({c, {16, 64, 16, 4}});
    c.name = "GLA near " + std::to_string(level);
    c.variant = ladle::recurrent_variant(true, false, false, false);
    c.spec.reverse = true;
    retype(c);
    cases.push_back({c, {16, 64, 16, 8}});
    c.name = "g_gamma near " + std::to_string(level);
    c.variant = ladle::recurrent_variant(false, false, false, true);
    retype(c);
    cases.push_back({c, {16, 32, 16, 2}});
  }
  return cases;
}

}  // namespace chunked_cases
