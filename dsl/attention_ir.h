// The kernel IR of one softmax-attention variant: what dsl::softmax lowers to and what the
// CPU path and the CUDA tile generator walk. Beside q, k and v it holds two expressions
// over the pair (i, j) of a query and a key, and the masks whose structure a kernel can use
// to skip whole tiles:
//   logit_ij = score            (an expression of Op::score = q_i . k_j, the indices i, j,
//                                h, b, pair inputs [B,H,Tq,Tk], per-head inputs, scalars)
//   attend   = keep_ij != 0     (a predicate of the same; empty: every pair)
//              && j <= i + (Tk - Tq)                                   when causal
//              && i + (Tk-Tq) - left <= j <= i + (Tk-Tq) + right       when window
//              && q_segment[i] == kv_segment[j]                        when segment_ids
//   p_i      = softmax_j(logit_ij over attended j, with the sink logits in the denominator)
//   o_i      = sum_j dropout(p_ij) v_j
// The window sizes, the sink logits, the dropout rate and seed are run-time values; the
// flags say only that they exist, so that one kernel serves every window size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir.h"

namespace ladle::ir {

struct AttentionVariant {
  std::string name;            // for printouts and kernel names; not part of the hash
  std::vector<Input> inputs;   // q, k, v first (roles query, key, value), then by first use
  Expr score;                  // required
  Expr keep;                   // optional predicate
  bool causal = false;
  bool window = false;
  bool segment_ids = false;
  bool sinks = false;
  bool dropout = false;

  int find_input(const std::string& input_name) const;
};

// Everything wrong with a variant (empty: well formed): q, k, v missing or of the wrong
// kind, an input kind attention cannot index (per token over features), operands out of
// order, non-finite constants, an empty score.
std::vector<std::string> validate(const AttentionVariant& variant);

std::uint64_t hash(const AttentionVariant& variant);
std::string hash_hex(const AttentionVariant& variant);
std::string to_string(const AttentionVariant& variant);  // many lines, as dumps show it

}  // namespace ladle::ir
