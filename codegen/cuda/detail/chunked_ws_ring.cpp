// The ws kernel's ring of stages, over the device ring (ladle_stage_ring, codegen/device/pipeline.cuh:
// the mbarriers' protocol): the producer's loop over the chunks (a free stage, then the copies) and
// the consumers' side of it (the stage of a chunk, the wait for its bytes, the release).
#include "chunked_ws_emit.h"

namespace ladle::cuda::detail {

void WsEmitter::ring_init() const {
  c("const ladle_stage_ring<STAGES> stage_ring{full, empty};  // chunk c in stage c % STAGES");
  c("if (threadIdx.x == 0) {");
  c("  stage_ring.init(4 * CONSUMERS);  // a stage is free again once every consumer warp released it");
  c("  ladle_fence_barrier_init();");
  fit_words_init();
  c("}");
  c("__syncthreads();  // the only block-wide barrier: the producer leaves after its copies");
}

void WsEmitter::producer() const {
  c("// 1. The producer warpgroup: one thread issues every copy. A chunk's box starts at row0, so that");
  c("//    row r holds token row0 + r either way; rows outside [bos, eos) are masked by the consumers");
  c("//    (and outside the tensor TMA writes zeros).");
  // The state pass keeps the launch's registers; the serial form gives the producer's to the consumers.
  c("if (ladle_producer_warpgroup<" + std::to_string(states ? 0 : ws_producer_registers) + ", " +
    std::to_string(states ? 0 : ws_consumer_registers) + ">()) {");
  c.in();
  c("if (threadIdx.x == 0) {");
  c.in();
  c("for (int c = 0; c < chunks; ++c) {");
  c.in();
  c("const int stage = c % STAGES;");
  c("stage_ring.acquire(c, STAGE_BYTES);  // the stage released, its bytes announced");
  c("const int row0 = static_cast<int>(REVERSE ? eos - static_cast<long long>(c + 1) * C : bos + static_cast<long long>(c) * C);");
  c("unsigned short* const dst = ring + stage * (STAGE_BYTES / 2);");
  producer_copies();
  c.out();
  c("}");
  emit_producer_exit(c);
}

// The chunk loop's opening: its stage, the box's first row and the chunk's tokens in the sequence.
void WsEmitter::chunk_loop_head() const {
  c("for (int c = 0; c < chunks; ++c) {");
  c.in();
  c("const int stage = c % STAGES;");
  c("const long long row0 = REVERSE ? eos - static_cast<long long>(c + 1) * C : bos + static_cast<long long>(c) * C;");
  c("const int valid = static_cast<int>(length - static_cast<long long>(c) * C < C ? length - static_cast<long long>(c) * C : C);");
}

// With chunk_states_out: S as the chunk starts (the true state: the last chunk's factors applied), to
// chunk_states[first chunk + c][h], column pairs in 8-byte stores.
void WsEmitter::store_chunk_state() const {
  if (!spec.chunk_states_out) return;
  c("{  // the state entering this chunk, for the backward");
  c.in();
  c(std::string("const long long first_chunk = ") + (spec.varlen ? "chunk_offsets[n]" : "static_cast<long long>(n) * ((T + C - 1) / C)") + ";");
  c("float* const cs = chunk_states + ((first_chunk + c) * H + h) * static_cast<long long>(K) * V;");
  c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
  c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
  c("    LADLE_UNROLL for (int r = 0; r < 4; r += 2) {");
  c.in(), c.in(), c.in();
  c("const int feat = 64 * mt + 16 * warp + gid + 8 * (r / 2), col = cv0 + 8 * nb + 2 * tig;");
  c("if (feat < K && col < V) ladle_store2(cs + static_cast<long long>(feat) * V + col, S[mt][nb][r], S[mt][nb][r + 1], col + 1 < V);");
  c.out(), c.out(), c.out();
  c("    }");
  c.out();
  c("}");
}

void WsEmitter::stage_wait() const { c("stage_ring.wait(c);"); }

void WsEmitter::stage_release(bool with_comment) const {
  c("__syncwarp();");
  c(std::string("stage_ring.release(c, lane);") + (with_comment ? "  // this warp is done with the stage" : ""));
}

}  // namespace ladle::cuda::detail
