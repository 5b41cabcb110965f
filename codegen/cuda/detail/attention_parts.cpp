// The text both tensor-core paths of the softmax-attention family share (codegen/cuda/attention.h):
// the logit and keep expressions with the masks (step 4), the online softmax (step 5) and the
// normalised store (step 7). They read score[BN / 8][4] and o_acc[DVP / 8][4] in the mma.sync
// m16n8 accumulator layout, per warp: row gid (+ 8 for elements 2, 3), columns 2 tig and + 1 of
// each 8 columns. wgmma's m64nNk16 accumulator gives each warp of a warpgroup 16 rows in that
// same layout, so the text is one for both.
#include "attention_parts.h"

namespace ladle::cuda::detail {

std::string attention_leaf(ir::Op op, const std::string& score) {
  switch (op) {
    case ir::Op::score: return score;
    case ir::Op::query_index: return "static_cast<float>(i)";
    case ir::Op::key_index: return "static_cast<float>(j)";
    case ir::Op::head_index: return "static_cast<float>(h)";
    case ir::Op::batch_index: return "static_cast<float>(n)";
    default: break;
  }
  return "0.0f";
}

void declare_mask_params(const AttentionParamFn& param, const ir::AttentionVariant& variant, DType q_segment_ids_type,
                         DType kv_segment_ids_type, bool varlen) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  const auto segment_type = [](DType t) { return t == DType::i32 ? "const int*" : "const long long*"; };
  if (variant.segment_ids) {
    param(segment_type(q_segment_ids_type), "q_segment_ids", Type::pointer, Role::q_segment_ids);
    param("long long", "q_segment_stride_b", Type::i64, Role::q_segment_stride_b);
    param("long long", "q_segment_stride_t", Type::i64, Role::q_segment_stride_t);
    param(segment_type(kv_segment_ids_type), "kv_segment_ids", Type::pointer, Role::kv_segment_ids);
    param("long long", "kv_segment_stride_b", Type::i64, Role::kv_segment_stride_b);
    param("long long", "kv_segment_stride_t", Type::i64, Role::kv_segment_stride_t);
  }
  if (varlen) {
    param("const long long*", "cu_seqlens_q", Type::pointer, Role::cu_seqlens_q);
    param("const long long*", "cu_seqlens_k", Type::pointer, Role::cu_seqlens_k);
  }
  if (variant.window) {
    param("long long", "window_left", Type::i64, Role::window_left);
    param("long long", "window_right", Type::i64, Role::window_right);
  }
  if (variant.dropout) {
    param("float", "dropout_p", Type::f32, Role::dropout_p);
    param("unsigned long long", "seed", Type::u64, Role::seed);
  }
}

void declare_output_params(const AttentionParamFn& param, const ir::AttentionVariant& variant, const AttentionKernelSpec& spec) {
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  param(std::string(storage_type(spec.output_type)) + "*", "o", Type::pointer, Role::output);
  param("long long", "o_stride_b", Type::i64, Role::output_stride_b);
  param("long long", "o_stride_t", Type::i64, Role::output_stride_t);
  param("long long", "o_stride_h", Type::i64, Role::output_stride_h);
  param("long long", "o_stride_d", Type::i64, Role::output_stride_d);
  if (spec.lse) param("float*", "lse", Type::pointer, Role::lse);
  if (variant.sinks) {
    param("const " + std::string(storage_type(spec.sinks_type)) + "*", "softmax_aux", Type::pointer, Role::softmax_aux);
    param("long long", "softmax_aux_stride_h", Type::i64, Role::softmax_aux_stride_h);
    param("long long", "softmax_aux_stride_s", Type::i64, Role::softmax_aux_stride_s);
    param("int", "sinks", Type::i32, Role::sinks);
  }
}

void emit_attention_bounds(Code& c, bool varlen) {
  if (varlen) {
    c("const long long q_bos = cu_seqlens_q[n], k_bos = cu_seqlens_k[n];");
    c("const int q_len = static_cast<int>(cu_seqlens_q[n + 1] - q_bos), k_len = static_cast<int>(cu_seqlens_k[n + 1] - k_bos);");
    c("const int b = 0;");
  } else {
    c("const long long q_bos = 0, k_bos = 0;");
    c("const int q_len = Tq, k_len = Tk, b = n;");
  }
}

void emit_attention_sequence(Code& c, bool varlen) {
  c("// The sequence: its first query and key, their counts, the batch row.");
  emit_attention_bounds(c, varlen);
  c("(void)B;");
}

void emit_query_sequence(Code& c, bool varlen) {
  if (varlen) {
    c("const long long q_bos = cu_seqlens_q[n];");
    c("const int q_len = static_cast<int>(cu_seqlens_q[n + 1] - q_bos), b = 0;");
  } else {
    c("const long long q_bos = 0;");
    c("const int q_len = Tq, b = n;");
  }
}

void emit_key_range(Code& c, const ir::AttentionVariant& variant, const std::string& first, const std::string& last,
                    const std::string& begin, const std::string& end) {
  if (variant.causal) c("if (" + last + " + diagonal + 1 < " + end + ") " + end + " = " + last + " + diagonal + 1;");
  if (variant.window) {
    c("if (window_right >= 0 && " + last + " + diagonal + window_right + 1 < " + end + ") " + end + " = " + last +
      " + diagonal + window_right + 1;");
    c("if (window_left >= 0 && " + first + " + diagonal - window_left > " + begin + ") " + begin + " = " + first +
      " + diagonal - window_left;");
  }
}

void emit_logits(Code& c, const AttentionParts& parts) {
  const ir::AttentionVariant& variant = parts.variant;
  const std::string& logit_expression = parts.logit_expression;
  const std::string& keep_expression = parts.keep_expression;
  // The keys each of this thread's two rows may attend, key_lo..key_hi (the sequence, causal,
  // window; none for a row past the sequence), formed once per tile (in 64 bits under a window):
  // the per-element test is then two 32-bit compares.
  const auto emit_row_ranges = [&] {
    const std::string wide = variant.window ? "long long" : "int";  // window sizes are 64-bit
    c("int key_lo[2], key_hi[2];");
    c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c.in();
    c("const " + wide + " i = " + parts.half_token + ";");
    c(wide + " lo = 0, end = k_len;");
    emit_key_range(c, variant, "i", "i", "lo", "end");
    c("key_lo[half] = static_cast<int>(lo < k_len ? lo : k_len);");
    c("key_hi[half] = row_live[half] && end > 0 ? static_cast<int>(end - 1) : -1;");
    c.out();
    c("}");
  };
  const std::string& first = parts.first_token;
  const std::string& last = parts.last_token;
  std::string interior = "j0 + BN <= k_len";
  if (variant.causal) interior += " && j0 + BN - 1 <= " + first + " + diagonal";
  if (variant.window)
    interior += " && (window_left < 0 || j0 >= " + last + " + diagonal - window_left) && (window_right < 0 || j0 + BN - 1 <= " + first +
                " + diagonal + window_right)";
  const auto prelude = [&] {
    for (const std::string& line : parts.element_prelude) c(line);
  };
  c("// 4. logit = " + ir::to_string(variant.inputs, variant.score) +
    (parts.folded ? " (its rest: log2 units / ladle_logit_factor), -inf where masked. Only a" : " (in log2 units), -inf where masked. Only a"));
  c("//    tile that crosses the edge of the sequence or of the causal / window range tests it per element.");
  c("const bool boundary = !(" + interior + ");");
  c("float logit[BN / 8][4];");
  // A variant whose every test lies in the structured range (no segment ids, no user predicate)
  // and which reads no pair input (a row past the sequence would read past the input) needs no
  // test at all inside the range: its interior tiles take a branch of plain logits. Rows past
  // the sequence then hold finite logits of zero-filled or neighbouring q rows, never stored.
  bool pair_input = false;
  for (const ir::Expr* e : {&variant.score, &variant.keep})
    for (const ir::Node& node : e->nodes)
      if (node.op == ir::Op::input && variant.inputs[node.input].kind == ir::InputKind::pair) pair_input = true;
  const bool plain_interior = !variant.segment_ids && keep_expression.empty() && !pair_input;
  if (plain_interior) {
    c("if (!boundary) {");
    c("  LADLE_UNROLL for (int nt = 0; nt < BN / 8; ++nt)");
    c("    LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c("      const int i = " + parts.row_token + ", j = j0 + nt * 8 + tig * 2 + (r & 1);");
    c("      (void)i, (void)j;");
    c.in(), c.in(), c.in();
    prelude();
    c.out(), c.out(), c.out();
    c("      logit[nt][r] = " + logit_expression + ";");
    c("    }");
    c("} else {");
    c.in();
  }
  if (!plain_interior) c("(void)boundary;  // the row ranges below hold the structured masks");
  emit_row_ranges();
  c("LADLE_UNROLL for (int nt = 0; nt < BN / 8; ++nt)");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
  c.in();
  c("  const int i = " + parts.row_token + ", j = j0 + nt * 8 + tig * 2 + (r & 1);");
  c("  (void)i;");
  c.in();
  prelude();
  c.out();
  std::string attend = "j >= key_lo[r / 2] && j <= key_hi[r / 2]";
  if (variant.segment_ids)
    attend += " && q_segment[r / 2] == static_cast<long long>(kv_segment_ids[b * kv_segment_stride_b + (k_bos + j) * kv_segment_stride_t])";
  if (!keep_expression.empty()) attend += " && (" + keep_expression + ") != 0.0f";
  c("  const bool attend = " + attend + ";");
  c("  logit[nt][r] = attend ? " + logit_expression + " : ladle_neg_inf();");
  c.out();
  c("  }");
  if (plain_interior) {
    c.out();
    c("}");
  }
  c("");
}

void emit_online_softmax(Code& c, const AttentionParts& parts, bool defer_rescale) {
  const ir::AttentionVariant& variant = parts.variant;
  c("// 5. Online softmax per row: the new maximum, the rescale of what came before, p = 2^(logit - max).");
  c("//    The running maximum moves only when the tile's exceeds it by more than 8 (log2 units): p may");
  c("//    reach 2^8, exactly accounted for, and o_acc's rescale is skipped where no row of the warp moved.");
  if (defer_rescale) c("//    o_acc is still being written by the previous tile's P V: its rescale waits in o_rescale.");
  c("float p[BN / 8][4];");
  c("float o_rescale[2];");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("// Four independent partial maxima and sums: no chain of BN / 4 dependent instructions.");
  c("float part[4] = {ladle_neg_inf(), ladle_neg_inf(), ladle_neg_inf(), ladle_neg_inf()};");
  c("LADLE_UNROLL for (int nt = 0; nt < BN / 8; ++nt) part[nt % 4] = fmaxf(part[nt % 4], fmaxf(logit[nt][2 * half], logit[nt][2 * half + 1]));");
  c("const float tile_max = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));");
  c("const float tile_top = ladle_quad_max(tile_max);");
  c("o_rescale[half] = 1.0f;");
  if (parts.folded) {
    c("if ((tile_top - row_max[half]) * ladle_logit_factor > 8.0f) {  // also the first finite maximum (row_max -inf)");
    c("  o_rescale[half] = ladle_exp2((row_max[half] - tile_top) * ladle_logit_factor);");
  } else {
    c("if (tile_top > row_max[half] + 8.0f) {  // also the first finite maximum (row_max -inf)");
    c("  o_rescale[half] = ladle_exp2(row_max[half] - tile_top);");
  }
  c("  row_max[half] = tile_top;");
  if (!parts.tensor_sums) c("  row_sum[half] *= o_rescale[half];");
  c("}");
  if (parts.folded)
    c("const float neg_base = row_max[half] == ladle_neg_inf() ? 0.0f : -row_max[half] * ladle_logit_factor;  // p = 0, no NaN");
  else
    c("const float base = row_max[half] == ladle_neg_inf() ? 0.0f : row_max[half];  // nothing attended yet: p = 0, no NaN");
  if (!defer_rescale) {
    c("if (ladle_warp_any(o_rescale[half] != 1.0f))  // a row's maximum moved");
    c("  LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) o_acc[nt][2 * half] *= o_rescale[half], o_acc[nt][2 * half + 1] *= o_rescale[half];");
  }
  c("part[0] = part[1] = part[2] = part[3] = 0.0f;");
  c("LADLE_UNROLL for (int nt = 0; nt < BN / 8; ++nt)");
  c("  LADLE_UNROLL for (int r = 2 * half; r < 2 * half + 2; ++r) {");
  c(parts.folded ? "    p[nt][r] = ladle_exp2(fmaf(logit[nt][r], ladle_logit_factor, neg_base));"
                 : "    p[nt][r] = ladle_exp2(logit[nt][r] - base);");
  if (!parts.tensor_sums) c("    part[nt % 4] += p[nt][r];");
  if (variant.dropout) {
    c("    // dropout: the denominator keeps p, the product with V sees the kept values, rescaled");
    c("    const int i = row0 + (r >= 2 ? 8 : 0), j = j0 + nt * 8 + tig * 2 + (r & 1);");
    c("    const float u = ladle_dropout_uniform(seed, n, h, i, j);");
    c("    p[nt][r] = u >= dropout_p ? p[nt][r] * keep_scale : 0.0f;");
  }
  c("  }");
  if (!parts.tensor_sums) c("row_sum[half] += (part[0] + part[1]) + (part[2] + part[3]);");
  c.out();
  c("}");
  c("");
}

void emit_o_rescale(Code& c, const AttentionParts& parts) {
  c("if (ladle_warp_any(o_rescale[0] != 1.0f || o_rescale[1] != 1.0f)) {  // a row's maximum moved");
  c("  LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt)");
  c("    o_acc[nt][0] *= o_rescale[0], o_acc[nt][1] *= o_rescale[0], o_acc[nt][2] *= o_rescale[1], o_acc[nt][3] *= o_rescale[1];");
  if (parts.tensor_sums)
    c("  sum_acc[0][0] *= o_rescale[0], sum_acc[0][1] *= o_rescale[0], sum_acc[0][2] *= o_rescale[1], sum_acc[0][3] *= o_rescale[1];");
  c("}");
}

void emit_epilogue(Code& c, const AttentionParts& parts) {
  const ir::AttentionVariant& variant = parts.variant;
  const AttentionKernelSpec& spec = parts.spec;
  c("// 7. Normalise and store: the row sum over the quad" + std::string(variant.sinks ? ", the sink logits join the denominator" : "") +
    "; a row with nothing");
  c("//    attended gets o = 0" + std::string(spec.lse ? " and lse = -inf." : "."));
  const bool pairs = spec.Dv % 2 == 0;  // col < DV then implies col + 1 < DV
  if (pairs) {
    c("// Both columns of a thread's pair in one store where o's rows allow it: unit stride over Dv, even");
    c("// strides, a base aligned to the pair.");
    c("const bool o_pairs = o_stride_d == 1 && ((o_stride_b | o_stride_t | o_stride_h) & 1) == 0 &&");
    c("                     (reinterpret_cast<unsigned long long>(o) & (2 * sizeof(*o) - 1)) == 0;");
  }
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c(std::string(parts.tensor_sums ? "float sum = sum_acc[0][2 * half]" : "float sum = ladle_quad_sum(row_sum[half])") +
    ", top = row_max[half]" + (parts.folded ? " * ladle_logit_factor" : "") + ", scale_o = 1.0f;  // top in log2 units" +
    (parts.tensor_sums ? " (the sum: P times ones, all of the row's keys)" : ""));
  if (variant.sinks) {
    c("{");
    c.in();
    c("float with_sinks = top;");
    c("for (int s = 0; s < sinks; ++s) with_sinks = fmaxf(with_sinks, LOG2E * ladle_load(softmax_aux + h * softmax_aux_stride_h + s * softmax_aux_stride_s));");
    c("scale_o = with_sinks > top ? ladle_exp2(top - with_sinks) : 1.0f;");
    c("sum *= scale_o;");
    c("for (int s = 0; s < sinks; ++s) sum += ladle_exp2(LOG2E * ladle_load(softmax_aux + h * softmax_aux_stride_h + s * softmax_aux_stride_s) - with_sinks);");
    c("top = with_sinks;");
    c.out();
    c("}");
  }
  c("const int i = row0 + half * 8;");
  c("if (!row_live[half]) continue;");
  c("const float inv = sum > 0.0f ? scale_o / sum : 0.0f;");
  c(std::string(storage_type(spec.output_type)) + "* const o_row = o + b * o_stride_b + (q_bos + i) * o_stride_t + h * o_stride_h;");
  if (pairs) {
    c("if (o_pairs) {");
    c("  LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt)");
    c("    if (nt * 8 + tig * 2 < DV) ladle_store_pair(o_row + nt * 8 + tig * 2, o_acc[nt][2 * half] * inv, o_acc[nt][2 * half + 1] * inv);");
    c("} else {");
    c.in();
  }
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) {");
  c("  const int col = nt * 8 + tig * 2;");
  c("  if (col < DV) ladle_store(o_row + col * o_stride_d, o_acc[nt][2 * half] * inv);");
  c("  if (col + 1 < DV) ladle_store(o_row + (col + 1) * o_stride_d, o_acc[nt][2 * half + 1] * inv);");
  c("}");
  if (pairs) {
    c.out();
    c("}");
  }
  if (spec.lse)
    c("if (tig == 0) lse[(static_cast<long long>(b) * H + h) * Tq + q_bos + i] = sum > 0.0f ? (top + log2f(sum)) * LN2 : ladle_neg_inf();");
  else
    c("(void)top; (void)LN2;");
  c.out();
  c("}");
}

}  // namespace ladle::cuda::detail
