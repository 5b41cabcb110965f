// The parts of the ws kernel every form shares: its constants and shared memory layout, the block's
// sequence, what the producer copies per stage, the consumers' setup and the state as it enters, and
// the pieces of a chunk (the wgmma batch, P's fragments, the gate at a box row, o's store, the
// state's stores).
#include "chunked_ws_emit.h"

namespace ladle::cuda::detail {

void WsEmitter::constants() const {
  c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", BV = " + std::to_string(BV) +
    ", KB = BK / 64, CONSUMERS = BV / 64, STAGES = " + std::to_string(STAGES) + ";");
  c("constexpr unsigned BOX = C * 128;  // bytes of a box: C tokens of 64 16-bit features, 128-byte rows");
  if (states) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the key-side gate, copied as k is");
    c("constexpr unsigned STAGE_BYTES = (KB + GB * KB + CONSUMERS) * BOX;  // k boxes, the gate's boxes, one v box per consumer");
    c("constexpr int QB = 0, VB = KB + GB * KB;  // the state pass copies no q: k boxes first; v's box");
  } else if (vgate) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the value-side gate, copied as v is");
    c("constexpr unsigned STAGE_BYTES = (2 * KB + CONSUMERS + GB * CONSUMERS) * BOX;  // q, k, v boxes, the gate's boxes per consumer");
    c("constexpr int QB = KB, VB = 2 * KB, GVB = 2 * KB + CONSUMERS;  // the first k box, v's box, the gate's first box");
    c("constexpr float FIT_LIMIT = 100.0f;  // the largest |log2 factor| of vt and o's");
    c("constexpr int GS = 72;  // G's row stride in floats (72 = 8 mod 32: a warp's 8 rows of float2 loads hit every bank once)");
  } else if (kserial) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the key-side gate, copied as k is");
    c("constexpr unsigned STAGE_BYTES = (2 * KB + GB * KB + CONSUMERS) * BOX;  // q boxes, k boxes, the gate's boxes, one v box per consumer");
    c("constexpr int QB = KB, VB = 2 * KB + GB * KB;  // q boxes before the k boxes (QB: the first k box); v's box");
    c("constexpr int NT = 128 * CONSUMERS, PARTS = NT / BK, TP = C / PARTS;  // consumer threads; threads per key feature, steps each");
    c("constexpr float FIT_LIMIT = 100.0f;  // the largest |log2 factor| of q~ and k~");
  } else {
    c("constexpr unsigned STAGE_BYTES = (2 * KB + CONSUMERS) * BOX;  // q boxes, k boxes, one v box per consumer");
    c("constexpr int QB = KB, VB = 2 * KB;  // q boxes before the k boxes; v's box");
  }
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("constexpr float GATE_FLOOR = -256.0f;  // log2 gates below it (-inf: a hard reset) count as it: 2^-256 = 0");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("(void)LOG2E; (void)GATE_FLOOR;");
}

void WsEmitter::shared_layout() const {
  c("// Shared memory from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 bytes):");
  if (vgate) {
    c("//   ring [STAGES][2 KB + CONSUMERS + GB CONSUMERS][C][64] q, k, v and the gate's boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state, read by o = q st (swizzled)");
    c("//   vt_all [CONSUMERS][C][64] bf16                 v 2^(R - G_s) (swizzled); P [C][C] where a column does not fit");
    c("//   gv_all [CONSUMERS][C][GS] f32                  G per step and column (rows padded to GS = 72)");
    c("//   part_all [CONSUMERS][8][64] f32                each half's sum, low and high per column, the midpoints R, pend");
    c("//   vfail_all [CONSUMERS][4]                       whether a column does not fit (this chunk's word, the next's)");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  } else if (kserial) {
    c("//   ring [STAGES][2 KB + GB KB + CONSUMERS][C][64] q, k, the gate's and v boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state times the step's 2^(R - G_t0-1) (swizzled)");
    c("//   qi, ki [KB][C][64] bf16                        q~ and k~ of the step (swizzled), shared by the consumers");
    c("//   tot, llo, lhi [PARTS][BK] f32                  each part's log2 sum per feature and its range from the part's start");
    c("//   pre, post [BK] f32                             the step's factors per key row: 2^(R - G_t0-1), 2^(G_t1-1 - R)");
    c("//   fitw [2]                                       which windows (bits 0-7) and whether the chunk (bit 8) do not fit");
    c("//   bq [2][C] f32                                  a read before the update's bonus q . u . k per step (two chunks)");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  } else {
    c("//   ring [STAGES][QB + KB + CONSUMERS][C][64] bf16 q boxes, k boxes, v boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state, read by o = q st (swizzled; not in the state pass)");
    c("//   vup_all [CONSUMERS][C][64] bf16                each consumer's v rows times 2^(G_C - G_s) (swizzled)");
    c("//   gate_all [CONSUMERS * 4][C] f32                each consumer warp's cumulative log2 decay");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  }
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("unsigned char* const base = smem + (1024 - ladle_shared_address(smem) % 1024) % 1024;");
  c("unsigned short* const ring = reinterpret_cast<unsigned short*>(base);");
  c("unsigned short* const st_all = reinterpret_cast<unsigned short*>(base + STAGES * STAGE_BYTES);");
  if (vgate) {
    c("unsigned short* const vt_all = st_all + CONSUMERS * BK * 64;");
    c("float* const gv_all = reinterpret_cast<float*>(vt_all + CONSUMERS * C * 64);");
    c("float* const part_all = gv_all + CONSUMERS * C * GS;");
    c("unsigned* const vfail_all = reinterpret_cast<unsigned*>(part_all + CONSUMERS * 8 * 64);");
    c("unsigned long long* const full = reinterpret_cast<unsigned long long*>(vfail_all + CONSUMERS * 4);");
  } else if (kserial) {
    c("unsigned short* const qi = st_all + CONSUMERS * BK * 64;");
    c("unsigned short* const ki = qi + KB * C * 64;");
    c("float* const tot = reinterpret_cast<float*>(ki + KB * C * 64);");
    c("float* const llo = tot + PARTS * BK;");
    c("float* const lhi = llo + PARTS * BK;");
    c("float* const pre = lhi + PARTS * BK;");
    c("float* const post = pre + BK;");
    c("unsigned* const fitw = reinterpret_cast<unsigned*>(post + BK);");
    c("float* const bq = reinterpret_cast<float*>(fitw + 4);  // [2][C]: the bonus read per step, this chunk's and the last's");
    c("(void)bq;");
    c("unsigned long long* const full = reinterpret_cast<unsigned long long*>(bq + 2 * C);");
  } else {
    c(std::string("unsigned short* const vup_all = st_all + ") + (states ? "0" : "CONSUMERS * BK * 64") + ";");
    c(std::string("constexpr int UPD = ") + (kgate ? "KB * C * 64;  // kup = k 2^(G_C - G_s) per consumer (a key-side gate)" : "C * 64;  // vup per consumer"));
    c("float* const gate_all = reinterpret_cast<float*>(vup_all + CONSUMERS * UPD);");
    c(std::string("float* const gtot_all = gate_all + CONSUMERS * 4 * C;  // ") + (kgate ? "[CONSUMERS][BK]: the chunk's log2 decay per key feature" : "(none)"));
    c(std::string("unsigned long long* const full = reinterpret_cast<unsigned long long*>(gtot_all + ") + (kgate ? "CONSUMERS * BK" : "0") + ");");
  }
  c("unsigned long long* const empty = full + STAGES;");
}

// The block's value columns, sequence and head, each input's head, the sequence's length in chunks.
void WsEmitter::sequence() const {
  c("const int v0 = blockIdx.x * BV;  // the block's first value column");
  c(states ? "const int n = blockIdx.z / H, h = blockIdx.z % H;" : "const int n = blockIdx.y / H, h = blockIdx.y % H;");
  emit_sequence_bounds(c, segmented, spec.varlen);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of.used[k] && inputs[k].kind != ir::InputKind::scalar) c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H;");
  c("const long long length = eos - bos;");
  c("const int chunks = static_cast<int>((length + C - 1) / C);");
}

// The form's flags that the first thread clears beside the ring's mbarriers.
void WsEmitter::fit_words_init() const {
  if (kserial) c("  fitw[0] = fitw[1] = 0u;");
  if (vgate) c("  for (int w = 0; w < CONSUMERS * 4; ++w) vfail_all[w] = 0u;");
}

// The copies of a chunk into its stage (dst, row0 and stage in scope): q (not in the state pass), k,
// v per consumer, the gate's inputs beside k or v.
void WsEmitter::producer_copies() const {
  if (!states)
    c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + kb * (BOX / 2), &q_map, kb * 64, row0, " + id[qi] + "_head, b, &full[stage]);");
  c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + (QB + kb) * (BOX / 2), &k_map, kb * 64, row0, " + id[ki] +
    "_head, b, &full[stage]);");
  c("for (int j = 0; j < CONSUMERS; ++j)");
  c("  ladle_tma_load_4d(dst + (VB + j) * (BOX / 2), &v_map, v0 + 64 * j, row0, " + id[vi] + "_head, b, &full[stage]);");
  for (int gi = 0; gi < GB; ++gi)
    if (vgate)
      c("for (int j = 0; j < CONSUMERS; ++j) ladle_tma_load_4d(dst + (GVB + " + std::to_string(gi) + " * CONSUMERS + j) * (BOX / 2), &" +
        id[gate_boxes[gi]] + "_map, v0 + 64 * j, row0, " + id[gate_boxes[gi]] + "_head, b, &full[stage]);");
    else
      c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + (QB + KB + " + std::to_string(gi) + " * KB + kb) * (BOX / 2), &" +
        id[gate_boxes[gi]] + "_map, kb * 64, row0, " + id[gate_boxes[gi]] + "_head, b, &full[stage]);");
}

void WsEmitter::consumer_setup() const {
  c("// 2. The consumers. Accumulator layout (wgmma m64nNk16, per warp as mma.sync's): thread (warp, gid, tig)");
  c("//    holds rows 16 warp + gid (+ 8 for r >= 2) and columns 8 nb + 2 tig (+ 1 for odd r).");
  c("const int consumer = threadIdx.x / 128 - 1, wt = threadIdx.x % 128, warp = wt / 32, lane = threadIdx.x % 32;");
  c("const int gid = lane / 4, tig = lane % 4;");
  c("const int cv0 = v0 + 64 * consumer;  // this consumer's first value column");
  c("unsigned short* const st = st_all + consumer * BK * 64;");
  if (!kserial && !vgate) {
    c("unsigned short* const vup = vup_all + consumer * UPD;");
    if (kgate) c("float* const gtot = gtot_all + consumer * BK;");
    c("float* const gsum = gate_all + (consumer * 4 + warp) * C;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of.used[k] && inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
        "_stride_h);");
  c("const float read_scale = " + (variant.has(ir::Slot::scale) ? render_slot(variant, id, ir::Slot::scale, "") : std::string("1.0f")) +
    ";");
  // Byte offset of a swizzled 16-bit element (row, col) of a [rows][64] region at a 1024-aligned base.
  c("// Element (row, col < 64) of a 128-byte-swizzled [rows][64] region: its 16-byte piece col / 8 lands at");
  c("// piece (col / 8) ^ (row % 8) of the row.");
  c("const auto swz = [](int row, int col) { return row * 64 + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7)); };");
  c("");
  c("// The state columns [cv0, cv0 + 64) of every key row: S[mt][nb][r] is key row 64 mt + 16 warp + gid + 8 (r / 2),");
  c("// column cv0 + 8 nb + 2 tig + r % 2.");
  c("float S[KB][8][4];");
}

// A loop over this thread's elements of S, its key row feat and value column col in scope.
void WsEmitter::for_state(const std::function<void()>& body) const {
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("    LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
  c.in(), c.in(), c.in();
  c("const int feat = 64 * mt + 16 * warp + gid + 8 * (r / 2), col = cv0 + 8 * nb + 2 * tig + (r & 1);");
  body();
  c.out(), c.out(), c.out();
  c("    }");
}

// S as the block enters its sequence: the initial state (or zero), then for a segment its earlier
// segments folded in.
void WsEmitter::entering_state() const {
  std::string start = spec.initial_state ? "ladle_load(initial_state + ((" + sequence_index + " * H + h) * K + feat) * V + col)" : "0.0f";
  for_state([&] {
    c(start == "0.0f" ? std::string("S[mt][nb][r] = 0.0f; (void)feat; (void)col;")
                      : "S[mt][nb][r] = feat < K && col < V ? " + start + " : 0.0f;");
  });
  if (segmented && !states) fold_earlier_segments();
}

// The fold of the earlier segments (or pieces), here rather than in a kernel of its own: this
// block's columns of each one's own state L_j after its decay D_j, in order.
void WsEmitter::fold_earlier_segments() const {
  c("// The state entering this segment: each earlier segment's (or piece's) own state folded in order,");
  c("// S = 2^D_j S + L_j (segment_states and segment_decay rows seg[5] .. seg[5] + seg[4] - 1).");
  c("for (long long j = seg[5]; j < seg[5] + seg[4]; ++j) {");
  c.in();
  c(std::string("const float dj = ") + (has_gate ? "ladle_exp2(segment_decay[j * H + h])" : "1.0f") + ";");
  c("const float* const lj = segment_states + (j * H + h) * K * V;");
  if (kgate) {
    // The decay per key row once, before the loads (per element, the fold spilled registers).
    c("const float* const dk = segment_decay + (j * H + h) * K;  // the key-side gate's log2 total per feature");
    c("float dec[KB][2];");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
    c("    dec[mt][half] = feat < K ? ladle_exp2(dk[feat]) : 1.0f;");
    c("  }");
  }
  if (vgate) {
    // The decay per value column once, as for a key-side gate's rows (segment_decay's rows of V).
    c("float dec[8][2];");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
    c("    const int col = cv0 + 8 * nb + 2 * tig + e;");
    c("    dec[nb][e] = col < V ? ladle_exp2(segment_decay[(j * H + h) * V + col]) : 1.0f;");
    c("  }");
  }
  const std::string decay = kgate ? "dec[mt][r / 2]" : vgate ? "dec[nb][r & 1]" : "dj";
  for_state([&] {
    c("if (feat < K && col < V) S[mt][nb][r] = " + decay + " * S[mt][nb][r] + lj[static_cast<long long>(feat) * V + col];");
  });
  if (kgate || vgate) c("(void)dj;");
  c.out();
  c("}");
}

void WsEmitter::descriptors() const {
  c("// One descriptor for every operand (128-byte swizzle, SBO 1024: the next 8 rows; LBO: the next box):");
  c("// a product adds its operand's byte offset / 16 to the start address (shared memory ends below");
  c("// 256 KiB, so the sum never carries out of bits 0-13).");
  c("const unsigned long long desc = ladle_wgmma_desc_sw128(ring, BOX, 1024);");
  c("const unsigned st_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(st) - base);");
  c("(void)st_offset; (void)st;");
  if (states) c("float segment_log = 0.0f;  // the segment's total log2 decay (a key-side gate: key feature wt's)");
  if (!kserial && !vgate) c("const unsigned vup_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(vup) - base);");
}

// o, two columns at a time, for the rows ta and tb that are tokens of the sequence.
void WsEmitter::store_o() const {
  c("// 2f. o, two columns at a time, for the rows that are tokens of the sequence.");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c.in();
  c("const long long pos = row0 + (half ? tb : ta);");
  c("if (pos < bos || pos >= eos) continue;");
  c("auto* const o_row = o + b * o_stride_b + pos * o_stride_t + h * o_stride_h;");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
  c.in();
  c("const int col = cv0 + 8 * nb + 2 * tig;");
  c("if (col >= V) continue;");
  c("const float x0 = o_acc[nb][2 * half], x1 = o_acc[nb][2 * half + 1];");
  c("if (o_stride_d == 1) {");
  c("  ladle_store2(o_row + col, x0, x1, col + 1 < V);");
  c("} else {");
  c("  ladle_store(o_row + col * o_stride_d, x0);");
  c("  if (col + 1 < V) ladle_store(o_row + (col + 1) * o_stride_d, x1);");
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
}

// The batch of the serial kernel without a key-side gate: score = q k^T, o = q st, S += k^T U with U
// at byte offset `update` (vup, or vt for a value-side gate).
void WsEmitter::batch(const std::string& update) const {
  const std::string name = update.substr(0, update.find('_'));
  c("// 2c. One batch: score = q k^T (both K-major), o = q st (st N-major), S += k^T " + name + " (k M-major, " + name);
  c("//     N-major). q's and k's next 16 features are 32 bytes on in the row, the next 64 in the next box;");
  c("//     st's, " + name + "'s and k^T's next 16 rows 2048 bytes on.");
  c("float score[8][4], o_acc[8][4];");
  c("ladle_wgmma_fence_operand<64>(score);");
  c("ladle_wgmma_fence_operand<64>(o_acc);");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
  c("  ladle_wgmma_ss_bf16<64>(score, desc + (stage_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
  c("                          desc + (stage_offset + (KB + kt / 4) * BOX + (kt % 4) * 32) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
  c("  ladle_wgmma_ss_bf16_tb<64>(o_acc, desc + (stage_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
  c("                             desc + (st_offset + kt * 2048) / 16, kt > 0);");
  c("ladle_wgmma_commit();");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
  c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (stage_offset + (KB + mt) * BOX + kk * 2048) / 16, desc + (" + update +
    " + kk * 2048) / 16);");
  c("ladle_wgmma_commit();");
}

// P's bf16 fragments (the A operand of o += P v) from the scores once their batch is done: element
// r of column block nb is `value`, with step_s (the key's step) and step_t (the row's) in scope.
void WsEmitter::p_fragments(const std::string& value) const {
  c("ladle_wgmma_wait<2>();");
  c("ladle_wgmma_fence_operand<64>(score);");
  c("unsigned p_frag[4][4];");
  c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
  c.in();
  c("float p[4];");
  c("LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
  c.in();
  c("const int s = 8 * nb + 2 * tig + (r & 1);");
  c("const int step_s = REVERSE ? C - 1 - s : s, step_t = r < 2 ? step_a : step_b;");
  c("p[r] = " + value + ";");
  c.out();
  c("}");
  c("p_frag[nb / 2][(nb % 2) * 2] = ladle_pack_bf16(p[0], p[1]);");
  c("p_frag[nb / 2][(nb % 2) * 2 + 1] = ladle_pack_bf16(p[2], p[3]);");
  c.out();
  c("}");
}

// The gate's log2 value lg at box row `row`, column `col` of its inputs' boxes (box(gi): input gi's box
// in the stage; stage_offset in scope), floored at GATE_FLOOR: the value side's slot or the key side's.
void WsEmitter::gate_value_at(const std::string& row, const std::string& col, const std::function<std::string(int)>& box) const {
  for (int gi = 0; gi < GB; ++gi) {
    const int k = gate_boxes[gi];
    c("const float " + id[k] + "_x = ladle_load(reinterpret_cast<const " + std::string(storage_type(spec.input_types[k])) +
      "*>(ring + (stage_offset + (" + box(gi) + ") * BOX) / 2 + swz(" + row + ", " + col + ")));");
  }
  c("const float x = LOG2E * (" + render_slot(variant, id, vgate ? ir::Slot::log_decay_v : ir::Slot::log_decay_k, "_x") + ");");
  c("const float lg = x > GATE_FLOOR ? x : GATE_FLOOR;");
}

// The key-side gate's at box row `row` of key feature fb * 64 + fc (fb, fc in scope).
void WsEmitter::key_gate_at(const std::string& row) const {
  gate_value_at(row, "fc", [](int gi) { return "QB + KB + " + std::to_string(gi) + " * KB + fb"; });
}

// The value-side gate's at box row `row` of this consumer's column `col` (its boxes per consumer).
void WsEmitter::value_gate_at(const std::string& row, const std::string& col) const {
  gate_value_at(row, col, [](int gi) { return "GVB + " + std::to_string(gi) + " * CONSUMERS + consumer"; });
}

// The state pass's segment state and total decay; the final state.
void WsEmitter::state_stores() const {
  if (states) {
    c("");
    c("// The segment's own final state and total log2 decay, for the fold and the segments after it.");
    for_state([&] {
      c("if (feat < K && col < V) segment_states[((static_cast<long long>(n) * H + h) * K + feat) * V + col] = S[mt][nb][r];");
    });
    if (kgate) c("if (blockIdx.x == 0 && consumer == 0 && wt < K) segment_decay[(static_cast<long long>(n) * H + h) * K + wt] = segment_log;");
    else if (has_gate) c("if (blockIdx.x == 0 && consumer == 0 && wt == 0) segment_decay[static_cast<long long>(n) * H + h] = segment_log;");
  }
  if (spec.final_state) {
    c("");
    if (segmented) c("if (seg[6] != 0) {  // the sequence's last segment");
    for_state([&] {
      c("if (feat < K && col < V) final_state[((" + sequence_index + " * H + h) * K + feat) * V + col] = S[mt][nb][r];");
    });
    if (segmented) c("}");
  }
}

}  // namespace ladle::cuda::detail
