// The chunked (tensor-core) forward of the delta rule and the gated delta rule, in three kernels per
// call (docs/operations.md: update forms). Within a chunk of C = 64 tokens with cumulative log decay
// gamma_t = g_1 + ... + g_t, the state's correction e_t = beta_t (v_t - exp(g_t) S_(t-1)^T k_t) solves
// the unit lower-triangular system
//   (I + A) E = beta (V - diag(exp(gamma)) K S_0),   A_ts = beta_t exp(gamma_t - gamma_s) k_t . k_s  (s < t),
// so with T = (I + A)^(-1) (the WY / UT form): E = U - W S_0, U = T (beta V), W = T (beta exp(gamma) K).
// Then o_t = exp(gamma_t) q_t^T S_0 + sum_(s <= t) exp(gamma_t - gamma_s) (q_t . k_s) e_s and the next
// state is S_C = exp(gamma_C) S_0 + K^T diag(exp(gamma_C - gamma)) E.
//
//   prepare (grid: chunks x H, 128 threads): gamma, A by mma.sync, T in 16 x 16 blocks (fp32), W and U
//            by mma.sync; W, U, k (normalised) into work arrays (bf16), gamma (f32).
//   states   (grid: ceil(V / 64) x N*H, 256 threads): the only serial pass. The state's 64 value columns
//            in registers (fp32); each chunk: h = S_0 and E = U - W S_0 into work arrays, then
//            S_C = exp(gamma_C) S_0 + K^T diag(exp(gamma_C - gamma)) E, the next chunk's tiles in flight.
//   outputs  (grid: chunks x H x ceil(V / 128), 256 threads; V <= 64: ceil(V / 64), 128): o = exp(gamma) q h
//            + tril(q k^T decayed) E, every chunk in parallel, q and k staged once for 128 value columns.
// q and k pass through their feature maps (and the L2 normalisation) as they are staged; beta, the
// decay and the scale are the variant's expressions. K <= 128, V <= 256.
//
// KDA (a key-side decay, with or without a per-head one): gamma is per feature, G_t = g_1 + ... + g_t in
// log2 (a log2 gate below -256, a hard reset's -inf included, counts as -256: 2^-256 = 0 in fp32).
// A_ts = beta_t sum_i k_ti k_si 2^(G_ti - G_si) and P_ts = sum_i q_ti k_si 2^(G_ti - G_si) are formed in
// 16 x 16 blocks with per-feature references: a block below the diagonal, rows from block I and columns
// from block J < I, as (k_t 2^(G_t - G_16I)) . (k_s 2^(G_16I - G_s)), both factors at most 1 whatever the
// decay; a diagonal block against its row 7 where |G_t - G_ref| <= 100 over its 16 rows (every factor
// within 2^+-100), else element by element. W = T diag(beta) (K 2^G); the states kernel takes
// k 2^(G_last - G) and 2^(G_last) per state row; the outputs kernel stages k and the gates itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "../kernel.h"

namespace ladle::cuda {

inline constexpr int chunked_delta_chunk = 64;

enum class ChunkedDeltaPhase { prepare, states, outputs };

struct ChunkedDeltaSpec : KernelTypes {
  int block_k = 128;   // key rows: 64 or 128, at least K
  int value_pad = 128; // U's row length in the work array: V rounded up to 64 (at most 256)
  // q, k and v loaded 8 features (16 bytes) at a time: 16-bit, features contiguous, rows 16-byte
  // aligned, K and V multiples of 8 (the launcher checks; else element by element).
  bool vector_loads = false;
  ChunkedDeltaPhase phase = ChunkedDeltaPhase::states;
};

struct ChunkedDeltaKernel {
  std::string name;
  std::string source;
  std::vector<KernelParam> params;
  unsigned threads = 0;
  int shared_bytes = 0;  // dynamic shared memory per block
  int block_v = 64;      // value columns per block (states 64; outputs 128 where V > 64, else 64)
  int blocks_per_sm = 3; // what the launch bounds promise (and the shared memory allows)
};

// Why the chunked delta kernels cannot run this variant at these sizes (empty: they can).
std::string chunked_delta_unsupported(const ir::Variant& variant, std::int64_t key_dim, std::int64_t value_dim);
// The spec's block_k and value_pad for these sizes.
ChunkedDeltaSpec chunked_delta_spec(const KernelTypes& types, std::int64_t key_dim, std::int64_t value_dim, ChunkedDeltaPhase phase);
// The work arrays' sizes in elements, for `chunks` chunks (over all sequences) and H heads: W and k
// [chunks][H][C][block_k], U and E [chunks][H][C][value_pad], h [chunks][H][block_k][value_pad] (bf16),
// gamma [chunks][H][C] (f32; KDA: G_last [chunks][H][block_k], log2), sized for both.
std::int64_t chunked_delta_w_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads);
std::int64_t chunked_delta_u_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads);
std::int64_t chunked_delta_h_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads);
std::int64_t chunked_delta_gamma_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads);

// Throws InvalidArgument for a variant the family does not run or a malformed spec.
ChunkedDeltaKernel generate_chunked_delta(const ir::Variant& variant, const ChunkedDeltaSpec& spec);

}  // namespace ladle::cuda
