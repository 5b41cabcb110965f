// The segmented form's state pass in its suffix form (internal to codegen; not installed).
//
// A segment's own final state, from zero, is L = sum_t diag(2^(A_t)) k_t v_t^T, where A_t is the
// sum of the log2 gates after token t in the segment: every factor is a decay (at most 1), so no
// reference token is needed. Per chunk of 64 tokens a block of 8 warps owns the whole [K, BV]
// state tile and
//   1. copies the chunk's raw rows (k, the gate inputs, v) by cp.async, one chunk ahead;
//   2. forms each key column's suffix sums within the chunk (two columns per thread, the chunk's
//      tokens in parts, the parts' totals exchanged through shared memory) and writes
//      k_up = k 2^(suffix) as bf16;
//   3. S = diag(2^(chunk total)) S + k_up^T v on mma.sync, reading v as copied.
// Against the split form's state pass it stages nothing (v is read raw), forms each gate sum once
// per (token, key) instead of once per value tile, and keeps the whole state in one block.
#pragma once

#include <string>

#include <ladle/dsl/ir.h>

#include "../chunked.h"

namespace ladle::cuda::detail {

// Why the suffix form cannot run this variant with these types and tile (empty: it can). It
// needs no value-side gate, a key-side gate that is per key dimension, per token and head, or
// constant per head (not a per-token head gate beside a per-dimension one), key-side token
// inputs and v in 16-bit storage, v a bf16 input as is, and block_k, block_v <= 128.
std::string suffix_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec);

// The kernel (phase states, segmented); the parameters are the other state pass's.
ChunkedKernel generate_suffix_states(const ir::Variant& variant, const ChunkedKernelSpec& spec);

}  // namespace ladle::cuda::detail
