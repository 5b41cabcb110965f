// The chunked family's mma.sync kernels (codegen/cuda/chunked.h), emitted part by part: the serial
// form, the split form's state and output passes and the segmented form's state pass and serial
// kernel. Internal to codegen (not installed).
//
// generate_chunked (cuda_chunked.cpp) checks the spec, names the kernel and declares its
// parameters; ChunkedEmitter writes the rest, one method per part of the kernel: the header
// comment, the constants and shared memory, the block's sequence and state, then per chunk the
// staging, the gate sums (chunked_parts.cpp), the steps over the chunk with the read and the
// state update (chunked_steps.cpp), and at the end the final states.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "../chunked.h"
#include "cuda_source.h"

namespace ladle::cuda::detail {

// How the gates enter the chunk: per key dimension (GLA), one per-token scalar on the key
// side (g_gamma, a per-token head gate), none; and per value dimension or none.
enum class KeyGate { none, scalar, vector };

inline KeyGate key_gate(const ir::Variant& variant) {
  if (variant.has(ir::Slot::log_decay_k)) return KeyGate::vector;
  return variant.has(ir::Slot::log_decay_head) ? KeyGate::scalar : KeyGate::none;
}

inline bool per_token_scale(const ir::Variant& variant) {
  return ir::extent(variant, variant.slot(ir::Slot::scale)).token;
}

inline int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// How the warps share the work of a tile: o by 16-row tiles x column groups, the state by
// 16-row tiles x column groups (warps past o_warps / s_warps sit those parts out).
struct ChunkedLayout {
  int mt = 0, cg = 0, ocols = 0, o_warps = 0;
  int smt = 0, s_mpw = 0, s_wpm = 0, scols = 0, s_warps = 0;
  int state_registers = 0;
};
ChunkedLayout chunked_layout(const ChunkedTile& tile);

// vs in the wgmma tiles: 8 x 8 core matrices (128 contiguous bytes: 8 tokens of 8 values), 16
// bytes of padding after each so that a row of 16-byte items spreads over every bank; the
// core matrices of a row of 8 tokens side by side along V.
constexpr int vs_core_stride = 72;  // elements from one core matrix to the next along V
inline int vs_elements(const ChunkedTile& tile) {
  return tile.wgmma ? tile.chunk / 8 * (tile.block_v / 8) * vs_core_stride : tile.chunk * (tile.block_v + 8);
}

// The text of one mma.sync kernel (any phase but fold) of the chunked family. tile: the phase's
// own (the split form's state tile for the state pass); id: the inputs' identifiers.
class ChunkedEmitter {
 public:
  ChunkedEmitter(const ir::Variant& variant, const ChunkedKernelSpec& spec, const ChunkedTile& tile,
                 std::vector<std::string> id);
  // The kernel's source; kernel: its name and shared memory, declarations: its parameters.
  std::string source(const ChunkedKernel& kernel, const std::vector<std::string>& declarations);

 private:
  // The kernel's parts, in the order they are emitted (chunked_parts.cpp).
  std::string header_text(const ChunkedKernel& kernel) const;
  void emit_signature(const ChunkedKernel& kernel, const std::vector<std::string>& declarations);
  void emit_constants();
  void emit_shared_memory();
  void emit_block_indices();
  void emit_sequence_setup();
  void emit_initial_state();
  void emit_chunk_loop();
  void emit_staging();
  void emit_bonus_read();
  void emit_gate_sums();
  void emit_final_states();
  // The steps over a chunk (chunked_steps.cpp): the state pass's one update, or the other forms'
  // steps, each a span that fits, its factors, the state for the read, the scores, o, the update.
  void emit_state_pass_update();
  void emit_steps();
  void emit_step_span();
  void emit_read_factors();
  void emit_read_state();
  void emit_scores();
  void emit_output();
  void emit_output_store();
  void emit_update_wait();
  void emit_update_factors(const std::string& reference);
  void emit_update(const std::string& reference, bool early);

  // Pieces the parts share.
  std::string render(ir::Slot s, const std::string& suffix) const;
  bool has(ir::Slot s) const { return variant.has(s); }
  bool varies_over_tokens(ir::Slot s) const;
  void no_feature_slot(ir::Slot s, const std::string& local);
  void token_locals(const std::string& cpos, const std::string& base = "base", const std::string& valid = "valid");
  std::string vs_index(const std::string& row, const std::string& col) const;
  void for_state(const std::function<void()>& body);
  static std::string state_at(const std::string& chunk);
  static std::string kg_at(const std::string& row, const std::string& col);
  static std::string vg_at(const std::string& row, const std::string& col);
  static std::string before(const std::string& array_at);
  std::string read_gate(const std::string& col) const;
  std::function<std::string(const std::string&)> state_factors(const std::string& at, const std::string& name, bool head_gate);
  void emit_prefetch(const std::string& first);
  void stage8(const std::vector<bool>& side, ir::InputKind kind, const std::string& count, const std::string& first,
              const std::string& suffix);

  const ir::Variant& variant;
  const ChunkedKernelSpec& spec;
  const ChunkedTile tile;
  const std::vector<std::string> id;
  const std::vector<ir::Input>& inputs;
  const InputUse use_of;
  const std::vector<bool>&used, &key_side, &value_side;
  const ChunkedPhase phase;
  const bool states, outputs, segmented;
  const bool wgmma;  // the serial form's state update on wgmma.mma_async (vs as core matrices)
  const int threads;
  const KeyGate kgate;
  const bool vgate, check_fit, scale_per_token;
  // A read before the update: o_t = q_t^T S_(t-1) (+ (q_t . u . k_t) v_t with a bonus u), where q~
  // carries the gate product up to t - 1 (G_(t-1), 0 at the chunk's start), the scores are strictly
  // causal and the bonus is the scores' diagonal (bq, formed once per chunk from the staged rows).
  const bool before_read, bonus;
  const bool prefetch;             // chunked_prefetch: the next chunk's raw rows by cp.async
  std::vector<bool> async;         // per input: prefetched (else loaded when staged)
  // The output pass's state tile (bf16 chunk_states) lands in st by cp.async together with the
  // chunk's rows and is scaled in place in 3a: read there from global memory, element by
  // element, its loads were a large share of the pass's stall samples.
  const bool state_async;
  // Eight consecutive features per item: one row offset, one 16-byte load per tensor where the
  // row is contiguous and aligned (ladle_load8), one 16-byte shared store per staged array.
  // Two items in flight at 8 warps; at 4 or fewer, each thread holds twice the state and o, and
  // unrolled staging spilled.
  // The state pass stages from its prefetch buffers only (shared loads, no o): four items in
  // flight (one at a time, its staging was a large share of its stall samples, each item waiting on
  // its shared loads).
  const std::string staging_unroll;
  std::string gate_columns;        // the gate columns of 2: the key side's BK (or 1), then BV
  std::string key_width;           // segment_decay's key-side totals: K, 1 or 0
  const std::string sequence_index;
  Code c;
};

}  // namespace ladle::cuda::detail
