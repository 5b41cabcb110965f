#include "chunked_ws.h"

#include <functional>

#include <ladle/runtime/error.h>

#include "attention_parts.h"
#include "cuda_source.h"

namespace ladle::cuda::detail {

namespace {

constexpr int ws_chunk = 64;
constexpr int ws_producer_registers = 24, ws_consumer_registers = 240;

// The template's own names (an input with one of these names is renamed).
const std::set<std::string>& ws_names() {
  static const std::set<std::string> names = {
      "C", "BK", "BV", "KB", "CONSUMERS", "STAGES", "BOX", "STAGE_BYTES", "THREADS", "LOG2E", "GATE_FLOOR", "REVERSE", "smem",
      "base", "ring", "st_all", "vup_all", "gate_all", "full", "empty", "n", "h", "b", "bos", "eos", "seg", "v0", "length",
      "chunks", "consumer", "wt", "warp", "lane", "gid", "tig", "cv0", "st", "vup", "gsum", "S", "desc", "c", "stage", "parity",
      "row0", "valid", "g0", "g1", "pair", "prefix", "total", "d", "other", "G0", "G1", "decay", "score", "o_acc", "p_frag",
      "p", "ta", "tb", "step_a", "step_b", "G_a", "G_b", "f_a", "f_b", "mt", "nb", "r", "kk", "kt", "col", "feat", "row",
      "step", "w", "e", "piece", "x", "u", "live", "t", "o", "o_stride_b", "o_stride_t", "o_stride_h", "o_stride_d",
      "initial_state", "final_state", "cu_seqlens", "B", "T", "H", "K", "V", "read_scale", "segments", "segment_states",
      "segment_decay", "q_map", "k_map", "v_map", "dst", "value", "o_row", "pos", "half", "s", "next", "stage_desc", "sd",
      "keep", "G_s", "step_s", "first", "start", "x0", "x1", "shift", "g", "G", "G_C", "tot", "lg", "fb", "fc", "k_box", "kx",
      "gtot", "gtot_all", "UPD", "GB", "VB", "QB", "f", "step_t", "v_box", "segment_log", "dj", "lj", "j", "i", "m", "mt",
      "NT", "PARTS", "TP", "FIT_LIMIT", "ct", "part", "Gl", "run", "lo", "hi", "tot", "llo", "lhi", "pre", "post", "fitw",
      "offset", "glo", "ghi", "R", "fails", "fail", "wlo", "whi", "t0", "t1", "mode", "Rs", "gprev", "glast", "gfirst", "mine",
      "qi", "ki", "dk", "dec", "again", "gu", "at", "qx", "kx", "qi_offset", "ki_offset", "inside", "factor", "o_started", "q_box", "fit_all", "wend",
      "GVB", "GS", "ladle_vf4", "ladle_vf2", "g4", "r4", "gs", "rs", "ga", "gb", "rj", "vt", "vt_all", "vt_offset", "gv", "gv_all",
      "part", "part_all", "rv", "vfail", "vfail_all", "col_g", "half_g", "exact", "col0", "R_of", "pend", "pend_mine", "fst", "fS",
      "pa", "pb", "vs", "Gs"};
  return names;
}

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

ChunkedKernel generate_ws_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked: " + what); };
  const ChunkedTile& tile = spec.tile;
  if (const auto problems = ws_tile_rules(tile); !problems.empty()) fail("tile " + to_string(tile) + ": " + problems.front());
  const bool states = spec.phase == ChunkedPhase::states;
  if (const std::string why = states ? ws_states_unsupported(variant, spec) : ws_spec_unsupported(variant, spec); !why.empty())
    fail("tile " + to_string(tile) + ": " + why);
  // A key-side gate (GLA): its per-token inputs come by TMA beside k. The state pass forms
  // kup = k 2^(G_C - G_s) per key feature instead of vup; the serial kernel (kserial) forms q~ and k~
  // against a reference per key feature (see its header).
  // A value-side gate (vserial): its per-token inputs come by TMA beside v, one box per consumer.
  const std::vector<int> gate_boxes = ws_gate_inputs(variant);
  const bool kgate = variant.has(ir::Slot::log_decay_k), kserial = kgate && !states;
  // A read before the update (kserial only): q~ carries G_(t-1), the scores are strictly causal, the bonus
  // on their diagonal; a single-token step reads the state as it entered (q~ against G_(t0-1)).
  const bool before_read = variant.read_before_update && !states, bonus = before_read && variant.has(ir::Slot::bonus);
  const bool vgate = variant.has(ir::Slot::log_decay_v);
  const int GB = static_cast<int>(gate_boxes.size());
  if (spec.phase != ChunkedPhase::serial && !states) fail("the ws form has a serial kernel and a segmented state pass only");
  if (states && (!spec.segmented || spec.initial_state || spec.final_state))
    fail("the ws state pass is the segmented form's (segmented, from zero: initial_state = final_state = false)");
  if (!chunked_wgmma_arch(spec.arch))
    fail("tile " + to_string(tile) + ": ws needs the target sm_90a (TMA, wgmma.mma_async), the target is " +
         (spec.arch.empty() ? std::string("not given") : spec.arch));
  const bool segmented = spec.segmented;
  const int C = ws_chunk, BK = tile.block_k, BV = tile.block_v, CONSUMERS = BV / 64;
  const int STAGES = stages_of(tile, states, GB, vgate), THREADS = 128 * (1 + CONSUMERS);
  const std::vector<std::string> id = identifiers(variant, ws_names());
  const auto& inputs = variant.inputs;
  const InputUse use_of = input_use(variant);
  const int qi = states ? -1 : input_of(variant, ir::Slot::q_feature), ki = input_of(variant, ir::Slot::k_feature),
            vi = input_of(variant, ir::Slot::v);
  const bool has_gate = variant.has(ir::Slot::log_decay_head);
  // The per-token head inputs the gate reads (loaded one chunk ahead into registers).
  std::vector<bool> gate_reads(inputs.size(), false);
  if (has_gate)
    for (const ir::Node& node : variant.slot(ir::Slot::log_decay_head).nodes)
      if (node.op == ir::Op::input && inputs[node.input].kind == ir::InputKind::token_head) gate_reads[node.input] = true;

  ChunkedKernel kernel;
  kernel.name = "ladle_chunked_ws" + std::string(states ? "_states" : "") + std::string(segmented ? "_segmented" : "") + "_" +
                hex(fnv1a(to_string(tile) + types_key(spec) + (segmented ? "|segmented" : "") + (states ? "|states" : ""),
                          ir::hash(variant)));
  kernel.threads = static_cast<unsigned>(THREADS);
  kernel.block_v = BV;
  kernel.block_k = BK;
  kernel.phase = spec.phase;
  kernel.shared_bytes = ws_shared_bytes(tile, states, GB, vgate);

  std::vector<std::string> declarations;
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
    std::vector<std::pair<std::string, int>> maps = {{"q_map", qi}, {"k_map", ki}, {"v_map", vi}};
    if (states) maps.erase(maps.begin());  // the state pass reads no q
    for (int k : gate_boxes) maps.push_back({id[k] + "_map", k});
    for (const auto& [name, index] : maps) {
      declarations.push_back("const __grid_constant__ ladle_tensor_map " + name);
      kernel.params.push_back({name, "ladle_tensor_map", Type::tensor_map, Role::input_tensor_map, index, C});
    }
  }

  std::string header = "ladle: chunked kernel " + kernel.name + "\nGenerated by codegen/detail/chunked_ws.cpp; do not edit.\n\n";
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
  header += "\n" + ir::to_string(variant);
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

  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + wgmma_helpers(64, 64, false, false) +
    wgmma_transposed_helpers(64) + ws_helpers());
  if (vgate)
    c("#ifndef LADLE_VF4\n#define LADLE_VF4\n"
      "struct alignas(16) ladle_vf4 { float x[4]; };  // 16- and 8-byte shared memory loads of G\n"
      "struct alignas(8) ladle_vf2 { float x[2]; };\n#endif");
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(THREADS) + (states ? ", 2) " : ", 1) ") + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", BV = " + std::to_string(BV) +
    ", KB = BK / 64, CONSUMERS = BV / 64, STAGES = " + std::to_string(STAGES) + ";");
  c("constexpr unsigned BOX = C * 128;  // bytes of a box: C tokens of 64 16-bit features, 128-byte rows");
  if (states) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the key-side gate, copied as k is");
    c("constexpr unsigned STAGE_BYTES = (KB + GB * KB + CONSUMERS) * BOX;  // k boxes, the gate's boxes, one v box per consumer");
    c("constexpr int QB = 0, VB = KB + GB * KB;  // the state pass copies no q: k boxes first; v's box");
  } else if (vgate) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the value-side gate, copied as v is");
    c("constexpr unsigned STAGE_BYTES = (2 * KB + CONSUMERS + GB * CONSUMERS) * BOX;  // q, k, v boxes, the gate's boxes per consumer");
    c("constexpr int QB = KB, VB = 2 * KB, GVB = 2 * KB + CONSUMERS;  // the first k box, v's box, the gate's first box");
    c("constexpr float FIT_LIMIT = 100.0f;  // the largest |log2 factor| of vt and o's");
    c("constexpr int GS = 72;  // G's row stride in floats (72 = 8 mod 32: a warp's 8 rows of float2 loads hit every bank once)");
  } else if (kserial) {
    c("constexpr int GB = " + std::to_string(GB) + ";  // inputs of the key-side gate, copied as k is");
    c("constexpr unsigned STAGE_BYTES = (2 * KB + GB * KB + CONSUMERS) * BOX;  // q boxes, k boxes, the gate's boxes, one v box per consumer");
    c("constexpr int QB = KB, VB = 2 * KB + GB * KB;  // q boxes before the k boxes (QB: the first k box); v's box");
    c("constexpr int NT = 128 * CONSUMERS, PARTS = NT / BK, TP = C / PARTS;  // consumer threads; threads per key feature, steps each");
    c("constexpr float FIT_LIMIT = 100.0f;  // the largest |log2 factor| of q~ and k~");
  } else {
    c("constexpr unsigned STAGE_BYTES = (2 * KB + CONSUMERS) * BOX;  // q boxes, k boxes, one v box per consumer");
    c("constexpr int QB = KB, VB = 2 * KB;  // q boxes before the k boxes; v's box");
  }
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("constexpr float GATE_FLOOR = -256.0f;  // log2 gates below it (-inf: a hard reset) count as it: 2^-256 = 0");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("(void)LOG2E; (void)GATE_FLOOR;");
  c("");
  c("// Shared memory from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 bytes):");
  if (vgate) {
    c("//   ring [STAGES][2 KB + CONSUMERS + GB CONSUMERS][C][64] q, k, v and the gate's boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state, read by o = q st (swizzled)");
    c("//   vt_all [CONSUMERS][C][64] bf16                 v 2^(R - G_s) (swizzled); P [C][C] where a column does not fit");
    c("//   gv_all [CONSUMERS][C][GS] f32                  G per step and column (rows padded to GS = 72)");
    c("//   part_all [CONSUMERS][8][64] f32                each half's sum, low and high per column, the midpoints R, pend");
    c("//   vfail_all [CONSUMERS][4]                       whether a column does not fit (this chunk's word, the next's)");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  } else if (kserial) {
    c("//   ring [STAGES][2 KB + GB KB + CONSUMERS][C][64] q, k, the gate's and v boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state times the step's 2^(R - G_t0-1) (swizzled)");
    c("//   qi, ki [KB][C][64] bf16                        q~ and k~ of the step (swizzled), shared by the consumers");
    c("//   tot, llo, lhi [PARTS][BK] f32                  each part's log2 sum per feature and its range from the part's start");
    c("//   pre, post [BK] f32                             the step's factors per key row: 2^(R - G_t0-1), 2^(G_t1-1 - R)");
    c("//   fitw [2]                                       which windows (bits 0-7) and whether the chunk (bit 8) do not fit");
    c("//   bq [2][C] f32                                  a read before the update's bonus q . u . k per step (two chunks)");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  } else {
    c("//   ring [STAGES][QB + KB + CONSUMERS][C][64] bf16 q boxes, k boxes, v boxes (TMA, swizzled)");
    c("//   st_all [CONSUMERS][BK][64] bf16                each consumer's state, read by o = q st (swizzled; not in the state pass)");
    c("//   vup_all [CONSUMERS][C][64] bf16                each consumer's v rows times 2^(G_C - G_s) (swizzled)");
    c("//   gate_all [CONSUMERS * 4][C] f32                each consumer warp's cumulative log2 decay");
    c("//   full [STAGES], empty [STAGES]                  mbarriers");
  }
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("unsigned char* const base = smem + (1024 - ladle_shared_address(smem) % 1024) % 1024;");
  c("unsigned short* const ring = reinterpret_cast<unsigned short*>(base);");
  c("unsigned short* const st_all = reinterpret_cast<unsigned short*>(base + STAGES * STAGE_BYTES);");
  if (vgate) {
    c("unsigned short* const vt_all = st_all + CONSUMERS * BK * 64;");
    c("float* const gv_all = reinterpret_cast<float*>(vt_all + CONSUMERS * C * 64);");
    c("float* const part_all = gv_all + CONSUMERS * C * GS;");
    c("unsigned* const vfail_all = reinterpret_cast<unsigned*>(part_all + CONSUMERS * 8 * 64);");
    c("unsigned long long* const full = reinterpret_cast<unsigned long long*>(vfail_all + CONSUMERS * 4);");
  } else if (kserial) {
    c("unsigned short* const qi = st_all + CONSUMERS * BK * 64;");
    c("unsigned short* const ki = qi + KB * C * 64;");
    c("float* const tot = reinterpret_cast<float*>(ki + KB * C * 64);");
    c("float* const llo = tot + PARTS * BK;");
    c("float* const lhi = llo + PARTS * BK;");
    c("float* const pre = lhi + PARTS * BK;");
    c("float* const post = pre + BK;");
    c("unsigned* const fitw = reinterpret_cast<unsigned*>(post + BK);");
    c("float* const bq = reinterpret_cast<float*>(fitw + 4);  // [2][C]: the bonus read per step, this chunk's and the last's");
    c("(void)bq;");
    c("unsigned long long* const full = reinterpret_cast<unsigned long long*>(bq + 2 * C);");
  } else {
    c(std::string("unsigned short* const vup_all = st_all + ") + (states ? "0" : "CONSUMERS * BK * 64") + ";");
    c(std::string("constexpr int UPD = ") + (kgate ? "KB * C * 64;  // kup = k 2^(G_C - G_s) per consumer (a key-side gate)" : "C * 64;  // vup per consumer"));
    c("float* const gate_all = reinterpret_cast<float*>(vup_all + CONSUMERS * UPD);");
    c(std::string("float* const gtot_all = gate_all + CONSUMERS * 4 * C;  // ") + (kgate ? "[CONSUMERS][BK]: the chunk's log2 decay per key feature" : "(none)"));
    c(std::string("unsigned long long* const full = reinterpret_cast<unsigned long long*>(gtot_all + ") + (kgate ? "CONSUMERS * BK" : "0") + ");");
  }
  c("unsigned long long* const empty = full + STAGES;");
  c("");
  c("const int v0 = blockIdx.x * BV;  // the block's first value column");
  c(states ? "const int n = blockIdx.z / H, h = blockIdx.z % H;" : "const int n = blockIdx.y / H, h = blockIdx.y % H;");
  emit_sequence_bounds(c, segmented, spec.varlen);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of.used[k] && inputs[k].kind != ir::InputKind::scalar) c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H;");
  c("const long long length = eos - bos;");
  c("const int chunks = static_cast<int>((length + C - 1) / C);");
  c("");
  c("if (threadIdx.x == 0) {");
  c("  for (int s = 0; s < STAGES; ++s) {");
  c("    ladle_mbarrier_init(&full[s], 1);               // the producer's arrive_expect_tx, then the copies' bytes");
  c("    ladle_mbarrier_init(&empty[s], 4 * CONSUMERS);  // lane 0 of every consumer warp");
  c("  }");
  c("  ladle_fence_barrier_init();");
  if (kserial) c("  fitw[0] = fitw[1] = 0u;");
  if (vgate) c("  for (int w = 0; w < CONSUMERS * 4; ++w) vfail_all[w] = 0u;");
  c("}");
  c("__syncthreads();  // the only block-wide barrier: the producer leaves after its copies");
  c("");
  c("// 1. The producer warpgroup: one thread issues every copy. A chunk's box starts at row0, so that");
  c("//    row r holds token row0 + r either way; rows outside [bos, eos) are masked by the consumers");
  c("//    (and outside the tensor TMA writes zeros).");
  c("if (threadIdx.x < 128) {");
  c.in();
  if (!states) c("ladle_setmaxnreg_dec<" + std::to_string(ws_producer_registers) + ">();");
  c("if (threadIdx.x == 0) {");
  c.in();
  c("for (int c = 0; c < chunks; ++c) {");
  c.in();
  c("const int stage = c % STAGES;");
  c("if (c >= STAGES) ladle_mbarrier_wait(&empty[stage], (c / STAGES - 1) & 1);");
  c("const int row0 = static_cast<int>(REVERSE ? eos - static_cast<long long>(c + 1) * C : bos + static_cast<long long>(c) * C);");
  c("unsigned short* const dst = ring + stage * (STAGE_BYTES / 2);");
  c("ladle_mbarrier_arrive_expect_tx(&full[stage], STAGE_BYTES);");
  if (!states)
    c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + kb * (BOX / 2), &q_map, kb * 64, row0, " + id[qi] + "_head, b, &full[stage]);");
  c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + (QB + kb) * (BOX / 2), &k_map, kb * 64, row0, " + id[ki] +
    "_head, b, &full[stage]);");
  c("for (int j = 0; j < CONSUMERS; ++j)");
  c("  ladle_tma_load_4d(dst + (VB + j) * (BOX / 2), &v_map, v0 + 64 * j, row0, " + id[vi] + "_head, b, &full[stage]);");
  for (int gi = 0; gi < GB; ++gi)
    if (vgate)
      c("for (int j = 0; j < CONSUMERS; ++j) ladle_tma_load_4d(dst + (GVB + " + std::to_string(gi) + " * CONSUMERS + j) * (BOX / 2), &" +
        id[gate_boxes[gi]] + "_map, v0 + 64 * j, row0, " + id[gate_boxes[gi]] + "_head, b, &full[stage]);");
    else
      c("for (int kb = 0; kb < KB; ++kb) ladle_tma_load_4d(dst + (QB + KB + " + std::to_string(gi) + " * KB + kb) * (BOX / 2), &" +
        id[gate_boxes[gi]] + "_map, kb * 64, row0, " + id[gate_boxes[gi]] + "_head, b, &full[stage]);");
  c.out();
  c("}");
  c.out();
  c("}");
  c("return;");
  c.out();
  c("}");
  if (!states) c("ladle_setmaxnreg_inc<" + std::to_string(ws_consumer_registers) + ">();");
  c("");
  c("// 2. The consumers. Accumulator layout (wgmma m64nNk16, per warp as mma.sync's): thread (warp, gid, tig)");
  c("//    holds rows 16 warp + gid (+ 8 for r >= 2) and columns 8 nb + 2 tig (+ 1 for odd r).");
  c("const int consumer = threadIdx.x / 128 - 1, wt = threadIdx.x % 128, warp = wt / 32, lane = threadIdx.x % 32;");
  c("const int gid = lane / 4, tig = lane % 4;");
  c("const int cv0 = v0 + 64 * consumer;  // this consumer's first value column");
  c("unsigned short* const st = st_all + consumer * BK * 64;");
  if (!kserial && !vgate) {
    c("unsigned short* const vup = vup_all + consumer * UPD;");
    if (kgate) c("float* const gtot = gtot_all + consumer * BK;");
    c("float* const gsum = gate_all + (consumer * 4 + warp) * C;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of.used[k] && inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
        "_stride_h);");
  c("const float read_scale = " + (variant.has(ir::Slot::scale) ? render_slot(variant, id, ir::Slot::scale, "") : std::string("1.0f")) +
    ";");
  // Byte offset of a swizzled 16-bit element (row, col) of a [rows][64] region at a 1024-aligned base.
  c("// Element (row, col < 64) of a 128-byte-swizzled [rows][64] region: its 16-byte piece col / 8 lands at");
  c("// piece (col / 8) ^ (row % 8) of the row.");
  c("const auto swz = [](int row, int col) { return row * 64 + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7)); };");
  c("");
  c("// The state columns [cv0, cv0 + 64) of every key row: S[mt][nb][r] is key row 64 mt + 16 warp + gid + 8 (r / 2),");
  c("// column cv0 + 8 nb + 2 tig + r % 2.");
  c("float S[KB][8][4];");
  // A loop over this thread's elements of S, its key row feat and value column col in scope.
  const auto for_state = [&](const std::function<void()>& body) {
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("    LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c.in(), c.in(), c.in();
    c("const int feat = 64 * mt + 16 * warp + gid + 8 * (r / 2), col = cv0 + 8 * nb + 2 * tig + (r & 1);");
    body();
    c.out(), c.out(), c.out();
    c("    }");
  };
  const std::string sequence_index = segmented ? "seg[3]" : "static_cast<long long>(n)";
  {
    std::string start = spec.initial_state ? "ladle_load(initial_state + ((" + sequence_index + " * H + h) * K + feat) * V + col)" : "0.0f";
    for_state([&] {
      c(start == "0.0f" ? std::string("S[mt][nb][r] = 0.0f; (void)feat; (void)col;")
                        : "S[mt][nb][r] = feat < K && col < V ? " + start + " : 0.0f;");
    });
    if (segmented && !states) {
      // The fold of the earlier segments (or pieces), here rather than in a kernel of its own: this
      // block's columns of each one's own state L_j after its decay D_j, in order.
      c("// The state entering this segment: each earlier segment's (or piece's) own state folded in order,");
      c("// S = 2^D_j S + L_j (segment_states and segment_decay rows seg[5] .. seg[5] + seg[4] - 1).");
      c("for (long long j = seg[5]; j < seg[5] + seg[4]; ++j) {");
      c.in();
      c(std::string("const float dj = ") + (has_gate ? "ladle_exp2(segment_decay[j * H + h])" : "1.0f") + ";");
      c("const float* const lj = segment_states + (j * H + h) * K * V;");
      if (kgate) {
        // The decay per key row once, before the loads (per element, the fold spilled 28 bytes).
        c("const float* const dk = segment_decay + (j * H + h) * K;  // the key-side gate's log2 total per feature");
        c("float dec[KB][2];");
        c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
        c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
        c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
        c("    dec[mt][half] = feat < K ? ladle_exp2(dk[feat]) : 1.0f;");
        c("  }");
      }
      if (vgate) {
        // The decay per value column once, as for a key-side gate's rows (segment_decay's rows of V).
        c("float dec[8][2];");
        c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
        c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
        c("    const int col = cv0 + 8 * nb + 2 * tig + e;");
        c("    dec[nb][e] = col < V ? ladle_exp2(segment_decay[(j * H + h) * V + col]) : 1.0f;");
        c("  }");
      }
      const std::string decay = kgate ? "dec[mt][r / 2]" : vgate ? "dec[nb][r & 1]" : "dj";
      for_state([&] {
        c("if (feat < K && col < V) S[mt][nb][r] = " + decay + " * S[mt][nb][r] + lj[static_cast<long long>(feat) * V + col];");
      });
      if (kgate || vgate) c("(void)dj;");
      c.out();
      c("}");
    }
  }
  c("// One descriptor for every operand (128-byte swizzle, SBO 1024: the next 8 rows; LBO: the next box):");
  c("// a product adds its operand's byte offset / 16 to the start address (shared memory ends below");
  c("// 256 KiB, so the sum never carries out of bits 0-13).");
  c("const unsigned long long desc = ladle_wgmma_desc_sw128(ring, BOX, 1024);");
  c("const unsigned st_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(st) - base);");
  c("(void)st_offset; (void)st;");
  if (states) c("float segment_log = 0.0f;  // the segment's total log2 decay (a key-side gate: key feature wt's)");
  if (!kserial && !vgate) c("const unsigned vup_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(vup) - base);");
  // The chunk loop's opening: its stage, the box's first row and the chunk's tokens in the sequence.
  const auto chunk_loop_head = [&] {
    c("for (int c = 0; c < chunks; ++c) {");
    c.in();
    c("const int stage = c % STAGES;");
    c("const unsigned parity = (c / STAGES) & 1;");
    c("const long long row0 = REVERSE ? eos - static_cast<long long>(c + 1) * C : bos + static_cast<long long>(c) * C;");
    c("const int valid = static_cast<int>(length - static_cast<long long>(c) * C < C ? length - static_cast<long long>(c) * C : C);");
  };
  // o, two columns at a time, for the rows ta and tb that are tokens of the sequence.
  const auto emit_store_o = [&] {
    c("// 2f. o, two columns at a time, for the rows that are tokens of the sequence.");
    c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c.in();
    c("const long long pos = row0 + (half ? tb : ta);");
    c("if (pos < bos || pos >= eos) continue;");
    c("auto* const o_row = o + b * o_stride_b + pos * o_stride_t + h * o_stride_h;");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
    c.in();
    c("const int col = cv0 + 8 * nb + 2 * tig;");
    c("if (col >= V) continue;");
    c("const float x0 = o_acc[nb][2 * half], x1 = o_acc[nb][2 * half + 1];");
    c("if (o_stride_d == 1) {");
    c("  ladle_store2(o_row + col, x0, x1, col + 1 < V);");
    c("} else {");
    c("  ladle_store(o_row + col * o_stride_d, x0);");
    c("  if (col + 1 < V) ladle_store(o_row + (col + 1) * o_stride_d, x1);");
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
  };
  // The batch of the serial kernel without a key-side gate: score = q k^T, o = q st, S += k^T U with U
  // at byte offset `update` (vup, or vt for a value-side gate).
  const auto emit_batch = [&](const std::string& update) {
    const std::string name = update.substr(0, update.find('_'));
    c("// 2c. One batch: score = q k^T (both K-major), o = q st (st N-major), S += k^T " + name + " (k M-major, " + name);
    c("//     N-major). q's and k's next 16 features are 32 bytes on in the row, the next 64 in the next box;");
    c("//     st's, " + name + "'s and k^T's next 16 rows 2048 bytes on.");
    c("float score[8][4], o_acc[8][4];");
    c("ladle_wgmma_fence_operand<64>(score);");
    c("ladle_wgmma_fence_operand<64>(o_acc);");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
    c("ladle_wgmma_fence();");
    c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
    c("  ladle_wgmma_ss_bf16<64>(score, desc + (stage_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
    c("                          desc + (stage_offset + (KB + kt / 4) * BOX + (kt % 4) * 32) / 16, kt > 0);");
    c("ladle_wgmma_commit();");
    c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
    c("  ladle_wgmma_ss_bf16_tb<64>(o_acc, desc + (stage_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
    c("                             desc + (st_offset + kt * 2048) / 16, kt > 0);");
    c("ladle_wgmma_commit();");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
    c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (stage_offset + (KB + mt) * BOX + kk * 2048) / 16, desc + (" + update +
      " + kk * 2048) / 16);");
    c("ladle_wgmma_commit();");
  };
  // P's bf16 fragments (the A operand of o += P v) from the scores once their batch is done: element
  // r of column block nb is `value`, with step_s (the key's step) and step_t (the row's) in scope.
  const auto emit_p = [&](const std::string& value) {
    c("ladle_wgmma_wait<2>();");
    c("ladle_wgmma_fence_operand<64>(score);");
    c("unsigned p_frag[4][4];");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
    c.in();
    c("float p[4];");
    c("LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c.in();
    c("const int s = 8 * nb + 2 * tig + (r & 1);");
    c("const int step_s = REVERSE ? C - 1 - s : s, step_t = r < 2 ? step_a : step_b;");
    c("p[r] = " + value + ";");
    c.out();
    c("}");
    c("p_frag[nb / 2][(nb % 2) * 2] = ladle_pack_bf16(p[0], p[1]);");
    c("p_frag[nb / 2][(nb % 2) * 2 + 1] = ladle_pack_bf16(p[2], p[3]);");
    c.out();
    c("}");
  };
  // The gate's log2 value lg at box row `row`, column `col` of its inputs' boxes (box(gi): input gi's box
  // in the stage; stage_offset in scope), floored at GATE_FLOOR: the value side's slot or the key side's.
  const auto gate_value_at = [&](const std::string& row, const std::string& col, const std::function<std::string(int)>& box) {
    for (int gi = 0; gi < GB; ++gi) {
      const int k = gate_boxes[gi];
      c("const float " + id[k] + "_x = ladle_load(reinterpret_cast<const " + std::string(storage_type(spec.input_types[k])) +
        "*>(ring + (stage_offset + (" + box(gi) + ") * BOX) / 2 + swz(" + row + ", " + col + ")));");
    }
    c("const float x = LOG2E * (" + render_slot(variant, id, vgate ? ir::Slot::log_decay_v : ir::Slot::log_decay_k, "_x") + ");");
    c("const float lg = x > GATE_FLOOR ? x : GATE_FLOOR;");
  };
  // The key-side gate's at box row `row` of key feature fb * 64 + fc (fb, fc in scope).
  const auto gate_at = [&](const std::string& row) {
    gate_value_at(row, "fc", [](int gi) { return "QB + KB + " + std::to_string(gi) + " * KB + fb"; });
  };
  // The serial kernel of a key-side gate (kserial): steps against a reference per key feature.
  const auto emit_kserial = [&] {
    c("// The key feature this thread sums the gate of, over the chunk's steps [part TP, part TP + TP).");
    c("const int ct = threadIdx.x - 128, f = ct % BK, part = ct / BK;");
    c("const int fb = f / 64, fc = f % 64;");
    // Constants, not pointer differences: two registers fewer (at 128,64,128,12 with states, 8 bytes spilled).
    c("constexpr unsigned qi_offset = STAGES * STAGE_BYTES + CONSUMERS * BK * 128;  // qi - base, in bytes");
    c("constexpr unsigned ki_offset = qi_offset + KB * BOX;");
    if (bonus) {
      // The bonus does not vary over tokens: lane l's features l, l + 32, ... are the same every row.
      c("// The bonus weight of this lane's key features lane + 32 j (0 past K), for the rows' q . u . k.");
      c("float ub[BK / 32];");
      c("LADLE_UNROLL for (int j = 0; j < BK / 32; ++j) {");
      c.in();
      c("const int i = lane + 32 * j;");
      for (const std::size_t k : slot_inputs(variant, ir::Slot::bonus))
        if (inputs[k].kind == ir::InputKind::head_key)
          c("const float " + id[k] + "_b = i < K ? ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
            "_stride_h + i * " + id[k] + "_stride_d) : 0.0f;");
      c("ub[j] = i < K ? " + render_slot(variant, id, ir::Slot::bonus, "_b") + " : 0.0f;");
      c.out();
      c("}");
    }
    c("");
    chunk_loop_head();
    c("ladle_mbarrier_wait(&full[stage], parity);");
    c("const unsigned stage_offset = stage * STAGE_BYTES;");
    c("");
    if (bonus) {
      c("// 2-. The bonus read of each step, q . u . k (the scores' diagonal): a warp a row, read after the next");
      c("//     barrier; two buffers, so a consumer still forming the last chunk's P reads that chunk's.");
      c("float* const bq_c = bq + (c & 1) * C;");
      c("for (int step = (threadIdx.x - 128) / 32; step < C; step += NT / 32) {");
      c.in();
      c("const int row = REVERSE ? C - 1 - step : step;");
      c("float part_b = 0.0f;");
      c("LADLE_UNROLL for (int j = 0; j < BK / 32; ++j) {");
      c.in();
      c("const int i = lane + 32 * j, ib = i / 64, ic = i % 64;");
      c("const float qx = ladle_bf16_float(ring[(stage_offset + ib * BOX) / 2 + swz(row, ic)]);");
      c("const float kx = ladle_bf16_float(ring[(stage_offset + (QB + ib) * BOX) / 2 + swz(row, ic)]);");
      c("part_b += qx * ub[j] * kx;");
      c.out();
      c("}");
      c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) part_b += __shfl_xor_sync(0xffffffffu, part_b, d);");
      c("if (lane == 0) bq_c[step] = step < valid ? part_b : 0.0f;");
      c.out();
      c("}");
      c("");
    }
    c("// 2a. G of feature f over this part's steps, from the part's start (Gl), and its range with the 0 before it.");
    c("float Gl[TP];");
    c("float run = 0.0f, lo = 0.0f, hi = 0.0f;");
    c("LADLE_UNROLL for (int u = 0; u < TP; ++u) {");
    c.in();
    c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
    gate_at("row");
    c("run += step < valid && f < K ? lg : 0.0f;");
    c("Gl[u] = run;");
    c("lo = fminf(lo, run), hi = fmaxf(hi, run);");
    c.out();
    c("}");
    c("tot[part * BK + f] = run, llo[part * BK + f] = lo, lhi[part * BK + f] = hi;");
    c("ladle_named_barrier_sync(1 + CONSUMERS, NT);  // every part's sums");
    c("// G before this part (offset), G_valid-1 (total), the range of G_-1 .. G_valid-1 and the chunk's reference R;");
    c("// whether the chunk and each 8-token window of this part fit (a window's range includes G before it).");
    c("float offset = 0.0f, total = 0.0f, glo = 0.0f, ghi = 0.0f;");
    c("LADLE_UNROLL for (int p = 0; p < PARTS; ++p) {");
    c("  glo = fminf(glo, total + llo[p * BK + f]), ghi = fmaxf(ghi, total + lhi[p * BK + f]);");
    c("  if (p < part) offset += tot[p * BK + f];");
    c("  total += tot[p * BK + f];");
    c("}");
    c("const float R = 0.5f * (glo + ghi);");
    c("unsigned fails = ghi - glo > 2.0f * FIT_LIMIT ? 0x100u : 0u;");
    c("LADLE_UNROLL for (int w = 0; w < TP / 8; ++w) {");
    c.in();
    c("float wlo = w > 0 ? Gl[(8 * w + TP - 1) % TP] : 0.0f, whi = wlo;");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) wlo = fminf(wlo, Gl[8 * w + u]), whi = fmaxf(whi, Gl[8 * w + u]);");
    c("if (whi - wlo > 2.0f * FIT_LIMIT) fails |= 1u << (part * (TP / 8) + w);");
    c.out();
    c("}");
    c("if (fails) atomicOr(&fitw[c & 1], fails);");
    c("ladle_named_barrier_sync(1 + CONSUMERS, NT);  // every thread's fit bits");
    c("const unsigned fail = fitw[c & 1];");
    c("if (ct == 0) fitw[(c + 1) & 1] = 0u;  // the next chunk's word: every thread read it a chunk ago, barriers since");
    c("");
    c("// 2b. The steps: the whole chunk where it fits, else its 8-token windows that fit, else single tokens.");
    c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows of score and o");
    c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
    c("float o_acc[8][4];");
    // A step's body, t0, t1, o_started, mine, Rs, gprev and glast in scope. Emitted twice: the whole
    // chunk alone (Gl is dead after its q~ and k~, so the products need no spill), and the loop of
    // windows and tokens, which recomputes G from the gate's inputs (recompute) and runs its loops
    // over the part's steps rolled up (unrolled, they spilled 400 bytes at 128,64,128,12).
    const auto emit_step = [&](bool recompute) {
      c("// q~ and k~ of feature f over this part's steps, zero outside [t0, t1) (so past the sequence too).");
      c("const unsigned short* const q_box = ring + (stage_offset + fb * BOX) / 2;");
      c("const unsigned short* const k_box = ring + (stage_offset + (QB + fb) * BOX) / 2;");
      if (recompute) c("float again = 0.0f;  // G again, from the part's start");
      c(std::string(recompute ? "LADLE_UNROLL_1" : "LADLE_UNROLL") + " for (int u = 0; u < TP; ++u) {");
      c.in();
      c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
      c("const int at = fb * (C * 64) + swz(row, fc);");
      if (recompute) {
        c("float gu = offset;");
        if (before_read) c("float gp = offset;  // G_(t-1)");
        c("if (mine) {");
        c.in();
        gate_at("row");
        if (before_read) c("gp = offset + again;");
        c("again += step < valid && f < K ? lg : 0.0f;");
        c("gu = offset + again;");
        c.out();
        c("}");
        c("const bool inside = mine && step >= t0 && step < t1;");
        c("const float d = gu - Rs;");
        if (before_read) c("const float dq = gp - Rq;");
      } else {
        c("const bool inside = step >= t0 && step < t1;");
        c("const float d = offset + Gl[u] - Rs;");
        if (before_read) c("const float dq = offset + (u > 0 ? Gl[u > 0 ? u - 1 : 0] : 0.0f) - Rq;");
      }
      c("const float qx = ladle_bf16_float(q_box[swz(row, fc)]), kx = ladle_bf16_float(k_box[swz(row, fc)]);");
      c(std::string("qi[at] = inside ? static_cast<unsigned short>(ladle_pack_bf16(qx * ladle_exp2(") + (before_read ? "dq" : "d") +
        "), 0.0f) & 0xffffu) : 0;");
      c("ki[at] = inside ? static_cast<unsigned short>(ladle_pack_bf16(kx * ladle_exp2(-d), 0.0f) & 0xffffu) : 0;");
      c.out();
      c("}");
      c("if (mine) pre[f] = ladle_exp2(Rs - gprev), post[f] = ladle_exp2(glast - Rs);");
      c("ladle_fence_proxy_async();  // qi and ki, written through the generic proxy, before wgmma reads them");
      c("ladle_named_barrier_sync(1 + CONSUMERS, NT);");
      c("");
      c("// 2c. This consumer's columns of S times pre per key row, and their bf16 copy st.");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
      c("    const float factor = pre[feat];");
      if (before_read) {  // st = S 2^(Rq - G_t0-1): S itself for a single-token step (Rq = G_t0-1), else S pre
        c("    const float read_factor = single ? 1.0f : factor;");
        c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
        c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half] * read_factor, S[mt][nb][2 * half + 1] * read_factor);");
        c("      S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
        c("    }");
      } else {
        c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
        c("      S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
        c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half], S[mt][nb][2 * half + 1]);");
        c("    }");
      }
      c("  }");
      c("ladle_fence_proxy_async();  // st, before wgmma reads it");
      c("ladle_named_barrier_sync(1 + consumer, 128);");
      c("");
      c("// 2d. One batch: score = q~ k~^T (both K-major), o += q~ st (st N-major), S += k~^T v (k~ M-major, v");
      c("//     N-major in the stage).");
      c("float score[8][4];");
      c("ladle_wgmma_fence_operand<64>(score);");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
      c("ladle_wgmma_fence();");
      c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
      c("  ladle_wgmma_ss_bf16<64>(score, desc + (qi_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
      c("                          desc + (ki_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16, kt > 0);");
      c("ladle_wgmma_commit();");
      c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt)");
      c("  ladle_wgmma_ss_bf16_tb<64>(o_acc, desc + (qi_offset + (kt / 4) * BOX + (kt % 4) * 32) / 16,");
      c("                             desc + (st_offset + kt * 2048) / 16, kt > 0 || o_started);");
      c("ladle_wgmma_commit();");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
      c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (ki_offset + mt * BOX + kk * 2048) / 16,");
      c("                                desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
      c("ladle_wgmma_commit();");
      c("");
      c("// 2e. P: the scores of the step's pairs, s before or at t (k~ is zero before t0); o += P v (P from");
      c("//     registers, v N-major).");
      if (before_read)  // strictly causal; the bonus on the diagonal of the step's rows
        emit_p("step_s < step_t && step_t < t1 ? score[nb][r] : " +
               std::string(bonus ? "(step_s == step_t && step_t >= t0 && step_t < t1 ? bq[(c & 1) * C + step_t] : 0.0f)" : "0.0f"));
      else
        emit_p("step_s <= step_t && step_t < t1 ? score[nb][r] : 0.0f");
      c("ladle_wgmma_wait<1>();  // o += q~ st done");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("ladle_wgmma_fence();");
      c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
      c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
      c("ladle_wgmma_commit();");
      c("ladle_wgmma_wait<0>();  // the update and o += P v done");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
      c("// S's rows times post: the state after the step's last token.");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c("    const float factor = post[64 * mt + 16 * warp + gid + 8 * half];");
      c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) S[mt][nb][2 * half] *= factor, S[mt][nb][2 * half + 1] *= factor;");
      c("  }");
    };
    c("if (!(fail & 0x100u)) {  // one step: the chunk against R (part 0 writes the factors)");
    c.in();
    c("const int t0 = 0, t1 = valid;");
    c("const bool o_started = false, mine = part == 0;");
    c("const float Rs = R, gprev = 0.0f, glast = total;");
    if (before_read) c("const float Rq = Rs;\nconstexpr bool single = false;");
    emit_step(false);
    c.out();
    c("} else {");
    c.in();
    c("bool o_started = false;");
    c("for (int t0 = 0; t0 < valid;) {");
    c.in();
    c("// mode 1: an 8-token window against its midpoint; 2: a token against itself");
    c("const int mode = !((fail >> (t0 / 8)) & 1u) ? 1 : 2;");
    c("const int t1 = mode == 2 ? t0 + 1 : t0 + 8 < valid ? t0 + 8 : valid;");
    c("if (o_started) ladle_named_barrier_sync(1 + CONSUMERS, NT);  // the last step's products have read qi, ki, pre and post");
    c("// The step's reference Rs for feature f, G before its first token (gprev) and at its last (glast),");
    c("// from the part holding the step (mine).");
    c("const bool mine = t0 >= part * TP && t0 < part * TP + TP;");
    c("float Rs = 0.0f, gprev = offset, glast = offset;");
    c("if (mine) {");
    c.in();
    c("float wlo = 3.0e38f, whi = -3.0e38f, gfirst = offset, again = 0.0f;");
    c("LADLE_UNROLL_1 for (int u = 0; u < TP; ++u) {");
    c.in();
    c("const int step = part * TP + u, row = REVERSE ? C - 1 - step : step;");
    gate_at("row");
    c("again += step < valid && f < K ? lg : 0.0f;");
    c("const float g = offset + again;");
    c("if (step == t0 - 1) gprev = g;");
    c("if (step == t0) gfirst = g;");
    c("if (step == t1 - 1) glast = g;");
    c("if (step >= t0 && step < t1) wlo = fminf(wlo, g), whi = fmaxf(whi, g);");
    c.out();
    c("}");
    c("wlo = fminf(wlo, gprev), whi = fmaxf(whi, gprev);");
    c("Rs = mode == 2 ? gfirst : 0.5f * (wlo + whi);");
    c.out();
    c("}");
    if (before_read) {
      // A single token reads the state as it entered (q~ = q against G_(t0-1)) whatever its own gate;
      // its k~ = k against G_t0 (its scores are all masked: strictly causal).
      c("const bool single = mode == 2;");
      c("const float Rq = single ? gprev : Rs;");
    }
    emit_step(true);
    c("o_started = true;");
    c("t0 = t1;");
    c.out();
    c("}");
    c.out();
    c("}");
    c("__syncwarp();");
    c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);  // this warp is done with the stage");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= read_scale;");
    c("");
    emit_store_o();
    c.out();
    c("}");
  };
  // The value-side gate's at box row `row` of this consumer's column `col` (its boxes per consumer).
  const auto value_gate_at = [&](const std::string& row, const std::string& col) {
    gate_value_at(row, col, [](int gi) { return "GVB + " + std::to_string(gi) + " * CONSUMERS + consumer"; });
  };
  // The serial kernel of a value-side gate (vserial): a reference per value column, each consumer on
  // its own columns (see the header).
  const auto emit_vserial = [&] {
    c("// The value column (of this consumer's 64) whose gate this thread sums, over the steps [32 half_g, 32 half_g + 32).");
    c("const int col_g = wt % 64, half_g = wt / 64;");
    c("float* const gv = gv_all + consumer * C * GS;");
    c("float* const part = part_all + consumer * 8 * 64;  // [0, 128) sums, [128, 256) lows, [256, 384) highs per half, rv, pend");
    c("float* const rv = part + 6 * 64;  // the midpoint of each column's G over the chunk");
    c("// S's columns are stored times 2^-pend: the last chunk's 2^(G_C - R) is taken with the next chunk's 2^R.");
    c("float* const pend = part + 7 * 64;");
    c("float pend_mine = 0.0f;  // column col_g's (half 0)");
    c("unsigned* const vfail = vfail_all + consumer * 4;");
    c("unsigned short* const vt = vt_all + consumer * C * 64;");
    c("const unsigned vt_offset = static_cast<unsigned>(reinterpret_cast<unsigned char*>(vt) - base);");
    chunk_loop_head();
    c("ladle_mbarrier_wait(&full[stage], parity);");
    c("const unsigned stage_offset = stage * STAGE_BYTES;");
    c("const unsigned short* const v_box = ring + (stage_offset + (VB + consumer) * BOX) / 2;");
    c("");
    c("// 2a. G of column col_g over this half's steps, from the half's start, and its range (with the start).");
    c("if (half_g == 0) pend[col_g] = pend_mine;  // every thread read the last one before the last chunk's end");
    c("float run = 0.0f, lo = 0.0f, hi = 0.0f;");
    c("LADLE_UNROLL for (int u = 0; u < 32; ++u) {");
    c.in();
    c("const int step = 32 * half_g + u, row = REVERSE ? C - 1 - step : step;");
    value_gate_at("row", "col_g");
    c("run += step < valid && cv0 + col_g < V ? lg : 0.0f;");
    c("gv[step * GS + col_g] = run;  // from the half's start (the second half adds the first's sum below)");
    c("lo = fminf(lo, run), hi = fmaxf(hi, run);");
    c.out();
    c("}");
    c("part[half_g * 64 + col_g] = run, part[128 + half_g * 64 + col_g] = lo, part[256 + half_g * 64 + col_g] = hi;");
    c("ladle_named_barrier_sync(1 + consumer, 128);  // both halves' sums");
    c("if (half_g) {");
    c("  const float offset = part[col_g];");
    c("  LADLE_UNROLL for (int u = 0; u < 32; ++u) gv[(32 + u) * GS + col_g] += offset;");
    c("}");
    c("if (half_g == 0) {");
    c("  const float glo = fminf(lo, run + part[192 + col_g]), ghi = fmaxf(hi, run + part[320 + col_g]);");
    c("  rv[col_g] = 0.5f * (glo + ghi);");
    c("  if (ghi - glo > 2.0f * FIT_LIMIT) vfail[c & 1] = 1u;");
    c("}");
    c("ladle_named_barrier_sync(1 + consumer, 128);  // G, the midpoints and the fit word");
    c("const bool exact = vfail[c & 1] != 0u;  // a column spans more than 2 FIT_LIMIT: R = G_C, the exact sum");
    c("if (wt == 0) vfail[(c + 1) & 1] = 0u;  // the next chunk's word: every thread read it a chunk ago, barriers since");
    c("const auto R_of = [&](int j) { return exact ? gv[(C - 1) * GS + j] : rv[j]; };");
    c("if (half_g == 0) pend_mine = exact ? 0.0f : gv[(C - 1) * GS + col_g] - rv[col_g];  // the next chunk's");
    c("");
    c("// 2b. With S's true columns 2^pend S: S *= 2^(pend + R) and st = bf16(S), so that o = q st is 2^R");
    c("//     times the state's part (where a column does not fit: st = bf16(2^pend S), S *= 2^(pend + G_C));");
    c("//     vt = v 2^(R - G_s).");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {");
    c.in();
    c("float fst[2], fS[2];  // st's and S's factors of columns 8 nb + 2 tig + e");
    c("LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
    c("  const int j = 8 * nb + 2 * tig + e;");
    c("  fst[e] = ladle_exp2(exact ? pend[j] : pend[j] + rv[j]);");
    c("  fS[e] = exact ? ladle_exp2(pend[j] + gv[(C - 1) * GS + j]) : fst[e];");
    c("}");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
    c("    float* const x = &S[mt][nb][2 * half];");
    c("    *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(x[0] * fst[0], x[1] * fst[1]);");
    c("    x[0] *= fS[0], x[1] *= fS[1];");
    c("  }");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int i = 0; i < C * 8 / 128; ++i) {  // 16-byte pieces: piece e of row e / 8 holds columns col0 .. col0 + 7");
    c.in();
    c("const int e = wt + 128 * i, row = e / 8, col0 = 8 * ((e % 8) ^ (row & 7));");
    c("const int step = REVERSE ? C - 1 - row : row;");
    c("float x[8];");
    c("ladle_unpack8_bf16(x, ladle_ld16(v_box + 8 * e));");
    c("const ladle_vf4* const g4 = reinterpret_cast<const ladle_vf4*>(gv + step * GS + col0);");
    c("const ladle_vf4* const r4 = reinterpret_cast<const ladle_vf4*>(exact ? gv + (C - 1) * GS + col0 : rv + col0);");
    c("LADLE_UNROLL for (int w = 0; w < 2; ++w) {");
    c("  const ladle_vf4 gs = g4[w], rs = r4[w];");
    c("  LADLE_UNROLL for (int u = 0; u < 4; ++u) x[4 * w + u] = step < valid ? x[4 * w + u] * ladle_exp2(rs.x[u] - gs.x[u]) : 0.0f;");
    c("}");
    c("ladle_store8_bf16(vt + 8 * e, x);");
    c.out();
    c("}");
    c("ladle_fence_proxy_async();  // st and vt, written through the generic proxy, before wgmma reads them");
    c("ladle_named_barrier_sync(1 + consumer, 128);");
    c("");
    emit_batch("vt_offset");
    c("");
    c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows");
    c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
    c("if (!exact) {");
    c.in();
    c("// 2d. P from the scores: step s before or at step t, s a token of the sequence.");
    emit_p("step_s <= step_t && step_s < valid ? score[nb][r] : 0.0f");
    c("// 2e. o += P vt (P from registers, vt N-major), then o *= scale 2^(G_t - R).");
    c("ladle_wgmma_fence();");
    c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
    c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (vt_offset + kk * 2048) / 16);");
    c("ladle_wgmma_commit();");
    c("ladle_wgmma_wait<0>();  // the update and o += P vt done");
    c("ladle_wgmma_fence_operand<64>(o_acc);");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) {  // two columns a load (GS = 72: conflict-free for the 8 rows)");
    c.in();
    c("const int j = 8 * nb + 2 * tig;");
    c("const ladle_vf2 ga = *reinterpret_cast<const ladle_vf2*>(gv + step_a * GS + j), gb = *reinterpret_cast<const ladle_vf2*>(gv + step_b * GS + j);");
    c("const ladle_vf2 rj = *reinterpret_cast<const ladle_vf2*>(rv + j);");
    c("LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
    c("  o_acc[nb][e] *= read_scale * ladle_exp2(ga.x[e] - rj.x[e]);");
    c("  o_acc[nb][2 + e] *= read_scale * ladle_exp2(gb.x[e] - rj.x[e]);");
    c("}");
    c.out();
    c("}");
    c.out();
    c("} else {");
    c.in();
    c("ladle_wgmma_wait<0>();  // the batch done");
    c("ladle_wgmma_fence_operand<64>(score);");
    c("ladle_wgmma_fence_operand<64>(o_acc);");
    c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)  // o's state part times 2^(G_t) per element");
    c("  LADLE_UNROLL for (int r = 0; r < 4; ++r)");
    c("    o_acc[nb][r] *= ladle_exp2(gv[(r < 2 ? step_a : step_b) * GS + 8 * nb + 2 * tig + (r & 1)]);");
    c("ladle_named_barrier_sync(1 + consumer, 128);  // every warp's update has read vt");
    c("// 2e'. P in vt's place (bf16, [t row][s row]), then o_t += sum_s P_ts 2^(G_t - G_s) v_s per element.");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c("    const int s = 8 * nb + 2 * tig + (r & 1), row = r < 2 ? ta : tb;");
    c("    const int step_s = REVERSE ? C - 1 - s : s, step_t = r < 2 ? step_a : step_b;");
    c("    vt[row * 64 + s] = step_s <= step_t && step_s < valid ? static_cast<unsigned short>(ladle_pack_bf16(score[nb][r], 0.0f) & 0xffffu) : 0;");
    c("  }");
    c("ladle_named_barrier_sync(1 + consumer, 128);  // P");
    c("LADLE_UNROLL_1 for (int s = 0; s < C; ++s) {");
    c.in();
    c("const int step_s = REVERSE ? C - 1 - s : s;");
    c("if (step_s >= valid) continue;");
    c("const float pa = step_s <= step_a ? ladle_bf16_float(vt[ta * 64 + s]) : 0.0f;");
    c("const float pb = step_s <= step_b ? ladle_bf16_float(vt[tb * 64 + s]) : 0.0f;");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
    c("    const int j = 8 * nb + 2 * tig + e;");
    c("    const float vs = ladle_bf16_float(v_box[swz(s, j)]), Gs = gv[step_s * GS + j];");
    c("    if (pa != 0.0f) o_acc[nb][e] += pa * vs * ladle_exp2(gv[step_a * GS + j] - Gs);");
    c("    if (pb != 0.0f) o_acc[nb][2 + e] += pb * vs * ladle_exp2(gv[step_b * GS + j] - Gs);");
    c("  }");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
    c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= read_scale;");
    c.out();
    c("}");
    c("__syncwarp();");
    c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);  // this warp is done with the stage");
    c("");
    emit_store_o();
    c("// The next chunk rewrites st, vt, G and the sums: every warp of this consumer is past its products.");
    c("ladle_named_barrier_sync(1 + consumer, 128);");
    c.out();
    c("}");
    if (spec.final_state) {
      c("// S's true columns for the final state: the last chunk's pending 2^(G_C - R).");
      c("if (half_g == 0) pend[col_g] = pend_mine;");
      c("ladle_named_barrier_sync(1 + consumer, 128);");
      c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
      c("  LADLE_UNROLL for (int e = 0; e < 2; ++e) {");
      c("    const float factor = ladle_exp2(pend[8 * nb + 2 * tig + e]);");
      c("    LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) S[mt][nb][e] *= factor, S[mt][nb][2 + e] *= factor;");
      c("  }");
    }
  };
  if (kserial) {
    emit_kserial();
  } else if (vgate) {
    emit_vserial();
  } else {
    if (has_gate) {
      bool token_gate = false;
      for (std::size_t k = 0; k < inputs.size(); ++k) token_gate = token_gate || gate_reads[k];
      if (token_gate) c("// The per-token gate inputs of the next chunk's steps 2 lane and 2 lane + 1, loaded a chunk ahead.");
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (gate_reads[k]) c("float " + id[k] + "_next[2] = {0.0f, 0.0f};");
      const auto load_next = [&](const std::string& chunk) {
        bool any = false;
        for (std::size_t k = 0; k < inputs.size(); ++k) any = any || gate_reads[k];
        if (!any) return;
        c("LADLE_UNROLL for (int u = 0; u < 2; ++u) {");
        c.in();
        c("const long long step = static_cast<long long>(" + chunk + ") * C + 2 * lane + u;");
        c("const bool live = step < length;");
        c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
        for (std::size_t k = 0; k < inputs.size(); ++k)
          if (gate_reads[k])
            c(id[k] + "_next[u] = live ? ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + t * " + id[k] + "_stride_t + " + id[k] +
              "_head * " + id[k] + "_stride_h) : 0.0f;");
        c.out();
        c("}");
      };
      load_next("0");
      c("");
      chunk_loop_head();
      c("// 2a. The cumulative log2 decay G of this chunk's steps (step = token order in the recurrence's");
      c("//     direction), per warp: steps 2 lane and 2 lane + 1, a scan over the lanes.");
      c("float g[2];");
      c("LADLE_UNROLL for (int u = 0; u < 2; ++u) {");
      c.in();
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (gate_reads[k]) c("const float " + id[k] + "_t = " + id[k] + "_next[u];");
      c("const float x = LOG2E * (" + render_slot(variant, id, ir::Slot::log_decay_head, "") + ");");
      c("g[u] = 2 * lane + u < valid ? (x > GATE_FLOOR ? x : GATE_FLOOR) : 0.0f;");
      c.out();
      c("}");
      load_next("c + 1");
    } else {
      c("");
      chunk_loop_head();
      c("float g[2] = {0.0f, 0.0f};  // no decay");
    }
    c("float prefix = g[0] + g[1], total = prefix;  // inclusive scan of the lanes' pair sums");
    c("LADLE_UNROLL for (int d = 1; d < 32; d *= 2) {");
    c("  const float other = __shfl_xor_sync(0xffffffffu, total, d);");
    c("  if (lane & d) prefix += other;");
    c("  total += other;");
    c("}");
    c("gsum[2 * lane] = prefix - g[1];");
    c("gsum[2 * lane + 1] = prefix;");
    c("__syncwarp();");
    c("const float G_C = gsum[valid - 1];  // the chunk's total");
    c("");
    c("// 2b. The state's bf16 copy for o = q st, v's rows times 2^(G_C - G_s) for the update, then S's decay.");
    c("ladle_mbarrier_wait(&full[stage], parity);");
    c("const unsigned stage_offset = stage * STAGE_BYTES;");
    c("const unsigned short* const v_box = ring + (stage_offset + (VB + consumer) * BOX) / 2;");
    if (kgate) {
      c("// The key-side gate: thread wt owns key feature wt; the chunk's total per feature, then kup.");
      c("if (wt < BK) {");
      c.in();
      c("const int fb = wt / 64, fc = wt % 64;");
      c("const unsigned short* const k_box = ring + (stage_offset + fb * BOX) / 2;");
      // Eight steps at a time with independent loads (a loop over single steps was latency-bound: the
      // state pass took 0.71 ms at GLA B2 T16384 on the H100 against 0.10 ms for a per-head decay).
      const auto eight_gates = [&] {
        c("float lgs[8];");
        c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
        c.in();
        c("const int step = s0 + u, row = REVERSE ? C - 1 - step : step;");
        gate_at("row");
        c("lgs[u] = step < valid ? lg : 0.0f;");
        c.out();
        c("}");
      };
      c("float tot = 0.0f;");
      c("LADLE_UNROLL_1 for (int s0 = 0; s0 < C; s0 += 8) {");
      c.in();
      eight_gates();
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) tot += lgs[u];");
      c.out();
      c("}");
      c("gtot[wt] = tot;");
      c("segment_log += tot;");
      c("float G = 0.0f;");
      c("LADLE_UNROLL_1 for (int s0 = 0; s0 < C; s0 += 8) {");
      c.in();
      eight_gates();
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
      c.in();
      c("const int step = s0 + u, row = REVERSE ? C - 1 - step : step;");
      c("G += lgs[u];");
      c("const float w = step < valid ? ladle_exp2(tot - G) : 0.0f;");
      c("const float kx = ladle_bf16_float(k_box[swz(row, fc)]);");
      c("vup[fb * (BOX / 2) + swz(row, fc)] = static_cast<unsigned short>(ladle_pack_bf16(kx * w, 0.0f) & 0xffffu);");
      c.out();
      c("}");
      c.out();
      c("}");
      c.out();
      c("}");
      c("ladle_named_barrier_sync(1 + consumer, 128);  // every feature's total in gtot");
    } else if (states) {
      c("segment_log += G_C;");
    } else {
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
      c("    LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c("      const int feat = 64 * mt + 16 * warp + gid + 8 * half;");
      c("      *reinterpret_cast<unsigned*>(st + swz(feat, 8 * nb + 2 * tig)) = ladle_pack_bf16(S[mt][nb][2 * half], S[mt][nb][2 * half + 1]);");
      c("    }");
    }
    if (kgate) {
      c("(void)v_box;");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c("    const float decay = ladle_exp2(gtot[64 * mt + 16 * warp + gid + 8 * half]);  // the key row's");
      c("    LADLE_UNROLL for (int nb = 0; nb < 8; ++nb) S[mt][nb][2 * half] *= decay, S[mt][nb][2 * half + 1] *= decay;");
      c("  }");
    } else {
      c("LADLE_UNROLL for (int i = 0; i < C * 8 / 128; ++i) {  // 16-byte pieces, as swizzled: the row is what matters");
      c.in();
      c("const int e = wt + 128 * i, row = e / 8;");
      c("const int step = REVERSE ? C - 1 - row : row;");
      c("const float w = step < valid ? ladle_exp2(G_C - gsum[step]) : 0.0f;");
      c("float x[8];");
      c("ladle_unpack8_bf16(x, ladle_ld16(v_box + 8 * e));");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] *= w;");
      c("ladle_store8_bf16(vup + 8 * e, x);");
      c.out();
      c("}");
      c("const float decay = ladle_exp2(G_C);");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
      c("    LADLE_UNROLL for (int r = 0; r < 4; ++r) S[mt][nb][r] *= decay;");
    }
    c("ladle_fence_proxy_async();  // st and vup, written through the generic proxy, before wgmma reads them");
    c("ladle_named_barrier_sync(1 + consumer, 128);");
    c("");
    if (states) {
      c("// 2c. The update alone: S += k^T vup (k M-major, vup N-major; the next 16 tokens 2048 bytes on).");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
      c("ladle_wgmma_fence();");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt)");
      c("  LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
      if (kgate)  // A = kup^T (its box mt), B = v as copied
        c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (vup_offset + mt * BOX + kk * 2048) / 16, desc + (stage_offset + VB * BOX + consumer * BOX + kk * 2048) / 16);");
      else
        c("    ladle_wgmma_ss_bf16_tab<64>(S[mt], desc + (stage_offset + mt * BOX + kk * 2048) / 16, desc + (vup_offset + kk * 2048) / 16);");
      c("ladle_wgmma_commit();");
      c("ladle_wgmma_wait<0>();  // the stage and vup are free");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
      c("__syncwarp();");
      c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);");
    } else {
      emit_batch("vup_offset");
      c("");
      c("// 2d. P from the scores: step s before or at step t, s a token of the sequence.");
      c("const int ta = 16 * warp + gid, tb = ta + 8;  // this thread's rows");
      c("const int step_a = REVERSE ? C - 1 - ta : ta, step_b = REVERSE ? C - 1 - tb : tb;");
      c("const float G_a = gsum[step_a], G_b = gsum[step_b];");
      emit_p("step_s <= step_t && step_s < valid ? score[nb][r] * read_scale * ladle_exp2((r < 2 ? G_a : G_b) - gsum[step_s]) : 0.0f");
      c("ladle_wgmma_wait<1>();  // o = q st done");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("const float f_a = read_scale * ladle_exp2(G_a), f_b = read_scale * ladle_exp2(G_b);");
      c("LADLE_UNROLL for (int nb = 0; nb < 8; ++nb)");
      c("  LADLE_UNROLL for (int r = 0; r < 4; ++r) o_acc[nb][r] *= r < 2 ? f_a : f_b;");
      c("// 2e. o += P v (P from registers, v N-major in the stage).");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("ladle_wgmma_fence();");
      c("LADLE_UNROLL for (int kk = 0; kk < C / 16; ++kk)");
      c("  ladle_wgmma_rs_bf16<64>(o_acc, p_frag[kk], desc + (stage_offset + (VB + consumer) * BOX + kk * 2048) / 16);");
      c("ladle_wgmma_commit();");
      c("ladle_wgmma_wait<0>();  // the update and o += P v done: the stage, st and vup are free");
      c("ladle_wgmma_fence_operand<64>(o_acc);");
      c("LADLE_UNROLL for (int mt = 0; mt < KB; ++mt) ladle_wgmma_fence_operand<64>(S[mt]);");
      c("__syncwarp();");
      c("if (lane == 0) ladle_mbarrier_arrive(&empty[stage]);");
      c("");
      emit_store_o();
    }
    c("// The next chunk rewrites st, vup and gsum: every warp of this consumer is past its products.");
    c("ladle_named_barrier_sync(1 + consumer, 128);");
    c.out();
    c("}");
  }
  if (states) {
    c("");
    c("// The segment's own final state and total log2 decay, for the fold and the segments after it.");
    for_state([&] {
      c("if (feat < K && col < V) segment_states[((static_cast<long long>(n) * H + h) * K + feat) * V + col] = S[mt][nb][r];");
    });
    if (kgate) c("if (blockIdx.x == 0 && consumer == 0 && wt < K) segment_decay[(static_cast<long long>(n) * H + h) * K + wt] = segment_log;");
    else if (has_gate) c("if (blockIdx.x == 0 && consumer == 0 && wt == 0) segment_decay[static_cast<long long>(n) * H + h] = segment_log;");
  }
  if (spec.final_state) {
    c("");
    if (segmented) c("if (seg[6] != 0) {  // the sequence's last segment");
    for_state([&] {
      c("if (feat < K && col < V) final_state[((" + sequence_index + " * H + h) * K + feat) * V + col] = S[mt][nb][r];");
    });
    if (segmented) c("}");
  }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace ladle::cuda::detail
