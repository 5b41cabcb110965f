// How a call of the chunked family runs, decided once. A ChunkedPlan names the form (serial, split
// or segmented), the tile, the segments and the state pass, and lists every kernel the call
// launches, in order, with what each one's grid walks. plan_chunked makes it from the call, the
// tile (the caller's, the tuner's, else the heuristic's) and the target, and checks it there: a
// plan that exists runs. The launcher (gpu::run_variant_into), the tuner's compile step and
// ladle-dump read the same plan, so the dump shows what runs; codegen emits each kernel as its
// spec says and decides nothing again (a spec asking for a form the variant cannot take is an
// InvalidArgument from cuda::generate_chunked, never a quiet fallback).
//
//   const gpu::ChunkedPlan plan = gpu::plan_chunked(variant, bound, options, gpu::device_target());
//   for (const gpu::ChunkedLaunch& launch : plan.launches) ... launch.spec, launch.over ...
//
// The heuristics behind each choice are measured in bench/RESULTS.md ("Evidence behind the
// heuristics"); the knobs below exist to measure the choices not taken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpu_recurrent.h"

namespace ladle::gpu {

// The plan's measurement knobs. The defaults are the library's choices; chunked_plan_knobs() reads
// the environment's overrides (the one place that reads them) and throws InvalidArgument naming the
// variable for a value it does not know:
//   LADLE_STATE_PIECES=n       the segmented state pass in n pieces per earlier segment (n >= 1)
//   LADLE_SUFFIX_STATES=0|1    the segmented state pass in the split form's (0) or the suffix
//                              form (1, where the variant takes it), never the ws form
//   LADLE_SUFFIX_CHUNK=32|64   the suffix pass's chunk (default 32)
//   LADLE_WS_KEY_STATES=0|1    the ws state pass for a key-side gate too (default 0: the suffix pass)
struct ChunkedPlanKnobs {
  std::int64_t state_pieces = 0;      // 0: by the heuristic (chunked_state_pieces)
  std::optional<bool> suffix_states;  // unset: the ws pass where it runs, else the suffix form where the variant takes it
  int suffix_chunk = 32;
  bool ws_key_states = false;
};
ChunkedPlanKnobs chunked_plan_knobs();

// One kernel of a plan and what its grid walks: the call's sequences, the split form's chunks
// (every sequence's, with chunk offsets for packed ones), or a row of a segments table (the
// earlier segments, or all of them).
struct ChunkedLaunch {
  enum class Over { sequences, chunks, earlier_segments, all_segments };
  cuda::ChunkedKernelSpec spec;
  Over over = Over::sequences;
};
const char* to_string(ChunkedLaunch::Over over);

struct ChunkedPlan {
  // serial: one kernel per (sequence, head, value tile) walks the whole sequence. split: a state
  // pass writes the state entering every chunk, then an output pass forms every chunk in parallel.
  // segmented: few long sequences cut into segments (cuda::ChunkedSegments): a state pass over every
  // segment but the last of its sequence, the fold, then the serial form over every segment.
  enum class Form { serial, split, segmented };
  Form form = Form::serial;
  cuda::ChunkedKernelSpec spec;         // the call's kernel: its tile (serial or split) and types
  std::int64_t segment_tokens = 0;      // segmented: tokens per segment
  std::int64_t state_pieces = 1;        // segmented: pieces of each earlier segment in the state pass
  cuda::ChunkedSegments segments;       // segmented: the tables, in pieces where state_pieces > 1
  std::vector<ChunkedLaunch> launches;  // in launch order
};
const char* to_string(ChunkedPlan::Form form);
// "segmented: 8 segments of 4096 tokens, state pass in 2 pieces; states <tile> over earlier_segments, ..."
std::string to_string(const ChunkedPlan& plan);

// The plan of a call (bound by ops::bind_inputs; choose_algorithm chose the chunked family and not
// the delta rule's form): options.chunked_tile where given (the caller's or the tuner's), else
// heuristic_chunked_tile for the sequences the tile sees (chunked_tile_sequences). Throws
// InvalidArgument, naming the argument, for a tile that does not fit the call or the target.
ChunkedPlan plan_chunked(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                         const GpuTarget& target, const ChunkedPlanKnobs& knobs = chunked_plan_knobs());

// The segmented form's state pass and fold alone, over the caller's segments (one piece each): what
// gpu::run_entry_states launches. The serial tile (the heuristic's for that many segments, else the
// default where the heuristic's is a split tile) chooses the state pass as plan_chunked would.
ChunkedPlan plan_entry_states(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                              const cuda::ChunkedSegments& segments, const GpuTarget& target,
                              const ChunkedPlanKnobs& knobs = chunked_plan_knobs());

// Tokens per segment of the chunked serial form for this call (0: whole sequences): the
// caller's RunOptions::chunked_segment_tokens, else, where the (sequence, head) pairs fill less
// than half the SMs and the sequences are long, a power-of-two cut of each sequence that keeps at
// least 1024 tokens a segment. A split tile runs whole sequences.
std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options);
std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options, const GpuTarget& target);

// The plan gpu::run_variant_with_chunk_states runs for a bound call (its tile in options, else the
// heuristic's): the serial ws form with chunk_states_out set, or nullopt where the call takes another
// form (defined in gpu_recurrent.cpp).
std::optional<ChunkedPlan> chunk_states_plan(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                             const GpuTarget& target);
// The sequences a tile is chosen for: the segments where the call runs segmented, else 0 (the call's N).
std::int64_t chunked_tile_sequences(const ops::BoundInputs& bound, const RunOptions& options, const GpuTarget& target);

// The delta rule's chunked form (codegen/cuda/chunked_delta.h), decided once in the same way: three
// kernels on the call's stream, prepare over every chunk (W, U, k and gamma into work arrays), the
// states pass over each sequence (h and E, chunk after chunk), outputs over every chunk. The
// launcher (gpu::run_variant_into), ladle-dump and `ladle-cache prebuild` read this plan.
struct ChunkedDeltaLaunch {
  // chunks: every chunk of every sequence x head (the outputs also x value blocks of the kernel's
  // block_v); sequences: value blocks of 64 x (sequence, head), a sequence with no chunks passing its
  // initial state to its final state.
  enum class Over { chunks, sequences };
  cuda::ChunkedDeltaSpec spec;
  Over over = Over::chunks;
};
struct ChunkedDeltaPlan {
  std::vector<ChunkedDeltaLaunch> launches;  // prepare, states, outputs
};
// The plan of a bound call that choose_algorithm sends to the delta rule's chunked form: the
// specs' types, 16-byte loads where every 16-bit row of q, k, v and the token inputs is 16 aligned,
// contiguous bytes.
ChunkedDeltaPlan plan_chunked_delta(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options);
const char* to_string(ChunkedDeltaLaunch::Over over);

// Why TMA cannot copy this call's q, k and v as the chunked ws form reads them (empty: it can):
// bf16 [B,T,X,D] views with contiguous features, a 16-byte aligned start and strides of whole 16 bytes.
std::string ws_copyable(const ir::Variant& variant, const ops::BoundInputs& bound);

// The chunked tile without tuning: by K and V, the device's shared memory, and the number
// of blocks the shape gives (sequences: the segments when the call runs segmented, else 0: N).
cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound,
                                         std::int64_t sequences = 0);
// The same for a target (device_target() without a driver is planned as named_target(cuda::Target::hopper)).
cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, std::int64_t sequences,
                                         const GpuTarget& target);
// The split form of a serial tile (state tiles 64 x 64 of 4 warps, bf16 per-chunk states).
cuda::ChunkedTile split_chunked_tile(const cuda::ChunkedTile& serial, std::int64_t value_dim);
// The call's kernel spec (its tile: options.chunked_tile, else the heuristic's), checked against the
// call and the target: what plan_chunked starts from, and what ladle::run_variant checks before it
// uploads anything.
cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options);
cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options, const GpuTarget& target);
// The segmented form's kernels for a call's serial spec: the state pass over every segment but
// the last (the suffix form where the variant takes it; else the split form's state tile of
// split_chunked_tile, at 64-token chunks where they fit max_shared_bytes, 0: not checked), the
// fold, then the serial form over every segment.
struct SegmentedSpecs {
  cuda::ChunkedKernelSpec first, fold, serial;  // the state pass, the fold, the serial form
  // Whether the fold runs as a kernel of its own: not after a ws serial tile, whose kernel folds the
  // earlier segments' states itself as it starts.
  bool fold_runs() const { return !serial.tile.ws; }
};
// On sm_90a (serial.arch, or a ws serial tile) the state pass runs in the ws form where the variant
// and types allow (cuda::chunked_ws_unsupported of a states spec) and ws_state_pass is set: the caller
// clears it where TMA cannot copy the call's k, v and gate inputs (ws_states_copyable). knobs: the
// library's choices unless given.
SegmentedSpecs segmented_chunked_specs(const ir::Variant& variant, const cuda::ChunkedKernelSpec& serial,
                                       std::int64_t key_dim, std::int64_t value_dim, int max_shared_bytes = 0,
                                       bool ws_state_pass = true, const ChunkedPlanKnobs& knobs = {});
// Why TMA cannot copy this call's k, v and key-gate inputs as the ws state pass reads them (empty: it can).
std::string ws_states_copyable(const ir::Variant& variant, const ops::BoundInputs& bound);

}  // namespace ladle::gpu
