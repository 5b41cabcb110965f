// The chunked family's warp-specialised Hopper form (ChunkedTile::ws, sm_90a; internal to
// codegen, not installed), for variants whose decay is at most a per-head scalar per token
// (simple GLA, RetNet, Lightning, Mamba2's scalar decay, user expressions of that shape), or a
// key-side gate alone (GLA, a user's per-feature gate).
//
// Why a form of its own: the serial form's chunk is a chain of phases between block barriers
// (stage, gate sums, state copy, products, store), and one block of 8 warps per SM cannot hide
// that chain's latency (issue 11: few issue slots used, the tensor pipe mostly idle). Here
//   - a producer warpgroup copies q, k and v chunk by chunk with TMA into a ring of stages guarded
//     by mbarriers, so loads never sit on the compute chain;
//   - each consumer warpgroup owns 64 value columns of the state (fp32, wgmma accumulators) and
//     needs nothing from the other: o[:, j] = q S[:, j] + P v[:, j] and the update of S[:, j] read
//     only its own columns, so the consumers synchronise with no one but the producer;
//   - every product is one wgmma batch: score = q k^T, o = q S (S as bf16 in shared memory) and
//     S = 2^(G_C) S + k^T (w v) are issued together, then o += P v from registers.
// A per-head decay needs no reference token: every factor 2^(G_t - G_s), 2^(G_t), 2^(G_C - G_s) is
// a decay (at most 1) taken per (t, s) pair, row or token, so no chunk needs a fallback.
// A key-side gate's factors differ per key feature, so they go into the operands: q~ = q 2^(G_t - R)
// and k~ = k 2^(R - G_s) against a reference R per feature (the midpoint of G over the chunk, else
// over 8-token windows, else single tokens where G spans more than 2 FIT_LIMIT), formed once per
// chunk by both consumer warpgroups together (named barriers), S's rows scaled around the batch.
// A value-side gate's factors differ per value column, which is the consumers' own: the update takes
// vt = v 2^(R - G_s) against a reference R per column (S's columns scaled by 2^R before the batch
// and 2^(G_C - R) after it), o = 2^R (q st) + P vt, then o *= 2^(G_t - R). R is the midpoint of the
// column's G over the chunk where every column of the consumer spans at most 2 FIT_LIMIT; else
// R = G_C (vt a decay), o's state part takes 2^(G_t) and the intra-chunk part is summed exactly
// per element, P_ts 2^(G_t - G_s) v_s (slow, for gates strong enough to need it).
#pragma once

#include <string>

#include <ladle/dsl/ir.h>

#include "../chunked.h"

namespace ladle::cuda::detail {

// Why the ws form cannot run this variant (empty: it can): it needs a decay of at most a per-head
// scalar per token, or a key-side gate alone, or a value-side gate alone (each reading per-token
// inputs of its side, per-head parameters and scalars), q, k and v read as they are (no feature
// map), a read scale that does not vary over tokens, and no normaliser.
std::string ws_variant_unsupported(const ir::Variant& variant);
// The same for a spec: the variant, then q, k and v in bf16 and a key gate's inputs in 16 bits (TMA
// copies them as they are).
std::string ws_spec_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec);
// What is wrong with a ws tile apart from the variant (empty: nothing).
std::vector<std::string> ws_tile_rules(const ChunkedTile& tile);
// Dynamic shared memory of a block (a 1024-byte aligned ring of stages, then the consumers' buffers):
// the serial kernel's, or (states) the segmented state pass's.
// gate_inputs: the number of per-token inputs a gate reads (ws_gate_inputs); value_gate: the gate is
// the value-side one.
int ws_shared_bytes(const ChunkedTile& tile, bool states = false, int gate_inputs = 0, bool value_gate = false);
// Why the ws form's segmented state pass cannot run this variant with these types (empty: it can):
// the serial form's rules, or a key-side gate alone (GLA: no per-head or value-side decay beside it)
// whose token inputs are 16-bit, with bf16 k and v.
std::string ws_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec);
// The per-token inputs the gate reads, copied by TMA: a key-side gate's token_key inputs (beside k), a
// value-side gate's token_value inputs (beside v).
std::vector<int> ws_gate_inputs(const ir::Variant& variant);

// The serial kernel (segmented or not) in the ws form, or (phase states, segmented) the segmented
// form's state pass: k and v only, the update alone, each segment's own state and total decay.
ChunkedKernel generate_ws_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec);

}  // namespace ladle::cuda::detail
