// Runs any recurrent variant built with the DSL: q, k and v by position, every further
// input by the name the expression gave it. The named ops (recurrent, gla) are thin
// wrappers over this; so is a researcher's new gate:
//   auto variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau),
//                                       dsl::q, dsl::scalar("scale")), "custom_gate");
//   auto result = ladle::run_variant(variant, q, k, v, {{{"x", x}, {"tau", tau}}, {{"scale", 0.125f}}});
// Shapes follow docs/operations.md: q [B,T,H,K], k [B,T,H_kv,K], v [B,T,H_kv,V] (or grouped value
// heads: v [B,T,HV,V], HV a multiple of H, the recurrence over HV heads), per-token
// inputs [B,T,H,K|V] or [B,T,H], per-head inputs [H] or [B,H]; with cu_seqlens the batch is
// 1 and per-token inputs may drop it. Every mismatch throws InvalidArgument naming the input.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/codegen/cuda/chunked.h>
#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/dsl/ir.h>

#include <ladle/runtime/tensor.h>

namespace ladle {

class Stream;

struct VariantInputs {
  std::map<std::string, TensorView> tensors;  // by input name
  std::map<std::string, float> scalars;       // by input name
};

// Where a call runs. automatic: the GPU when any tensor is device memory or a CUDA driver and
// device are present, else the CPU. cpu reads host tensors only (a device tensor is an
// InvalidArgument naming it); gpu reads device tensors where they are and uploads host ones.
enum class Backend { automatic, cpu, gpu };

// How a call on the GPU treats its tensors (every op's options carry one).
struct GpuOptions {
  // The call's copies and kernels are ordered on it; nullptr: the default stream. A call whose
  // tensors are all device memory returns with its work queued, without waiting for it.
  const Stream* stream = nullptr;
  // Host tensors on the GPU path are uploaded (and host outputs copied back); false: each is an
  // InvalidArgument naming it, so that no copy happens unnoticed.
  bool upload_host_tensors = true;
};

// Which kernel family runs a call on the GPU. automatic: chunked (tensor cores) for 16-bit
// q/k/v and sequences of at least `chunked_min_tokens` tokens on average, the fused
// recurrent kernel otherwise (decode-sized calls, fp32 inputs, normalised variants). The CPU
// path is the sequential oracle whatever is chosen here.
enum class Algorithm { automatic, recurrent, chunked };
inline constexpr std::int64_t chunked_min_tokens = 64;

// How the GPU backward forms the decays' gradients where its recurrences run on the tensor cores
// (16-bit slots). Each 64-step block sums its own steps' terms q . dq - k . dk backwards from a carry,
// the gradient the later steps leave; the carry comes from
//   boundary_blocks (the default): the forward's state and the gradient dS at the block's end, their
//     product summed in fp32 (the state passes in both directions); and where the recurrences' decays
//     are a key-side or a head decay alone (GLA, simple GLA, a user's key gate), with bf16 slots and K, V
//     up to 128, dq and dk come from one kernel per 64-step block (ladle_bwd_block_bf16) in fp32 from
//     the same states instead of two recurrences each rounded to bf16 on its own, so that the block's
//     terms, which cancel, keep fp32 precision: GLA's dg 1.8e-3 at T 1000 (fla 0.6: 1.6e-3), dq and dk
//     6e-4 (fla: 1.9e-3 and 2.0e-3); GLA's backward 4.78 ms at B8 T4096 H16 K=V=128 on an H200;
//   boundary_states: the same carries, dq and dk always from the recurrences: faster (3.69 ms there),
//     GLA's dg 5.6e-3;
//   block_sums: the later blocks' sums of q . dq - k . dk, whose bf16 rounding adds up along the
//     sequence (GLA's dg 2.9e-2 at T 1000), fastest (2.06 ms on an H100).
// bench/RESULTS.md, "Issue 36: gate gradients from the boundary states" and "Issue 36: dq and dk a
// block at a time (stop 55)".
enum class GateGradients { boundary_states, boundary_blocks, block_sums };

// The GPU backward's form for the update forms (the delta rule, gated delta rule, KDA, RWKV6):
//   automatic: the chunked WY form on the tensor cores where it runs (the delta rule with a head decay
//     or none, 16-bit inputs, K <= 128, T >= 64: fla's precision, 5.6x faster), else the recurrent one;
//   recurrent: the fused-recurrent form in fp32 (twice as precise: 2.3e-3 against fp64 where the
//     chunked form's gradients are at 4.7e-3; 44 ms against 8 ms at B8 T4096 H16 K=V=128);
//   chunked: the chunked form where it runs, for any input dtype, else the recurrent one.
// The CPU backward is exact in either. bench/RESULTS.md, "Issue 36: the delta rule's chunked WY backward".
enum class UpdateBackward { automatic, recurrent, chunked };

struct RunOptions {
  std::optional<TensorView> initial_state;  // [N,H,K,V], f32 (f16, bf16 are widened)
  std::optional<TensorView> cu_seqlens;     // [N+1], i32 or i64: packed sequences
  bool reverse = false;                     // t = T..1
  bool return_state = false;                // also return final_state [N,H,K,V] f32
  int threads = 0;                          // CPU threads; 0: one per hardware thread
  Backend backend = Backend::automatic;
  GpuOptions gpu;
  Algorithm algorithm = Algorithm::automatic;
  // The fused-recurrent tile on the GPU (block_k, block_v, warps); empty: tuned/heuristic.
  std::optional<cuda::RecurrentTile> tile;
  // The chunked tile on the GPU (block_k, chunk, block_v, warps); empty: tuned/heuristic.
  std::optional<cuda::ChunkedTile> chunked_tile;
  // The chunked serial form's segments (cuda::ChunkedSegments): at most this many tokens per
  // segment; 0: whole sequences; empty: by shape (few long sequences are cut so that the blocks
  // cover the GPU: chunked_segment_tokens).
  std::optional<std::int64_t> chunked_segment_tokens;
  // The GPU backward's gate gradients (above); the CPU backward is exact in either.
  GateGradients gate_gradients = GateGradients::boundary_blocks;
  // The GPU backward's form for the update forms (above).
  UpdateBackward update_backward = UpdateBackward::automatic;
};

// Outputs live where q lives: device memory when q is device memory, else the host.
struct RecurrentResult {
  Tensor o;                            // [B,T,H,V] (the rank of q), the dtype of q
  std::optional<Tensor> final_state;   // [N,H,K,V] f32, when return_state
};

// Caller-owned outputs: o must match q's layout with V features and q's dtype;
// final_state, when given, is written (and must be given when return_state is set). Either may
// be host or device memory, whatever the inputs are.
struct RecurrentOutputs {
  TensorView o;
  std::optional<TensorView> final_state;
};

RecurrentResult run_variant(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                            const TensorView& v, const VariantInputs& inputs = {},
                            const RunOptions& options = {});
void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs);

// The gradients of a loss L through run_variant: dL/dq, dL/dk, dL/dv, dL/d(every named tensor
// input: gates, a user expression's per-token and per-head inputs), dL/d initial_state. f32, each
// in the shape it was given in (an [H] parameter's gradient sums over the batch, GQA's dk and dv
// over the query heads that share them). Scalars passed by value get none. They live where the
// forward's outputs do: device memory when q is device memory (after a GPU forward), else the host.
struct RecurrentGradients {
  Tensor dq, dk, dv;
  std::map<std::string, Tensor> inputs;   // by input name
  std::optional<Tensor> d_initial_state;  // [N,H,K,V], when options.initial_state was given
};

// What the backward needs from a forward call, held by the caller (no global state): the call's
// arguments (views, host or device memory as they were given: the caller keeps those tensors alive
// and unchanged until the backward; a fingerprint of their contents is checked, for device tensors
// by copying their bytes to the host on options.gpu.stream at the forward and again at the
// backward: ops/detail/fingerprint.h) and, after a CPU forward, the state entering every 64-token
// chunk of every (sequence, head), so that the backward does not run the forward again.
struct RecurrentSaved {
  ir::Variant variant;
  TensorView q, k, v;
  VariantInputs inputs;
  RunOptions options;
  std::shared_ptr<const cpu::RecurrentCheckpoints> checkpoints;  // the CPU forward's; empty after a GPU forward
  std::uint64_t fingerprint = 0;  // of the inputs' contents at the forward
  bool valid = false;             // made by run_variant_for_backward
};

struct RecurrentForward {
  RecurrentResult result;
  RecurrentSaved saved;
};

// The forward of run_variant, keeping what its backward needs. Where it runs, and how it treats host
// and device tensors, follows options.backend and options.gpu as run_variant does (device tensors
// read in place, outputs where q lives; backend = cpu refuses a device tensor by name). After a CPU
// forward the backward runs on the CPU (checkpoints of the state every 64 tokens); after a GPU
// forward it runs on the GPU, as three recurrences of the plain form over the slots
// (run_variant_backward_composed; a normalised read's normaliser is the state's extra column), or
// for the update forms in ladle_bwd_update (codegen/cuda/update_backward.h).
RecurrentForward run_variant_for_backward(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const VariantInputs& inputs = {}, const RunOptions& options = {});

// The backward of run_variant, derived from the variant's expression (the gradient of gate math
// such as logsigmoid(x) / tau comes from ir::derivative of the lowered slots): d_output = dL/do
// ([B,T,H,V] or packed [T,H,V], any floating dtype) and optionally d_final_state = dL/d final_state
// ([N,H,K,V]). After a GPU forward, d_output and d_final_state may be host or device memory, as the
// forward's tensors may: device ones are read in place on the forward's options.gpu.stream (saved
// keeps the pointer: the stream must outlive it), host ones are uploaded, or refused by name when
// options.gpu.upload_host_tensors is off. On device tensors alone the call waits for the stream
// once, for the fingerprint's copy of the saved tensors, and returns with its kernels queued. After
// a CPU forward the backward reads every tensor on the host and refuses a device one by name. Bad
// input throws InvalidArgument naming it: a d_output or d_final_state of the wrong shape or dtype, a
// saved value whose tensors no longer hold what its forward read.
RecurrentGradients run_variant_backward(const RecurrentSaved& saved, const TensorView& d_output,
                                        const std::optional<TensorView>& d_final_state = std::nullopt);

// Caller-owned gradients, written by the call (fp32, contiguous, each in its input's shape): dq, dk,
// dv, every named tensor input's (by name; each must be given) and d initial_state when the call has
// one.
struct RecurrentGradientViews {
  TensorView dq, dk, dv;
  std::map<std::string, TensorView> inputs;
  std::optional<TensorView> d_initial_state;
};

// The backward of run_variant from the forward's own arguments, into caller-owned gradients, for
// callers that keep those arguments themselves (an autograd framework: ladle's Python entry). No
// saved value and no fingerprint, so nothing waits for the stream. On the GPU (as run_variant decides
// from options.backend and the tensors) it runs the GPU backward's kernels on options.gpu.stream, with
// no forward (host tensors uploaded, a host cu_seqlens read in place, a device one copied to the
// host); the update forms' in ladle_bwd_update (codegen/cuda/update_backward.h). On the CPU it
// runs the forward again for its checkpoints, then the CPU backward, and copies the gradients into
// the outputs. Bad input throws InvalidArgument naming it.
void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients);

// The backward by composition, on `backend` (gpu, or automatic with a GPU or a device tensor:
// gpu::run_variant_backward_into of ops/gpu_backward.h, generated kernels on device tensors, host and
// device tensors taken as run_variant_backward takes them; cpu: the same algorithm on the host, which
// the tests hold against the direct CPU backward, refusing a device tensor by name): the slots (q, k,
// v features, the log decays, the scale) evaluated at every token, then three recurrences of the
// plain form: dq = scale S_t do_t over the transposed state, and dv, dk over dS in the other
// direction (the decays shifted by one token); the decays' gradients as reverse sums of
// q . dq - k . dk (and o . do - v . dv), and the inputs' through ir::derivative. On the CPU not for
// normalised reads nor the update forms (their GPU backward is ladle_bwd_update's, not a composition).
RecurrentGradients run_variant_backward_composed(const RecurrentSaved& saved, const TensorView& d_output,
                                                 const std::optional<TensorView>& d_final_state, Backend backend);

}  // namespace ladle
