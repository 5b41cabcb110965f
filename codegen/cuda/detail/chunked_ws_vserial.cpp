// The ws kernel's chunks for a value-side gate (vserial): a reference per value column, each consumer
// on its own columns (see chunked_ws.h): the gate's sums per column, vt and st against the references,
// one batch, then o where every column fits or, where one does not, the exact sum per element.
#include "chunked_ws_emit.h"

namespace ladle::cuda::detail {

void WsEmitter::vserial_chunks() const {
  c("// The value column (of this consumer's 64) whose gate this thread sums, over the steps [32 half_g, 32 half_g + 32).");
  c("const int col_g = wt % 64, half_g = wt / 64;");
  c("float* const gv = gv_all + consumer * C * GS;");
  c("float* const part = part_all + consumer * 8 * 64;  // [0, 128) sums, [128, 256) lows, [256, 384) highs per half, rv, pend");
  c("float* const rv = part + 6 * 64;  // the midpoint of each column's G over the chunk");
  c("// S's columns are stored times 2^-pend: the last chunk's 2^(G_C - R) is taken with the next chunk's 2^R.");
  c("float* const pend = part + 7 * 64;");
  c("float pend_mine = 0.0f;  // column col_g's (half 0)");
  c("unsigned* const vfail = vfail_all + consumer * 4;");
  c("unsigned short* const vt = vt_all + consumer * C * 64;");
  c("const unsigned vt_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(vt) - base);");
  chunk_loop_head();
  stage_wait();
  c("const unsigned stage_offset = stage * STAGE_BYTES;");
  c("const unsigned short* const v_box = ring + (stage_offset + (VB + consumer) * BOX) / 2;");
  c("");
  vserial_gate_sums();
  c("");
  vserial_operands();
  c("");
  batch("vt_offset");
  c("");
  c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows");
  c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
  c("if (!exact) {");
  c.in();
  vserial_fitting_outputs();
  c.out();
  c("} else {");
  c.in();
  vserial_exact_outputs();
  c.out();
  c("}");
  stage_release(true);
  c("");
  store_o();
  c("// The next chunk rewrites st, vt, G and the sums: every warp of this consumer is past its products.");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
  c.out();
  c("}");
  if (spec.final_state) vserial_final_state();
}

// G of column col_g over this thread's half of the chunk, the midpoints R and whether a column does not fit.
void WsEmitter::vserial_gate_sums() const {
  c("// 2a. G of column col_g over this half's steps, from the half's start, and its range (with the start).");
  c("if (half_g == 0) pend[col_g] = pend_mine;  // every thread read the last one before the last chunk's end");
  c("float run = 0.0f, lo = 0.0f, hi = 0.0f;");
  c("LADLE_UNROLL for (int u = 0; u < 32; ++u) {");
  c.in();
  c("const int step = 32 * half_g + u, row = REVERSE ? C - 1 - step : step;");
  value_gate_at("row", "col_g");
  c("run += step < valid && cv0 + col_g < V ? lg : 0.0f;");
  c("gv[step * GS + col_g] = run;  // from the half's start (the second half adds the first's sum below)");
  c("lo = fminf(lo, run), hi = fmaxf(hi, run);");
  c.out();
  c("}");
  c("part[half_g * 64 + col_g] = run, part[128 + half_g * 64 + col_g] = lo, part[256 + half_g * 64 + col_g] = hi;");
  c("ladle_named_barrier_sync(1 + consumer, 128);  // both halves' sums");
  c("if (half_g) {");
  c("  const float offset = part[col_g];");
  c("  LADLE_UNROLL for (int u = 0; u < 32; ++u) gv[(32 + u) * GS + col_g] += offset;");
  c("}");
  c("if (half_g == 0) {");
  c("  const float glo = fminf(lo, run + part[192 + col_g]), ghi = fmaxf(hi, run + part[320 + col_g]);");
  c("  rv[col_g] = 0.5f * (glo + ghi);");
  c("  if (ghi - glo > 2.0f * FIT_LIMIT) vfail[c & 1] = 1u;");
  c("}");
  c("ladle_named_barrier_sync(1 + consumer, 128);  // G, the midpoints and the fit word");
  c("const bool exact = vfail[c & 1] != 0u;  // a column spans more than 2 FIT_LIMIT: R = G_C, the exact sum");
  c("if (wt == 0) vfail[(c + 1) & 1] = 0u;  // the next chunk's word: every thread read it a chunk ago, barriers since");
  c("const auto R_of = [&](int j) { return exact ? gv[(C - 1) * GS + j] : rv[j]; };");
  c("if (half_g == 0) pend_mine = exact ? 0.0f : gv[(C - 1) * GS + col_g] - rv[col_g];  // the next chunk's");
}

// S's columns and st against the references, vt = v 2^(R - G_s).
void WsEmitter::vserial_operands() const {
  c("// 2b. With S's true columns 2^pend S: S *= 2^(pend + R) and st = bf16(S), so that o = q st is 2^R");
  c("//     times the state's part (where a column does not fit: st = bf16(2^pend S), S *= 2^(pend + G_C));");
  c("//     vt = v 2^(R - G_s).");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
  c.in();
  c("float fst[2], fS[2];  // st's and S's factors of columns 8 nb + 2 tig + e");
  c("LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("  const int j = 8 * nb + 2 * tig + e;");
  c("  fst[e] = ladle_exp2(exact ? pend[j] : pend[j] + rv[j]);");
  c("  fS[e] = exact ? ladle_exp2(pend[j] + gv[(C - 1) * GS + j]) : fst[e];");
  c("}");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
  c("    float* const x = &S[mt][nb][2 * half];");
  c("    *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(x[0] * fst[0], x[1] * fst[1]);");
  c("    x[0] *= fS[0], x[1] *= fS[1];");
  c("  }");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int i = 0; i < C * 8 / 128; ++i) {  // 16-byte pieces: piece e of row e / 8 holds columns col0 .. col0 + 7");
  c.in();
  c("const int e = wt + 128 * i, row = e / 8, col0 = 8 * ((e % 8) ^ (row & 7));");
  c("const int step = REVERSE ? C - 1 - row : row;");
  c("float x[8];");
  c("ladle_unpack8_bf16(x, ladle_ld16(v_box + 8 * e));");
  c("const ladle_vf4* const g4 = reinterpret_cast<const ladle_vf4*>(gv + step * GS + col0);");
  c("const ladle_vf4* const r4 = reinterpret_cast<const ladle_vf4*>(exact ? gv + (C - 1) * GS + col0 : rv + col0);");
  c("LADLE_UNROLL for (int w = 0; w < 2; ++w) {");
  c("  const ladle_vf4 gs = g4[w], rs = r4[w];");
  c("  LADLE_UNROLL for (int u = 0; u < 4; ++u) x[4 * w + u] = step < valid ? x[4 * w + u] * ladle_exp2(rs.x[u] - gs.x[u]) : 0.0f;");
  c("}");
  c("ladle_store8_bf16(vt + 8 * e, x);");
  c.out();
  c("}");
  c("ladle_fence_proxy_async();  // st and vt, written through the generic proxy, before wgmma reads them");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
}

// Every column fits: P from the scores, o += P vt, o *= scale 2^(G_t - R).
void WsEmitter::vserial_fitting_outputs() const {
  c("// 2d. P from the scores: step s before or at step t, s a token of the sequence.");
  p_fragments("step_s <= step_t && step_s < valid ? score[nb][r] : 0.0f");
  c("// 2e. o += P vt (P from registers, vt N-major), then o *= scale 2^(G_t - R).");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (vt_offset + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();  // the update and o += P vt done");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {  // two columns a load (GS = 72: conflict-free for the 8 rows)");
  c.in();
  c("const int j = 8 * nb + 2 * tig;");
  c("const ladle_vf2 ga = *reinterpret_cast<const ladle_vf2*>(gv + step_a * GS + j), gb = *reinterpret_cast<const ladle_vf2*>(gv + step_b * GS + j);");
  c("const ladle_vf2 rj = *reinterpret_cast<const ladle_vf2*>(rv + j);");
  c("LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("  o_acc[nb][e] *= read_scale * ladle_exp2(ga.x[e] - rj.x[e]);");
  c("  o_acc[nb][2 + e] *= read_scale * ladle_exp2(gb.x[e] - rj.x[e]);");
  c("}");
  c.out();
  c("}");
}

// A column does not fit: o's state part times 2^(G_t), then the exact sum per element from P in vt's place.
void WsEmitter::vserial_exact_outputs() const {
  c("ladle_wgmma_wait<0>();  // the batch done");
  c("ladle_wgmma_fence_operand<64>(score);");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)  // o's state part times 2^(G_t) per element");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r)");
  c("    o_acc[nb][r] *= ladle_exp2(gv[(r < 2 ? step_a : step_b) * GS + 8 * nb + 2 * tig + (r & 1)]);");
  c("ladle_named_barrier_sync(1 + consumer, 128);  // every warp's update has read vt");
  c("// 2e'. P in vt's place (bf16, [t row][s row]), then o_t += sum_s P_ts 2^(G_t - G_s) v_s per element.");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
  c("    const int s = 8 * nb + 2 * tig + (r & 1), row = r < 2 ? ta : tb;");
  c("    const int step_s = REVERSE ? C - 1 - s : s, step_t = r < 2 ? step_a : step_b;");
  c("    vt[row * 64 + s] = step_s <= step_t && step_s < valid ? static_cast<unsigned short>(ladle_pack_bf16(score[nb][r], 0.0f) & 0xffffu) : 0;");
  c("  }");
  c("ladle_named_barrier_sync(1 + consumer, 128);  // P");
  c("LADLE_UNROLL_1 for (int s = 0; s < C; ++s) {");
  c.in();
  c("const int step_s = REVERSE ? C - 1 - s : s;");
  c("if (step_s >= valid) continue;");
  c("const float pa = step_s <= step_a ? ladle_bf16_float(vt[ta * 64 + s]) : 0.0f;");
  c("const float pb = step_s <= step_b ? ladle_bf16_float(vt[tb * 64 + s]) : 0.0f;");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const int j = 8 * nb + 2 * tig + e;");
  c("    const float vs = ladle_bf16_float(v_box[swz(s, j)]), Gs = gv[step_s * GS + j];");
  c("    if (pa != 0.0f) o_acc[nb][e] += pa * vs * ladle_exp2(gv[step_a * GS + j] - Gs);");
  c("    if (pb != 0.0f) o_acc[nb][2 + e] += pb * vs * ladle_exp2(gv[step_b * GS + j] - Gs);");
  c("  }");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= read_scale;");
}

// S's true columns for the final state: the last chunk's pending 2^(G_C - R).
void WsEmitter::vserial_final_state() const {
  c("// S's true columns for the final state: the last chunk's pending 2^(G_C - R).");
  c("if (half_g == 0) pend[col_g] = pend_mine;");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
  c("    const float factor = ladle_exp2(pend[8 * nb + 2 * tig + e]);");
  c("    LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) S[mt][nb][e] *= factor, S[mt][nb][2 + e] *= factor;");
  c("  }");
}

}  // namespace ladle::cuda::detail
