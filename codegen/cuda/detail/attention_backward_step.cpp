// One step of the attention backward's main kernel: a query head's tile of 64 queries against the
// block's 128 keys (two warpgroups of 64). S^T = K q^T and dP^T = V do^T on wgmma, the element-wise
// P, dS and input gradients, dV += P^T do and dK += dS^T q from registers, dQ = dS K through dS^T in
// shared memory, added into dq by TMA reductions or red.global.
#include "attention_backward.h"

namespace ladle::cuda::detail {

namespace {

std::string storage(DType t) { return t == DType::u8 ? "unsigned char" : storage_type(t); }

std::string pack(const AttentionBackwardParts& parts) { return parts.f16 ? "ladle_pack_f16" : "ladle_pack_bf16"; }

// The step's query head and tile, its row statistics, what the logit reads of the inputs there.
void emit_step_inputs(Code& c, const AttentionBackwardParts& parts) {
  c("const int h = hk * group + step / tiles, m0 = (tile_begin + step % tiles) * BM, stage = step % STAGES;");
  c("(void)h;");
  c("const float2* const stats = stats_s + (step & 1) * BM;  // this step's, stored at the last step's barrier");
  c("float2 next_stats = make_float2(0.0f, 0.0f);");
  c("if (threadIdx.x < BM && step + 1 < steps) next_stats = load_stats(step + 1);  // in flight through the step");
  emit_step_values(c, parts);
}

}  // namespace

void emit_step_values(Code& c, const AttentionBackwardParts& parts) {
  const auto& inputs = parts.variant.inputs;
  const std::vector<std::string>& id = parts.id;
  for (std::size_t k = 3; k < inputs.size(); ++k) {
    if (!parts.used[k] && !parts.gradient[k]) continue;
    if (inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h);");
    if (inputs[k].kind == ir::InputKind::pair) {
      c("const " + storage(parts.spec.input_types[k]) + "* const " + id[k] + "_bh = " + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h;");
      if (parts.gradient[k])
        c("float* const d_" + id[k] + "_bh = d_" + id[k] + " + b * d_" + id[k] + "_stride_b + h * d_" + id[k] + "_stride_h;");
    }
  }
  const HoistedExpression& hoisted = parts.hoisted;
  if (!hoisted.invariants.empty()) {
    c("// The logit's factors that no (query, key) pair changes (log2 units).");
    for (std::size_t k = 0; k < hoisted.invariants.size(); ++k)
      c("const float " + hoisted.inputs[hoisted.first_hoisted + k].name + " = " +
        ir::render_c(inputs, hoisted.invariants[k], attention_backward_load(id), attention_backward_leaf, ir::RenderFunctions{"ladle_tanh"}) +
        ";");
  }
}

namespace {

// Step 3: S^T and dP^T, the keys as rows.
void emit_transposed_scores(Code& c, const AttentionBackwardParts& parts) {
  c("// 3. S^T = K q^T and dP^T = V do^T for this warpgroup's 64 keys and the tile's 64 queries.");
  c("float s_acc[BM / 8][4], dp_acc[BM / 8][4];");
  c("ladle_wgmma_fence_operand<BM>(s_acc);");
  c("ladle_wgmma_fence_operand<BM>(dp_acc);");
  c("ladle_wgmma_fence();");
  const std::string ss = parts.f16 ? "ladle_wgmma_ss_f16<BM>" : "ladle_wgmma_ss_bf16<BM>";
  c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt)");
  c("  " + ss + "(s_acc, k_desc + ((kt / 4) * BN * 64 + (kt % 4) * 16) * 2 / 16,");
  c("      q_desc + (stage * Q_BYTES + ((kt / 4) * BM * 64 + (kt % 4) * 16) * 2) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int kt = 0; kt < DVP / 16; ++kt)");
  c("  " + ss + "(dp_acc, v_desc + ((kt / 4) * BN * 64 + (kt % 4) * 16) * 2 / 16,");
  c("      do_desc + (stage * DO_BYTES + ((kt / 4) * BM * 64 + (kt % 4) * 16) * 2) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<BM>(s_acc);");
  c("ladle_wgmma_fence_operand<BM>(dp_acc);");
  c("");
}

// Step 4 over the step's elements (tested: each (query, key) tested against the sequences and
// the masks; else every one attends).
void emit_element_gradients(Code& c, const AttentionBackwardParts& parts, bool tested) {
  const ir::AttentionVariant& variant = parts.variant;
  const auto& inputs = variant.inputs;
  const std::vector<std::string>& id = parts.id;
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk) {");
  c.in();
  c("float pd[2][4], ds[2][4];  // columns 16 kk.. (two accumulator column blocks), packed as soon as formed");
  c("LADLE_UNROLL for (int x = 0; x < 2; ++x)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c.in();
  c("  const int nt = 2 * kk + x, i = m0 + nt * 8 + tig * 2 + e;");
  c("  const float2 st = stats[nt * 8 + tig * 2 + e];  // lse (log2 units) and delta of query i");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("  const int r = 2 * half + e, j = key_row[half];");
  c("  (void)j;");
  if (tested) {
    std::string attend = "i < q_len && j < k_len";
    if (variant.causal) attend += " && j <= i + diagonal";
    if (variant.window)
      attend += " && (window_left < 0 || j >= static_cast<long long>(i) + diagonal - window_left) && "
                "(window_right < 0 || j <= static_cast<long long>(i) + diagonal + window_right)";
    if (variant.segment_ids)
      attend += " && kv_segment[half] == static_cast<long long>(q_segment_ids[b * q_segment_stride_b + (q_bos + i) * q_segment_stride_t])";
    if (!parts.keep_expression.empty()) attend += " && (" + parts.keep_expression + ") != 0.0f";
    c("  const bool attend = " + attend + ";");
  } else {
    c("  constexpr bool attend = true;");
  }
  c("  float p = 0.0f, dl = 0.0f, keep = 1.0f;");
  c("  if (attend) {");
  c("    p = ladle_exp2(" + parts.logit_expression + " - st.x);");
  if (variant.dropout)
    c("    keep = ladle_dropout_uniform(seed, n, h, i, j) >= dropout_p ? keep_scale : 0.0f;");
  c("    dl = p * (dp_acc[nt][r] * keep - st.y);");
  c("  }");
  c("  pd[x][r] = p * keep;");
  c("  ds[x][r] = attend ? dl * (" + parts.dscore_expression + ") : 0.0f;");
  for (std::size_t k = 3; k < inputs.size(); ++k) {
    if (parts.dinput_expression[k].empty()) continue;
    // sync: the first column part adds them; split ws: warpgroup 0.
    const std::string live = parts.input_guard.empty() ? "dl != 0.0f" : parts.input_guard + " && dl != 0.0f";
    if (inputs[k].kind == ir::InputKind::pair)
      c("  if (" + live + ") ladle_red_add_f32(d_" + id[k] + "_bh + (q_bos + i) * d_" + id[k] + "_stride_t + (k_bos + j) * d_" + id[k] +
        "_stride_d, dl * (" + parts.dinput_expression[k] + "));");
    else
      c("  if (" + live + ") acc_" + id[k] + " += dl * (" + parts.dinput_expression[k] + ");");
  }
  c.out();
  c("  }");
  c.out();
  c("  }");
  const std::string pk = pack(parts);
  if (parts.split) {
    c("// Split: the bf16 halves hi (p_frag, ds_frag) and lo = x - hi (p_lo, ds_lo).");
    c("p_lo[kk][0] = ladle_pack_lo_bf16(pd[0][0], pd[0][1]);");
    c("p_lo[kk][1] = ladle_pack_lo_bf16(pd[0][2], pd[0][3]);");
    c("p_lo[kk][2] = ladle_pack_lo_bf16(pd[1][0], pd[1][1]);");
    c("p_lo[kk][3] = ladle_pack_lo_bf16(pd[1][2], pd[1][3]);");
    c("ds_lo[kk][0] = ladle_pack_lo_bf16(ds[0][0], ds[0][1]);");
    c("ds_lo[kk][1] = ladle_pack_lo_bf16(ds[0][2], ds[0][3]);");
    c("ds_lo[kk][2] = ladle_pack_lo_bf16(ds[1][0], ds[1][1]);");
    c("ds_lo[kk][3] = ladle_pack_lo_bf16(ds[1][2], ds[1][3]);");
  }
  c("p_frag[kk][0] = " + pk + "(pd[0][0], pd[0][1]);");
  c("p_frag[kk][1] = " + pk + "(pd[0][2], pd[0][3]);");
  c("p_frag[kk][2] = " + pk + "(pd[1][0], pd[1][1]);");
  c("p_frag[kk][3] = " + pk + "(pd[1][2], pd[1][3]);");
  c("ds_frag[kk][0] = " + pk + "(ds[0][0], ds[0][1]);");
  c("ds_frag[kk][1] = " + pk + "(ds[0][2], ds[0][3]);");
  c("ds_frag[kk][2] = " + pk + "(ds[1][0], ds[1][1]);");
  c("ds_frag[kk][3] = " + pk + "(ds[1][2], ds[1][3]);");
  c.out();
  c("}");
}

}  // namespace

// Step 4: P and dS packed as the A fragments of dV and dK, the inputs' gradients added. Interior
// steps (every (query, key) of the warpgroup's part inside both sequences and the structured masks,
// and no per-element test besides: no segment ids, no predicate) skip the tests.
void emit_elements(Code& c, const AttentionBackwardParts& parts) {
  const ir::AttentionVariant& variant = parts.variant;
  const bool plain_interior = !variant.segment_ids && parts.keep_expression.empty();
  const std::string& key0 = parts.key_base;  // the first of the warpgroup's 64 keys
  std::string interior = "m0 + BM <= q_len && " + key0 + " + 64 <= k_len";
  if (variant.causal) interior += " && " + key0 + " + 63 <= m0 + diagonal";
  if (variant.window)
    interior += " && (window_left < 0 || " + key0 + " >= m0 + BM - 1 + diagonal - window_left) && "
                "(window_right < 0 || " + key0 + " + 63 <= m0 + diagonal + window_right)";
  c("// 4. P = 2^(logit - lse), dlogit = P (dP - delta), dS = dlogit * d logit / d score, per element; masked: 0.");
  c("//    P (times the dropout keep) and dS packed in 16-bit pairs are the A operands of dV and dK.");
  c("unsigned p_frag[BM / 16][4], ds_frag[BM / 16][4];");
  if (parts.split) c("unsigned p_lo[BM / 16][4], ds_lo[BM / 16][4];");
  if (plain_interior) {
    c("if (" + interior + ") {");
    c.in();
    emit_element_gradients(c, parts, false);
    c.out();
    c("} else {");
    c.in();
    emit_element_gradients(c, parts, true);
    c.out();
    c("}");
  } else {
    emit_element_gradients(c, parts, true);
  }
}

namespace {

void emit_ds_transposed_store(Code& c, const AttentionBackwardParts& parts) {
  c("// dS^T into shared memory for dQ: row = key (128 bytes: the tile's 64 queries), 16-byte piece p of row r at");
  c("// p ^ r % 8 (TMA's 128-byte swizzle, which the descriptor names). Buffers alternate by step: the other");
  c("// warpgroup may still read the last step's.");
  c("{");
  c.in();
  c("unsigned char* const ds_base = ds_tile + (step & 1) * DS_BYTES;");
  if (parts.column_split) {
    c("if (warpgroup == 0) {  // both warpgroups formed the same dS^T");
    c.in();
  }
  c("LADLE_UNROLL for (int nt = 0; nt < BM / 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int kr = warp * 16 + gid + 8 * half;");
  c("    *reinterpret_cast<unsigned*>(ds_base + kr * 128 + ((nt ^ (kr % 8)) * 16) + tig * 4) = ds_frag[nt / 2][(nt % 2) * 2 + half];");
  c("  }");
  if (parts.column_split) {
    c.out();
    c("}");
  }
  c.out();
  c("}");
}

// Steps 5 and 6: dV and dK from registers, then dQ = dS K once both warpgroups' dS^T is stored.
void emit_gradient_products(Code& c, const AttentionBackwardParts& parts) {
  const std::string rs_dv = std::string(parts.f16 ? "ladle_wgmma_rs_f16" : "ladle_wgmma_rs_bf16") + "<DVP>";
  const std::string rs_dk = std::string(parts.f16 ? "ladle_wgmma_rs_f16" : "ladle_wgmma_rs_bf16") + "<DP>";
  const std::string tab = std::string(parts.f16 ? "ladle_wgmma_ss_f16_tab" : "ladle_wgmma_ss_bf16_tab") + "<64>";
  c("// 5. dV += P^T do and dK += dS^T q (A from registers, 16 queries per product).");
  c("ladle_wgmma_fence_operand<DVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<DP>(dk_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs_dv + "(dv_acc, p_frag[kk], don_desc + (stage * DO_BYTES + kk * 2048) / 16);");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs_dk + "(dk_acc, ds_frag[kk], qn_desc + (stage * Q_BYTES + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("// 6. dQ = dS K over the block's 128 keys: warpgroup w takes D's columns 64 w.. (warpgroup 1 idles at DP <= 64).");
  c("ladle_fence_proxy_async();  // dS^T's stores, visible to wgmma");
  c("if (threadIdx.x < BM && step + 1 < steps) stats_s[((step + 1) & 1) * BM + threadIdx.x] = next_stats;");
  if (parts.spec.dq_tma)
    c("if (threadIdx.x % 128 == 0) ladle_bulk_wait_read();  // the last step's reductions have read this warpgroup's dQ stage");
  c("ladle_named_barrier_sync(1, 256);  // both warpgroups' dS^T stored, the next step's statistics too" +
    std::string(parts.spec.dq_tma ? ", the dQ stages free" : ""));
  c("float dq_acc[8][4];");
  c("const bool dq_part = warpgroup * 64 < DP;");
  c("if (dq_part) {");
  c.in();
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk)");
  c("  " + tab + "(dq_acc, ds_desc + ((step & 1) * DS_BYTES + kk * 2048) / 16, kn_desc + kk * 2048 / 16, kk > 0);");
  c("ladle_wgmma_commit();");
  c.out();
  c("}");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<DVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<DP>(dk_acc);");
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
}

// Split ws (head dims past 128), steps 5 and 6: each warpgroup's columns of dV and dK from registers
// (warpgroup 0 the first 128, warpgroup 1 the rest), then the barrier after dS^T's store.
void emit_split_key_products(Code& c, const AttentionBackwardParts& parts) {
  const std::string rs = parts.f16 ? "ladle_wgmma_rs_f16" : "ladle_wgmma_rs_bf16";
  c("// 5. dV += P^T do and dK += dS^T q over this warpgroup's columns (A from registers, 16 queries per product).");
  c("ladle_wgmma_fence_operand<CDVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<CDP>(dk_acc);");
  c("ladle_wgmma_fence();");
  c("if (warpgroup == 0) {");
  c.in();
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs + "<CDVP>(dv_acc, p_frag[kk], don_desc + (stage * DO_BYTES + kk * 2048) / 16);");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
  c("  " + rs + "<CDP>(dk_acc, ds_frag[kk], qn_desc + (stage * Q_BYTES + kk * 2048) / 16);");
  c.out();
  c("} else {  // columns 128.. (q's and do's boxes 2..)");
  c.in();
  if (parts.DVP > 128) {
    const std::string n = std::to_string(parts.DVP - 128);
    c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
    c("  " + rs + "<" + n + ">(reinterpret_cast<float (&)[" + n + " / 8][4]>(dv_acc), p_frag[kk], don_desc + (stage * DO_BYTES + 2 * BM * 128 + kk * 2048) / 16);");
  }
  if (parts.DP > 128) {
    const std::string n = std::to_string(parts.DP - 128);
    c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk)");
    c("  " + rs + "<" + n + ">(reinterpret_cast<float (&)[" + n + " / 8][4]>(dk_acc), ds_frag[kk], qn_desc + (stage * Q_BYTES + 2 * BM * 128 + kk * 2048) / 16);");
  }
  c.out();
  c("}");
  c("ladle_wgmma_commit();");
  c("ladle_fence_proxy_async();  // dS^T's stores, visible to wgmma");
  c("if (threadIdx.x < BM && step + 1 < steps) stats_s[((step + 1) & 1) * BM + threadIdx.x] = next_stats;");
  c("ladle_named_barrier_sync(1, 256);  // dS^T stored, the next step's statistics too");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<CDVP>(dv_acc);");
  c("ladle_wgmma_fence_operand<CDP>(dk_acc);");
}

// Split ws: dQ = dS K over the block's 64 keys, warpgroup w D's columns 128 w.., 64 at a time, added
// into dq by red.global (after the stage's release: dQ reads dS^T and K only).
void emit_split_dq(Code& c, const AttentionBackwardParts& parts) {
  const std::string tab = std::string(parts.f16 ? "ladle_wgmma_ss_f16_tab" : "ladle_wgmma_ss_bf16_tab") + "<64>";
  c("// 6. dQ = dS K over the block's 64 keys: warpgroup w takes D's columns 128 w.., 64 at a time.");
  c("float* const dq_head = dq + b * dq_stride_b + h * dq_stride_h;");
  c("LADLE_UNROLL for (int chunk = 0; chunk < 2; ++chunk) {");
  c.in();
  c("const int col0 = warpgroup * 128 + chunk * 64;");
  c("if (col0 >= DP) break;");
  c("float dq_acc[8][4];");
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk)");
  c("  " + tab + "(dq_acc, ds_desc + ((step & 1) * DS_BYTES + kk * 2048) / 16, kn_desc + (chunk * BN * 128 + kk * 2048) / 16, kk > 0);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<64>(dq_acc);");
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int i = m0 + (warp % 4) * 16 + gid + 8 * half, col = col0 + nt * 8 + tig * 2;");
  c("    if (i < q_len && col < D) ladle_red_add_f32x2(dq_head + (q_bos + i) * dq_stride_t + col, dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
  c("  }");
  c.out();
  c("}");
}

// dQ of the step added into dq: staged and reduced by TMA (dq_tma), else red.global from registers.
void emit_dq_store(Code& c, const AttentionBackwardParts& parts) {
  if (parts.spec.dq_tma) {
    c("// dQ into this warpgroup's stage (row r, column 32 x + c of box x at byte r 128 + ((c / 4) ^ r % 8) 16 + c % 4 * 4),");
    c("// then one thread adds the boxes into dq by TMA (rows past the sequence are zero; past the tensor, dropped).");
    c("unsigned char* const stage_boxes = dq_stage + warpgroup * 2 * BM * 128;");
    c("if (dq_part) {");
    c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("      const int r = (warp % 4) * 16 + gid + 8 * half, c = (nt % 4) * 8 + tig * 2;");
    c("      *reinterpret_cast<float2*>(stage_boxes + (nt / 4) * BM * 128 + r * 128 + (((c / 4) ^ (r % 8)) * 16) + (c % 4) * 4) =");
    c("          make_float2(dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
    c("    }");
    c("  ladle_fence_proxy_async();  // the stage's stores, visible to the TMA unit");
    c("}");
    c("ladle_named_barrier_sync(2 + warpgroup, 128);  // this warpgroup's stage written");
    c("if (dq_part && threadIdx.x % 128 == 0) {");
    c("  LADLE_UNROLL for (int x = 0; x < 2; ++x)");
    c("    if (warpgroup * 64 + x * 32 < D)");
    c("      ladle_tma_reduce_add_4d(&dq_map, stage_boxes + x * BM * 128, warpgroup * 64 + x * 32, static_cast<int>(q_bos) + m0, h, b);");
    c("  ladle_bulk_commit();");
    c("}");
  } else {
    c("if (dq_part) {");
    c.in();
    c("float* const dq_head = dq + b * dq_stride_b + h * dq_stride_h;");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int i = m0 + (warp % 4) * 16 + gid + 8 * half, col = warpgroup * 64 + nt * 8 + tig * 2;");
    c("    if (i < q_len && col < D) ladle_red_add_f32x2(dq_head + (q_bos + i) * dq_stride_t + col, dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
    c("  }");
    c.out();
    c("}");
  }
}

}  // namespace

// The gradients of head inputs: each warp's sum added once per head, after its last step.
void emit_head_input_gradients(Code& c, const AttentionBackwardParts& parts) {
  const auto& inputs = parts.variant.inputs;
  const std::vector<std::string>& id = parts.id;
  for (std::size_t k = 3; k < inputs.size(); ++k)
    if (!parts.dinput_expression[k].empty() && inputs[k].kind == ir::InputKind::head) {
      c("// d " + inputs[k].name + ": this warp's sum, one atomic per warp and head.");
      c("if (step + 1 == steps || (step + 1) % tiles == 0) {");
      c("  float x = acc_" + id[k] + ";");
      c("  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);");
      c("  if (lane == 0 && x != 0.0f) ladle_red_add_f32(d_" + id[k] + " + b * d_" + id[k] + "_stride_b + h * d_" + id[k] + "_stride_h, x);");
      c("  acc_" + id[k] + " = 0.0f;");
      c("}");
    }
}

void emit_attention_backward_steps(Code& c, const AttentionBackwardParts& parts) {
  c("for (int step = 0; step < steps; ++step) {");
  c.in();
  emit_step_inputs(c, parts);
  emit_stage_ring_acquire(c);
  emit_transposed_scores(c, parts);
  emit_elements(c, parts);
  emit_ds_transposed_store(c, parts);
  if (parts.column_split) {
    emit_split_key_products(c, parts);
    emit_stage_ring_release(c);
    emit_split_dq(c, parts);
  } else {
    emit_gradient_products(c, parts);
    emit_stage_ring_release(c);
    emit_dq_store(c, parts);
  }
  emit_head_input_gradients(c, parts);
  c.out();
  c("}");
  c("");
}

}  // namespace ladle::cuda::detail
