#include "gpu_attention_backward.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <cstdint>

#include <fmt/format.h>

#include <ladle/runtime/error.h>

#include "detail/loaded_kernel.h"
#include "gpu_attention.h"
#include "tune_attention.h"

namespace ladle::gpu {
namespace {

using Role = cuda::AttentionParam::Role;

std::string op_name(const ir::AttentionVariant& variant) { return (variant.name.empty() ? "attention" : variant.name) + " backward"; }

std::uint64_t address(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// TMA copies d_output's rows as they stand: q's 16-bit type, unit stride over Dv, 16-byte aligned
// base and strides.
bool tma_copyable(const TensorView& view, DType type) {
  if (view.type != type || view.rank() != 4) return false;
  if (view.strides[3] != 1 && view.shape[3] != 1) return false;
  if (address(view.data) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (view.shape[d] > 1 && (view.strides[d] * 2) % 16 != 0) return false;
  return true;
}

// d_output as main reads it: the caller's, or the contiguous copy prep writes.
TensorView d_output_for_tma(const cuda::AttentionBackwardSpec& spec, const ops::AttentionArgs& args, const cpu::AttentionGrads& grads,
                            void* copy) {
  if (!spec.copy_d_output) return grads.d_output;
  TensorView view = grads.d_output;
  view.data = copy;
  view.type = spec.input_types[0];
  view.strides = {args.Tq * args.H * args.Dv, args.H * args.Dv, args.Dv, 1};
  return view;
}

}  // namespace

cuda::AttentionBackwardSpec attention_backward_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                    const cpu::AttentionGrads& grads, const std::string& arch) {
  cuda::AttentionBackwardSpec spec;
  for (std::size_t k = 0; k < variant.inputs.size(); ++k)
    spec.input_types.push_back(variant.inputs[k].kind == ir::InputKind::scalar ? DType::f32 : args.tensors[k].type);
  spec.D = static_cast<int>(args.D);
  spec.Dv = static_cast<int>(args.Dv);
  spec.varlen = !args.cu_seqlens_q.empty();
  if (args.q_segment_ids) spec.q_segment_ids_type = args.q_segment_ids->type;
  if (args.kv_segment_ids) spec.kv_segment_ids_type = args.kv_segment_ids->type;
  if (args.softmax_aux) spec.sinks_type = args.softmax_aux->type;
  spec.output_type = args.o.type;
  spec.d_output_type = grads.d_output.type;
  spec.copy_d_output = !tma_copyable(grads.d_output, args.q.type);
  // Whether TMA can address dq; whether dQ's stage fits is the tile's question (cuda::with_tile).
  spec.dq_tma = grads.dq.strides.size() == 4 && address(grads.dq.data) % 16 == 0 && grads.dq.strides[0] % 4 == 0 &&
                grads.dq.strides[1] % 4 == 0 && grads.dq.strides[2] % 4 == 0;
  spec.sinks_gradient = args.softmax_aux.has_value() && grads.d_softmax_aux.has_value() && args.sinks > 0;
  spec.input_gradients.assign(variant.inputs.size(), false);
  for (std::size_t k = 0; k < variant.inputs.size() && k < grads.d_tensors.size(); ++k) spec.input_gradients[k] = grads.d_tensors[k].has_value();
  spec.arch = arch.empty() ? cuda::Target::hopper : arch;
  spec.form = cuda::attention_backward_form(spec.input_types, spec.D, spec.Dv, spec.arch);
  if (spec.form == cuda::AttentionBackwardForm::sync) spec = cuda::with_sync_tile(spec);  // d_output read in place, dq by atomics
  return spec;
}

CompiledAttentionBackward compile_attention_backward(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& spec,
                                                     const std::string& arch) {
  CompiledAttentionBackward out;
  out.kernel = cuda::generate_attention_backward(variant, spec);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch.empty() ? spec.arch : arch);
  return out;
}

AttentionBackwardArguments pack_attention_backward_arguments(const cuda::AttentionBackwardKernel& kernel,
                                                             const cuda::AttentionBackwardSpec& spec, const ops::AttentionArgs& args,
                                                             const cpu::AttentionGrads& grads, void* row_stats, void* d_output_copy,
                                                             const void* cu_seqlens_q, const void* cu_seqlens_k,
                                                             TensorMap (*encode)(const TensorMapDescription&)) {
  const auto pack = [&](KernelArgs& packed, const cuda::AttentionParam& p) {
    const auto i64 = [&](std::int64_t value) { packed.add(static_cast<long long>(value)); };
    const TensorView* d_input = p.input >= 0 && static_cast<std::size_t>(p.input) < grads.d_tensors.size() && grads.d_tensors[p.input]
                                    ? &*grads.d_tensors[p.input]
                                    : nullptr;
    const bool pair = p.input >= 0 && args.tensors[p.input].rank() == 4;  // head inputs are [B,H]
    switch (p.role) {
      case Role::d_output: packed.add(address(grads.d_output.data)); break;
      case Role::d_output_stride_b: i64(grads.d_output.strides[0]); break;
      case Role::d_output_stride_t: i64(grads.d_output.strides[1]); break;
      case Role::d_output_stride_h: i64(grads.d_output.strides[2]); break;
      case Role::d_output_stride_d: i64(grads.d_output.strides[3]); break;
      case Role::d_output_copy: packed.add(address(d_output_copy)); break;
      case Role::d_output_map:
        packed.add(encode(attention_tensor_map(d_output_for_tma(spec, args, grads, d_output_copy), p.box_rows)));
        break;
      case Role::dq_map: packed.add(encode(attention_tensor_map(grads.dq, p.box_rows))); break;
      case Role::row_stats: packed.add(address(row_stats)); break;
      case Role::dq: packed.add(address(grads.dq.data)); break;
      case Role::dq_stride_b: i64(grads.dq.strides[0]); break;
      case Role::dq_stride_t: i64(grads.dq.strides[1]); break;
      case Role::dq_stride_h: i64(grads.dq.strides[2]); break;
      case Role::dk: packed.add(address(grads.dk.data)); break;
      case Role::dk_stride_b: i64(grads.dk.strides[0]); break;
      case Role::dk_stride_t: i64(grads.dk.strides[1]); break;
      case Role::dk_stride_h: i64(grads.dk.strides[2]); break;
      case Role::dk_stride_d: i64(grads.dk.strides[3]); break;
      case Role::dv: packed.add(address(grads.dv.data)); break;
      case Role::dv_stride_b: i64(grads.dv.strides[0]); break;
      case Role::dv_stride_t: i64(grads.dv.strides[1]); break;
      case Role::dv_stride_h: i64(grads.dv.strides[2]); break;
      case Role::dv_stride_d: i64(grads.dv.strides[3]); break;
      // pair gradients [B,H,Tq,Tk]: i as "t", j as "d"; head gradients [B,H].
      case Role::d_input: packed.add(address(d_input->data)); break;
      case Role::d_input_stride_b: i64(d_input->strides[0]); break;
      case Role::d_input_stride_h: i64(d_input->strides[1]); break;
      case Role::d_input_stride_t: i64(pair ? d_input->strides[2] : 0); break;
      case Role::d_input_stride_d: i64(pair ? d_input->strides[3] : 0); break;
      case Role::d_softmax_aux: packed.add(address(grads.d_softmax_aux->data)); break;
      case Role::d_softmax_aux_stride_h: i64(grads.d_softmax_aux->strides[0]); break;
      case Role::d_softmax_aux_stride_s: i64(grads.d_softmax_aux->strides[1]); break;
      default: pack_attention_argument(packed, p, args, cu_seqlens_q, cu_seqlens_k, encode);
    }
  };
  AttentionBackwardArguments out;
  for (const cuda::AttentionParam& p : kernel.prep_params) pack(out.prep, p);
  for (const cuda::AttentionParam& p : kernel.main_params) pack(out.main, p);
  return out;
}

std::vector<std::string> gpu_attention_backward_unsupported(const ir::AttentionVariant& variant, const ops::AttentionArgs& args) {
  cpu::AttentionGrads none;  // the gradients wanted do not change what the kernels take
  none.d_output = args.o;
  return cuda::attention_backward_unsupported(variant, attention_backward_spec(variant, args, none, Device::get().properties().arch()));
}

cuda::AttentionBackwardTile heuristic_attention_backward_tile(const cuda::AttentionBackwardSpec& spec) { return {2, spec.dq_tma}; }

AttentionBackwardPlan plan_attention_backward(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                              const cpu::AttentionGrads& grads, const std::optional<cuda::AttentionBackwardTile>& tile,
                                              const std::string& arch) {
  AttentionBackwardPlan plan;
  const cuda::AttentionBackwardSpec base = attention_backward_spec(variant, args, grads, arch);
  plan.tile = tile ? *tile : heuristic_attention_backward_tile(base);
  plan.spec = cuda::with_tile(base, plan.tile);
  if (const auto problems = cuda::attention_backward_unsupported(variant, plan.spec); !problems.empty())
    throw InvalidArgument(fmt::format("{}: backward tile {}: {}", op_name(variant), cuda::to_string(plan.tile), problems.front()));
  plan.launches = {{AttentionLaunch::Kernel::prep, AttentionLaunch::Over::query_rows},
                   {AttentionLaunch::Kernel::main, AttentionLaunch::Over::key_blocks}};
  return plan;
}

std::string to_string(const AttentionBackwardPlan& plan) {
  if (plan.spec.form == cuda::AttentionBackwardForm::sync)
    return fmt::format("form sync, {} rows x {} columns", plan.spec.sync_rows, plan.spec.sync_columns);
  return fmt::format("form ws, {}", cuda::to_string(cuda::AttentionBackwardTile{plan.spec.stages, plan.spec.dq_tma}));  // as with_tile made it
}

void run_attention_backward_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const cpu::AttentionGrads& grads,
                                 const LaunchOptions& launch, const std::optional<cuda::AttentionBackwardTile>& tile) {
  const std::string op = op_name(variant);
  if (const auto problems = gpu_attention_backward_unsupported(variant, args); !problems.empty())
    throw InvalidArgument(op + " on the GPU: " + problems.front());
  if (!args.lse) throw InvalidArgument(op + ": the forward's lse is required (the forward must return it)");
  if (grads.dq.type != DType::f32 || grads.dk.type != DType::f32 || grads.dv.type != DType::f32)
    throw InvalidArgument(op + ": dq, dk and dv must be f32");
  if (grads.dq.strides[3] != 1 || address(grads.dq.data) % 8 != 0 || grads.dq.strides[1] % 2 != 0 || grads.dq.strides[2] % 2 != 0 ||
      grads.dq.strides[0] % 2 != 0)
    throw InvalidArgument(op + ": dq must have unit stride over D and even strides elsewhere (8-byte aligned pairs)");
  const std::int64_t rows_q = args.longest_q(), rows_k = args.longest_k();
  const Stream* stream = launch.stream;
  // Every gradient is overwritten: the atomically added ones start from zero, and so do dk and dv
  // where a key's block may not run (packed sequences; no query rows at all).
  fill_device_bytes(address(grads.dq.data), span_bytes(grads.dq), 0, stream);
  if (!args.cu_seqlens_k.empty() || rows_q == 0 || args.N * args.H == 0) {
    fill_device_bytes(address(grads.dk.data), span_bytes(grads.dk), 0, stream);
    fill_device_bytes(address(grads.dv.data), span_bytes(grads.dv), 0, stream);
  }
  for (const auto& d : grads.d_tensors)
    if (d) fill_device_bytes(address(d->data), span_bytes(*d), 0, stream);
  if (grads.d_softmax_aux) fill_device_bytes(address(grads.d_softmax_aux->data), span_bytes(*grads.d_softmax_aux), 0, stream);
  if (args.N * args.H == 0 || rows_q == 0 || rows_k == 0) return;
  if (args.Tq > INT32_MAX || args.Tk > INT32_MAX)
    throw InvalidArgument(fmt::format("{}: Tq = {}, Tk = {}: the GPU kernels index tokens with 32-bit ints", op, args.Tq, args.Tk));

  const std::string arch = Device::get().properties().arch();
  AttentionBackwardPlan plan = plan_attention_backward(variant, args, grads, tile, arch);
  // No tile named: the tuned one (the sync form has none to choose: with_sync_tile decided it).
  if (!tile && plan.spec.form != cuda::AttentionBackwardForm::sync)
    plan = plan_attention_backward(variant, args, grads, tuned_attention_backward_tile(variant, args, grads, plan.tile), arch);
  const cuda::AttentionBackwardSpec& spec = plan.spec;
  std::string key = fmt::format("attention-backward|{}|{}|{}|", ir::hash(variant), spec.D, spec.Dv);
  for (DType t : spec.input_types) key += dtype_name(t);
  for (bool g : spec.input_gradients) key += g ? "g" : "-";
  key += fmt::format("|{}{}x{}", cuda::to_string(spec.form), spec.sync_rows, spec.sync_columns);
  key += fmt::format("|s{}{}|{}{}{}{}{}{}{}{}", spec.stages, spec.dq_tma ? "qb" : "", spec.varlen, spec.copy_d_output, spec.sinks_gradient, dtype_name(spec.output_type),
                     dtype_name(spec.d_output_type), dtype_name(spec.q_segment_ids_type),
                     dtype_name(spec.kv_segment_ids_type), dtype_name(spec.sinks_type));
  const auto& loaded = detail::loaded_kernel<cuda::AttentionBackwardKernel>(
      key, arch, [&](const std::string& target) { return compile_attention_backward(variant, spec, target); });
  static std::mutex prep_mutex;
  static std::map<const void*, Kernel> prep_functions;
  const Kernel* prep = nullptr;
  {
    const std::lock_guard lock(prep_mutex);
    auto found = prep_functions.find(&loaded);
    if (found == prep_functions.end()) found = prep_functions.emplace(&loaded, loaded.module->kernel(loaded.kernel.prep_name)).first;
    prep = &found->second;
  }

  DeviceBuffer offsets_q, offsets_k;
  if (spec.varlen) {
    offsets_q = DeviceBuffer(args.cu_seqlens_q.size() * sizeof(std::int64_t));
    offsets_q.copy_from_host(args.cu_seqlens_q.data(), offsets_q.bytes(), 0, stream);
    offsets_k = DeviceBuffer(args.cu_seqlens_k.size() * sizeof(std::int64_t));
    offsets_k.copy_from_host(args.cu_seqlens_k.data(), offsets_k.bytes(), 0, stream);
  }
  DeviceBuffer row_stats = DeviceBuffer::on_stream(static_cast<std::size_t>(args.B * args.H * args.Tq) * 8, stream);
  DeviceBuffer copy;
  if (spec.copy_d_output) copy = DeviceBuffer::on_stream(static_cast<std::size_t>(args.B * args.Tq * args.H * args.Dv) * 2, stream);
  AttentionBackwardArguments packed = pack_attention_backward_arguments(
      loaded.kernel, spec, args, grads, reinterpret_cast<void*>(row_stats.device_ptr()), reinterpret_cast<void*>(copy.device_ptr()),
      reinterpret_cast<const void*>(offsets_q.device_ptr()), reinterpret_cast<const void*>(offsets_k.device_ptr()));
  // prep: row groups along x, heads along y; main: cuda::attention_grid.
  if (args.N * args.H > 65535)
    throw InvalidArgument(fmt::format("{}: {} sequences x {} heads; the GPU backward takes at most 65535 (grid.y)", op, args.N, args.H));
  cuda::AttentionGrid grid;
  try {
    grid = cuda::attention_grid(args.N * args.H_kv, (rows_k + loaded.kernel.block_n - 1) / loaded.kernel.block_n * loaded.kernel.column_parts);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {} sequences x {} kv heads, {} keys in blocks of {}: {}", op, args.N, args.H_kv, rows_k,
                                      loaded.kernel.block_n, e.what()));
  }
  prep->launch({static_cast<unsigned>((rows_q + loaded.kernel.prep_rows - 1) / loaded.kernel.prep_rows), static_cast<unsigned>(args.N * args.H), 1},
               {loaded.kernel.prep_threads, 1, 1}, packed.prep, 0, stream);
  loaded.function->launch({grid.x, grid.y, grid.z},
                          {loaded.kernel.main_threads, 1, 1}, packed.main, static_cast<unsigned>(loaded.kernel.shared_bytes), stream);
  if (spec.varlen) {
    // The offsets are freed on return: wait until the kernels have read them.
    if (stream) stream->synchronize();
    else Device::get().synchronize();
  }
}

}  // namespace ladle::gpu
