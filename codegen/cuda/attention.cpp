#include "attention.h"

#include <set>
#include <tuple>

#include <ladle/runtime/error.h>

#include "detail/attention_helpers.h"
#include "detail/attention_parts.h"
#include "detail/cuda_source.h"
#include "detail/hoist.h"
#include "../render_c.h"

namespace ladle::cuda {

using namespace detail;

namespace {


int pad16(int x) { return (x + 15) / 16 * 16; }

bool sixteen_bit(DType t) { return t == DType::f16 || t == DType::bf16; }

// The 16-bit operand type of a product: f16 when both factors are f16, else bf16 (fp32
// inputs are split into two bf16 halves).
struct Operands {
  bool qk_f16 = false, pv_f16 = false;
  bool split = false;  // fp32 q, k or v: hi + lo bf16 pairs
  bool async = false;  // cp.async: q, k, v of one 16-bit type, unit stride over the head dim
};

Operands operands(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec) {
  const DType q = spec.input_types[0], k = spec.input_types[1], v = spec.input_types[2];
  Operands o;
  o.split = attention_split_f32(variant, spec);
  o.qk_f16 = !o.split && q == DType::f16 && k == DType::f16;
  o.pv_f16 = !o.split && v == DType::f16;
  o.async = spec.async_copy && sixteen_bit(q) && q == k && k == v && spec.D % 8 == 0 && spec.Dv % 8 == 0;
  return o;
}

}  // namespace

bool attention_split_f32(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec) {
  (void)variant;
  for (int i = 0; i < 3 && i < static_cast<int>(spec.input_types.size()); ++i)
    if (spec.input_types[i] == DType::f32) return true;
  return false;
}

std::optional<double> attention_logit_factor(const ir::AttentionVariant& variant, const std::vector<float>& scalars) {
  // The split (fp32) and 16-bit forms differ in their tanh argument only, not in the factor.
  const HoistedExpression hoisted = hoist_invariants(variant.inputs, variant.score, 1.4426950408889634, 1.0);
  const std::optional<LeadingFactor> lead = leading_factor(hoisted);
  if (!lead) return std::nullopt;
  return scalar_value(hoisted, lead->factor, scalars);
}

AttentionGrid attention_grid(std::int64_t heads, std::int64_t blocks) {
  if (heads < 1 || blocks < 1)
    throw InvalidArgument("attention_grid: heads = " + std::to_string(heads) + ", blocks = " + std::to_string(blocks) + ", expected positive");
  const std::int64_t group = heads % 4 == 0 ? 4 : heads % 2 == 0 ? 2 : 1;
  if (blocks > 65535 || heads / group > 65535)
    throw InvalidArgument("attention_grid: " + std::to_string(blocks) + " blocks of a head and " + std::to_string(heads / group) +
                          " groups of " + std::to_string(group) + " heads; the grid takes at most 65535 of each");
  return {static_cast<unsigned>(group), static_cast<unsigned>(blocks), static_cast<unsigned>(heads / group)};
}

unsigned attention_persistent_blocks(std::int64_t items, int sms) {
  if (items < 1 || sms < 1 || items > INT32_MAX)
    throw InvalidArgument("attention_persistent_blocks: items = " + std::to_string(items) + ", sms = " + std::to_string(sms) +
                          ", expected 1 to 2^31 - 1 items and a positive SM count");
  return static_cast<unsigned>(items < sms ? items : sms);
}

namespace {

// What every part of the kernel's text reads.
struct Forward {
  const ir::AttentionVariant& variant;
  const AttentionKernelSpec& spec;
  const AttentionTile& tile;
  Operands ops;
  bool ws;     // the warp-specialised TMA pipeline
  bool wgmma;  // the products on wgmma (ws included)
  bool decode;  // mma.sync with a group's heads as rows and the keys split (a merge kernel after)
  int threads;
  int producer_registers, consumer_registers;  // ws with two consumer warpgroups: setmaxnreg
  std::vector<std::string> id;                 // the inputs' C names
  std::vector<bool> used;                      // the inputs the score or keep expression reads
};

// The logit and keep expressions as the key loop renders them.
struct Logit {
  HoistedExpression hoisted;
  bool folded = false;     // expression is rest, of the logit factor * rest
  std::string expression;  // log2 e * the score expression (or its rest)
  std::string factor;      // folded: the positive leading factor
  std::string keep;        // empty: no user predicate
};

[[noreturn]] void fail(const std::string& what) { throw InvalidArgument("generate_attention: " + what); }

// The spec's checks against the variant and the tile (throws InvalidArgument); its operand types.
Operands checked_operands(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec) {
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (spec.input_types.size() != variant.inputs.size())
    fail("input_types has " + std::to_string(spec.input_types.size()) + " entries, expected one per input (" +
         std::to_string(variant.inputs.size()) + ")");
  for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
    const DType t = spec.input_types[i];
    const bool mask_like = variant.inputs[i].kind == ir::InputKind::pair && t == DType::u8;
    if (variant.inputs[i].kind != ir::InputKind::scalar && !floating(t) && !mask_like)
      fail("input " + variant.inputs[i].name + " has dtype " + dtype_name(t) + ", expected f32, f16 or bf16");
  }
  if (!floating(spec.output_type)) fail(std::string("output_type ") + dtype_name(spec.output_type) + ", expected f32, f16 or bf16");
  for (DType t : {spec.q_segment_ids_type, spec.kv_segment_ids_type})
    if (t != DType::i32 && t != DType::i64)
      fail(std::string("segment ids of dtype ") + dtype_name(t) + ", expected i32 or i64");
  if (!floating(spec.sinks_type)) fail(std::string("sinks_type ") + dtype_name(spec.sinks_type) + ", expected f32, f16 or bf16");
  const Operands ops = operands(variant, spec);
  if (const auto problems = validate_attention_tile(spec.tile, spec.D, spec.Dv, 0, ops.split, spec.arch); !problems.empty())
    fail("tile " + to_string(spec.tile) + " at D=" + std::to_string(spec.D) + " Dv=" + std::to_string(spec.Dv) + ": " +
         problems.front());
  if (spec.tile.mma == AttentionMma::decode && variant.dropout)
    fail("tile " + to_string(spec.tile) + " is the decode form, which draws no dropout (an inference path): use an mma=sync tile");
  if (spec.persistent && spec.tile.mma != AttentionMma::ws)
    fail("persistent is set with tile " + to_string(spec.tile) + ": only the ws pipeline has a persistent form");
  if (spec.tile.mma == AttentionMma::ws && !ops.async)
    fail("tile " + to_string(spec.tile) + " copies q, k, v with TMA: they must be of one 16-bit type with 16-byte aligned rows "
         "and a unit stride over the head dim (async_copy), here they are not");
  return ops;
}

std::vector<bool> inputs_read(const ir::AttentionVariant& variant) {
  std::vector<bool> used(variant.inputs.size(), false);
  for (const ir::Expr* e : {&variant.score, &variant.keep})
    for (const ir::Node& node : e->nodes)
      if (node.op == ir::Op::input) used[node.input] = true;
  return used;
}

std::string storage(DType t) { return t == DType::u8 ? "unsigned char" : storage_type(t); }

// The kernel's parameters, into kernel.params; returns their declarations.
std::vector<std::string> declare_params(const Forward& f, AttentionKernel& kernel) {
  const AttentionKernelSpec& spec = f.spec;
  std::vector<std::string> declarations;
  using Role = AttentionParam::Role;
  using Type = AttentionParam::Type;
  const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role, int input = -1) {
    declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
    kernel.params.push_back({name, c_type, type, role, input});
  };
  for (std::size_t k = 0; k < f.variant.inputs.size(); ++k) {
    const ir::Input& in = f.variant.inputs[k];
    const int index = static_cast<int>(k);
    const std::string& name = f.id[k];
    if (in.kind == ir::InputKind::scalar) {
      param("float", name, Type::f32, Role::input, index);
      continue;
    }
    param("const " + storage(spec.input_types[k]) + "*", name, Type::pointer, Role::input, index);
    param("long long", name + "_stride_b", Type::i64, Role::input_stride_b, index);
    if (in.kind != ir::InputKind::head) param("long long", name + "_stride_t", Type::i64, Role::input_stride_t, index);
    param("long long", name + "_stride_h", Type::i64, Role::input_stride_h, index);
    if (in.kind != ir::InputKind::head) param("long long", name + "_stride_d", Type::i64, Role::input_stride_d, index);
    if (in.role == ir::Role::key) param("int", name + "_heads", Type::i32, Role::input_heads, index);
  }
  if (f.ws)
    for (const auto& [name, index, rows] : {std::tuple{"q_map", 0, f.tile.block_m}, std::tuple{"k_map", 1, f.tile.block_n},
                                            std::tuple{"v_map", 2, f.tile.block_n}}) {
      declarations.push_back(std::string("const __grid_constant__ ladle_tensor_map ") + name);
      kernel.params.push_back({name, "ladle_tensor_map", Type::tensor_map, Role::tensor_map, index, rows});
    }
  const auto add = [&](const std::string& c_type, const std::string& name, Type type, Role role) { param(c_type, name, type, role); };
  if (f.decode) declare_decode_params(add);  // partial results; the merge kernel takes o, lse and the sinks
  else declare_output_params(add, f.variant, spec);
  declare_mask_params(param, f.variant, spec.q_segment_ids_type, spec.kv_segment_ids_type, spec.varlen);
  param("int", "B", Type::i32, Role::batch);
  param("int", "Tq", Type::i32, Role::q_tokens);
  param("int", "Tk", Type::i32, Role::k_tokens);
  param("int", "H", Type::i32, Role::heads);
  if (spec.persistent) {
    param("unsigned*", "work_counter", Type::pointer, Role::work_counter);
    param("int", "row_blocks", Type::i32, Role::row_blocks);
    param("int", "sequences", Type::i32, Role::sequences);
  }
  return declarations;
}

// ---- The expressions, rendered at one (i, j) of the tile

ir::LoadFn input_load(const std::vector<std::string>& id) {
  return [&id](const ir::Input& in, std::int32_t k) -> std::string {
    switch (in.kind) {
      case ir::InputKind::pair:
        return "ladle_load(" + id[k] + "_row[r / 2] + (k_bos + j) * " + id[k] + "_stride_d)";
      case ir::InputKind::head: return id[k] + "_value";
      case ir::InputKind::scalar: return id[k];
      default: break;  // validate() keeps token inputs other than q, k, v out of the expressions
    }
    return "0.0f";
  };
}

std::string leaf_at(ir::Op op) { return attention_leaf(op, "score[nt][r]"); }

Logit render_logit(const Forward& f) {
  const auto& inputs = f.variant.inputs;
  const ir::LoadFn load = input_load(f.id);
  // The logit in log2 units, log2 e * score expression, with its invariant factors hoisted out of
  // the key loop (detail/hoist.h: a soft cap costs one multiply, not a division, before its
  // tanh). tanh: with 16-bit operands the hardware's tanh.approx.f32 (one MUFU operation,
  // relative error 2^-11, below what bf16 / f16 P and o round away); with fp32 operands
  // (split into bf16 pairs for fp32 accuracy) ladle_tanh_exp2, 1 - 2 / (2^y + 1) with y the
  // argument times 2 log2 e, which the rewrite folds into the hoisted factor before it.
  constexpr double log2e = 1.4426950408889634;
  const bool approximate_tanh = !f.ops.split;
  Logit logit;
  logit.hoisted = hoist_invariants(inputs, f.variant.score, log2e, approximate_tanh ? 1.0 : 2.0 * log2e);
  const HoistedExpression& hoisted = logit.hoisted;
  const auto hoisted_load = [&](const ir::Input& in, std::int32_t k) -> std::string {
    return static_cast<std::size_t>(k) >= hoisted.first_hoisted ? in.name : load(in, k);
  };
  ir::RenderFunctions functions;
  functions.tanh = approximate_tanh ? "ladle_tanh_approx" : "ladle_tanh_exp2";
  // A logit factor * rest whose factor is positive (a constant, or scalars the launcher checked:
  // positive_logit_factor): the kernel works in rest's units and folds the factor into p's FFMA.
  const std::optional<LeadingFactor> lead = leading_factor(hoisted);
  const std::vector<float> unit_scalars(inputs.size(), 1.0f);
  const bool scalar_factor = lead && scalar_value(hoisted, lead->factor, unit_scalars).has_value();
  if (f.spec.positive_logit_factor && !scalar_factor)
    throw InvalidArgument("generate_attention: positive_logit_factor is set but the logit " + ir::to_string(inputs, f.variant.score) +
                          " has no leading factor of scalars and constants (attention_logit_factor gives none)");
  // mma.sync tiles keep the whole logit: there the fold's extra registers spill, and its gain is on
  // the Hopper tiles.
  logit.folded = f.wgmma && scalar_factor &&
                 (f.spec.positive_logit_factor || scalar_value(hoisted, lead->factor, {}).value_or(0.0) > 0.0);
  logit.expression =
      ir::render_c(hoisted.inputs, logit.folded ? subtree(hoisted.expr, lead->rest) : hoisted.expr, hoisted_load, leaf_at, functions);
  logit.factor =
      logit.folded ? ir::render_c(hoisted.inputs, subtree(hoisted.expr, lead->factor), hoisted_load, leaf_at, functions) : "";
  functions.tanh = "ladle_tanh";
  logit.keep = f.variant.keep.empty() ? "" : ir::render_c(inputs, f.variant.keep, load, leaf_at, functions);
  return logit;
}

// ---- The kernel's text

// The comment block at the top of the source: the variant, the tile, the launch, the operand types.
std::string header_text(const Forward& f, const AttentionKernel& kernel) {
  const AttentionKernelSpec& spec = f.spec;
  const AttentionTile& tile = f.tile;
  const auto& inputs = f.variant.inputs;
  const std::string qk_type = f.ops.split ? "bf16 hi+lo (fp32 inputs split)" : f.ops.qk_f16 ? "f16" : "bf16";
  const std::string pv_type = f.ops.split ? "bf16 hi+lo (fp32 inputs split)" : f.ops.pv_f16 ? "f16" : "bf16";
  std::string header = "ladle: attention kernel " + kernel.name + "\nGenerated by codegen/cuda/attention.cpp; do not edit.\n\n";
  header += ir::to_string(f.variant);
  header += "\nlogit = " + ir::to_string(inputs, f.variant.score) + "\n";
  if (!f.variant.keep.empty()) header += "keep  = " + ir::to_string(inputs, f.variant.keep) + "\n";
  header += "config: " + to_string(tile) + " (" + std::to_string(f.threads) + " threads), D=" + std::to_string(spec.D) +
            " Dv=" + std::to_string(spec.Dv) + "\n";
  if (f.decode)
    header += "launch: grid attention_decode_grid(splits, ceil(Tq G / " + std::to_string(tile.block_m) + "), N * H_kv), block (" +
              std::to_string(f.threads) + "), dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes; then " +
              kernel.merge_name + ": grid attention_merge_blocks(N * H * Tq), block (" + std::to_string(attention_merge_threads) + ")\n" +
              "decode: the query heads of a GQA group are the rows (row = token * G + g, G = H / H_kv), so K and V are read\n"
              "once per group; the keys are split over gridDim.x, split_len keys each; the merge weighs the splits by lse.\n";
  else if (spec.persistent)
    header += "launch: grid attention_persistent_blocks(N * H * row_blocks, SMs), row_blocks = ceil(Tq / " + std::to_string(tile.block_m) +
              "), work_counter zeroed, block (" + std::to_string(f.threads) + "), dynamic shared memory " +
              std::to_string(kernel.shared_bytes) + " bytes\npersistent: a block walks work items (a row block of one (sequence, head)) "
              "handed out by work_counter, the next item's copies under this one's end\n";
  else
    header += "launch: grid attention_grid(N * H, ceil(Tq / " + std::to_string(tile.block_m) + "))" + ", block (" + std::to_string(f.threads) +
              "), dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes\n";
  std::string types;
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].kind != ir::InputKind::scalar) types += f.id[k] + " " + dtype_name(spec.input_types[k]) + ", ";
  header += "types: " + types + "o " + dtype_name(spec.output_type) + "; score = q k^T with " + qk_type +
            " operands, o_acc += P V with " + pv_type + " operands, fp32 accumulation and softmax\n";
  header += f.wgmma ? "tensor cores: wgmma.mma_async m64n" + std::to_string(tile.block_n) + "k16 (q, k from shared memory) and m64n" +
                          std::to_string(pad16(spec.Dv)) + "k16 (P from registers, V N-major), sm_90a; one warpgroup per 64 rows\n"
                    : std::string("tensor cores: mma.sync m16n8k16 (sm_80 and later)\n");
  if (f.ws) {
    header += "pipeline: warp-specialised. Warpgroup 0 produces: TMA (cp.async.bulk.tensor, 128-byte swizzle) copies q once\n"
              "and K, V into a ring of " + std::to_string(tile.stages) + " stages, each guarded by mbarriers (full: the bytes landed;\n"
              "empty: every consumer warp released it). Warpgroups 1.." + std::to_string(tile.warps / 4) +
              " consume, 64 rows each: tile t's q k^T and tile t-1's P V in flight\n"
              "together, tile t's softmax while P V finishes." +
              (f.consumer_registers ? " setmaxnreg: producer " + std::to_string(f.producer_registers) + ", consumers " +
                                          std::to_string(f.consumer_registers) + " registers per thread."
                                    : std::string()) + "\n";
  } else {
    header += std::string("K/V staging: ") + (f.ops.async ? "cp.async, 16 bytes per copy" : "loads converted in registers") +
              (tile.stages > 2 ? ", a ring of " + std::to_string(tile.stages) + " stages" : tile.stages == 2 ? ", double-buffered" : ", single buffer") + "\n";
  }
  header += std::string("varlen=") + (spec.varlen ? "1" : "0") + " lse=" + (spec.lse ? "1" : "0") + "\n";
  header += "GQA: query head h reads key/value head h / (H / H_kv).\n";
  return header;
}

// ws at value head dims to 64 without dropout sums each row's p on the tensor cores
// (AttentionParts::tensor_sums): there the softmax's instructions, not the products, bound the key
// loop, and one FADD a score less took causal B8 T4096 D = 64 from 0.785-0.825 to 0.749-0.763 ms on
// the H200; at D = 128 it gained nothing (causal) or cost 3-5 % (window + soft cap), so it stays off
// there (bench/RESULTS.md, "Issue 38: ... (stop 58)"). Dropout's denominator keeps the p its product
// with V drops, so it sums them one by one.
bool tensor_sums(const Forward& f) { return f.ws && !f.variant.dropout && f.spec.Dv <= 64; }

// The device helpers the kernel calls (each guarded, so that a host emulation may define its own).
std::string device_helpers(const Forward& f) {
  return storage_helpers + std::string(tensor_core_helpers) + attention_helpers +
         (f.wgmma ? wgmma_helpers(f.tile.block_n, pad16(f.spec.Dv), f.ops.qk_f16, f.ops.pv_f16) : std::string()) +
         (tensor_sums(f) ? wgmma_product(true, 8, f.ops.pv_f16, false, false) : std::string()) + (f.ws ? ws_helpers() : std::string());
}

// The signature, the tile's constants and this thread's place in its warp and warpgroup.
void emit_signature(Code& c, const Forward& f, const std::string& name, const std::vector<std::string>& declarations) {
  const AttentionTile& tile = f.tile;
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(f.threads) + (f.ws ? ", 1" : "") + ") " + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  if (f.decode) {  // the warps of a row group split each key tile: BN keys a warp of BN_TILE staged
    c("constexpr int BM = " + std::to_string(tile.block_m) + ", BN_TILE = " + std::to_string(tile.block_n) + ", WARPS = " +
      std::to_string(tile.warps) + ", THREADS = 32 * WARPS, STAGES = " + std::to_string(tile.stages) + ";");
    c("constexpr int ROW_WARPS = BM / 16, KEY_WARPS = WARPS / ROW_WARPS, BN = BN_TILE / KEY_WARPS;");
  } else {
    c("constexpr int BM = " + std::to_string(tile.block_m) + ", BN = " + std::to_string(tile.block_n) + ", WARPS = " +
      std::to_string(tile.warps) + ", THREADS = 32 * WARPS, STAGES = " + std::to_string(tile.stages) + ";");
  }
  c("constexpr int D = " + std::to_string(f.spec.D) + ", DV = " + std::to_string(f.spec.Dv) +
    ";  // head dims");
  c("constexpr int DP = " + std::to_string(pad16(f.spec.D)) + ", DVP = " + std::to_string(pad16(f.spec.Dv)) +
    ";  // rounded up to the tensor-core step (zero columns past D, DV)");
  if (f.ws) c("// Tiles as TMA writes them: boxes of 64 head-dim columns (below).");
  else if (f.wgmma) c("constexpr int KLD = DP, VLD = DVP;  // tiles of 8 x 8 core matrices, no padding");
  else c("constexpr int KLD = DP + 8, VLD = DVP + 8;  // padded rows: conflict-free ldmatrix");
  c("constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;");
  if (f.ws) {
    c("// Warpgroup 0 is the producer; warp w >= 4 is consumer warp w - 4.");
    c("const int lane = threadIdx.x % 32, warp = static_cast<int>(threadIdx.x / 32) - 4, gid = lane / 4, tig = lane % 4;");
  } else {
    c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, tig = lane % 4;");
  }
  if (f.decode) c("const int row_warp = warp % ROW_WARPS, key_warp = warp / ROW_WARPS;  // rows row_warp * 16.., keys key_warp * BN.. of a tile");
  if (f.wgmma) {
    c("// Owns rows 64 * warpgroup.. of the block (warp: 16 of them); read through a shuffle so that the");
    c("// compiler knows it is warp-uniform and keeps the descriptors built from it in uniform registers.");
    c("const int warpgroup = ladle_warp_uniform(warp / 4);");
  }
}

// The block's rows, head and sequence, and the key tiles its rows may attend.
void emit_block_range(Code& c, const Forward& f) {
  // Under a causal mask the last row blocks see the most keys: a group's start first, so that the
  // light ones fill the tail of the grid instead of the heavy ones.
  const bool longest_first = f.variant.causal && !f.spec.varlen;
  if (f.spec.persistent) {
    c("// Work item `item` in the order attention_grid's blocks run: a group's heads (4, 2 or 1, what divides");
    c("// N * H), then the row blocks, then the groups.");
    c("const int group = (sequences * H) % 4 == 0 ? 4 : (sequences * H) % 2 == 0 ? 2 : 1;");
    c("const int row_block = item / group % row_blocks;");
    c(longest_first ? "const int m0 = (row_blocks - 1 - row_block) * BM;" : "const int m0 = row_block * BM;");
    c("const unsigned head = item / (group * row_blocks) * group + item % group;");
  } else {
    // The grid (attention_grid): x a group's heads, y the row blocks, z the groups. (Unsigned, as the
    // signed forms cost the mma.sync kernel a spill.)
    c(longest_first ? "const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;" : "const int m0 = blockIdx.y * BM;");
    c("const unsigned head = blockIdx.z * gridDim.x + blockIdx.x;");
  }
  c("const int n = head / H, h = head % H;");
  c("");
  emit_attention_sequence(c, f.spec.varlen);
  if (!f.spec.persistent) c("if (m0 >= q_len) return;");  // persistent: the caller skips the item
  c("const int hk = h / (H / " + f.id[1] + "_heads);");
  c("");
  c("// The keys any row of this block may attend: the causal / window range of rows m0..row_last");
  c("// around the diagonal j = i + (k_len - q_len). Tiles outside it are never loaded.");
  c("const int diagonal = k_len - q_len, row_last = (m0 + BM < q_len ? m0 + BM : q_len) - 1;");
  c("long long key_begin = 0, key_end = k_len;");
  emit_key_range(c, f.variant, "m0", "row_last", "key_begin", "key_end");
  c("const int tile_begin = static_cast<int>(key_begin / BN);");
  c("const int tile_end = key_end > key_begin ? static_cast<int>((key_end + BN - 1) / BN) : tile_begin;");
  c("");
}

// The sequences' q, K, V rows and the shared-memory tiles of the mma.sync and wgmma paths.
void emit_tiles(Code& c, const Forward& f) {
  const AttentionKernelSpec& spec = f.spec;
  const AttentionTile& tile = f.tile;
  const std::vector<std::string>& id = f.id;
  const std::string qt = storage_type(spec.input_types[0]), kt = storage_type(spec.input_types[1]),
                    vt = storage_type(spec.input_types[2]);
  if (!f.decode)  // decode: each row's own head (emit_q_tile)
    c("const " + qt + "* const q_seq = " + id[0] + " + b * " + id[0] + "_stride_b + q_bos * " + id[0] + "_stride_t + h * " +
      id[0] + "_stride_h;");
  c("const " + kt + "* const k_seq = " + id[1] + " + b * " + id[1] + "_stride_b + k_bos * " + id[1] + "_stride_t + hk * " +
    id[1] + "_stride_h;");
  c("const " + vt + "* const v_seq = " + id[2] + " + b * " + id[2] + "_stride_b + k_bos * " + id[2] + "_stride_t + hk * " +
    id[2] + "_stride_h;");
  c("");
  c("LADLE_DYNAMIC_SHARED(smem);");
  const auto offset = [](const std::string& base, int bytes) {
    return "reinterpret_cast<unsigned short*>(smem + " + base + std::to_string(bytes) + ")";
  };
  if (f.wgmma) {
    const auto align128 = [](int bytes) { return (bytes + 127) / 128 * 128; };
    const int q_bytes = align128(tile.block_m * pad16(spec.D) * 2), k_bytes = align128(tile.block_n * pad16(spec.D) * 2),
              v_bytes = align128(tile.block_n * pad16(spec.Dv) * 2);
    c("// The q tile [BM][DP] for the whole key loop, then per stage the K tile [BN][DP] and the V tile");
    c("// [BN][DVP], 16-bit, each as 8 x 8 core matrices of 128 contiguous bytes (wgmma's no-swizzle layout).");
    c("unsigned short* const q_tile = " + offset("", 0) + ";");
    c("unsigned short* const k_tile = " + offset("", q_bytes) + ";");
    c("unsigned short* const v_tile = " + offset("", q_bytes + k_bytes) + ";");
    c("constexpr int STAGE_ELEMENTS = " + std::to_string((k_bytes + v_bytes) / 2) + ";  // 16-bit elements between stages");
  } else {
    const int k_bytes = (tile.block_n * (pad16(spec.D) + 8) * 2 + 15) / 16 * 16,
              v_bytes = (tile.block_n * (pad16(spec.Dv) + 8) * 2 + 15) / 16 * 16;
    const int stage_bytes = (k_bytes + v_bytes) * (f.ops.split ? 2 : 1);
    c("// Per stage: the K tile [BN][KLD] and the V tile [BN][VLD], 16-bit" +
      std::string(f.ops.split ? ", each as hi then lo halves." : "."));
    c("unsigned short* const k_tile = " + offset("", 0) + ";");
    c("unsigned short* const v_tile = " + offset("", k_bytes) + ";");
    if (f.ops.split) {
      c("unsigned short* const k_tile_lo = " + offset("", k_bytes + v_bytes) + ";");
      c("unsigned short* const v_tile_lo = " + offset("", 2 * k_bytes + v_bytes) + ";");
    }
    c("constexpr int STAGE_ELEMENTS = " + std::to_string(stage_bytes / 2) + ";  // 16-bit elements between stages");
    c("// The q tile [BM][KLD] borrows the stages before the key loop.");
    c("unsigned short* const q_tile = " + offset("", 0) + ";");
    if (f.ops.split) c("unsigned short* const q_tile_lo = " + offset("", (tile.block_m * (pad16(spec.D) + 8) * 2 + 15) / 16 * 16) + ";");
  }
  c("");
}

// Staging of `rows` rows of a [T, X, width] input into a 16-bit tile (dst_lo: the lo halves of
// split fp32 inputs).
struct StagedRows {
  std::string src, input, dst, dst_lo, first_row, limit, rows, width, padded, ld;
  bool f16;
  std::string row_src = "", row_ok = "";  // row r's first element and whether it exists (default: src's rows first_row + r < limit)
};

void emit_stage_rows(Code& c, const Forward& f, const StagedRows& s) {
  const auto operand_bits = [](bool f16) { return f16 ? std::string("ladle_f16_bits") : std::string("ladle_bf16_bits"); };
  // Where (r, col) of the tile lives: padded rows of `ld`, or wgmma's core matrices.
  const std::string at = f.wgmma ? core_matrix_offset("r", "col", s.padded) : "r * " + s.ld + " + col";
  const std::string row_src = s.row_src.empty() ? s.src + " + (" + s.first_row + " + r) * " + s.input + "_stride_t" : s.row_src;
  const std::string row_ok = s.row_ok.empty() ? s.first_row + " + r < " + s.limit : s.row_ok;
  if (f.ops.async) {
    c("for (int e = threadIdx.x; e < " + s.rows + " * (" + s.padded + " / 8); e += THREADS) {");
    c.in();
    c("const int r = e / (" + s.padded + " / 8), col = e % (" + s.padded + " / 8) * 8;");
    c("unsigned short* const dst = " + s.dst + " + " + at + ";");
    c("if (" + row_ok + " && col < " + s.width + ") ladle_cp_async_16(dst, " + row_src + " + col);");
    c("else ladle_zero_16(dst);  // past the sequence or the head dim: zero, never garbage (0 * NaN would reach o)");
    c.out();
    c("}");
    return;
  }
  c("for (int e = threadIdx.x; e < " + s.rows + " * " + s.padded + "; e += THREADS) {");
  c.in();
  c("const int r = e / " + s.padded + ", col = e % " + s.padded + ";");
  c("const float x = " + row_ok + " && col < " + s.width + " ? ladle_load(" + row_src + " + col * " + s.input + "_stride_d) : 0.0f;");
  if (f.ops.split) {
    c("const unsigned short hi = ladle_bf16_bits(x);");
    c(s.dst + "[" + at + "] = hi;");
    c(s.dst_lo + "[" + at + "] = ladle_bf16_bits(x - ladle_bf16_float(hi));");
  } else {
    c(s.dst + "[" + at + "] = " + operand_bits(s.f16) + "(x);");
  }
  c.out();
  c("}");
}

// Step 1 of the mma.sync and wgmma paths: the q tile, in shared memory (wgmma) or fragments (mma.sync).
void emit_q_tile(Code& c, const Forward& f) {
  StagedRows q{"q_seq", f.id[0], "q_tile", "q_tile_lo", "m0", "q_len", "BM", "D", "DP", "KLD", f.ops.qk_f16};
  if (f.decode) {  // packed row m0 + r: token (m0 + r) / G of query head hk * G + (m0 + r) % G
    const std::string& x = f.id[0];
    q.row_src = "(" + x + " + b * " + x + "_stride_b + (q_bos + (m0 + r) / G) * " + x + "_stride_t + (hk * G + (m0 + r) % G) * " + x +
                "_stride_h)";
    q.row_ok = "m0 + r < rows";
  }
  if (f.wgmma) {
    c("// 1. The q tile into shared memory, where the score products read it for the whole key loop.");
    StagedRows shared = q;
    shared.dst_lo = "";
    emit_stage_rows(c, f, shared);
    if (f.ops.async) c("ladle_cp_async_commit();");
    c("");
    return;
  }
  c("// 1. The q fragments of this warp's 16 rows, kept in registers for the whole key loop.");
  emit_stage_rows(c, f, q);
  if (f.ops.async) {
    c("ladle_cp_async_commit();");
    c("ladle_cp_async_wait<0>();");
  }
  c("__syncthreads();");
  c("unsigned q_frag[DP / 16][4];");
  if (f.ops.split) c("unsigned q_frag_lo[DP / 16][4];");
  c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt) {");
  const std::string rows = f.decode ? "row_warp" : "warp";  // decode: the warps of a row group share its q rows
  c("  ladle_ldmatrix_x4(q_frag[kt], &q_tile[(" + rows + " * 16 + lane % 16) * KLD + kt * 16 + (lane / 16) * 8]);");
  if (f.ops.split) c("  ladle_ldmatrix_x4(q_frag_lo[kt], &q_tile_lo[(" + rows + " * 16 + lane % 16) * KLD + kt * 16 + (lane / 16) * 8]);");
  c("}");
  c("__syncthreads();  // the stages reuse the q tile's memory");
  c("");
}

// The state of this thread's two rows and what the logit reads once per row.
void emit_row_state(Code& c, const Forward& f, const Logit& logit) {
  const auto& inputs = f.variant.inputs;
  const std::vector<std::string>& id = f.id;
  c("// Per row of this thread (gid and gid + 8 of the warp's 16): whether it exists, its");
  c("// running maximum and sum of 2^(logit - max), and its o accumulator o_acc[DVP / 8][4].");
  c("const int row0 = m0 + warp * 16 + gid;");
  c("const bool row_live[2] = {row0 < q_len, row0 + 8 < q_len};");
  if (tensor_sums(f)) {
    c("float row_max[2] = {ladle_neg_inf(), ladle_neg_inf()};");
    c("float sum_acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};  // the rows' sums of p, from the tensor cores (P times ones)");
  } else {
    c("float row_max[2] = {ladle_neg_inf(), ladle_neg_inf()}, row_sum[2] = {0.0f, 0.0f};");
  }
  c("float o_acc[DVP / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) o_acc[nt][0] = o_acc[nt][1] = o_acc[nt][2] = o_acc[nt][3] = 0.0f;");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!f.used[k]) continue;
    if (inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h);");
    if (inputs[k].kind == ir::InputKind::pair) {
      c("// " + inputs[k].name + " at (b, h, this thread's rows), indexed by packed positions");
      c("const " + storage(f.spec.input_types[k]) + "* const " + id[k] + "_row[2] = {");
      c("    " + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h + (q_bos + row0) * " + id[k] + "_stride_t,");
      c("    " + id[k] + " + b * " + id[k] + "_stride_b + h * " + id[k] + "_stride_h + (q_bos + row0 + 8) * " + id[k] + "_stride_t};");
    }
  }
  if (f.variant.segment_ids) {
    c("const long long q_segment[2] = {");
    c("    row_live[0] ? static_cast<long long>(q_segment_ids[b * q_segment_stride_b + (q_bos + row0) * q_segment_stride_t]) : 0,");
    c("    row_live[1] ? static_cast<long long>(q_segment_ids[b * q_segment_stride_b + (q_bos + row0 + 8) * q_segment_stride_t]) : 0};");
  }
  if (f.variant.dropout) c("const float keep_scale = 1.0f / (1.0f - dropout_p);");
  const HoistedExpression& hoisted = logit.hoisted;
  if (!hoisted.invariants.empty()) {
    c("// The logit's factors that no (query, key) pair changes, once per thread (log2 units).");
    for (std::size_t k = 0; k < hoisted.invariants.size(); ++k)
      c("const float " + hoisted.inputs[hoisted.first_hoisted + k].name + " = " +
        ir::render_c(inputs, hoisted.invariants[k], input_load(id), leaf_at, ir::RenderFunctions{"ladle_tanh"}) + ";");
  }
  if (logit.folded) {
    c("// logit = ladle_logit_factor * rest (positive): logit[][] holds rest, the running maxima too.");
    c("const float ladle_logit_factor = " + logit.factor + ";");
  }
  c("");
}

// decode: the state of this thread's two packed rows, each with its own token and query head, and
// what the logit reads per row; returns the lines that open each element's scope in the logits.
std::vector<std::string> emit_decode_row_state(Code& c, const Forward& f, const Logit& logit) {
  const auto& inputs = f.variant.inputs;
  const std::vector<std::string>& id = f.id;
  std::vector<std::string> prelude{"const int h = row_head[r / 2];", "(void)h;"};
  c("// Per row of this thread (packed rows gid and gid + 8 of the warp's 16): whether it exists, its token");
  c("// and query head, its running maximum and sum of 2^(logit - max), and its o accumulator o_acc[DVP / 8][4].");
  c("const int row0 = m0 + row_warp * 16 + gid;");
  c("bool row_live[2];");
  c("int row_token[2], row_head[2];");
  c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("  row_live[half] = row0 + 8 * half < rows;");
  c("  row_token[half] = (row0 + 8 * half) / G;");
  c("  row_head[half] = hk * G + (row0 + 8 * half) % G;");
  c("}");
  c("float row_max[2] = {ladle_neg_inf(), ladle_neg_inf()}, row_sum[2] = {0.0f, 0.0f};");
  c("float o_acc[DVP / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < DVP / 8; ++nt) o_acc[nt][0] = o_acc[nt][1] = o_acc[nt][2] = o_acc[nt][3] = 0.0f;");
  std::vector<std::string> head_values;  // the lines that bind a head input's value to a row half
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!f.used[k]) continue;
    const std::string& x = id[k];
    if (inputs[k].kind == ir::InputKind::head) {
      c("const float " + x + "_per_row[2] = {ladle_load(" + x + " + b * " + x + "_stride_b + row_head[0] * " + x + "_stride_h), ladle_load(" +
        x + " + b * " + x + "_stride_b + row_head[1] * " + x + "_stride_h)};");
      prelude.push_back("const float " + x + "_value = " + x + "_per_row[r / 2];");
      prelude.push_back("(void)" + x + "_value;");
      head_values.push_back("const float " + x + "_value = " + x + "_per_row[half];");
    }
    if (inputs[k].kind == ir::InputKind::pair) {
      c("// " + inputs[k].name + " at (b, each row's head and token), indexed by packed positions");
      c("const " + storage(f.spec.input_types[k]) + "* " + x + "_row[2];");
      c("LADLE_UNROLL for (int half = 0; half < 2; ++half)");
      c("  " + x + "_row[half] = " + x + " + b * " + x + "_stride_b + row_head[half] * " + x + "_stride_h + (q_bos + row_token[half]) * " + x +
        "_stride_t;");
    }
  }
  if (f.variant.segment_ids) {
    c("long long q_segment[2];");
    c("LADLE_UNROLL for (int half = 0; half < 2; ++half)");
    c("  q_segment[half] = row_live[half] ? static_cast<long long>(q_segment_ids[b * q_segment_stride_b + (q_bos + row_token[half]) * "
      "q_segment_stride_t]) : 0;");
  }
  const HoistedExpression& hoisted = logit.hoisted;
  if (!hoisted.invariants.empty()) {
    c("// The logit's factors that no key changes, once per row (log2 units).");
    for (std::size_t k = 0; k < hoisted.invariants.size(); ++k) {
      const std::string& name = hoisted.inputs[hoisted.first_hoisted + k].name;
      c("float " + name + "_per_row[2];");
      c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c.in();
      c("const int h = row_head[half];");
      c("(void)h;");
      for (const std::string& line : head_values) c(line);
      c(name + "_per_row[half] = " + ir::render_c(inputs, hoisted.invariants[k], input_load(id), leaf_at, ir::RenderFunctions{"ladle_tanh"}) + ";");
      c.out();
      c("}");
      prelude.push_back("const float " + name + " = " + name + "_per_row[r / 2];");
      prelude.push_back("(void)" + name + ";");
    }
  }
  c("");
  return prelude;
}

// Step 3 on mma.sync: score = q k^T from the q fragments and the stage's K tile.
void emit_sync_scores(Code& c, const Forward& f) {
  const std::string qk_mma = f.ops.qk_f16 ? "ladle_mma_f16" : "ladle_mma_bf16";
  c("// 3. score = q k^T for this warp's 16 rows and the tile's BN keys.");
  c("float score[BN / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < BN / 8; ++nt) score[nt][0] = score[nt][1] = score[nt][2] = score[nt][3] = 0.0f;");
  c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt)");
  c("  LADLE_UNROLL for (int np = 0; np < BN / 16; ++np) {");
  c.in();
  c("  unsigned k_frag[4];");
  c("  ladle_ldmatrix_x4(k_frag, &k_s[(np * 16 + lane % 8 + (lane / 16) * 8) * KLD + kt * 16 + ((lane / 8) & 1) * 8]);");
  c("  " + qk_mma + "(score[2 * np], q_frag[kt], k_frag[0], k_frag[1]);");
  c("  " + qk_mma + "(score[2 * np + 1], q_frag[kt], k_frag[2], k_frag[3]);");
  if (f.ops.split) {
    c("  " + qk_mma + "(score[2 * np], q_frag_lo[kt], k_frag[0], k_frag[1]);  // lo q x hi k");
    c("  " + qk_mma + "(score[2 * np + 1], q_frag_lo[kt], k_frag[2], k_frag[3]);");
    c("  ladle_ldmatrix_x4(k_frag, &k_s_lo[(np * 16 + lane % 8 + (lane / 16) * 8) * KLD + kt * 16 + ((lane / 8) & 1) * 8]);");
    c("  " + qk_mma + "(score[2 * np], q_frag[kt], k_frag[0], k_frag[1]);  // hi q x lo k");
    c("  " + qk_mma + "(score[2 * np + 1], q_frag[kt], k_frag[2], k_frag[3]);");
  }
  c.out();
  c("  }");
  c("");
}

// Step 6 on mma.sync: o_acc += P V with P packed from p[BN / 8][4] (hi and lo halves when split).
void emit_sync_pv(Code& c, const Forward& f) {
  const std::string pv_mma = f.ops.pv_f16 ? "ladle_mma_f16" : "ladle_mma_bf16";
  c("// 6. o_acc += P V: P's accumulator layout is the A operand of the next product.");
  const std::string pack = f.ops.pv_f16 ? "ladle_pack_f16" : "ladle_pack_bf16";
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk) {");
  c.in();
  if (f.ops.split) {
    c("float p_hi[2][4], p_lo[2][4];");
    c("LADLE_UNROLL for (int e = 0; e < 8; ++e) {");
    c("  p_hi[e / 4][e % 4] = ladle_bf16_float(ladle_bf16_bits(p[2 * kk + e / 4][e % 4]));");
    c("  p_lo[e / 4][e % 4] = p[2 * kk + e / 4][e % 4] - p_hi[e / 4][e % 4];");
    c("}");
    c("const unsigned p_frag[4] = {ladle_pack_bf16(p_hi[0][0], p_hi[0][1]), ladle_pack_bf16(p_hi[0][2], p_hi[0][3]),");
    c("                            ladle_pack_bf16(p_hi[1][0], p_hi[1][1]), ladle_pack_bf16(p_hi[1][2], p_hi[1][3])};");
    c("const unsigned p_frag_lo[4] = {ladle_pack_bf16(p_lo[0][0], p_lo[0][1]), ladle_pack_bf16(p_lo[0][2], p_lo[0][3]),");
    c("                               ladle_pack_bf16(p_lo[1][0], p_lo[1][1]), ladle_pack_bf16(p_lo[1][2], p_lo[1][3])};");
  } else {
    c("const unsigned p_frag[4] = {" + pack + "(p[2 * kk][0], p[2 * kk][1]), " + pack + "(p[2 * kk][2], p[2 * kk][3]),");
    c("                            " + pack + "(p[2 * kk + 1][0], p[2 * kk + 1][1]), " + pack + "(p[2 * kk + 1][2], p[2 * kk + 1][3])};");
  }
  c("LADLE_UNROLL for (int np = 0; np < DVP / 16; ++np) {");
  c.in();
  c("unsigned v_frag[4];");
  c("ladle_ldmatrix_x4_trans(v_frag, &v_s[(kk * 16 + lane % 16) * VLD + np * 16 + (lane / 16) * 8]);");
  c(pv_mma + "(o_acc[2 * np], p_frag, v_frag[0], v_frag[1]);");
  c(pv_mma + "(o_acc[2 * np + 1], p_frag, v_frag[2], v_frag[3]);");
  if (f.ops.split) {
    c(pv_mma + "(o_acc[2 * np], p_frag_lo, v_frag[0], v_frag[1]);  // lo p x hi v");
    c(pv_mma + "(o_acc[2 * np + 1], p_frag_lo, v_frag[2], v_frag[3]);");
    c("ladle_ldmatrix_x4_trans(v_frag, &v_s_lo[(kk * 16 + lane % 16) * VLD + np * 16 + (lane / 16) * 8]);");
    c(pv_mma + "(o_acc[2 * np], p_frag, v_frag[0], v_frag[1]);  // hi p x lo v");
    c(pv_mma + "(o_acc[2 * np + 1], p_frag, v_frag[2], v_frag[3]);");
  }
  c.out();
  c("}");
  c.out();
  c("}");
}

// Steps 2 to 6 of the mma.sync and wgmma paths: K and V staged tile by tile (double-buffered at
// two stages; decode: a ring of up to four), each tile's scores, logits, online softmax and P V.
void emit_key_loop(Code& c, const Forward& f, const AttentionParts& parts) {
  const std::vector<std::string>& id = f.id;
  c("// 2. K and V tiles into shared memory, stage by stage.");
  c("const auto stage_tile = [&](int tile, int stage) {");
  c.in();
  const std::string width = f.decode ? "BN_TILE" : "BN";  // the keys a tile stages
  c("const int j0 = tile * " + width + ";");
  emit_stage_rows(c, f, {"k_seq", id[1], "(k_tile + stage * STAGE_ELEMENTS)", "(k_tile_lo + stage * STAGE_ELEMENTS)", "j0", "k_len",
                         width, "D", "DP", "KLD", f.ops.qk_f16});
  emit_stage_rows(c, f, {"v_seq", id[2], "(v_tile + stage * STAGE_ELEMENTS)", "(v_tile_lo + stage * STAGE_ELEMENTS)", "j0", "k_len",
                         width, "DV", "DVP", "VLD", f.ops.pv_f16});
  if (f.ops.async) c("ladle_cp_async_commit();");
  c.out();
  c("};");
  if (f.tile.stages > 2) {  // decode: a ring of STAGES, STAGES - 1 tiles in flight (an empty group past the end keeps the count)
    c("for (int s = 0; s < STAGES - 1; ++s) {");
    c("  if (tile_begin + s < tile_end) stage_tile(tile_begin + s, s);");
    if (f.ops.async) c("  else ladle_cp_async_commit();");
    c("}");
  } else {
    c("if (tile_begin < tile_end) stage_tile(tile_begin, 0);");
  }
  c("for (int tile = tile_begin; tile < tile_end; ++tile) {");
  c.in();
  if (f.tile.stages > 2) {
    c("const int stage = (tile - tile_begin) % STAGES;");
    c("// Tile + STAGES - 1 into the stage tile - 1 left (every warp passed the barrier after it).");
    c("if (tile + STAGES - 1 < tile_end) stage_tile(tile + STAGES - 1, (stage + STAGES - 1) % STAGES);");
    if (f.ops.async) {
      c("else ladle_cp_async_commit();");
      c("ladle_cp_async_wait<STAGES - 1>();  // this tile's group has landed");
    }
  } else if (f.tile.stages == 2) {
    c("const int stage = (tile - tile_begin) & 1;");
    c("if (tile + 1 < tile_end) {  // the next tile streams in while this one is computed");
    c("  stage_tile(tile + 1, stage ^ 1);");
    if (f.ops.async) c("  ladle_cp_async_wait<1>();");
    c("} else {");
    if (f.ops.async) c("  ladle_cp_async_wait<0>();");
    c("}");
  } else {
    c("const int stage = 0;");
    c("if (tile > tile_begin) stage_tile(tile, 0);");
    if (f.ops.async) c("ladle_cp_async_wait<0>();");
  }
  if (f.wgmma) c("ladle_fence_proxy_async();  // this thread's shared-memory writes, visible to wgmma's async proxy");
  c("__syncthreads();");
  // decode: this warp's BN keys of the tile.
  const std::string k_off = f.decode ? " + key_warp * BN * KLD" : "", v_off = f.decode ? " + key_warp * BN * VLD" : "";
  c(f.decode ? "const int j0 = tile * BN_TILE + key_warp * BN;" : "const int j0 = tile * BN;");
  c("const unsigned short* const k_s = k_tile + stage * STAGE_ELEMENTS" + k_off + ";");
  c("const unsigned short* const v_s = v_tile + stage * STAGE_ELEMENTS" + v_off + ";");
  if (f.ops.split) {
    c("const unsigned short* const k_s_lo = k_tile_lo + stage * STAGE_ELEMENTS" + k_off + ";");
    c("const unsigned short* const v_s_lo = v_tile_lo + stage * STAGE_ELEMENTS" + v_off + ";");
  }
  c("");
  if (f.wgmma) emit_wgmma_scores(c, parts);
  else emit_sync_scores(c, f);
  emit_logits(c, parts);
  emit_online_softmax(c, parts);
  if (f.wgmma) emit_wgmma_pv(c, parts);
  else emit_sync_pv(c, f);
  c("__syncthreads();  // the next tile's copy reuses this stage");
  c.out();
  c("}");
  c("");
}

}  // namespace

namespace {

// The kernel for these inputs' C names (with_input_names runs it twice).
AttentionKernel generate_named(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec, const Operands& ops,
                               const std::vector<std::string>& id) {
  const AttentionTile& tile = spec.tile;
  const bool ws = tile.mma == AttentionMma::ws, decode = tile.mma == AttentionMma::decode;
  // ws: a producer warpgroup beside the consumers' warps; with two or three consumer warpgroups the
  // producer gives its registers to them (setmaxnreg: 128 x 24 + 256 x 240, or 128 x 24 + 384 x 160,
  // within the 64K register file).
  const bool two_consumers = ws && tile.warps == 8, three_consumers = ws && tile.warps == 12;
  const Forward f{variant,
                  spec,
                  tile,
                  ops,
                  ws,
                  tile.mma == AttentionMma::wgmma || ws,
                  decode,
                  32 * tile.warps + (ws ? 128 : 0),
                  two_consumers || three_consumers ? 24 : 0,
                  two_consumers ? 240 : three_consumers ? 160 : 0,
                  id,
                  inputs_read(variant)};

  AttentionKernel kernel;
  std::string key = to_string(tile) + "|" + std::to_string(spec.D) + "," + std::to_string(spec.Dv) +
                    (spec.varlen ? " L" : "") + (spec.lse ? " E" : "") + (ops.async ? " A" : "") +
                    dtype_name(spec.output_type) + dtype_name(spec.q_segment_ids_type) +
                    dtype_name(spec.kv_segment_ids_type) + dtype_name(spec.sinks_type) + (spec.persistent ? " P" : "");
  for (DType t : spec.input_types) key += dtype_name(t);
  kernel.name = "ladle_attention_" + hex(fnv1a(key, ir::hash(variant)));
  kernel.persistent = spec.persistent;
  kernel.threads = static_cast<unsigned>(f.threads);
  kernel.block_m = tile.block_m;
  kernel.shared_bytes = ws ? attention_ws_shared_bytes(tile, spec.D, spec.Dv, spec.persistent ? attention_ws_q_stages(tile, spec.D, spec.Dv) : 1)
                           : attention_shared_bytes(tile, spec.D, spec.Dv, ops.split);  // decode: the key warps' merge too
  if (decode) kernel.merge_name = kernel.name + "_merge";
  const std::vector<std::string> declarations = declare_params(f, kernel);
  const Logit logit = render_logit(f);
  AttentionParts parts{variant, spec, logit.expression, logit.keep, logit.folded, ops.qk_f16, ops.pv_f16,
                       f.producer_registers, f.consumer_registers, "row0 + (r >= 2 ? 8 : 0)", "row0 + 8 * half", "m0", "row_last", {},
                       tensor_sums(f)};

  Code c;
  c(comment_block(header_text(f, kernel)) + "\n" + device_helpers(f));
  emit_signature(c, f, kernel.name, declarations);
  if (spec.persistent) {
    emit_ws_persistent(c, parts, {[&] { emit_block_range(c, f); }, [&] { emit_row_state(c, f, logit); }, [&] { emit_epilogue(c, parts); }});
    kernel.source = c.text();
    return kernel;
  }
  if (decode) emit_decode_range(c, variant, spec.varlen, id[1] + "_heads");
  else emit_block_range(c, f);
  if (ws) {
    emit_ws_shared(c, parts);
    emit_ws_producer(c, parts);
  } else {
    emit_tiles(c, f);
    emit_q_tile(c, f);
  }
  if (decode) {
    parts.element_prelude = emit_decode_row_state(c, f, logit);
    parts.row_token = "row_token[r / 2]", parts.half_token = "row_token[half]", parts.first_token = "row_first";
  } else {
    emit_row_state(c, f, logit);
  }
  if (ws) emit_ws_consumer_loop(c, parts);
  else emit_key_loop(c, f, parts);
  if (decode) {
    emit_decode_key_merge(c), emit_decode_partials(c);
  } else {
    emit_epilogue(c, parts);
    c.out();
    c("}");
  }
  kernel.source = c.text();
  if (decode) kernel.source += decode_merge_kernel(variant, spec, kernel.merge_name, kernel.merge_params);
  return kernel;
}

}  // namespace

AttentionKernel generate_attention(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec) {
  const Operands ops = checked_operands(variant, spec);
  return with_input_names<AttentionKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return generate_named(variant, spec, ops, id); });
}

}  // namespace ladle::cuda
