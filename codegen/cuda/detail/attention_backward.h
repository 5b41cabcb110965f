// The pieces of the softmax-attention backward's text (codegen/cuda/attention_backward.h) that
// live outside cuda_attention_backward.cpp: main's stage ring (attention_backward_ring.cpp) and
// its steps, one query head's tile each (attention_backward_step.cpp). Internal to codegen (not
// installed).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "../attention_backward.h"
#include "cuda_source.h"
#include "hoist.h"
#include "../../render_c.h"

namespace ladle::cuda::detail {

// What the pieces read of the kernels being generated: the spec's derived sizes and flags, and
// the expressions at one (i, j), i a query of the step's tile and j a key of this thread.
struct AttentionBackwardParts {
  // Checks nothing: generate_attention_backward has (attention_backward_unsupported).
  AttentionBackwardParts(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec, const std::vector<std::string>& id);

  const ir::AttentionVariant& variant;
  const AttentionBackwardSpec& spec;
  std::vector<std::string> id;  // the inputs' C names
  bool sync = false;            // the mma.sync form (AttentionBackwardForm::sync)
  bool split = false;           // sync with f32 (or mixed) q, k, v: bf16 hi + lo pairs
  bool f16 = false;             // q, k, v f16 (else bf16; split: bf16)
  int DP = 0, DVP = 0;          // head dims rounded up to the tensor-core step
  int DPB = 0, DVPB = 0;        // and to whole TMA boxes of 64 columns
  // ws with a head dim past 128 (column_split): a block of 64 keys, each warpgroup every key and its
  // own columns of dK and dV (CDP, CDVP: warpgroup 0's, at most 128; warpgroup 1 the rest), both
  // forming S^T and dP^T; warpgroup 0 stores dS^T and adds the score inputs' gradients.
  bool column_split = false;
  int CDP = 0, CDVP = 0;
  int key_block = 128;                // keys a block
  std::string key_warp = "warp";      // the warp's 16 keys of the block start at key_warp * 16
  std::string key_base = "j_block + warpgroup * 64";  // the first key of the warp's warpgroup
  std::string input_guard;            // what must hold for a thread to add the score inputs' gradients
  // The constants naming dK's and dV's accumulator columns: every one (DP, DVP), a warpgroup's (CDP,
  // CDVP), a column part's (sync: CW).
  std::string dk_columns = "DP", dv_columns = "DVP";
  std::vector<bool> used;       // per input: the score or keep expression reads it
  std::vector<bool> gradient;   // per input: main writes its gradient (pair and head inputs)
  // The logit as the forward's ws tiles form it (log2 units, invariant factors hoisted, tanh.approx),
  // so that P here is the forward's P to its rounding.
  HoistedExpression hoisted;
  std::string logit_expression, keep_expression;  // keep: empty without a user predicate
  // d logit / d score and d logit / d input (natural units), through ir::derivative.
  std::string dscore_expression;
  std::vector<std::string> dinput_expression;  // per input; empty: no gradient
};

// An input's value at (i, j) (pair inputs through <id>_bh, head inputs through <id>_value).
ir::LoadFn attention_backward_load(const std::vector<std::string>& id);
// The attention leaves at (i, j); the score is s_acc[nt][r].
std::string attention_backward_leaf(ir::Op op);

// ---- main's stage ring (attention_backward_ring.cpp): thread 0 copies K and V once, and q and
// d_output of each step into a ring of STAGES stages, guarded by mbarriers full (the bytes
// landed) and empty (every consumer warp read the stage).

// The barriers after the row statistics in shared memory, their initialisation, the issue(step)
// lambda and the first STAGES - 1 steps' copies.
void emit_stage_ring(Code& c);
// At the top of a step: the copy STAGES - 1 steps ahead issued, this step's stage waited for.
void emit_stage_ring_acquire(Code& c);
// This warp is done with the step's q and d_output: the stage is released.
void emit_stage_ring_release(Code& c);

// ---- main's opening (attention_backward.cpp), both forms

// From j_block (the block's first key): the block returns past the sequence; diagonal, j_last, the
// query tiles its keys may be attended by (tile_begin, tile_end, tiles) and steps = group * tiles.
void emit_block_query_tiles(Code& c, const ir::AttentionVariant& variant);
// This thread's keys key_row[2] (rows gid and gid + 8 of warp's 16 from j_block), their segment ids,
// dropout's keep scale, the head inputs' gradient sums, load_stats(step) (a step's BM row statistics).
void emit_key_row_values(Code& c, const AttentionBackwardParts& parts);
// Step 7: dK and dV of this thread's keys, stored once (every column, the warpgroup's or the part's).
void emit_key_gradients(Code& c, const AttentionBackwardParts& parts);

// ---- main's steps (attention_backward_step.cpp)

// The loop over steps (one query head's tile of 64 queries each): S^T and dP^T, the element-wise
// gradients, dV, dK and dQ, and the head inputs' gradients.
void emit_attention_backward_steps(Code& c, const AttentionBackwardParts& parts);
// The parts both forms' steps share: what a step reads of the score's inputs (after h), step 4's
// element-wise P, dS and input gradients into p_frag / ds_frag (split: also p_lo / ds_lo), and the
// head inputs' gradients after a head's last step.
void emit_step_values(Code& c, const AttentionBackwardParts& parts);
void emit_elements(Code& c, const AttentionBackwardParts& parts);
void emit_head_input_gradients(Code& c, const AttentionBackwardParts& parts);

// ---- the sync form's main kernel (attention_backward_sync.cpp): mma.sync, sm_80 on

void emit_sync_main(Code& c, const AttentionBackwardParts& parts, const std::string& name, const std::vector<std::string>& decl);

}  // namespace ladle::cuda::detail
