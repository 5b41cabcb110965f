// The stage ring of the attention backward's main kernel (sm_90a): K and V once behind kv_full, q
// and d_output step by step into STAGES stages behind full / empty mbarriers, thread 0 the
// producer, every warp a consumer. Kept apart so that one shared device-side ring can replace it.
#include "attention_backward.h"

namespace ladle::cuda::detail {

void emit_stage_ring(Code& c) {
  c("unsigned long long* const kv_full = reinterpret_cast<unsigned long long*>(stats_s + 2 * BM);");
  c("unsigned long long* const full = kv_full + 1;");
  c("unsigned long long* const empty = kv_full + 1 + STAGES;");
  c("if (threadIdx.x == 0) {");
  c("  ladle_mbarrier_init(kv_full, 1);");
  c("  for (int s = 0; s < STAGES; ++s) {");
  c("    ladle_mbarrier_init(&full[s], 1);   // the producer's arrive_expect_tx, then the copies' bytes");
  c("    ladle_mbarrier_init(&empty[s], 8);  // lane 0 of every consumer warp");
  c("  }");
  c("  ladle_fence_barrier_init();");
  c("}");
  c("__syncthreads();");
  c("");
  c("// 1. Thread 0 issues every copy: K and V once, q and do of the first STAGES - 1 steps now, and at the");
  c("//    top of each step the step STAGES - 1 ahead, into the stage the step before released (empty).");
  c("const auto issue = [&](int step) {");
  c.in();
  c("const int h = hk * group + step / tiles, q_row = static_cast<int>(q_bos) + (tile_begin + step % tiles) * BM, stage = step % STAGES;");
  c("if (step >= STAGES) ladle_mbarrier_wait(&empty[stage], (step / STAGES - 1) & 1);");
  c("ladle_mbarrier_arrive_expect_tx(&full[stage], Q_BYTES + DO_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb)");
  c("  ladle_tma_load_4d(q_ring + stage * (Q_BYTES / 2) + cb * BM * 64, &q_map, cb * 64, q_row, h, b, &full[stage]);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb)");
  c("  ladle_tma_load_4d(do_ring + stage * (DO_BYTES / 2) + cb * BM * 64, &do_map, cb * 64, q_row, h, b, &full[stage]);");
  c.out();
  c("};");
  c("if (threadIdx.x == 0) {");
  c.in();
  c("const int k_row = static_cast<int>(k_bos) + j_block;");
  c("ladle_mbarrier_arrive_expect_tx(kv_full, K_BYTES + V_BYTES);");
  c("for (int cb = 0; cb < DPB / 64; ++cb) ladle_tma_load_4d(k_tile + cb * BN * 64, &k_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int cb = 0; cb < DVPB / 64; ++cb) ladle_tma_load_4d(v_tile + cb * BN * 64, &v_map, cb * 64, k_row, hk, b, kv_full);");
  c("for (int step = 0; step < STAGES - 1 && step < steps; ++step) issue(step);");
  c.out();
  c("}");
  c("");
}

void emit_stage_ring_acquire(Code& c) {
  c("if (threadIdx.x == 0 && step + STAGES - 1 < steps) issue(step + STAGES - 1);");
  c("ladle_mbarrier_wait(&full[stage], (step / STAGES) & 1);");
}

void emit_stage_ring_release(Code& c) { c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);  // q and do of this stage are read"); }

}  // namespace ladle::cuda::detail
