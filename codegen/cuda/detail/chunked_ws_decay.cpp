// The ws kernel's chunks for a per-head decay (or none): the serial kernel (o and the state) and the
// segmented form's state pass, which also takes a key-side gate alone (kup = k 2^(G_C - G_s) per key
// feature in vup's place). Every factor is a decay: no reference token, no fallback.
#include "chunked_ws_emit.h"

namespace ladle::cuda::detail {

void WsEmitter::decay_chunks() const {
  decay_gate_scan();
  c("");
  c("// 2b. The state's bf16 copy for o = q st, v's rows times 2^(G_C - G_s) for the update, then S's decay.");
  stage_wait();
  c("const unsigned stage_offset = stage * STAGE_BYTES;");
  c("const unsigned short* const v_box = ring + (stage_offset + (VB + consumer) * BOX) / 2;");
  decay_update_operands();
  c("");
  if (states)
    state_pass_update();
  else
    decay_products();
  c("// The next chunk rewrites st, vup and gsum: every warp of this consumer is past its products.");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
  c.out();
  c("}");
}

// The chunk loop's opening and G, the cumulative log2 decay of the chunk's steps per warp (gsum), with
// G_C its total; a per-token gate's inputs come one chunk ahead.
void WsEmitter::decay_gate_scan() const {
  if (has_gate) {
    bool token_gate = false;
    for (std::size_t k = 0; k < inputs.size(); ++k) token_gate = token_gate || gate_reads[k];
    if (token_gate) c("// The per-token gate inputs of the next chunk's steps 2 lane and 2 lane + 1, loaded a chunk ahead.");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (gate_reads[k]) c("float " + id[k] + "_next[2] = {0.0f, 0.0f};");
    load_next_gates("0");
    c("");
    chunk_loop_head();
    store_chunk_state();
    c("// 2a. The cumulative log2 decay G of this chunk's steps (step = token order in the recurrence's");
    c("//     direction), per warp: steps 2 lane and 2 lane + 1, a scan over the lanes.");
    c("float g[2];");
    c("LADLE_UNROLL for (int u = 0; u < 2; ++u) {");
    c.in();
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (gate_reads[k]) c("const float " + id[k] + "_t = " + id[k] + "_next[u];");
    c("const float x = LOG2E * (" + render_slot(variant, id, ir::Slot::log_decay_head, "") + ");");
    c("g[u] = 2 * lane + u < valid ? (x > GATE_FLOOR ? x : GATE_FLOOR) : 0.0f;");
    c.out();
    c("}");
    load_next_gates("c + 1");
  } else {
    c("");
    chunk_loop_head();
    store_chunk_state();
    c("float g[2] = {0.0f, 0.0f};  // no decay");
  }
  c("float prefix = g[0] + g[1], total = prefix;  // inclusive scan of the lanes' pair sums");
  c("LADLE_UNROLL for (int d = 1; d < 32; d *= 2) {");
  c("  const float other = __shfl_xor_sync(0xffffffffu, total, d);");
  c("  if (lane & d) prefix += other;");
  c("  total += other;");
  c("}");
  c("gsum[2 * lane] = prefix - g[1];");
  c("gsum[2 * lane + 1] = prefix;");
  c("__syncwarp();");
  c("const float G_C = gsum[valid - 1];  // the chunk's total");
}

// The per-token inputs of the head gate for the chunk `chunk`'s steps 2 lane and 2 lane + 1.
void WsEmitter::load_next_gates(const std::string& chunk) const {
  bool any = false;
  for (std::size_t k = 0; k < inputs.size(); ++k) any = any || gate_reads[k];
  if (!any) return;
  c("LADLE_UNROLL for (int u = 0; u < 2; ++u) {");
  c.in();
  c("const long long step = static_cast<long long>(" + chunk + ") * C + 2 * lane + u;");
  c("const bool live = step < length;");
  c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (gate_reads[k])
      c(id[k] + "_next[u] = live ? ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + t * " + id[k] + "_stride_t + " + id[k] +
        "_head * " + id[k] + "_stride_h) : 0.0f;");
  c.out();
  c("}");
}

// st = bf16(S), vup = 2^(G_C - G_s) v_s and S *= 2^(G_C); the state pass of a key-side gate: kup and S's
// rows times their chunk's decay.
void WsEmitter::decay_update_operands() const {
  if (kgate) {
    key_gate_kup();
  } else if (states) {
    c("segment_log += G_C;");
  } else {
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("      const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
    c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half], S[mt][nb][2 * half + 1]);");
    c("    }");
  }
  if (kgate) {
    c("(void)v_box;");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const float decay = ladle_exp2(gtot[64 * mt + 16 * warp + gid + 8 * half]);  // the key row's");
    c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) S[mt][nb][2 * half] *= decay, S[mt][nb][2 * half + 1] *= decay;");
    c("  }");
  } else {
    c("LADLE_UNROLL for (int i = 0; i < C * 8 / 128; ++i) {  // 16-byte pieces, as swizzled: the row is what matters");
    c.in();
    c("const int e = wt + 128 * i, row = e / 8;");
    c("const int step = REVERSE ? C - 1 - row : row;");
    c("const float w = step < valid ? ladle_exp2(G_C - gsum[step]) : 0.0f;");
    c("float x[8];");
    c("ladle_unpack8_bf16(x, ladle_ld16(v_box + 8 * e));");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] *= w;");
    c("ladle_store8_bf16(vup + 8 * e, x);");
    c.out();
    c("}");
    c("const float decay = ladle_exp2(G_C);");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("    LADLE_UNROLL for (int r = 0; r < 4; ++r) S[mt][nb][r] *= decay;");
  }
  c("ladle_fence_proxy_async();  // st and vup, written through the generic proxy, before wgmma reads them");
  c("ladle_named_barrier_sync(1 + consumer, 128);");
}

// The key-side gate: thread wt owns key feature wt; the chunk's total per feature, then kup.
void WsEmitter::key_gate_kup() const {
  c("// The key-side gate: thread wt owns key feature wt; the chunk's total per feature, then kup.");
  c("if (wt < BK) {");
  c.in();
  c("const int fb = wt / 64, fc = wt % 64;");
  c("const unsigned short* const k_box = ring + (stage_offset + fb * BOX) / 2;");
  // Eight steps at a time with independent loads (a loop over single steps was latency-bound: the
  // state pass took several times a per-head decay's).
  const auto eight_gates = [&] {
    c("float lgs[8];");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c.in();
    c("const int step = s0 + u, row = REVERSE ? C - 1 - step : step;");
    key_gate_at("row");
    c("lgs[u] = step < valid ? lg : 0.0f;");
    c.out();
    c("}");
  };
  c("float tot = 0.0f;");
  c("LADLE_UNROLL_1 for (int s0 = 0; s0 < C; s0 += 8) {");
  c.in();
  eight_gates();
  c("LADLE_UNROLL for (int u = 0; u < 8; ++u) tot += lgs[u];");
  c.out();
  c("}");
  c("gtot[wt] = tot;");
  c("segment_log += tot;");
  c("float G = 0.0f;");
  c("LADLE_UNROLL_1 for (int s0 = 0; s0 < C; s0 += 8) {");
  c.in();
  eight_gates();
  c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
  c.in();
  c("const int step = s0 + u, row = REVERSE ? C - 1 - step : step;");
  c("G += lgs[u];");
  c("const float w = step < valid ? ladle_exp2(tot - G) : 0.0f;");
  c("const float kx = ladle_bf16_float(k_box[swz(row, fc)]);");
  c("vup[fb * (BOX / 2) + swz(row, fc)] = static_cast<unsigned short>(ladle_pack_bf16(kx * w, 0.0f) & 0xffffu);");
  c.out();
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
  c("ladle_named_barrier_sync(1 + consumer, 128);  // every feature's total in gtot");
}

// The state pass: the update alone, then the stage is free.
void WsEmitter::state_pass_update() const {
  c("// 2c. The update alone: S += k^T vup (k M-major, vup N-major; the next 16 tokens 2048 bytes on).");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  if (kgate)  // A = kup^T (its box mt), B = v as copied
    c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (vup_offset + mt * BOX + kk * 2048) / 16, desc + (stage_offset + VB * BOX + consumer * BOX + kk * 2048) / 16);");
  else
    c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (stage_offset + mt * BOX + kk * 2048) / 16, desc + (vup_offset + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();  // the stage and vup are free");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  stage_release(false);
}

// The serial kernel: one batch, P with the decays folded in, o's state part scaled, o += P v, o stored.
void WsEmitter::decay_products() const {
  batch("vup_offset");
  c("");
  c("// 2d. P from the scores: step s before or at step t, s a token of the sequence.");
  c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows");
  c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
  c("const float G_a = gsum[step_a], G_b = gsum[step_b];");
  p_fragments("step_s <= step_t && step_s < valid ? score[nb][r] * read_scale * ladle_exp2((r < 2 ? G_a : G_b) - gsum[step_s]) : 0.0f");
  c("ladle_wgmma_wait<1>();  // o = q st done");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("const float f_a = read_scale * ladle_exp2(G_a), f_b = read_scale * ladle_exp2(G_b);");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= r < 2 ? f_a : f_b;");
  c("// 2e. o += P v (P from registers, v N-major in the stage).");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();  // the update and o += P v done: the stage, st and vup are free");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  stage_release(false);
  c("");
  store_o();
}

}  // namespace ladle::cuda::detail
