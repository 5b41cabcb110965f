#include "gpu_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include <ladle/runtime/error.h>

#include "detail/loaded_kernel.h"
#include "tune_attention.h"

namespace ladle::gpu {
namespace {

using Role = cuda::AttentionParam::Role;

std::string op_name(const ir::AttentionVariant& variant) { return variant.name.empty() ? "attention" : variant.name; }

std::uint64_t address(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// cp.async copies 16 bytes: every q, k, v row must start 16-byte aligned, with unit stride
// over the head dimension.
bool rows_aligned(const TensorView& view) {
  if (view.strides[3] != 1 && view.shape[3] != 1) return false;
  if (address(view.data) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (view.shape[d] > 1 && view.strides[d] % 8 != 0) return false;
  return true;
}

std::string spec_key(const ir::AttentionVariant& variant, const cuda::AttentionKernelSpec& spec) {
  std::string key = ir::hash_hex(variant) + "|" + cuda::to_string(spec.tile);
  for (DType t : spec.input_types) key += dtype_name(t);
  key += fmt::format("|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", dtype_name(spec.output_type), spec.D, spec.Dv, spec.varlen,
                     spec.lse, spec.async_copy, spec.positive_logit_factor, dtype_name(spec.q_segment_ids_type),
                     dtype_name(spec.kv_segment_ids_type), dtype_name(spec.sinks_type), spec.persistent);
  return key;
}

}  // namespace

AttentionWork attention_work(const ops::AttentionArgs& args, int block_m) {
  if (block_m < 1) throw InvalidArgument("attention_work: block_m = " + std::to_string(block_m) + ", expected positive");
  AttentionWork work;
  work.row_blocks = (args.longest_q() + block_m - 1) / block_m;
  return work;
}

bool attention_persistent_enabled() {
  const char* value = std::getenv("LADLE_ATTENTION_PERSISTENT");
  return value != nullptr && std::string(value) == "1";
}

bool attention_decode_shaped(const ops::AttentionArgs& args) {
  const std::int64_t q = args.longest_q(), k = args.longest_k();
  // (and a grid of (sequence, key/value head) pairs the decode grid takes)
  return args.dropout_p <= 0 && q >= 1 && q <= 16 && k >= 128 && k >= 8 * q && args.N * args.H_kv <= 65535;
}

AttentionDecodeSplit attention_decode_split(const ops::AttentionArgs& args, const cuda::AttentionTile& tile, int sms, int shared_per_sm) {
  AttentionDecodeSplit split;
  const std::int64_t rows = args.longest_q(), groups = args.N * args.H_kv;
  const std::int64_t row_blocks = std::max<std::int64_t>(1, (rows * (args.H / std::max<std::int64_t>(1, args.H_kv)) + tile.block_m - 1) / tile.block_m);
  const std::int64_t tiles = std::max<std::int64_t>(1, (args.longest_k() + tile.block_n - 1) / tile.block_n);
  // The blocks an SM holds at once (by shared memory; at most 12 warps an SM at the kernels' ~168
  // registers). Each split count s (up to attention_merge_splits, at least eight key tiles a split)
  // costs about waves x (tiles a split + 2): the blocks run in ceil(s blocks / slots) waves, each as
  // long as one block's tiles plus its start and partial store (about two tiles). The cheapest wins,
  // the fewer splits on a tie.
  const int shared = std::max(1, cuda::attention_shared_bytes(tile, static_cast<int>(args.D), static_cast<int>(args.Dv), false));
  const std::int64_t room = shared_per_sm > 0 ? shared_per_sm : 227 * 1024;
  const std::int64_t resident = std::max<std::int64_t>(1, std::min<std::int64_t>(room / shared, 12 / std::max(1, tile.warps)));
  const std::int64_t slots = resident * std::max(sms, 1), blocks = groups * row_blocks;
  const std::int64_t most = std::clamp<std::int64_t>(tiles / 8, 1, cuda::attention_merge_splits);
  std::int64_t splits = 1, best = -1;
  for (std::int64_t s = 1; s <= most; ++s) {
    const std::int64_t per = (tiles + s - 1) / s, waves = (s * blocks + slots - 1) / slots, cost = waves * (per + 2);
    if (best < 0 || cost < best) best = cost, splits = s;
  }
  const std::int64_t per_split = (tiles + splits - 1) / splits;
  split.splits = static_cast<int>((tiles + per_split - 1) / per_split);  // none empty
  split.split_len = static_cast<int>(per_split * tile.block_n);
  split.partial_rows = std::max<std::int64_t>(rows, 1);
  return split;
}

// 128-row tiles (8 warps) keep K/V reuse high; when the shape gives fewer such blocks than
// the GPU has SMs (short or few sequences), 64-row tiles double the blocks. On sm_90a the ws
// pipeline where its copies can run (16-bit q, k, v of one type in aligned rows, D and Dv
// multiples of 8), else mma.sync, and the first tile that fits where that does not.
cuda::AttentionTile heuristic_attention_tile(const ops::AttentionArgs& args, int sms, const std::string& arch,
                                             int max_shared_bytes) {
  const int D = static_cast<int>(args.D), Dv = static_cast<int>(args.Dv);
  cuda::AttentionTile tile = cuda::default_attention_tile(D, Dv);
  const std::int64_t rows = args.longest_q();
  if (args.N * args.H * ((rows + 127) / 128) < sms) tile.block_m = 64, tile.warps = 4;
  // Head dims the default does not fit (mma.sync holds q's fragments in registers: past
  // D/4 + block_n/2 + Dv/2 = 160 it does not fit, e.g. D = Dv = 256), or fp32 inputs past the
  // device's shared memory: the first tile that fits, in this order: fewer keys per tile, one
  // stage, 64-row tiles, then wgmma (q in shared memory; sm_90a, 16-bit inputs).
  bool split = false;
  for (std::size_t i = 0; i < 3 && i < args.tensors.size(); ++i) split = split || args.tensors[i].type == DType::f32;
  const auto fits = [&](const cuda::AttentionTile& t) {
    return cuda::validate_attention_tile(t, D, Dv, max_shared_bytes, split, arch).empty();
  };
  // sm_90a with q, k, v of one 16-bit type in rows TMA can copy: the warp-specialised pipeline,
  // two stages, 128 keys a tile where the registers allow: not past D, Dv = 128, and not for a
  // variant that reads a pair input or segment ids per score or draws dropout (ptxas compiles the consumers
  // within the launch bound's 168 registers: 128-key tiles of those spill, 64-key ones do not;
  // bench/RESULTS.md, "Evidence behind the heuristics", H1).
  // A few query tokens against many keys: the decode form (a GQA group's heads as rows, the keys
  // split over blocks): four warps, one to four row groups of 16 (the group's rows), the others
  // splitting each 64-key tile; three K/V tiles in flight where one row group's warps all split the
  // keys, else two (bench/RESULTS.md, "Evidence behind the heuristics", H18).
  if (attention_decode_shaped(args)) {
    const std::int64_t group = args.H / std::max<std::int64_t>(1, args.H_kv);
    const std::int64_t row_groups = std::min<std::int64_t>(4, (args.longest_q() * group + 15) / 16);
    const int block_m = static_cast<int>(16 * (row_groups == 3 ? 4 : row_groups));
    for (const int block_n : {64, 32})
      for (const int warps : {4, block_m / 16})
        for (const int stages : {block_m == 16 ? 3 : 2, 2}) {
          const cuda::AttentionTile decode{block_m, block_n, warps, stages, cuda::AttentionMma::decode};
          if (fits(decode)) return decode;
        }
  }
  const DType qt = args.tensors.size() >= 3 ? args.tensors[0].type : DType::f32;
  const bool tma = cuda::has_wgmma(arch) && (qt == DType::f16 || qt == DType::bf16) &&
                   args.tensors[1].type == qt && args.tensors[2].type == qt && rows_aligned(args.q) &&
                   rows_aligned(args.k) && rows_aligned(args.v);
  if (tma) {
    cuda::AttentionTile ws = tile;
    // A window takes 128-key tiles like the rest since its edge tiles test a row range per element
    // (faster than 64 keys: bench/RESULTS.md, "Evidence behind the heuristics", H2).
    bool light = args.dropout_p <= 0 && !args.q_segment_ids;
    for (std::size_t i = 3; i < args.tensors.size(); ++i) light = light && (!args.tensors[i].data || args.tensors[i].rank() != 4);
    ws.mma = cuda::AttentionMma::ws, ws.stages = 2, ws.block_n = D <= 128 && Dv <= 128 && light ? 128 : 64;
    // Head dims to 64 with 128-key tiles, no sliding window: three consumer warpgroups (192 rows a
    // block, three K/V stages) where the shape still gives every SM a block: more warps to hide the
    // softmax's latency behind the products (H200, B8 T4096 D64: causal 0.715-0.721 ms against
    // 0.744-0.750, sinks + GQA 0.722-0.737 against 0.786-0.803; a window + soft cap 7 % slower, so
    // not there: "Evidence behind the heuristics", H19).
    cuda::AttentionTile three = ws;
    three.block_m = 192, three.warps = 12, three.stages = 3;
    const bool window = args.window_left >= 0 || args.window_right >= 0;
    if (D <= 64 && Dv <= 64 && ws.block_n == 128 && !window && args.N * args.H * ((rows + 191) / 192) >= sms && fits(three))
      return three;
    if (fits(ws)) return ws;
    ws.block_n = 64;
    if (fits(ws)) return ws;
  }
  if (fits(tile)) return tile;
  std::vector<cuda::AttentionMma> kinds = {cuda::AttentionMma::sync};
  if (cuda::has_wgmma(arch) && !split) kinds.push_back(cuda::AttentionMma::wgmma);
  for (const cuda::AttentionMma mma : kinds)
    for (const int block_n : {tile.block_n, 32})
      for (const int stages : {tile.stages, 1})
        for (const int block_m : {tile.block_m, 64}) {
          cuda::AttentionTile t = tile;
          t.mma = mma, t.block_n = block_n, t.stages = stages, t.block_m = block_m, t.warps = block_m / 16;
          if (fits(t)) return t;
        }
  return tile;  // none fits: attention_kernel_spec says why
}

cuda::AttentionTile heuristic_attention_tile(const ops::AttentionArgs& args) {
  if (!driver_available()) return heuristic_attention_tile(args, 132, "", 0);
  const DeviceProperties& device = Device::get().properties();
  return heuristic_attention_tile(args, device.sm_count, device.arch(), device.max_shared_per_block_optin);
}

cuda::AttentionKernelSpec attention_kernel_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                const std::optional<cuda::AttentionTile>& tile) {
  return attention_kernel_spec(variant, args, tile, device_target());
}

cuda::AttentionKernelSpec attention_kernel_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                const std::optional<cuda::AttentionTile>& tile, const GpuTarget& target) {
  cuda::AttentionKernelSpec spec;
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    spec.input_types.push_back(variant.inputs[i].kind == ir::InputKind::scalar ? DType::f32 : args.tensors[i].type);
  spec.output_type = args.o.data ? args.o.type : args.type;
  spec.D = static_cast<int>(args.D);
  spec.Dv = static_cast<int>(args.Dv);
  spec.varlen = !args.cu_seqlens_q.empty();
  spec.lse = args.lse.has_value();
  if (args.q_segment_ids) spec.q_segment_ids_type = args.q_segment_ids->type;
  if (args.kv_segment_ids) spec.kv_segment_ids_type = args.kv_segment_ids->type;
  if (args.softmax_aux) spec.sinks_type = args.softmax_aux->type;
  spec.async_copy = rows_aligned(args.q) && rows_aligned(args.k) && rows_aligned(args.v);
  // score * scale with scale > 0 (and a soft cap > 0): the kernel folds the factor into p's FFMA.
  if (const std::optional<double> factor = cuda::attention_logit_factor(variant, args.scalars);
      factor && std::isfinite(*factor) && *factor > 0.0)
    spec.positive_logit_factor = true;
  spec.tile = tile ? *tile : heuristic_attention_tile(args, target.sms > 0 ? target.sms : 132, target.arch, target.max_shared_bytes);
  spec.persistent = spec.tile.mma == cuda::AttentionMma::ws && attention_persistent_enabled();
  spec.arch = target.arch;
  const int max_shared = target.max_shared_bytes;
  const bool split = cuda::attention_split_f32(variant, spec);
  if (auto problems = cuda::validate_attention_tile(spec.tile, spec.D, spec.Dv, max_shared, split, spec.arch); !problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw InvalidArgument(fmt::format("{}: tile ({}) does not fit D={} Dv={}: {}", op_name(variant),
                                      cuda::to_string(spec.tile), spec.D, spec.Dv, all));
  }
  return spec;
}

const char* to_string(AttentionLaunch::Kernel kernel) {
  switch (kernel) {
    case AttentionLaunch::Kernel::main: return "main";
    case AttentionLaunch::Kernel::merge: return "merge";
    case AttentionLaunch::Kernel::prep: return "prep";
  }
  return "?";
}

const char* to_string(AttentionLaunch::Over over) {
  switch (over) {
    case AttentionLaunch::Over::row_blocks: return "row_blocks";
    case AttentionLaunch::Over::work_items: return "work_items";
    case AttentionLaunch::Over::key_splits: return "key_splits";
    case AttentionLaunch::Over::merged_rows: return "merged_rows";
    case AttentionLaunch::Over::query_rows: return "query_rows";
    case AttentionLaunch::Over::key_blocks: return "key_blocks";
  }
  return "?";
}

const char* to_string(AttentionPlan::Form form) {
  switch (form) {
    case AttentionPlan::Form::tiles: return "tiles";
    case AttentionPlan::Form::persistent: return "persistent";
    case AttentionPlan::Form::decode: return "decode";
  }
  return "?";
}

std::string to_string(const AttentionPlan& plan) {
  std::string out = fmt::format("{}: {}", to_string(plan.form), cuda::to_string(plan.spec.tile));
  if (plan.form == AttentionPlan::Form::decode)
    out += fmt::format(", {} key splits of {} keys", plan.split.splits, plan.split.split_len);
  else
    out += fmt::format(", {} row blocks", plan.row_blocks);
  for (std::size_t i = 0; i < plan.launches.size(); ++i)
    out += fmt::format("{} {} over {}", i == 0 ? ";" : ",", to_string(plan.launches[i].kernel), to_string(plan.launches[i].over));
  return out;
}

AttentionPlan plan_attention(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                             const std::optional<cuda::AttentionTile>& tile, const GpuTarget& target) {
  AttentionPlan plan;
  plan.spec = attention_kernel_spec(variant, args, tile, target);
  using Launch = AttentionLaunch;
  if (plan.spec.tile.mma == cuda::AttentionMma::decode) {
    plan.form = AttentionPlan::Form::decode;
    plan.split = attention_decode_split(args, plan.spec.tile, target.sms > 0 ? target.sms : 132, target.shared_per_sm);
    plan.launches = {{Launch::Kernel::main, Launch::Over::key_splits}, {Launch::Kernel::merge, Launch::Over::merged_rows}};
    return plan;
  }
  plan.row_blocks = attention_work(args, plan.spec.tile.block_m).row_blocks;
  plan.form = plan.spec.persistent ? AttentionPlan::Form::persistent : AttentionPlan::Form::tiles;
  plan.launches = {{Launch::Kernel::main, plan.spec.persistent ? Launch::Over::work_items : Launch::Over::row_blocks}};
  return plan;
}

CompiledAttention compile_attention(const ir::AttentionVariant& variant, const cuda::AttentionKernelSpec& spec,
                                    const std::string& arch) {
  CompiledAttention out;
  cuda::AttentionKernelSpec target = spec;  // the kernel is generated for the arch it is compiled for
  if (target.arch.empty()) target.arch = arch;
  out.kernel = cuda::generate_attention(variant, target);
  out.program = detail::compile_named(out.kernel.source, out.kernel.name, arch, out.kernel.shared_bytes);
  return out;
}

TensorMapDescription attention_tensor_map(const TensorView& view, int box_rows) {
  if (view.rank() != 4 || (view.type != DType::f16 && view.type != DType::bf16 && view.type != DType::f32))
    throw InvalidArgument("attention: a TMA copy needs a 16-bit or fp32 [B,T,X,D] view, got rank " + std::to_string(view.rank()) +
                          " of " + dtype_name(view.type));
  TensorMapDescription map;
  map.address = view.data;
  map.rank = 4;
  map.bfloat16 = view.type == DType::bf16 ? 1 : 0;
  map.float32 = view.type == DType::f32 ? 1 : 0;
  const std::int64_t size = map.float32 ? 4 : 2;
  // dims innermost first: D, T, X, B; a dimension of one index gets any valid stride.
  const int order[4] = {3, 1, 2, 0};
  for (int d = 0; d < 4; ++d) {
    const int axis = order[d];
    map.dims[d] = static_cast<std::uint64_t>(view.shape[axis]);
    const std::int64_t stride = view.shape[axis] > 1 ? view.strides[axis] * size : 16;
    map.strides[d] = d == 0 ? static_cast<std::uint64_t>(size) : static_cast<std::uint64_t>(stride);
  }
  map.box[0] = static_cast<std::uint32_t>(128 / size), map.box[1] = static_cast<std::uint32_t>(box_rows), map.box[2] = 1, map.box[3] = 1;
  return map;
}

KernelArgs pack_attention_arguments(const std::vector<cuda::AttentionParam>& params, const ops::AttentionArgs& args,
                                    const void* cu_seqlens_q, const void* cu_seqlens_k,
                                    TensorMap (*encode)(const TensorMapDescription&), const AttentionDecodeSplit* decode,
                                    const AttentionWork* work) {
  KernelArgs packed;
  for (const cuda::AttentionParam& p : params)
    pack_attention_argument(packed, p, args, cu_seqlens_q, cu_seqlens_k, encode, decode, work);
  return packed;
}

void pack_attention_argument(KernelArgs& packed, const cuda::AttentionParam& p, const ops::AttentionArgs& args,
                             const void* cu_seqlens_q, const void* cu_seqlens_k, TensorMap (*encode)(const TensorMapDescription&),
                             const AttentionDecodeSplit* decode, const AttentionWork* work) {
  const auto i64 = [&](std::int64_t value) { packed.add(static_cast<long long>(value)); };
  const auto i32 = [&](std::int64_t value) { packed.add(static_cast<int>(value)); };
  switch (p.role) {  // the persistent form's own
    case Role::work_counter:
    case Role::row_blocks:
      if (!work || !work->counter) throw InvalidArgument("attention: parameter " + p.name + " is the persistent form's: its work is not given");
      if (p.role == Role::work_counter) packed.add(address(work->counter));
      else i32(work->row_blocks);
      return;
    case Role::sequences: i32(args.N); return;
    default: break;
  }
  switch (p.role) {  // the decode form's own
    case Role::partial_o:
    case Role::partial_lse:
    case Role::partial_rows:
    case Role::split_len:
    case Role::kv_splits:
      if (!decode) throw InvalidArgument("attention: parameter " + p.name + " is the decode form's: its splits are not given");
      if (p.role == Role::partial_o) packed.add(address(decode->o_part));
      if (p.role == Role::partial_lse) packed.add(address(decode->lse_part));
      if (p.role == Role::partial_rows) i32(decode->partial_rows);
      if (p.role == Role::split_len) i32(decode->split_len);
      if (p.role == Role::kv_splits) i32(decode->splits);
      return;
    default: break;
  }
  {
    const TensorView* view = p.input >= 0 ? &args.tensors[p.input] : nullptr;
    switch (p.role) {
      case Role::input:
        if (p.type == cuda::AttentionParam::Type::f32) packed.add(args.scalars[p.input]);
        else packed.add(address(view->data));
        break;
      // q, k, v [B,T,X,D]; pair inputs [B,H,Tq,Tk] (i as "t", j as "d"); head inputs [B,H].
      case Role::input_stride_b: i64(view->strides[0]); break;
      case Role::input_stride_t: i64(view->strides[p.input < 3 ? 1 : 2]); break;
      case Role::input_stride_h: i64(view->strides[p.input < 3 ? 2 : 1]); break;
      case Role::input_stride_d: i64(view->strides[3]); break;
      case Role::input_heads: i32(view->shape[2]); break;
      case Role::output: packed.add(address(args.o.data)); break;
      case Role::output_stride_b: i64(args.o.strides[0]); break;
      case Role::output_stride_t: i64(args.o.strides[1]); break;
      case Role::output_stride_h: i64(args.o.strides[2]); break;
      case Role::output_stride_d: i64(args.o.strides[3]); break;
      case Role::lse: packed.add(address(args.lse->data)); break;
      case Role::q_segment_ids: packed.add(address(args.q_segment_ids->data)); break;
      case Role::q_segment_stride_b: i64(args.q_segment_ids->strides[0]); break;
      case Role::q_segment_stride_t: i64(args.q_segment_ids->strides[1]); break;
      case Role::kv_segment_ids: packed.add(address(args.kv_segment_ids->data)); break;
      case Role::kv_segment_stride_b: i64(args.kv_segment_ids->strides[0]); break;
      case Role::kv_segment_stride_t: i64(args.kv_segment_ids->strides[1]); break;
      case Role::softmax_aux: packed.add(address(args.softmax_aux->data)); break;
      case Role::softmax_aux_stride_h: i64(args.softmax_aux->strides[0]); break;
      case Role::softmax_aux_stride_s: i64(args.softmax_aux->strides[1]); break;
      case Role::sinks: i32(args.sinks); break;
      case Role::cu_seqlens_q: packed.add(address(cu_seqlens_q)); break;
      case Role::cu_seqlens_k: packed.add(address(cu_seqlens_k)); break;
      case Role::window_left: i64(args.window_left); break;
      case Role::window_right: i64(args.window_right); break;
      case Role::dropout_p: packed.add(args.dropout_p); break;
      case Role::seed: packed.add(static_cast<unsigned long long>(args.seed)); break;
      case Role::batch: i32(args.B); break;
      case Role::q_tokens: i32(args.Tq); break;
      case Role::k_tokens: i32(args.Tk); break;
      case Role::heads: i32(args.H); break;
      case Role::tensor_map: packed.add(encode(attention_tensor_map(*view, p.box_rows))); break;
      default: throw InvalidArgument("attention: parameter " + p.name + " is the backward's (pack_attention_backward_arguments)");
    }
  }
}

namespace {

// The decode form: the split kernel into fp32 partials on the call's stream, then the merge.
void launch_decode(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const LaunchOptions& launch,
                   const detail::LoadedKernel<cuda::AttentionKernel>& loaded, const AttentionPlan& plan, const void* cu_q,
                   const void* cu_k) {
  const cuda::AttentionKernel& kernel = loaded.kernel;
  if (!loaded.merge) throw Error(op_name(variant) + ": the decode kernel " + kernel.name + " has no merge kernel");
  AttentionDecodeSplit split = plan.split;
  const std::int64_t rows = args.N * args.H * split.partial_rows, group = args.H / args.H_kv;
  const DeviceBuffer o_part = DeviceBuffer::on_stream(static_cast<std::size_t>(split.splits * rows * args.Dv) * sizeof(float), launch.stream);
  const DeviceBuffer lse_part = DeviceBuffer::on_stream(static_cast<std::size_t>(split.splits * rows) * sizeof(float), launch.stream);
  split.o_part = reinterpret_cast<const void*>(o_part.device_ptr());
  split.lse_part = reinterpret_cast<const void*>(lse_part.device_ptr());
  cuda::AttentionGrid grid;
  try {
    grid = cuda::attention_decode_grid(split.splits, (args.longest_q() * group + kernel.block_m - 1) / kernel.block_m, args.N * args.H_kv);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {} sequences x {} key/value heads, {} query rows of {} heads each: {}", op_name(variant), args.N,
                                      args.H_kv, args.longest_q(), group, e.what()));
  }
  KernelArgs packed = pack_attention_arguments(kernel.params, args, cu_q, cu_k, encode_tensor_map, &split);
  loaded.function->launch({grid.x, grid.y, grid.z}, {kernel.threads, 1, 1}, packed, static_cast<unsigned>(kernel.shared_bytes),
                          launch.stream);
  KernelArgs merged = pack_attention_arguments(kernel.merge_params, args, cu_q, cu_k, encode_tensor_map, &split);
  loaded.merge->launch({cuda::attention_merge_blocks(rows), 1, 1}, {cuda::attention_merge_threads, 1, 1}, merged, 0, launch.stream);
}

void launch_attention(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const LaunchOptions& launch,
                      const std::optional<cuda::AttentionTile>& tile) {
  const std::string op = op_name(variant);
  if (args.lse) {
    const TensorView& lse = *args.lse;
    const bool dense = lse.strides.back() == 1 && (lse.rank() < 2 || lse.strides[lse.rank() - 2] == lse.shape.back());
    if (!dense) throw InvalidArgument(op + ": lse must be contiguous on the GPU");
  }
  if (args.softmax_aux && args.softmax_aux->rank() != 2)
    throw InvalidArgument(op + ": softmax_aux must be bound as [H,S] on the GPU");
  const std::int64_t rows = args.longest_q();
  if (args.N * args.H == 0 || rows == 0) return;
  if (args.Tq > INT32_MAX || args.Tk > INT32_MAX)
    throw InvalidArgument(fmt::format("{}: Tq = {}, Tk = {}: the GPU kernel indexes tokens with 32-bit ints", op, args.Tq, args.Tk));

  // No tile named: the tuned one (LADLE_AUTOTUNE; heuristic: the heuristic tile, nothing built; a
  // decode tile untuned).
  const AttentionPlan plan =
      plan_attention(variant, args, tile ? *tile : tuned_attention_tile(variant, args, heuristic_attention_tile(args)), device_target());
  const cuda::AttentionKernelSpec& spec = plan.spec;
  const std::string arch = Device::get().properties().arch();
  const auto& loaded = detail::loaded_kernel<cuda::AttentionKernel>(
      spec_key(variant, spec), arch, [&](const std::string& target) { return compile_attention(variant, spec, target); });

  DeviceBuffer offsets_q, offsets_k;
  if (spec.varlen) {
    offsets_q = DeviceBuffer(args.cu_seqlens_q.size() * sizeof(std::int64_t));
    offsets_q.copy_from_host(args.cu_seqlens_q.data(), offsets_q.bytes(), 0, launch.stream);
    offsets_k = DeviceBuffer(args.cu_seqlens_k.size() * sizeof(std::int64_t));
    offsets_k.copy_from_host(args.cu_seqlens_k.data(), offsets_k.bytes(), 0, launch.stream);
  }
  const void* cu_q = reinterpret_cast<const void*>(offsets_q.device_ptr());
  const void* cu_k = reinterpret_cast<const void*>(offsets_k.device_ptr());
  if (plan.form == AttentionPlan::Form::decode) {
    launch_decode(variant, args, launch, loaded, plan, cu_q, cu_k);
  } else if (plan.form == AttentionPlan::Form::persistent) {
    // A block an SM walking the work items; the counter that hands them out starts at 0.
    AttentionWork work;
    work.row_blocks = plan.row_blocks;
    DeviceBuffer counter = DeviceBuffer::on_stream(sizeof(unsigned), launch.stream);
    counter.fill_bytes(0, launch.stream);
    work.counter = reinterpret_cast<void*>(counter.device_ptr());
    KernelArgs packed = pack_attention_arguments(loaded.kernel.params, args, cu_q, cu_k, encode_tensor_map, nullptr, &work);
    const unsigned blocks = cuda::attention_persistent_blocks(work.items(args), Device::get().properties().sm_count);
    loaded.function->launch({blocks, 1, 1}, {loaded.kernel.threads, 1, 1}, packed, static_cast<unsigned>(loaded.kernel.shared_bytes),
                            launch.stream);
  } else {
    KernelArgs packed = pack_attention_arguments(loaded.kernel.params, args, cu_q, cu_k);
    cuda::AttentionGrid grid;
    try {
      grid = cuda::attention_grid(args.N * args.H, plan.row_blocks);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{}: {} sequences x {} heads, {} query rows in blocks of {}: {}", op_name(variant), args.N,
                                        args.H, rows, loaded.kernel.block_m, e.what()));
    }
    loaded.function->launch({grid.x, grid.y, grid.z}, {loaded.kernel.threads, 1, 1}, packed,
                            static_cast<unsigned>(loaded.kernel.shared_bytes), launch.stream);
  }
  if (spec.varlen) {
    // The offsets are freed on return: wait until the kernel has read them.
    if (launch.stream) launch.stream->synchronize();
    else Device::get().synchronize();
  }
}

}  // namespace

void run_attention_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const LaunchOptions& launch) {
  launch_attention(variant, args, launch, std::nullopt);
}

void run_attention_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const LaunchOptions& launch,
                        const cuda::AttentionTile& tile) {
  launch_attention(variant, args, launch, tile);
}

}  // namespace ladle::gpu
