// The stage ring of the attention backward's main kernel (sm_90a), over the device ring
// (codegen/device/pipeline.cuh): K and V once behind a latch, q and d_output step by step into
// STAGES stages, thread 0 the producer, every warp a consumer.
#include "attention_backward.h"

namespace ladle::cuda::detail {

void emit_stage_ring(Code& c) {
  c("unsigned long long* const kv_full = reinterpret_cast<unsigned long long*>(stats_s + 2 * BM);");
  c("unsigned long long* const full = kv_full + 1;");
  c("unsigned long long* const empty = kv_full + 1 + STAGES;");
  c("const ladle_stage_ring<STAGES> stage_ring{full, empty};  // step s in stage s % STAGES");
  c("const ladle_copy_latch kv_latch{kv_full};");
  c("if (threadIdx.x == 0) {");
  c("  kv_latch.init();");
  c("  stage_ring.init(8);  // a stage is free again once every consumer warp released it");
  c("  ladle_fence_barrier_init();");
  c("}");
  c("__syncthreads();");
  c("");
  c("// 1. Thread 0 issues every copy: K and V once, q and do of the first STAGES - 1 steps now, and at the");
  c("//    top of each step the step STAGES - 1 ahead, into the stage the step before released (empty).");
  c("const auto issue = [&](int step) {");
  c.in();
  c("const int h = hk * group + step / tiles, q_row = static_cast<int>(q_bos) + (tile_begin + step % tiles) * BM, stage = step % STAGES;");
  c("stage_ring.acquire(step, Q_BYTES + DO_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb)");
  c("  ladle_tma_load_4d(q_ring + stage * (Q_BYTES / 2) + cb * BM * 64, &q_map, cb * 64, q_row, h, b, &full[stage]);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb)");
  c("  ladle_tma_load_4d(do_ring + stage * (DO_BYTES / 2) + cb * BM * 64, &do_map, cb * 64, q_row, h, b, &full[stage]);");
  c.out();
  c("};");
  c("if (threadIdx.x == 0) {");
  c.in();
  c("const int k_row = static_cast<int>(k_bos) + j_block;");
  c("kv_latch.expect(K_BYTES + V_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb) ladle_tma_load_4d(k_tile + cb * BN * 64, &k_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb) ladle_tma_load_4d(v_tile + cb * BN * 64, &v_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int step = 0; step < STAGES - 1 && step < steps; ++step) issue(step);");
  c.out();
  c("}");
  c("");
}

void emit_stage_ring_acquire(Code& c) {
  c("if (threadIdx.x == 0 && step + STAGES - 1 < steps) issue(step + STAGES - 1);");
  c("stage_ring.wait(step);");
}

void emit_stage_ring_release(Code& c) { c("stage_ring.release(step, lane);  // q and do of this stage are read"); }

}  // namespace ladle::cuda::detail
