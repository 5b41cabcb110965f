#include "chunked_suffix.h"

#include <algorithm>

#include <ladle/runtime/error.h>

#include "cuda_source.h"

namespace ladle::cuda::detail {

namespace {

constexpr int suffix_warps = 8, suffix_threads = 32 * suffix_warps;


enum class Gate { none, scalar, vector };

Gate key_gate_of(const ir::Variant& variant) {
  if (variant.has(ir::Slot::log_decay_k)) return Gate::vector;
  return variant.has(ir::Slot::log_decay_head) ? Gate::scalar : Gate::none;
}

// The inputs a slot's expression reads.
std::vector<bool> reads(const ir::Variant& variant, ir::Slot slot) {
  std::vector<bool> out(variant.inputs.size(), false);
  if (!variant.has(slot)) return out;
  for (const ir::Node& node : variant.slots[static_cast<std::size_t>(slot)].nodes)
    if (node.op == ir::Op::input) out[static_cast<std::size_t>(node.input)] = true;
  return out;
}

bool sixteen_bit(DType t) { return t == DType::bf16 || t == DType::f16; }

int largest_split(int warps, int column_tiles) {
  int split = 1;
  while (split * 2 <= warps && column_tiles % (split * 2) == 0) split *= 2;
  return split;
}

}  // namespace

std::string suffix_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  if (spec.phase != ChunkedPhase::states || !spec.segmented) return "the suffix form is the segmented state pass";
  if (variant.has(ir::Slot::log_decay_v)) return "a value-side gate";
  const bool head_varies = variant.has(ir::Slot::log_decay_head) && ir::extent(variant, variant.slot(ir::Slot::log_decay_head)).token;
  if (key_gate_of(variant) == Gate::vector && head_varies) return "a per-token head gate beside a per-dimension key gate";
  if (spec.tile.block_k > 128 || spec.tile.block_v > 128) return "block_k or block_v past 128";
  const auto& inputs = variant.inputs;
  if (spec.input_types.size() != inputs.size()) return "input_types of the wrong length";
  for (const ir::Slot slot : {ir::Slot::k_feature, ir::Slot::log_decay_k}) {
    const std::vector<bool> r = reads(variant, slot);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (!r[k]) continue;
      if (inputs[k].kind == ir::InputKind::token_head) return "a per-token head input in the key features or key gate";
      if (inputs[k].kind == ir::InputKind::token_key && !sixteen_bit(spec.input_types[k])) return "an fp32 key-side input";
    }
  }
  const auto& v = variant.slots[static_cast<std::size_t>(ir::Slot::v)].nodes;
  if (v.size() != 1 || v[0].op != ir::Op::input) return "v is an expression, not an input as is";
  const auto vk = static_cast<std::size_t>(v[0].input);
  if (inputs[vk].kind != ir::InputKind::token_value || spec.input_types[vk] != DType::bf16) return "v is not a bf16 token input";
  return {};
}

namespace {

// What every part of the kernel reads, fixed before the first line is written.
struct SuffixContext {
  const ir::Variant& variant;
  const ChunkedKernelSpec& spec;
  const std::vector<ir::Input>& inputs;
  std::vector<std::string> id;
  Gate gate;
  bool has_head, head_varies;
  // 64-token chunks, or 32 where the tile says so: half the shared memory, two blocks per SM.
  int C, BK, BV, THREADS;
  int pairs, parts;  // key column pairs; each pair's tokens in parts, a thread each
  bool even_parts;   // every part C / P tokens: the token loops unrolled
  // The key-side token inputs the pass copies raw (those k_feature and the key gate read), and v.
  std::vector<bool> key_raw;
  std::size_t vk;
  // Inputs read per block (head parameters) or per token (a per-token head gate).
  std::vector<bool> head_used, token_head_used;
  // The state in mma accumulator layout, as the other state pass lays it out over 8 warps: row tiles,
  // per warp, warps per row tile, warps, columns per warp.
  int smt, s_wpm, s_mpw, s_warps, scols;
};

SuffixContext suffix_context(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::vector<std::string>& id) {
  const auto& inputs = variant.inputs;
  const int C = spec.tile.chunk >= 64 ? 64 : 32, BK = spec.tile.block_k, BV = spec.tile.block_v, THREADS = suffix_threads;
  const int pairs = BK / 2, parts = std::max(1, THREADS / pairs);
  std::vector<bool> key_raw(inputs.size(), false);
  for (const ir::Slot slot : {ir::Slot::k_feature, ir::Slot::log_decay_k}) {
    const std::vector<bool> r = reads(variant, slot);
    for (std::size_t k = 0; k < inputs.size(); ++k) key_raw[k] = key_raw[k] || (r[k] && inputs[k].kind == ir::InputKind::token_key);
  }
  std::vector<bool> head_used(inputs.size(), false), token_head_used(inputs.size(), false);
  for (const ir::Slot slot : {ir::Slot::k_feature, ir::Slot::log_decay_k, ir::Slot::log_decay_head}) {
    const std::vector<bool> r = reads(variant, slot);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      head_used[k] = head_used[k] || (r[k] && inputs[k].kind == ir::InputKind::head);
      token_head_used[k] = token_head_used[k] || (r[k] && inputs[k].kind == ir::InputKind::token_head);
    }
  }
  const int smt = BK / 16;
  int s_wpm = 1, s_mpw = 1, s_warps = suffix_warps;
  if (smt >= suffix_warps) {
    s_mpw = (smt + suffix_warps - 1) / suffix_warps;
  } else {
    s_wpm = largest_split(suffix_warps / smt, BV / 16);
    s_warps = smt * s_wpm;
  }
  const int scols = BV / s_wpm;
  const bool has_head = variant.has(ir::Slot::log_decay_head);
  return SuffixContext{.variant = variant,
                       .spec = spec,
                       .inputs = inputs,
                       .id = id,
                       .gate = key_gate_of(variant),
                       .has_head = has_head,
                       .head_varies = has_head && ir::extent(variant, variant.slot(ir::Slot::log_decay_head)).token,
                       .C = C,
                       .BK = BK,
                       .BV = BV,
                       .THREADS = THREADS,
                       .pairs = pairs,
                       .parts = parts,
                       .even_parts = C % parts == 0,
                       .key_raw = key_raw,
                       .vk = static_cast<std::size_t>(variant.slots[static_cast<std::size_t>(ir::Slot::v)].nodes[0].input),
                       .head_used = head_used,
                       .token_head_used = token_head_used,
                       .smt = smt,
                       .s_wpm = s_wpm,
                       .s_mpw = s_mpw,
                       .s_warps = s_warps,
                       .scols = scols};
}

// The kernel's name and launch shape, and its parameters: the recurrence's and a segment's tables
// (appended to `declarations` as C).
ChunkedKernel suffix_kernel(const SuffixContext& x, std::vector<std::string>& declarations) {
  const int BK = x.BK, BV = x.BV, C = x.C, THREADS = x.THREADS;
  ChunkedKernel kernel;
  kernel.name = "ladle_chunked_states_suffix_" +
                hex(fnv1a(std::to_string(BK) + "x" + std::to_string(BV) + "x" + std::to_string(C) + types_key(x.spec) + "|suffix", ir::hash(x.variant)));
  kernel.threads = static_cast<unsigned>(THREADS);
  kernel.block_v = BV;
  kernel.block_k = BK;
  kernel.phase = ChunkedPhase::states;

  declare_params(x.variant, x.id, x.spec, declarations, kernel.params);
  {
    using Type = KernelParam::Type;
    using Role = KernelParam::Role;
    const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role) {
      declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
      kernel.params.push_back({name, c_type, type, role, -1});
    };
    param("const long long*", "segments", Type::pointer, Role::segments);
    param("float*", "segment_states", Type::pointer, Role::segment_states);
    param("float*", "segment_decay", Type::pointer, Role::segment_decay);
  }
  return kernel;
}

// A buffer of shared memory.
struct Carve {
  std::string type, name, what;
  int bytes;
};

// Shared memory, in order: the raw rows of the key side's inputs and v (two chunks), k_up, the key
// gate's sums, the head gate's.
std::vector<Carve> suffix_carves(const SuffixContext& x) {
  const auto& inputs = x.inputs;
  const auto& id = x.id;
  const std::vector<bool>& key_raw = x.key_raw;
  const ChunkedKernelSpec& spec = x.spec;
  const int C = x.C, BK = x.BK, BV = x.BV, parts = x.parts;
  const Gate gate = x.gate;
  const bool head_varies = x.head_varies;
  std::vector<Carve> carves;
  const auto align16 = [](int bytes) { return (bytes + 15) / 16 * 16; };
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (key_raw[k])
      carves.push_back({storage_type(spec.input_types[k]), id[k] + "_raw", "[2][C][BK]: raw " + id[k] + " rows, two chunks",
                        align16(2 * C * BK * 2)});
  carves.push_back({"unsigned short", "v_raw", "[2][C][VLD] bf16: raw v rows (zero past the end), two chunks", align16(2 * C * (BV + 8) * 2)});
  carves.push_back({"unsigned short", "ks", "[C][QLD] bf16: k_up = k 2^(suffix)", align16(C * (BK + 8) * 2)});
  if (gate == Gate::vector) {
    carves.push_back({"float", "tot", "[P][BK]: each part's sum of them", align16(parts * BK * 4)});
    carves.push_back({"float", "ktot", "[BK]: the chunk's sums", align16(BK * 4)});
  }
  if (head_varies) {
    carves.push_back({"float", "hg", "[C]: log2 head gates", align16(C * 4)});
    carves.push_back({"float", "hs", "[C + 1]: their sums after each token, then the chunk's", align16((C + 1) * 4)});
  }
  return carves;
}

// The comment that opens the source.
std::string suffix_header(const SuffixContext& x, const ChunkedKernel& kernel) {
  const ir::Variant& variant = x.variant;
  const ChunkedKernelSpec& spec = x.spec;
  const int BK = x.BK, BV = x.BV, C = x.C, bytes = kernel.shared_bytes;
  const Gate gate = x.gate;
  std::string header = "ladle: chunked kernel " + kernel.name + "\nGenerated by codegen/cuda/detail/chunked_suffix.cpp; do not edit.\n\n";
  header += "The segmented form's first kernel in its suffix form: one segment (segments[n]) from a zero state, its own\n"
            "final state L = sum_t diag(2^(A_t)) k_t v_t^T (A_t: the log2 gates after t in the segment, so every\n"
            "factor is a decay) and its total log2 decay, to segment_states and segment_decay. Per 64-token chunk:\n"
            "the raw rows by cp.async one chunk ahead; the suffix sums within the chunk and k_up = k 2^(suffix) (bf16);\n"
            "S = diag(2^(chunk total)) S + k_up^T v on mma.sync m16n8k16, v read as copied.\n\n";
  header += ir::to_string(variant);
  header += "\nconfig: block_k=" + std::to_string(BK) + " block_v=" + std::to_string(BV) + " chunk=" + std::to_string(C) + " warps=8; requires K <= " +
            std::to_string(BK) + "\n";
  header += "launch: grid (ceil(V / " + std::to_string(BV) + "), 1, segments * H), block (256), dynamic shared memory " +
            std::to_string(bytes) + " bytes\n";
  header += "segments: [N][8] {b, first token, end token, sequence, index in it, row of its first earlier segment, last}\n";
  header += "types: " + types_line(variant, x.id, spec) + "; tensor-core operands bf16, accumulation fp32\n";
  header += std::string("gates: key side ") + (gate == Gate::vector ? "per dimension" : gate == Gate::scalar ? "per-token scalar" : "none") +
            "\nreverse=" + (spec.reverse ? "1" : "0") + "\n";
  return header;
}

// Writes the kernel's body into `c`, one method per part.
class SuffixEmitter : private SuffixContext {
 public:
  SuffixEmitter(const SuffixContext& context, Code& code) : SuffixContext(context), c(code) {}

  void constants() const {
    c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", BV = " + std::to_string(BV) + ", WARPS = 8, THREADS = 256;");
    c("constexpr int PAIRS = BK / 2, P = " + std::to_string(parts) + ";  // key column pairs; each pair's tokens in P parts, a thread each");
    c("constexpr int SMT = " + std::to_string(smt) + ", S_MPW = " + std::to_string(s_mpw) + ", S_WPM = " + std::to_string(s_wpm) +
      ", SCOLS = " + std::to_string(scols) + ", S_WARPS = " + std::to_string(s_warps) +
      ";  // the state: row tiles, per warp, warps per row tile, columns per warp, warps");
    c("constexpr int QLD = BK + 8, VLD = BV + 8;  // padded rows: conflict-free ldmatrix");
    c("constexpr float LOG2E = 1.4426950408889634f;");
    c("constexpr float GATE_FLOOR = -256.0f;  // log2 gates below it (-inf: a hard reset) count as it: 2^-256 = 0");
    c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
    c("(void)LOG2E; (void)GATE_FLOOR; (void)PAIRS; (void)P;");
  }

  // The buffers, the thread's and block's coordinates, the segment, each input's head and rows, S.
  void block_setup(const std::vector<Carve>& carves) const {
    c("LADLE_DYNAMIC_SHARED(smem);");
    int offset = 0;
    for (const Carve& carve : carves) {
      c(carve.type + "* const " + carve.name + " = reinterpret_cast<" + carve.type + "*>(smem + " + std::to_string(offset) + ");  // " +
        carve.what);
      offset += carve.bytes;
    }
    c("const unsigned ks_at = ladle_shared_address(ks), v_at = ladle_shared_address(v_raw);");
    c("const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;");
    c("const int gid = lane / 4, tig = lane % 4;  // mma fragment coordinates");
    c("const int v0 = blockIdx.x * BV;");
    c("constexpr int key0 = 0;");
    c("const int n = blockIdx.z / H, h = blockIdx.z % H;");
    c("// The block's segment: tokens [seg[1], seg[2]) of batch row seg[0].");
    c("const long long* const seg = segments + 8LL * n;");
    c("const int b = static_cast<int>(seg[0]);");
    c("const long long bos = seg[1], eos = seg[2];");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (key_raw[k] || k == vk || head_used[k] || token_head_used[k]) c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H;");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (head_used[k])
        c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
          "_stride_h);");
    if (has_head && !head_varies) c("const float head_log_decay = " + render(ir::Slot::log_decay_head, "") + ";");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (key_raw[k]) input_rows(k);
    input_rows(vk);
    c("");
    c("const int s_mt = S_WPM == 1 ? warp : warp / S_WPM, s_c0 = S_WPM == 1 ? 0 : (warp % S_WPM) * SCOLS;");
    c("float sacc[S_MPW][SCOLS / 8][4] = {};");
    const std::string key_width = gate == Gate::vector ? "K" : gate == Gate::scalar ? "1" : "0";
    c("const long long DL = " + key_width + ";  // segment_decay's row");
    c("(void)DL;");
    c("float segment_log[2] = {0.0f, 0.0f};  // the segment's log2 totals: this thread's column pair (part 0), or the head gate's");
    c("const long long length = eos - bos;");
  }

  // The copy of a chunk's raw rows (a lambda of the kernel), the first chunk's.
  void prefetch() const {
    c("// The raw rows of the chunk at `next` into buffer `stage`: cp.async where an item of 8 values lies");
    c("// inside a contiguous aligned row, else element copies; v's rows past the end are zeroed (their");
    c("// k_up is zero, and 0 * NaN is not).");
    c("const auto prefetch = [&](long long next, int stage) {");
    c.in();
    c("const int next_valid = static_cast<int>(length - next < C ? length - next : C);");
    bool any_key = false;
    for (std::size_t k = 0; k < inputs.size(); ++k) any_key = any_key || key_raw[k];
    if (any_key) {
      c("for (int e = threadIdx.x; e < C * (BK / 8); e += THREADS) {");
      c.in();
      c("const int row = e / (BK / 8), i0 = e % (BK / 8) * 8;");
      c("if (row >= next_valid) continue;");
      c("const long long t = REVERSE ? eos - 1 - (next + row) : bos + next + row;");
      c("const int count = K - i0;");
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (!key_raw[k]) continue;
        c("{");
        c.in();
        c("auto* const dst = &" + id[k] + "_raw[(stage * C + row) * BK + i0];");
        c("const auto* const p = " + id[k] + "_base + t * " + id[k] + "_stride_t + (count > 0 ? i0 * " + id[k] + "_stride_d : 0);");
        c("if (" + id[k] + "_vec && count >= 8) ladle_cp_async_16(dst, p);");
        c("else ladle_prefetch8(dst, p, " + id[k] + "_stride_d, count);");
        c.out();
        c("}");
      }
      c.out();
      c("}");
    }
    c("for (int e = threadIdx.x; e < C * (BV / 8); e += THREADS) {");
    c.in();
    c("const int row = e / (BV / 8), j0 = e % (BV / 8) * 8;");
    c("unsigned short* const dst = &v_raw[(stage * C + row) * VLD + j0];");
    c("const int count = V - (v0 + j0);");
    c("if (row >= next_valid || count <= 0) {");
    c("  ladle_st16(dst, ladle_u4{0u, 0u, 0u, 0u});");
    c("  continue;");
    c("}");
    c("const long long t = REVERSE ? eos - 1 - (next + row) : bos + next + row;");
    c("const ladle_bf16* const p = " + id[vk] + "_base + t * " + id[vk] + "_stride_t + (v0 + j0) * " + id[vk] + "_stride_d;");
    c("if (" + id[vk] + "_vec && count >= 8) ladle_cp_async_16(dst, p);");
    c("else ladle_prefetch8(reinterpret_cast<ladle_bf16*>(dst), p, " + id[vk] + "_stride_d, count);");
    c.out();
    c("}");
    c.out();
    c("};");
    c("if (length > 0) prefetch(0, 0);");
    c("ladle_cp_async_commit();");
    c("int stage = 0;");
  }

  // The loop over the chunks: the gates' sums, k_up, the update.
  void chunk_loop() const {
    c("for (long long base = 0; base < length; base += C, stage ^= 1) {");
    c.in();
    c("const int valid = static_cast<int>(length - base < C ? length - base : C);");
    c("ladle_cp_async_wait<0>();  // this chunk's rows");
    c("__syncthreads();           // ... visible to every thread, and every thread done with the other buffer");
    c("if (base + C < length) prefetch(base + C, stage ^ 1);");
    c("ladle_cp_async_commit();");
    c("");
    c("const int pair = threadIdx.x % PAIRS, part = threadIdx.x / PAIRS, col = 2 * pair;");
    c("const int lo = part * C / P, hi = (part + 1) * C / P;  // this thread's tokens");
    c("(void)lo; (void)hi; (void)col;");
    if (gate == Gate::vector) key_gate_sums();
    if (head_varies) head_gates();
    if (gate == Gate::vector || head_varies) c("__syncthreads();");
    if (head_varies) head_gate_sums();
    k_up();
    c("__syncthreads();");
    c("");
    update();
  }

  // The segment's own final state and total log2 decay.
  void stores() const {
    c("// The segment's own final state and total log2 decay, for the segments after it.");
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m)");
    c.in();
    c("if (warp < S_WARPS && s_mt + m * WARPS < SMT)");
    c.in();
    c("LADLE_UNROLL for (int nt = 0; nt < SCOLS / 8; ++nt)");
    c.in();
    c("LADLE_UNROLL for (int r = 0; r < 4; ++r) {");
    c.in();
    c("const int kk = (s_mt + m * WARPS) * 16 + gid + (r >= 2 ? 8 : 0), col = s_c0 + nt * 8 + tig * 2 + (r & 1);");
    c("if (key0 + kk < K && v0 + col < V) segment_states[((static_cast<long long>(n) * H + h) * K + key0 + kk) * V + v0 + col] = sacc[m][nt][r];");
    c.out();
    c("}");
    c.out();
    c.out();
    c.out();
    c("float* const dn = segment_decay + (static_cast<long long>(n) * H + h) * DL;");
    c("(void)dn;");
    if (gate == Gate::vector) {
      c("{  // the key side, by the blocks of the first value tile");
      c("  const int pair = threadIdx.x % PAIRS, part = threadIdx.x / PAIRS, col = 2 * pair;");
      c("  if (blockIdx.x == 0 && part == 0) {");
      c("    if (col < K) dn[col] = segment_log[0];");
      c("    if (col + 1 < K) dn[col + 1] = segment_log[1];");
      c("  }");
      c("}");
    }
    if (gate == Gate::scalar) c("if (blockIdx.x == 0 && threadIdx.x == 0) dn[0] = segment_log[0];");
  }

 private:
  std::string render(ir::Slot s, const std::string& suffix) const { return render_slot(variant, id, s, suffix); }

  // Per block: input k's rows of this batch row and head, and whether every row is contiguous and
  // 16-byte aligned (then an item inside the tensor is one cp.async).
  void input_rows(std::size_t k) const {
    c("const " + std::string(storage_type(spec.input_types[k])) + "* const " + id[k] + "_base = " + id[k] + " + b * " + id[k] +
      "_stride_b + " + id[k] + "_head * " + id[k] + "_stride_h;");
    c("const bool " + id[k] + "_vec = " + id[k] + "_stride_d == 1 && ((" + id[k] + "_stride_t | " + id[k] + "_stride_b | " + id[k] +
      "_stride_h) & 7) == 0 && (reinterpret_cast<unsigned long long>(" + id[k] + ") & 15ull) == 0;");
  }

  // The key-side values of token t, columns col and col + 1, from the raw buffers.
  void key_values(const std::string& t) const {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (key_raw[k]) {
        c("const float " + id[k] + "_i0 = ladle_load(&" + id[k] + "_raw[(stage * C + " + t + ") * BK + col]);");
        c("const float " + id[k] + "_i1 = ladle_load(&" + id[k] + "_raw[(stage * C + " + t + ") * BK + col + 1]);");
      }
  }

  // This thread's tokens, first to last (2a) and last to first (2c).
  void tokens(bool forward) const {
    if (even_parts) {
      c(forward ? "LADLE_UNROLL for (int u = 0; u < C / P; ++u) {" : "LADLE_UNROLL for (int u = C / P - 1; u >= 0; --u) {");
      c.in();
      c("const int t = lo + u;");
    } else {
      c(forward ? "for (int t = lo; t < hi; ++t) {" : "for (int t = hi - 1; t >= lo; --t) {");
      c.in();
    }
  }

  // The log2 key gates lg0, lg1 of token t, columns col and col + 1 (0 outside the chunk and K,
  // floored at GATE_FLOOR; NaN stays NaN), formed in 2a and again in 2c.
  void gates() const {
    std::string log_a0 = render(ir::Slot::log_decay_k, "_i0"), log_a1 = render(ir::Slot::log_decay_k, "_i1");
    if (has_head) log_a0 = "(" + log_a0 + ") + head_log_decay", log_a1 = "(" + log_a1 + ") + head_log_decay";
    c("float lg0 = LOG2E * (" + log_a0 + "), lg1 = LOG2E * (" + log_a1 + ");");
    c("lg0 = t < valid && col < K ? (lg0 < GATE_FLOOR ? GATE_FLOOR : lg0) : 0.0f;");
    c("lg1 = t < valid && col + 1 < K ? (lg1 < GATE_FLOOR ? GATE_FLOOR : lg1) : 0.0f;");
  }

  // 2a: the key gate's sums per part.
  void key_gate_sums() const {
    c("// 2a. The log2 key gates of this thread's tokens and column pair (0 outside the chunk and K;");
    c("//     floored at GATE_FLOOR), and their sums per part.");
    c("if (part < P) {");
    c.in();
    c("float sum0 = 0.0f, sum1 = 0.0f;");
    tokens(true);
    key_values("t");
    gates();
    c("sum0 += lg0, sum1 += lg1;");
    c.out();
    c("}");
    c("tot[part * BK + col] = sum0, tot[part * BK + col + 1] = sum1;");
    c.out();
    c("}");
  }

  // 2a: the head gate per token.
  void head_gates() const {
    c("// 2a. The log2 head gate of each token (0 past the end; floored at GATE_FLOOR).");
    c("for (int cpos = threadIdx.x; cpos < C; cpos += THREADS) {");
    c.in();
    c("const bool live = cpos < valid;");
    c("const long long t = live ? (REVERSE ? eos - 1 - (base + cpos) : bos + base + cpos) : bos;");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (token_head_used[k])
        c("const float " + id[k] + "_t = live ? ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + t * " + id[k] + "_stride_t + " +
          id[k] + "_head * " + id[k] + "_stride_h) : 0.0f;");
    c("const float lg = LOG2E * (" + render(ir::Slot::log_decay_head, "") + ");");
    c("hg[cpos] = live ? (lg < GATE_FLOOR ? GATE_FLOOR : lg) : 0.0f;");
    c.out();
    c("}");
  }

  // 2b: the head gate's sums after each token.
  void head_gate_sums() const {
    c("// 2b. The head gate's sums after each token, and the chunk's (hs[C]).");
    c("for (int cpos = threadIdx.x; cpos < C; cpos += THREADS) {");
    c.in();
    c("float s = 0.0f;");
    c("for (int u = C - 1; u > cpos; --u) s += hg[u];");
    c("hs[cpos] = s;");
    c("if (cpos == 0) hs[C] = s + hg[0];");
    c.out();
    c("}");
    c("__syncthreads();");
  }

  // 2c: k_up, and the chunk's sums into the segment's.
  void k_up() const {
    c("// 2c. k_up = k 2^(the log2 gates after t in the chunk), walking this thread's tokens from the last.");
    if (gate == Gate::scalar && !head_varies) {
      c("const float hlg = LOG2E * head_log_decay < GATE_FLOOR ? GATE_FLOOR : LOG2E * head_log_decay;  // per token");
    }
    c("if (part < P) {");
    c.in();
    if (gate == Gate::vector) {
      c("float s0 = 0.0f, s1 = 0.0f;  // the sums after this part");
      c("for (int later = P - 1; later > part; --later) s0 += tot[later * BK + col], s1 += tot[later * BK + col + 1];");
    }
    tokens(false);
    key_values("t");
    if (gate == Gate::vector) gates();
    c("const float x0 = " + render(ir::Slot::k_feature, "_i0") + ", x1 = " + render(ir::Slot::k_feature, "_i1") + ";");
    std::string f0 = "1.0f", f1 = "1.0f";
    if (gate == Gate::vector) f0 = "ladle_exp2(s0)", f1 = "ladle_exp2(s1)";
    if (gate == Gate::scalar) {
      c(std::string("const float f = ladle_exp2(") + (head_varies ? "hs[t]" : "static_cast<float>(valid - 1 - t) * hlg") + ");");
      f0 = f1 = "f";
    }
    c("const float ku0 = t < valid && col < K ? x0 * " + f0 + " : 0.0f;");
    c("const float ku1 = t < valid && col + 1 < K ? x1 * " + f1 + " : 0.0f;");
    c("*reinterpret_cast<unsigned*>(&ks[t * QLD + col]) = ladle_pack_bf16(ku0, ku1);");
    if (gate == Gate::vector) c("s0 += lg0, s1 += lg1;");
    c.out();
    c("}");
    if (gate == Gate::vector) {
      c("if (part == 0) {  // s0, s1: the chunk's sums");
      c("  ktot[col] = s0, ktot[col + 1] = s1;");
      c("  segment_log[0] += s0, segment_log[1] += s1;");
      c("}");
    }
    c.out();
    c("}");
    if (gate == Gate::scalar) {
      c(std::string("const float htot = ") + (head_varies ? "hs[C]" : "static_cast<float>(valid) * hlg") + ";");
      c("if (threadIdx.x == 0) segment_log[0] += htot;");
    }
  }

  // 3: S = diag(2^(chunk total)) S + k_up^T v, the chunk loop closed.
  void update() const {
    c("// 3. S = diag(2^(chunk total)) S + k_up^T v over the chunk's tokens.");
    if (gate != Gate::none) {
      c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m)");
      c.in();
      c("if (warp < S_WARPS && s_mt + m * WARPS < SMT)");
      c.in();
      c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
      c.in();
      c("const int kk = (s_mt + m * WARPS) * 16 + gid + 8 * half;");
      c(std::string("const float decay = ladle_exp2(") + (gate == Gate::vector ? "ktot[kk]" : "htot") + ");");
      c("(void)kk;");
      c("LADLE_UNROLL for (int nt = 0; nt < SCOLS / 8; ++nt) sacc[m][nt][2 * half] *= decay, sacc[m][nt][2 * half + 1] *= decay;");
      c.out();
      c("}");
      c.out();
      c.out();
    }
    c("LADLE_UNROLL for (int m = 0; m < S_MPW; ++m) {");
    c.in();
    c("if (warp >= S_WARPS || s_mt + m * WARPS >= SMT) continue;");
    c("const int k0 = (s_mt + m * WARPS) * 16;");
    c("for (int j = 0; j * 16 < valid; ++j) {  // rows past the end: k_up and v zero");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_trans_at(afrag, ks_at + 2u * ((j * 16 + lane % 8 + (lane / 16) * 8) * QLD + k0 + ((lane / 8) & 1) * 8));");
    c("LADLE_UNROLL for (int np = 0; np < SCOLS / 16; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, v_at + 2u * ((stage * C + j * 16 + lane % 16) * VLD + (s_c0 + np * 16 + (lane / 16) * 8)));");
    c("ladle_mma_bf16(sacc[m][2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(sacc[m][2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
  }

  Code& c;
};

}  // namespace

namespace {

// The kernel for these inputs' C names (with_input_names runs it twice).
ChunkedKernel generate_suffix_named(const ir::Variant& variant, const ChunkedKernelSpec& spec, const std::vector<std::string>& id) {
  const SuffixContext x = suffix_context(variant, spec, id);
  std::vector<std::string> declarations;
  ChunkedKernel kernel = suffix_kernel(x, declarations);
  const std::vector<Carve> carves = suffix_carves(x);
  int bytes = 0;
  for (const Carve& carve : carves) bytes += carve.bytes;
  kernel.shared_bytes = bytes;

  Code c;
  c(comment_block(suffix_header(x, kernel)) + "\n" + storage_helpers + tensor_core_helpers);
  // Two blocks per SM at 32-token chunks (ptxas held to 128 registers a thread).
  c("extern \"C\" __global__ void __launch_bounds__(256, " + std::string(x.C == 32 ? "2" : "1") + ") " + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  const SuffixEmitter e(x, c);
  e.constants();
  c("");
  e.block_setup(carves);
  c("");
  e.prefetch();
  e.chunk_loop();
  c("");
  e.stores();
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace

ChunkedKernel generate_suffix_states(const ir::Variant& variant, const ChunkedKernelSpec& spec) {
  if (const std::string why = suffix_states_unsupported(variant, spec); !why.empty())
    throw InvalidArgument("generate_chunked: suffix_states: the suffix state pass cannot take this spec: " + why);
  return with_input_names<ChunkedKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return generate_suffix_named(variant, spec, id); });
}

}  // namespace ladle::cuda::detail
