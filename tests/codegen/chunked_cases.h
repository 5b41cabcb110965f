// The chunked kernels the codegen-cuda_chunked test runs on the host emulation: every case of
// cuda_cases.h the family supports (no normaliser), over sequences long enough for several
// chunks and partial ones, with a sweep of tiles; plus gates strong enough to force 16-token
// and single-token steps, and hard resets (gates of -inf). chunked_emit renders them at build
// time.
#pragma once

#include <ladle/codegen/cuda/chunked.h>

#include <algorithm>
#include <limits>
#include <string>

#include "cuda_cases.h"

namespace chunked_cases {

struct Case {
  cuda_cases::Case c;  // the variant, sizes and types (c.spec.tile is not used)
  ladle::cuda::ChunkedTile tile;
  ladle::cuda::ChunkedKernelSpec spec() const {
    ladle::cuda::ChunkedKernelSpec s;
    static_cast<ladle::cuda::KernelTypes&>(s) = c.spec;
    s.tile = tile;
    if (tile.wgmma || tile.ws) s.arch = "sm_90a";
    return s;
  }
};

inline std::vector<Case> all() {
  using ladle::cuda::ChunkedTile;
  std::vector<Case> cases;
  int i = 0;
  for (cuda_cases::Case c : cuda_cases::all()) {
    if (!ladle::cuda::chunked_unsupported(c.variant).empty()) continue;
    if (c.cu_seqlens.empty()) c.T = 45;
    else c.cu_seqlens = {0, 37, 37, 90}, c.T = 90;
    const int block_k = (c.K + 15) / 16 * 16;
    const ChunkedTile tiles[] = {{block_k, 16, 16, 2}, {block_k, 32, 16, 2}, {block_k, 64, 32, 4}, {block_k, 32, 32, 8}};
    cases.push_back({c, tiles[i++ % 4]});
  }
  // Gate strength: near -2.5 per token a 64-token chunk no longer fits one reference token
  // (16-token steps); near -10 neither does a 16-token step (single tokens).
  const auto retype = [](cuda_cases::Case& c, ladle::DType gates = ladle::DType::f32) {  // bf16 q, k, v and o
    using E = ladle::DType;
    c.spec.input_types.clear();
    for (const ladle::ir::Input& in : c.variant.inputs)
      c.spec.input_types.push_back(in.kind == ladle::ir::InputKind::scalar ? E::f32 : in.role == ladle::ir::Role::other ? gates : E::bf16);
    c.spec.output_type = E::bf16;
  };
  // Hard resets: log gates of -inf (or finite, below what fp32 can tell from -inf after exp)
  // where cuda_cases::hard_reset_at says: chunk starts, middles, ends and runs of tokens, over
  // 150 tokens in chunks of 16, 32 and 64, forward and reverse; per key dimension, per value
  // dimension, a per-token head gate, and g_gamma of -inf for head 0 (every token resets).
  {
    using ladle::recurrent_variant;
    namespace dsl = ladle::dsl;
    const double inf = std::numeric_limits<double>::infinity();
    const ladle::ir::Variant head_gate =
        dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(dsl::token_head("g_t")), dsl::q, dsl::scalar("scale")), "head_gate");
    const ladle::ir::Variant read_before_head =
        dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_head(dsl::token_head("g_t")), dsl::q, dsl::scalar("scale")),
                   "read_before_head_gate");
    struct Reset {
      const char* name;
      ladle::ir::Variant variant;
      double value;
      bool reverse, states;
      ladle::DType gates;
      ChunkedTile tile;
    };
    using E = ladle::DType;
    const Reset resets[] = {
        {"GLA, -inf per key dimension", recurrent_variant(true, false, false, false), -inf, false, true, E::f32, {16, 64, 16, 4}},
        {"GLA, -inf per key dimension, bf16 gates, reverse", recurrent_variant(true, false, false, false), -inf, true, false, E::bf16, {16, 16, 16, 2}},
        {"-inf per value dimension", recurrent_variant(false, false, true, false), -inf, false, true, E::f32, {16, 32, 16, 2}},
        {"-inf per value dimension, reverse", recurrent_variant(false, false, true, false), -inf, true, false, E::f16, {16, 64, 16, 8}},
        {"a per-token head gate of -inf", head_gate, -inf, false, true, E::f32, {16, 64, 32, 4}},
        {"a per-token head gate of -inf, reverse", head_gate, -inf, true, true, E::bf16, {16, 16, 16, 2}},
        {"g_gamma of -inf for head 0", recurrent_variant(false, false, false, true), -inf, true, true, E::f32, {16, 32, 16, 2}},
        {"-inf in g, gk, gv and g_gamma", recurrent_variant(true, true, true, true), -inf, false, true, E::f32, {16, 64, 16, 4}},
        {"-inf in g, gk, gv and g_gamma, reverse", recurrent_variant(true, true, true, true), -inf, true, true, E::f32, {16, 32, 16, 2}},
        {"GLA and gv, gates of -1e4", recurrent_variant(true, false, true, false), -1e4, false, true, E::f32, {16, 64, 16, 4}},
        {"every gate of -1e30", recurrent_variant(true, true, true, true), -1e30, false, true, E::f32, {16, 16, 16, 2}},
        {"GLA, gates of -200 (log2 -289)", recurrent_variant(true, false, false, true), -200, false, true, E::f32, {16, 64, 16, 8}},
        {"GLA, gates of -100 (finite, strong)", recurrent_variant(true, false, false, false), -100, false, true, E::f32, {16, 64, 16, 4}},
        // A read before the update reads the state as it entered the token, reset or not.
        {"RWKV6, -inf per key dimension", ladle::rwkv6_variant(), -inf, false, true, E::f32, {16, 64, 16, 4}},
        {"RWKV6, -inf per key dimension, bf16 gates, reverse", ladle::rwkv6_variant(), -inf, true, true, E::bf16, {16, 16, 16, 2}},
        {"RWKV6, gates of -100 (finite, strong)", ladle::rwkv6_variant(), -100, false, true, E::f32, {16, 32, 16, 8}},
        {"a read before the update, a per-token head gate of -inf", read_before_head, -inf, true, true, E::f32, {16, 64, 32, 4}},
    };
    for (const Reset& r : resets) {
      cuda_cases::Case c = cuda_cases::all()[0];
      c.name = std::string("hard resets: ") + r.name;
      c.variant = r.variant;
      c.hard_reset = r.value;
      c.T = 150;
      c.spec.reverse = r.reverse;
      c.spec.initial_state = c.spec.final_state = r.states;
      retype(c, r.gates);
      cases.push_back({c, r.tile});
    }
  }
  for (const double level : {-2.5, -10.0}) {
    cuda_cases::Case c = cuda_cases::all()[0];
    c.variant = ladle::recurrent_variant(true, true, true, true);  // g, gk, gv, g_gamma
    c.name = "every gate near " + std::to_string(level);
    c.gate_level = level;
    c.T = 150;
    c.spec.initial_state = c.spec.final_state = true;
    retype(c);
    cases.push_back({c, {16, 64, 16, 4}});
    c.name = "GLA near " + std::to_string(level);
    c.variant = ladle::recurrent_variant(true, false, false, false);
    c.spec.reverse = true;
    retype(c);
    cases.push_back({c, {16, 64, 16, 8}});
    c.name = "RWKV6 near " + std::to_string(level);
    c.variant = ladle::rwkv6_variant();
    c.spec.reverse = level < -5;
    retype(c);
    cases.push_back({c, {16, 64, 16, 4}});
    c.spec.reverse = true;
    c.name = "g_gamma near " + std::to_string(level);
    c.variant = ladle::recurrent_variant(false, false, false, true);
    retype(c);
    cases.push_back({c, {16, 32, 16, 2}});  // (kept last: the source test reads it)
  }
  return cases;
}

// The serial form with its state update on wgmma (sm_90a) on every case above: block_k rounded up
// to whole warpgroups' rows (64 per 4 warps), 4 or 8 warps, chunks of 16, 32 and 64 tokens, the
// value width of the case's own tile.
inline std::vector<Case> wgmma() {
  std::vector<Case> cases;
  int i = 0;
  for (Case c : all()) {
    const int block_k = (c.tile.block_k + 63) / 64 * 64;
    const int chunks[] = {16, 32, 64};
    c.tile = {block_k, chunks[i % 3], c.tile.block_v, i % 2 == 1 && block_k % 128 == 0 ? 8 : 4};
    c.tile.wgmma = true;
    c.c.name += " (wgmma)";
    cases.push_back(c);
    ++i;
  }
  // Two warpgroups over a 128-row state (the tiles above have one): GLA at K = V = 128, bf16 q, k,
  // v and gates, 64-token chunks, value tiles of 16 and 32 columns.
  for (const int block_v : {16, 32}) {
    Case c{cuda_cases::all()[0], {128, 64, block_v, 8}};
    c.c.name = "GLA K=V=128, two warpgroups, block_v " + std::to_string(block_v) + " (wgmma)";
    c.c.variant = ladle::recurrent_variant(true, false, false, false);
    c.c.K = c.c.V = 128, c.c.B = 1, c.c.H = 2, c.c.H_kv = 2, c.c.T = 150;
    c.c.spec.initial_state = c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), ladle::DType::bf16);
    for (std::size_t k = 0; k < c.c.variant.inputs.size(); ++k)
      if (c.c.variant.inputs[k].kind == ladle::ir::InputKind::scalar) c.c.spec.input_types[k] = ladle::DType::f32;
    c.c.spec.output_type = ladle::DType::bf16;
    c.tile.wgmma = true;
    cases.push_back(c);
  }
  return cases;
}

// The warp-specialised Hopper form (sm_90a: TMA producer, wgmma consumers) on every case above it
// runs (a decay of at most a per-head scalar, or a key-side gate alone; q, k and v as they are), with
// bf16 q, k, v and o over 150 tokens (packed: 130, 0 and 70), so that sequences span several 64-token
// chunks and end in a partial one; block_v 64 (one consumer warpgroup) and 128 (two). A key-side
// gate's inputs in bf16 or f16 (TMA copies them): its strong-gate and hard-reset cases take the
// 8-token windows and single tokens. Plus K = V = 128 with GQA and states (two key boxes, two
// consumers with live columns), a user's per-token head gate over packed reversed sequences, GLA
// at K = V = 128 with states, a value-side gate alone (one reference per column, and strong enough
// for the exact sum), and no decay at all with T below a chunk.
inline void bf16_io(cuda_cases::Case& c) {
  using E = ladle::DType;
  for (std::size_t k = 0; k < c.variant.inputs.size(); ++k)
    if (c.variant.inputs[k].role != ladle::ir::Role::other) c.spec.input_types[k] = E::bf16;
  c.spec.output_type = E::bf16;
}

inline ladle::cuda::ChunkedTile ws_tile(int K, int block_v) {
  ladle::cuda::ChunkedTile tile{K <= 64 ? 64 : 128, 64, block_v, 4 + block_v / 16};
  tile.ws = true;
  return tile;
}

inline std::vector<Case> ws();

// The ws cases whose serial kernel can also write its chunks' entry states (chunk_states_out: a
// key-side gate or a head decay, no read before the update), with that flag set in spec_of().
inline bool writes_chunk_states(const Case& c) {
  const ladle::ir::Variant& v = c.c.variant;
  return !v.has(ladle::ir::Slot::log_decay_v) && !v.read_before_update;
}
inline ladle::cuda::ChunkedKernelSpec chunk_states_spec(const Case& c) {
  ladle::cuda::ChunkedKernelSpec spec = c.spec();
  spec.chunk_states_out = true;
  return spec;
}
inline std::vector<Case> ws_chunk_states() {
  std::vector<Case> out;
  for (const Case& c : ws())
    if (writes_chunk_states(c)) out.push_back(c);
  return out;
}

inline std::vector<Case> ws() {
  namespace dsl = ladle::dsl;
  using E = ladle::DType;
  std::vector<Case> cases;
  int i = 0;
  const auto add = [&](Case c) {
    ladle::cuda::ChunkedKernelSpec spec = c.spec();
    spec.arch = "sm_90a";
    if (!ladle::cuda::chunked_ws_unsupported(c.c.variant, spec).empty()) return;
    c.c.name += " (ws)";
    cases.push_back(c);
  };
  int key = 0;
  for (Case c : all()) {
    const ladle::ir::Variant& v = c.c.variant;
    const bool key_gate = v.has(ladle::ir::Slot::log_decay_k) && !v.has(ladle::ir::Slot::log_decay_v) &&
                          !v.has(ladle::ir::Slot::log_decay_head);
    const bool value_gate = v.has(ladle::ir::Slot::log_decay_v) && !v.has(ladle::ir::Slot::log_decay_k) &&
                            !v.has(ladle::ir::Slot::log_decay_head);
    if (!ladle::cuda::chunked_head_decay_only(v) && !key_gate && !value_gate) continue;
    bf16_io(c.c);
    if (key_gate || value_gate)
      for (int k : ladle::cuda::chunked_ws_gate_inputs(v)) c.c.spec.input_types[k] = key++ % 3 == 2 ? E::f16 : E::bf16;
    c.c.K = (c.c.K + 7) / 8 * 8, c.c.V = (c.c.V + 7) / 8 * 8;  // TMA: rows of whole 16 bytes
    if (c.c.cu_seqlens.empty()) c.c.T = std::max(c.c.T, 150);
    else c.c.cu_seqlens = {0, 130, 130, 200}, c.c.T = 200;
    c.tile = ws_tile(c.c.K, i++ % 2 == 0 ? 64 : 128);
    add(c);
  }
  Case base{cuda_cases::all()[0], ws_tile(128, 128)};
  {
    Case c = base;
    c.c.name = "simple GLA K=V=128, GQA 4/2, h0 and final state";
    c.c.variant = ladle::recurrent_variant(false, false, false, true);
    c.c.K = c.c.V = 128, c.c.B = 1, c.c.H = 4, c.c.H_kv = 2, c.c.T = 150;
    c.c.spec.initial_state = c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    add(c);
  }
  {
    Case c = base;
    c.c.name = "a user's head gate -softplus(dt) * A, packed, reverse, V = 96";
    c.c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(-dsl::softplus(dsl::token_head("dt")) * dsl::head_param("A")),
                                       dsl::q, dsl::scalar("scale")),
                             "mamba2_like");
    c.c.K = 64, c.c.V = 96, c.c.H = 2, c.c.H_kv = 2;
    c.c.cu_seqlens = {0, 130, 130, 200}, c.c.T = 200, c.c.B = 1;
    c.c.spec.varlen = true;
    c.c.spec.reverse = true;
    c.c.spec.initial_state = c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    c.tile = ws_tile(64, 128);
    add(c);
  }
  {
    Case c = base;
    c.c.name = "GLA K=V=128, GQA 4/2, h0 and final state, reverse";
    c.c.variant = ladle::recurrent_variant(true, false, false, false);
    c.c.K = c.c.V = 128, c.c.B = 1, c.c.H = 4, c.c.H_kv = 2, c.c.T = 150;
    c.c.spec.reverse = true;
    c.c.spec.initial_state = c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    for (int k : ladle::cuda::chunked_ws_gate_inputs(c.c.variant)) c.c.spec.input_types[k] = E::bf16;
    add(c);
  }
  // A value-side gate alone (the recurrences of GLA's backward that carry the gate on their output
  // side): gates that fit one reference per column, and gates near -2.5 per token that do not (the
  // exact per-element sum), a user's gate expression over packed sequences.
  for (const double level : {-1.0, -2.5}) {
    Case c = base;
    c.c.name = "a value gate near " + std::to_string(level) + ", K=V=128, GQA 4/2, h0 and final state, reverse";
    c.c.variant = ladle::recurrent_variant(false, false, true, false);
    c.c.K = c.c.V = 128, c.c.B = 1, c.c.H = 4, c.c.H_kv = 2, c.c.T = 150;
    c.c.gate_level = level;
    c.c.spec.reverse = level < -2;
    c.c.spec.initial_state = c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    for (int k : ladle::cuda::chunked_ws_gate_inputs(c.c.variant)) c.c.spec.input_types[k] = E::bf16;
    add(c);
  }
  {
    Case c = base;
    c.c.name = "a user's value gate logsigmoid(y) / tau, packed, V = 96";
    c.c.variant = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_v(dsl::logsigmoid(dsl::token_value("y")) / dsl::head_param("tau")),
                                       dsl::q, dsl::scalar("scale")),
                             "value_gate");
    c.c.K = 64, c.c.V = 96, c.c.H = 2, c.c.H_kv = 2;
    c.c.cu_seqlens = {0, 130, 130, 200}, c.c.T = 200, c.c.B = 1;
    c.c.spec.varlen = true;
    c.c.spec.initial_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    for (int k : ladle::cuda::chunked_ws_gate_inputs(c.c.variant)) c.c.spec.input_types[k] = E::f16;
    c.tile = ws_tile(64, 128);
    add(c);
  }
  {
    Case c = base;
    c.c.name = "no decay, T = 40 below a chunk";
    c.c.variant = ladle::recurrent_variant(false, false, false, false);
    c.c.K = 64, c.c.V = 64, c.c.T = 40;
    c.c.spec.final_state = true;
    c.c.spec.input_types.assign(c.c.variant.inputs.size(), E::f32);
    bf16_io(c.c);
    c.tile = ws_tile(64, 64);
    add(c);
  }
  return cases;
}

// The split form (a state pass, then every chunk's output in parallel) on every case above,
// with state tiles that cover K or split it (K = 32, 40), one to four warps, bf16 and fp32
// per-chunk states.
inline std::vector<Case> split() {
  std::vector<Case> cases;
  int i = 0;
  for (Case c : all()) {
    const int full = c.tile.block_k;
    struct StateTile {
      int block_k, block_v, warps;
      bool f32;
    };
    const StateTile tiles[] = {{16, 16, 1, false}, {full, 32, 2, true}, {16, 16, 4, false}, {full, 16, 2, false}};
    const StateTile& t = tiles[i++ % 4];
    c.tile.state_block_k = t.block_k;
    c.tile.state_block_v = t.block_v;
    c.tile.state_warps = t.warps;
    c.tile.state_f32 = t.f32;
    c.c.name += " (split)";
    cases.push_back(c);
  }
  return cases;
}

// The segmented form (a state pass over every segment but the last of its sequence, then the
// serial form over every segment) on every case above: segments of 16 to 64 tokens, so that most
// sequences have several and a partial last one, hard resets and strong gates fall on both sides
// of their boundaries; the first kernel's state tiles and chunk vary as in split(), and it runs
// each earlier segment whole or in 2 to 4 pieces.
struct SegmentedCase {
  Case c;                      // the serial kernel's case (c.c.spec: the call's types)
  ladle::cuda::ChunkedTile first;  // the first kernel's (split) tile
  std::int64_t segment_tokens;
  std::int64_t state_pieces = 1;  // the state pass's pieces per earlier segment (chunked_segments)
  ladle::cuda::ChunkedKernelSpec serial_spec() const {
    ladle::cuda::ChunkedKernelSpec s = c.spec();
    s.segmented = true;
    s.varlen = false;
    return s;
  }
  ladle::cuda::ChunkedKernelSpec fold_spec() const {
    ladle::cuda::ChunkedKernelSpec s = serial_spec();
    s.phase = ladle::cuda::ChunkedPhase::fold;
    return s;
  }
  ladle::cuda::ChunkedKernelSpec first_spec() const {
    ladle::cuda::ChunkedKernelSpec s = serial_spec();
    s.tile = first;
    if (first.ws) s.arch = "sm_90a";
    s.phase = ladle::cuda::ChunkedPhase::states;
    s.initial_state = s.final_state = false;
    // The suffix form where the variant takes it, as the library's plan asks for it.
    if (!first.ws) s.suffix_states = ladle::cuda::chunked_suffix_states_unsupported(c.c.variant, s).empty();
    return s;
  }
};

inline std::vector<SegmentedCase> segmented() {
  std::vector<SegmentedCase> cases;
  int i = 0;
  const std::vector<Case> split_cases = split(), wgmma_cases = wgmma();
  for (const Case& c : all()) {
    ladle::cuda::ChunkedTile first = split_cases[static_cast<std::size_t>(i)].tile;
    if (i % 2 == 0) first.chunk = 64, first.warps = std::max(first.warps, 4);  // the states phase does not use warps
    Case serial = c;
    if (i % 3 == 1) serial.tile = wgmma_cases[static_cast<std::size_t>(i)].tile;  // the serial kernel on wgmma
    serial.c.name += " (segmented)";
    // Every other case in bf16 (q, k, v and o; the gates bf16 or as they were), where the state pass
    // takes its suffix form (detail/chunked_suffix.h) if the variant allows it.
    if (i % 2 == 1) {
      using E = ladle::DType;
      cuda_cases::Case& t = serial.c;
      for (std::size_t k = 0; k < t.variant.inputs.size() && k < t.spec.input_types.size(); ++k) {
        const ladle::ir::Input& in = t.variant.inputs[k];
        if (in.kind == ladle::ir::InputKind::scalar) continue;
        if (in.role != ladle::ir::Role::other || i % 4 == 1) t.spec.input_types[k] = E::bf16;
      }
      t.spec.output_type = E::bf16;
      t.name += " bf16";
    }
    const std::int64_t lengths[] = {16, 48, 32, 64, 40};
    const std::int64_t pieces[] = {1, 2, 3, 1, 4, 2, 1};  // 3 of 16, 48 or 32 tokens: pieces of 6, 16 or 11, the last shorter
    SegmentedCase sc{serial, first, lengths[i % 5], pieces[i % 7]};
    // Where the state pass takes its suffix form (64-token chunks), segments of 130 tokens over
    // 200, whole or in two pieces of 65: the pass walks several chunks of each.
    if (sc.first_spec().suffix_states) {
      cuda_cases::Case& t = sc.c.c;
      if (t.cu_seqlens.empty()) t.T = std::max(t.T, 200);
      else t.cu_seqlens = {0, 150, 150, 200}, t.T = 200;
      sc.segment_tokens = 130;
      sc.state_pieces = i % 4 == 1 ? 1 : 2;
    }
    cases.push_back(sc);
    ++i;
  }
  return cases;
}

// The segmented form with its serial kernel in the ws form: every other ws case, segments of 100
// tokens (partial chunks inside segments), the state pass as the library runs it (the split tile
// of the serial one, its suffix form where the variant allows).
inline std::vector<SegmentedCase> ws_segmented() {
  std::vector<SegmentedCase> cases;
  int i = 0;
  for (Case c : ws()) {
    if (i++ % 2 == 1) continue;
    ladle::cuda::ChunkedTile first{c.tile.block_k, 64, 64, 8, 64, 64, 4, false};
    if (i % 4 == 1) {  // the state pass in the ws form as well, where it runs the variant
      ladle::cuda::ChunkedTile ws{c.tile.block_k, 64, 64, 8};
      ws.ws = true;
      ladle::cuda::ChunkedKernelSpec probe = c.spec();
      probe.tile = ws, probe.phase = ladle::cuda::ChunkedPhase::states, probe.segmented = true;
      if (ladle::cuda::chunked_ws_unsupported(c.c.variant, probe).empty()) first = ws;
    }
    c.c.name += first.ws ? " (segmented, ws state pass)" : " (segmented)";
    cases.push_back({c, first, 100, i % 4 == 1 ? 2 : 1});
  }
  // A key-side gate alone (GLA, gk, a user's logsigmoid(x) / tau): the ws state pass (k, v and the
  // gate's 16-bit inputs by TMA, kup = k 2^(G_C - G_s) per key feature) or, every third case, the
  // suffix pass the library takes; then the serial form in the ws form (folding the earlier segments'
  // per-feature decays itself) or, every other case, on its own tile after the fold kernel; forward
  // and reverse, hard resets among them.
  int j = 0;
  for (Case c : all()) {
    const ladle::ir::Variant& v = c.c.variant;
    if (!v.has(ladle::ir::Slot::log_decay_k) || v.has(ladle::ir::Slot::log_decay_v) || v.has(ladle::ir::Slot::log_decay_head)) continue;
    for (std::size_t k = 0; k < v.inputs.size(); ++k)
      if (v.inputs[k].kind != ladle::ir::InputKind::scalar && v.inputs[k].kind != ladle::ir::InputKind::head)
        c.c.spec.input_types[k] = ladle::DType::bf16;
    c.c.spec.output_type = ladle::DType::bf16;
    c.c.K = (c.c.K + 7) / 8 * 8, c.c.V = (c.c.V + 7) / 8 * 8;
    if (c.c.cu_seqlens.empty()) c.c.T = 300;
    else c.c.cu_seqlens = {0, 130, 130, 300}, c.c.T = 300;
    c.tile.block_k = std::max(c.tile.block_k, (c.c.K + 15) / 16 * 16);
    ladle::cuda::ChunkedTile first{c.c.K <= 64 ? 64 : 128, 64, 64, 8};
    first.ws = true;
    ladle::cuda::ChunkedKernelSpec probe = c.spec();
    probe.tile = first, probe.phase = ladle::cuda::ChunkedPhase::states, probe.segmented = true;
    if (!ladle::cuda::chunked_ws_unsupported(v, probe).empty()) continue;
    if (j % 3 == 2) first = {c.tile.block_k, 64, 64, 8, 64, 64, 4, false};  // the suffix pass where it applies
    if (j % 2 == 0) {  // the serial form in the ws form where it runs the variant (not a read before the update)
      ladle::cuda::ChunkedKernelSpec serial = c.spec();
      serial.tile = ws_tile(c.c.K, j % 4 == 0 ? 128 : 64), serial.arch = "sm_90a";
      if (ladle::cuda::chunked_ws_unsupported(v, serial).empty()) c.tile = serial.tile;
    }
    c.c.name += std::string(" (segmented, ") + (first.ws ? "ws state pass" : "suffix state pass") + " of a key gate, " +
                (c.tile.ws ? "ws serial" : "serial") + ")";
    cases.push_back({c, first, j % 2 ? 100 : 128, j % 3 == 1 ? 2 : 1});
    ++j;
  }
  return cases;
}

}  // namespace chunked_cases
