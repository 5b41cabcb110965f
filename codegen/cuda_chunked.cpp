#include "cuda_chunked.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include <ladle/runtime/error.h>

#include "detail/attention_parts.h"
#include "detail/chunked_suffix.h"
#include "detail/chunked_ws.h"
#include "detail/cuda_source.h"
#include "render_c.h"

namespace ladle::cuda {

using namespace detail;

namespace {

// How the gates enter the chunk: per key dimension (GLA), one per-token scalar on the key
// side (g_gamma, a per-token head gate), none; and per value dimension or none.
enum class KeyGate { none, scalar, vector };

KeyGate key_gate(const ir::Variant& variant) {
  if (variant.has(ir::Slot::log_decay_k)) return KeyGate::vector;
  return variant.has(ir::Slot::log_decay_head) ? KeyGate::scalar : KeyGate::none;
}

bool per_token_scale(const ir::Variant& variant) {
  return ir::extent(variant, variant.slot(ir::Slot::scale)).token;
}

int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// The template's own names (an input with one of these names is renamed).
const std::set<std::string>& template_names() {
  static const std::set<std::string> names = {
      "C", "BK", "BV", "THREADS", "WARPS", "MT", "CG", "OCOLS", "SMT", "S_MPW", "S_WPM", "SCOLS", "QLD", "VLD",
      "LOG2E", "FIT_LIMIT", "GATE_FLOOR", "REVERSE", "smem", "qs", "ks", "vs", "st", "kg", "hg", "vg", "token_scale", "fit",
      "lane", "warp", "gid", "tig", "n", "h", "b", "v0", "bos", "eos", "length", "base", "valid", "t0", "t1", "tm",
      "te", "span", "checks", "sacc", "acc", "aacc", "afrag", "bfrag", "worst", "fits", "e", "i", "t", "cpos",
      "step", "live", "use", "col", "row0", "mi", "cg", "s_mt", "s_c0", "kk", "f", "o", "read_scale",
      "head_log_decay", "o_stride_b", "o_stride_t", "o_stride_h", "o_stride_d", "initial_state", "final_state",
      "cu_seqlens", "B", "T", "H", "K", "V", "q_feature", "k_feature", "v_feature", "jv", "run", "s", "p", "ld", "d",
      "f0", "f1", "fa", "fb", "ra", "rb", "g_start", "lo", "hi", "k0", "j", "np", "nt", "kt", "sp", "r", "m", "tt", "lg", "floors",
      "key0", "chunk_states", "chunk_offsets", "N", "gc", "VT", "chunks", "lo_n", "hi_n", "mid", "c_of", "state_at", "first_chunk",
      "i0", "j0", "u", "key_count", "value_count", "qv8", "kv8", "kg8", "vv8", "vg8", "gt8", "gm8", "ge8", "hf", "half", "odd", "decay_row",
      "decay_col", "decay_head", "read_row", "read_col", "read_head", "next", "next_valid", "qs_at", "ks_at", "vs_at", "st_at",
      "chunk_worst", "g_lo", "g_hi", "g_tm", "ps", "PLD", "ps_at", "blk", "bi", "bj", "pacc", "p0", "p1", "VCS", "VRS", "vs_off", "o_row", "row_scale", "x0", "x1", "lj", "dj", "fr", "fc0", "fc1", "c0"};
  return names;
}

// How the warps share the work of a tile: o by 16-row tiles x column groups, the state by
// 16-row tiles x column groups (warps past o_warps / s_warps sit those parts out).
struct Layout {
  int mt = 0, cg = 0, ocols = 0, o_warps = 0;
  int smt = 0, s_mpw = 0, s_wpm = 0, scols = 0, s_warps = 0;
  int state_registers = 0;
};

int largest_split(int warps, int column_tiles) {  // a power of two <= warps dividing column_tiles
  int split = 1;
  while (split * 2 <= warps && column_tiles % (split * 2) == 0) split *= 2;
  return split;
}

Layout layout(const ChunkedTile& tile) {
  Layout l;
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
  if (const Layout l = layout(state_tile(tile)); l.state_registers > 64)
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
  const Layout l = layout(tile);
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

// vs in the wgmma tiles: 8 x 8 core matrices (128 contiguous bytes: 8 tokens of 8 values), 16
// bytes of padding after each so that a row of 16-byte items spreads over every bank; the
// core matrices of a row of 8 tokens side by side along V.
constexpr int vs_core_stride = 72;  // elements from one core matrix to the next along V
int vs_elements(const ChunkedTile& tile) {
  return tile.wgmma ? tile.chunk / 8 * (tile.block_v / 8) * vs_core_stride : tile.chunk * (tile.block_v + 8);
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
// for the prefetch's addresses (128,64,64,4 spilled 72 bytes on sm_90a with it, none without;
// 128,64,128,8 holds as many state values and fits).
bool chunked_prefetch(const ir::Variant& variant, const ChunkedTile& full, ChunkedPhase phase) {
  if (full.ws) return false;  // its producer warpgroup copies every chunk ahead by TMA
  const ChunkedTile tile = phase_tile(full, phase);
  const int raw = prefetch_bytes(variant, tile);
  return raw > 0 && (layout(tile).state_registers <= 32 || tile.warps >= 8) &&
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

bool chunked_suffix_states(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  return spec.suffix_states && suffix_states_unsupported(variant, spec).empty();
}

bool chunked_wgmma_arch(const std::string& arch) { return arch == "sm_90a" || arch == "compute_90a"; }

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
  if (tile.wgmma && !arch.empty() && !chunked_wgmma_arch(arch))
    problems.push_back("wgmma needs the target sm_90a (wgmma.mma_async), the target is " + arch);
  if (tile.ws && !arch.empty() && !chunked_wgmma_arch(arch))
    problems.push_back("ws needs the target sm_90a (TMA, wgmma.mma_async), the target is " + arch);
  if (tile.ws)
    if (const std::string why = ws_variant_unsupported(variant); !why.empty()) problems.push_back(why);
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

ChunkedKernel generate_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (const std::string why = chunked_unsupported(variant); !why.empty()) fail(why);
  if (const auto problems = tile_rules(spec.tile); !problems.empty()) fail("tile " + to_string(spec.tile) + ": " + problems.front());
  check_types("generate_chunked", variant, spec);
  if (spec.tile.wgmma && !chunked_wgmma_arch(spec.arch))
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

  if (spec.tile.ws && (phase == ChunkedPhase::serial || phase == ChunkedPhase::states)) return generate_ws_chunked(variant, spec);
  if (chunked_suffix_states(variant, spec)) return generate_suffix_states(variant, spec);
  if (spec.tile.ws && phase != ChunkedPhase::fold) fail(std::string("the ws form has no ") + to_string(phase) + " phase");

  const ChunkedTile tile = states ? state_tile(spec.tile) : spec.tile;
  const bool wgmma = tile.wgmma;  // the serial form's state update on wgmma.mma_async (vs as core matrices)
  const int threads = 32 * tile.warps;
  const std::vector<std::string> id = identifiers(variant, template_names());
  const auto& inputs = variant.inputs;
  const auto has = [&](ir::Slot s) { return variant.has(s); };
  const auto varies_over_tokens = [&](ir::Slot s) { return ir::extent(variant, variant.slot(s)).token; };
  const KeyGate kgate = key_gate(variant);
  const bool vgate = has(ir::Slot::log_decay_v);
  const bool check_fit = kgate == KeyGate::vector || vgate;
  const bool scale_per_token = per_token_scale(variant);
  // A read before the update: o_t = q_t^T S_(t-1) (+ (q_t . u . k_t) v_t with a bonus u), where q~
  // carries the gate product up to t - 1 (G_(t-1), 0 at the chunk's start), the scores are strictly
  // causal and the bonus is the scores' diagonal (bq, formed once per chunk from the staged rows).
  const bool before_read = variant.read_before_update, bonus = has(ir::Slot::bonus);

  const InputUse use_of = input_use(variant);
  const std::vector<bool>&used = use_of.used, &key_side = use_of.key_side, &value_side = use_of.value_side;
  const auto render = [&](ir::Slot s, const std::string& suffix) { return render_slot(variant, id, s, suffix); };

  ChunkedKernel kernel;
  const std::string phase_name = (phase == ChunkedPhase::serial ? "" : std::string("_") + to_string(phase)) + (segmented ? "_segmented" : "");
  kernel.name = "ladle_chunked" + phase_name + "_" + hex(fnv1a(to_string(spec.tile) + types_key(spec) + (segmented ? "|segmented" : ""), ir::hash(variant)));
  kernel.threads = static_cast<unsigned>(threads);
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
    // The segmented form's fold: each sequence's earlier segments in order, one thread per state
    // element and head. It has its own kernel because, done at the start of the serial kernel
    // (with the whole state in registers), it spilled 16-44 bytes on sm_90a with h0 and the final state.
    kernel.threads = 256;
    kernel.shared_bytes = 0;
    const std::string key_part = kgate == KeyGate::vector ? "dj[kk]" : kgate == KeyGate::scalar ? "dj[0]" : "";
    const std::string key_width = kgate == KeyGate::vector ? "K" : kgate == KeyGate::scalar ? "1" : "0";
    std::string log2 = key_part;
    if (vgate) log2 += std::string(log2.empty() ? "" : " + ") + "dj[" + key_width + " + col]";
    std::string header = "ladle: chunked kernel " + kernel.name + "\nGenerated by codegen/cuda_chunked.cpp; do not edit.\n\n";
    header += "The segmented form's fold (between its state pass and its serial form): for each sequence with earlier\n"
              "segments (the block rows of its last segment in `segments`), from S = h0 (or 0), for each earlier segment\n"
              "j in order S = 2^D_j S + L_j, written back over L_j: segment_states row j then holds the state entering\n"
              "segment j + 1, which the serial kernel starts from. One thread per element of the [K][V] state.\n\n";
    header += ir::to_string(variant);
    header += "\nlaunch: grid (ceil(K * V / 256), segments * H), block (256); the serial kernel's parameters\n";
    Code c;
    c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers);
    c("extern \"C\" __global__ void __launch_bounds__(256) " + kernel.name + "(");
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
    kernel.source = c.text();
    return kernel;
  }

  // ---- Header
  std::string header = "ladle: chunked kernel " + kernel.name + "\nGenerated by codegen/cuda_chunked.cpp; do not edit.\n\n";
  if (segmented)
    header += states ? "The segmented form's first kernel: the split form's state pass over one segment (segments[n]) from a\n"
                       "zero state; writes the segment's own final state and total log2 decay (segment_states, segment_decay).\n\n"
                     : "The segmented form's last kernel: the serial form over one segment (segments[n]), from the state its\n"
                       "earlier segments leave (h0, or the fold kernel's row of segment_states).\n\n";
  else if (states)
    header += "The split form's state pass: walks the chunks of one sequence and head for a key tile x value tile\n"
              "of the state, writes the state entering every chunk to chunk_states (and the final state); no output.\n\n";
  if (outputs)
    header += "The split form's output pass: one chunk per block, all chunks in parallel, from the state entering\n"
              "the chunk (chunk_states, written by the state pass).\n\n";
  header += ir::to_string(variant);
  header += "\nconfig: " + to_string(spec.tile) + " (" + std::to_string(threads) + " threads)" +
            (states ? std::string("; key rows per block ") + std::to_string(tile.block_k)
                    : "; requires K <= " + std::to_string(tile.block_k)) + "\n";
  const std::string grid = states ? "ceil(V / " + std::to_string(tile.block_v) + "), ceil(K / " + std::to_string(tile.block_k) + "), N * H"
                           : outputs ? "chunks * ceil(V / " + std::to_string(tile.block_v) + "), H"
                                     : "ceil(V / " + std::to_string(tile.block_v) + "), N * H";
  header += "launch: grid (" + grid + "), block (" + std::to_string(threads) + "), dynamic shared memory " +
            std::to_string(kernel.shared_bytes) + " bytes\n";
  if (segmented)
    header += "segments: [N][8] {b, first token, end token, sequence, index in it, row of its first earlier segment, last}\n";
  if (phase != ChunkedPhase::serial && !segmented)
    header += std::string("chunk_states: [chunks][H][K][V] ") + (spec.tile.state_f32 ? "fp32" : "bf16") +
              ", the state entering each chunk (chunks = N * ceil(T / " + std::to_string(tile.chunk) +
              ")" + (spec.varlen ? ", or chunk_offsets[N] packed" : "") + ")\n";
  header += "types: " + types_line(variant, id, spec) + "; tensor-core operands bf16, accumulation fp32\n";
  header += wgmma ? "tensor cores: the state update on wgmma.mma_async m64n" + std::to_string(tile.block_v) +
                        "k16 (k_up^T from registers, v_up from shared memory), the other products on mma.sync m16n8k16\n"
                  : std::string("tensor cores: mma.sync m16n8k16\n");
  header += std::string("gates: key side ") +
            (kgate == KeyGate::vector ? "per dimension" : kgate == KeyGate::scalar ? "per-token scalar" : "none") +
            ", value side " + (vgate ? "per dimension" : "none") + "\n";
  if (before_read)
    header += std::string("read: before the update (o_t = q_t^T S_(t-1)") + (bonus ? " + (q_t . bonus . k_t) v_t" : "") +
              "): q~ carries the gates up to t - 1, the scores are strictly causal" + (bonus ? ", the bonus on their diagonal" : "") + "\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") +
            " initial_state=" + (spec.initial_state ? "1" : "0") + " final_state=" + (spec.final_state ? "1" : "0") + "\n";
  header += "GQA: an input with X heads serves query head h from head h * X / H.\n";
  header += "bytes per token and value tile: q, k, v, gates read once, o written once; the state once per sequence.\n";

  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers + (wgmma ? wgmma_helpers(tile.block_v, tile.block_v, false, false) : std::string()));
  // The state pass is a serial walk over chunks: several blocks per SM hide its latency, so ptxas
  // is asked to fit 128 registers per thread (without the hint it chose 80 and spilled); measured on
  // the H100: 3 blocks of 168 registers with the staging unrolled ran 1.9x slower than 4 of 127.
  const std::string bounds = states ? std::to_string(threads) + ", " + std::to_string(std::max(1, 512 / threads))
                                    : std::to_string(threads) + ", 1";  // ptxas otherwise picked 168 and spilled
  c("extern \"C\" __global__ void __launch_bounds__(" + bounds + ") " + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int C = " + std::to_string(tile.chunk) + ", BK = " + std::to_string(tile.block_k) + ", BV = " +
    std::to_string(tile.block_v) + ", WARPS = " + std::to_string(tile.warps) + ", THREADS = 32 * WARPS;");
  const Layout l = layout(tile);
  c("constexpr int MT = " + std::to_string(l.mt) + ", CG = " + std::to_string(l.cg) + ", OCOLS = " + std::to_string(l.ocols) +
    ";  // o: 16-row tiles, column groups, columns per warp");
  c("constexpr int SMT = " + std::to_string(l.smt) + ", S_MPW = " + std::to_string(l.s_mpw) + ", S_WPM = " +
    std::to_string(l.s_wpm) + ", SCOLS = " + std::to_string(l.scols) + ", S_WARPS = " + std::to_string(l.s_warps) +
    ";  // the state: row tiles, per warp, warps per row tile, columns per warp, warps");
  c("constexpr int QLD = BK + 8, VLD = BV + 8, PLD = C + 8;  // padded rows: conflict-free ldmatrix");
  c("(void)PLD;");
  if (wgmma) {
    c("// vs as 8 x 8 core matrices (8 tokens of 8 values, 128 contiguous bytes, then 16 of padding), the");
    c("// core matrices of 8 tokens side by side along V: wgmma reads it N-major; rows of 16-byte items");
    c("// and ldmatrix's 8-row reads spread over every bank.");
    c("constexpr unsigned VCS = " + std::to_string(vs_core_stride) + ", VRS = BV / 8 * VCS;  // elements to the next 8 values, the next 8 tokens");
    c("const auto vs_off = [](unsigned t, unsigned j) { return t / 8 * VRS + j / 8 * VCS + t % 8 * 8 + j % 8; };");
  }
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("constexpr float FIT_LIMIT = 100.0f;     // |log2 factor| allowed against one reference token");
  c("constexpr float GATE_FLOOR = -256.0f;   // log2 gates below it (-inf: a hard reset) count as it");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("(void)FIT_LIMIT; (void)GATE_FLOOR; (void)LOG2E;");
  c("");
  c("LADLE_DYNAMIC_SHARED(smem);");
  int offset = 0;
  const auto carve = [&](const std::string& type, const std::string& name, int elements, int element_bytes, const std::string& what) {
    c(type + "* const " + name + " = reinterpret_cast<" + type + "*>(smem + " + std::to_string(offset) + ");  // " + what);
    offset += align16(elements * element_bytes);
  };
  if (!states) carve("unsigned short", "qs", tile.chunk * (tile.block_k + 8), 2, "[C][QLD] bf16: q features, then q~");
  carve("unsigned short", "ks", tile.chunk * (tile.block_k + 8), 2,
        states ? "[C][QLD] bf16: k features, then k_up" : "[C][QLD] bf16: k features, then k~, then k_up");
  carve("unsigned short", "vs", vs_elements(tile), 2,
        std::string(wgmma ? "[C/8][BV/8] core matrices" : "[C][VLD]") + (states ? " bf16: v, then v_up" : " bf16: v, then v~, then v_up"));
  if (!states) carve("unsigned short", "st", tile.block_k * (tile.block_v + 8), 2, "[BK][VLD] bf16: the state, scaled for the read");
  if (!states) carve("unsigned short", "ps", tile.chunk * (tile.chunk + 8), 2, "[C][PLD] bf16: the step's masked intra-chunk scores");
  if (kgate == KeyGate::vector) carve("float", "kg", tile.chunk * tile.block_k, 4, "[C][BK]: cumulative log2 key gates");
  if (kgate == KeyGate::scalar) carve("float", "hg", tile.chunk, 4, "[C]: cumulative log2 head gate");
  if (vgate) carve("float", "vg", tile.chunk * tile.block_v, 4, "[C][BV]: cumulative log2 value gates");
  if (scale_per_token && !states) carve("float", "token_scale", tile.chunk, 4, "[C]: the read scale per token");
  if (bonus && !states) carve("float", "bq", tile.chunk, 4, "[C]: the bonus read q_t . bonus . k_t per token (the scores' diagonal)");
  carve("unsigned", "fit", 2, 4, "the fit check's running maximum (two, alternating)");
  // The prefetch buffers (chunked_prefetch): the next chunk's raw rows of each staged per-token
  // input, copied by cp.async while this chunk computes; an fp32 input keeps its buffer unused
  // and is loaded when staged.
  const bool prefetch = chunked_prefetch(variant, spec.tile, phase);
  std::vector<bool> async(inputs.size(), false);
  for (std::size_t k = 0; prefetch && k < inputs.size(); ++k) {
    const bool key_row = key_side[k] && inputs[k].kind == ir::InputKind::token_key;
    const bool value_row = value_side[k] && inputs[k].kind == ir::InputKind::token_value;
    if (!key_row && !value_row) continue;
    // The state pass reads no q: an input only the query feature reads is not copied there.
    bool needed = !states;
    for (const ir::Slot slot : {ir::Slot::k_feature, ir::Slot::log_decay_k, ir::Slot::v, ir::Slot::log_decay_v})
      for (const ir::Node& node : variant.slots[static_cast<std::size_t>(slot)].nodes)
        needed = needed || (node.op == ir::Op::input && node.input == static_cast<std::int32_t>(k));
    async[k] = needed && spec.input_types[k] != DType::f32;
    const int elements = tile.chunk * (key_row ? tile.block_k : tile.block_v);
    if (async[k])
      carve(storage_type(spec.input_types[k]), id[k] + "_raw", elements, 2,
            std::string(key_row ? "[C][BK]" : "[C][BV]") + ": the next chunk's raw " + id[k] + " rows");
    else
      offset += align16(elements * 2);
  }
  c("");
  // 32-bit shared-memory addresses of the tensor-core operands (ldmatrix), so that no operand
  // address is formed in 64-bit generic arithmetic.
  c(std::string("const unsigned ") +
    (states ? "" : "qs_at = ladle_shared_address(qs), st_at = ladle_shared_address(st), ps_at = ladle_shared_address(ps), ") +
    "ks_at = ladle_shared_address(ks), vs_at = ladle_shared_address(vs);");
  c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;");
  c("const int gid = lane / 4, tig = lane % 4;  // mma fragment coordinates");
  if (states) {
    c("const int v0 = blockIdx.x * BV;          // first value column of the block");
    c("const int key0 = blockIdx.y * BK;        // first key row of the block");
    c("const int n = blockIdx.z / H, h = blockIdx.z % H;");
  } else if (outputs) {
    c("// The block's chunk (over all sequences), value tile and head; the chunk's sequence n and");
    c("// its index c_of within it.");
    c("const int VT = (V + BV - 1) / BV;");
    c("const long long gc = blockIdx.x / VT;");
    c("const int v0 = static_cast<int>(blockIdx.x % VT) * BV;");
    c("const int h = blockIdx.y;");
    c("constexpr int key0 = 0;");
    if (spec.varlen) {
      c("int lo_n = 0, hi_n = N - 1;  // the last sequence whose first chunk is at or before gc");
      c("while (lo_n < hi_n) {");
      c("  const int mid = (lo_n + hi_n + 1) / 2;");
      c("  if (chunk_offsets[mid] <= gc) lo_n = mid;");
      c("  else hi_n = mid - 1;");
      c("}");
      c("const int n = lo_n;");
      c("const long long c_of = gc - chunk_offsets[n];");
    } else {
      c("const long long chunks = (T + C - 1) / C;  // per sequence");
      c("const int n = static_cast<int>(gc / chunks);");
      c("const long long c_of = gc % chunks;");
    }
  } else {
    c("const int v0 = blockIdx.x * BV;          // first value column of the block");
    c("constexpr int key0 = 0;");
    c("const int n = blockIdx.y / H, h = blockIdx.y % H;");
  }
  emit_sequence_bounds(c, segmented, spec.varlen);
  if (phase != ChunkedPhase::serial && !segmented) {
    c("// Where the state entering chunk c of this sequence is kept: chunk_states[first chunk + c][h].");
    c(std::string("const long long first_chunk = ") + (spec.varlen ? "chunk_offsets[n]" : "static_cast<long long>(n) * ((T + C - 1) / C)") + ";");
    c("(void)N;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (used[k] && inputs[k].kind != ir::InputKind::scalar) c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H;");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (used[k] && inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " +
        id[k] + "_stride_h);");
  const auto no_feature_slot = [&](ir::Slot s, const std::string& local) {
    c("const float " + local + " = " + (has(s) ? render(s, "") : std::string(s == ir::Slot::scale ? "1.0f" : "0.0f")) + ";");
  };
  if (!varies_over_tokens(ir::Slot::log_decay_head) && has(ir::Slot::log_decay_head)) no_feature_slot(ir::Slot::log_decay_head, "head_log_decay");
  if (!scale_per_token) no_feature_slot(ir::Slot::scale, "read_scale");
  c("if (threadIdx.x == 0) fit[0] = fit[1] = 0u;");
  c("int checks = 0;");
  c("(void)checks;");
  c("");
  c("// The state tile in mma accumulator layout: warp row tile(s) s_mt (+ m * WARPS), columns from s_c0.");
  c("const int s_mt = S_WPM == 1 ? warp : warp / S_WPM, s_c0 = S_WPM == 1 ? 0 : (warp % S_WPM) * SCOLS;");
  if (!outputs) c("float sacc[S_MPW][SCOLS / 8][4] = {};");
  // Element (row, col) of vs: padded rows, or core matrices in the wgmma tiles.
  const auto vs_index = [wgmma](const std::string& row, const std::string& col) {
    return wgmma ? "vs_off(" + row + ", " + col + ")" : row + " * VLD + " + col;
  };
  const auto for_state = [&](const std::function<void()>& body) {
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m)");
    c.in();
    c("if (warp < S_WARPS && s_mt + m * WARPS < SMT)");
    c.in();
    c("LADLE_UNROLL for (int nt = 0; nt < SCOLS / 8; ++nt)");
    c.in();
    c("LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c.in();
    c("const int kk = (s_mt + m * WARPS) * 16 + gid + (r >= 2 ? 8 : 0), col = s_c0 + nt * 8 + tig * 2 + (r & 1);");
    body();
    c.out();
    c("}");
    c.out();
    c.out();
    c.out();
  };
  // Element (key0 + kk, v0 + col) of a [K][V] state of this head: the states of chunk gc at
  // chunk_states + state_at(gc).
  const auto state_at = [](const std::string& chunk) {
    return "((" + chunk + " * H + h) * K + key0 + kk) * V + v0 + col";
  };
  const std::string sequence_index = segmented ? "seg[3]" : "static_cast<long long>(n)";
  if (outputs) c("// The state entering the chunk is read from chunk_states where it is needed (3a, 3d).");
  else if (segmented && !states) {
    c("// The state entering this segment: h0 for a sequence's first segment, else the fold kernel's");
    c("// result in segment_states row seg[5] + seg[4] - 1 (the earlier segments' L_j and D_j folded in).");
    for_state([&] {
      c("sacc[m][nt][r] = key0 + kk < K && v0 + col < V ? (seg[4] > 0 ? segment_states[" + state_at("(seg[5] + seg[4] - 1)") + "] : " +
        (spec.initial_state ? "ladle_load(initial_state + " + state_at(sequence_index) + ")" : std::string("0.0f")) + ") : 0.0f;");
    });
  } else for_state([&] {
    if (spec.initial_state)
      c("sacc[m][nt][r] = key0 + kk < K && v0 + col < V ? ladle_load(initial_state + " + state_at(sequence_index) + ") : 0.0f;");
    else
      c("sacc[m][nt][r] = 0.0f; (void)kk; (void)col;");
  });
  // segment_decay: per earlier segment and head, DL log2 totals: the key side (K of them, or one
  // for a per-head scalar gate, which a key-side vector gate's totals include), then V value-side.
  const int key_totals = kgate == KeyGate::vector ? 2 : kgate == KeyGate::scalar ? 1 : 0;  // 2: K of them
  const std::string key_width = key_totals == 2 ? "K" : key_totals == 1 ? "1" : "0";
  if (segmented) {
    c("const long long DL = " + key_width + (vgate ? " + V" : "") + ";  // segment_decay's row: key side, then value side");
    c("(void)DL;");
  }
  c("");

  const auto token_locals = [&](const std::string& cpos, const std::string& base = "base", const std::string& valid = "valid") {
    c("const long long step = " + base + " + " + cpos + ";");
    c("const bool live = " + cpos + " < " + valid + ";");
    c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
    token_rows(c, variant, id, used, true);
    if (varies_over_tokens(ir::Slot::log_decay_head) && has(ir::Slot::log_decay_head)) {
      no_feature_slot(ir::Slot::log_decay_head, "head_log_decay");
      c("(void)head_log_decay;");
    }
  };
  // Index expressions of the gate arrays, "0" past the front.
  const auto kg_at = [](const std::string& row, const std::string& col) { return "kg[(" + row + ") * BK + " + col + "]"; };
  const auto vg_at = [](const std::string& row, const std::string& col) { return "vg[(" + row + ") * BV + " + col + "]"; };
  const auto before = [](const std::string& array_at) { return "(t0 > 0 ? " + array_at + " : 0.0f)"; };
  // The key-side gate sum at the read's reference token: tm, or tq for a read before the update
  // (-1 there: the chunk's start, 0).
  const auto read_gate = [&](const std::string& col) {
    return before_read ? "(tq >= 0 ? " + kg_at("tq", col) + " : 0.0f)" : kg_at("tm", col);
  };
  // The state's factor from the step's start (t0 - 1) to token `at`, for the state tile this
  // thread holds: one per key row (2 per row tile) times one per value column (2 per column
  // tile), so 2^x is taken per row and per column, not per element. Returns the factor's text
  // for element sacc[m][nt][<r>] given the text of <r> (empty when the variant has no such gate).
  const auto state_factors = [&](const std::string& at, const std::string& name,
                                  bool head_gate) -> std::function<std::string(const std::string&)> {
    std::vector<std::string> row, column;  // factor text before and after the element's r
    if (kgate == KeyGate::vector) {
      c("float " + name + "_row[S_MPW][2];");
      c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m)");
      c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c("    const int kk = (s_mt + m * WARPS) * 16 + gid + 8 * half;");
      c("    " + name + "_row[m][half] = s_mt + m * WARPS < SMT ? ladle_exp2(" + (at == "tq" ? read_gate("kk") : kg_at(at, "kk")) + " - " +
        before(kg_at("t0 - 1", "kk")) + ") : 1.0f;");
      c("  }");
      row = {name + "_row[m][", " >> 1]"};
    }
    std::string head;
    if (kgate == KeyGate::scalar && head_gate) {
      c("const float " + name + "_head = ladle_exp2(hg[" + at + "] - " + before("hg[t0 - 1]") + ");");
      head = name + "_head";
    }
    if (vgate) {
      c("float " + name + "_col[SCOLS / 8][2];");
      c("LADLE_UNROLL for (int nt = 0; nt < SCOLS / 8; ++nt)");
      c("  LADLE_UNROLL for (int odd = 0; odd < 2; ++odd) {");
      c("    const int col = s_c0 + nt * 8 + tig * 2 + odd;");
      c("    " + name + "_col[nt][odd] = ladle_exp2(" + vg_at(at, "col") + " - " + before(vg_at("t0 - 1", "col")) + ");");
      c("  }");
      column = {name + "_col[nt][", " & 1]"};
    }
    if (row.empty() && head.empty() && column.empty()) return {};
    return [row, head, column](const std::string& r) {
      std::string factor = head;
      if (!row.empty()) factor += (factor.empty() ? "" : " * ") + row[0] + r + row[1];
      if (!column.empty()) factor += (factor.empty() ? "" : " * ") + column[0] + r + column[1];
      return factor;
    };
  };

  // The gate columns of 2 (cumulative sums): the key side's BK (or the head gate's 1), then BV.
  std::string gate_columns;
  if (kgate == KeyGate::vector) gate_columns = "BK";
  if (kgate == KeyGate::scalar) gate_columns = "1";
  if (vgate) gate_columns += gate_columns.empty() ? "BV" : " + BV";
  if (segmented && states && !gate_columns.empty()) {
    c("constexpr int GCOLS = " + gate_columns + ";");
    c("float segment_log[(GCOLS + THREADS - 1) / THREADS] = {};  // the segment's log2 totals of this thread's gate columns");
  }
  c("const long long length = eos - bos;");
  // The raw rows of the chunk at `first` into the prefetch buffers, then one commit.
  const auto emit_prefetch = [&](const std::string& first) {
    c("{  // Prefetch the raw rows of the chunk at " + first + " (cp.async where a row is contiguous and aligned).");
    c.in();
    c("const long long next = " + first + ";");
    c("const int next_valid = static_cast<int>(length - next < C ? length - next : C);");
    const auto rows = [&](ir::InputKind kind, const std::vector<bool>& side) {
      const bool key = kind == ir::InputKind::token_key;
      const std::string cols = key ? "BK" : "BV", first_col = key ? "i0" : "j0", count = key ? "key_count" : "value_count";
      bool any = false;
      for (std::size_t k = 0; k < inputs.size(); ++k) any = any || (async[k] && side[k] && inputs[k].kind == kind);
      if (!any) return;
      c("for (int e = threadIdx.x; e < C * (" + cols + " / 8); e += THREADS) {");
      c.in();
      c("const int cpos = e / (" + cols + " / 8), " + first_col + " = e % (" + cols + " / 8) * 8;");
      token_locals("cpos", "next", "next_valid");
      c("const int " + count + " = live ? " + (key ? "K - (key0 + i0)" : "V - (v0 + j0)") + " : 0;");
      for (std::size_t k = 0; k < inputs.size(); ++k)
        if (async[k] && side[k] && inputs[k].kind == kind)
          c("ladle_prefetch8(&" + id[k] + "_raw[cpos * " + cols + " + " + first_col + "], " + id[k] + " + (" + count + " > 0 ? " +
            id[k] + "_row + " + (key ? "(key0 + i0)" : "(v0 + j0)") + " * " + id[k] + "_stride_d : 0), " + id[k] +
            "_stride_d, " + count + ");");
      c.out();
      c("}");
    };
    rows(ir::InputKind::token_key, key_side);
    rows(ir::InputKind::token_value, value_side);
    c("ladle_cp_async_commit();");
    c.out();
    c("}");
  };
  if (prefetch) emit_prefetch(outputs ? "c_of * C" : "0");
  // The output pass's state tile (bf16 chunk_states) lands in st by cp.async together with the
  // chunk's rows and is scaled in place in 3a: read there from global memory, element by
  // element, its loads were 47 % of the pass's stall samples.
  const bool state_async = outputs && !spec.tile.state_f32;
  if (state_async) {
    c("{  // The state entering the chunk into st (cp.async where a row segment is contiguous and aligned).");
    c.in();
    c("for (int e = threadIdx.x; e < BK * (BV / 8); e += THREADS) {");
    c.in();
    c("const int kk = e / (BV / 8), col = e % (BV / 8) * 8;");
    c("const int count = key0 + kk < K ? V - (v0 + col) : 0;  // columns inside the state (<= 0: none, zeroed in 3a)");
    c("ladle_prefetch8(reinterpret_cast<ladle_bf16*>(&st[kk * VLD + col]), chunk_states + (count > 0 ? " +
      state_at("(first_chunk + c_of)") + " : 0), 1, count);");
    c.out();
    c("}");
    c("ladle_cp_async_commit();");
    c.out();
    c("}");
  }
  if (outputs) c("for (long long base = c_of * C; base < length && base == c_of * C; base += C) {  // this chunk only");
  else c("for (long long base = 0; base < length; base += C) {");
  c.in();
  c("const int valid = static_cast<int>(length - base < C ? length - base : C);");
  if (prefetch) {
    c("ladle_cp_async_wait<0>();  // this chunk's raw rows");
    c("__syncthreads();");
  }
  if (states && !segmented) {
    c("// The state entering this chunk, for the output pass.");
    // Two adjacent columns per store (the accumulator layout holds them in r and r + 1).
    for_state([&] {
      c("if ((r & 1) == 0 && key0 + kk < K && v0 + col < V)");
      c("  ladle_store2(chunk_states + " + state_at("(first_chunk + base / C)") +
        ", sacc[m][nt][r], sacc[m][nt][r + 1], v0 + col + 1 < V);");
    });
  }
  c("");
  c("// 1. Stage the chunk: q and k features (bf16), v (bf16), log2 gates (fp32). Rows past");
  c("//    the end are zero.");
  // Eight consecutive features per item: one row offset, one 16-byte load per tensor where the
  // row is contiguous and aligned (ladle_load8), one 16-byte shared store per staged array.
  // Two items in flight at 8 warps; at 4 or fewer, each thread holds twice the state and o, and
  // unrolled staging spilled (112 bytes at 128,64,64,4 on sm_90a).
  // The state pass stages from its prefetch buffers only (shared loads, no o): four items in
  // flight (one at a time, its staging was 46 % of its stall samples, each item waiting on
  // its shared loads).
  const std::string staging_unroll = states && prefetch ? "LADLE_UNROLL_4 " : tile.warps >= 8 ? "LADLE_UNROLL_2 " : "";
  const auto stage8 = [&](const std::vector<bool>& side, ir::InputKind kind, const std::string& count,
                          const std::string& first, const std::string& suffix) {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (side[k] && inputs[k].kind == kind) {
        c("float " + id[k] + "_x8[8];");
        if (async[k])
          c("ladle_load8_raw(" + id[k] + "_x8, &" + id[k] + "_raw[cpos * " + (kind == ir::InputKind::token_key ? "BK" : "BV") +
            " + " + (kind == ir::InputKind::token_key ? "i0" : "j0") + "]);  // prefetched");
        else
          c("ladle_load8(" + id[k] + "_x8, " + id[k] + " + (" + count + " > 0 ? " + id[k] + "_row + " + first + " * " + id[k] +
            "_stride_d : 0), " + id[k] + "_stride_d, " + count + ");");
      }
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c.in();
    c("const bool use = u < " + count + ";");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (side[k] && inputs[k].kind == kind) c("const float " + id[k] + suffix + " = " + id[k] + "_x8[u];");
  };
  c(staging_unroll + "for (int e = threadIdx.x; e < C * (BK / 8); e += THREADS) {");
  c.in();
  c("const int cpos = e / (BK / 8), i0 = e % (BK / 8) * 8;");
  token_locals("cpos");
  c("const int key_count = live ? K - (key0 + i0) : 0;  // features of this item inside K (<= 0: none)");
  c(std::string("float ") + (states ? "" : "qv8[8], ") + "kv8[8]" + (kgate == KeyGate::vector ? ", kg8[8]" : "") + ";");
  stage8(key_side, ir::InputKind::token_key, "key_count", "(key0 + i0)", "_i");
  if (!states) c("qv8[u] = use ? " + render(ir::Slot::q_feature, "_i") + " : 0.0f;");
  c("kv8[u] = use ? " + render(ir::Slot::k_feature, "_i") + " : 0.0f;");
  if (kgate == KeyGate::vector) {
    std::string log_a = render(ir::Slot::log_decay_k, "_i");
    if (has(ir::Slot::log_decay_head)) log_a = "(" + log_a + ") + head_log_decay";
    c("kg8[u] = use ? LOG2E * (" + log_a + ") : 0.0f;");
  }
  c.out();
  c("}");
  if (!states) c("ladle_store8_bf16(&qs[cpos * QLD + i0], qv8);");
  c("ladle_store8_bf16(&ks[cpos * QLD + i0], kv8);");
  if (kgate == KeyGate::vector) c("ladle_store8_f32(&kg[cpos * BK + i0], kg8);");
  c.out();
  c("}");
  if (kgate == KeyGate::scalar || (scale_per_token && !states)) {
    c("for (int cpos = threadIdx.x; cpos < C; cpos += THREADS) {");
    c.in();
    token_locals("cpos");
    if (kgate == KeyGate::scalar) c("hg[cpos] = live ? LOG2E * head_log_decay : 0.0f;");
    if (scale_per_token && !states) c("token_scale[cpos] = live ? " + render(ir::Slot::scale, "") + " : 0.0f;");
    c.out();
    c("}");
  }
  c(staging_unroll + "for (int e = threadIdx.x; e < C * (BV / 8); e += THREADS) {");
  c.in();
  c("const int cpos = e / (BV / 8), j0 = e % (BV / 8) * 8;");
  token_locals("cpos");
  c("const int value_count = live ? V - (v0 + j0) : 0;  // columns of this item inside V (<= 0: none)");
  c(std::string("float vv8[8]") + (vgate ? ", vg8[8]" : "") + ";");
  stage8(value_side, ir::InputKind::token_value, "value_count", "(v0 + j0)", "_j");
  c("vv8[u] = use ? " + render(ir::Slot::v, "_j") + " : 0.0f;");
  if (vgate) c("vg8[u] = use ? LOG2E * (" + render(ir::Slot::log_decay_v, "_j") + ") : 0.0f;");
  c.out();
  c("}");
  c("ladle_store8_bf16(&vs[" + vs_index("cpos", "j0") + "], vv8);");
  if (vgate) c("ladle_store8_f32(&vg[cpos * BV + j0], vg8);");
  c.out();
  c("}");
  if (wgmma) c("ladle_fence_proxy_async();  // this thread's writes of vs, visible to wgmma's async proxy");
  c("__syncthreads();");
  // Every thread has read the prefetch buffers: the next chunk's rows may land in them while
  // this chunk computes (the serial form and the state pass; the output pass has one chunk).
  if (prefetch && !outputs) {
    c("if (base + C < length)");
    emit_prefetch("base + C");
  }
  if (bonus && !states) {
    // From the staged (bf16) features, as the scores beside it are formed; before 3a rewrites qs and ks.
    c("");
    c("// 1b. The bonus read of each token, q_t . bonus . k_t (the scores' diagonal): a warp a row.");
    c("for (int cpos = warp; cpos < C; cpos += WARPS) {");
    c.in();
    token_locals("cpos");
    c("float part = 0.0f;");
    c("for (int i0 = lane * 8; i0 < BK; i0 += 256) {");
    c.in();
    c("float qv8[8], kv8[8];");
    c("ladle_load8_bf16(qv8, &qs[cpos * QLD + i0]);");
    c("ladle_load8_bf16(kv8, &ks[cpos * QLD + i0]);");
    c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
    c.in();
    c("const int i = i0 + u;");
    for (const std::size_t k : slot_inputs(variant, ir::Slot::bonus))
      if (inputs[k].kind == ir::InputKind::token_key || inputs[k].kind == ir::InputKind::head_key)
        c("const float " + id[k] + "_b = live && i < K ? " + row_load(id, k, "i") + " : 0.0f;");
    c("part += qv8[u] * (" + render(ir::Slot::bonus, "_b") + ") * kv8[u];");
    c.out();
    c("}");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) part += __shfl_xor_sync(0xffffffffu, part, d);");
    c("if (lane == 0) bq[cpos] = part;");
    c.out();
    c("}");
    if (kgate == KeyGate::none && !vgate) c("__syncthreads();");
  }
  if (kgate != KeyGate::none || vgate) {
    c("");
    // A log2 gate below GATE_FLOOR (-inf: a hard reset, exp(-inf) = 0) counts as GATE_FLOOR:
    // 2^-256 is 0 in fp32 (so is exp of any natural-log gate below about -104 on the CPU path),
    // so the state is still wiped exactly, but no sum is -inf and no difference is
    // (-inf) - (-inf) = NaN. Nothing else changes, because the steps already handle it: a step
    // with a floored gate after its first token spans a log2 difference of at least 256 >
    // FIT_LIMIT (decays: gates <= 0), so it fails the fit check and is walked in 16-token steps,
    // then single tokens; a step that starts at a floored gate reads and decays the state by
    // 2^(<= -256) = 0, as it should. A per-head scalar gate is not checked and needs no check:
    // its factors 2^(G_t - G_s), s <= t, are all <= 1, and 0 across a floored gate.
    // Precision: a single running sum would carry each floor (-256 per reset in the chunk) into
    // every later sum and round the small gates after it at that magnitude, token after token.
    // So the sum since the last floored gate (run) is kept apart from the sums before it and the
    // floors (floors): each stored value, floors + run, is rounded once at that magnitude, so a
    // difference of two of them is off by one fp32 spacing there (plus run's own rounding, as in
    // any chunk), however many tokens lie between. A chunk without a floored gate has floors = 0
    // and stores run exactly as before: its cost is a compare and an add per gate in this loop
    // and nothing anywhere else (a branch per chunk, or a reset flag per column read by the
    // factors, would cost every chunk to help rare ones).
    c("// 2. Cumulative log2 gates within the chunk, one column per thread. A gate below GATE_FLOOR");
    c("//    (-inf: a hard reset) counts as GATE_FLOOR: 2^-256 = 0 still wipes the state, and no");
    c("//    sum is -inf; a step with one after its first token fails the fit check. The sum since");
    c("//    the last floored gate is kept apart, so the small gates after it keep their precision.");
    const std::string columns = gate_columns;
    // The whole chunk's fit check (3, the first step) is taken here, from the sums as they are
    // formed: the profile gave its own pass over the gates 7 % of the samples at 32-token chunks.
    const bool fused_fit = check_fit && !states;
    if (fused_fit) c("float chunk_worst = 0.0f;  // the whole chunk's largest |G_t - G_tm|, for the fit check");
    if (segmented && states) {  // unrolled, so that segment_log stays in registers
      c("LADLE_UNROLL for (int gi = 0; gi < (GCOLS + THREADS - 1) / THREADS; ++gi) {");
      c.in();
      c("const int col = threadIdx.x + gi * THREADS;");
      c("if (col >= GCOLS) break;");
    } else {
      c("for (int col = threadIdx.x; col < " + columns + "; col += THREADS) {");
      c.in();
    }
    std::string pointer;
    if (kgate == KeyGate::vector) pointer = vgate ? "col < BK ? kg + col : vg + (col - BK)" : "kg + col";
    if (kgate == KeyGate::scalar) pointer = vgate ? "col < 1 ? hg : vg + (col - 1)" : "hg";
    if (kgate == KeyGate::none) pointer = "vg + col";
    std::string ld = kgate == KeyGate::vector ? "BK" : "1";
    if (vgate) ld = kgate == KeyGate::none ? "BV" : "(" + pointer.substr(0, pointer.find('?')) + "? " + ld + " : BV)";
    c("float* const p = " + pointer + ";");
    c("const int ld = " + ld + ";");
    c("float floors = 0.0f, run = 0.0f;");
    if (fused_fit) c("float g_lo = 0.0f, g_hi = 0.0f, g_tm = 0.0f;  // over the chunk's tokens, and at its middle one");
    c("LADLE_UNROLL for (int cpos = 0; cpos < C; ++cpos) {");
    c.in();
    c("const float lg = p[cpos * ld];");
    c("if (lg < GATE_FLOOR) floors += run + GATE_FLOOR, run = 0.0f;");
    c("else run += lg;  // NaN stays NaN");
    c("p[cpos * ld] = floors + run;");
    if (fused_fit) {
      // A read before the update also takes G_(-1) = 0 (q~ of the chunk's first token).
      c(before_read ? "if (cpos == 0) g_lo = fminf(0.0f, floors + run), g_hi = fmaxf(0.0f, floors + run);"
                    : "if (cpos == 0) g_lo = g_hi = floors + run;");
      c("else if (cpos < valid) g_lo = fminf(g_lo, floors + run), g_hi = fmaxf(g_hi, floors + run);");
      c("if (cpos == (valid - 1) / 2) g_tm = floors + run;");
    }
    c.out();
    c("}");
    if (segmented && states) c("segment_log[gi] += floors + run;  // the chunk's total (rows past the end add 0)");
    if (fused_fit) {
      // max over t of |G_t - G_tm| is max(G_hi - G_tm, G_tm - G_lo) exactly (a rounded difference
      // is monotone in each operand); a NaN is skipped as the per-element check skipped it.
      c(std::string(kgate == KeyGate::scalar ? "if (col >= 1) " : "") +  // not the head gate's column
        "chunk_worst = fmaxf(chunk_worst, fmaxf(g_hi - g_tm, g_tm - g_lo));");
    }
    c.out();
    c("}");
    if (fused_fit) {
      c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) chunk_worst = fmaxf(chunk_worst, __shfl_xor_sync(0xffffffffu, chunk_worst, d));");
      c("if (lane == 0) atomicMax(&fit[checks & 1], ladle_float_bits(chunk_worst));");
    }
    c("__syncthreads();");
  }
  c("");
  // 3c and 3d: the state update over rows t0..t1. `reference` is the token the staged k and v
  // are relative to: tm after the read (k~, v~), t where they are still raw. early (the serial
  // form without a value gate): issued before the output, from k~ and v as staged, the update's
  // factors applied to the k~^T fragments in registers (k_up = k~ 2^(G_te - G_tm) per key row,
  // the head gate's 2^(g_te - g_s) per token), so that no pass rewrites ks or vs and the
  // output's products overlap the update; on wgmma the caller waits for it (emit_update_wait).
  const auto emit_update_wait = [&] {
    c("ladle_wgmma_wait<0>();");
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) ladle_wgmma_fence_operand<BV>(sacc[m]);");
  };
  const auto emit_update = [&](const std::string& reference, bool early) {
    const bool update_factors = !early && (kgate != KeyGate::none || vgate);
    if (update_factors) {
      c("__syncthreads();");
      c("");
      c("// 3c. The update's factors, in place: k_up = k 2^(G_te - G_t), v_up = v 2^(Gv_te - Gv_t)" +
        std::string(reference == "tm" ? " (k~ and v~ hold the factors against tm)." : "."));
      if (kgate == KeyGate::vector) {
        c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
        c.in();
        c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
        c("float kv8[8], ge8[8], gt8[8];");
        c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
        c("ladle_load8_f32(ge8, &kg[te * BK + i0]);");
        c("ladle_load8_f32(gt8, &kg[" + reference + " * BK + i0]);");
        c("LADLE_UNROLL for (int u = 0; u < 8; ++u) kv8[u] *= ladle_exp2(ge8[u] - gt8[u]);");
        c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
        c.out();
        c("}");
      }
      if (vgate || kgate == KeyGate::scalar) {
        c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BV / 8); e += THREADS) {");
        c.in();
        c("const int t = t0 + e / (BV / 8), j0 = e % (BV / 8) * 8;");
        c("float vv8[8];");
        c("ladle_load8_bf16(vv8, &vs[" + vs_index("t", "j0") + "]);");
        c(kgate == KeyGate::scalar ? "const float hf = hg[te] - hg[t];" : "constexpr float hf = 0.0f;");
        std::string log2_factor = "hf";
        if (vgate) {
          c("float ge8[8], gt8[8];");
          c("ladle_load8_f32(ge8, &vg[te * BV + j0]);");
          c("ladle_load8_f32(gt8, &vg[" + reference + " * BV + j0]);");
          log2_factor = "ge8[u] - gt8[u] + hf";
        }
        c("LADLE_UNROLL for (int u = 0; u < 8; ++u) vv8[u] *= ladle_exp2(" + log2_factor + ");");
        c("ladle_store8_bf16(&vs[" + vs_index("t", "j0") + "], vv8);");
        c.out();
        c("}");
      }
    }
    if (!early) {
      if (wgmma) c("ladle_fence_proxy_async();  // this thread's writes of vs, visible to wgmma's async proxy");
      c("__syncthreads();");
      c("");
    }
    c(std::string("// 3") + (early ? "c" : "d") + ". The state: S = S * decay(t0-1 -> te) + k_up^T v_up over rows t0..t1" +
      (early ? ", issued before the output: k_up^T" : "."));
    if (early)
      c("//     and v_up are k~^T and v as staged, the factors applied in registers (k_up = k~ 2^(G_te - G_tm) per key row, v_up = v 2^(g_te - g_s) per token).");
    if (outputs) {
      c("// The output pass keeps the chunk's state in its own slice of chunk_states (no other block reads");
      c("// it): in registers only for this update.");
      c("float sacc[S_MPW][SCOLS / 8][4];");
      for_state([&] { c("sacc[m][nt][r] = kk < K && v0 + col < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + ") : 0.0f;"); });
    }
    if (const auto decay = state_factors("te", "decay", true))
      for_state([&] { c("sacc[m][nt][r] *= " + decay("r") + "; (void)kk; (void)col;"); });
    if (wgmma) {
      c("//    On wgmma: per warpgroup and 64 key rows, one m64nBVk16 product per 16 tokens: A = k_up^T from");
      c("//    registers (the ldmatrix.trans fragment of each warp's 16 rows), B = v_up N-major from vs");
      c("//    (imm-trans-b = 1; SBO 144 bytes: the next 8 values; LBO VRS * 2 bytes: the next 8 tokens).");
      c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) ladle_wgmma_fence_operand<BV>(sacc[m]);");
      c("ladle_wgmma_fence();");
    }
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) {");
    c.in();
    if (!wgmma) c("if (warp >= S_WARPS || s_mt + m * WARPS >= SMT) continue;");  // wgmma tiles: every warp, every m
    c("const int k0 = (s_mt + m * WARPS) * 16;");
    if (early && kgate == KeyGate::vector)  // rows k0 + gid (afrag 0, 2) and k0 + gid + 8 (1, 3)
      c("const float fa = ladle_exp2(" + kg_at("te", "k0 + gid") + " - " + kg_at("tm", "k0 + gid") + "), fb = ladle_exp2(" +
        kg_at("te", "k0 + gid + 8") + " - " + kg_at("tm", "k0 + gid + 8") + ");");
    c("for (int j = t0 / 16; j <= (t1 - 1) / 16; ++j) {");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_trans_at(afrag, ks_at + 2u * ((j * 16 + lane % 8 + (lane / 16) * 8) * QLD + k0 + ((lane / 8) & 1) * 8));");
    if (early && kgate == KeyGate::vector) {
      c("afrag[0] = ladle_scale_bf16x2(afrag[0], fa, fa), afrag[1] = ladle_scale_bf16x2(afrag[1], fb, fb);");
      c("afrag[2] = ladle_scale_bf16x2(afrag[2], fa, fa), afrag[3] = ladle_scale_bf16x2(afrag[3], fb, fb);");
    }
    if (early && kgate == KeyGate::scalar) {  // tokens s, s + 1 (afrag 0, 1) and s + 8, s + 9 (2, 3)
      c("{");
      c.in();
      c("const int s = j * 16 + tig * 2;");
      c("const float h0 = ladle_exp2(hg[te] - hg[s]), h1 = ladle_exp2(hg[te] - hg[s + 1]);");
      c("const float h8 = ladle_exp2(hg[te] - hg[s + 8]), h9 = ladle_exp2(hg[te] - hg[s + 9]);");
      c("afrag[0] = ladle_scale_bf16x2(afrag[0], h0, h1), afrag[1] = ladle_scale_bf16x2(afrag[1], h0, h1);");
      c("afrag[2] = ladle_scale_bf16x2(afrag[2], h8, h9), afrag[3] = ladle_scale_bf16x2(afrag[3], h8, h9);");
      c.out();
      c("}");
    }
    // After the factors: a token past the step may have an infinite factor (a floored gate), 0 * inf.
    c("if (j * 16 < t0 || j * 16 + 16 > t1) {  // a partial tile: rows outside the step count zero");
    c.in();
    c("const int s = j * 16 + tig * 2;");
    c("const unsigned lo = (s >= t0 && s < t1 ? 0xffffu : 0u) | (s + 1 >= t0 && s + 1 < t1 ? 0xffff0000u : 0u);");
    c("const unsigned hi = (s + 8 >= t0 && s + 8 < t1 ? 0xffffu : 0u) | (s + 9 >= t0 && s + 9 < t1 ? 0xffff0000u : 0u);");
    c("afrag[0] &= lo, afrag[1] &= lo, afrag[2] &= hi, afrag[3] &= hi;");
    c.out();
    c("}");
    if (wgmma) {
      c("ladle_wgmma_rs_bf16<BV>(sacc[m], afrag, ladle_wgmma_desc(vs + vs_off(j * 16, 0), VRS * 2, VCS * 2));");
    } else {
      c("LADLE_UNROLL for (int np = 0; np < SCOLS / 16; ++np) {");
      c.in();
      c("unsigned bfrag[4];");
      c("ladle_ldmatrix_x4_trans_at(bfrag, vs_at + 2u * (" + vs_index("(j * 16 + lane % 16)", "(s_c0 + np * 16 + (lane / 16) * 8)") + "));");
      c("ladle_mma_bf16(sacc[m][2 * np], afrag, bfrag[0], bfrag[1]);");
      c("ladle_mma_bf16(sacc[m][2 * np + 1], afrag, bfrag[2], bfrag[3]);");
      c.out();
      c("}");
    }
    c.out();
    c("}");
    c.out();
    c("}");
    if (wgmma) {
      c("ladle_wgmma_commit();");
      if (!early) emit_update_wait();
    }
    if (outputs)
      for_state([&] {
        c("if (kk < K && v0 + col < V) ladle_store(chunk_states + " + state_at("(first_chunk + c_of)") + ", sacc[m][nt][r]);");
      });
  };
  if (states) {
    c("// 3. The state update over the whole chunk: no read, so no reference token and no fit check;");
    c("//    every factor 2^(G_te - G_t) is a decay (at most 1), and a floored gate wipes exactly.");
    c("{");
    c.in();
    c("const int t0 = 0, t1 = valid, te = valid - 1;");
    emit_update("t", false);
    c.out();
    c("}");
  } else {
    c("// 3. Steps over the chunk: the whole chunk when its gate factors fit one reference token");
    c("//    tm, else 16-token steps, else single tokens (which always fit).");
    c("for (int t0 = 0; t0 < valid;) {");
    c.in();
    c("if (t0 > 0) __syncthreads();  // the last step's update has read its rows");
    c("int span = C, t1 = valid, tm = 0;");
    if (check_fit) c("span = t0 == 0 ? C : t0 % 16 == 0 ? 16 : 1;");
    c("for (;;) {");
    c.in();
    c("t1 = t0 + span < valid ? t0 + span : valid;");
    c("tm = t0 + (t1 - t0 - 1) / 2;");
    if (check_fit) {
      c("if (span == 1) break;");
      c("if (t0 > 0 || span < C) {  // the whole chunk's maximum is in fit already (2.)");
      c.in();
      c("float worst = 0.0f;");
      // A read before the update: over t0 - 1 .. t1 - 1 (q~ of row t carries G_(t-1); G_(-1) = 0).
      const auto worst_over = [&](const std::string& gates, const std::string& columns) {
        const std::string first = before_read ? "t0 - 1" : "t0", rows = before_read ? "(t1 - t0 + 1)" : "(t1 - t0)";
        c("for (int e = threadIdx.x; e < " + rows + " * (" + columns + " / 8); e += THREADS) {");
        c.in();
        c("const int t = " + first + " + e / (" + columns + " / 8), i0 = e % (" + columns + " / 8) * 8;");
        c("float gt8[8], gm8[8];");
        if (before_read)
          c("if (t < 0) { LADLE_UNROLL for (int u = 0; u < 8; ++u) gt8[u] = 0.0f; } else");
        c("ladle_load8_f32(gt8, &" + gates + "[t * " + columns + " + i0]);");
        c("ladle_load8_f32(gm8, &" + gates + "[tm * " + columns + " + i0]);");
        c("LADLE_UNROLL for (int u = 0; u < 8; ++u) worst = fmaxf(worst, fabsf(gt8[u] - gm8[u]));");
        c.out();
        c("}");
      };
      if (kgate == KeyGate::vector) worst_over("kg", "BK");
      if (vgate) worst_over("vg", "BV");
      c("LADLE_UNROLL for (int d = 16; d > 0; d /= 2) worst = fmaxf(worst, __shfl_xor_sync(0xffffffffu, worst, d));");
      c("if (lane == 0) atomicMax(&fit[checks & 1], ladle_float_bits(worst));");
      c("__syncthreads();");
      c.out();
      c("}");
      c("const bool fits = ladle_bits_float(fit[checks & 1]) <= FIT_LIMIT;");
      c("if (threadIdx.x == 0) fit[(checks + 1) & 1] = 0u;");
      c("++checks;");
      c("if (fits) break;");
      c("__syncthreads();  // the next check's maximum starts after the reset");
      c("span = span > 16 ? 16 : 1;");
    } else {
      c("break;");
    }
    c.out();
    c("}");
    c("const int te = t1 - 1;");
    c("(void)te; (void)tm;");
    if (before_read) {
      // A one-token step has no intra-step scores (strictly causal): q~ = q against t0 - 1, so the
      // state is read as it entered the step whatever the token's own gate (a hard reset included).
      c("const int tq = t1 - t0 == 1 ? t0 - 1 : tm;  // q~'s reference token (-1: the chunk's start)");
      c("(void)tq;");
    }
    c("");
    if (before_read) {
      c("// 3a. Factors, in place for rows t0..t1: q~ = q 2^(G_t-1 - G_tq), k~ = k 2^(G_tm - G_t); the state for");
      c("//     the read, S 2^(G_tq - G_t0-1).");
    } else {
      c("// 3a. Factors against tm, in place for rows t0..t1: q~ = q 2^(G_t - G_tm), k~ = k 2^(G_tm - G_t),");
      c("//     v~ = v 2^(Gv_tm - Gv_t); the state for the read, S 2^(G_tm - G_t0-1) 2^(Gv_tm - Gv_t0-1).");
    }
    if (kgate == KeyGate::vector && before_read) {
      c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
      c.in();
      c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
      c("float qv8[8], kv8[8], gt8[8], gm8[8], gp8[8], gq8[8];");
      c("ladle_load8_bf16(qv8, &qs[t * QLD + i0]);");
      c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
      c("ladle_load8_f32(gt8, &kg[t * BK + i0]);");
      c("ladle_load8_f32(gm8, &kg[tm * BK + i0]);");
      c("if (t > 0) ladle_load8_f32(gp8, &kg[(t - 1) * BK + i0]);");
      c("else { LADLE_UNROLL for (int u = 0; u < 8; ++u) gp8[u] = 0.0f; }");
      c("if (tq >= 0) ladle_load8_f32(gq8, &kg[tq * BK + i0]);");
      c("else { LADLE_UNROLL for (int u = 0; u < 8; ++u) gq8[u] = 0.0f; }");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
      c("  qv8[u] *= ladle_exp2(gp8[u] - gq8[u]);");
      c("  kv8[u] *= ladle_exp2(gm8[u] - gt8[u]);");
      c("}");
      c("ladle_store8_bf16(&qs[t * QLD + i0], qv8);");
      c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
      c.out();
      c("}");
    } else if (kgate == KeyGate::vector) {
      c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BK / 8); e += THREADS) {");
      c.in();
      c("const int t = t0 + e / (BK / 8), i0 = e % (BK / 8) * 8;");
      c("float qv8[8], kv8[8], gt8[8], gm8[8];");
      c("ladle_load8_bf16(qv8, &qs[t * QLD + i0]);");
      c("ladle_load8_bf16(kv8, &ks[t * QLD + i0]);");
      c("ladle_load8_f32(gt8, &kg[t * BK + i0]);");
      c("ladle_load8_f32(gm8, &kg[tm * BK + i0]);");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
      c("  const float d = gt8[u] - gm8[u];");
      c("  qv8[u] *= ladle_exp2(d);");
      c("  kv8[u] *= ladle_exp2(-d);");
      c("}");
      c("ladle_store8_bf16(&qs[t * QLD + i0], qv8);");
      c("ladle_store8_bf16(&ks[t * QLD + i0], kv8);");
      c.out();
      c("}");
    }
    if (vgate) {
      c(staging_unroll + "for (int e = threadIdx.x; e < (t1 - t0) * (BV / 8); e += THREADS) {");
      c.in();
      c("const int t = t0 + e / (BV / 8), j0 = e % (BV / 8) * 8;");
      c("float vv8[8], gt8[8], gm8[8];");
      c("ladle_load8_bf16(vv8, &vs[" + vs_index("t", "j0") + "]);");
      c("ladle_load8_f32(gt8, &vg[t * BV + j0]);");
      c("ladle_load8_f32(gm8, &vg[tm * BV + j0]);");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) vv8[u] *= ladle_exp2(gm8[u] - gt8[u]);");
      c("ladle_store8_bf16(&vs[" + vs_index("t", "j0") + "], vv8);");
      c.out();
      c("}");
    }
    std::string factor;
    if (kgate == KeyGate::vector) factor += " * ladle_exp2(" + read_gate("kk") + " - " + before(kg_at("t0 - 1", "kk")) + ")";
    if (vgate) factor += " * ladle_exp2(" + vg_at("tm", "col") + " - " + before(vg_at("t0 - 1", "col")) + ")";
    std::string factor1 = factor;
    for (std::size_t at = factor1.find("col"); at != std::string::npos; at = factor1.find("col", at + 9))
      factor1.replace(at, 3, "(col + 1)");
    if (state_async) {
      c("if (t0 == 0) {  // the state as it arrived (st), in place");
      c.in();
      if (!prefetch) {
        c("ladle_cp_async_wait<0>();");
        c("__syncthreads();");
      }
      c("LADLE_UNROLL_2 for (int e = threadIdx.x; e < BK * (BV / 8); e += THREADS) {");
      c.in();
      c("const int kk = e / (BV / 8), c8 = e % (BV / 8) * 8;");
      c("float s8[8];");
      c("ladle_load8_bf16(s8, &st[kk * VLD + c8]);");
      c("LADLE_UNROLL for (int u = 0; u < 8; ++u) {");
      c.in();
      c("const int col = c8 + u;");
      c("s8[u] = key0 + kk < K && v0 + col < V ? s8[u]" + factor + " : 0.0f;");
      c.out();
      c("}");
      c("ladle_store8_bf16(&st[kk * VLD + c8], s8);");
      c.out();
      c("}");
      c.out();
      c("} else {  // the state as the last step left it in chunk_states");
      c.in();
    }
    if (outputs) {
      c("LADLE_UNROLL_8 for (int e = threadIdx.x; e < BK * (BV / 2); e += THREADS) {  // two columns per thread");
      c.in();
      c("const int kk = e / (BV / 2), col = e % (BV / 2) * 2;");
      c("const bool row = kk < K;");
      c("const float s0 = row && v0 + col < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + ") : 0.0f;");
      c("const float s1 = row && v0 + col + 1 < V ? ladle_load(chunk_states + " + state_at("(first_chunk + c_of)") + " + 1) : 0.0f;");
      c("const float f0 = 1.0f" + factor + ";");
      c("const float f1 = 1.0f" + factor1 + ";");
      c("*reinterpret_cast<unsigned*>(&st[kk * VLD + col]) = ladle_pack_bf16(s0 * f0, s1 * f1);");
      c.out();
      c("}");
      if (state_async) {
        c.out();
        c("}");
      }
    } else {
      // The head gate (a per-token scalar) enters the read per row in 3b instead.
      const auto read = state_factors(before_read ? "tq" : "tm", "read", false);
      for_state([&] {
        c("if ((r & 1) == 0) {");
        c.in();
        c("*reinterpret_cast<unsigned*>(&st[kk * VLD + col]) = ladle_pack_bf16(sacc[m][nt][r]" +
          (read ? " * " + read("r") : "") + ", sacc[m][nt][r + 1]" + (read ? " * " + read("(r + 1)") : "") + ");");
        c.out();
        c("}");
      });
    }
    // The update goes before the output where no pass has to rewrite ks or vs for it (early); P
    // beside st where no factor pass rewrites qs and ks before it (no key-side vector gate).
    const bool early = !outputs && !vgate;
    const bool scores_first = early && chunked_head_decay_only(variant);
    if (!scores_first) {
      c("__syncthreads();");
      c("");
    }
    if (early && !scores_first) emit_update("tm", true);
    c("// 3b0. The step's intra-chunk scores P = mask(q~ k~^T)" +
      std::string(kgate == KeyGate::scalar ? " times the head gate from s to t" : "") +
      ", each 16 x 16 block on or");
    c("//     below the diagonal formed once, by one warp, into ps: the CG warps that share a row tile");
    c("//     read it there instead of each forming it.");
    c("LADLE_UNROLL_1 for (int blk = warp; blk < MT * MT; blk += WARPS) {  // one block at a time: unrolled, it spilled at K = 256");
    c.in();
    c("const int bi = blk / MT, bj = blk % MT;");
    c("if (bj > bi || bj < t0 / 16 || bi * 16 >= t1) continue;");
    c("float pacc[2][4] = {};");
    // At block_k 256 the fully unrolled products spilled (4 to 84 bytes) beside the state.
    c(std::string(tile.block_k > 128 ? "LADLE_UNROLL_4" : "LADLE_UNROLL") + " for (int kt = 0; kt < BK / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4], bfrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, qs_at + 2u * ((bi * 16 + lane % 16) * QLD + kt * 16 + (lane / 16) * 8));");
    c("ladle_ldmatrix_x4_at(bfrag, ks_at + 2u * ((bj * 16 + lane % 8 + (lane / 16) * 8) * QLD + kt * 16 + ((lane / 8) & 1) * 8));");
    c("ladle_mma_bf16(pacc[0], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(pacc[1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int nt = 0; nt < 2; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int t = bi * 16 + gid + 8 * half, s = bj * 16 + nt * 8 + tig * 2;");
    if (before_read) {
      // Strictly causal (s < t), the head gate from t - 1; the bonus read on the diagonal.
      const std::string head0 = kgate == KeyGate::scalar ? " * ladle_exp2(hg[t - 1] - hg[s])" : "";
      const std::string head1 = kgate == KeyGate::scalar ? " * ladle_exp2(hg[t - 1] - hg[s + 1])" : "";
      const auto diagonal = [&](const std::string& col) {
        return bonus ? "(" + col + " == t && t >= t0 && t < t1 ? bq[t] : 0.0f)" : std::string("0.0f");
      };
      c("    const float p0 = s >= t0 && s < t && t < t1 ? pacc[nt][2 * half]" + head0 + " : " + diagonal("s") + ";");
      c("    const float p1 = s + 1 >= t0 && s + 1 < t && t < t1 ? pacc[nt][2 * half + 1]" + head1 + " : " + diagonal("s + 1") + ";");
    } else if (kgate == KeyGate::scalar) {
      c("    const float p0 = s >= t0 && s <= t && t < t1 ? pacc[nt][2 * half] * ladle_exp2(hg[t] - hg[s]) : 0.0f;");
      c("    const float p1 = s + 1 >= t0 && s + 1 <= t && t < t1 ? pacc[nt][2 * half + 1] * ladle_exp2(hg[t] - hg[s + 1]) : 0.0f;");
    } else {
      c("    const float p0 = s >= t0 && s <= t && t < t1 ? pacc[nt][2 * half] : 0.0f;");
      c("    const float p1 = s + 1 >= t0 && s + 1 <= t && t < t1 ? pacc[nt][2 * half + 1] : 0.0f;");
    }
    c("    *reinterpret_cast<unsigned*>(&ps[t * PLD + s]) = ladle_pack_bf16(p0, p1);");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    c("");
    if (scores_first) emit_update("tm", true);
    c("// 3b. o for rows t0..t1: each warp one 16-row tile and OCOLS columns.");
    c("{");
    c.in();
    c("const int mi = warp % MT, cg = warp / MT, row0 = mi * 16;");
    c("if (warp < MT * CG && row0 < t1 && row0 + 16 > t0) {");
    c.in();
    c("float acc[OCOLS / 8][4];");
    c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;");
    c("// The inter-chunk read: q~ [16 x BK] * st [BK x OCOLS].");
    c("LADLE_UNROLL for (int kt = 0; kt < BK / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, qs_at + 2u * ((row0 + lane % 16) * QLD + kt * 16 + (lane / 16) * 8));");
    c("LADLE_UNROLL for (int np = 0; np < OCOLS / 16; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, st_at + 2u * ((kt * 16 + lane % 16) * VLD + cg * OCOLS + np * 16 + (lane / 16) * 8));");
    c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    if (kgate == KeyGate::scalar) {
      c("{  // the head gate from the step's start to each row");
      c.in();
      c("const float g_start = " + before("hg[t0 - 1]") + ";");
      c("const int ra = row0 + gid < C - 1 ? row0 + gid : C - 1, rb = row0 + gid + 8 < C - 1 ? row0 + gid + 8 : C - 1;");
      if (before_read)  // the gates up to t - 1: none for the step's first row
        c("const float fa = ladle_exp2((ra > t0 ? hg[ra - 1] : g_start) - g_start), fb = ladle_exp2((rb > t0 ? hg[rb - 1] : g_start) - g_start);");
      else
        c("const float fa = ladle_exp2(hg[ra] - g_start), fb = ladle_exp2(hg[rb] - g_start);");
      c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) acc[nt][0] *= fa, acc[nt][1] *= fa, acc[nt][2] *= fb, acc[nt][3] *= fb;");
      c.out();
      c("}");
    }
    c("// The intra-chunk attention for these rows: P (ps) times v~ [16 x OCOLS].");
    c("LADLE_UNROLL for (int j = 0; j < MT; ++j) {");
    c.in();
    c("if (j < t0 / 16 || j > mi) continue;");
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, ps_at + 2u * ((row0 + lane % 16) * PLD + j * 16 + (lane / 16) * 8));");
    c("LADLE_UNROLL for (int np = 0; np < OCOLS / 16; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, vs_at + 2u * (" + vs_index("(j * 16 + lane % 16)", "(cg * OCOLS + np * 16 + (lane / 16) * 8)") + "));");
    c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    c("// Store the rows of the step" + std::string(vgate ? ", with the value gate from tm to t" : "") +
      ": two adjacent columns per store where o's columns are contiguous (one row offset per row).");
    c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c.in();
    c("const int t = row0 + gid + 8 * half;");
    c("if (t < t0 || t >= t1) continue;");
    c("const long long tt = REVERSE ? eos - 1 - (base + t) : bos + base + t;");
    c("auto* const o_row = o + b * o_stride_b + tt * o_stride_t + h * o_stride_h;");
    c("const float row_scale = " + std::string(scale_per_token ? "token_scale[t]" : "read_scale") + ";");
    c("LADLE_UNROLL for (int nt = 0; nt < OCOLS / 8; ++nt) {");
    c.in();
    c("const int col = cg * OCOLS + nt * 8 + tig * 2;");
    c("if (v0 + col >= V) continue;");
    std::string x0 = "acc[nt][2 * half] * row_scale", x1 = "acc[nt][2 * half + 1] * row_scale";
    if (vgate) {
      x0 += " * ladle_exp2(" + vg_at("t", "col") + " - " + vg_at("tm", "col") + ")";
      x1 += " * ladle_exp2(" + vg_at("t", "col + 1") + " - " + vg_at("tm", "col + 1") + ")";
    }
    c("const float x0 = " + x0 + ", x1 = " + x1 + ";");
    c("if (o_stride_d == 1) {");
    c("  ladle_store2(o_row + v0 + col, x0, x1, v0 + col + 1 < V);");
    c("} else {");
    c("  ladle_store(o_row + (v0 + col) * o_stride_d, x0);");
    c("  if (v0 + col + 1 < V) ladle_store(o_row + (v0 + col + 1) * o_stride_d, x1);");
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    if (outputs) {
      c("if (t1 < valid) {  // the state is needed past this step only inside a chunk split into steps");
      c.in();
      emit_update("tm", false);
      c.out();
      c("}");
    } else if (!early) {
      emit_update("tm", false);
    } else if (wgmma) {
      c("// The update issued before the output is complete before the next step or chunk.");
      emit_update_wait();
    }
    c("t0 = t1;");
    c.out();
    c("}");
  }
  c("__syncthreads();  // the next chunk overwrites the staged rows");
  c.out();
  c("}");
  if (spec.final_state && !outputs) {
    c("");
    if (segmented) c("if (seg[6] != 0) {  // the sequence's last segment");
    for_state([&] {
      // n * H + h is the grid's (sequence, head) index outside the segmented form (blockIdx.z in the state
      // pass, blockIdx.y in the serial form): read again here, so that n and h need not live across the
      // chunk loop (at 64-token chunks on wgmma that spilled 4 bytes).
      const std::string pair = states ? "blockIdx.z" : "blockIdx.y";
      c("if (key0 + kk < K && v0 + col < V) final_state[" +
        (segmented ? state_at(sequence_index) : "(static_cast<long long>(" + pair + ") * K + key0 + kk) * V + v0 + col") +
        "] = sacc[m][nt][r];");
    });
    if (segmented) c("}");
  }
  if (segmented && states) {
    c("");
    c("// The segment's own final state and total log2 decay, for the segments after it.");
    for_state([&] { c("if (key0 + kk < K && v0 + col < V) segment_states[" + state_at("static_cast<long long>(n)") + "] = sacc[m][nt][r];"); });
    if (!gate_columns.empty()) {
      const std::string key_columns = kgate == KeyGate::vector ? "BK" : kgate == KeyGate::scalar ? "1" : "0";
      c("LADLE_UNROLL for (int gi = 0; gi < (GCOLS + THREADS - 1) / THREADS; ++gi) {");
      c.in();
      c("const int col = threadIdx.x + gi * THREADS;");
      c("float* const dn = segment_decay + (static_cast<long long>(n) * H + h) * DL;");
      c("if (col < " + key_columns + ") {  // the key side: written by the blocks of the first value tile");
      c.in();
      if (kgate == KeyGate::vector) c("if (blockIdx.x == 0 && key0 + col < K) dn[key0 + col] = segment_log[gi];");
      else if (kgate == KeyGate::scalar) c("if (blockIdx.x == 0 && blockIdx.y == 0) dn[0] = segment_log[gi];");
      c.out();
      c("} else if (col < GCOLS) {  // the value side: by the blocks of the first key tile");
      c.in();
      if (vgate) c("if (blockIdx.y == 0 && v0 + col - " + key_columns + " < V) dn[" + key_width + " + v0 + col - " + key_columns + "] = segment_log[gi];");
      c.out();
      c("}");
      c.out();
      c("}");
    }
  }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace ladle::cuda
