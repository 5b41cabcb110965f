#include "gpu_recurrent.h"

#include <ladle/codegen/cuda/chunked_delta.h>

#include "detail/call_signature.h"
#include "detail/interim.h"
#include "detail/loaded_kernel.h"
#include "detail/pack_input.h"
#include "chunked_plan.h"
#include "generated_kernels.h"
#include "gpu_attention.h"
#include "tune_recurrent.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/cache.h>
#include <ladle/runtime/log.h>
#include <ladle/runtime/tuned_cache.h>

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
    key += std::string("|") + cuda::to_string(spec.phase) + (spec.segmented ? "|segmented" : "") + (spec.suffix_states ? "|suffix" : "") +
           (spec.chunk_states_out ? "|chunk_states" : "");
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
  return {device.arch(), device.sm_count, device.max_shared_per_block_optin, device.max_shared_per_sm};
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
  const ChunkedDeltaPlan plan = plan_chunked_delta(variant, bound, options);
  const cuda::ChunkedDeltaSpec& prepare = plan.launches.front().spec;  // the work arrays' sizes
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
  DeviceBuffer gamma = DeviceBuffer::on_stream(bytes(cuda::chunked_delta_gamma_elements(prepare, chunks, H), 4), launch.stream);
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
  for (const ChunkedDeltaLaunch& each : plan.launches) {
    if (each.over == ChunkedDeltaLaunch::Over::sequences) {
      run(each.spec, value_blocks, static_cast<unsigned>(N * H), 1);  // a sequence with no chunks passes h0 to its final state
    } else if (chunks > 0) {
      const int block_v = loaded(each.spec).kernel.block_v;  // the outputs' value blocks; prepare takes the whole width
      const auto blocks = each.spec.phase == cuda::ChunkedDeltaPhase::outputs ? static_cast<unsigned>((args.value_dim + block_v - 1) / block_v) : 1u;
      run(each.spec, static_cast<unsigned>(chunks), static_cast<unsigned>(H), blocks);
    }
  }
  if (!args.cu_seqlens.empty()) {
    if (launch.stream) launch.stream->synchronize();  // the chunk offsets are freed on return
    else Device::get().synchronize();
  }
}

// A chunked plan's kernels on the call's stream, in order (ops/chunked_plan.h): the work arrays its
// form needs live on the stream; a launch over no rows (no earlier segments, no chunks) is left out.
// entry_states: the segmented form's states table ([earlier rows][H][K][V] f32) or the split form's
// per-chunk states where the caller keeps them (run_entry_states, run_chunk_states), else one of this call's.
// known: each launch's loaded kernel by index where an earlier call of the same signature loaded it
// (a repeated call skips the lookup by key); loaded: where given, receives them (nullptr for a launch
// left out).
using LoadedChunked = detail::LoadedKernel<cuda::ChunkedKernel>;
void run_chunked_plan(const ChunkedPlan& plan, const ir::Variant& variant, const ops::BoundInputs& bound, std::uint64_t offsets,
                      const LaunchOptions& launch, std::uint64_t entry_states = 0,
                      const std::vector<const LoadedChunked*>* known = nullptr, std::vector<const LoadedChunked*>* loaded = nullptr,
                      std::uint64_t entry_decay = 0,
                      const std::function<void(std::uint64_t states, std::uint64_t decay)>* after_states = nullptr) {
  const auto& args = bound.args;
  const std::int64_t N = bound.dims.N;
  const Stream* stream = launch.stream;
  SplitArguments split;
  std::int64_t chunks = 0;
  std::uint64_t earlier_rows = 0, all_rows = 0;  // the segments tables on the device
  std::int64_t decay_width = 0;                   // DL of segment_decay
  DeviceBuffer states, device_offsets, all_copy, earlier_copy, own_states, own_decay;
  if (plan.form == ChunkedPlan::Form::split) {
    // The state pass writes the state entering every chunk; then every chunk's output in parallel.
    const std::vector<std::int64_t> chunk_offsets = first_chunks(args, N, plan.spec.tile.chunk);
    chunks = chunk_offsets.back();
    if (!entry_states)
      states = DeviceBuffer::on_stream(static_cast<std::size_t>(chunks * args.heads * args.key_dim * args.value_dim) *
                                           (plan.spec.tile.state_f32 ? 4 : 2),
                                       stream);
    split.chunk_states = entry_states ? entry_states : states.device_ptr();
    split.sequences = N;
    if (!args.cu_seqlens.empty()) {
      device_offsets = DeviceBuffer::on_stream(chunk_offsets.size() * sizeof(std::int64_t), stream);
      device_offsets.copy_from_host(chunk_offsets.data(), device_offsets.bytes(), 0, stream);
      split.chunk_offsets = device_offsets.device_ptr();
    }
  } else if (plan.spec.chunk_states_out) {
    // The serial ws kernel writing the state entering each of its chunks into the caller's table
    // (run_variant_with_chunk_states), packed sequences' rows from their first chunks.
    split.chunk_states = entry_states;
    split.sequences = N;
    if (!args.cu_seqlens.empty()) {
      const std::vector<std::int64_t> chunk_offsets = first_chunks(args, N, plan.spec.tile.chunk);
      device_offsets = DeviceBuffer::on_stream(chunk_offsets.size() * sizeof(std::int64_t), stream);
      device_offsets.copy_from_host(chunk_offsets.data(), device_offsets.bytes(), 0, stream);
      split.chunk_offsets = device_offsets.device_ptr();
    }
  } else if (plan.form == ChunkedPlan::Form::segmented) {
    // The tables from the cache of earlier calls' (segment_rows), else copied for this call; each
    // earlier segment's own final state and total decay.
    const auto upload_rows = [&](const std::vector<long long>& rows) {
      DeviceBuffer buffer = DeviceBuffer::on_stream(std::max<std::size_t>(8, rows.size() * sizeof(long long)), stream);
      if (!rows.empty()) buffer.copy_from_host(rows.data(), rows.size() * sizeof(long long), 0, stream);
      return buffer;
    };
    all_rows = segment_rows(plan.segments.all);
    if (!all_rows) all_copy = upload_rows(plan.segments.all), all_rows = all_copy.device_ptr();
    earlier_rows = segment_rows(plan.segments.earlier);
    if (!earlier_rows) earlier_copy = upload_rows(plan.segments.earlier), earlier_rows = earlier_copy.device_ptr();
    const std::int64_t earlier = plan.segments.earlier_segments();
    const std::int64_t width = decay_width = cuda::chunked_segment_decay_width(variant, args.key_dim, args.value_dim);
    if (!entry_states)
      own_states = DeviceBuffer::on_stream(
          std::max<std::size_t>(4, static_cast<std::size_t>(earlier * args.heads * args.key_dim * args.value_dim) * 4), stream);
    if (!entry_decay)
      own_decay = DeviceBuffer::on_stream(std::max<std::size_t>(4, static_cast<std::size_t>(earlier * args.heads * width) * 4), stream);
    split.segment_states = entry_states ? entry_states : own_states.device_ptr();
    split.segment_decay = entry_decay ? entry_decay : own_decay.device_ptr();
  }
  if (loaded) loaded->assign(plan.launches.size(), nullptr);
  for (std::size_t index = 0; index < plan.launches.size(); ++index) {
    const ChunkedLaunch& each = plan.launches[index];
    SplitArguments arguments = split;
    std::int64_t rows = N;  // the grid's sequences
    switch (each.over) {
      case ChunkedLaunch::Over::sequences:
      case ChunkedLaunch::Over::chunks: break;
      case ChunkedLaunch::Over::earlier_segments: rows = plan.segments.earlier_segments(), arguments.segments = earlier_rows; break;
      case ChunkedLaunch::Over::all_segments: rows = plan.segments.segments(), arguments.segments = all_rows; break;
    }
    // The state pass and the fold only where some sequence has earlier segments; the output pass
    // only where there are chunks (the state pass still passes h0 to the final state).
    if (plan.form == ChunkedPlan::Form::segmented && each.spec.phase != cuda::ChunkedPhase::serial && plan.segments.earlier_segments() == 0)
      continue;
    if (each.spec.phase == cuda::ChunkedPhase::outputs && chunks == 0) continue;
    const LoadedChunked* const was = known && index < known->size() ? (*known)[index] : nullptr;
    const LoadedChunked& kernel = was ? *was : loaded_kernel(variant, each.spec, compile_chunked);
    if (loaded) (*loaded)[index] = &kernel;
    // A grid walks (row, head) pairs on its y or z axis, at most 65535: a long sequence's segments
    // (its 64-step blocks in the backward's entry states) go in launches of fewer rows, each with the
    // table (and the state pass's outputs, which it indexes by the launch's own rows) advanced.
    const bool over_table = each.over == ChunkedLaunch::Over::earlier_segments || each.over == ChunkedLaunch::Over::all_segments;
    const std::int64_t most = over_table ? std::max<std::int64_t>(1, 65535 / std::max<std::int64_t>(1, args.heads)) : rows;
    for (std::int64_t first = 0; first < std::max<std::int64_t>(rows, 1); first += most) {
      const std::int64_t count = std::min(most, rows - first);
      SplitArguments part = arguments;
      if (first > 0) {
        part.segments += static_cast<std::uint64_t>(first) * 8 * sizeof(long long);
        if (each.spec.phase == cuda::ChunkedPhase::states) {
          part.segment_states += static_cast<std::uint64_t>(first * args.heads * args.key_dim * args.value_dim) * 4;
          part.segment_decay += static_cast<std::uint64_t>(first * args.heads * decay_width) * 4;
        }
      }
      KernelArgs packed = pack_arguments(kernel.kernel.params, variant, args, offsets, part);
      const cuda::ChunkedGrid grid = cuda::chunked_grid(kernel.kernel, over_table ? count : rows, args.heads, args.key_dim, args.value_dim, chunks);
      if (grid.x == 0 || grid.y == 0 || grid.z == 0) break;
      kernel.function->launch({grid.x, grid.y, grid.z}, {kernel.kernel.threads, 1, 1}, packed,
                              static_cast<unsigned>(kernel.kernel.shared_bytes), stream);
    }
    if (after_states && plan.form == ChunkedPlan::Form::segmented && each.spec.phase == cuda::ChunkedPhase::states)
      (*after_states)(split.segment_states, split.segment_decay);
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

namespace {

// The device-tensor entries' common checks: q, k, v, the tensor inputs and initial_state on the
// device (cu_seqlens may be either: the checks read it on the host, from `seqlens`, a host copy of a
// device one). Returns the options with cu_seqlens on the host.
RunOptions device_call(const std::string& op, const char* why, const TensorView& q, const TensorView& k, const TensorView& v,
                       const VariantInputs& inputs, const RunOptions& options, const LaunchOptions& launch,
                       std::optional<Tensor>& seqlens) {
  require_device(op, "q", q, why);
  require_device(op, "k", k, why);
  require_device(op, "v", v, why);
  for (const auto& [name, view] : inputs.tensors) require_device(op, name, view, why);
  if (options.initial_state) require_device(op, "initial_state", *options.initial_state, why);
  RunOptions checked = options;
  if (options.cu_seqlens && options.cu_seqlens->on_device()) {
    seqlens = Tensor::copy_of(*options.cu_seqlens, Location::host(), launch.stream);
    checked.cu_seqlens = seqlens->view();
  }
  return checked;
}

}  // namespace

namespace {

// What run_variant_into chose for a call: its algorithm, and the chunked family's plan and kernels or
// the fused recurrent kernel (the delta rule's chunked form plans on its own).
struct ChosenRun {
  Algorithm algorithm = Algorithm::automatic;
  std::optional<ChunkedPlan> chunked;
  std::vector<const LoadedChunked*> chunked_kernels;  // the plan's, by launch (loaded kernels live for the process)
  const detail::LoadedKernel<cuda::RecurrentKernel>* recurrent_kernel = nullptr;  // the fused recurrent kernel's
};

// Everything the checks and choices of run_variant_into read but the data's addresses: the variant,
// the views, the options, the tuning policy, the plan's knobs and the device. None where cu_seqlens is
// given: its values shape the plan.
std::optional<ops::detail::CallSignature> run_signature(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                                        const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                                                        const RecurrentOutputs& outputs, const ChunkedPlanKnobs& knobs, Policy policy) {
  if (options.cu_seqlens || policy == Policy::force) return std::nullopt;
  ops::detail::CallSignature s;
  s.add(ir::hash(variant)).add(q).add(k).add(v).add(outputs.o).add(outputs.final_state).add(options.initial_state);
  s.add(inputs.tensors.size());
  for (const auto& [name, view] : inputs.tensors) s.add(name).add(view);
  s.add(inputs.scalars.size());
  for (const auto& [name, value] : inputs.scalars) s.add(name).add_float(value);
  s.add(static_cast<std::uint64_t>(options.reverse) | static_cast<std::uint64_t>(options.return_state) << 1 |
        static_cast<std::uint64_t>(options.algorithm) << 8 | static_cast<std::uint64_t>(policy) << 16);
  s.add(options.tile.has_value());
  if (options.tile) s.add(options.tile->block_k).add(options.tile->block_v).add(options.tile->warps);
  s.add(options.chunked_tile.has_value());
  if (const auto& t = options.chunked_tile)
    s.add(t->block_k).add(t->chunk).add(t->block_v).add(t->warps).add(t->state_block_k).add(t->state_block_v).add(t->state_warps)
        .add(static_cast<std::uint64_t>(t->state_f32) | static_cast<std::uint64_t>(t->wgmma) << 1 | static_cast<std::uint64_t>(t->ws) << 2);
  s.add(options.chunked_segment_tokens.has_value()).add(options.chunked_segment_tokens.value_or(0));
  s.add(knobs.state_pieces).add(knobs.suffix_states.has_value()).add(knobs.suffix_states.value_or(false));
  s.add(knobs.suffix_chunk).add(knobs.ws_key_states);
  s.add(Device::current());
  return s;
}

ops::detail::CallMemo<std::shared_ptr<const ChosenRun>>& chosen_runs() {
  static auto* const memo = new ops::detail::CallMemo<std::shared_ptr<const ChosenRun>>();
  return *memo;
}

}  // namespace

namespace {

// The programs of a chunked plan's launches, generated as compile_chunked generates them, onto `out`.
void add_chunked_programs(const ir::Variant& variant, const std::vector<ChunkedLaunch>& launches, const std::string& arch,
                          std::vector<GeneratedKernel>& out) {
  for (const ChunkedLaunch& each : launches) {
    cuda::ChunkedKernelSpec target = each.spec;
    if (target.arch.empty()) target.arch = arch;
    cuda::ChunkedKernel kernel = cuda::generate_chunked(variant, target);
    out.push_back({kernel.name, std::move(kernel.source), std::string(each.spec.segmented ? "segmented " : "chunked ") + cuda::to_string(each.spec.phase), cuda::to_string(each.spec.tile),
                   kernel.threads, kernel.shared_bytes});
  }
}

bool interim_for_chunked(const ir::Variant& variant, const ChunkedPlan& plan, const RunOptions& options, const LaunchOptions& launch) {
  const std::string arch = Device::get().properties().arch();
  std::string job = "chunked";
  for (const ChunkedLaunch& each : plan.launches) job.append(1, '\n').append(spec_key(variant, each.spec, arch));
  return detail::interim(options, job, arch, [&] {
    std::vector<GeneratedKernel> out;
    add_chunked_programs(variant, plan.launches, arch, out);
    return out;
  }, launch);
}

bool interim_for_delta(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options, const LaunchOptions& launch) {
  if (options.algorithm != Algorithm::automatic || !background_compile_enabled()) return false;  // before planning
  const std::string arch = Device::get().properties().arch();
  const ChunkedDeltaPlan plan = plan_chunked_delta(variant, bound, options);
  std::string job = "delta";
  for (const ChunkedDeltaLaunch& each : plan.launches) job.append(1, '\n').append(delta_spec_key(variant, each.spec, arch));
  return detail::interim(options, job, arch, [&] {
    std::vector<GeneratedKernel> out;
    for (const ChunkedDeltaLaunch& each : plan.launches) {
      cuda::ChunkedDeltaKernel kernel = cuda::generate_chunked_delta(variant, each.spec);  // as compile_delta
      out.push_back({kernel.name, std::move(kernel.source), "delta", "", kernel.threads, kernel.shared_bytes});
    }
    return out;
  }, launch);
}

// The chunked tiles a first call tunes among (with_chunked_tile): the cost model's best 8.
constexpr std::size_t chunked_tune_candidates = 8;

// Under LADLE_AUTOTUNE=cached a shape without a tuned tile tunes on its first call: it compiles every
// candidate's kernels, then times them. Here the compiles run behind the call instead (one job for all
// the candidates' programs, the heuristic's among them) while the fused recurrent kernel runs it; the
// first call after they end times the candidates (no compile left) and stores the choice as before.
bool interim_for_tuning(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                        const GpuTarget& target, const ChunkedPlanKnobs& knobs, const LaunchOptions& launch) {
  if (options.algorithm != Algorithm::automatic || options.chunked_tile || policy_from_env() != Policy::cached ||
      !background_compile_enabled() || !DiskCache::global().enabled())
    return false;
  const cuda::ChunkedTile heuristic = heuristic_chunked_tile(variant, bound, chunked_tile_sequences(bound, options, target), target);
  const TuneJob tuning = chunked_tune_job(variant, bound, options, heuristic);
  const std::string job = "tune\n" + tuning.key.hash();
  const BackgroundState state = BackgroundCompiles::global().state(job);
  if (state == BackgroundState::done) return false;
  if (state == BackgroundState::none && TunedCache::global().lookup(tuning.key)) {  // tuned before: its tile's kernels
    BackgroundCompiles::global().mark_done(job);
    return false;
  }
  const std::string arch = Device::get().properties().arch();
  return detail::interim(options, job, arch, [&] {
    std::vector<GeneratedKernel> out;
    for (const Config& config : tuning.tuner.plan(chunked_tune_candidates).configs) {
      RunOptions candidate = options;
      candidate.algorithm = Algorithm::chunked;
      candidate.chunked_tile = to_chunked_tile(config);
      std::vector<GeneratedKernel> programs;
      try {
        add_chunked_programs(variant, plan_chunked(variant, bound, candidate, target, knobs).launches, arch, programs);
      } catch (const std::exception&) {
        continue;  // the tuner records such a candidate as invalid when it meets it
      }
      std::move(programs.begin(), programs.end(), std::back_inserter(out));
    }
    return out;
  }, launch);
}

}  // namespace

namespace {

// A forward on device tensors, checked and bound: every view on the device (`why` says so where one is
// not), the outputs against the inputs, contiguous states. variant_validated: as bind_inputs takes it.
ops::BoundInputs bind_device_run(const std::string& op, const char* why, const ir::Variant& variant, const TensorView& q,
                                 const TensorView& k, const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                                 const RecurrentOutputs& outputs, const LaunchOptions& launch, bool variant_validated = false) {
  std::optional<Tensor> seqlens;
  const RunOptions checked = device_call(op, why, q, k, v, inputs, options, launch, seqlens);
  require_device(op, "o", outputs.o, why);
  if (outputs.final_state) require_device(op, "final_state", *outputs.final_state, why);
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, checked, variant_validated);
  ops::bind_outputs(op, options, outputs, bound);
  if (bound.args.initial_state && !is_contiguous(*bound.args.initial_state))
    throw InvalidArgument(op + ": initial_state must be contiguous [N,H,K,V] on the GPU");
  if (bound.args.final_state && !is_contiguous(*bound.args.final_state))
    throw InvalidArgument(op + ": final_state must be contiguous [N,H,K,V] on the GPU");
  return bound;
}

// The options with their chunked tile: the caller's, else the autotuner's choice (LADLE_AUTOTUNE;
// heuristic means heuristic_chunked_tile) among the 8 tiles the cost model ranks best: it ranks the
// measured tiles in their measured order at the benchmark shapes, so a first call times those
// instead of all 25 (bench/RESULTS.md, "Evidence behind the heuristics", H13). ladle-tune still
// times every valid tile.
RunOptions with_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                             const GpuTarget& target) {
  RunOptions tiled = options;
  if (tiled.chunked_tile) return tiled;
  TuneOptions tune_options;
  tune_options.max_candidates = chunked_tune_candidates;
  const cuda::ChunkedTile heuristic = heuristic_chunked_tile(variant, bound, chunked_tile_sequences(bound, options, target), target);
  tiled.chunked_tile = tuned_chunked_tile(variant, bound, options, heuristic, tune_options);
  return tiled;
}

}  // namespace

void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs, const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  // A call seen before (its signature: everything below reads but the addresses) skips the variant's
  // validation and the choice of algorithm, tile and plan; its arguments are still checked.
  const ChunkedPlanKnobs knobs = chunked_plan_knobs();
  const std::optional<ops::detail::CallSignature> signature =
      run_signature(variant, q, k, v, inputs, options, outputs, knobs, policy_from_env());
  const std::shared_ptr<const ChosenRun> known = signature ? chosen_runs().find(*signature).value_or(nullptr) : nullptr;
  // Device tensors only (ladle::run_variant_into takes host ones too).
  ops::BoundInputs bound = bind_device_run(op, "ladle::gpu::run_variant_into takes device tensors (ladle::run_variant_into uploads host ones)",
                                           variant, q, k, v, inputs, options, outputs, launch, known != nullptr);
  const auto& args = bound.args;
  // No tokens still means work: each sequence's final state is its initial state.
  if (bound.dims.N * args.heads * args.value_dim == 0) return;

  ChosenRun chosen;  // this call's choices, remembered below where no earlier call's are known
  const Algorithm algorithm = known ? known->algorithm : choose_algorithm(variant, bound, options);
  chosen.algorithm = algorithm;
  DeviceBuffer offsets;
  if (!args.cu_seqlens.empty()) {
    offsets = DeviceBuffer(args.cu_seqlens.size() * sizeof(std::int64_t));
    offsets.copy_from_host(args.cu_seqlens.data(), offsets.bytes(), 0, launch.stream);
  }
  const unsigned grid_y = static_cast<unsigned>(bound.dims.N * args.heads);
  const auto run_recurrent = [&](const detail::LoadedKernel<cuda::RecurrentKernel>& loaded) {
    KernelArgs packed = pack_arguments(loaded.kernel.params, variant, args, offsets.device_ptr());
    const unsigned grid_x = static_cast<unsigned>((args.value_dim + loaded.kernel.block_v - 1) / loaded.kernel.block_v);
    loaded.function->launch({grid_x, grid_y, 1}, {loaded.kernel.threads, 1, 1}, packed, 0, launch.stream);
  };
  // A chunked call whose kernels are not compiled yet: the fused recurrent kernel (the heuristic's
  // tile, no tuning) runs it while they compile behind it; nothing is remembered, so that a later
  // call of this signature looks again (interim_for_chunked).
  const auto run_interim = [&] {
    RunOptions tiled = options;
    if (!tiled.tile) tiled.tile = heuristic_tile(bound);
    run_recurrent(loaded_kernel(variant, kernel_spec(variant, bound, tiled), compile_recurrent));
  };
  bool interim_ran = false;
  if (algorithm == Algorithm::chunked && variant.update == ir::Update::delta) {
    if (!known && interim_for_delta(variant, bound, options, launch)) {
      interim_ran = true;
      run_interim();
    } else {
      run_chunked_delta(variant, bound, options, offsets.device_ptr(), launch);
    }
  } else if (algorithm == Algorithm::chunked && known) {
    run_chunked_plan(*known->chunked, variant, bound, offsets.device_ptr(), launch, 0, &known->chunked_kernels);
  } else if (algorithm == Algorithm::chunked) {
    const GpuTarget target = device_target();
    // The tuner's candidates compiling behind the call (interim_for_tuning), else the plan's kernels.
    interim_ran = interim_for_tuning(variant, bound, options, target, knobs, launch);
    if (!interim_ran) {
      chosen.chunked = plan_chunked(variant, bound, with_chunked_tile(variant, bound, options, target), target, knobs);
      interim_ran = interim_for_chunked(variant, *chosen.chunked, options, launch);
    }
    if (interim_ran) {
      run_interim();
    } else {
      run_chunked_plan(*chosen.chunked, variant, bound, offsets.device_ptr(), launch, 0, nullptr, &chosen.chunked_kernels);
    }
  } else {
    // No tile named: the autotuner's choice (LADLE_AUTOTUNE; heuristic means heuristic_tile).
    if (known) {
      chosen.recurrent_kernel = known->recurrent_kernel;
    } else {
      RunOptions tiled = options;
      if (!tiled.tile) tiled.tile = tuned_tile(variant, bound, options, heuristic_tile(bound));
      chosen.recurrent_kernel = &loaded_kernel(variant, kernel_spec(variant, bound, tiled), compile_recurrent);
    }
    run_recurrent(*chosen.recurrent_kernel);
  }
  if (signature && !known && !interim_ran) chosen_runs().remember(*signature, std::make_shared<const ChosenRun>(std::move(chosen)));
  if (!args.cu_seqlens.empty()) {
    // The offsets buffer is freed on return: wait until the kernel has read it.
    if (launch.stream) launch.stream->synchronize();
    else Device::get().synchronize();
  }
}

std::optional<ChunkedPlan> chunk_states_plan(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                             const GpuTarget& target) {
  if (variant.update == ir::Update::delta || variant.has(ir::Slot::log_decay_v) || variant.read_before_update) return std::nullopt;
  ChunkedPlan plan = plan_chunked(variant, bound, options, target, chunked_plan_knobs());
  if (plan.form != ChunkedPlan::Form::serial || !plan.spec.tile.ws || plan.spec.tile.chunk != 64 || plan.launches.size() != 1) return std::nullopt;
  plan.spec.chunk_states_out = plan.launches[0].spec.chunk_states_out = true;
  return plan;
}

bool run_variant_with_chunk_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                                   std::uint64_t chunk_states, const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  if (!chunk_states) throw InvalidArgument(op + ": chunk_states: a device table [chunks][H][K][V] f32 expected, got null");
  const ops::BoundInputs bound =
      bind_device_run(op, "ladle::gpu::run_variant_with_chunk_states takes device tensors", variant, q, k, v, inputs, options, outputs, launch);
  const auto& args = bound.args;
  if (variant.update == ir::Update::delta || variant.has(ir::Slot::log_decay_v) || variant.read_before_update) return false;
  if (choose_algorithm(variant, bound, options) != Algorithm::chunked) return false;
  const GpuTarget target = device_target();
  const std::optional<ChunkedPlan> chosen = chunk_states_plan(variant, bound, with_chunked_tile(variant, bound, options, target), target);
  if (!chosen) return false;
  if (bound.dims.N * args.heads * args.value_dim == 0) return true;
  const ChunkedPlan& plan = *chosen;
  DeviceBuffer offsets;
  if (!args.cu_seqlens.empty()) {
    offsets = DeviceBuffer(args.cu_seqlens.size() * sizeof(std::int64_t));
    offsets.copy_from_host(args.cu_seqlens.data(), offsets.bytes(), 0, launch.stream);
  }
  run_chunked_plan(plan, variant, bound, offsets.device_ptr(), launch, chunk_states);
  if (!args.cu_seqlens.empty()) {  // the offsets buffers are freed on return
    if (launch.stream) launch.stream->synchronize();
    else Device::get().synchronize();
  }
  return true;
}

bool run_variant_with_summaries(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                                const SegmentSummariesHook& hook, const LaunchOptions& launch) {
  const std::string op = op_name(variant);
  const ops::BoundInputs bound =
      bind_device_run(op, "ladle::gpu::run_variant_with_summaries takes device tensors", variant, q, k, v, inputs, options, outputs, launch);
  const auto& args = bound.args;
  if (!args.initial_state || args.initial_state->type != DType::f32)
    throw InvalidArgument(op + ": the entry states' hook fills options.initial_state: a contiguous f32 [N,H,K,V] expected");
  if (bound.dims.N * args.heads * args.key_dim * args.value_dim == 0) return false;
  if (variant.update == ir::Update::delta || choose_algorithm(variant, bound, options) != Algorithm::chunked) return false;
  const GpuTarget target = device_target();
  ChunkedPlan plan = plan_chunked(variant, bound, with_chunked_tile(variant, bound, options, target), target, chunked_plan_knobs());
  if (plan.form != ChunkedPlan::Form::segmented || plan.launches.empty() || plan.launches.front().spec.phase != cuda::ChunkedPhase::states)
    return false;
  // The state pass over every segment: each sequence's last one too, as rows after the plan's own
  // (which keep their places: the fold and the serial kernels name them by position).
  std::vector<std::vector<long long>> chains(static_cast<std::size_t>(bound.dims.N));
  const std::int64_t own = plan.segments.earlier_segments();
  for (std::int64_t r = 0; r < own; ++r) chains[static_cast<std::size_t>(plan.segments.earlier[r * 8 + 3])].push_back(r);
  // The last segment in the plan's pieces, as its earlier ones (one long row would be the pass's slowest block).
  const std::int64_t piece_tokens = (plan.segment_tokens + plan.state_pieces - 1) / std::max<std::int64_t>(1, plan.state_pieces);
  const std::vector<long long> all = plan.segments.all;
  for (std::size_t r = 0; r + 8 <= all.size(); r += 8) {
    const long long* row = &all[r];
    if (row[6] == 0) continue;
    const long long lo = row[1], hi = row[2];
    for (long long at = 0; at < hi - lo; at += std::max<std::int64_t>(1, piece_tokens)) {  // none for an empty sequence
      const long long plo = args.reverse ? std::max(lo, hi - at - piece_tokens) : lo + at;
      const long long phi = args.reverse ? hi - at : std::min(hi, lo + at + piece_tokens);
      const long long extra[8] = {row[0], plo, phi, row[3], row[4], row[5], 0, 0};
      chains[static_cast<std::size_t>(row[3])].push_back(plan.segments.earlier_segments());
      plan.segments.earlier.insert(plan.segments.earlier.end(), extra, extra + 8);
    }
  }
  DeviceBuffer offsets;
  if (!args.cu_seqlens.empty()) {
    offsets = DeviceBuffer(args.cu_seqlens.size() * sizeof(std::int64_t));
    offsets.copy_from_host(args.cu_seqlens.data(), offsets.bytes(), 0, launch.stream);
  }
  const std::function<void(std::uint64_t, std::uint64_t)> between = [&](std::uint64_t states, std::uint64_t decay) {
    hook(states, decay, chains);
  };
  run_chunked_plan(plan, variant, bound, offsets.device_ptr(), launch, 0, nullptr, nullptr, 0, &between);
  if (!args.cu_seqlens.empty()) {
    if (launch.stream) launch.stream->synchronize();
    else Device::get().synchronize();
  }
  return true;
}

}  // namespace ladle::gpu

namespace ladle::gpu {

namespace {

// The checks and binding the backward's state passes share (run_entry_states, run_chunk_states): no
// final state, device tensors, a contiguous h0, no output (the passes write none, but take the
// chunked kernels' parameters, o's strides among them), the chunked family and not the delta rule's.
// `options` comes back checked, its cu_seqlens on the host.
ops::BoundInputs bind_state_pass(const std::string& op, const char* why, const ir::Variant& variant, const TensorView& q,
                                 const TensorView& k, const TensorView& v, const VariantInputs& inputs,
                                 const LaunchOptions& launch, RunOptions& options) {
  if (options.return_state) throw InvalidArgument(op + ": options.return_state: the state passes write no final state");
  std::optional<Tensor> seqlens;
  options = device_call(op, why, q, k, v, inputs, options, launch, seqlens);
  options.algorithm = Algorithm::chunked;  // choose_algorithm refuses what the family cannot run
  ops::BoundInputs bound = ops::bind_inputs(op, variant, q, k, v, inputs, options);
  if (bound.args.initial_state && !is_contiguous(*bound.args.initial_state))
    throw InvalidArgument(op + ": initial_state must be contiguous [N,H,K,V] on the GPU");
  bound.args.output = TensorView::contiguous(nullptr, bound.dims.type,
                                             {bound.args.batch, bound.args.tokens, bound.args.heads, bound.args.value_dim});
  if (variant.update == ir::Update::delta)
    throw InvalidArgument(op + ": the states come from the chunked family's state pass, not the delta rule's");
  choose_algorithm(variant, bound, options);
  return bound;
}

}  // namespace

void run_entry_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, const cuda::ChunkedSegments& segments,
                      std::uint64_t states, const LaunchOptions& launch) {
  const std::string op = op_name(variant) + " entry states";
  RunOptions checked = options;
  const ops::BoundInputs bound = bind_state_pass(op, "ladle::gpu::run_entry_states takes device tensors", variant, q, k, v, inputs, launch, checked);
  const ChunkedPlan plan = plan_entry_states(variant, bound, checked, segments, device_target());
  if (plan.segments.earlier_segments() == 0 || bound.args.heads * bound.args.key_dim * bound.args.value_dim == 0) return;
  run_chunked_plan(plan, variant, bound, 0, launch, states);
}

void run_segment_summaries(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                           const VariantInputs& inputs, const RunOptions& options, const cuda::ChunkedSegments& segments,
                           std::uint64_t states, std::uint64_t decay, const LaunchOptions& launch) {
  const std::string op = op_name(variant) + " segment summaries";
  if (options.initial_state) throw InvalidArgument(op + ": options.initial_state: the summaries start from zero");
  if (options.cu_seqlens) throw InvalidArgument(op + ": options.cu_seqlens: the segments table names the tokens");
  RunOptions checked = options;
  const ops::BoundInputs bound = bind_state_pass(op, "ladle::gpu::run_segment_summaries takes device tensors", variant, q, k, v, inputs, launch, checked);
  ChunkedPlan plan = plan_entry_states(variant, bound, checked, segments, device_target());
  if (plan.launches.empty() || plan.launches.front().spec.phase != cuda::ChunkedPhase::states)
    throw InvalidArgument(op + ": the segmented state pass does not run this call (" + to_string(plan) + ")");
  plan.launches.resize(1);  // the state pass alone: no fold
  if (plan.segments.earlier_segments() == 0 || bound.args.heads * bound.args.key_dim * bound.args.value_dim == 0) return;
  run_chunked_plan(plan, variant, bound, 0, launch, states, nullptr, nullptr, decay);
}

void run_chunk_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, int chunk, std::uint64_t states,
                      const LaunchOptions& launch) {
  const std::string op = op_name(variant) + " chunk states";
  if (chunk != 16 && chunk != 32 && chunk != 64) throw InvalidArgument(op + ": chunk = " + std::to_string(chunk) + ", expected 16, 32 or 64");
  RunOptions checked = options;
  checked.chunked_segment_tokens = 0;  // the split form runs whole sequences
  const ops::BoundInputs bound = bind_state_pass(op, "ladle::gpu::run_chunk_states takes device tensors", variant, q, k, v, inputs, launch, checked);
  // The split form's default tile at this chunk, its states in fp32; only its state pass runs.
  cuda::ChunkedTile tile = split_chunked_tile(cuda::default_chunked_tile(bound.args.key_dim, bound.args.value_dim), bound.args.value_dim);
  tile.chunk = chunk, tile.state_f32 = true;
  checked.chunked_tile = tile;
  ChunkedPlan plan = plan_chunked(variant, bound, checked, device_target());
  if (plan.form != ChunkedPlan::Form::split || plan.launches.empty() || plan.launches.front().spec.phase != cuda::ChunkedPhase::states)
    throw InvalidArgument(op + ": the split form's state pass does not run this call (" + to_string(plan) + ")");
  plan.launches.resize(1);
  if (bound.args.heads * bound.args.key_dim * bound.args.value_dim == 0) return;
  DeviceBuffer offsets;  // the split form walks packed sequences by cu_seqlens on the device
  if (!bound.args.cu_seqlens.empty()) {
    offsets = DeviceBuffer::on_stream(bound.args.cu_seqlens.size() * sizeof(std::int64_t), launch.stream);
    offsets.copy_from_host(bound.args.cu_seqlens.data(), offsets.bytes(), 0, launch.stream);
  }
  run_chunked_plan(plan, variant, bound, offsets.device_ptr(), launch, states);
}

}  // namespace ladle::gpu
