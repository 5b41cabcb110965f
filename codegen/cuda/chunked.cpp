#include "chunked.h"

#include <algorithm>
#include <cstdio>

#include <ladle/runtime/error.h>

#include "detail/chunked_parts.h"
#include "detail/chunked_suffix.h"
#include "detail/chunked_ws.h"
#include "detail/cuda_source.h"
#include "../render_c.h"

namespace ladle::cuda {

using namespace detail;

namespace {


int largest_split(int warps, int column_tiles) {  // a power of two <= warps dividing column_tiles
  int split = 1;
  while (split * 2 <= warps && column_tiles % (split * 2) == 0) split *= 2;
  return split;
}

}  // namespace

ChunkedLayout detail::chunked_layout(const ChunkedTile& tile) {
  ChunkedLayout l;
  l.mt = tile.chunk / 16;
  l.cg = largest_split(std::max(1, tile.warps / l.mt), tile.block_v / 16);
  l.ocols = tile.block_v / l.cg;
  l.o_warps = l.mt * l.cg;
  l.smt = tile.block_k / 16;
  if (l.smt >= tile.warps) {
    l.s_wpm = 1;
    l.s_mpw = (l.smt + tile.warps - 1) / tile.warps;
    l.s_warps = tile.warps;
  } else {
    l.s_wpm = largest_split(tile.warps / l.smt, tile.block_v / 16);
    l.s_mpw = 1;
    l.s_warps = l.smt * l.s_wpm;
  }
  l.scols = tile.block_v / l.s_wpm;
  l.state_registers = l.s_mpw * l.scols / 2;
  return l;
}

namespace {

// The tile the split form's state pass runs with: its key rows, value columns and warps.
ChunkedTile state_tile(const ChunkedTile& tile) {
  return {tile.state_block_k, tile.chunk, tile.state_block_v, tile.state_warps};
}

std::vector<std::string> state_tile_rules(const ChunkedTile& tile) {
  std::vector<std::string> problems;
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  if (!tile.split()) {
    if (tile.state_block_v != 0 || tile.state_warps != 0 || tile.state_f32)
      say("state_block_v, state_warps and state_f32 need state_block_k > 0 (the split form)");
    return problems;
  }
  const int w = tile.state_warps;
  if (w != 1 && w != 2 && w != 4 && w != 8) say("state_warps = " + std::to_string(w) + ", expected 1, 2, 4 or 8");
  if (tile.state_block_k < 16 || tile.state_block_k > 256 || tile.state_block_k % 16 != 0)
    say("state_block_k = " + std::to_string(tile.state_block_k) + ", expected a multiple of 16 up to 256");
  if (tile.state_block_v < 16 || tile.state_block_v > 128 || tile.state_block_v % 16 != 0)
    say("state_block_v = " + std::to_string(tile.state_block_v) + ", expected a multiple of 16 up to 128");
  if (!problems.empty()) return problems;
  if (const ChunkedLayout l = chunked_layout(state_tile(tile)); l.state_registers > 64)
    say("each thread of the state pass would keep " + std::to_string(l.state_registers) +
        " state values in registers (state_block_k * state_block_v / threads), expected at most 64");
  return problems;
}

std::vector<std::string> tile_rules(const ChunkedTile& tile) {
  if (tile.ws) return ws_tile_rules(tile);
  std::vector<std::string> problems = state_tile_rules(tile);
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  if (tile.warps != 2 && tile.warps != 4 && tile.warps != 8) say("warps = " + std::to_string(tile.warps) + ", expected 2, 4 or 8");
  if (tile.chunk != 16 && tile.chunk != 32 && tile.chunk != 64) say("chunk = " + std::to_string(tile.chunk) + ", expected 16, 32 or 64");
  if (tile.block_k < 16 || tile.block_k > 256 || tile.block_k % 16 != 0)
    say("block_k = " + std::to_string(tile.block_k) + ", expected a multiple of 16 up to 256");
  if (tile.block_v < 16 || tile.block_v > 128 || tile.block_v % 16 != 0)
    say("block_v = " + std::to_string(tile.block_v) + ", expected a multiple of 16 up to 128");
  if (!problems.empty()) return problems;
  const ChunkedLayout l = chunked_layout(tile);
  if (l.mt > tile.warps)
    say("chunk = " + std::to_string(tile.chunk) + " needs at least " + std::to_string(l.mt) + " warps (one per 16 rows)");
  if (l.state_registers > 64)
    say("each thread would keep " + std::to_string(l.state_registers) +
        " state values in registers (block_k * block_v / threads), expected at most 64");
  if (tile.wgmma) {
    if (tile.split()) say("wgmma is the serial form's (state_block_k = 0), not the split form's");
    if (tile.warps != 4 && tile.warps != 8) say("wgmma needs whole warpgroups: warps = 4 or 8, got " + std::to_string(tile.warps));
    else if (l.smt % tile.warps != 0)
      say("wgmma needs block_k / 16 to be a multiple of warps (each warpgroup owns 64-row slices of the state), got block_k = " +
          std::to_string(tile.block_k) + " with " + std::to_string(tile.warps) + " warps");
  }
  return problems;
}

}  // namespace

std::string chunked_unsupported(const ir::Variant& variant) {
  if (variant.normalize) return "the chunked family has no normaliser (normalize); use the fused-recurrent algorithm";
  // The read before the update (RWKV6's bonus read) is the plain form's recurrence read one token
  // earlier: the same state pass, and in the read q~ carries the gate product up to t - 1, the
  // intra-chunk scores are strictly causal and the bonus (q . u . k) sits on their diagonal.
  if (variant.update != ir::Update::additive || variant.l2_normalize_qk)
    return "the chunked family does not run " + ir::form_name(variant) + " (ladle::cuda::generate_chunked_delta does)";
  return {};
}

const char* to_string(ChunkedPhase phase) {
  switch (phase) {
    case ChunkedPhase::states: return "states";
    case ChunkedPhase::outputs: return "outputs";
    case ChunkedPhase::fold: return "fold";
    default: return "serial";
  }
}

namespace {

// Shared memory of a block without the prefetch buffers.
int base_shared_bytes(const ir::Variant& variant, const ChunkedTile& tile, bool states) {
  const int c = tile.chunk, bk = tile.block_k, bv = tile.block_v;
  int bytes = align16(c * (bk + 8) * 2) + align16(vs_elements(tile) * 2);     // ks, vs
  if (!states) bytes += align16(c * (bk + 8) * 2) + align16(bk * (bv + 8) * 2) + align16(c * (c + 8) * 2);  // qs, st, ps
  const KeyGate gate = key_gate(variant);
  if (gate == KeyGate::vector) bytes += align16(c * bk * 4);
  if (gate == KeyGate::scalar) bytes += align16(c * 4);
  if (variant.has(ir::Slot::log_decay_v)) bytes += align16(c * bv * 4);
  if (per_token_scale(variant) && !states) bytes += align16(c * 4);
  if (variant.has(ir::Slot::bonus) && !states) bytes += align16(c * 4);
  return bytes + 16;  // the fit check's two words
}

// The prefetch buffers: the next chunk's raw rows of every staged per-token input, 16-bit
// storage ([C][BK] key side, [C][BV] value side); fp32 inputs are loaded when staged instead.
int prefetch_bytes(const ir::Variant& variant, const ChunkedTile& tile) {
  const InputUse use = input_use(variant);
  int bytes = 0;
  for (std::size_t k = 0; k < variant.inputs.size(); ++k) {
    if (!use.used[k]) continue;
    if (use.key_side[k] && variant.inputs[k].kind == ir::InputKind::token_key) bytes += align16(tile.chunk * tile.block_k * 2);
    if (use.value_side[k] && variant.inputs[k].kind == ir::InputKind::token_value) bytes += align16(tile.chunk * tile.block_v * 2);
  }
  return bytes;
}

// A tile prefetches only where the buffers keep it within 160 KiB (an A100 allows 163 KiB per
// block): a tile that fits without them still fits everywhere it did.
constexpr int prefetch_shared_limit = 160 * 1024;

ChunkedTile phase_tile(const ChunkedTile& full, ChunkedPhase phase) {
  return phase == ChunkedPhase::states ? state_tile(full) : full;
}

}  // namespace

// Threads of a 4-warp tile that keep more than 32 state values in registers have no room left
// for the prefetch's addresses (such a tile spilled with it, none without; a tile of 8 warps
// that holds as many state values fits).
bool chunked_prefetch(const ir::Variant& variant, const ChunkedTile& full, ChunkedPhase phase) {
  if (full.ws) return false;  // its producer warpgroup copies every chunk ahead by TMA
  const ChunkedTile tile = phase_tile(full, phase);
  const int raw = prefetch_bytes(variant, tile);
  return raw > 0 && (chunked_layout(tile).state_registers <= 32 || tile.warps >= 8) &&
         base_shared_bytes(variant, tile, phase == ChunkedPhase::states) + raw <= prefetch_shared_limit;
}

int chunked_shared_bytes(const ir::Variant& variant, const ChunkedTile& full, ChunkedPhase phase) {
  if (full.ws && phase != ChunkedPhase::fold)
    return ws_shared_bytes(full, phase == ChunkedPhase::states, static_cast<int>(ws_gate_inputs(variant).size()),
                           variant.has(ir::Slot::log_decay_v));
  const ChunkedTile tile = phase_tile(full, phase);
  return base_shared_bytes(variant, tile, phase == ChunkedPhase::states) +
         (chunked_prefetch(variant, full, phase) ? prefetch_bytes(variant, tile) : 0);
}

ChunkedTile default_chunked_tile(std::int64_t key_dim, std::int64_t value_dim) {
  ChunkedTile tile;
  tile.block_k = static_cast<int>(std::clamp<std::int64_t>((key_dim + 15) / 16 * 16, 16, 256));
  tile.block_v = static_cast<int>(std::clamp<std::int64_t>((value_dim + 15) / 16 * 16, 16, 64));
  if (tile.block_k > 128) tile.block_v = std::min(tile.block_v, 32);  // 64 state values per thread at most
  tile.chunk = 64;
  tile.warps = 8;
  while (!tile_rules(tile).empty() && tile.block_v < 128) tile.block_v += 16;
  return tile;
}

std::string to_string(const ChunkedTile& tile) {
  std::string text = "block_k=" + std::to_string(tile.block_k) + " chunk=" + std::to_string(tile.chunk) +
                     " block_v=" + std::to_string(tile.block_v) + " warps=" + std::to_string(tile.warps);
  if (tile.split())
    text += " states=" + std::to_string(tile.state_block_k) + "x" + std::to_string(tile.state_block_v) + "x" +
            std::to_string(tile.state_warps) + (tile.state_f32 ? " f32" : "");
  if (tile.wgmma) text += " wgmma";
  if (tile.ws) text += " ws";
  return text;
}

std::vector<int> chunked_ws_gate_inputs(const ir::Variant& variant) { return ws_gate_inputs(variant); }

std::string chunked_ws_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  return spec.phase == ChunkedPhase::states ? ws_states_unsupported(variant, spec) : ws_spec_unsupported(variant, spec);
}

bool chunked_head_decay_only(const ir::Variant& variant) {
  return key_gate(variant) != KeyGate::vector && !variant.has(ir::Slot::log_decay_v);
}

std::string chunked_suffix_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  return suffix_states_unsupported(variant, spec);
}


ChunkedTile parse_chunked_tile(const std::string& text) {
  ChunkedTile tile;
  char word[8] = {};
  int fields = std::sscanf(text.c_str(), "%d,%d,%d,%d,%d,%d,%d,%7s", &tile.block_k, &tile.chunk, &tile.block_v, &tile.warps,
                           &tile.state_block_k, &tile.state_block_v, &tile.state_warps, word);
  bool valid = fields == 4 || fields == 7 || (fields == 8 && std::string(word) == "f32");
  if (fields == 4 && text.find(',') != std::string::npos) {  // block_k,chunk,block_v,warps[,wgmma]
    int used = 0;
    char rest[8] = {};
    const int more = std::sscanf(text.c_str(), "%*d,%*d,%*d,%*d%n,%7s", &used, rest);
    const std::string suffix = more == 1 ? text.substr(static_cast<std::size_t>(used)) : std::string();
    if (more == 1) valid = suffix == ",wgmma" || suffix == ",ws";
    else valid = used == static_cast<int>(text.size());
    tile.wgmma = suffix == ",wgmma";
    tile.ws = suffix == ",ws";
  }
  if (!valid)
    throw InvalidArgument("chunked tile '" + text +
                          "', expected block_k,chunk,block_v,warps[,wgmma], block_k,chunk,block_v,warps,ws or "
                          "block_k,chunk,block_v,warps,state_block_k,state_block_v,state_warps[,f32]");
  tile.state_f32 = fields == 8;
  return tile;
}

ChunkedGrid chunked_grid(const ChunkedKernel& kernel, std::int64_t sequences, std::int64_t heads, std::int64_t key_dim,
                         std::int64_t value_dim, std::int64_t chunks) {
  const auto u = [](std::int64_t x) { return static_cast<unsigned>(x); };
  const std::int64_t value_tiles = (value_dim + kernel.block_v - 1) / kernel.block_v;
  switch (kernel.phase) {
    case ChunkedPhase::states: return {u(value_tiles), u((key_dim + kernel.block_k - 1) / kernel.block_k), u(sequences * heads)};
    case ChunkedPhase::outputs: return {u(chunks * value_tiles), u(heads), 1};
    case ChunkedPhase::fold: return {u((key_dim * value_dim + kernel.threads - 1) / kernel.threads), u(sequences * heads), 1};
    default: return {u(value_tiles), u(sequences * heads), 1};
  }
}

std::vector<std::string> validate_chunked_tile(const ChunkedTile& tile, const ir::Variant& variant,
                                               std::int64_t key_dim, std::int64_t value_dim, int max_shared_bytes,
                                               const std::string& arch) {
  std::vector<std::string> problems = tile_rules(tile);
  if (tile.wgmma && !arch.empty() && !has_wgmma(arch))
    problems.push_back("wgmma needs the target sm_90a (wgmma.mma_async), the target is " + arch);
  if (tile.ws && !arch.empty() && !has_wgmma(arch))
    problems.push_back("ws needs the target sm_90a (TMA, wgmma.mma_async), the target is " + arch);
  if (tile.ws)
    if (const std::string why = ws_variant_unsupported(variant); !why.empty()) problems.push_back(why);
  // Wrong on an H100 (NaN from the second chunk on: the carried state), right in the host emulation:
  // an open bug, refused until it is found (bench/RESULTS.md, "Issue 35, continued").
  if (tile.wgmma && tile.warps == 8 && tile.block_v == 16 && tile.chunk == 64 && !chunked_head_decay_only(variant))
    problems.push_back("block_v 16 on wgmma with two warpgroups and 64-token chunks computes NaN on the GPU with a key-side or "
                       "value-side gate (an open bug); use block_v 32, 4 warps or 32-token chunks");
  if (key_dim > tile.block_k)
    problems.push_back("K = " + std::to_string(key_dim) + " exceeds block_k = " + std::to_string(tile.block_k));
  if (key_dim < 1 || value_dim < 1) problems.push_back("K and V must be at least 1");
  if (max_shared_bytes > 0 && chunked_shared_bytes(variant, tile) > max_shared_bytes)
    problems.push_back("needs " + std::to_string(chunked_shared_bytes(variant, tile)) +
                       " bytes of shared memory, the device allows " + std::to_string(max_shared_bytes));
  return problems;
}

ChunkedSegments chunked_segments(std::int64_t sequences, std::int64_t tokens, const std::vector<std::int64_t>& cu_seqlens,
                                 std::int64_t segment_tokens, bool reverse, std::int64_t state_pieces) {
  if (segment_tokens <= 0) throw InvalidArgument("chunked_segments: segment_tokens = " + std::to_string(segment_tokens) + ", expected > 0");
  if (state_pieces <= 0) throw InvalidArgument("chunked_segments: state_pieces = " + std::to_string(state_pieces) + ", expected > 0");
  if (!cu_seqlens.empty() && static_cast<std::int64_t>(cu_seqlens.size()) != sequences + 1)
    throw InvalidArgument("chunked_segments: cu_seqlens has " + std::to_string(cu_seqlens.size()) + " offsets, expected " +
                          std::to_string(sequences + 1));
  const std::int64_t piece_tokens = (segment_tokens + state_pieces - 1) / state_pieces;
  ChunkedSegments out;
  for (std::int64_t n = 0; n < sequences; ++n) {
    const bool packed = !cu_seqlens.empty();
    const std::int64_t bos = packed ? cu_seqlens[n] : 0, eos = packed ? cu_seqlens[n + 1] : tokens;
    const std::int64_t count = std::max<std::int64_t>(1, (eos - bos + segment_tokens - 1) / segment_tokens);
    const std::int64_t first_earlier = out.earlier_segments();
    // Tokens [lo, hi) of segment i of `length`-token segments, in the recurrence's direction: from
    // the front, or from the back when reversed.
    const auto span = [&](std::int64_t i, std::int64_t length) {
      const std::int64_t lo = reverse ? std::max(bos, eos - (i + 1) * length) : bos + i * length;
      const std::int64_t hi = reverse ? eos - i * length : std::min(eos, bos + (i + 1) * length);
      return std::pair{lo, hi};
    };
    for (std::int64_t i = 0; i < count; ++i) {
      const auto [lo, hi] = span(i, segment_tokens);
      const bool last = i + 1 == count;
      const long long row[8] = {packed ? 0 : n, lo, hi, n, i * state_pieces, first_earlier, last ? 1 : 0, 0};
      out.all.insert(out.all.end(), row, row + 8);
      if (last) continue;
      for (std::int64_t p = 0; p < state_pieces; ++p) {  // the pieces of an earlier segment, in its direction
        const std::int64_t plo = reverse ? std::max(lo, hi - (p + 1) * piece_tokens) : std::min(hi, lo + p * piece_tokens);
        const std::int64_t phi = reverse ? std::max(lo, hi - p * piece_tokens) : std::min(hi, lo + (p + 1) * piece_tokens);
        const long long piece[8] = {packed ? 0 : n, plo, phi, n, i * state_pieces + p, first_earlier, 0, 0};
        out.earlier.insert(out.earlier.end(), piece, piece + 8);
      }
    }
  }
  return out;
}

std::int64_t chunked_segment_decay_width(const ir::Variant& variant, std::int64_t key_dim, std::int64_t value_dim) {
  const KeyGate kgate = key_gate(variant);
  return (kgate == KeyGate::vector ? key_dim : kgate == KeyGate::scalar ? 1 : 0) + (variant.has(ir::Slot::log_decay_v) ? value_dim : 0);
}


namespace {

// The segmented form's fold: each sequence's earlier segments in order, one thread per state
// element and head. It has its own kernel because, done at the start of the serial kernel
// (with the whole state in registers), it spilled with h0 and the final state.
std::string fold_source(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::string& name,
                        const std::vector<std::string>& declarations) {
  const KeyGate kgate = key_gate(variant);
  const bool vgate = variant.has(ir::Slot::log_decay_v);
  const std::string key_part = kgate == KeyGate::vector ? "dj[kk]" : kgate == KeyGate::scalar ? "dj[0]" : "";
  const std::string key_width = kgate == KeyGate::vector ? "K" : kgate == KeyGate::scalar ? "1" : "0";
  std::string log2 = key_part;
  if (vgate) log2 += std::string(log2.empty() ? "" : " + ") + "dj[" + key_width + " + col]";
  std::string header = "ladle: chunked kernel " + name + "\nGenerated by codegen/cuda/chunked.cpp; do not edit.\n\n";
  header += "The segmented form's fold (between its state pass and its serial form): for each sequence with earlier\n"
            "segments (the block rows of its last segment in `segments`), from S = h0 (or 0), for each earlier segment\n"
            "j in order S = 2^D_j S + L_j, written back over L_j: segment_states row j then holds the state entering\n"
            "segment j + 1, which the serial kernel starts from. One thread per element of the [K][V] state.\n\n";
  header += ir::to_string(variant);
  header += "\nlaunch: grid (ceil(K * V / 256), segments * H), block (256); the serial kernel's parameters\n";
  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(256) " + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("const long long e = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;  // element kk * V + col of the state");
  c("const int h = blockIdx.y % H;");
  c("const long long* const seg = segments + 8LL * (blockIdx.y / H);");
  c("if (seg[6] == 0 || seg[4] == 0 || e >= static_cast<long long>(K) * V) return;  // not a last segment, or no earlier ones");
  c("const int kk = static_cast<int>(e / V), col = static_cast<int>(e % V);");
  c("(void)kk; (void)col;");
  c("const long long DL = " + key_width + (vgate ? " + V" : "") + ";");
  c("(void)DL;");
  c(std::string("float S = ") + (spec.initial_state ? "ladle_load(initial_state + ((seg[3] * H + h) * K + kk) * V + col)" : "0.0f") + ";");
  c("for (long long j = seg[5]; j < seg[5] + seg[4]; ++j) {");
  c.in();
  c("const float* const dj = segment_decay + (j * H + h) * DL;");
  c("(void)dj;");
  c("float* const lj = segment_states + ((j * H + h) * K + kk) * V + col;");
  c("S = S" + (log2.empty() ? std::string() : " * ladle_exp2(" + log2 + ")") + " + *lj;");
  c("*lj = S;  // the state entering segment j + 1");
  c.out();
  c("}");
  c.out();
  c("}");
  return c.text();
}

}  // namespace

namespace {

// The mma.sync form's kernel (a phase of it) for these inputs' C names (with_input_names runs it twice).
ChunkedKernel generate_named(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::vector<std::string>& id) {
  const ChunkedPhase phase = spec.phase;
  const bool states = phase == ChunkedPhase::states;
  const bool segmented = spec.segmented;
  const ChunkedTile tile = states ? state_tile(spec.tile) : spec.tile;

  ChunkedKernel kernel;
  const std::string phase_name = (phase == ChunkedPhase::serial ? "" : std::string("_") + to_string(phase)) + (segmented ? "_segmented" : "");
  kernel.name = "ladle_chunked" + phase_name + "_" + hex(fnv1a(to_string(spec.tile) + types_key(spec) + (segmented ? "|segmented" : ""), ir::hash(variant)));
  kernel.threads = static_cast<unsigned>(32 * tile.warps);
  kernel.block_v = tile.block_v;
  kernel.block_k = tile.block_k;
  kernel.phase = phase;
  kernel.shared_bytes = chunked_shared_bytes(variant, spec.tile, phase);

  std::vector<std::string> declarations;
  declare_params(variant, id, spec, declarations, kernel.params);
  {
    using Type = KernelParam::Type;
    using Role = KernelParam::Role;
    const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role) {
      declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
      kernel.params.push_back({name, c_type, type, role, -1});
    };
    if (segmented) {
      param("const long long*", "segments", Type::pointer, Role::segments);
      param(states || phase == ChunkedPhase::fold ? "float*" : "const float*", "segment_states", Type::pointer, Role::segment_states);
      param(states ? "float*" : "const float*", "segment_decay", Type::pointer, Role::segment_decay);
    }
  }
  if (phase != ChunkedPhase::serial && !segmented) {
    using Type = KernelParam::Type;
    using Role = KernelParam::Role;
    const std::string state_type = spec.tile.state_f32 ? "float*" : "ladle_bf16*";
    const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role) {
      declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
      kernel.params.push_back({name, c_type, type, role, -1});
    };
    param(state_type, "chunk_states", Type::pointer, Role::chunk_states);
    if (spec.varlen) param("const long long*", "chunk_offsets", Type::pointer, Role::chunk_offsets);
    param("int", "N", Type::i32, Role::sequences);
  }

  if (phase == ChunkedPhase::fold) {
    kernel.threads = 256;
    kernel.shared_bytes = 0;
    kernel.source = fold_source(variant, spec, kernel.name, declarations);
    return kernel;
  }
  kernel.source = ChunkedEmitter(variant, spec, tile, id).source(kernel, declarations);
  return kernel;
}

}  // namespace

ChunkedKernel generate_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (const std::string why = chunked_unsupported(variant); !why.empty()) fail(why);
  if (const auto problems = tile_rules(spec.tile); !problems.empty()) fail("tile " + to_string(spec.tile) + ": " + problems.front());
  check_types("generate_chunked", variant, spec);
  if (spec.tile.wgmma && !has_wgmma(spec.arch))
    fail("tile " + to_string(spec.tile) + ": wgmma needs the target sm_90a (wgmma.mma_async), the target is " +
         (spec.arch.empty() ? std::string("not given") : spec.arch));
  const ChunkedPhase phase = spec.phase;
  if (!(spec.tile.ws && phase == ChunkedPhase::states) &&  // the ws form's own state pass takes the serial tile
      (phase == ChunkedPhase::serial || phase == ChunkedPhase::fold) == spec.tile.split())
    fail(std::string("phase ") + to_string(phase) + (spec.tile.split() ? " with a split tile (" : " needs a split tile, got (") +
         to_string(spec.tile) + ")");
  const bool states = phase == ChunkedPhase::states, outputs = phase == ChunkedPhase::outputs;
  const bool segmented = spec.segmented;
  if (segmented && outputs) fail("the output pass has no segmented form");
  if (phase == ChunkedPhase::fold && !segmented) fail("the fold phase is the segmented form's (segmented = true)");
  if (segmented && spec.varlen) fail("a segmented kernel takes its tokens from the segments table, not cu_seqlens (varlen = false)");
  if (segmented && states && (spec.initial_state || spec.final_state))
    fail("the segmented state pass starts from zero and writes segment_states (initial_state = final_state = false)");

  if (spec.suffix_states && spec.tile.ws) fail("suffix_states with a ws tile: the ws form's state pass is its own");
  if (spec.chunk_states_out && !(spec.tile.ws && phase == ChunkedPhase::serial))
    fail("chunk_states_out: only the ws form's serial kernel writes its chunks' entry states (tile " + to_string(spec.tile) + ", phase " +
         to_string(phase) + ")");
  if (spec.tile.ws && (phase == ChunkedPhase::serial || phase == ChunkedPhase::states)) return generate_ws_chunked(variant, spec);
  if (spec.suffix_states) return generate_suffix_states(variant, spec);  // refuses what it cannot run
  if (spec.tile.ws && phase != ChunkedPhase::fold) fail(std::string("the ws form has no ") + to_string(phase) + " phase");

  return with_input_names<ChunkedKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return generate_named(variant, spec, id); });
}

}  // namespace ladle::cuda
