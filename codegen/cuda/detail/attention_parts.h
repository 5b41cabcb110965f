// The pieces of a softmax-attention kernel's text (codegen/cuda/attention.h) that live outside
// cuda_attention.cpp: the steps both tensor-core paths share (attention_parts.cpp) and the
// Hopper wgmma path's own (attention_wgmma.cpp). Internal to codegen (not installed).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../attention.h"
#include "cuda_source.h"

namespace ladle::cuda::detail {

// What the pieces read of the kernel being generated.
struct AttentionParts {
  const ir::AttentionVariant& variant;
  const AttentionKernelSpec& spec;
  std::string logit_expression;  // log2 e * the score expression, rendered at (i, j) of score[nt][r]
  std::string keep_expression;   // empty: no user predicate
  // logit_expression is rest, the logit ladle_logit_factor * rest with a positive factor: maxima
  // in rest's units, p by one FFMA (else logit_expression is the whole logit).
  bool folded = false;
  bool qk_f16 = false, pv_f16 = false;  // f16 operands (else bf16)
  // ws: registers per thread after setmaxnreg (0: no setmaxnreg), producer and consumers.
  int producer_registers = 0, consumer_registers = 0;
  // Where the logits find a row's query token: per accumulator element r, per row half, and the
  // first and last token of the block's rows; lines that open each element's scope (decode: the
  // row's query head and what it reads per head).
  std::string row_token = "row0 + (r >= 2 ? 8 : 0)", half_token = "row0 + 8 * half";
  std::string first_token = "m0", last_token = "row_last";
  std::vector<std::string> element_prelude;
  // ws without dropout: each row's sum of p on the tensor cores, beside P V (P times a tile of ones
  // in shared memory: sum_acc[1][4], every column the row's sum), not by one FADD a score.
  bool tensor_sums = false;
};

// Declares one kernel parameter (C type, name, type, role), as each generator's own list does.
using AttentionParamFn = std::function<void(const std::string&, const std::string&, AttentionParam::Type, AttentionParam::Role)>;
// The parameters of the masks and the sequences both attention directions read, in one order:
// segment ids (when the variant has them, of these types), cu_seqlens (varlen), the window's
// edges, dropout's probability and seed.
void declare_mask_params(const AttentionParamFn& param, const ir::AttentionVariant& variant, DType q_segment_ids_type,
                         DType kv_segment_ids_type, bool varlen);
// The output's parameters (o and its strides, lse when the spec asks for it) and the sinks' (when
// the variant has them): the forward's and the decode form's merge kernel's, in one order.
void declare_output_params(const AttentionParamFn& param, const ir::AttentionVariant& variant, const AttentionKernelSpec& spec);
// The block's sequence n: q_bos, k_bos, q_len, k_len and the batch row b (cu_seqlens when varlen);
// emit_attention_sequence adds the forward's comment and reads B.
void emit_attention_bounds(Code& c, bool varlen);
void emit_attention_sequence(Code& c, bool varlen);
// Its query side alone: q_bos, q_len and b (the backward's prep kernel, the decode form's merge).
void emit_query_sequence(Code& c, bool varlen);
// The keys that rows first..last may attend, as [begin, end) narrowed in place (the caller declares
// both, 64-bit under a window, from 0 and the sequence's k_len): the causal and window edges
// around the diagonal j = i + (k_len - q_len).
// A leaf of a score expression: the score itself (the accumulator element `score`) or an index.
std::string attention_leaf(ir::Op op, const std::string& score);

void emit_key_range(Code& c, const ir::AttentionVariant& variant, const std::string& first, const std::string& last,
                    const std::string& begin, const std::string& end);
// Step 4: logit[BN / 8][4] (log2 units, -inf where masked) from score[BN / 8][4].
void emit_logits(Code& c, const AttentionParts& parts);
// Step 5: the online softmax of this tile's rows: p[BN / 8][4], row_max, row_sum, o_acc rescaled
// (defer_rescale: o_acc untouched, its factor per row half left in o_rescale[2]).
void emit_online_softmax(Code& c, const AttentionParts& parts, bool defer_rescale = false);
// o_acc *= o_rescale per row half, skipped where no row of the warp moved its maximum.
void emit_o_rescale(Code& c, const AttentionParts& parts);
// Step 7: o = o_acc / row_sum (sinks in the denominator), lse (the caller closes the kernel).
void emit_epilogue(Code& c, const AttentionParts& parts);

// ---- decode (attention_decode.cpp): a GQA group's query heads as rows, the keys split over blocks

// The split kernel's own parameters: the partial o and lse, their rows per (sequence, head), the
// keys per split.
void declare_decode_params(const AttentionParamFn& param);
// The block's (sequence, key/value head), packed rows, tokens and the key tiles of its split.
void emit_decode_range(Code& c, const ir::AttentionVariant& variant, bool varlen, const std::string& k_heads);
// Step 6b: the key warps of a row group merge their running maxima, sums and o into key warp 0's
// (the others return).
void emit_decode_key_merge(Code& c);
// Step 7 of the split kernel: each row's partial o and lse (log2 units); closes the kernel.
void emit_decode_partials(Code& c);
// The merge kernel `name` (its parameters into params): the splits combined by lse, the sinks in
// the denominator, o and lse stored as the forward stores them.
std::string decode_merge_kernel(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec, const std::string& name,
                                std::vector<AttentionParam>& params);

// ---- wgmma (sm_90a)

// The device helpers of the wgmma path: matrix descriptors, fences, and one wgmma.mma_async per
// shape the kernel uses (m64n<score_n>k16 from shared memory, m64n<out_n>k16 with A from
// registers). A host emulation defines LADLE_WGMMA_HELPERS and LADLE_WGMMA_EMULATED first.
std::string wgmma_helpers(int score_n, int out_n, bool qk_f16, bool pv_f16);
// One wgmma.mma_async specialisation, d[n / 8][4] += A B: ladle_wgmma_{ss,rs}_{bf16,f16}[_ta|_tb|_tab]<n>
// (registers_a: A from four registers per thread; trans_a / trans_b: an MN-major operand, ss only).
// Guarded, so that two products of one shape in a source define it once. The template itself is
// declared by wgmma_helpers (and wgmma_transposed_helpers for bf16 _tb / _tab).
std::string wgmma_product(bool registers_a, int n, bool f16, bool trans_a = false, bool trans_b = false);
// ladle_wgmma_ss_bf16_tb<n> (A K-major, B N-major) and ladle_wgmma_ss_bf16_tab<n> (both MN-major),
// after wgmma_helpers: the chunked ws form's products whose operands run along the tokens.
std::string wgmma_transposed_helpers(int n);
// The 16-bit element offset of (row, col) in a tile stored as 8 x 8 core matrices (8 rows of
// 16 contiguous bytes each, 128 bytes a matrix), core matrices row-major over the tile whose
// rows have `padded` columns: the no-swizzle layout wgmma's descriptors address.
std::string core_matrix_offset(const std::string& row, const std::string& col, const std::string& padded);
// Step 3 on wgmma: score[BN / 8][4] = q k^T for this warpgroup's 64 rows.
void emit_wgmma_scores(Code& c, const AttentionParts& parts);
// p[BN / 8][4] packed in 16-bit pairs into p_frag[BN / 16][4]: the A fragments of P V (the score
// accumulator layout is the A layout of m16n8k16 / m64nNk16 per warp).
void emit_pack_p(Code& c, const AttentionParts& parts);
// Step 6 on wgmma: o_acc += P V with P packed from p[BN / 8][4].
void emit_wgmma_pv(Code& c, const AttentionParts& parts);

// ---- ws: the warp-specialised TMA + mbarrier + wgmma pipeline (sm_90a; attention_ws.cpp)

// Device helpers: the tensor-map parameter type, mbarriers, TMA tensor copies, setmaxnreg and the
// 128-byte-swizzle descriptor. A host emulation defines LADLE_TENSOR_MAP_DEFINED and
// LADLE_PIPELINE_HELPERS first.
std::string ws_helpers();
// The shared-memory layout (q, the K and V rings, the mbarriers) and the barriers' initialisation.
void emit_ws_shared(Code& c, const AttentionParts& parts);
// The producer warpgroup: gives back registers, and one thread issues every TMA copy; returns.
void emit_ws_producer(Code& c, const AttentionParts& parts);
// The consumer warpgroups' key loop (steps 3 to 6, overlapped), after the per-row state is declared.
void emit_ws_consumer_loop(Code& c, const AttentionParts& parts);
// The persistent ws kernel (AttentionKernelSpec::persistent) after its signature: the shared
// layout, then both roles each walking the work items, with the generator's own parts for what an
// item is (its rows, head, sequence and key tiles, from `item`), the consumers' per-row state and
// the epilogue.
struct WsItemParts {
  std::function<void()> item_range, row_state, epilogue;
};
void emit_ws_persistent(Code& c, const AttentionParts& parts, const WsItemParts& item);

}  // namespace ladle::cuda::detail
