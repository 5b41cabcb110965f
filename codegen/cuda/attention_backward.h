// The backward of the softmax-attention family on the GPU, in CUDA C++: one ir::AttentionVariant
// in, two readable kernels out (one module). The gradients come from the same expression as the
// forward: the logit, its masks and the derivative of the score expression by the raw score and
// by each tensor input (ir::derivative) are rendered inline, so a soft cap, an ALiBi slope or a
// bias gets its gradient without a hand-written kernel.
//
// 1. prep (one warp per query row): delta_i = do_i . o_i (fp32) and the forward's lse in log2
//    units, written as row_stats [B,H,Tq] float2 {lse log2 e (+inf where nothing was attended),
//    delta}; the sinks' gradient -sum_i exp(sink - lse_i) delta_i (a block sum, one atomic per
//    sink); and, where the caller's d_output is not q's 16-bit type with TMA-copyable rows, a
//    contiguous copy of it in that type.
// 2. main (sm_90a, warp-specialised as the forward's ws tiles): one block per 128 keys of one
//    (sequence, key/value head). Thread 0 copies the block's K and V once and, a step or more
//    ahead, a 64-row tile of q and of d_output into a ring of stages (TMA, 128-byte swizzle,
//    mbarriers); the block walks every query head that shares the key/value head and every query
//    tile the causal / window masks leave. Two warpgroups own 64 keys each (no producer
//    warpgroup: 256 threads leave each up to 255 registers for dK's and dV's accumulators):
//      S^T  = K q^T, dP^T = V do^T         wgmma from shared memory (K-major)
//      P    = 2^(logit - lse)              logit and masks rendered from the expression
//      dlogit = P (dP - delta)             (dropout: dP and P V's P take the same keep mask)
//      dS   = dlogit * d logit / d score   the derivative expression, rendered
//      dV  += P^T do, dK += dS^T q         wgmma, P and dS from registers, q and do N-major
//      dQ  += dS K                         dS^T through shared memory (both warpgroups' keys),
//                                          wgmma with both operands MN-major, then staged in shared
//                                          memory (swizzled fp32 boxes of 64 rows x 32) and added
//                                          into dq by the TMA unit (cp.reduce.async.bulk.tensor add,
//                                          two boxes a warpgroup a step; dq_tma), or, for a dq TMA
//                                          cannot address, with red.global.add.v2.f32 from registers
//    dK and dV are stored once at the end (fp32, no atomics: the block owns its keys for every
//    query head of its group); a pair input's gradient (a bias) is added per element, a per-head
//    input's (a slope) per warp.
// Launch: prep grid (ceil(Tq / 8), N * H), 256 threads; main grid attention_grid(N * H_kv, ceil(Tk / 128)),
// 256 threads, dynamic shared memory AttentionBackwardKernel::shared_bytes (dq zeroed first).
//
// Past a head dim of 128 (to 256) the ws kernel splits columns instead of keys between its
// warpgroups (attention_backward_column_split): a block owns 64 keys (grid ceil(Tk / 64)); both
// warpgroups form S^T and dP^T for all of them, warpgroup w keeps dK's and dV's columns 128 w.. in
// registers, warpgroup 0 stores dS^T and adds the score inputs' gradients, and dQ is added by
// red.global in 64-column chunks (no room for dQ's TMA stage beside full-width K, V and the ring).
//
// The `sync` form (AttentionBackwardForm::sync, sm_80 and later) takes what the ws form refuses:
// f32 inputs (and q, k, v of mixed types), head dims up to 256, targets without wgmma. Its main
// kernel is mma.sync m16n8k16 with fp32 accumulation, 4 warps a block of 64 keys (a warp 16 of
// them), the keys' dK and dV columns cut into column parts of `sync_columns` (a part a block,
// parts along grid.y: S^T and dP^T are formed again per part, dQ's columns are the part's):
//   stage q and do (a step's `sync_rows` queries, any strides and floating types, converted to
//   16 bits; f32: split into bf16 halves hi + lo, products as hi*hi + hi*lo + lo*hi, about 16
//   bits of mantissa, as the forward's mma.sync path), then per warp S^T = K q^T, dP^T = V do^T,
//   the same element-wise P, dS and input gradients as the ws form, dV += P^T do, dK += dS^T q
//   from registers, dS^T through shared memory, dQ = dS K added into dq with atomics. No TMA, no
//   d_output copy (main reads d_output in place). Grid attention_grid(N * H_kv, ceil(Tk / 64) *
//   column_parts), 128 threads.
#pragma once

#include <string>
#include <vector>

#include "attention.h"

namespace ladle::cuda {

// The main kernel's form: warp-specialised on wgmma + TMA (sm_90a, q, k, v of one 16-bit type,
// head dims to 128), or mma.sync (sm_80 on, any floating q, k, v, head dims to 256).
enum class AttentionBackwardForm { ws, sync };
const char* to_string(AttentionBackwardForm form);

struct AttentionBackwardSpec {
  std::vector<DType> input_types;  // one per variant input, as AttentionKernelSpec's
  int D = 128, Dv = 128;                 // 1 to 128, multiples of 8
  bool varlen = false;
  DType q_segment_ids_type = DType::i64, kv_segment_ids_type = DType::i64;
  DType sinks_type = DType::f32;
  DType output_type = DType::bf16;    // the forward's o (read by prep)
  DType d_output_type = DType::bf16;  // the caller's d_output (read by prep)
  bool copy_d_output = false;      // prep writes d_output_copy (q's type, contiguous): main reads it by TMA
  bool sinks_gradient = false;     // prep adds the sinks' gradient into d_softmax_aux
  std::vector<bool> input_gradients;  // per variant input: its gradient is written (pair and head inputs)
  int stages = 2;                     // the q / d_output ring: 2 to 4
  bool dq_tma = false;                // dq 16-byte aligned, its strides multiples of 4 (and shared memory to spare):
                                      // main stages dQ's rows in shared memory and adds them by bulk reductions
                                      // (cp.reduce.async.bulk.tensor through an fp32 tensor map of dq);
                                      // else red.global.add.v2.f32 from registers
  std::string arch = "sm_90a";        // ws needs sm_90a; sync sm_80 or later
  AttentionBackwardForm form = AttentionBackwardForm::ws;
  // sync: the queries of a step (64, 32 or 16) and the dK / dV columns of a block (64 or 128).
  int sync_rows = 64, sync_columns = 128;
};

// The form a call takes: ws where it runs (sm_90a, q, k, v of one 16-bit type, D and Dv <= 128),
// else sync.
AttentionBackwardForm attention_backward_form(const std::vector<DType>& input_types, int D, int Dv, const std::string& arch);
// A sync spec's tile for its target: 128 columns a part for 16-bit inputs, 64 for split f32 ones
// (their fragments come in pairs); the most query rows (64, 32, 16) whose shared memory the
// target has (an unknown target: sm_90's 227 KiB).
AttentionBackwardSpec with_sync_tile(AttentionBackwardSpec spec);
// Whether a ws spec cuts dK's and dV's columns between its warpgroups (a head dim past 128): blocks
// of 64 keys, every warpgroup forming S^T and dP^T for all of them, dQ by red.global.
bool attention_backward_column_split(const AttentionBackwardSpec& spec);
// Whether a sync spec's q, k, v go through the tensor cores as split bf16 pairs (any of them f32,
// or of mixed types).
bool attention_backward_split(const AttentionBackwardSpec& spec);

// What the autotuner chooses for a call (ops/tune_attention.h): the q / d_output ring's depth and
// whether dQ goes through TMA reductions, where the call's dq allows them (AttentionBackwardSpec::
// dq_tma) and shared memory has room. The heuristic: 2 stages, TMA.
struct AttentionBackwardTile {
  int stages = 2;
  bool dq_tma = true;
};
// "stages=2 dq=tma" (dq=red: red.global.add.v2)
std::string to_string(const AttentionBackwardTile& tile);

struct AttentionBackwardKernel {
  std::string source;  // both kernels
  std::string prep_name, name;  // name: main's
  std::vector<AttentionParam> prep_params, main_params;
  unsigned prep_threads = 256, main_threads = 256;
  int prep_rows = 8;       // prep grid.x = ceil(longest q sequence / prep_rows)
  int block_n = 128;       // main grid: attention_grid(N * H_kv, ceil(longest k sequence / block_n) * column_parts)
  int column_parts = 1;    // sync: the dK / dV column parts (ws: 1)
  int shared_bytes = 0;    // main's dynamic shared memory
};

// What keeps a call off the GPU backward (empty: it runs). ws: head dims past 256 or not multiples
// of 8, q, k, v not of one 16-bit type, a target other than sm_90a, dq_tma past D = 128. sync: head dims past 256 or not
// multiples of 8, q, k, v not floating, a target without mma.sync, more shared memory than the
// target's.
std::vector<std::string> attention_backward_unsupported(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec);

// The most dynamic shared memory a block of main may have (sm_90's opt-in limit, 227 KiB).
inline constexpr int attention_backward_max_shared_bytes = 232448;
// The main kernel's dynamic shared memory for a spec (attention_backward_unsupported refuses more
// than attention_backward_max_shared_bytes, or the sync form's target's limit).
int attention_backward_shared_bytes(const AttentionBackwardSpec& spec);
// A call's spec with a tile applied: its stages; dQ by TMA where the tile asks, the call's dq allows
// (spec.dq_tma) and shared memory has room at those stages, else by red.global.
AttentionBackwardSpec with_tile(AttentionBackwardSpec spec, const AttentionBackwardTile& tile);

// Throws InvalidArgument for a malformed variant or anything attention_backward_unsupported names.
AttentionBackwardKernel generate_attention_backward(const ir::AttentionVariant& variant, const AttentionBackwardSpec& spec);

}  // namespace ladle::cuda
