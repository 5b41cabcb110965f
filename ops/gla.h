// Gated linear attention: recurrent() with the key-side gate g [B,T,H,K] only (plus an
// optional per-head g_gamma), written as its own DSL expression:
//   read(scan(k, v).decay_k(g)[.decay_head(g_gamma)], q, scale)
// Same shapes, dtypes and defaults as recurrent.h.
#pragma once

#include <optional>

#include "variant.h"

namespace ladle {

struct GlaOptions {
  std::optional<TensorView> g_gamma;        // [H] or [B,H]
  std::optional<float> scale;               // default 1/sqrt(K)
  std::optional<TensorView> initial_state;  // [N,H,K,V]
  bool reverse = false;
  std::optional<TensorView> cu_seqlens;     // [N+1], i32 or i64
  bool return_state = false;                // final_state [N,H,K,V] f32
  Backend backend = Backend::automatic;     // GPU when there is one or a tensor is device memory, else CPU
  GpuOptions gpu;                           // stream, and whether host tensors may be uploaded
  Algorithm algorithm = Algorithm::automatic;  // GPU family: chunked by shape and dtype, or forced
  std::optional<cuda::ChunkedTile> chunked_tile;  // the chunked family's tile on the GPU; empty: tuned/heuristic
  GateGradients gate_gradients = GateGradients::boundary_blocks;  // the GPU backward's (variant.h)
};

RecurrentResult gla(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                    const GlaOptions& options = {});
void gla_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
              const GlaOptions& options, const RecurrentOutputs& outputs);

// Training: the forward of gla(), keeping what its backward needs; then
// ladle::run_variant_backward(forward.saved, d_o[, d_final_state]) gives dq, dk, dv, d initial_state
// and grads.inputs.at("g") (and "g_gamma" where given), each in its input's shape.
RecurrentForward gla_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                  const GlaOptions& options = {});

const ir::Variant& gla_variant(bool g_gamma);

}  // namespace ladle
