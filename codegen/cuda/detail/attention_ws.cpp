// The warp-specialised Hopper pipeline of the softmax-attention family (AttentionTile::mma = ws,
// sm_90a): a producer warpgroup loading q once and K, V tile by tile with TMA into a ring of
// shared-memory stages guarded by mbarriers, and consumer warpgroups overlapping their wgmma
// products with the softmax. See codegen/cuda/attention.h for the schedule.
//
// Shared memory (from a 1024-byte aligned base: the 128-byte swizzle repeats every 1024 bytes and
// wgmma's descriptors assume the pattern starts there):
//   q_tile [DPB / 64][BM][64]    boxes of 64 head-dim columns, one 128-byte row per token
//   k_tile [STAGES][DPB / 64][BN][64], v_tile [STAGES][DVPB / 64][BN][64]
//   mbarriers full_k, full_v, empty_k, empty_v [STAGES], q_full
// TMA writes each 128-byte row r with its 16-byte pieces permuted (piece p at p ^ (r % 8)); the
// descriptors say so (swizzle mode 1) and wgmma undoes it:
//   q and K as K-major operands: 8 rows at SBO = 1024 bytes, the next 16 of D 32 bytes further
//   within the row (the start address advances; LBO unused), the next 64 of D in the next box;
//   V as the N-major B of o += P V: 64 of Dv per 128-byte row, the next 64 at LBO = BN * 128
//   bytes (the next box), the next 8 keys at SBO = 1024, the next 16 keys 2048 bytes further.
#include "attention_parts.h"

namespace ladle::cuda::detail {

std::string ws_helpers() {
  return "#include <ladle/codegen/device/pipeline.cuh>\n";
}

void emit_ws_shared(Code& c, const AttentionParts& parts) {
  const bool persistent = parts.spec.persistent;
  c("// Shared memory from a 1024-byte aligned base: q [DPB / 64][BM][64], per stage K [DPB / 64][BN][64] and");
  c("// V [DVPB / 64][BN][64] (boxes of 64 head-dim columns as TMA writes them, 128-byte swizzle), then the");
  c("// mbarriers: full (the copy landed) and empty (every consumer warp is done) per stage for K and for V,");
  c(persistent ? "// full and empty per q tile (a ring of Q_TILES, a round per work item), and the items the producer drew."
               : "// and one for q.");
  c("constexpr int DPB = (D + 63) / 64 * 64, DVPB = (DV + 63) / 64 * 64;  // head dims in whole boxes");
  c("constexpr unsigned Q_BYTES = BM * DPB * 2, K_BYTES = BN * DPB * 2, V_BYTES = BN * DVPB * 2;");
  const int q_tiles = persistent ? attention_ws_q_stages(parts.spec.tile, parts.spec.D, parts.spec.Dv) : 1;
  c("constexpr int Q_TILES = " + std::to_string(q_tiles) + ";  // q tiles the layout holds" +
    (persistent ? " (a ring: the next item's q lands while this one's is read)" : ""));
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("unsigned char* const aligned_smem = smem + (1024 - ladle_shared_address(smem) % 1024) % 1024;");
  c("unsigned short* const q_tile = reinterpret_cast<unsigned short*>(aligned_smem);");
  c("unsigned short* const k_tile = reinterpret_cast<unsigned short*>(aligned_smem + Q_TILES * Q_BYTES);");
  c("unsigned short* const v_tile = reinterpret_cast<unsigned short*>(aligned_smem + Q_TILES * Q_BYTES + STAGES * K_BYTES);");
  c("unsigned long long* const full_k = reinterpret_cast<unsigned long long*>(aligned_smem + Q_TILES * Q_BYTES + STAGES * (K_BYTES + V_BYTES));");
  c("unsigned long long* const full_v = full_k + STAGES;");
  c("unsigned long long* const empty_k = full_k + 2 * STAGES;");
  c("unsigned long long* const empty_v = full_k + 3 * STAGES;");
  c("unsigned long long* const q_full = full_k + 4 * STAGES;");
  if (parts.tensor_sums) {
    c("// The B operand of the row sums (P times ones): 1 KB of 16-bit ones after the mbarriers, 128-byte aligned;");
    c("// every element the sums' descriptor reaches (8 columns x 16 keys, LBO 128, SBO 256 bytes) is a one.");
    c("unsigned short* const ones_tile = reinterpret_cast<unsigned short*>(aligned_smem + (Q_TILES * Q_BYTES + STAGES * (K_BYTES + V_BYTES) + 8 * (4 * STAGES + 6) + 127) / 128 * 128);");
    c("for (int i = threadIdx.x; i < 512; i += blockDim.x) ones_tile[i] = " + std::string(parts.pv_f16 ? "0x3C00" : "0x3F80") + ";  // 1.0");
    c("ladle_fence_proxy_async();  // the ones, written by threads, are read by the tensor cores");
  }
  if (persistent) {
    c("unsigned long long* const q_empty = full_k + 4 * STAGES + 2;");
    c("// The item of q round r at item_slot[2 (r % Q_TILES)] (8 bytes a slot).");
    c("volatile int* const item_slot = reinterpret_cast<volatile int*>(full_k + 4 * STAGES + 4);");
    c("// Round r of the K and V rings (every item's key tiles, one after the other) in stage r % STAGES");
    c("// (codegen/device/pipeline.cuh); the block's item_round-th item's q in that round of a ring of Q_TILES.");
    c("const ladle_stage_ring<STAGES> k_ring{full_k, empty_k}, v_ring{full_v, empty_v};");
    c("const ladle_stage_ring<Q_TILES> q_ring{q_full, q_empty};");
  } else {
    c("// Tile t's K and V in stage t % STAGES of their rings (codegen/device/pipeline.cuh), q behind a latch.");
    c("const ladle_stage_ring<STAGES> k_ring{full_k, empty_k}, v_ring{full_v, empty_v};");
    c("const ladle_copy_latch q_latch{q_full};");
  }
  c("if (threadIdx.x == 0) {");
  c("  k_ring.init(WARPS);  // a stage is free again once every consumer warp released it");
  c("  v_ring.init(WARPS);");
  c(persistent ? "  q_ring.init(WARPS);" : "  q_latch.init();");
  c("  ladle_fence_barrier_init();");
  c("}");
  c("__syncthreads();  // the only block-wide barrier: the producer leaves after its copies");
  c("");
}

namespace {

// One item's K and V copies, rounds `round`.. of the rings (the producer's thread).
void emit_ws_kv_copies(Code& c, const std::string& round) {
  c("for (int tile = tile_begin; tile < tile_end; ++tile) {");
  c.in();
  c("const int it = " + round + "tile - tile_begin, stage = it % STAGES;");
  c("k_ring.acquire(it, K_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb)");
  c("  ladle_tma_load_4d(k_tile + stage * (K_BYTES / 2) + cb * BN * 64, &k_map, cb * 64, k_row + tile * BN, hk, b, &full_k[stage]);");
  c("v_ring.acquire(it, V_BYTES);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb)");
  c("  ladle_tma_load_4d(v_tile + stage * (V_BYTES / 2) + cb * BN * 64, &v_map, cb * 64, k_row + tile * BN, hk, b, &full_v[stage]);");
  c.out();
  c("}");
}

std::string producer_roles(const AttentionParts& parts) {
  const bool split = parts.consumer_registers > 0;  // the producer's registers go to the consumers
  return "if (ladle_producer_warpgroup<" + std::to_string(split ? parts.producer_registers : 0) + ", " +
         std::to_string(split ? parts.consumer_registers : 0) + ">()) {";
}

}  // namespace

void emit_ws_producer(Code& c, const AttentionParts& parts) {
  c("// 1. The producer warpgroup: one thread issues every copy, in the order the consumers use them. A");
  c("//    stage is refilled once every consumer warp has released it (empty), one phase per round.");
  c(producer_roles(parts));
  c.in();
  c("if (threadIdx.x == 0) {");
  c.in();
  c("const int q_row = static_cast<int>(q_bos) + m0, k_row = static_cast<int>(k_bos);");
  c("q_latch.expect(Q_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb) ladle_tma_load_4d(q_tile + cb * BM * 64, &q_map, cb * 64, q_row, h, b, q_full);");
  emit_ws_kv_copies(c, "");
  emit_producer_exit(c);
  c("");
}

namespace {

// The consumers' values that outlive a key loop: the descriptors, P's fragments, the scores and the
// ping-pong turns.
void emit_ws_consumer_setup(Code& c, const AttentionParts& parts) {
  c("// The descriptors of this warpgroup's q rows and of the first K and V stages, formed once: a");
  c("// product's own adds its byte offset / 16 to the start address (bits 0-13; shared memory ends");
  c("// below 256 KiB, so the sum never carries out of them).");
  c("const unsigned long long q_desc = ladle_wgmma_desc_sw128(q_tile + warpgroup * 64 * 64, 16, 1024);");
  c("const unsigned long long k_desc = ladle_wgmma_desc_sw128(k_tile, 16, 1024);");
  c("const unsigned long long v_desc = ladle_wgmma_desc_sw128(v_tile, BN * 128, 1024);");
  c("unsigned p_frag[BN / 16][4];  // P of the previous tile: the register A operand of its P V");
  if (parts.tensor_sums) c("const unsigned long long ones_desc = ladle_wgmma_desc(ones_tile, 128, 256);");
  c("float score[BN / 8][4];");
  if (parts.spec.tile.warps == 8) c("const ladle_pingpong turns{warpgroup};");
}

// Steps 3 to 6 over one block's (one item's) key tiles. Persistent: the rings' rounds continue
// from `round`, and q goes back to the producer (round item_round of its ring) once the last q k^T is done.
void emit_ws_key_loop(Code& c, const AttentionParts& parts) {
  const bool persistent = parts.spec.persistent;
  const std::string base = persistent ? "round + " : "";
  const std::string ss = parts.qk_f16 ? "ladle_wgmma_ss_f16<BN>" : "ladle_wgmma_ss_bf16<BN>";
  const std::string rs = parts.pv_f16 ? "ladle_wgmma_rs_f16<DVP>" : "ladle_wgmma_rs_bf16<DVP>";
  // The text of one tile's scores: issue q k^T into score (its first product overwrites it), and
  // P V of the tile before it. ptxas keeps wgmma asynchronous only where no other instruction touches an
  // accumulator between its issue and the wait that completes it, so the issues are straight-line
  // code with every register access before the fence.
  // The mbarrier waits (loops) come before the fence: ptxas fences again where code runs between.
  // Two consumer warpgroups take turns issuing (ladle_pingpong, pipeline.cuh): a warpgroup waits for
  // its turn once its data has landed, issues, then hands the turn over, so that one warpgroup's
  // products run while the other forms its softmax.
  const bool pingpong = parts.spec.tile.warps == 8;
  const auto take_turn = [&] {
    if (pingpong) c("turns.take_turn();");
  };
  const auto pass_turn = [&](bool last) {
    if (pingpong) c(last ? "turns.pass_last_turn();" : "turns.pass_turn();");
  };
  const auto issue_scores = [&](const std::string& stage, const std::string& round, const std::string& also_wait) {
    c("k_ring.wait(" + round + ");");
    if (!also_wait.empty()) c(also_wait);
    take_turn();
    c("ladle_wgmma_fence_operand<BN>(score);");
    c("ladle_wgmma_fence_operand<DVP>(o_acc);");
    if (parts.tensor_sums) c("ladle_wgmma_fence_operand<8>(sum_acc);");
    c("ladle_wgmma_fence();");
    c("// 3. score = q k^T: one m64nBNk16 per 16 of D, both K-major and swizzled (SBO 1024: the next 8");
    c("//    rows; the next 16 of D 32 bytes on within the 128-byte row, the next 64 in the next box). The");
    c("//    first product overwrites score (scale-d = 0): no zeroing.");
    c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt)");
    c("  " + ss + "(score, " + std::string(persistent ? "q_item_desc" : "q_desc") + " + ((kt / 4) * BM * 64 + (kt % 4) * 16) * 2 / 16,");
    c("      k_desc + (" + stage + " * K_BYTES + ((kt / 4) * BN * 64 + (kt % 4) * 16) * 2) / 16, kt > 0);");
    c("ladle_wgmma_commit();");
  };
  const auto issue_pv = [&](const std::string& stage) {
    c("// 6. o_acc += P V of the tile before: one m64nDVPk16 per 16 keys, V N-major and swizzled (SBO");
    c("//    1024: the next 8 keys; LBO BN * 128: the next 64 of Dv, in the next box).");
    c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk)");
    c("  " + rs + "(o_acc, p_frag[kk], v_desc + (" + stage + " * V_BYTES + kk * 16 * 64 * 2) / 16);");
    if (parts.tensor_sums) {
      c("//    The rows' sums of P beside it: P times ones, one m64n8k16 per 16 keys (sum_acc: every column the sum).");
      c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk) " + std::string(parts.pv_f16 ? "ladle_wgmma_rs_f16<8>" : "ladle_wgmma_rs_bf16<8>") +
        "(sum_acc, p_frag[kk], ones_desc);");
    }
    c("ladle_wgmma_commit();");
  };
  // Logits, softmax, then (after P V completes, where one is in flight) o_acc's rescale and P packed.
  const auto consume_scores = [&](bool pv_in_flight) {
    c("ladle_wgmma_fence_operand<BN>(score);");
    c("k_ring.release(it, lane);");
    c("const int j0 = tile * BN;");
    c("");
    emit_logits(c, parts);
    emit_online_softmax(c, parts, true);
    if (pv_in_flight) {
      c("ladle_wgmma_wait<0>();  // P V of the tile before done: o_acc and p_frag are free, its V stage too");
      c("ladle_wgmma_fence_operand<DVP>(o_acc);");
      if (parts.tensor_sums) c("ladle_wgmma_fence_operand<8>(sum_acc);");
      c("v_ring.release(it - 1, lane);");
    }
    emit_o_rescale(c, parts);
    emit_pack_p(c, parts);
  };

  c("if (tile_begin < tile_end) {");
  c.in();
  if (pingpong && !persistent) c("turns.start();");  // persistent: once before the items
  c("{");
  c.in();
  if (persistent) {
    c("const int tile = tile_begin, it = round, stage = it % STAGES;");
    issue_scores("stage", "it", "");
  } else {
    c("const int tile = tile_begin, it = 0, stage = 0;");
    issue_scores("0", "0", "");
  }
  pass_turn(false);
  c("ladle_wgmma_wait<0>();");
  consume_scores(false);
  c.out();
  c("}");
  c("for (int tile = tile_begin + 1; tile < tile_end; ++tile) {");
  c.in();
  c("const int it = " + base + "tile - tile_begin, stage = it % STAGES, prev = (it + STAGES - 1) % STAGES;");
  issue_scores("stage", "it", "v_ring.wait(it - 1);");
  issue_pv("prev");
  pass_turn(false);
  c("ladle_wgmma_wait<1>();  // q k^T done; P V may still run");
  consume_scores(true);
  c.out();
  c("}");
  if (persistent) c("q_ring.release(item_round, lane);  // the item's last q k^T is done: the producer may copy the next q");
  c("{  // the last tile's P V");
  c.in();
  c("const int last = " + base + "tile_end - 1 - tile_begin, prev = last % STAGES;");
  c("v_ring.wait(last);");
  take_turn();
  c("ladle_wgmma_fence_operand<DVP>(o_acc);");
  if (parts.tensor_sums) c("ladle_wgmma_fence_operand<8>(sum_acc);");
  c("ladle_wgmma_fence();");
  issue_pv("prev");
  pass_turn(!persistent);  // persistent: the turns go on into the next item
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<DVP>(o_acc);");
  if (parts.tensor_sums) c("ladle_wgmma_fence_operand<8>(sum_acc);");
  c("v_ring.release(last, lane);");
  c.out();
  c("}");
  c.out();
  c(persistent ? "} else {" : "}");
  if (persistent) {
    c("  q_ring.release(item_round, lane);  // no key tiles: q was not read");
    c("}");
  }
  c("");
}

}  // namespace

void emit_ws_consumer_loop(Code& c, const AttentionParts& parts) {
  c("// 2. The key loop. The first tile's scores alone; then iteration t issues tile t's q k^T and tile");
  c("//    t-1's P V together, reads the scores as soon as the first is done (the second still running)");
  c("//    and forms tile t's P while P V finishes; the last P V after the loop. A stage goes back to");
  c("//    the producer (empty) as soon as its product has read it.");
  emit_ws_consumer_setup(c, parts);
  c("q_latch.wait();");
  emit_ws_key_loop(c, parts);
}

void emit_ws_persistent(Code& c, const AttentionParts& parts, const WsItemParts& item) {
  emit_ws_shared(c, parts);
  c("const int items = sequences * H * row_blocks;");
  c("// 1. The producer warpgroup: one thread draws the work items (the first blockIdx.x, then from");
  c("//    work_counter) and, per item, publishes it with q's copy (round item_round of q's ring: the consumers");
  c("//    released the previous q), then the item's K and V tiles into their rings; an item past the");
  c("//    last is published without copies and ends both roles.");
  c(producer_roles(parts));
  c.in();
  c("if (threadIdx.x == 0) {");
  c.in();
  c("int round = 0;  // K / V rounds issued");
  c("for (int item_round = 0, item = blockIdx.x;; ++item_round) {");
  c.in();
  c("q_ring.wait_free(item_round);");
  c("item_slot[2 * (item_round % Q_TILES)] = item;  // before announce's arrive, whose release semantics publish it");
  c("if (item >= items) {");
  c("  q_ring.announce(item_round, 0);");
  c("  break;");
  c("}");
  c("// The next item, drawn now: the atomic's latency passes under this item's copies.");
  c("const int next = static_cast<int>(gridDim.x + atomicAdd(work_counter, 1u));");
  item.item_range();
  c("if (m0 < q_len) {");
  c.in();
  c("const int q_row = static_cast<int>(q_bos) + m0, k_row = static_cast<int>(k_bos);");
  c("q_ring.announce(item_round, Q_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb)");
  c("  ladle_tma_load_4d(q_tile + (item_round % Q_TILES) * (Q_BYTES / 2) + cb * BM * 64, &q_map, cb * 64, q_row, h, b,");
  c("                    &q_full[item_round % Q_TILES]);");
  emit_ws_kv_copies(c, "round + ");
  c("round += tile_end - tile_begin;");
  c.out();
  c("} else {");
  c("  q_ring.announce(item_round, 0);  // rows past this sequence's end: nothing to copy or compute");
  c("}");
  c("item = next;");
  c.out();
  c("}");
  emit_producer_exit(c);
  c("");
  c("// 2. The consumers: per item, its rows' state, the key loop and the store; rounds continue across items,");
  c("//    and so do the warpgroups' turns: warpgroup 0 may issue the next item's first q k^T while warpgroup 1");
  c("//    finishes this one.");
  emit_ws_consumer_setup(c, parts);
  const bool pingpong = parts.spec.tile.warps == 8;
  if (pingpong) c("turns.start();");
  c("int round = 0;  // K / V rounds consumed");
  c("for (int item_round = 0;; ++item_round) {");
  c.in();
  c("q_ring.wait(item_round);");
  c("const int item = item_slot[2 * (item_round % Q_TILES)];");
  c("if (item >= items) break;");
  item.item_range();
  c("if (m0 >= q_len) {");
  c("  q_ring.release(item_round, lane);");
  c("  continue;");
  c("}");
  item.row_state();
  c("// This item's q tile: the ring's slot item_round % Q_TILES.");
  c("const unsigned long long q_item_desc = q_desc + static_cast<unsigned long long>(item_round % Q_TILES) * (Q_BYTES / 16);");
  emit_ws_key_loop(c, parts);
  c("round += tile_end - tile_begin;");
  item.epilogue();
  c.out();
  c("}");
  if (pingpong) c("turns.finish();");
  c.out();
  c("}");
}

}  // namespace ladle::cuda::detail
