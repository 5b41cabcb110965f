#include "chunked_plan.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include <ladle/runtime/error.h>

#include "gpu_attention.h"

namespace ladle::gpu {
namespace {

std::string op_name(const ir::Variant& variant) { return variant.name.empty() ? "variant" : variant.name; }

// An environment variable's value, or "" where it is unset.
std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

ChunkedPlanKnobs chunked_plan_knobs() {
  ChunkedPlanKnobs knobs;
  const auto fail = [](const char* name, const std::string& value, const char* expected) {
    throw InvalidArgument(fmt::format("{} = '{}', expected {}", name, value, expected));
  };
  if (const std::string pieces = environment("LADLE_STATE_PIECES"); !pieces.empty()) {
    char* end = nullptr;
    const long long value = std::strtoll(pieces.c_str(), &end, 10);
    if (*end != '\0' || value < 1) fail("LADLE_STATE_PIECES", pieces, "a count >= 1");
    knobs.state_pieces = value;
  }
  if (const std::string suffix = environment("LADLE_SUFFIX_STATES"); !suffix.empty()) {
    if (suffix != "0" && suffix != "1") fail("LADLE_SUFFIX_STATES", suffix, "0 (the split form's state pass) or 1 (the suffix form's)");
    knobs.suffix_states = suffix == "1";
  }
  if (const std::string chunk = environment("LADLE_SUFFIX_CHUNK"); !chunk.empty()) {
    if (chunk != "32" && chunk != "64") fail("LADLE_SUFFIX_CHUNK", chunk, "32 or 64");
    knobs.suffix_chunk = chunk == "64" ? 64 : 32;
  }
  if (const std::string key = environment("LADLE_WS_KEY_STATES"); !key.empty()) {
    if (key != "0" && key != "1") fail("LADLE_WS_KEY_STATES", key, "0 or 1");
    knobs.ws_key_states = key == "1";
  }
  return knobs;
}

const char* to_string(ChunkedLaunch::Over over) {
  switch (over) {
    case ChunkedLaunch::Over::sequences: return "sequences";
    case ChunkedLaunch::Over::chunks: return "chunks";
    case ChunkedLaunch::Over::earlier_segments: return "earlier segments";
    case ChunkedLaunch::Over::all_segments: return "all segments";
  }
  return "?";
}

const char* to_string(ChunkedPlan::Form form) {
  switch (form) {
    case ChunkedPlan::Form::serial: return "serial";
    case ChunkedPlan::Form::split: return "split";
    case ChunkedPlan::Form::segmented: return "segmented";
  }
  return "?";
}

std::string to_string(const ChunkedPlan& plan) {
  std::string out = to_string(plan.form);
  if (plan.form == ChunkedPlan::Form::segmented)
    out += fmt::format(" ({} segments of at most {} tokens, the state pass in {} piece{})", plan.segments.segments(),
                       plan.segment_tokens, plan.state_pieces, plan.state_pieces == 1 ? "" : "s");
  for (const ChunkedLaunch& launch : plan.launches) {
    const char* form = launch.spec.suffix_states ? " suffix" : "";
    out += fmt::format("; {}{} ({}) over {}", cuda::to_string(launch.spec.phase), form, cuda::to_string(launch.spec.tile),
                       to_string(launch.over));
  }
  return out;
}

// The serial form (8 warps, one block per SM): the widest value tile K allows, narrowed while the
// narrower grid still runs in one wave, at 64-token chunks or 32 where 64 would crowd the
// registers or leave no room for the prefetch: 128,32,128,8 at B32 T1024 and B8 T4096,
// 128,64,32,8 at B2 T16384, each the tuner's choice too. The split form (parallel over chunks) is
// correct but slower at every benchmark shape, so a split tile is used only when named
// (bench/RESULTS.md, "Evidence behind the heuristics", H5). Where the call runs segmented
// (chunked_segment_tokens), `sequences` is the number of segments: B2 T16384 in 4 segments takes
// B8 T4096's tile, 128,32,128,8.
std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options) {
  return chunked_segment_tokens(bound, options, device_target());
}

std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options, const GpuTarget& target) {
  if (options.chunked_segment_tokens) return *options.chunked_segment_tokens;  // checked by bind_inputs
  if (options.chunked_tile && options.chunked_tile->split()) return 0;
  const auto& args = bound.args;
  const std::int64_t N = bound.dims.N;
  if (N == 0) return 0;
  const int sms = target.sms > 0 ? target.sms : 132;
  const std::int64_t per_sequence = args.cu_seqlens.empty() ? args.tokens : args.cu_seqlens.back() / N;
  // B2 T16384 in 4 segments of 4096 tokens runs as B8 T4096 does, plus the segments' own states
  // (bench/RESULTS.md, "Evidence behind the heuristics", H6).
  std::int64_t pieces = 1;
  while (2 * pieces * N * args.heads <= sms && per_sequence / (2 * pieces) >= 1024) pieces *= 2;
  if (pieces == 1) return 0;
  return ((per_sequence + pieces - 1) / pieces + 63) / 64 * 64;
}

// Why TMA cannot copy this call's q, k and v (and a key-side gate's per-token inputs) as the ws form
// reads them (empty: it can): q, k and v in bf16, the gate's inputs in 16 bits; each [B,T,X,D] view
// needs contiguous features, a 16-byte aligned start and strides of whole 16 bytes.
std::string ws_copyable(const ir::Variant& variant, const ops::BoundInputs& bound) {
  const std::vector<int> gate = cuda::chunked_ws_gate_inputs(variant);
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Role role = variant.inputs[i].role;
    const bool gate_input = std::find(gate.begin(), gate.end(), static_cast<int>(i)) != gate.end();
    if (role != ir::Role::query && role != ir::Role::key && role != ir::Role::value && !gate_input) continue;
    const TensorView& view = bound.args.tensors[i];
    if (!gate_input && view.type != DType::bf16) return variant.inputs[i].name + " is not bf16";
    if (gate_input && view.type != DType::bf16 && view.type != DType::f16) return variant.inputs[i].name + " is not 16-bit";
    const auto problems = validate_tensor_map(attention_tensor_map(view, 64));
    if (!problems.empty()) return variant.inputs[i].name + ": " + problems.front();
  }
  return {};
}

cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, std::int64_t sequences) {
  return heuristic_chunked_tile(variant, bound, sequences, device_target());
}

// Not memoised here: a repeated call skips it whole (gpu::run_variant_into's call memo,
// ops/detail/call_signature.h).
cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, std::int64_t sequences,
                                         const GpuTarget& target) {
  const auto& args = bound.args;
  const std::int64_t N = sequences > 0 ? sequences : bound.dims.N;
  cuda::ChunkedTile tile = cuda::default_chunked_tile(args.key_dim, args.value_dim);
  // Without a device: the H100's figures.
  const GpuTarget known = target.arch.empty() ? named_target(cuda::Target::hopper) : target;
  const bool copyable = cuda::has_wgmma(known.arch) && args.key_dim <= 128 && ws_copyable(variant, bound).empty();
  const int max_shared = known.max_shared_bytes, sms = known.sms > 0 ? known.sms : 132;
  const std::string& arch = known.arch;
  const auto valid = [&](const cuda::ChunkedTile& t) {
    return cuda::validate_chunked_tile(t, variant, args.key_dim, args.value_dim, max_shared).empty();
  };
  // The whole value width per block where K allows it: q, k and the gates are staged and their
  // intra-chunk products formed once per (sequence, head) instead of once per value tile
  // (bench/RESULTS.md, "Evidence behind the heuristics", H7).
  if (tile.block_k <= 128) {
    cuda::ChunkedTile wide = tile;
    wide.block_v = static_cast<int>(std::clamp<std::int64_t>((args.value_dim + 15) / 16 * 16, 16, 128));
    if (valid(wide)) tile = wide;
  }
  // Few (sequence, head) pairs: narrower value tiles give more blocks, while the narrower grid
  // still runs in one wave (B2 T16384: block_v 32, 128 blocks, beat 64 and 128).
  const auto blocks = [&](int block_v) { return N * args.heads * ((args.value_dim + block_v - 1) / block_v); };
  while (tile.block_v > 32 && 2 * blocks(tile.block_v) <= sms &&
         valid({tile.block_k, tile.chunk, tile.block_v / 2, tile.warps}))
    tile.block_v /= 2;
  // 64-token chunks where the next chunk's prefetch fits beside them and a thread keeps at most
  // 32 state values, else 32-token ones (block_v 128 at 8 warps, 64 state values a thread: 64
  // tokens leave no room for the prefetch, or spill; bench/RESULTS.md, "Evidence behind the
  // heuristics", H8).
  cuda::ChunkedTile shorter = tile;
  shorter.chunk = 32;
  const bool crowded = tile.block_k * tile.block_v / (32 * tile.warps) > 32;
  if ((!valid(tile) || crowded || !cuda::chunked_prefetch(variant, tile)) && valid(shorter) &&
      cuda::chunked_prefetch(variant, shorter))
    tile = shorter;
  if (!valid(tile)) tile.chunk = 32;
  // sm_90a, a per-head decay, bf16 q, k, v that TMA can copy: the warp-specialised form (a TMA
  // producer beside one wgmma consumer warpgroup per 64 value columns).
  if (cuda::has_wgmma(arch) && args.key_dim <= 128) {
    cuda::ChunkedTile ws{args.key_dim <= 64 ? 64 : 128, 64, args.value_dim <= 64 ? 64 : 128, 0};
    ws.warps = 4 + ws.block_v / 16;
    ws.ws = true;
    cuda::ChunkedKernelSpec types;
    types.tile = ws;
    for (std::size_t i = 0; i < variant.inputs.size(); ++i)
      types.input_types.push_back(variant.inputs[i].kind == ir::InputKind::scalar ? DType::f32 : args.tensors[i].type);
    if (valid(ws) && cuda::chunked_ws_unsupported(variant, types).empty() && copyable) return ws;
  }
  // sm_90a: the state update on wgmma where the warps cover the state in whole warpgroups
  // (bench/RESULTS.md, "Evidence behind the heuristics", H9).
  if (cuda::has_wgmma(arch)) {
    cuda::ChunkedTile w = tile;
    w.wgmma = true;
    if (valid(w)) tile = w;
    // A per-head decay at most: 64-token chunks on wgmma, where the state update runs beside the
    // output; GLA's key gate keeps 32 (bench/RESULTS.md, "Evidence behind the heuristics", H10).
    cuda::ChunkedTile longer = tile;
    longer.chunk = 64;
    if (tile.wgmma && cuda::chunked_head_decay_only(variant) && valid(longer) && cuda::chunked_prefetch(variant, longer))
      tile = longer;
  }
  return tile;
}

// The split form's default for these sizes: the heuristic's output tile at block_v 64, state
// tiles of 64 x 64 (smaller where K or V is) with 4 warps, bf16 per-chunk states.
cuda::ChunkedTile split_chunked_tile(const cuda::ChunkedTile& serial, std::int64_t value_dim) {
  cuda::ChunkedTile tile = serial;
  tile.wgmma = false;  // the split form's kernels run mma.sync
  if (tile.ws) tile.ws = false, tile.warps = 8;  // the ws form has no state pass of its own
  tile.state_block_k = std::min(64, tile.block_k);
  tile.state_block_v = std::min<int>(64, static_cast<int>((value_dim + 15) / 16 * 16));
  tile.state_warps = 4;
  return tile;
}

namespace {

// The suffix state pass (one block of 8 warps per SM, each owning a whole state tile) in pieces
// where the earlier segments alone leave SMs idle: the smallest power of two up to 16 that gives
// two blocks per SM, while a piece keeps at least 512 tokens (bench/RESULTS.md, issue 11, eighth
// step; LADLE_STATE_PIECES measures the others).
std::int64_t chunked_state_pieces(const cuda::ChunkedKernelSpec& first, const ops::BoundInputs& bound, const GpuTarget& target,
                                  const cuda::ChunkedSegments& segments, std::int64_t segment_tokens) {
  if (!first.tile.ws && !first.suffix_states) return 1;
  const int sms = target.sms > 0 ? target.sms : 132;
  const std::int64_t value_tiles = (bound.args.value_dim + first.tile.block_v - 1) / first.tile.block_v;
  const std::int64_t blocks = segments.earlier_segments() * bound.args.heads * value_tiles;
  std::int64_t pieces = 1;
  while (pieces < 16 && blocks * pieces < 2 * sms && segment_tokens / (2 * pieces) >= 512) pieces *= 2;
  return pieces;
}

}  // namespace

std::string ws_states_copyable(const ir::Variant& variant, const ops::BoundInputs& bound) {
  std::vector<int> inputs = cuda::chunked_ws_gate_inputs(variant);
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    if (variant.inputs[i].role == ir::Role::key || variant.inputs[i].role == ir::Role::value) inputs.push_back(static_cast<int>(i));
  for (int i : inputs) {
    const TensorView& view = bound.args.tensors[static_cast<std::size_t>(i)];
    if (view.type != DType::bf16 && view.type != DType::f16) return variant.inputs[i].name + " is not 16-bit";
    const auto problems = validate_tensor_map(attention_tensor_map(view, 64));
    if (!problems.empty()) return variant.inputs[i].name + ": " + problems.front();
  }
  return {};
}

SegmentedSpecs segmented_chunked_specs(const ir::Variant& variant, const cuda::ChunkedKernelSpec& serial,
                                       std::int64_t key_dim, std::int64_t value_dim, int max_shared_bytes, bool ws_state_pass,
                                       const ChunkedPlanKnobs& knobs) {
  SegmentedSpecs out{serial, serial, serial};
  out.serial.segmented = true;
  out.serial.varlen = false;
  out.serial.suffix_states = false;
  out.fold = out.serial;
  out.fold.phase = cuda::ChunkedPhase::fold;
  out.first = out.serial;
  out.first.tile = split_chunked_tile(serial.tile, value_dim);
  cuda::ChunkedTile longer = out.first.tile;  // 64-token chunks where the tile allows them
  longer.chunk = 64;
  longer.warps = std::max(longer.warps, 4);
  if (cuda::validate_chunked_tile(longer, variant, key_dim, value_dim, max_shared_bytes).empty()) out.first.tile = longer;
  out.first.phase = cuda::ChunkedPhase::states;
  out.first.initial_state = out.first.final_state = false;
  // The suffix form where the variant takes it (knobs.suffix_states = false: the split form's state
  // pass instead), at 32-token chunks, two blocks per SM (bench/RESULTS.md, "Evidence behind the
  // heuristics", H11; knobs.suffix_chunk 64 measures the other).
  out.first.suffix_states = knobs.suffix_states.value_or(true) && cuda::chunked_suffix_states_unsupported(variant, out.first).empty();
  if (out.first.suffix_states) out.first.tile.chunk = knobs.suffix_chunk;
  // A ws serial tile: the state pass in the ws form too (k and v by TMA, the update alone on wgmma,
  // one consumer warpgroup per block, two blocks per SM), unless the knobs name another.
  // A key-side gate keeps the suffix pass: its ws form is slower (the per-feature sums are
  // latency-bound; bench/RESULTS.md, "Evidence behind the heuristics", H12) unless
  // knobs.ws_key_states asks for it.
  const bool key_gate = variant.has(ir::Slot::log_decay_k) && !knobs.ws_key_states;
  if (ws_state_pass && !knobs.suffix_states && !key_gate && key_dim <= 128 && (serial.tile.ws || cuda::has_wgmma(serial.arch))) {
    cuda::ChunkedKernelSpec ws = out.first;
    ws.tile = cuda::ChunkedTile{key_dim <= 64 ? 64 : 128, 64, 64, 8};
    ws.tile.ws = true;
    ws.suffix_states = false;
    if (cuda::chunked_ws_unsupported(variant, ws).empty()) out.first = ws;
  }
  return out;
}

cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options) {
  return chunked_kernel_spec(variant, bound, options, device_target());
}

cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options, const GpuTarget& target) {
  const auto& args = bound.args;
  cuda::ChunkedKernelSpec spec;
  spec.tile = options.chunked_tile.value_or(heuristic_chunked_tile(variant, bound, 0, target));
  const int max_shared = target.max_shared_bytes;
  spec.arch = target.arch;
  if (auto problems = cuda::validate_chunked_tile(spec.tile, variant, args.key_dim, args.value_dim, max_shared, spec.arch);
      !problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw InvalidArgument(fmt::format("{}: chunked_tile ({}) does not fit K={} V={}: {}", op_name(variant),
                                      cuda::to_string(spec.tile), args.key_dim, args.value_dim, all));
  }
  static_cast<cuda::KernelTypes&>(spec) = kernel_types(variant, bound, options);
  if (spec.tile.ws) {
    if (const std::string why = cuda::chunked_ws_unsupported(variant, spec); !why.empty())
      throw InvalidArgument(fmt::format("{}: chunked_tile ({}): {}", op_name(variant), cuda::to_string(spec.tile), why));
    if (const std::string why = ws_copyable(variant, bound); !why.empty())
      throw InvalidArgument(fmt::format("{}: chunked_tile ({}) copies q, k and v by TMA: {}", op_name(variant),
                                        cuda::to_string(spec.tile), why));
  }
  return spec;
}

std::int64_t chunked_tile_sequences(const ops::BoundInputs& bound, const RunOptions& options, const GpuTarget& target) {
  const std::int64_t segment_tokens = chunked_segment_tokens(bound, options, target);
  if (segment_tokens == 0) return 0;
  const auto& args = bound.args;
  return cuda::chunked_segments(bound.dims.N, args.tokens, args.cu_seqlens, segment_tokens, args.reverse).segments();
}

ChunkedPlan plan_chunked(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                         const GpuTarget& target, const ChunkedPlanKnobs& knobs) {
  const auto& args = bound.args;
  ChunkedPlan plan;
  plan.segment_tokens = chunked_segment_tokens(bound, options, target);
  RunOptions tiled = options;
  if (!tiled.chunked_tile) tiled.chunked_tile = heuristic_chunked_tile(variant, bound, chunked_tile_sequences(bound, options, target), target);
  plan.spec = chunked_kernel_spec(variant, bound, tiled, target);
  using Over = ChunkedLaunch::Over;
  if (plan.segment_tokens > 0) {
    // ops::bind_inputs refuses the caller's segments with a split tile; the library's own never meet one.
    if (plan.spec.tile.split())
      throw InvalidArgument(fmt::format("{}: chunked_segment_tokens = {} with a split chunked_tile ({}): the split form runs whole "
                                        "sequences (name a serial tile, or chunked_segment_tokens = 0)",
                                        op_name(variant), plan.segment_tokens, cuda::to_string(plan.spec.tile)));
    plan.form = ChunkedPlan::Form::segmented;
    plan.segments = cuda::chunked_segments(bound.dims.N, args.tokens, args.cu_seqlens, plan.segment_tokens, args.reverse);
    const SegmentedSpecs specs = segmented_chunked_specs(variant, plan.spec, args.key_dim, args.value_dim, target.max_shared_bytes,
                                                         ws_states_copyable(variant, bound).empty(), knobs);
    plan.state_pieces = knobs.state_pieces > 0 ? knobs.state_pieces
                                               : chunked_state_pieces(specs.first, bound, target, plan.segments, plan.segment_tokens);
    if (plan.state_pieces > 1)
      plan.segments = cuda::chunked_segments(bound.dims.N, args.tokens, args.cu_seqlens, plan.segment_tokens, args.reverse,
                                             plan.state_pieces);
    plan.launches.push_back({specs.first, Over::earlier_segments});
    if (specs.fold_runs()) plan.launches.push_back({specs.fold, Over::all_segments});
    plan.launches.push_back({specs.serial, Over::all_segments});
  } else if (plan.spec.tile.split()) {
    plan.form = ChunkedPlan::Form::split;
    cuda::ChunkedKernelSpec states = plan.spec, outputs = plan.spec;
    states.phase = cuda::ChunkedPhase::states;
    outputs.phase = cuda::ChunkedPhase::outputs;
    plan.launches = {{states, Over::chunks}, {outputs, Over::chunks}};
  } else {
    plan.launches = {{plan.spec, Over::sequences}};
  }
  return plan;
}

ChunkedPlan plan_entry_states(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                              const cuda::ChunkedSegments& segments, const GpuTarget& target, const ChunkedPlanKnobs& knobs) {
  const auto& args = bound.args;
  if (segments.all.size() % 8 != 0 || segments.earlier.size() % 8 != 0 || segments.all.empty())
    throw InvalidArgument(op_name(variant) + ": segments: tables of 8 values a row, at least one segment, expected");
  ChunkedPlan plan;
  plan.form = ChunkedPlan::Form::segmented;
  plan.segments = segments;
  RunOptions tiled = options;
  if (!tiled.chunked_tile) {
    tiled.chunked_tile = heuristic_chunked_tile(variant, bound, segments.segments(), target);
    if (tiled.chunked_tile->split() || (tiled.chunked_tile->ws && !ws_copyable(variant, bound).empty()))
      tiled.chunked_tile = cuda::default_chunked_tile(args.key_dim, args.value_dim);
  }
  plan.spec = chunked_kernel_spec(variant, bound, tiled, target);
  if (plan.spec.tile.split())
    throw InvalidArgument(fmt::format("{}: chunked_tile ({}): the entry states run the segmented form, which takes a serial tile",
                                      op_name(variant), cuda::to_string(plan.spec.tile)));
  const SegmentedSpecs specs = segmented_chunked_specs(variant, plan.spec, args.key_dim, args.value_dim, target.max_shared_bytes,
                                                       ws_states_copyable(variant, bound).empty(), knobs);
  plan.spec = specs.serial;
  for (std::size_t r = 0; r < segments.all.size(); r += 8)
    plan.segment_tokens = std::max<std::int64_t>(plan.segment_tokens, segments.all[r + 2] - segments.all[r + 1]);
  // The fold runs here though the serial form does not: after a ws serial tile it runs in the mma.sync
  // form's tile (the fold is the same kernel whatever the tile; the ws serial kernel folds for itself).
  cuda::ChunkedKernelSpec fold = specs.fold;
  if (fold.tile.ws) fold.tile = cuda::default_chunked_tile(args.key_dim, args.value_dim);
  plan.launches = {{specs.first, ChunkedLaunch::Over::earlier_segments}, {fold, ChunkedLaunch::Over::all_segments}};
  return plan;
}

ChunkedDeltaPlan plan_chunked_delta(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options) {
  const auto& args = bound.args;
  const cuda::KernelTypes types = kernel_types(variant, bound, options);
  cuda::ChunkedDeltaSpec prepare = cuda::chunked_delta_spec(types, args.key_dim, args.value_dim, cuda::ChunkedDeltaPhase::prepare);
  // 16-byte loads of q, k and v where each row of 8 features is 16 contiguous, aligned bytes.
  bool vector_loads = args.key_dim % 8 == 0 && args.value_dim % 8 == 0;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    if (variant.inputs[i].role == ir::Role::other) continue;
    const TensorView& x = args.tensors[i];
    const bool sixteen = x.type == DType::bf16 || x.type == DType::f16;
    const bool aligned = reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0 && x.strides[3] == 1 &&
                         (x.shape[0] == 1 || x.strides[0] % 8 == 0) && x.strides[1] % 8 == 0 && x.strides[2] % 8 == 0;
    vector_loads = vector_loads && sixteen && aligned;
  }
  prepare.vector_loads = vector_loads;
  cuda::ChunkedDeltaSpec states = prepare, outputs = prepare;
  states.phase = cuda::ChunkedDeltaPhase::states;
  outputs.phase = cuda::ChunkedDeltaPhase::outputs;
  ChunkedDeltaPlan plan;
  plan.launches = {{prepare, ChunkedDeltaLaunch::Over::chunks}, {states, ChunkedDeltaLaunch::Over::sequences},
                  {outputs, ChunkedDeltaLaunch::Over::chunks}};
  return plan;
}


const char* to_string(ChunkedDeltaLaunch::Over over) { return over == ChunkedDeltaLaunch::Over::chunks ? "chunks" : "sequences"; }

}  // namespace ladle::gpu
