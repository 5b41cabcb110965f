// The ws kernel's chunks for a key-side gate (kserial): per chunk, the gate's sums per key feature and
// whether the chunk and its 8-token windows fit, then the steps (the whole chunk, else windows, else
// single tokens), each with q~ and k~ against a reference per feature, shared by the consumers.
#include "chunked_ws_emit.h"

namespace ladle::cuda::detail {

void WsEmitter::kserial_chunks() const {
  kserial_setup();
  c("");
  chunk_loop_head();
  store_chunk_state();
  stage_wait();
  c("const unsigned stage_offset = stage * STAGE_BYTES;");
  c("");
  if (bonus) kserial_bonus_read();
  kserial_gate_sums();
  c("");
  kserial_steps();
  stage_release(true);
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= read_scale;");
  c("");
  store_o();
  c.out();
  c("}");
}

// The key feature and part of the chunk this thread sums the gate over, the offsets of q~ and k~, a
// bonus's weights.
void WsEmitter::kserial_setup() const {
  c("// The key feature this thread sums the gate of, over the chunk's steps [part TP, part TP + TP).");
  c("const int ct = threadIdx.x - 128, f = ct % BK, part = ct / BK;");
  c("const int fb = f / 64, fc = f % 64;");
  // Constants, not pointer differences: two registers fewer (with the differences, the kernel spilled).
  c("constexpr unsigned qi_offset = STAGES * STAGE_BYTES + CONSUMERS * BK * 128;  // qi - base, in bytes");
  c("constexpr unsigned ki_offset = qi_offset + KB * BOX;");
  if (bonus) {
    // The bonus does not vary over tokens: lane l's features l, l + 32, ... are the same every row.
    c("// The bonus weight of this lane's key features lane + 32 j (0 past K), for the rows' q . u . k.");
    c("float ub[BK / 32];");
    c("LADLE_UNROLL for (int j = 0; j < BK / 32; ++j) {");
    c.in();
    c("const int i = lane + 32 * j;");
    for (const std::size_t k : slot_inputs(variant, ir::Slot::bonus))
      if (inputs[k].kind == ir::InputKind::head_key)
        c("const float " + id[k] + "_b = i < K ? ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
          "_stride_h + i * " + id[k] + "_stride_d) : 0.0f;");
    c("ub[j] = i < K ? " + render_slot(variant, id, ir::Slot::bonus, "_b") + " : 0.0f;");
    c.out();
    c("}");
  }
}

// The bonus read of each step, q . u . k (the scores' diagonal).
void WsEmitter::kserial_bonus_read() const {
  c("// 2-. The bonus read of each step, q . u . k (the scores' diagonal): a warp a row, read after the next");
  c("//     barrier; two buffers, so a consumer still forming the last chunk's P reads that chunk's.");
  c("float* const bq_c = bq + (c & 1) * C;");
  c("for (int step = (threadIdx.x - 128) / 32; step < C; step += NT / 32) {");
  c.in();
  c("const int row = REVERSE ? C - 1 - step : step;");
  c("float part_b = 0.0f;");
  c("LADLE_UNROLL for (int j = 0; j < BK / 32; ++j) {");
  c.in();
  c("const int i = lane + 32 * j, ib = i / 64, ic = i % 64;");
  c("const float qx = ladle_bf16_float(ring[(stage_offset + ib * BOX) / 2 + swz(row, ic)]);");
  c("const float kx = ladle_bf16_float(ring[(stage_offset + (QB + ib) * BOX) / 2 + swz(row, ic)]);");
  c("part_b += qx * ub[j] * kx;");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) part_b += __shfl_xor_sync(0xffffffffu, part_b, d);");
  c("if (lane == 0) bq_c[step] = step < valid ? part_b : 0.0f;");
  c.out();
  c("}");
  c("");
}

// G of feature f over this thread's part, the chunk's reference R and which windows do not fit.
void WsEmitter::kserial_gate_sums() const {
  c("// 2a. G of feature f over this part's steps, from the part's start (Gl), and its range with the 0 before it.");
  c("float Gl[TP];");
  c("float run = 0.0f, lo = 0.0f, hi = 0.0f;");
  c("LADLE_UNROLL for (int u = 0; u < TP; ++u) {");
  c.in();
  c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
  key_gate_at("row");
  c("run += step < valid && f < K ? lg : 0.0f;");
  c("Gl[u] = run;");
  c("lo = fminf(lo, run), hi = fmaxf(hi, run);");
  c.out();
  c("}");
  c("tot[part * BK + f] = run, llo[part * BK + f] = lo, lhi[part * BK + f] = hi;");
  c("ladle_named_barrier_sync(1 + CONSUMERS, NT);  // every part's sums");
  c("// G before this part (offset), G_valid-1 (total), the range of G_-1 .. G_valid-1 and the chunk's reference R;");
  c("// whether the chunk and each 8-token window of this part fit (a window's range includes G before it).");
  c("float offset = 0.0f, total = 0.0f, glo = 0.0f, ghi = 0.0f;");
  c("LADLE_UNROLL for (int p = 0; p < PARTS; ++p) {");
  c("  glo = fminf(glo, total + llo[p * BK + f]), ghi = fmaxf(ghi, total + lhi[p * BK + f]);");
  c("  if (p < part) offset += tot[p * BK + f];");
  c("  total += tot[p * BK + f];");
  c("}");
  c("const float R = 0.5f * (glo + ghi);");
  c("unsigned fails = ghi - glo > 2.0f * FIT_LIMIT ? 0x100u : 0u;");
  c("LADLE_UNROLL for (int w = 0; w < TP / 8; ++w) {");
  c.in();
  c("float wlo = w > 0 ? Gl[(8 * w + TP - 1) % TP] : 0.0f, whi = wlo;");
  c("LADLE_UNROLL for (int u = 0; u < 8; ++u) wlo = fminf(wlo, Gl[8 * w + u]), whi = fmaxf(whi, Gl[8 * w + u]);");
  c("if (whi - wlo > 2.0f * FIT_LIMIT) fails |= 1u << (part * (TP / 8) + w);");
  c.out();
  c("}");
  c("if (fails) atomicOr(&fitw[c & 1], fails);");
  c("ladle_named_barrier_sync(1 + CONSUMERS, NT);  // every thread's fit bits");
  c("const unsigned fail = fitw[c & 1];");
  c("if (ct == 0) fitw[(c + 1) & 1] = 0u;  // the next chunk's word: every thread read it a chunk ago, barriers since");
}

// The steps: the whole chunk where it fits, else its 8-token windows that fit, else single tokens.
void WsEmitter::kserial_steps() const {
  c("// 2b. The steps: the whole chunk where it fits, else its 8-token windows that fit, else single tokens.");
  c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows of score and o");
  c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
  c("float o_acc[8][4];");
  c("if (!(fail & 0x100u)) {  // one step: the chunk against R (part 0 writes the factors)");
  c.in();
  c("const int t0 = 0, t1 = valid;");
  c("const bool o_started = false, mine = part == 0;");
  c("const float Rs = R, gprev = 0.0f, glast = total;");
  if (before_read) c("const float Rq = Rs;\nconstexpr bool single = false;");
  kserial_step(false);
  c.out();
  c("} else {");
  c.in();
  c("bool o_started = false;");
  c("for (int t0 = 0; t0 < valid;) {");
  c.in();
  c("// mode 1: an 8-token window against its midpoint; 2: a token against itself");
  c("const int mode = !((fail >> (t0 / 8)) & 1u) ? 1 : 2;");
  c("const int t1 = mode == 2 ? t0 + 1 : t0 + 8 < valid ? t0 + 8 : valid;");
  c("if (o_started) ladle_named_barrier_sync(1 + CONSUMERS, NT);  // the last step's products have read qi, ki, pre and post");
  kserial_window_reference();
  if (before_read) {
    // A single token reads the state as it entered (q~ = q against G_(t0-1)) whatever its own gate;
    // its k~ = k against G_t0 (its scores are all masked: strictly causal).
    c("const bool single = mode == 2;");
    c("const float Rq = single ? gprev : Rs;");
  }
  kserial_step(true);
  c("o_started = true;");
  c("t0 = t1;");
  c.out();
  c("}");
  c.out();
  c("}");
}

// A window's or token's reference Rs for feature f, G before its first token (gprev) and at its last
// (glast), from the part holding the step (mine).
void WsEmitter::kserial_window_reference() const {
  c("// The step's reference Rs for feature f, G before its first token (gprev) and at its last (glast),");
  c("// from the part holding the step (mine).");
  c("const bool mine = t0 >= part * TP && t0 < part * TP + TP;");
  c("float Rs = 0.0f, gprev = offset, glast = offset;");
  c("if (mine) {");
  c.in();
  c("float wlo = 3.0e38f, whi = -3.0e38f, gfirst = offset, again = 0.0f;");
  c("LADLE_UNROLL_1 for (int u = 0; u < TP; ++u) {");
  c.in();
  c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
  key_gate_at("row");
  c("again += step < valid && f < K ? lg : 0.0f;");
  c("const float g = offset + again;");
  c("if (step == t0 - 1) gprev = g;");
  c("if (step == t0) gfirst = g;");
  c("if (step == t1 - 1) glast = g;");
  c("if (step >= t0 && step < t1) wlo = fminf(wlo, g), whi = fmaxf(whi, g);");
  c.out();
  c("}");
  c("wlo = fminf(wlo, gprev), whi = fmaxf(whi, gprev);");
  c("Rs = mode == 2 ? gfirst : 0.5f * (wlo + whi);");
  c.out();
  c("}");
}

// A step's body, t0, t1, o_started, mine, Rs, gprev and glast in scope. Emitted twice: the whole
// chunk alone (Gl is dead after its q~ and k~, so the products need no spill), and the loop of
// windows and tokens, which recomputes G from the gate's inputs (recompute) and runs its loops
// over the part's steps rolled up (unrolled, they spilled).
void WsEmitter::kserial_step(bool recompute) const {
  kserial_step_operands(recompute);
  c("");
  kserial_step_state();
  c("");
  kserial_step_products();
}

// q~ and k~ of feature f over this part's steps, and the step's factors pre and post per key row.
void WsEmitter::kserial_step_operands(bool recompute) const {
  c("// q~ and k~ of feature f over this part's steps, zero outside [t0, t1) (so past the sequence too).");
  c("const unsigned short* const q_box = ring + (stage_offset + fb * BOX) / 2;");
  c("const unsigned short* const k_box = ring + (stage_offset + (QB + fb) * BOX) / 2;");
  if (recompute) c("float again = 0.0f;  // G again, from the part's start");
  c(std::string(recompute ? "LADLE_UNROLL_1" : "LADLE_UNROLL") + " for (int u = 0; u < TP; ++u) {");
  c.in();
  c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
  c("const int at = fb * (C * 64) + swz(row, fc);");
  if (recompute) {
    c("float gu = offset;");
    if (before_read) c("float gp = offset;  // G_(t-1)");
    c("if (mine) {");
    c.in();
    key_gate_at("row");
    if (before_read) c("gp = offset + again;");
    c("again += step < valid && f < K ? lg : 0.0f;");
    c("gu = offset + again;");
    c.out();
    c("}");
    c("const bool inside = mine && step >= t0 && step < t1;");
    c("const float d = gu - Rs;");
    if (before_read) c("const float dq = gp - Rq;");
  } else {
    c("const bool inside = step >= t0 && step < t1;");
    c("const float d = offset + Gl[u] - Rs;");
    if (before_read) c("const float dq = offset + (u > 0 ? Gl[u > 0 ? u - 1 : 0] : 0.0f) - Rq;");
  }
  c("const float qx = ladle_bf16_float(q_box[swz(row, fc)]), kx = ladle_bf16_float(k_box[swz(row, fc)]);");
  c(std::string("qi[at] = inside ? static_cast<unsigned short>(ladle_pack_bf16(qx * ladle_exp2(") + (before_read ? "dq" : "d") +
    "), 0.0f) & 0xffffu) : 0;");
  c("ki[at] = inside ? static_cast<unsigned short>(ladle_pack_bf16(kx * ladle_exp2(-d), 0.0f) & 0xffffu) : 0;");
  c.out();
  c("}");
  c("if (mine) pre[f] = ladle_exp2(Rs - gprev), post[f] = ladle_exp2(glast - Rs);");
  c("ladle_fence_proxy_async();  // qi and ki, written through the generic proxy, before wgmma reads them");
  c("ladle_named_barrier_sync(1 + CONSUMERS, NT);");
}

// This consumer's columns of S times pre per key row, and their bf16 copy st.
void WsEmitter::kserial_step_state() const {
  c("// 2c. This consumer's columns of S times pre per key row, and their bf16 copy st.");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
  c("    const float factor = pre[feat];");
  if (before_read) {  // st = S 2^(Rq - G_t0-1): S itself for a single-token step (Rq = G_t0-1), else S pre
    c("    const float read_factor = single ? 1.0f : factor;");
    c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
    c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half] * read_factor, S[mt][nb][2 * half + 1] * read_factor);");
    c("      S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
    c("    }");
  } else {
    c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
    c("      S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
    c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half], S[mt][nb][2 * half + 1]);");
    c("    }");
  }
  c("  }");
  c("ladle_fence_proxy_async();  // st, before wgmma reads it");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
}

// One batch, P from the step's scores, o += P v, S's rows times post.
void WsEmitter::kserial_step_products() const {
  c("// 2d. One batch: score = q~ k~^T (both K-major), o += q~ st (st N-major), S += k~^T v (k~ M-major, v");
  c("//     N-major in the stage).");
  c("float score[8][4];");
  c("ladle_wgmma_fence_operand<64>(score);");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
  c("  ladle_wgmma_ss_bf16<64>(score, desc + (qi_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
  c("                          desc + (ki_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
  c("  ladle_wgmma_ss_bf16_tb<64>(o_acc, desc + (qi_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
  c("                             desc + (st_offset + kt * 2048) / 16, kt > 0 || o_started);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (ki_offset + mt * BOX + kk * 2048) / 16,");
  c("                                desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("");
  c("// 2e. P: the scores of the step's pairs, s before or at t (k~ is zero before t0); o += P v (P from");
  c("//     registers, v N-major).");
  if (before_read)  // strictly causal; the bonus on the diagonal of the step's rows
    p_fragments("step_s < step_t && step_t < t1 ? score[nb][r] : " +
                std::string(bonus ? "(step_s == step_t && step_t >= t0 && step_t < t1 ? bq[(c & 1) * C + step_t] : 0.0f)" : "0.0f"));
  else
    p_fragments("step_s <= step_t && step_t < t1 ? score[nb][r] : 0.0f");
  c("ladle_wgmma_wait<1>();  // o += q~ st done");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();  // the update and o += P v done");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("// S's rows times post: the state after the step's last token.");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const float factor = post[64 * mt + 16 * warp + gid + 8 * half];");
  c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
  c("  }");
}

}  // namespace ladle::cuda::detail
