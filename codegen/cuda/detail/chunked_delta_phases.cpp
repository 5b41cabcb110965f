// The steps of the chunked delta rule's three kernels: prepare (gamma, A, T = (I + A)^-1, W and
// U), states (h and E per chunk, the state carried over the chunks) and outputs (o).
#include <algorithm>

#include "chunked_delta_emitter.h"

namespace ladle::cuda::detail {

// Returns whether v's rows were prefetched into registers (vraw).
bool ChunkedDeltaEmitter::prepare_stage() {
  // KDA: the per-head decay, if any, joins the key-side one in G; gamma stays 0 (W's factor is beta).
  const std::string g_expr = has(ir::Slot::log_decay_head) && !kda ? render(ir::Slot::log_decay_head, "") : std::string("0.0f");
  const std::string beta_expr = has(ir::Slot::write_strength) ? render(ir::Slot::write_strength, "") : std::string("1.0f");
  c("// A and T in fp32 share their space with v, which is staged once T is solved (three blocks an SM).");
  c("unsigned short* ks = reinterpret_cast<unsigned short*>(smem);  // k (features, normalised), [C][KLD]");
  c("unsigned short* tsu = ks + C * KLD;                              // T diag(beta), [C][TLD]");
  c("unsigned short* ts = tsu + C * TLD;                              // T diag(beta exp(gamma)), [C][TLD]");
  c("float* af = reinterpret_cast<float*>(ts + C * TLD);              // A, [C][ALD]");
  c("float* tf = af + C * ALD;                                        // T in fp32, [C][ALD]");
  c("unsigned short* vs = reinterpret_cast<unsigned short*>(af);      // v, [C][PVLD], after the solve");
  c("float* gs = reinterpret_cast<float*>(smem + " + std::to_string(2 * (C * KLD + 2 * C * TLD) + std::max(4 * 2 * C * ALD, 2 * C * PVLD)) +
    ");  // g");
  c("float* gam = gs + C;");
  c("float* betas = gam + C;");
  c("float* wfac = betas + C;                                         // beta exp(gamma), W's column factors of T");
  if (kda) {
    c("float* G = af;  // the gates [C][GLD] (log2, then G_t = g_1 + ... + g_t), in A's space until A is written");
    c("unsigned* fitw = reinterpret_cast<unsigned*>(wfac + C);  // each 16-row block's spread about its row 7 (float bits)");
    c("if (tid < C / 16) fitw[tid] = 0u;");
  }
  c("");
  c("// 1. Stage the chunk: g and beta a thread a row; k and v, every load in flight at once.");
  c("if (tid < C) {");
  c.in();
  c("const int p = tid;");
  token_of_row("chunk");
  c("gs[p] = live ? " + g_expr + " : 0.0f;");
  c("betas[p] = live ? " + beta_expr + " : 0.0f;");
  c.out();
  c("}");
  stage_tile(ir::Slot::k_feature, "ks", "KLD", "BK", "K", "_i", ir::Role::key, variant.l2_normalize_qk);
  if (kda) kda_stage_gates("G");
  // v's raw rows are loaded now into registers (eight 16-byte groups a thread at V <= 128) and staged
  // once the solve is done: their latency passes behind the solve instead of after it.
  const bool prefetch_v = spec.vector_loads && spec.value_pad <= 128;
  if (prefetch_v) prefetch_rows(ir::Role::value, "vraw", "VPAD", "V");
  c("__syncthreads();");
  return prefetch_v;
}

void ChunkedDeltaEmitter::prepare_gamma() {
  c("// 2. gamma_t = g_0 + ... + g_t (past the sequence's end g = 0: gamma stays); k normalised.");
  c("if (tid < C) {  // an inclusive scan by shuffles in each of warps 0 and 1, then warp 1 adds warp 0's total");
  c.in();
  c("float s = gs[tid];");
  c("LADLE_UNROLL for (int off = 1; off < 32; off <<= 1) {");
  c("  const float other = __shfl_up_sync(0xffffffffu, s, off);");
  c("  if (lane >= off) s += other;");
  c("}");
  c("if (tid >= 32) {  // warp 0's total, by shuffles over its 32 values");
  c("  float total = gs[lane];");
  c("  LADLE_UNROLL for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);");
  c("  s += total;");
  c("}");
  c("gam[tid] = s;");
  c("wfac[tid] = betas[tid] * expf(s);");
  if (!kda) c("work_gamma[(gc * H + h) * C + tid] = s;");
  c.out();
  c("}");
  c("__syncthreads();");
  if (kda) {
    kda_scan_gates("G");
    c("if (tid < BK) work_gamma[(gc * H + h) * BK + tid] = G[(C - 1) * GLD + tid];  // G_last, for the states kernel");
    c("// k 2^(G_last - G_t) (at most k), for the states kernel's update: 16 bytes at a time.");
    c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / 128; ++m) {");
    c.in();
    c("const int e = tid + m * 128;");
    c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
    c("float kv8[8];");
    c("ladle_load8_bf16(kv8, &ks[p * KLD + i]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) kv8[u] *= ladle_exp2(G[(C - 1) * GLD + i + u] - G[p * GLD + i + u]);");
    c("ladle_store8_bf16(&work_k[((gc * H + h) * C + p) * BK + i], kv8);");
    c.out();
    c("}");
    return;
  }
  c("// k, normalised, for the states and outputs kernels: 16 bytes at a time.");
  c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / 128; ++m) {");
  c.in();
  c("const int e = tid + m * 128;");
  c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
  c("ladle_st16(&work_k[((gc * H + h) * C + p) * BK + i], ladle_ld16(&ks[p * KLD + i]));");
  c.out();
  c("}");
}

void ChunkedDeltaEmitter::prepare_a() {
  if (kda) {
    c("// 3. A = beta_t sum_i k_ti k_si 2^(G_ti - G_si) below the diagonal (fp32); warp w: rows 16w..16w+15.");
    c("{");
    c.in();
    c("const int r0 = warp * 16;");
    kda_scores("ks", "ks", false);
    c("__syncthreads();  // every warp's scores are formed: k may change, and G's space takes A");
    kda_scale_rows("ks");
    c("__syncthreads();");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
    c("    const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = nt * 8 + (lane % 4) * 2 + (e & 1);");
    c("    af[row * ALD + col] = col < row ? betas[row] * acc[nt][e] : 0.0f;");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    return;
  }
  c("// 3. A = beta_t exp(gamma_t - gamma_s) k_t . k_s below the diagonal (fp32); warp w: rows 16w..16w+15.");
  c("{");
  c.in();
  zero("acc", "8");
  mma_rows("acc", "ks", "KLD", "warp * 16", "ks", "KLD", false, "BK / 16", "8");
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
  c("    const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = nt * 8 + (lane % 4) * 2 + (e & 1);");
  c("    af[row * ALD + col] = col < row ? betas[row] * ladle_exp2((gam[row] - gam[col]) * LOG2E) * acc[nt][e] : 0.0f;");
  c("  }");
  c.out();
  c("}");
  c("__syncthreads();");
}

void ChunkedDeltaEmitter::prepare_inverse() {
  c("// 4. T = (I + A)^-1 in 16 x 16 blocks (fp32): the diagonal blocks' inverses by forward substitution,");
  c("//    one column a thread; then block row i = 1..3: T_ij = -T_ii (sum over j <= m < i of A_im T_mj).");
  c("if (tid < C) {");
  c.in();
  c("const int d = tid / 16 * 16, col = tid % 16;  // block d, column d + col");
  c("float x[16];");
  c("LADLE_UNROLL for (int r = 0; r < 16; ++r) {");
  c.in();
  c("float val = r == col ? 1.0f : 0.0f;");
  c("LADLE_UNROLL for (int s = 0; s < r; ++s) val -= af[(d + r) * ALD + d + s] * x[s];");
  c("x[r] = val;");
  c("tf[(d + r) * ALD + d + col] = val;");
  c.out();
  c("}");
  c.out();
  c("}");
  c("__syncthreads();");
  c("// Block row i = 1..3: M_ij = sum over j <= m < i of A_im T_mj for every j < i, then T_ij = -T_ii M_ij;");
  c("// a thread four columns of one row of a block (i * 64 groups), 16-byte loads of T and M.");
  c("LADLE_UNROLL for (int i = 1; i < C / 16; ++i) {");
  c.in();
  c("float msum[2][4];");
  c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
  c.in();
  c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
  c("msum[pass][0] = msum[pass][1] = msum[pass][2] = msum[pass][3] = 0.0f;");
  c("if (grp < i * 64)");
  c("  for (int m = j * 16; m < i * 16; ++m) {");
  c("    const float a = af[(i * 16 + r) * ALD + m];");
  c("    const ladle_f4 t4 = ladle_ld4(&tf[m * ALD + j * 16 + cq]);");
  c("    msum[pass][0] += a * t4.x, msum[pass][1] += a * t4.y, msum[pass][2] += a * t4.z, msum[pass][3] += a * t4.w;");
  c("  }");
  c.out();
  c("}");
  c("__syncthreads();  // A's block row i is read for the last time: M_ij takes A_ij's place");
  c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
  c.in();
  c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
  c("if (grp < i * 64) ladle_st4(&af[(i * 16 + r) * ALD + j * 16 + cq], ladle_f4{msum[pass][0], msum[pass][1], msum[pass][2], msum[pass][3]});");
  c.out();
  c("}");
  c("__syncthreads();");
  c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
  c.in();
  c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
  c("if (grp >= i * 64) continue;");
  c("float sv[4] = {0.0f, 0.0f, 0.0f, 0.0f};");
  c("LADLE_UNROLL for (int m = 0; m < 16; ++m) {");
  c("  const float a = tf[(i * 16 + r) * ALD + i * 16 + m];");
  c("  const ladle_f4 a4 = ladle_ld4(&af[(i * 16 + m) * ALD + j * 16 + cq]);");
  c("  sv[0] += a * a4.x, sv[1] += a * a4.y, sv[2] += a * a4.z, sv[3] += a * a4.w;");
  c("}");
  c("ladle_st4(&tf[(i * 16 + r) * ALD + j * 16 + cq], ladle_f4{-sv[0], -sv[1], -sv[2], -sv[3]});");
  c.out();
  c("}");
  c("__syncthreads();");
  c.out();
  c("}");
}

void ChunkedDeltaEmitter::prepare_w_u(bool prefetch_v) {
  c("// W = (T diag(beta exp(gamma))) K and U = (T diag(beta)) V: T's columns scaled, two bf16 copies.");
  c("// T is block lower triangular: the blocks above the diagonal were never written, and are zero.");
  c("LADLE_UNROLL for (int m = 0; m < C * C / 2 / 128; ++m) {");
  c.in();
  c("const int e = tid + m * 128;");
  c("const int r = e / (C / 2), s = e % (C / 2) * 2;");
  c("const bool below = s / 16 <= r / 16;");
  c("const float t0 = below ? tf[r * ALD + s] : 0.0f, t1 = below ? tf[r * ALD + s + 1] : 0.0f;");
  c("*reinterpret_cast<unsigned*>(&ts[r * TLD + s]) = ladle_pack_bf16(t0 * wfac[s], t1 * wfac[s + 1]);");
  c("*reinterpret_cast<unsigned*>(&tsu[r * TLD + s]) = ladle_pack_bf16(t0 * betas[s], t1 * betas[s + 1]);");
  c.out();
  c("}");
  c("__syncthreads();  // A and T are read for the last time: v takes their space");
  stage_tile(ir::Slot::v, "vs", "PVLD", "VPAD", "V", "_j", ir::Role::value, false, prefetch_v ? "vraw" : "");
  c("__syncthreads();");
  c("// 5. W = T (beta exp(gamma) K), U = T (beta V): 64 columns at a time, warp w: rows 16w..16w+15.");
  c("const unsigned short* tsw = ts;");
  c("const long long base = (gc * H + h) * C;");
  c("for (int col0 = 0; col0 < BK + VPAD; col0 += 64) {");
  c.in();
  c("const bool w_part = col0 < BK;");
  c("const unsigned short* src = w_part ? ks + col0 : vs + (col0 - BK);");
  c("const unsigned short* tsrc = w_part ? tsw : tsu;");
  c("const int ld = w_part ? KLD : PVLD;");
  c("const unsigned tsrc_s = ladle_shared_address(tsrc), src_s = ladle_shared_address(src);");
  zero("acc", "8");
  c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
  c.in();
  c("unsigned afrag[4];");
  c("ladle_ldmatrix_x4_at(afrag, tsrc_s + 2u * static_cast<unsigned>((warp * 16 + lane % 16) * TLD + kt * 16 + (lane / 16) * 8));");
  c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
  c.in();
  c("unsigned bfrag[4];");
  c("ladle_ldmatrix_x4_trans_at(bfrag, src_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * ld + np * 16 + (lane / 16) * 8));");
  c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int row = warp * 16 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
  c("    const unsigned pair = ladle_pack_bf16(acc[nt][2 * half], acc[nt][2 * half + 1]);");
  c("    if (w_part) *reinterpret_cast<unsigned*>(&work_w[(base + row) * BK + col0 + col]) = pair;");
  c("    else *reinterpret_cast<unsigned*>(&work_u[(base + row) * VPAD + col0 - BK + col]) = pair;");
  c("  }");
  c.out();
  c("}");
}

void ChunkedDeltaEmitter::states_tiles_and_state() {
  c("// Double-buffered tiles of chunk c % 2: W and k [C][KLD], U [C][VLD] (E's decayed copy overwrites U in place).");
  c("unsigned short* ws = reinterpret_cast<unsigned short*>(smem);");
  c("unsigned short* ks = ws + 2 * C * KLD;");
  c("unsigned short* us = ks + 2 * C * KLD;");
  c("unsigned short* ss = us + 2 * C * VLD;  // S_0 in bf16, [BK][VLD]");
  c(kda ? "float* gam = reinterpret_cast<float*>(ss + BK * VLD);  // G_last, [2][BK] (log2)"
        : "float* gam = reinterpret_cast<float*>(ss + BK * VLD);  // [2][C]");
  c("");
  c("// The state: warp w < BK / 16 keeps rows 16w..16w+15 of its 64 columns in mma accumulator order.");
  c("float S[8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
  c("    const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = vb * 64 + nt * 8 + (lane % 4) * 2 + (e & 1);");
  if (spec.initial_state)
    c("    S[nt][e] = warp < BK / 16 && row < K && col < V ? ladle_load(initial_state + ((static_cast<long long>(n) * H + h) * K + row) * V + col) : 0.0f;");
  else
    c("    S[nt][e] = 0.0f;");
  c("    if (warp < BK / 16) ss[row * VLD + nt * 8 + (lane % 4) * 2 + (e & 1)] = ladle_bf16_bits(S[nt][e]);");
  c("  }");
}

void ChunkedDeltaEmitter::states_fetch() {
  c("const long long chunks = (length + C - 1) / C;");
  c("// Chunk c's W, k, U and gamma into buffer c % 2, as one cp.async group.");
  c("const auto fetch = [&](long long chunk) {");
  c.in();
  c("const long long base = ((gc0 + chunk) * H + h) * C;");
  c("const int buf = static_cast<int>(chunk & 1);");
  c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / 256; ++m) {");
  c.in();
  c("const int e = tid + m * 256;");
  c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
  c("ladle_cp_async_16(&ws[(buf * C + p) * KLD + i], &work_w[(base + p) * BK + i]);");
  c("ladle_cp_async_16(&ks[(buf * C + p) * KLD + i], &work_k[(base + p) * BK + i]);");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int m = 0; m < C * 8 / 256; ++m) {");
  c.in();
  c("const int e = tid + m * 256;");
  c("const int p = e / 8, j = e % 8 * 8;");
  c("ladle_cp_async_16(&us[(buf * C + p) * VLD + j], &work_u[(base + p) * VPAD + vb * 64 + j]);");
  c.out();
  c("}");
  if (kda)
    c("if (tid < BK / 4) ladle_cp_async_16(&gam[buf * BK + tid * 4], &work_gamma[((gc0 + chunk) * H + h) * BK + tid * 4]);");
  else
    c("if (tid < C / 4) ladle_cp_async_16(&gam[buf * C + tid * 4], &work_gamma[base + tid * 4]);");
  c("ladle_cp_async_commit();");
  c.out();
  c("};");
  c("if (chunks > 0) fetch(0);");
}

void ChunkedDeltaEmitter::states_chunks() {
  c("for (long long chunk = 0; chunk < chunks; ++chunk) {");
  c.in();
  c("const long long base = ((gc0 + chunk) * H + h) * C;");
  c("const int buf = static_cast<int>(chunk & 1);");
  c("ladle_cp_async_wait<0>();  // this chunk's tiles, the only group in flight");
  c("__syncthreads();  // ... from every thread's copies; every warp is done with the previous chunk (its buffer, S_0's copy)");
  c("if (chunk + 1 < chunks) fetch(chunk + 1);  // into the other buffer, whose last readers passed the barrier above");
  c("const unsigned short* wb = ws + buf * C * KLD;");
  c("const unsigned short* kbuf = ks + buf * C * KLD;");
  c("unsigned short* ub = us + buf * C * VLD;");
  c(kda ? "const float* gb = gam + buf * BK;" : "const float* gb = gam + buf * C;");
  states_e();
  states_update();
  c.out();
  c("}");
}

void ChunkedDeltaEmitter::states_e() {
  c("// 1. h = S_0 into the work array (16 bytes a thread at a time); E = U - W S_0: warp w, rows 16 (w % 4),");
  c("//    columns 32 (w / 4); E into the work array, exp(gamma_last - gamma) E over U.");
  c("LADLE_UNROLL_2 for (int m = 0; m < BK * 8 / 256; ++m) {  // (unrolled fully, ptxas spills at 128 registers with states)");
  c.in();
  c("const int e = tid + m * 256;");
  c("const int row = e / 8, j = e % 8 * 8;");
  c("ladle_st16(&work_h[(((gc0 + chunk) * H + h) * BK + row) * VPAD + vb * 64 + j], ladle_ld16(&ss[row * VLD + j]));");
  c.out();
  c("}");
  c("{");
  c.in();
  c("const int r0 = (warp % 4) * 16, c0 = (warp / 4) * 32;");
  zero("acc", "4");
  mma_rows("acc", "wb", "KLD", "r0", "ss", "VLD", true, "BK / 16", "4", "c0");
  if (kda) {
    c("const float dec[2] = {1.0f, 1.0f};  // KDA: the decays are in k 2^(G_last - G)");
  } else {
    c("const float last = gb[C - 1];");
    c("// The two rows' decays first: the stores below could alias gamma's buffer for the compiler.");
    c("const float dec[2] = {expf(last - gb[r0 + lane / 4]), expf(last - gb[r0 + lane / 4 + 8])};");
  }
  c("LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int row = r0 + lane / 4 + half * 8, col = c0 + nt * 8 + (lane % 4) * 2;");
  c("    const unsigned u2 = *reinterpret_cast<const unsigned*>(&ub[row * VLD + col]);");
  c("    const float e0 = ladle_bits_float(u2 << 16) - acc[nt][2 * half];");
  c("    const float e1 = ladle_bits_float(u2 & 0xffff0000u) - acc[nt][2 * half + 1];");
  c("    const float d = dec[half];");
  c("    *reinterpret_cast<unsigned*>(&work_e[(base + row) * VPAD + vb * 64 + col]) = ladle_pack_bf16(e0, e1);");
  c("    *reinterpret_cast<unsigned*>(&ub[row * VLD + col]) = ladle_pack_bf16(e0 * d, e1 * d);");
  c("  }");
  c.out();
  c("}");
  c("__syncthreads();");
}

void ChunkedDeltaEmitter::states_update() {
  c(kda ? "// 2. S = 2^(G_last) S + (k 2^(G_last - G))^T E: warp w < BK / 16, rows 16w..16w+15."
        : "// 2. S = exp(gamma_last) S + K^T (exp(gamma_last - gamma) E): warp w < BK / 16, rows 16w..16w+15.");
  c("if (warp < BK / 16) {");
  c.in();
  if (kda) {
    c("const float decay0 = ladle_exp2(gb[warp * 16 + lane / 4]), decay1 = ladle_exp2(gb[warp * 16 + lane / 4 + 8]);  // 2^G_last, per row");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt) S[nt][0] *= decay0, S[nt][1] *= decay0, S[nt][2] *= decay1, S[nt][3] *= decay1;");
  } else {
    c("const float decay = expf(gb[C - 1]);");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt) S[nt][0] *= decay, S[nt][1] *= decay, S[nt][2] *= decay, S[nt][3] *= decay;");
  }
  c("const unsigned kbuf_s = ladle_shared_address(kbuf), ub_s = ladle_shared_address(ub);");
  c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
  c.in();
  c("unsigned afrag[4];  // K^T: rows are features, the k-dimension tokens");
  c("ladle_ldmatrix_x4_trans_at(afrag, kbuf_s + 2u * static_cast<unsigned>((kt * 16 + lane % 8 + (lane / 16) * 8) * KLD + warp * 16 + ((lane / 8) & 1) * 8));");
  c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
  c.in();
  c("unsigned bfrag[4];");
  c("ladle_ldmatrix_x4_trans_at(bfrag, ub_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * VLD + np * 16 + (lane / 16) * 8));");
  c("ladle_mma_bf16(S[2 * np], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(S[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
  c("// S_0's copy is overwritten without a barrier: its readers (step 1) passed the one before step 2, its next");
  c("// readers come after the next chunk's first.");
  c("if (warp < BK / 16)");
  c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("    LADLE_UNROLL for (int half = 0; half < 2; ++half)");
  c("      *reinterpret_cast<unsigned*>(&ss[(warp * 16 + lane / 4 + half * 8) * VLD + nt * 8 + (lane % 4) * 2]) =");
  c("          ladle_pack_bf16(S[nt][2 * half], S[nt][2 * half + 1]);");
}

void ChunkedDeltaEmitter::states_final() {
  c("if (warp < BK / 16)");
  c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("    LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
  c("      const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = vb * 64 + nt * 8 + (lane % 4) * 2 + (e & 1);");
  c("      if (row < K && col < V) final_state[((static_cast<long long>(n) * H + h) * K + row) * V + col] = S[nt][e];");
  c("    }");
}

// The outputs kernel's h (S_0) and E tiles of each 64-column group by cp.async into hs0 and es0;
// `group_count` names the kernel's constant for the 64-column groups a block.
void ChunkedDeltaEmitter::outputs_fetch_h_e(const std::string& group_count) {
  const std::string threads = std::to_string(kernel.threads);
  // One tile of `rows` rows of 64 columns per group, 16 bytes a thread and step.
  const auto fetch = [&](const std::string& rows, const std::string& row, const std::string& dst, const std::string& src) {
    c("LADLE_UNROLL for (int m = 0; m < " + group_count + " * " + rows + " * 8 / " + threads + "; ++m) {");
    c.in();
    c("const int e = tid + m * " + threads + ";");
    c("const int grp = e / (" + rows + " * 8), " + row + " = e % (" + rows + " * 8) / 8, j = e % 8 * 8, col = (blockIdx.z * " +
      group_count + " + grp) * 64 + j;");
    c("if (col < VPAD) ladle_cp_async_16(&" + dst + ", &" + src + ");");
    c.out();
    c("}");
  };
  fetch("BK", "row", "hs0[(grp * BK + row) * VLD + j]", "work_h[((gc * H + h) * BK + row) * VPAD + col]");
  fetch("C", "p", "es0[(grp * C + p) * VLD + j]", "work_e[(base + p) * VPAD + col]");
}

void ChunkedDeltaEmitter::outputs_loads() {
  const std::string G = std::to_string(groups), threads = std::to_string(kernel.threads);
  c("constexpr int G = " + G + ";  // 64-column groups a block: warps 4g..4g+3 take group g");
  c("unsigned short* qs = reinterpret_cast<unsigned short*>(smem);  // q (features, normalised), [C][KLD]");
  c("unsigned short* ks = qs + C * KLD;                               // k (normalised), [C][KLD]");
  c("unsigned short* hs = ks + C * KLD + warp / 4 * BK * VLD;         // h = S_0's 64 columns of this warp's group, [BK][VLD]");
  c("unsigned short* es = ks + C * KLD + G * BK * VLD + warp / 4 * C * VLD;  // E's 64 columns, [C][VLD]");
  c("float* gam = reinterpret_cast<float*>(ks + C * KLD + G * (BK * VLD + C * VLD));");
  c("float* qscale = gam + C;");
  c("const long long base = (gc * H + h) * C;");
  c("// 1. q's raw rows into registers first; k, each group's h and E, and gamma by cp.async; then q through");
  c("//    its feature map into shared memory; the scale.");
  const bool prefetch_q = spec.vector_loads && chunked_delta_chunk * spec.block_k / 8 / static_cast<int>(kernel.threads) <= 8;
  if (prefetch_q) prefetch_rows(ir::Role::query, "qraw", "BK", "K");
  c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / " + threads + "; ++m) {");
  c.in();
  c("const int e = tid + m * " + threads + ";");
  c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
  c("ladle_cp_async_16(&ks[p * KLD + i], &work_k[(base + p) * BK + i]);");
  c.out();
  c("}");
  c("unsigned short* const hs0 = ks + C * KLD;");
  c("unsigned short* const es0 = hs0 + G * BK * VLD;");
  outputs_fetch_h_e("G");
  c("if (tid < C / 4) ladle_cp_async_16(&gam[tid * 4], &work_gamma[base + tid * 4]);");
  c("ladle_cp_async_commit();");
  c("if (tid < C) {");
  c.in();
  c("const int p = tid;");
  token_of_row("chunk");
  c("qscale[p] = " + (has(ir::Slot::scale) ? render(ir::Slot::scale, "") : std::string("1.0f")) + ";");
  c.out();
  c("}");
  stage_tile(ir::Slot::q_feature, "qs", "KLD", "BK", "K", "_i", ir::Role::query, variant.l2_normalize_qk, prefetch_q ? "qraw" : "");
  c("ladle_cp_async_wait<0>();");
  c("__syncthreads();");
  c("if (vb * 64 >= VPAD) return;  // a group past V (V over 128 with an odd number of 64-column blocks)");
}

void ChunkedDeltaEmitter::outputs_scores() {
  c("// 2. Warp w, rows 16 (w % 4)..+15: P = q k^T (masked, decayed), kept in registers as the A operand of");
  c("//    P E (an accumulator tile is an A fragment's layout); O = exp(gamma) q h + P E.");
  c("const int r0 = warp % 4 * 16;");
  zero("acc", "8");
  mma_rows("acc", "qs", "KLD", "r0", "ks", "KLD", false, "BK / 16", "8");
  c("unsigned pfrag[C / 16][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int row = r0 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
  c("    const float d0 = col <= row ? ladle_exp2((gam[row] - gam[col]) * LOG2E) : 0.0f, d1 = col + 1 <= row ? ladle_exp2((gam[row] - gam[col + 1]) * LOG2E) : 0.0f;");
  c("    pfrag[nt / 2][(nt % 2) * 2 + half] = ladle_pack_bf16(acc[nt][2 * half] * d0, acc[nt][2 * half + 1] * d1);");
  c("  }");
}

void ChunkedDeltaEmitter::outputs_values() {
  c("// 32 columns at a time (16 accumulators beside P's 16 registers: 128 registers a thread at 256 threads).");
  c("const unsigned es_s = ladle_shared_address(es);");
  if (kda)
    c("const float row_decay[2] = {1.0f, 1.0f};  // KDA: q's rows carry 2^G already");
  else
    c("const float row_decay[2] = {expf(gam[r0 + lane / 4]), expf(gam[r0 + lane / 4 + 8])};");
  c("LADLE_UNROLL_1 for (int vh = 0; vh < 2; ++vh) {");
  c.in();
  zero("ov", "4");
  mma_rows("ov", "qs", "KLD", "r0", "hs", "VLD", true, "BK / 16", "4", "vh * 32");
  c("LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
  c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) ov[nt][e] *= row_decay[e / 2];");
  c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt)");
  c("  LADLE_UNROLL for (int np = 0; np < 2; ++np) {");
  c("    unsigned bfrag[4];");
  c("    ladle_ldmatrix_x4_trans_at(bfrag, es_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * VLD + vh * 32 + np * 16 + (lane / 16) * 8));");
  c("    ladle_mma_bf16(ov[2 * np], pfrag[kt], bfrag[0], bfrag[1]);");
  c("    ladle_mma_bf16(ov[2 * np + 1], pfrag[kt], bfrag[2], bfrag[3]);");
  c("  }");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {  // rows lane / 4 and lane / 4 + 8: one address each");
  c.in();
  c("const int row = r0 + lane / 4 + half * 8;");
  c("const long long step = chunk * C + row;");
  c("if (step >= length) continue;");
  c("const long long tok = REVERSE ? eos - 1 - step : bos + step;");
  c("const float factor = qscale[row];");
  c("const int col0 = vb * 64 + vh * 32 + (lane % 4) * 2;");
  c("auto* const out = o + b * o_stride_b + tok * o_stride_t + h * o_stride_h + static_cast<long long>(col0) * o_stride_d;");
  c("if (o_stride_d == 1 && (reinterpret_cast<unsigned long long>(out) & (2 * sizeof(*out) - 1)) == 0 && col0 + 25 < V) {");
  c("  // every pair aligned and inside the row: one store a pair");
  c("  LADLE_UNROLL for (int nt = 0; nt < 4; ++nt) ladle_store_pair(out + nt * 8, factor * ov[nt][2 * half], factor * ov[nt][2 * half + 1]);");
  c("} else {");
  c("  LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
  c("    LADLE_UNROLL for (int e = 0; e < 2; ++e)");
  c("      if (col0 + nt * 8 + e < V) ladle_store(out + (nt * 8 + e) * o_stride_d, factor * ov[nt][2 * half + e]);");
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
}

// KDA: the gates' tile (fp32, log2): g_t of each feature (the key-side decay's expression, plus the
// per-head decay's where the variant has one), 0 past the sequence's end, at least -256 (a hard reset's
// -inf included: 2^-256 = 0 in fp32 wipes exactly, and differences stay finite).
void ChunkedDeltaEmitter::kda_stage_gates(const std::string& tile) {
  const std::string threads = std::to_string(kernel.threads);
  std::string expr = render(ir::Slot::log_decay_k, "_i");
  if (has(ir::Slot::log_decay_head)) expr = "(" + expr + ") + (" + render(ir::Slot::log_decay_head, "") + ")";
  // Each token-key input's eight features by one 16-byte load (two for fp32) where the row is
  // contiguous and aligned (ladle_load8 checks), every group of the loop in flight at once: the
  // element-by-element form spent a fifth of the prepare kernel's stalls waiting on these loads.
  c("// The gates, g in log2 a feature, into " + tile + ": eight features a thread at a time, every group in flight.");
  c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / " + std::string(threads) + "; ++m) {");
  c.in();
  c("const int grp = tid + m * " + threads + ";");
  c("const int p = grp / (BK / 8), f0 = grp % (BK / 8) * 8;");
  token_of_row("chunk");
  c("const int count = live ? (K - f0 < 8 ? K - f0 : 8) : 0;  // features of the group in the row (<= 0: none)");
  const std::vector<std::size_t> reads = slot_inputs(variant, ir::Slot::log_decay_k);
  for (std::size_t k : reads)
    if (inputs[k].kind == ir::InputKind::token_key || inputs[k].kind == ir::InputKind::head_key)
      c("float " + id[k] + "_x8[8];"),
      c("ladle_load8(" + id[k] + "_x8, " + id[k] + " + (count > 0 ? " + id[k] + "_row + f0 * " + id[k] + "_stride_d : 0), " + id[k] +
        "_stride_d, count);");
  c("float gx[8];");
  c("LADLE_UNROLL for (int e = 0; e < 8; ++e) {");
  c.in();
  c("const bool use = e < count;");
  for (std::size_t k : reads)
    if (inputs[k].kind == ir::InputKind::token_key || inputs[k].kind == ir::InputKind::head_key)
      c("const float " + id[k] + "_i = use ? " + id[k] + "_x8[e] : 0.0f;");
  c("gx[e] = use ? fmaxf((" + expr + ") * LOG2E, -256.0f) : 0.0f;");
  c.out();
  c("}");
  c("ladle_st4(&" + tile + "[p * GLD + f0], ladle_f4{gx[0], gx[1], gx[2], gx[3]});");
  c("ladle_st4(&" + tile + "[p * GLD + f0 + 4], ladle_f4{gx[4], gx[5], gx[6], gx[7]});");
  c.out();
  c("}");
}

// KDA: G_t = g_1 + ... + g_t in place, a thread a feature (after a barrier past the staging).
void ChunkedDeltaEmitter::kda_scan_gates(const std::string& tile) {
  // Each 16-row block's spread about its row 7 (max over its rows and features of |G_t - G_7|, the
  // diagonal blocks' fit) comes with the scan: per feature, then by shuffles over the warp, then
  // atomicMax on the float's bits (non-negative: they order as the floats) into fitw[block].
  c("if (tid < BK) {  // the per-feature cumulative sums, a thread a feature, and each block's spread about its row 7");
  c.in();
  c("float run = 0.0f;");
  c("LADLE_UNROLL for (int blk = 0; blk < C / 16; ++blk) {");
  c.in();
  c("float g_lo = 3.0e38f, g_hi = -3.0e38f, g_mid = 0.0f;");
  c("LADLE_UNROLL for (int r = 0; r < 16; ++r) {");
  c("  const int p = blk * 16 + r;");
  c("  run = " + tile + "[p * GLD + tid] = run + " + tile + "[p * GLD + tid];");
  c("  g_lo = fminf(g_lo, run), g_hi = fmaxf(g_hi, run);");
  c("  if (r == 7) g_mid = run;");
  c("}");
  c("float spread = fmaxf(g_hi - g_mid, g_mid - g_lo);");
  c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) spread = fmaxf(spread, __shfl_xor_sync(0xffffffffu, spread, d));");
  c("if (lane == 0) atomicMax(&fitw[blk], ladle_float_bits(spread));");
  c.out();
  c("}");
  c.out();
  c("}");
  c("__syncthreads();");
}

// KDA: the chunk's scores x_t . y_s 2^(G_t - G_s) (per feature) for warp rows r0..r0+15 (the block row
// I = r0 / 16) into acc[8][4], every column of blocks J <= I (the caller masks s < t or s <= t). Blocks
// J < I: A fragments x_t 2^(G_t - G_16I), B fragments y_s 2^(G_16I - G_s), both factors at most 1 whatever
// the decay. The diagonal block: against its row 7 where every |G_t - G_ref| <= FIT_LIMIT over its rows,
// else element by element (exact for any decay; only where it is needed).
void ChunkedDeltaEmitter::kda_scores(const std::string& x, const std::string& y, bool inclusive) {
  c("const int I = r0 / 16;  // the warp's block row");
  c("// Features f, f + 1 of row `row` of a bf16 tile, times 2^(sign (G_row - G_ref)), packed as bf16.");
  c("const auto kda_pair = [&](const unsigned short* tile, int row, int ref, int f, float sign) -> unsigned {");
  c("  const unsigned bits = *reinterpret_cast<const unsigned*>(&tile[row * KLD + f]);");
  c("  const float x_lo = ladle_bits_float(bits << 16) * ladle_exp2(sign * (G[row * GLD + f] - G[ref * GLD + f]));");
  c("  const float x_hi = ladle_bits_float(bits & 0xffff0000u) * ladle_exp2(sign * (G[row * GLD + f + 1] - G[ref * GLD + f + 1]));");
  c("  return ladle_pack_bf16(x_lo, x_hi);");
  c("};");
  c("const bool fits = ladle_bits_float(fitw[I]) <= FIT_LIMIT;  // the diagonal block's spread (the scan's)");
  zero("acc", "8");
  c("LADLE_UNROLL_1 for (int kt = 0; kt < BK / 16; ++kt) {");
  c.in();
  c("const int f = kt * 16 + (lane % 4) * 2, ra = r0 + lane / 4;");
  c("if (I > 0) {");
  c.in();
  c("unsigned a_off[4] = {kda_pair(" + x + ", ra, r0, f, 1.0f), kda_pair(" + x + ", ra + 8, r0, f, 1.0f), kda_pair(" + x +
    ", ra, r0, f + 8, 1.0f), kda_pair(" + x + ", ra + 8, r0, f + 8, 1.0f)};");
  c("LADLE_UNROLL for (int J = 0; J < 3; ++J)");
  c("  if (J < I)");
  c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("      const int rb = J * 16 + half * 8 + lane / 4;");
  c("      ladle_mma_bf16(acc[2 * J + half], a_off, kda_pair(" + y + ", rb, r0, f, -1.0f), kda_pair(" + y + ", rb, r0, f + 8, -1.0f));");
  c("    }");
  c.out();
  c("}");
  c("if (fits) {");
  c.in();
  c("const int rm = r0 + 7;");
  c("unsigned a_dia[4] = {kda_pair(" + x + ", ra, rm, f, 1.0f), kda_pair(" + x + ", ra + 8, rm, f, 1.0f), kda_pair(" + x +
    ", ra, rm, f + 8, 1.0f), kda_pair(" + x + ", ra + 8, rm, f + 8, 1.0f)};");
  c("LADLE_UNROLL for (int J = 0; J < 4; ++J)");
  c("  if (J == I)");
  c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("      const int rb = r0 + half * 8 + lane / 4;");
  c("      ladle_mma_bf16(acc[2 * J + half], a_dia, kda_pair(" + y + ", rb, rm, f, -1.0f), kda_pair(" + y + ", rb, rm, f + 8, -1.0f));");
  c("    }");
  c.out();
  c("}");
  c.out();
  c("}");
  c("if (!fits)  // the diagonal block element by element: 2^(G_t - G_s) per feature");
  c("  LADLE_UNROLL for (int J = 0; J < 4; ++J)");
  c("    if (J == I)");
  c("      LADLE_UNROLL for (int nt = 0; nt < 2; ++nt)");
  c("        LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
  c("          const int row = r0 + lane / 4 + (e >= 2 ? 8 : 0), col = r0 + nt * 8 + (lane % 4) * 2 + (e & 1);");
  c("          float sum = 0.0f;");
  c(std::string("          if (col ") + (inclusive ? "<=" : "<") + " row)");
  c("            for (int f = 0; f < BK; ++f)");
  c("              sum += ladle_bf16_float(" + x + "[row * KLD + f]) * ladle_bf16_float(" + y + "[col * KLD + f]) *");
  c("                     ladle_exp2(G[row * GLD + f] - G[col * GLD + f]);");
  c("          acc[2 * J + nt][e] = sum;");
  c("        }");
}

// KDA: the rows of a bf16 tile [C][KLD] times 2^(G_t) (at most 1: the decay from the chunk's start), in place.
void ChunkedDeltaEmitter::kda_scale_rows(const std::string& tile) {
  const std::string threads = std::to_string(kernel.threads);
  c("// " + tile + " times 2^(G_t), per feature, in place.");
  c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / " + threads + "; ++m) {");
  c.in();
  c("const int grp = tid + m * " + threads + ";");
  c("const int p = grp / (BK / 8), i = grp % (BK / 8) * 8;");
  c("float x8[8];");
  c("ladle_load8_bf16(x8, &" + tile + "[p * KLD + i]);");
  c("LADLE_UNROLL for (int u = 0; u < 8; ++u) x8[u] *= ladle_exp2(G[p * GLD + i + u]);");
  c("ladle_store8_bf16(&" + tile + "[p * KLD + i], x8);");
  c.out();
  c("}");
}

// KDA's outputs kernel up to P: q, k (from the inputs, through their feature maps and the L2
// normalisation) and the gates staged; G; P = tril(q k^T, per-feature decays) into registers; q times
// 2^G in place; then h and E by cp.async into the space G held.
void ChunkedDeltaEmitter::outputs_loads_kda() {
  const std::string threads = std::to_string(kernel.threads);
  c("constexpr int G_GROUPS = " + std::to_string(groups) + ";  // 64-column groups a block: warps 4g..4g+3 take group g");
  c("unsigned short* qs = reinterpret_cast<unsigned short*>(smem);  // q (features, normalised), [C][KLD]");
  c("unsigned short* ks = qs + C * KLD;                               // k (normalised), [C][KLD]");
  c("unsigned short* const hs0 = ks + C * KLD;");
  c("unsigned short* const es0 = hs0 + G_GROUPS * BK * VLD;");
  c("unsigned short* hs = hs0 + warp / 4 * BK * VLD;                  // h = S_0's 64 columns of this warp's group, [BK][VLD]");
  c("unsigned short* es = es0 + warp / 4 * C * VLD;                   // E's 64 columns, [C][VLD]");
  c("float* G = reinterpret_cast<float*>(hs0);                        // the gates [C][GLD], until h and E come");
  c("float* qscale = reinterpret_cast<float*>(hs0 + " + std::to_string(std::max(groups * (BK * VLD + C * VLD), 2 * C * GLD)) + ");");
  c("unsigned* fitw = reinterpret_cast<unsigned*>(qscale + C);  // each 16-row block's spread about its row 7 (float bits)");
  c("if (tid < C / 16) fitw[tid] = 0u;");
  c("const long long base = (gc * H + h) * C;");
  c("// 1. q, k and the gates staged; the scale.");
  c("if (tid < C) {");
  c.in();
  c("const int p = tid;");
  token_of_row("chunk");
  c("qscale[p] = " + (has(ir::Slot::scale) ? render(ir::Slot::scale, "") : std::string("1.0f")) + ";");
  c.out();
  c("}");
  stage_tile(ir::Slot::q_feature, "qs", "KLD", "BK", "K", "_i", ir::Role::query, variant.l2_normalize_qk);
  stage_tile(ir::Slot::k_feature, "ks", "KLD", "BK", "K", "_i", ir::Role::key, variant.l2_normalize_qk);
  kda_stage_gates("G");
  c("__syncthreads();");
  kda_scan_gates("G");
  c("// 2. Warp w, rows 16 (w % 4)..+15: P = tril(q k^T) with the per-feature decays, kept in registers as");
  c("//    the A operand of P E (an accumulator tile is an A fragment's layout).");
  c("const int r0 = warp % 4 * 16;");
  c("unsigned pfrag[C / 16][4];");
  c("{");
  c.in();
  kda_scores("qs", "ks", true);
  c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int row = r0 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
  c("    pfrag[nt / 2][(nt % 2) * 2 + half] = ladle_pack_bf16(col <= row ? acc[nt][2 * half] : 0.0f, col + 1 <= row ? acc[nt][2 * half + 1] : 0.0f);");
  c("  }");
  c.out();
  c("}");
  c("__syncthreads();  // every warp's P is formed: q may change");
  kda_scale_rows("qs");
  c("__syncthreads();  // G is spent: h and E take its space");
  outputs_fetch_h_e("G_GROUPS");
  c("ladle_cp_async_commit();");
  c("ladle_cp_async_wait<0>();");
  c("__syncthreads();");
  c("if (vb * 64 >= VPAD) return;  // a group past V (V over 128 with an odd number of 64-column blocks)");
}

}  // namespace ladle::cuda::detail

