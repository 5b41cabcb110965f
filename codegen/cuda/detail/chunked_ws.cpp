#include "chunked_ws.h"

#include <ladle/runtime/error.h>

#include "attention_parts.h"
#include "chunked_ws_emit.h"

// generate_ws_chunked checks the spec, fixes what every part reads (WsContext), names the kernel and
// its parameters, writes the header comment, then has WsEmitter write the parts in order: constants,
// shared memory, the sequence, the ring and the producer (chunked_ws_ring.cpp), the consumers' setup
// and entering state (chunked_ws_parts.cpp), the chunks of the variant's form (chunked_ws_decay.cpp,
// chunked_ws_kserial.cpp, chunked_ws_vserial.cpp) and the state's stores.

namespace ladle::cuda::detail {

namespace {


// Whether slot s reads input `role` as it is: the expression is that input alone.
bool plain(const ir::Variant& variant, ir::Slot s, ir::Role role) {
  const ir::Expr& e = variant.slot(s);
  return e.nodes.size() == 1 && e.nodes[0].op == ir::Op::input && variant.inputs[e.nodes[0].input].role == role;
}

int input_of(const ir::Variant& variant, ir::Slot s) { return variant.slot(s).nodes[0].input; }

// Bytes of one stage of the ring: q boxes (not in the state pass), k boxes, the gate's inputs' boxes
// (a key-side gate: KB per input, beside k; a value-side gate: one per consumer and input, beside v),
// a v box per consumer.
int stage_bytes(const ChunkedTile& tile, bool states, int gate_inputs, bool value_gate) {
  const int kb = tile.block_k / 64, consumers = tile.block_v / 64;
  return ((states ? 1 : 2) * kb + gate_inputs * (value_gate ? consumers : kb) + consumers) * ws_chunk * 128;
}

// The serial kernel of a key-side gate: threads per key feature, each a run of C / parts steps.
int key_parts(const ChunkedTile& tile) { return 128 * (tile.block_v / 64) / tile.block_k; }

// The consumers' buffers and the 1024-byte alignment. The state pass: vup (a key-side gate: kup, the
// k boxes' size), the gate sums (and per key feature). The serial kernel: st per consumer, then for a
// per-head decay vup and the gate sums per consumer, for a key-side gate the block's q~ and k~ boxes,
// each part's sums and ranges per feature, the factors per key row and the fit words.
// A value-side gate (vserial): per consumer st, vt [C][64] bf16, G [C][72] f32 (rows padded), the halves' sums and
// ranges [3][2][64] f32, the midpoints and the pending log2 factors [2][64] f32 and two fit words (16 bytes).
int fixed_bytes(const ChunkedTile& tile, bool states, int gate_inputs, bool value_gate) {
  const int consumers = tile.block_v / 64, kb = tile.block_k / 64;
  if (value_gate) return 1024 + consumers * (tile.block_k * 128 + ws_chunk * 128 + ws_chunk * 72 * 4 + 8 * 64 * 4 + 16);
  if (!states && gate_inputs > 0)
    return 1024 + consumers * tile.block_k * 128 + 2 * kb * ws_chunk * 128 + (3 * key_parts(tile) + 2) * tile.block_k * 4 + 16 +
           2 * ws_chunk * 4;  // bq: a read before the update's bonus per step, two chunks
  const int update = gate_inputs > 0 ? kb * ws_chunk * 128 + tile.block_k * 4 : ws_chunk * 128;
  return 1024 + consumers * ((states ? 0 : tile.block_k * 128) + update + 4 * ws_chunk * 4);
}

int stages_of(const ChunkedTile& tile, bool states, int gate_inputs, bool value_gate) {
  // Three stages where they fit beside the consumers' buffers in 227 KiB (the state pass: in half of
  // it, two blocks per SM), else two.
  const int limit = states ? 113 * 1024 : 227 * 1024;
  return fixed_bytes(tile, states, gate_inputs, value_gate) + 3 * (stage_bytes(tile, states, gate_inputs, value_gate) + 16) <= limit
             ? 3
             : 2;
}

// The per-token inputs (token_key for the key side, token_value for the value side) a gate slot
// reads, in input order.
std::vector<int> gate_inputs_of(const ir::Variant& variant, ir::Slot slot, ir::InputKind kind) {
  std::vector<int> out;
  if (!variant.has(slot)) return out;
  std::vector<bool> seen(variant.inputs.size(), false);
  for (const ir::Node& node : variant.slot(slot).nodes)
    if (node.op == ir::Op::input && variant.inputs[node.input].kind == kind) seen[node.input] = true;
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (seen[k]) out.push_back(static_cast<int>(k));
  return out;
}

std::vector<int> key_gate_inputs(const ir::Variant& variant) {
  return gate_inputs_of(variant, ir::Slot::log_decay_k, ir::InputKind::token_key);
}

// Why the ws form cannot read this gate (empty: it can): its per-token inputs come by TMA beside k
// (a key-side gate) or v (a value-side one), so at least one, all over that side's features; the
// rest are per-head parameters or scalars.
std::string gate_reads(const ir::Variant& variant, ir::Slot slot) {
  const bool key = slot == ir::Slot::log_decay_k;
  const ir::InputKind kind = key ? ir::InputKind::token_key : ir::InputKind::token_value;
  const std::string side = key ? "key" : "value";
  for (const ir::Node& node : variant.slot(slot).nodes)
    if (node.op == ir::Op::input && variant.inputs[node.input].kind != kind &&
        variant.inputs[node.input].kind != ir::InputKind::head && variant.inputs[node.input].kind != ir::InputKind::scalar)
      return "the ws form's " + side + "-side gate reads per-token " + side + " inputs, per-head parameters and scalars only (" +
             variant.inputs[node.input].name + " is none of them)";
  if (gate_inputs_of(variant, slot, kind).empty()) return "the ws form's " + side + "-side gate must read a per-token " + side + " input";
  return {};
}

}  // namespace

std::string ws_variant_unsupported(const ir::Variant& variant) {
  if (variant.normalize) return "the ws form has no normaliser";
  // A read before the update (RWKV6): with a key-side gate alone (the per-feature steps), and a bonus per head.
  if (variant.read_before_update) {
    if (!variant.has(ir::Slot::log_decay_k) || variant.has(ir::Slot::log_decay_head))
      return "the ws form reads before the update only with a key-side gate alone (RWKV6's decay)";
    if (variant.has(ir::Slot::bonus) && ir::extent(variant, variant.slot(ir::Slot::bonus)).token)
      return "the ws form takes a bonus per head (u [H,K]), not one that varies over tokens";
  }
  if (variant.has(ir::Slot::log_decay_v)) {
    if (variant.has(ir::Slot::log_decay_k) || variant.has(ir::Slot::log_decay_head))
      return "the ws form takes a value-side gate alone (no key-side gate or per-head decay beside it)";
    if (std::string why = gate_reads(variant, ir::Slot::log_decay_v); !why.empty()) return why;
  }
  if (variant.has(ir::Slot::log_decay_k)) {
    if (variant.has(ir::Slot::log_decay_head)) return "the ws form takes a key-side gate or a per-head decay, not both";
    if (std::string why = gate_reads(variant, ir::Slot::log_decay_k); !why.empty()) return why;
  }
  if (!plain(variant, ir::Slot::q_feature, ir::Role::query) || !plain(variant, ir::Slot::k_feature, ir::Role::key) ||
      !plain(variant, ir::Slot::v, ir::Role::value))
    return "the ws form copies q, k and v as they are (no feature map)";
  if (ir::extent(variant, variant.slot(ir::Slot::scale)).token) return "the ws form needs a read scale that does not vary over tokens";
  return {};
}

std::string ws_spec_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  if (std::string why = ws_variant_unsupported(variant); !why.empty()) return why;
  if (spec.input_types.size() != variant.inputs.size()) return "input_types do not match the variant";
  for (ir::Slot s : {ir::Slot::q_feature, ir::Slot::k_feature, ir::Slot::v}) {
    const int k = input_of(variant, s);
    if (spec.input_types[k] != DType::bf16)
      return "the ws form reads q, k and v as bf16 by TMA; " + variant.inputs[k].name + " is " + dtype_name(spec.input_types[k]);
  }
  for (int k : ws_gate_inputs(variant))
    if (spec.input_types[k] != DType::bf16 && spec.input_types[k] != DType::f16)
      return "the ws form copies the gate's inputs by TMA in 16 bits; " + variant.inputs[k].name + " is " +
             dtype_name(spec.input_types[k]);
  return {};
}

std::string ws_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  if (variant.has(ir::Slot::log_decay_v)) return "the ws state pass takes no value-side gate";
  if (!variant.has(ir::Slot::log_decay_k)) return ws_spec_unsupported(variant, spec);
  if (variant.normalize) return "the ws form has no normaliser";
  if (variant.has(ir::Slot::log_decay_head)) return "the ws state pass takes a key-side gate or a per-head decay, not both";
  if (std::string why = gate_reads(variant, ir::Slot::log_decay_k); !why.empty()) return why;
  if (!plain(variant, ir::Slot::k_feature, ir::Role::key) || !plain(variant, ir::Slot::v, ir::Role::value))
    return "the ws form copies k and v as they are (no feature map)";
  if (spec.input_types.size() != variant.inputs.size()) return "input_types do not match the variant";
  for (ir::Slot s : {ir::Slot::k_feature, ir::Slot::v}) {
    const int k = input_of(variant, s);
    if (spec.input_types[k] != DType::bf16)
      return "the ws form reads k and v as bf16 by TMA; " + variant.inputs[k].name + " is " + dtype_name(spec.input_types[k]);
  }
  for (int k : key_gate_inputs(variant))
    if (spec.input_types[k] != DType::bf16 && spec.input_types[k] != DType::f16)
      return "the ws state pass copies the key gate's inputs by TMA in 16 bits; " + variant.inputs[k].name + " is " +
             dtype_name(spec.input_types[k]);
  return {};
}

std::vector<int> ws_gate_inputs(const ir::Variant& variant) {
  return variant.has(ir::Slot::log_decay_v) ? gate_inputs_of(variant, ir::Slot::log_decay_v, ir::InputKind::token_value)
                                            : key_gate_inputs(variant);
}

std::vector<std::string> ws_tile_rules(const ChunkedTile& tile) {
  std::vector<std::string> problems;
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  if (tile.split()) say("ws is a serial form (state_block_k = 0), not the split form");
  if (tile.wgmma) say("ws and wgmma are two forms of the serial kernel: name one");
  if (tile.chunk != ws_chunk) say("ws needs chunk = 64, got " + std::to_string(tile.chunk));
  if (tile.block_k != 64 && tile.block_k != 128) say("ws needs block_k = 64 or 128, got " + std::to_string(tile.block_k));
  if (tile.block_v != 64 && tile.block_v != 128) say("ws needs block_v = 64 or 128, got " + std::to_string(tile.block_v));
  else if (tile.warps != 4 + tile.block_v / 16)
    say("ws needs warps = " + std::to_string(4 + tile.block_v / 16) +
        " (a producer warpgroup and a consumer warpgroup per 64 value columns), got " + std::to_string(tile.warps));
  return problems;
}

int ws_shared_bytes(const ChunkedTile& tile, bool states, int gate_inputs, bool value_gate) {
  const int stages = stages_of(tile, states, gate_inputs, value_gate);
  return fixed_bytes(tile, states, gate_inputs, value_gate) + stages * stage_bytes(tile, states, gate_inputs, value_gate) +
         2 * stages * 8;
}

namespace {

// The spec's checks, in the order their errors reach the caller.
void check_ws_spec(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked: " + what); };
  const ChunkedTile& tile = spec.tile;
  if (const auto problems = ws_tile_rules(tile); !problems.empty()) fail("tile " + to_string(tile) + ": " + problems.front());
  const bool states = spec.phase == ChunkedPhase::states;
  if (const std::string why = states ? ws_states_unsupported(variant, spec) : ws_spec_unsupported(variant, spec); !why.empty())
    fail("tile " + to_string(tile) + ": " + why);
  if (spec.phase != ChunkedPhase::serial && !states) fail("the ws form has a serial kernel and a segmented state pass only");
  if (states && (!spec.segmented || spec.initial_state || spec.final_state))
    fail("the ws state pass is the segmented form's (segmented, from zero: initial_state = final_state = false)");
  if (spec.chunk_states_out && (states || spec.segmented || variant.has(ir::Slot::log_decay_v) || variant.read_before_update))
    fail("chunk_states_out: the serial ws form of whole sequences writes its chunks' entry states, for a key-side gate or a head "
         "decay (with a value-side gate, S's columns carry a pending factor at a chunk's start)");
  if (!has_wgmma(spec.arch))
    fail("tile " + to_string(tile) + ": ws needs the target sm_90a (TMA, wgmma.mma_async), the target is " +
         (spec.arch.empty() ? std::string("not given") : spec.arch));
}

WsContext ws_context(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::vector<std::string>& id) {
  const ChunkedTile& tile = spec.tile;
  const bool states = spec.phase == ChunkedPhase::states;
  const std::vector<int> gate_boxes = ws_gate_inputs(variant);
  const bool kgate = variant.has(ir::Slot::log_decay_k);
  const bool before_read = variant.read_before_update && !states;
  const bool vgate = variant.has(ir::Slot::log_decay_v);
  const int GB = static_cast<int>(gate_boxes.size());
  const int CONSUMERS = tile.block_v / 64;
  const auto& inputs = variant.inputs;
  const bool has_gate = variant.has(ir::Slot::log_decay_head);
  std::vector<bool> head_gate_reads(inputs.size(), false);
  if (has_gate)
    for (const ir::Node& node : variant.slot(ir::Slot::log_decay_head).nodes)
      if (node.op == ir::Op::input && inputs[node.input].kind == ir::InputKind::token_head) head_gate_reads[node.input] = true;
  return WsContext{.variant = variant,
                   .spec = spec,
                   .inputs = inputs,
                   .states = states,
                   .segmented = spec.segmented,
                   .kgate = kgate,
                   .kserial = kgate && !states,
                   .before_read = before_read,
                   .bonus = before_read && variant.has(ir::Slot::bonus),
                   .vgate = vgate,
                   .has_gate = has_gate,
                   .gate_boxes = gate_boxes,
                   .GB = GB,
                   .C = ws_chunk,
                   .BK = tile.block_k,
                   .BV = tile.block_v,
                   .CONSUMERS = CONSUMERS,
                   .STAGES = stages_of(tile, states, GB, vgate),
                   .THREADS = 128 * (1 + CONSUMERS),
                   .id = id,
                   .use_of = input_use(variant),
                   .qi = states ? -1 : input_of(variant, ir::Slot::q_feature),
                   .ki = input_of(variant, ir::Slot::k_feature),
                   .vi = input_of(variant, ir::Slot::v),
                   .gate_reads = head_gate_reads,
                   .sequence_index = spec.segmented ? "seg[3]" : "static_cast<long long>(n)"};
}

// The kernel's name and launch shape, and its parameters: the recurrence's, a segment's tables, the
// tensor maps TMA reads (appended to `declarations` as C).
ChunkedKernel ws_kernel(const WsContext& x, std::vector<std::string>& declarations) {
  const ir::Variant& variant = x.variant;
  const ChunkedKernelSpec& spec = x.spec;
  const ChunkedTile& tile = spec.tile;
  const bool states = x.states, segmented = x.segmented, vgate = x.vgate;
  const int C = x.C, BK = x.BK, BV = x.BV, GB = x.GB, THREADS = x.THREADS, qi = x.qi, ki = x.ki, vi = x.vi;
  const std::vector<std::string>& id = x.id;
  const std::vector<int>& gate_boxes = x.gate_boxes;
  ChunkedKernel kernel;
  kernel.name = "ladle_chunked_ws" + std::string(states ? "_states" : "") + std::string(segmented ? "_segmented" : "") + "_" +
                hex(fnv1a(to_string(tile) + types_key(spec) + (segmented ? "|segmented" : "") + (states ? "|states" : "") +
                              (spec.chunk_states_out ? "|chunk_states" : ""),
                          ir::hash(variant)));
  kernel.threads = static_cast<unsigned>(THREADS);
  kernel.block_v = BV;
  kernel.block_k = BK;
  kernel.phase = spec.phase;
  kernel.shared_bytes = ws_shared_bytes(tile, states, GB, vgate);

  declare_params(variant, id, spec, declarations, kernel.params);
  {
    using Type = KernelParam::Type;
    using Role = KernelParam::Role;
    if (segmented) {
      const auto param = [&](const std::string& c_type, const std::string& name, Role role) {
        declarations.push_back(c_type + " __restrict__ " + name);
        kernel.params.push_back({name, c_type, Type::pointer, role, -1});
      };
      param("const long long*", "segments", Role::segments);
      param(states ? "float*" : "const float*", "segment_states", Role::segment_states);
      param(states ? "float*" : "const float*", "segment_decay", Role::segment_decay);
    }
    if (spec.chunk_states_out) {
      declarations.push_back("float* __restrict__ chunk_states");
      kernel.params.push_back({"chunk_states", "float*", Type::pointer, Role::chunk_states, -1});
      if (spec.varlen) {
        declarations.push_back("const long long* __restrict__ chunk_offsets");
        kernel.params.push_back({"chunk_offsets", "const long long*", Type::pointer, Role::chunk_offsets, -1});
      }
    }
    std::vector<std::pair<std::string, int>> maps = {{"q_map", qi}, {"k_map", ki}, {"v_map", vi}};
    if (states) maps.erase(maps.begin());  // the state pass reads no q
    for (int k : gate_boxes) maps.push_back({id[k] + "_map", k});
    for (const auto& [name, index] : maps) {
      declarations.push_back("const __grid_constant__ ladle_tensor_map " + name);
      kernel.params.push_back({name, "ladle_tensor_map", Type::tensor_map, Role::input_tensor_map, index, C});
    }
  }
  return kernel;
}

// The comment that opens the source: what the kernel computes, its configuration, launch and types.
std::string ws_header(const WsContext& x, const ChunkedKernel& kernel) {
  const ir::Variant& variant = x.variant;
  const ChunkedKernelSpec& spec = x.spec;
  const ChunkedTile& tile = spec.tile;
  const bool states = x.states, segmented = x.segmented, kgate = x.kgate, kserial = x.kserial, vgate = x.vgate;
  const bool before_read = x.before_read, bonus = x.bonus;
  const int BK = x.BK, BV = x.BV, CONSUMERS = x.CONSUMERS, STAGES = x.STAGES, THREADS = x.THREADS;
  const std::vector<std::string>& id = x.id;
  std::string header = "ladle: chunked kernel " + kernel.name + "\nGenerated by codegen/cuda/detail/chunked_ws.cpp; do not edit.\n\n";
  header += std::string("The serial form, warp-specialised (sm_90a): a producer warpgroup copies q, k") +
            (kgate ? ", the key gate's inputs" : vgate ? ", the value gate's inputs" : "") +
            " and v of each 64-token chunk\nby TMA into a ring of " + std::to_string(STAGES) +
            " stages (mbarriers full / empty); consumer warpgroup j owns value columns\n"
            "[64 j, 64 j + 64) of the block's state S (fp32, wgmma accumulators) and per chunk, with G_t the cumulative\n";
  if (vgate)
    header += "log2 decay of value column j through token t of the chunk (G_-1 = 0) and a reference R per column (the\n"
              "midpoint of its G over the chunk where every column of the consumer spans at most 2 FIT_LIMIT, else G_C):\n"
              "  st = bf16(S), S's columns *= 2^R, vt_s = v_s 2^(R - G_s) (swizzled); one wgmma batch: score = q k^T,\n"
              "  o = q st, S += k^T vt; o *= 2^R, o += P vt (P_ts = score_ts, s <= t), o *= scale 2^(G_t - R), S's\n"
              "  columns *= 2^(G_C - R). Each factor is at most 2^FIT_LIMIT and each product of two a decay. Where a\n"
              "  column does not fit: R = G_C (vt a decay), o's state part *= 2^(G_t), and o_t += sum_s P_ts 2^(G_t - G_s) v_s\n"
              "  per element, from P in vt's place.\n";
  else if (kserial) {
    header += "log2 decay of key feature i through token t of the chunk (G_-1 = 0), in steps [t0, t1) with a reference R per\n"
              "feature (the whole chunk where every feature's G over t0 - 1 .. t1 - 1 spans at most 2 FIT_LIMIT, R its\n"
              "midpoint; else 8-token windows that fit, R theirs; else single tokens, R = G_t0):\n"
              "  q~_t = q_t 2^(G_t - R), k~_s = k_s 2^(R - G_s) (zero outside the step; 128-byte swizzled, shared by the consumers);\n"
              "  S's rows *= 2^(R - G_t0-1), st = bf16(S); one wgmma batch: score = q~ k~^T, o += q~ st, S += k~^T v;\n"
              "  P_ts = score_ts (t0 <= s <= t < t1), o += P v, S's rows *= 2^(G_t1-1 - R); after the steps o *= scale, stored.\n"
              "Each factor is at most 2^FIT_LIMIT and each product of two a decay, so nothing overflows; the consumers\n"
              "split the per-feature work (PARTS threads a feature) and meet at named barriers per step.\n";
    if (before_read)
      header += std::string("Read before the update: q~_t = q_t 2^(G_t-1 - R) (a single token: q~ = q, st = bf16(S) before its decay), ") +
                "P_ts = score_ts for s < t" + (bonus ? ", P_tt = q_t . bonus . k_t (bq, per step)" : "") + ".\n";
  } else {  // a per-head decay
    header += "log2 head decay through token t of the chunk and G_C its total:\n"
              "  st = bf16(S), vup = 2^(G_C - G_s) v_s (both 128-byte swizzled, as TMA writes its boxes), S *= 2^(G_C);\n"
              "  one wgmma batch: score = q k^T, o = q st, S += k^T vup;\n"
              "  P_ts = scale q_t.k_s 2^(G_t - G_s) (s <= t), o_t *= scale 2^(G_t), then o += P v; o stored.\n"
              "Every factor is a decay (at most 1): no reference token, no fallback.\n";
  }
  if (states)
    header += "The segmented form's state pass in the ws form: one segment (segments[n]) from a zero state, only the\n"
              "update (no q, no output); writes the segment's own final state and total log2 decay (segment_states,\n"
              "segment_decay). Two blocks per SM.\n";
  else if (segmented)
    header += "Segmented: one segment (segments[n]) from the state its earlier segments leave: h0, then each earlier\n"
              "segment's own state folded in, S = 2^D_j S + L_j (no fold kernel: segment_states as the state pass wrote it).\n";
  if (spec.chunk_states_out)
    header += std::string("Also writes the state entering each chunk, fp32, to chunk_states[first chunk + c][h] ([chunks][H][K][V];\n"
                          "first chunk: ") + (spec.varlen ? "chunk_offsets[n]" : "n ceil(T / 64)") + "), for the recurrent backward's boundary states.\n";
  header += "\n";  // not "\n" + ir::to_string(...): GCC 12 (-O3) sees an overlapping copy there (-Wrestrict)
  header += ir::to_string(variant);
  header += "\nconfig: " + to_string(tile) + " (" + std::to_string(THREADS) + " threads: producer, " + std::to_string(CONSUMERS) +
            " consumer warpgroup(s)); requires K <= " + std::to_string(BK) + "\n";
  header += "launch: grid (ceil(V / " + std::to_string(BV) + (states ? "), 1, N * H" : "), N * H") + "), block (" + std::to_string(THREADS) +
            "), dynamic shared memory " + std::to_string(kernel.shared_bytes) + " bytes\n";
  header += std::string("tensor maps: q, k, v") + (kgate ? ", the key gate's inputs" : vgate ? ", the value gate's inputs" : "") +
            " as [B,T,X,D] (16-bit, 128-byte swizzle, zero fill), boxes of 64 features by 64 tokens\n";
  if (segmented)
    header += "segments: [N][8] {b, first token, end token, sequence, index in it, row of its first earlier segment, last}\n";
  header += "types: " + types_line(variant, id, spec) + "; tensor-core operands bf16, accumulation fp32\n";
  if (!states)
    header += "setmaxnreg: producer " + std::to_string(ws_producer_registers) + ", consumers " + std::to_string(ws_consumer_registers) +
              " registers per thread\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") +
            " initial_state=" + (spec.initial_state ? "1" : "0") + " final_state=" + (spec.final_state ? "1" : "0") + "\n";
  header += "GQA: an input with X heads serves query head h from head h * X / H.\n";
  return header;
}

// The helpers the kernel includes, then its signature, the body's braces opened.
void emit_ws_signature(Code& c, const WsContext& x, const std::string& header, const std::string& name,
                       const std::vector<std::string>& declarations) {
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + wgmma_helpers(64, 64, false, false) +
    wgmma_transposed_helpers(64) + ws_helpers());
  if (x.vgate)
    c("#ifndef LADLE_VF4\n#define LADLE_VF4\n"
      "struct alignas(16) ladle_vf4 { float x[4]; };  // 16- and 8-byte shared memory loads of G\n"
      "struct alignas(8) ladle_vf2 { float x[2]; };\n#endif");
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(x.THREADS) + (x.states ? ", 2) " : ", 1) ") + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
}

}  // namespace

namespace {

// The kernel for these inputs' C names (with_input_names runs it twice).
ChunkedKernel generate_ws_named(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::vector<std::string>& id) {
  const WsContext x = ws_context(variant, spec, id);
  std::vector<std::string> declarations;
  ChunkedKernel kernel = ws_kernel(x, declarations);
  Code c;
  emit_ws_signature(c, x, ws_header(x, kernel), kernel.name, declarations);
  const WsEmitter e(x, c);
  e.constants();
  c("");
  e.shared_layout();
  c("");
  e.sequence();
  c("");
  e.ring_init();
  c("");
  e.producer();
  c("");
  e.consumer_setup();
  e.entering_state();
  e.descriptors();
  if (x.kserial)
    e.kserial_chunks();
  else if (x.vgate)
    e.vserial_chunks();
  else
    e.decay_chunks();
  e.state_stores();
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace

ChunkedKernel generate_ws_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  check_ws_spec(variant, spec);
  return with_input_names<ChunkedKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return generate_ws_named(variant, spec, id); });
}

}  // namespace ladle::cuda::detail
