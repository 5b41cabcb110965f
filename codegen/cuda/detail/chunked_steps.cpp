// The steps over a chunk of the chunked family's mma.sync kernels (chunked_parts.h): the state
// pass's one update, or the other forms' steps, each a span whose gate factors fit one reference
// token, its factors, the state for the read, the scores, o, and the state update.
#include "chunked_parts.h"

#include <string>

namespace ladle::cuda::detail {

void ChunkedEmitter::emit_state_pass_update() {
  c("// 3. The state update over the whole chunk: no read, so no reference token and no fit check;");
  c("//    every factor 2^(G_te - G_t) is a decay (at most 1), and a floored gate wipes exactly.");
  c("{");
  c.in();
  c("const int t0 = 0, t1 = valid, te = valid - 1;");
  emit_update("t", false);
  c.out();
  c("}");
}

void ChunkedEmitter::emit_steps() {
  c("// 3. Steps over the chunk: the whole chunk when its gate factors fit one reference token");
  c("//    tm, else 16-token steps, else single tokens (which always fit).");
  c("for (int t0 = 0; t0 < valid;) {");
  c.in();
  c("if (t0 > 0) __syncthreads();  // the last step's update has read its rows");
  c("int span = C, t1 = valid, tm = 0;");
  if (check_fit) c("span = t0 == 0 ? C : t0 % 16 == 0 ? 16 : 1;");
  emit_step_span();
  c("");
  emit_read_factors();
  emit_read_state();
  // The update goes before the output where no pass has to rewrite ks or vs for it (early); P
  // beside st where no factor pass rewrites qs and ks before it (no key-side vector gate).
  const bool early = !outputs && !vgate;
  const bool scores_first = early && chunked_head_decay_only(variant);
  if (!scores_first) {
    c("__syncthreads();");
    c("");
  }
  if (early && !scores_first) emit_update("tm", true);
  emit_scores();
  if (scores_first) emit_update("tm", true);
  emit_output();
  if (outputs) {
    c("if (t1 < valid) {  // the state is needed past this step only inside a chunk split into steps");
    c.in();
    emit_update("tm", false);
    c.out();
    c("}");
  } else if (!early) {
    emit_update("tm", false);
  } else if (wgmma) {
    c("// The update issued before the output is complete before the next step or chunk.");
    emit_update_wait();
  }
  c("t0 = t1;");
  c.out();
  c("}");
}

// The step's span t0..t1: the longest of the whole chunk, 16 tokens and one token whose gate
// factors fit its reference token tm (the fit check), then te (and tq for a read before the update).
void ChunkedEmitter::emit_step_span() {
  c("for (;;) {");
  c.in();
  c("t1 = t0 + span < valid ? t0 + span : valid;");
  c("tm = t0 + (t1 - t0 - 1) / 2;");
  if (check_fit) {
    c("if (span == 1) break;");
    c("if (t0 > 0 || span < C) {  // the whole chunk's maximum is in fit already (2.)");
    c.in();
    c("float worst = 0.0f;");
    // A read before the update: over t0 - 1 .. t1 - 1 (q~ of row t carries G_(t-1); G_(-1) = 0).
    const auto worst_over = [&](const std::string& gates, const std::string& columns) {
      const std::string first = before_read ? "t0 - 1" : "t0", rows = before_read ? "(t1 - t0 + 1)" : "(t1 - t0)";
      c("for (int e = threadIdx.x; e < " + rows + " * (" + columns + " / 8); e += THREADS) {");
      c.in();
      c("const int t = " + first + " + e / (" + columns + " / 8), i0 = e % (" + columns + " / 8) * 8;");
      c("float gt8[8], gm8[8];");
      if (before_read)
        c("if (t < 0) { LADLE_UNROLL for (int u = 0; u < 8; ++u) gt8[u] = 0.0f; } else");
      c("ladle_load8_f32(gt8, &" + gates + "[t * " + columns + " + i0]);");
      c("ladle_load8_f32(gm8, &" + gates + "[tm * " + columns + " + i0]);");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) worst = fmaxf(worst, fabsf(gt8[u] - gm8[u]));");
      c.out();
      c("}");
    };
    if (kgate == KeyGate::vector) worst_over("kg", "BK");
    if (vgate) worst_over("vg", "BV");
    c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) worst = fmaxf(worst, __shfl_xor_sync(0xffffffffu, worst, d));");
    c("if (lane == 0) atomicMax(&fit[checks & 1], ladle_float_bits(worst));");
    c("__syncthreads();");
    c.out();
    c("}");
    c("const bool fits = ladle_bits_float(fit[checks & 1]) <= FIT_LIMIT;");
    c("if (threadIdx.x == 0) fit[(checks + 1) & 1] = 0u;");
    c("++checks;");
    c("if (fits) break;");
    c("__syncthreads();  // the next check's maximum starts after the reset");
    c("span = span > 16 ? 16 : 1;");
  } else {
    c("break;");
  }
  c.out();
  c("}");
  c("const int te = t1 - 1;");
  c("(void)te; (void)tm;");
  if (before_read) {
    // A one-token step has no intra-step scores (strictly causal): q~ = q against t0 - 1, so the
    // state is read as it entered the step whatever the token's own gate (a hard reset included).
    c("const int tq = t1 - t0 == 1 ? t0 - 1 : tm;  // q~'s reference token (-1: the chunk's start)");
    c("(void)tq;");
  }
}

void ChunkedEmitter::emit_read_factors() {
  if (before_read) {
    c("// 3a. Factors, in place for rows t0..t1: q~ = q 2^(G_t-1 - G_tq), k~ = k 2^(G_tm - G_t); the state for");
    c("//     the read, S 2^(G_tq - G_t0-1).");
  } else {
    c("// 3a. Factors against tm, in place for rows t0..t1: q~ = q 2^(G_t - G_tm), k~ = k 2^(G_tm - G_t),");
    c("//     v~ = v 2^(Gv_tm - Gv_t); the state for the read, S 2^(G_tm - G_t0-1) 2^(Gv_tm - Gv_t0-1).");
  }
  if (kgate == KeyGate::vector && before_read) {
    c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
    c.in();
    c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
    c("float qv8[8], kv8[8], gt8[8], gm8[8], gp8[8], gq8[8];");
    c("ladle_load8_bf16(qv8, &qs[t * QLD + i0]);");
    c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
    c("ladle_load8_f32(gt8, &kg[t * BK + i0]);");
    c("ladle_load8_f32(gm8, &kg[tm * BK + i0]);");
    c("if (t > 0) ladle_load8_f32(gp8, &kg[(t - 1) * BK + i0]);");
    c("else { LADLE_UNROLL for (int u = 0; u < 8; ++u) gp8[u] = 0.0f; }");
    c("if (tq >= 0) ladle_load8_f32(gq8, &kg[tq * BK + i0]);");
    c("else { LADLE_UNROLL for (int u = 0; u < 8; ++u) gq8[u] = 0.0f; }");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c("  qv8[u] *= ladle_exp2(gp8[u] - gq8[u]);");
    c("  kv8[u] *= ladle_exp2(gm8[u] - gt8[u]);");
    c("}");
    c("ladle_store8_bf16(&qs[t * QLD + i0], qv8);");
    c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
    c.out();
    c("}");
  } else if (kgate == KeyGate::vector) {
    c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
    c.in();
    c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
    c("float qv8[8], kv8[8], gt8[8], gm8[8];");
    c("ladle_load8_bf16(qv8, &qs[t * QLD + i0]);");
    c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
    c("ladle_load8_f32(gt8, &kg[t * BK + i0]);");
    c("ladle_load8_f32(gm8, &kg[tm * BK + i0]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c("  const float d = gt8[u] - gm8[u];");
    c("  qv8[u] *= ladle_exp2(d);");
    c("  kv8[u] *= ladle_exp2(-d);");
    c("}");
    c("ladle_store8_bf16(&qs[t * QLD + i0], qv8);");
    c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
    c.out();
    c("}");
  }
  if (vgate) {
    c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BV / 8); e += THREADS) {");
    c.in();
    c("const int t = t0 + e / (BV / 8), j0 = e % (BV / 8) * 8;");
    c("float vv8[8], gt8[8], gm8[8];");
    c("ladle_load8_bf16(vv8, &vs[" + vs_index("t", "j0") + "]);");
    c("ladle_load8_f32(gt8, &vg[t * BV + j0]);");
    c("ladle_load8_f32(gm8, &vg[tm * BV + j0]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) vv8[u] *= ladle_exp2(gm8[u] - gt8[u]);");
    c("ladle_store8_bf16(&vs[" + vs_index("t", "j0") + "], vv8);");
    c.out();
    c("}");
  }
}

// The state for the read into st, scaled from the step's start to the reference token.
void ChunkedEmitter::emit_read_state() {
  std::string factor;
  if (kgate == KeyGate::vector) factor += " * ladle_exp2(" + read_gate("kk") + " - " + before(kg_at("t0 - 1", "kk")) + ")";
  if (vgate) factor += " * ladle_exp2(" + vg_at("tm", "col") + " - " + before(vg_at("t0 - 1", "col")) + ")";
  std::string factor1 = factor;
  for (std::size_t at = factor1.find("col"); at != std::string::npos; at = factor1.find("col", at + 9))
    factor1.replace(at, 3, "(col + 1)");
  if (state_async) {
    c("if (t0 == 0) {  // the state as it arrived (st), in place");
    c.in();
    if (!prefetch) {
      c("ladle_cp_async_wait<0>();");
      c("__syncthreads();");
    }
    c("LADLE_UNROLL_2 for (int e = threadIdx.x; e < BK * (BV / 8); e += THREADS) {");
    c.in();
    c("const int kk = e / (BV / 8), c8 = e % (BV / 8) * 8;");
    c("float s8[8];");
    c("ladle_load8_bf16(s8, &st[kk * VLD + c8]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c.in();
    c("const int col = c8 + u;");
    c("s8[u] = key0 + kk < K && v0 + col < V ? s8[u]" + factor + " : 0.0f;");
    c.out();
    c("}");
    c("ladle_store8_bf16(&st[kk * VLD + c8], s8);");
    c.out();
    c("}");
    c.out();
    c("} else {  // the state as the last step left it in chunk_states");
    c.in();
  }
  if (outputs) {
    c("LADLE_UNROLL_8 for (int e = threadIdx.x; e < BK * (BV / 2); e += THREADS) {  // two columns per thread");
    c.in();
    c("const int kk = e / (BV / 2), col = e % (BV / 2) * 2;");
    c("const bool row = kk < K;");
    c("const float s0 = row && v0 + col < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + ") : 0.0f;");
    c("const float s1 = row && v0 + col + 1 < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + " + 1) : 0.0f;");
    c("const float f0 = 1.0f" + factor + ";");
    c("const float f1 = 1.0f" + factor1 + ";");
    c("*reinterpret_cast<unsigned*>(&st[kk * VLD + col]) = ladle_pack_bf16(s0 * f0, s1 * f1);");
    c.out();
    c("}");
    if (state_async) {
      c.out();
      c("}");
    }
  } else {
    // The head gate (a per-token scalar) enters the read per row in 3b instead.
    const auto read = state_factors(before_read ? "tq" : "tm", "read", false);
    for_state([&] {
      c("if ((r & 1) == 0) {");
      c.in();
      c("*reinterpret_cast<unsigned*>(&st[kk * VLD + col]) = ladle_pack_bf16(sacc[m][nt][r]" +
        (read ? " * " + read("r") : "") + ", sacc[m][nt][r + 1]" + (read ? " * " + read("(r + 1)") : "") + ");");
      c.out();
      c("}");
    });
  }
}

void ChunkedEmitter::emit_scores() {
  c("// 3b0. The step's intra-chunk scores P = mask(q~ k~^T)" +
    std::string(kgate == KeyGate::scalar ? " times the head gate from s to t" : "") +
    ", each 16 x 16 block on or");
  c("//     below the diagonal formed once, by one warp, into ps: the CG warps that share a row tile");
  c("//     read it there instead of each forming it.");
  c("LADLE_UNROLL_1 for (int blk = warp; blk < MT * MT; blk += WARPS) {  // one block at a time: unrolled, it spilled at K = 256");
  c.in();
  c("const int bi = blk / MT, bj = blk % MT;");
  c("if (bj > bi || bj < t0 / 16 || bi * 16 >= t1) continue;");
  c("float pacc[2][4] = {};");
  // At block_k 256 the fully unrolled products spilled beside the state.
  c(std::string(tile.block_k > 128 ? "LADLE_UNROLL_4" : "LADLE_UNROLL") + " for (int kt = 0; kt < BK / 16; ++kt) {");
  c.in();
  c("unsigned afrag[4], bfrag[4];");
  c("ladle_ldmatrix_x4_at(afrag, qs_at + 2u * ((bi * 16 + lane % 16) * QLD + kt * 16 + (lane / 16) * 8));");
  c("ladle_ldmatrix_x4_at(bfrag, ks_at + 2u * ((bj * 16 + lane % 8 + (lane / 16) * 8) * QLD + kt * 16 + ((lane / 8) & 1) * 8));");
  c("ladle_mma_bf16(pacc[0], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(pacc[1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int nt = 0; nt < 2; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int t = bi * 16 + gid + 8 * half, s = bj * 16 + nt * 8 + tig * 2;");
  if (before_read) {
    // Strictly causal (s < t), the head gate from t - 1; the bonus read on the diagonal.
    const std::string head0 = kgate == KeyGate::scalar ? " * ladle_exp2(hg[t - 1] - hg[s])" : "";
    const std::string head1 = kgate == KeyGate::scalar ? " * ladle_exp2(hg[t - 1] - hg[s + 1])" : "";
    const auto diagonal = [&](const std::string& col) {
      return bonus ? "(" + col + " == t && t >= t0 && t < t1 ? bq[t] : 0.0f)" : std::string("0.0f");
    };
    c("    const float p0 = s >= t0 && s < t && t < t1 ? pacc[nt][2 * half]" + head0 + " : " + diagonal("s") + ";");
    c("    const float p1 = s + 1 >= t0 && s + 1 < t && t < t1 ? pacc[nt][2 * half + 1]" + head1 + " : " + diagonal("s + 1") + ";");
  } else if (kgate == KeyGate::scalar) {
    c("    const float p0 = s >= t0 && s <= t && t < t1 ? pacc[nt][2 * half] * ladle_exp2(hg[t] - hg[s]) : 0.0f;");
    c("    const float p1 = s + 1 >= t0 && s + 1 <= t && t < t1 ? pacc[nt][2 * half + 1] * ladle_exp2(hg[t] - hg[s + 1]) : 0.0f;");
  } else {
    c("    const float p0 = s >= t0 && s <= t && t < t1 ? pacc[nt][2 * half] : 0.0f;");
    c("    const float p1 = s + 1 >= t0 && s + 1 <= t && t < t1 ? pacc[nt][2 * half + 1] : 0.0f;");
  }
  c("    *reinterpret_cast<unsigned*>(&ps[t * PLD + s]) = ladle_pack_bf16(p0, p1);");
  c("  }");
  c.out();
  c("}");
  c("__syncthreads();");
  c("");
}

void ChunkedEmitter::emit_output() {
  c("// 3b. o for rows t0..t1: each warp one 16-row tile and OCOLS columns.");
  c("{");
  c.in();
  c("const int mi = warp % MT, cg = warp / MT, row0 = mi * 16;");
  c("if (warp < MT * CG && row0 < t1 && row0 + 16 > t0) {");
  c.in();
  c("float acc[OCOLS / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;");
  c("// The inter-chunk read: q~ [16 x BK] * st [BK x OCOLS].");
  c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt) {");
  c.in();
  c("unsigned afrag[4];");
  c("ladle_ldmatrix_x4_at(afrag, qs_at + 2u * ((row0 + lane % 16) * QLD + kt * 16 + (lane / 16) * 8));");
  c("LADLE_UNROLL for (int np = 0; np < OCOLS / 16; ++np) {");
  c.in();
  c("unsigned bfrag[4];");
  c("ladle_ldmatrix_x4_trans_at(bfrag, st_at + 2u * ((kt * 16 + lane % 16) * VLD + cg * OCOLS + np * 16 + (lane / 16) * 8));");
  c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c.out();
  c("}");
  if (kgate == KeyGate::scalar) {
    c("{  // the head gate from the step's start to each row");
    c.in();
    c("const float g_start = " + before("hg[t0 - 1]") + ";");
    c("const int ra = row0 + gid < C - 1 ? row0 + gid : C - 1, rb = row0 + gid + 8 < C - 1 ? row0 + gid + 8 : C - 1;");
    if (before_read)  // the gates up to t - 1: none for the step's first row
      c("const float fa = ladle_exp2((ra > t0 ? hg[ra - 1] : g_start) - g_start), fb = ladle_exp2((rb > t0 ? hg[rb - 1] : g_start) - g_start);");
    else
      c("const float fa = ladle_exp2(hg[ra] - g_start), fb = ladle_exp2(hg[rb] - g_start);");
    c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) acc[nt][0] *= fa, acc[nt][1] *= fa, acc[nt][2] *= fb, acc[nt][3] *= fb;");
    c.out();
    c("}");
  }
  c("// The intra-chunk attention for these rows: P (ps) times v~ [16 x OCOLS].");
  c("LADLE_UNROLL for (int j = 0; j < MT; ++j) {");
  c.in();
  c("if (j < t0 / 16 || j > mi) continue;");
  c("unsigned afrag[4];");
  c("ladle_ldmatrix_x4_at(afrag, ps_at + 2u * ((row0 + lane % 16) * PLD + j * 16 + (lane / 16) * 8));");
  c("LADLE_UNROLL for (int np = 0; np < OCOLS / 16; ++np) {");
  c.in();
  c("unsigned bfrag[4];");
  c("ladle_ldmatrix_x4_trans_at(bfrag, vs_at + 2u * (" + vs_index("(j * 16 + lane % 16)", "(cg * OCOLS + np * 16 + (lane / 16) * 8)") + "));");
  c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c.out();
  c("}");
  emit_output_store();
  c.out();
  c("}");
  c.out();
  c("}");
}

void ChunkedEmitter::emit_output_store() {
  c("// Store the rows of the step" + std::string(vgate ? ", with the value gate from tm to t" : "") +
    ": two adjacent columns per store where o's columns are contiguous (one row offset per row).");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const int t = row0 + gid + 8 * half;");
  c("if (t < t0 || t >= t1) continue;");
  c("const long long tt = REVERSE ? eos - 1 - (base + t) : bos + base + t;");
  c("auto* const o_row = o + b * o_stride_b + tt * o_stride_t + h * o_stride_h;");
  c("const float row_scale = " + std::string(scale_per_token ? "token_scale[t]" : "read_scale") + ";");
  c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) {");
  c.in();
  c("const int col = cg * OCOLS + nt * 8 + tig * 2;");
  c("if (v0 + col >= V) continue;");
  std::string x0 = "acc[nt][2 * half] * row_scale", x1 = "acc[nt][2 * half + 1] * row_scale";
  if (vgate) {
    x0 += " * ladle_exp2(" + vg_at("t", "col") + " - " + vg_at("tm", "col") + ")";
    x1 += " * ladle_exp2(" + vg_at("t", "col + 1") + " - " + vg_at("tm", "col + 1") + ")";
  }
  c("const float x0 = " + x0 + ", x1 = " + x1 + ";");
  c("if (o_stride_d == 1) {");
  c("  ladle_store2(o_row + v0 + col, x0, x1, v0 + col + 1 < V);");
  c("} else {");
  c("  ladle_store(o_row + (v0 + col) * o_stride_d, x0);");
  c("  if (v0 + col + 1 < V) ladle_store(o_row + (v0 + col + 1) * o_stride_d, x1);");
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
}

void ChunkedEmitter::emit_update_wait() {
  c("ladle_wgmma_wait<0>();");
  c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) ladle_wgmma_fence_operand<BV>(sacc[m]);");
}

// 3c. The update's factors, in place in ks and vs, against `reference` (see emit_update).
void ChunkedEmitter::emit_update_factors(const std::string& reference) {
  c("__syncthreads();");
  c("");
  c("// 3c. The update's factors, in place: k_up = k 2^(G_te - G_t), v_up = v 2^(Gv_te - Gv_t)" +
    std::string(reference == "tm" ? " (k~ and v~ hold the factors against tm)." : "."));
  if (kgate == KeyGate::vector) {
    c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
    c.in();
    c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
    c("float kv8[8], ge8[8], gt8[8];");
    c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
    c("ladle_load8_f32(ge8, &kg[te * BK + i0]);");
    c("ladle_load8_f32(gt8, &kg[" + reference + " * BK + i0]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) kv8[u] *= ladle_exp2(ge8[u] - gt8[u]);");
    c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
    c.out();
    c("}");
  }
  if (vgate || kgate == KeyGate::scalar) {
    c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BV / 8); e += THREADS) {");
    c.in();
    c("const int t = t0 + e / (BV / 8), j0 = e % (BV / 8) * 8;");
    c("float vv8[8];");
    c("ladle_load8_bf16(vv8, &vs[" + vs_index("t", "j0") + "]);");
    c(kgate == KeyGate::scalar ? "const float hf = hg[te] - hg[t];" : "constexpr float hf = 0.0f;");
    std::string log2_factor = "hf";
    if (vgate) {
      c("float ge8[8], gt8[8];");
      c("ladle_load8_f32(ge8, &vg[te * BV + j0]);");
      c("ladle_load8_f32(gt8, &vg[" + reference + " * BV + j0]);");
      log2_factor = "ge8[u] - gt8[u] + hf";
    }
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) vv8[u] *= ladle_exp2(" + log2_factor + ");");
    c("ladle_store8_bf16(&vs[" + vs_index("t", "j0") + "], vv8);");
    c.out();
    c("}");
  }
}

// 3c and 3d: the state update over rows t0..t1. `reference` is the token the staged k and v
// are relative to: tm after the read (k~, v~), t where they are still raw. early (the serial
// form without a value gate): issued before the output, from k~ and v as staged, the update's
// factors applied to the k~^T fragments in registers (k_up = k~ 2^(G_te - G_tm) per key row,
// the head gate's 2^(g_te - g_s) per token), so that no pass rewrites ks or vs and the
// output's products overlap the update; on wgmma the caller waits for it (emit_update_wait).
void ChunkedEmitter::emit_update(const std::string& reference, bool early) {
  const bool update_factors = !early && (kgate != KeyGate::none || vgate);
  if (update_factors) emit_update_factors(reference);
  if (!early) {
    if (wgmma) c("ladle_fence_proxy_async();  // this thread's writes of vs, visible to wgmma's async proxy");
    c("__syncthreads();");
    c("");
  }
  c(std::string("// 3") + (early ? "c" : "d") + ". The state: S = S * decay(t0-1 -> te) + k_up^T v_up over rows t0..t1" +
    (early ? ", issued before the output: k_up^T" : "."));
  if (early)
    c("//     and v_up are k~^T and v as staged, the factors applied in registers (k_up = k~ 2^(G_te - G_tm) per key row, v_up = v 2^(g_te - g_s) per token).");
  if (outputs) {
    c("// The output pass keeps the chunk's state in its own slice of chunk_states (no other block reads");
    c("// it): in registers only for this update.");
    c("float sacc[S_MPW][SCOLS / 8][4];");
    for_state([&] { c("sacc[m][nt][r] = kk < K && v0 + col < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + ") : 0.0f;"); });
  }
  if (const auto decay = state_factors("te", "decay", true))
    for_state([&] { c("sacc[m][nt][r] *= " + decay("r") + "; (void)kk; (void)col;"); });
  if (wgmma) {
    c("//    On wgmma: per warpgroup and 64 key rows, one m64nBVk16 product per 16 tokens: A = k_up^T from");
    c("//    registers (the ldmatrix.trans fragment of each warp's 16 rows), B = v_up N-major from vs");
    c("//    (imm-trans-b = 1; SBO 144 bytes: the next 8 values; LBO VRS * 2 bytes: the next 8 tokens).");
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) ladle_wgmma_fence_operand<BV>(sacc[m]);");
    c("ladle_wgmma_fence();");
  }
  c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) {");
  c.in();
  if (!wgmma) c("if (warp >= S_WARPS || s_mt + m * WARPS >= SMT) continue;");  // wgmma tiles: every warp, every m
  c("const int k0 = (s_mt + m * WARPS) * 16;");
  if (early && kgate == KeyGate::vector)  // rows k0 + gid (afrag 0, 2) and k0 + gid + 8 (1, 3)
    c("const float fa = ladle_exp2(" + kg_at("te", "k0 + gid") + " - " + kg_at("tm", "k0 + gid") + "), fb = ladle_exp2(" +
      kg_at("te", "k0 + gid + 8") + " - " + kg_at("tm", "k0 + gid + 8") + ");");
  c("for (int j = t0 / 16; j <= (t1 - 1) / 16; ++j) {");
  c.in();
  c("unsigned afrag[4];");
  c("ladle_ldmatrix_x4_trans_at(afrag, ks_at + 2u * ((j * 16 + lane % 8 + (lane / 16) * 8) * QLD + k0 + ((lane / 8) & 1) * 8));");
  if (early && kgate == KeyGate::vector) {
    c("afrag[0] = ladle_scale_bf16x2(afrag[0], fa, fa), afrag[1] = ladle_scale_bf16x2(afrag[1], fb, fb);");
    c("afrag[2] = ladle_scale_bf16x2(afrag[2], fa, fa), afrag[3] = ladle_scale_bf16x2(afrag[3], fb, fb);");
  }
  if (early && kgate == KeyGate::scalar) {  // tokens s, s + 1 (afrag 0, 1) and s + 8, s + 9 (2, 3)
    c("{");
    c.in();
    c("const int s = j * 16 + tig * 2;");
    c("const float h0 = ladle_exp2(hg[te] - hg[s]), h1 = ladle_exp2(hg[te] - hg[s + 1]);");
    c("const float h8 = ladle_exp2(hg[te] - hg[s + 8]), h9 = ladle_exp2(hg[te] - hg[s + 9]);");
    c("afrag[0] = ladle_scale_bf16x2(afrag[0], h0, h1), afrag[1] = ladle_scale_bf16x2(afrag[1], h0, h1);");
    c("afrag[2] = ladle_scale_bf16x2(afrag[2], h8, h9), afrag[3] = ladle_scale_bf16x2(afrag[3], h8, h9);");
    c.out();
    c("}");
  }
  // After the factors: a token past the step may have an infinite factor (a floored gate), 0 * inf.
  c("if (j * 16 < t0 || j * 16 + 16 > t1) {  // a partial tile: rows outside the step count zero");
  c.in();
  c("const int s = j * 16 + tig * 2;");
  c("const unsigned lo = (s >= t0 && s < t1 ? 0xffffu : 0u) | (s + 1 >= t0 && s + 1 < t1 ? 0xffff0000u : 0u);");
  c("const unsigned hi = (s + 8 >= t0 && s + 8 < t1 ? 0xffffu : 0u) | (s + 9 >= t0 && s + 9 < t1 ? 0xffff0000u : 0u);");
  c("afrag[0] &= lo, afrag[1] &= lo, afrag[2] &= hi, afrag[3] &= hi;");
  c.out();
  c("}");
  if (wgmma) {
    c("ladle_wgmma_rs_bf16<BV>(sacc[m], afrag, ladle_wgmma_desc(vs + vs_off(j * 16, 0), VRS * 2, VCS * 2));");
  } else {
    c("LADLE_UNROLL for (int np = 0; np < SCOLS / 16; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, vs_at + 2u * (" + vs_index("(j * 16 + lane % 16)", "(s_c0 + np * 16 + (lane / 16) * 8)") + "));");
    c("ladle_mma_bf16(sacc[m][2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(sacc[m][2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
  }
  c.out();
  c("}");
  c.out();
  c("}");
  if (wgmma) {
    c("ladle_wgmma_commit();");
    if (!early) emit_update_wait();
  }
  if (outputs)
    for_state([&] {
      c("if (kk < K && v0 + col < V) ladle_store(chunk_states + " + state_at("(first_chunk + c_of)") + ", sacc[m][nt][r]);");
    });
}

}  // namespace ladle::cuda::detail
