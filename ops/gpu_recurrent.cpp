#include "gpu_recurrent.h"

#include <ladle/codegen/cuda/chunked_delta.h>

#include "detail/loaded_kernel.h"
#include "detail/pack_input.h"
#include "gpu_attention.h"
#include "tune_recurrent.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

namespace ladle::gpu {
namespace {

using Role = cuda::KernelParam::Role;

std::string op_name(const ir::Variant& variant) {
  return variant.name.empty() ? "variant" : variant.name;
}

bool is_contiguous(const TensorView& view) {
  std::int64_t expected = 1;
  for (int d = view.rank() - 1; d >= 0; --d) {
    if (view.shape[d] != 1 && view.strides[d] != expected) return false;
    expected *= view.shape[d];
  }
  return true;
}

template <class Spec>
std::string spec_key(const ir::Variant& variant, const Spec& spec, const std::string& arch) {
  std::string key = ir::hash_hex(variant) + "|" + arch + "|" + cuda::to_string(spec.tile);
  if constexpr (requires { spec.phase; })
    key += std::string("|") + cuda::to_string(spec.phase) + (spec.segmented ? "|segmented" : "") + (spec.suffix_states ? "|suffix" : "");
  for (DType t : spec.input_types) key += dtype_name(t);
  key += fmt::format("|{}{}{}{}{}{}{}", dtype_name(spec.output_type), spec.reverse,
                     spec.varlen, dtype_name(spec.cu_seqlens_type), spec.initial_state,
                     dtype_name(spec.initial_state_type), spec.final_state);
  return key;
}

// The loaded kernel of (variant, spec) on this GPU, compiled on the first call.
template <class Spec, class Compile>
const auto& loaded_kernel(const ir::Variant& variant, const Spec& spec, Compile compile_family) {
  using Generated = decltype(compile_family(variant, spec, std::string()).kernel);
  const std::string arch = Device::get().properties().arch();
  return detail::loaded_kernel<Generated>(spec_key(variant, spec, arch), arch, [&](const std::string& target) {
    return compile_family(variant, spec, target);
  });
}

// A segments table on the device, kept for the process: a later call with the same table (the same
// shape) passes it again instead of copying it. Each call copied two small tables from pageable
// memory, and the GPU waited on those copies between the kernels (bench/RESULTS.md, "Evidence
// behind the heuristics", H3). 0: not cached (the cache holds 512 tables; then the caller copies
// its own).
std::uint64_t segment_rows(const std::vector<long long>& rows) {
  static std::mutex mutex;
  static auto* const tables = new std::map<std::vector<long long>, DeviceBuffer>();  // never freed: kernels may read them at exit
  if (rows.empty()) return 0;
  std::lock_guard lock(mutex);
  if (const auto found = tables->find(rows); found != tables->end()) return found->second.device_ptr();
  if (tables->size() >= 512) return 0;
  DeviceBuffer buffer(rows.size() * sizeof(long long));
  buffer.copy_from_host(rows.data(), rows.size() * sizeof(long long));
  return tables->emplace(rows, std::move(buffer)).first->second.device_ptr();
}

// What the split chunked form's kernels take besides a call's arguments.
struct SplitArguments {
  std::uint64_t chunk_states = 0;   // device [chunks][H][K][V]
  std::uint64_t chunk_offsets = 0;  // device [N+1] (varlen)
  std::int64_t sequences = 0;
  std::uint64_t segments = 0;        // the segmented form: device [S][8] (cuda::ChunkedSegments)
  std::uint64_t segment_states = 0;  // device [S'][H][K][V] f32
  std::uint64_t segment_decay = 0;   // device [S'][H][DL] f32
  std::uint64_t delta_w = 0, delta_u = 0, delta_k = 0, delta_e = 0, delta_h = 0, delta_gamma = 0;  // the chunked delta rule's work arrays
};

}  // namespace

namespace detail {

bool pack_input(KernelArgs& packed, const cuda::KernelParam& p, const ir::Variant& variant, const cpu::RecurrentArgs& args) {
  if (p.input < 0) return false;
  const TensorView* view = &args.tensors[p.input];
  const bool head_param = variant.inputs[p.input].kind == ir::InputKind::head;
  switch (p.role) {
    case Role::input:
      if (p.type == cuda::KernelParam::Type::f32) packed.add(args.scalars[p.input]);
      else packed.add(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(view->data)));
      return true;
    case Role::input_stride_b: packed.add(static_cast<long long>(view->strides[0])); return true;
    case Role::input_stride_t: packed.add(static_cast<long long>(view->strides[1])); return true;
    case Role::input_stride_h: packed.add(static_cast<long long>(view->strides[head_param ? 1 : 2])); return true;
    case Role::input_stride_d: packed.add(static_cast<long long>(view->strides[3])); return true;
    case Role::input_heads: packed.add(static_cast<int>(view->shape[head_param ? 1 : 2])); return true;
    default: return false;
  }
}

}  // namespace detail

namespace {

// The argument array of a kernel of the recurrence families, by parameter role.
KernelArgs pack_arguments(const std::vector<cuda::KernelParam>& params, const ir::Variant& variant,
                          const cpu::RecurrentArgs& args, std::uint64_t offsets, const SplitArguments& split = {}) {
  KernelArgs packed;
  auto ptr = [](const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); };
  for (const cuda::KernelParam& p : params) {
    const TensorView* view = p.input >= 0 ? &args.tensors[p.input] : nullptr;
    if (detail::pack_input(packed, p, variant, args)) continue;
    switch (p.role) {
      case Role::input:
      case Role::input_stride_b:
      case Role::input_stride_t:
      case Role::input_stride_h:
      case Role::input_stride_d:
      case Role::input_heads: break;  // packed above
      case Role::output: packed.add(ptr(args.output.data)); break;
      case Role::output_stride_b: packed.add(static_cast<long long>(args.output.strides[0])); break;
      case Role::output_stride_t: packed.add(static_cast<long long>(args.output.strides[1])); break;
      case Role::output_stride_h: packed.add(static_cast<long long>(args.output.strides[2])); break;
      case Role::output_stride_d: packed.add(static_cast<long long>(args.output.strides[3])); break;
      case Role::initial_state: packed.add(ptr(args.initial_state->data)); break;
      case Role::final_state: packed.add(ptr(args.final_state->data)); break;
      case Role::cu_seqlens: packed.add(offsets); break;
      case Role::batch: packed.add(static_cast<int>(args.batch)); break;
      case Role::tokens: packed.add(static_cast<int>(args.tokens)); break;
      case Role::heads: packed.add(static_cast<int>(args.heads)); break;
      case Role::key_dim: packed.add(static_cast<int>(args.key_dim)); break;
      case Role::value_dim: packed.add(static_cast<int>(args.value_dim)); break;
      case Role::chunk_states: packed.add(split.chunk_states); break;
      case Role::chunk_offsets: packed.add(split.chunk_offsets); break;
      case Role::sequences: packed.add(static_cast<int>(split.sequences)); break;
      case Role::segments: packed.add(split.segments); break;
      case Role::segment_states: packed.add(split.segment_states); break;
      case Role::segment_decay: packed.add(split.segment_decay); break;
      case Role::delta_w: packed.add(split.delta_w); break;
      case Role::delta_u: packed.add(split.delta_u); break;
      case Role::delta_k: packed.add(split.delta_k); break;
      case Role::delta_e: packed.add(split.delta_e); break;
      case Role::delta_h: packed.add(split.delta_h); break;
      case Role::delta_gamma: packed.add(split.delta_gamma); break;
      case Role::input_tensor_map: packed.add(encode_tensor_map(attention_tensor_map(*view, p.box_rows))); break;
    }
  }
  return packed;
}

}  // namespace

cuda::KernelTypes kernel_types(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options) {
  const auto& args = bound.args;
  cuda::KernelTypes spec;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    spec.input_types.push_back(variant.inputs[i].kind == ir::InputKind::scalar ? DType::f32
                                                                               : args.tensors[i].type);
  }
  spec.output_type = bound.args.output.data ? bound.args.output.type : bound.dims.type;  // o bound: its dtype
  spec.reverse = args.reverse;
  spec.varlen = !args.cu_seqlens.empty();
  spec.cu_seqlens_type = DType::i64;
  spec.initial_state = args.initial_state.has_value();
  if (args.initial_state) spec.initial_state_type = args.initial_state->type;
  spec.final_state = options.return_state;
  return spec;
}

// The heuristic tile for this call's shape. Few (sequence, head) pairs leave most SMs idle
// with wide tiles; narrow ones give more blocks (bench/RESULTS.md, "Evidence behind the
// heuristics", H4). Without a device (dump, CI) the size-only heuristic applies.
GpuTarget device_target() {
  if (!driver_available()) return {};
  const DeviceProperties& device = Device::get().properties();
  return {device.arch(), device.sm_count, device.max_shared_per_block_optin};
}

GpuTarget named_target(const std::string& arch) {
  if (arch.empty()) return device_target();
  return {arch, 132, cuda::target(arch).max_shared_bytes};
}

cuda::RecurrentTile heuristic_tile(const ops::BoundInputs& bound) { return heuristic_tile(bound, device_target()); }

cuda::RecurrentTile heuristic_tile(const ops::BoundInputs& bound, const GpuTarget& target) {
  const auto& args = bound.args;
  cuda::RecurrentTile tile = cuda::default_tile(args.key_dim, args.value_dim);
  if (tile.block_k != 128 || target.sms == 0) return tile;
  const std::int64_t wide_blocks = bound.dims.N * args.heads * ((args.value_dim + 63) / 64);
  if (wide_blocks < target.sms) {
    tile.block_v = 32;
    tile.warps = 16;
  }
  return tile;
}

cuda::RecurrentKernelSpec kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                      const RunOptions& options) {
  return kernel_spec(variant, bound, options, device_target());
}

cuda::RecurrentKernelSpec kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                      const RunOptions& options, const GpuTarget& target) {
  const auto& args = bound.args;
  cuda::RecurrentKernelSpec spec;
  spec.tile = options.tile.value_or(heuristic_tile(bound, target));
  if (auto problems = cuda::validate_tile(spec.tile, args.key_dim, args.value_dim, variant); !problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw InvalidArgument(fmt::format("{}: tile ({}) does not fit K={} V={}: {}", op_name(variant),
                                      cuda::to_string(spec.tile), args.key_dim, args.value_dim, all));
  }
  static_cast<cuda::KernelTypes&>(spec) = kernel_types(variant, bound, options);
  return spec;
}

Algorithm choose_algorithm(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options) {
  const auto& args = bound.args;
  const std::string why = variant.update == ir::Update::delta ? cuda::chunked_delta_unsupported(variant, args.key_dim, args.value_dim)
                                                              : cuda::chunked_unsupported(variant);
  if (options.algorithm == Algorithm::chunked) {
    if (!why.empty()) throw InvalidArgument(op_name(variant) + ": algorithm chunked: " + why);
    if (args.key_dim > 256)
      throw InvalidArgument(fmt::format("{}: algorithm chunked: K = {}, expected at most 256", op_name(variant), args.key_dim));
    return Algorithm::chunked;
  }
  if (options.algorithm == Algorithm::recurrent) return Algorithm::recurrent;
  if (!why.empty() || args.key_dim > 256) return Algorithm::recurrent;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const ir::Role role = variant.inputs[i].role;
    if ((role == ir::Role::query || role == ir::Role::key || role == ir::Role::value) &&
        args.tensors[i].type != DType::f16 && args.tensors[i].type != DType::bf16)
      return Algorithm::recurrent;  // fp32 inputs keep fp32 products
  }
  // Tokens per sequence: T, or the mean length of the packed sequences.
  const std::int64_t per_sequence =
      args.cu_seqlens.empty() ? args.tokens : args.cu_seqlens.back() / std::max<std::int64_t>(1, bound.dims.N);
  return per_sequence >= chunked_min_tokens ? Algorithm::chunked : Algorithm::recurrent;
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

cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, std::int64_t sequences,
                                         const GpuTarget& target) {
  const auto& args = bound.args;
  const std::int64_t N = sequences > 0 ? sequences : bound.dims.N;
  cuda::ChunkedTile tile = cuda::default_chunked_tile(args.key_dim, args.value_dim);
  // Without a device: the H100's figures.
  const GpuTarget known = target.arch.empty() ? named_target(cuda::Target::hopper) : target;
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
    if (valid(ws) && cuda::chunked_ws_unsupported(variant, types).empty() && ws_copyable(variant, bound).empty()) return ws;
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

// The suffix state pass (one block of 8 warps per SM, each owning a whole state tile) in pieces
// where the earlier segments alone leave SMs idle: the smallest power of two up to 16 that gives
// two blocks per SM, while a piece keeps at least 512 tokens. LADLE_STATE_PIECES overrides it (a
// measurement knob: bench/RESULTS.md, issue 11, eighth step).
std::int64_t chunked_state_pieces(const ir::Variant& variant, const cuda::ChunkedKernelSpec& first, const ops::BoundInputs& bound,
                                  const cuda::ChunkedSegments& segments, std::int64_t segment_tokens) {
  if (const char* forced = std::getenv("LADLE_STATE_PIECES"); forced && *forced) {
    const long long value = std::atoll(forced);
    if (value < 1) throw InvalidArgument(fmt::format("LADLE_STATE_PIECES = '{}', expected a count >= 1", forced));
    return value;
  }
  if (!first.tile.ws && !cuda::chunked_suffix_states(variant, first)) return 1;
  const int sms = driver_available() ? Device::get().properties().sm_count : 132;
  const std::int64_t value_tiles = (bound.args.value_dim + first.tile.block_v - 1) / first.tile.block_v;
  const std::int64_t blocks = segments.earlier_segments() * bound.args.heads * value_tiles;
  std::int64_t pieces = 1;
  while (pieces < 16 && blocks * pieces < 2 * sms && segment_tokens / (2 * pieces) >= 512) pieces *= 2;
  return pieces;
}

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
                                       std::int64_t key_dim, std::int64_t value_dim, int max_shared_bytes, bool ws_state_pass) {
  SegmentedSpecs out{serial, serial, serial};
  out.serial.segmented = true;
  out.serial.varlen = false;
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
  // LADLE_SUFFIX_STATES=0: the split form's state pass instead (a measurement knob, like LADLE_STATE_PIECES).
  if (const char* suffix = std::getenv("LADLE_SUFFIX_STATES"); suffix && std::string(suffix) == "0") out.first.suffix_states = false;
  // The suffix form at 32-token chunks, two blocks per SM (bench/RESULTS.md, "Evidence behind the
  // heuristics", H11); LADLE_SUFFIX_CHUNK=64 measures the other.
  if (cuda::chunked_suffix_states(variant, out.first)) {
    const char* chunk = std::getenv("LADLE_SUFFIX_CHUNK");
    out.first.tile.chunk = chunk && std::string(chunk) == "64" ? 64 : 32;
  }
  // A ws serial tile: the state pass in the ws form too (k and v by TMA, the update alone on wgmma,
  // one consumer warpgroup per block, two blocks per SM); LADLE_SUFFIX_STATES=0 or =1 measures the others.
  // A key-side gate keeps the suffix pass: its ws form is slower (the per-feature sums are
  // latency-bound; bench/RESULTS.md, "Evidence behind the heuristics", H12) unless
  // LADLE_WS_KEY_STATES=1 asks for it.
  const char* other = std::getenv("LADLE_SUFFIX_STATES");
  const char* key_states = std::getenv("LADLE_WS_KEY_STATES");
  const bool key_gate = variant.has(ir::Slot::log_decay_k) && !(key_states && std::string(key_states) == "1");
  if (ws_state_pass && !other && !key_gate && key_dim <= 128 && (serial.tile.ws || cuda::has_wgmma(serial.arch))) {
    cuda::ChunkedKernelSpec ws = out.first;
    ws.tile = cuda::ChunkedTile{key_dim <= 64 ? 64 : 128, 64, 64, 8};
    ws.tile.ws = true;
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

CompiledChunked compile_chunked(const ir::Variant& variant, const cuda::ChunkedKernelSpec& spec, const std::string& arch) {
  CompiledChunked out;
  cuda::ChunkedKernelSpec target = spec;  // the kernel is generated for the arch it is compiled for
  if (target.arch.empty()) target.arch = arch;
  out.kernel = cuda::generate_chunked(variant, target);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch, out.kernel.shared_bytes);
  return out;
}

namespace {

// The first chunk of each sequence over all of them ([N + 1]; the last entry counts every chunk), for
// chunks of C tokens.
std::vector<std::int64_t> first_chunks(const cpu::RecurrentArgs& args, std::int64_t N, std::int64_t C) {
  std::vector<std::int64_t> out{0};
  if (args.cu_seqlens.empty()) {
    out.push_back(N * ((args.tokens + C - 1) / C));
  } else {
    for (std::size_t n = 0; n + 1 < args.cu_seqlens.size(); ++n) out.push_back(out.back() + (args.cu_seqlens[n + 1] - args.cu_seqlens[n] + C - 1) / C);
  }
  return out;
}

struct CompiledDelta {
  cuda::ChunkedDeltaKernel kernel;
  CompiledProgram program;
};

CompiledDelta compile_delta(const ir::Variant& variant, const cuda::ChunkedDeltaSpec& spec, const std::string& arch) {
  CompiledDelta out;
  out.kernel = cuda::generate_chunked_delta(variant, spec);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch, out.kernel.shared_bytes);
  return out;
}

std::string delta_spec_key(const ir::Variant& variant, const cuda::ChunkedDeltaSpec& spec, const std::string& arch) {
  const char* phase = spec.phase == cuda::ChunkedDeltaPhase::prepare ? "prepare" : spec.phase == cuda::ChunkedDeltaPhase::states ? "states" : "outputs";
  std::string key = ir::hash_hex(variant) + "|" + arch + "|delta|" + phase +
                    fmt::format("|{}|{}|{}", spec.block_k, spec.value_pad, spec.vector_loads);
  for (DType t : spec.input_types) key += dtype_name(t);
  key += fmt::format("|{}{}{}{}{}{}{}", dtype_name(spec.output_type), spec.reverse, spec.varlen,
                     dtype_name(spec.cu_seqlens_type), spec.initial_state, dtype_name(spec.initial_state_type),
                     spec.final_state);
  return key;
}

}  // namespace

std::vector<cuda::ChunkedDeltaSpec> chunked_delta_specs(const ir::Variant& variant, const ops::BoundInputs& bound,
                                                        const RunOptions& options) {
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
  return {prepare, states, outputs};
}

std::vector<cuda::ChunkedKernelSpec> chunked_launch_specs(const ir::Variant& variant, const cuda::ChunkedKernelSpec& spec,
                                                          const ops::BoundInputs& bound, bool segmented, const GpuTarget& target) {
  if (segmented) {
    const SegmentedSpecs specs = segmented_chunked_specs(variant, spec, bound.args.key_dim, bound.args.value_dim,
                                                         target.max_shared_bytes, ws_states_copyable(variant, bound).empty());
    std::vector<cuda::ChunkedKernelSpec> out{specs.first};
    if (specs.fold_runs()) out.push_back(specs.fold);
    out.push_back(specs.serial);
    return out;
  }
  if (!spec.tile.split()) return {spec};
  cuda::ChunkedKernelSpec states = spec, outputs = spec;
  states.phase = cuda::ChunkedPhase::states;
  outputs.phase = cuda::ChunkedPhase::outputs;
  return {states, outputs};
}

namespace {

// The delta rule's chunked form (codegen/cuda/chunked_delta.h), three kernels on the call's stream:
// prepare over every chunk (W, U, k and gamma into work arrays), states (the serial pass over each
// sequence's chunks: h and E), outputs over every chunk.
void run_chunked_delta(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options, std::uint64_t offsets,
                       const LaunchOptions& launch) {
  const auto& args = bound.args;
  const std::int64_t N = bound.dims.N, C = cuda::chunked_delta_chunk;
  const std::vector<std::int64_t> chunk_offsets = first_chunks(args, N, C);
  const std::int64_t chunks = chunk_offsets.back();
  const std::vector<cuda::ChunkedDeltaSpec> specs = chunked_delta_specs(variant, bound, options);
  const cuda::ChunkedDeltaSpec &prepare = specs[0], &states = specs[1], &outputs = specs[2];
  const std::string arch = Device::get().properties().arch();
  const auto loaded = [&](const cuda::ChunkedDeltaSpec& spec) -> const auto& {
    return detail::loaded_kernel<cuda::ChunkedDeltaKernel>(delta_spec_key(variant, spec, arch), arch, [&](const std::string& target) {
      return compile_delta(variant, spec, target);
    });
  };
  const auto bytes = [](std::int64_t elements, std::size_t size) { return std::max<std::size_t>(16, static_cast<std::size_t>(elements) * size); };
  const std::int64_t H = args.heads;
  DeviceBuffer w = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_w_elements(prepare, chunks, H), 2), launch.stream);
  DeviceBuffer kn = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_w_elements(prepare, chunks, H), 2), launch.stream);
  DeviceBuffer u = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_u_elements(prepare, chunks, H), 2), launch.stream);
  DeviceBuffer e = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_u_elements(prepare, chunks, H), 2), launch.stream);
  DeviceBuffer hs = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_h_elements(prepare, chunks, H), 2), launch.stream);
  DeviceBuffer gamma = DeviceBuffer::on_stream(bytes(chunks * H * C, 4), launch.stream);
  DeviceBuffer device_offsets;
  SplitArguments work;
  work.sequences = N;
  work.delta_w = w.device_ptr(), work.delta_u = u.device_ptr(), work.delta_k = kn.device_ptr();
  work.delta_e = e.device_ptr(), work.delta_h = hs.device_ptr(), work.delta_gamma = gamma.device_ptr();
  if (!args.cu_seqlens.empty()) {
    device_offsets = DeviceBuffer::on_stream(chunk_offsets.size() * sizeof(std::int64_t), launch.stream);
    device_offsets.copy_from_host(chunk_offsets.data(), device_offsets.bytes(), 0, launch.stream);
    work.chunk_offsets = device_offsets.device_ptr();
  }
  const auto run = [&](const cuda::ChunkedDeltaSpec& spec, unsigned x, unsigned y, unsigned z) {
    const auto& kernel = loaded(spec);
    KernelArgs packed = pack_arguments(kernel.kernel.params, variant, args, offsets, work);
    kernel.function->launch({x, y, z}, {kernel.kernel.threads, 1, 1}, packed, static_cast<unsigned>(kernel.kernel.shared_bytes), launch.stream);
  };
  const unsigned value_blocks = static_cast<unsigned>((args.value_dim + 63) / 64);
  if (chunks > 0) run(prepare, static_cast<unsigned>(chunks), static_cast<unsigned>(H), 1);
  // Sequences with no chunks still pass their initial state to their final state.
  run(states, value_blocks, static_cast<unsigned>(N * H), 1);
  const auto output_blocks = static_cast<unsigned>((args.value_dim + loaded(outputs).kernel.block_v - 1) / loaded(outputs).kernel.block_v);
  if (chunks > 0) run(outputs, static_cast<unsigned>(chunks), static_cast<unsigned>(H), output_blocks);
  if (!args.cu_seqlens.empty()) {
    if (launch.stream) launch.stream->synchronize();  // the chunk offsets are freed on return
    else Device::get().synchronize();
  }
}

}  // namespace

CompiledRecurrent compile_recurrent(const ir::Variant& variant, const cuda::RecurrentKernelSpec& spec,
                                    const std::string& arch) {
  CompiledRecurrent out;
  out.kernel = cuda::generate_recurrent(variant, spec);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch, 0);
  return out;
}

void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs, const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  // Device tensors only (ladle::run_variant_into takes host ones too); cu_seqlens may be either: the
  // checks read it on the host.
  const char* const why = "ladle::gpu::run_variant_into takes device tensors (ladle::run_variant_into uploads host ones)";
  require_device(op, "q", q, why);
  require_device(op, "k", k, why);
  require_device(op, "v", v, why);
  for (const auto& [name, view] : inputs.tensors) require_device(op, name, view, why);
  if (options.initial_state) require_device(op, "initial_state", *options.initial_state, why);
  require_device(op, "o", outputs.o, why);
  if (outputs.final_state) require_device(op, "final_state", *outputs.final_state, why);
  RunOptions checked = options;
  std::optional<Tensor> seqlens;
  if (options.cu_seqlens && options.cu_seqlens->on_device()) {
    seqlens = Tensor::copy_of(*options.cu_seqlens, Location::host(), launch.stream);
    checked.cu_seqlens = seqlens->view();
  }
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, checked);
  ops::bind_outputs(op, options, outputs, bound);
  const auto& args = bound.args;
  if (args.initial_state && !is_contiguous(*args.initial_state))
    throw InvalidArgument(op + ": initial_state must be contiguous [N,H,K,V] on the GPU");
  if (args.final_state && !is_contiguous(*args.final_state))
    throw InvalidArgument(op + ": final_state must be contiguous [N,H,K,V] on the GPU");
  // No tokens still means work: each sequence's final state is its initial state.
  if (bound.dims.N * args.heads * args.value_dim == 0) return;

  const Algorithm algorithm = choose_algorithm(variant, bound, options);
  DeviceBuffer offsets;
  if (!args.cu_seqlens.empty()) {
    offsets = DeviceBuffer(args.cu_seqlens.size() * sizeof(std::int64_t));
    offsets.copy_from_host(args.cu_seqlens.data(), offsets.bytes(), 0, launch.stream);
  }
  const unsigned grid_y = static_cast<unsigned>(bound.dims.N * args.heads);
  if (algorithm == Algorithm::chunked && variant.update == ir::Update::delta) {
    run_chunked_delta(variant, bound, options, offsets.device_ptr(), launch);
  } else if (algorithm == Algorithm::chunked) {
    // No tile named: the autotuner's choice (LADLE_AUTOTUNE; heuristic means heuristic_chunked_tile).
    RunOptions tiled = options;
    // Few long sequences: the serial form over segments of them (cuda::ChunkedSegments).
    const std::int64_t segment_tokens = chunked_segment_tokens(bound, options);
    cuda::ChunkedSegments segments;
    if (segment_tokens > 0)
      segments = cuda::chunked_segments(bound.dims.N, args.tokens, args.cu_seqlens, segment_tokens, args.reverse);
    if (!tiled.chunked_tile) {
      // The 8 tiles the cost model ranks best: it ranks the measured tiles in their measured order
      // at the benchmark shapes, so a first call times those instead of all 25 (bench/RESULTS.md,
      // "Evidence behind the heuristics", H13). ladle-tune still times every valid tile.
      TuneOptions tune_options;
      tune_options.max_candidates = 8;
      tiled.chunked_tile = tuned_chunked_tile(variant, bound, options,
                                              heuristic_chunked_tile(variant, bound, segments.segments()), tune_options);
    }
    cuda::ChunkedKernelSpec spec = chunked_kernel_spec(variant, bound, tiled);
    if (segment_tokens > 0 && spec.tile.split())
      throw InvalidArgument(fmt::format("{}: chunked_segment_tokens = {} with a split chunked_tile ({}): the split form runs whole "
                                        "sequences (name a serial tile, or chunked_segment_tokens = 0)",
                                        op, segment_tokens, cuda::to_string(spec.tile)));
    const std::int64_t N = bound.dims.N;
    // Launches spec's kernel over `sequences` (the call's N, or the rows of a segments table).
    const auto run = [&](const SplitArguments& split, std::int64_t chunks, std::int64_t sequences) {
      const auto& loaded = loaded_kernel(variant, spec, compile_chunked);
      KernelArgs packed = pack_arguments(loaded.kernel.params, variant, args, offsets.device_ptr(), split);
      const cuda::ChunkedGrid grid = cuda::chunked_grid(loaded.kernel, sequences, args.heads, args.key_dim, args.value_dim, chunks);
      if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
      loaded.function->launch({grid.x, grid.y, grid.z}, {loaded.kernel.threads, 1, 1}, packed,
                              static_cast<unsigned>(loaded.kernel.shared_bytes), launch.stream);
    };
    if (segment_tokens > 0) {
      // 1. Every segment but the last of its sequence: its own final state and decay, from zero
      //    (the split form's state pass, 64 x 64 state tiles of 4 warps, 64-token chunks).
      // 2. The fold: the state entering every segment but the first of its sequence, in place.
      // 3. Every segment: the serial form from h0 or the fold's state.
      const int max_shared = Device::get().properties().max_shared_per_block_optin;
      const SegmentedSpecs segmented_specs =
          segmented_chunked_specs(variant, spec, args.key_dim, args.value_dim, max_shared, ws_states_copyable(variant, bound).empty());
      const auto& [first, fold, serial] = segmented_specs;
      const std::int64_t pieces = chunked_state_pieces(variant, first, bound, segments, segment_tokens);
      if (pieces > 1) segments = cuda::chunked_segments(bound.dims.N, args.tokens, args.cu_seqlens, segment_tokens, args.reverse, pieces);
      const std::int64_t S = segments.segments(), earlier = segments.earlier_segments();
      const std::int64_t width = cuda::chunked_segment_decay_width(variant, args.key_dim, args.value_dim);
      const auto upload_rows = [&](const std::vector<long long>& rows) {
        DeviceBuffer buffer = DeviceBuffer::on_stream(std::max<std::size_t>(8, rows.size() * sizeof(long long)), launch.stream);
        if (!rows.empty()) buffer.copy_from_host(rows.data(), rows.size() * sizeof(long long), 0, launch.stream);
        return buffer;
      };
      // The tables from the cache of earlier calls' (segment_rows), else copied for this call.
      DeviceBuffer all_copy, earlier_copy;
      std::uint64_t all_rows = segment_rows(segments.all), earlier_rows = segment_rows(segments.earlier);
      if (!all_rows) all_copy = upload_rows(segments.all), all_rows = all_copy.device_ptr();
      if (!earlier_rows) earlier_copy = upload_rows(segments.earlier), earlier_rows = earlier_copy.device_ptr();
      DeviceBuffer own_states = DeviceBuffer::on_stream(
          std::max<std::size_t>(4, static_cast<std::size_t>(earlier * args.heads * args.key_dim * args.value_dim) * 4), launch.stream);
      DeviceBuffer own_decay =
          DeviceBuffer::on_stream(std::max<std::size_t>(4, static_cast<std::size_t>(earlier * args.heads * width) * 4), launch.stream);
      SplitArguments split;
      split.segment_states = own_states.device_ptr();
      split.segment_decay = own_decay.device_ptr();
      if (earlier > 0) {
        spec = first;
        split.segments = earlier_rows;
        run(split, 0, earlier);
        // 2. each sequence's earlier segments folded in order: the state entering each segment (the ws
        //    serial kernel folds them itself as it starts)
        if (segmented_specs.fold_runs()) {
          spec = fold;
          split.segments = all_rows;
          run(split, 0, S);
        }
      }
      spec = serial;
      split.segments = all_rows;
      run(split, 0, S);
    } else if (!spec.tile.split()) {
      run({}, 0, N);
    } else {
      // The split form: the state pass writes the state entering every chunk, then every
      // chunk's output is formed in parallel. The per-chunk states live on the call's stream.
      const std::vector<std::int64_t> chunk_offsets = first_chunks(args, N, spec.tile.chunk);
      const std::int64_t chunks = chunk_offsets.back();
      const std::size_t state_bytes = static_cast<std::size_t>(chunks * args.heads * args.key_dim * args.value_dim) *
                                      (spec.tile.state_f32 ? 4 : 2);
      DeviceBuffer states = DeviceBuffer::on_stream(state_bytes, launch.stream);
      DeviceBuffer device_offsets;
      SplitArguments split{states.device_ptr(), 0, N};
      if (!args.cu_seqlens.empty()) {
        device_offsets = DeviceBuffer::on_stream(chunk_offsets.size() * sizeof(std::int64_t), launch.stream);
        device_offsets.copy_from_host(chunk_offsets.data(), device_offsets.bytes(), 0, launch.stream);
        split.chunk_offsets = device_offsets.device_ptr();
      }
      spec.phase = cuda::ChunkedPhase::states;
      run(split, chunks, N);
      if (chunks > 0) {
        spec.phase = cuda::ChunkedPhase::outputs;
        run(split, chunks, N);
      }
    }
  } else {
    // No tile named: the autotuner's choice (LADLE_AUTOTUNE; heuristic means heuristic_tile).
    RunOptions tiled = options;
    if (!tiled.tile) tiled.tile = tuned_tile(variant, bound, options, heuristic_tile(bound));
    const cuda::RecurrentKernelSpec spec = kernel_spec(variant, bound, tiled);
    const auto& loaded = loaded_kernel(variant, spec, compile_recurrent);
    KernelArgs packed = pack_arguments(loaded.kernel.params, variant, args, offsets.device_ptr());
    const unsigned grid_x = static_cast<unsigned>((args.value_dim + loaded.kernel.block_v - 1) / loaded.kernel.block_v);
    loaded.function->launch({grid_x, grid_y, 1}, {loaded.kernel.threads, 1, 1}, packed, 0, launch.stream);
  }
  if (!args.cu_seqlens.empty()) {
    // The offsets buffer is freed on return: wait until the kernel has read it.
    if (launch.stream) launch.stream->synchronize();
    else Device::get().synchronize();
  }
}

}  // namespace ladle::gpu
