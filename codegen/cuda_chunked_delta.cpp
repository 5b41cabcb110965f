#include "cuda_chunked_delta.h"

#include <algorithm>

#include <ladle/runtime/error.h>

#include "detail/chunked_delta_emitter.h"
#include "detail/cuda_source.h"
#include "render_c.h"

namespace ladle::cuda {

using namespace detail;

std::string chunked_delta_unsupported(const ir::Variant& variant, std::int64_t key_dim, std::int64_t value_dim) {
  if (variant.update != ir::Update::delta) return "the chunked delta kernels run the delta rule only";
  if (key_dim > 128) return "K = " + std::to_string(key_dim) + ", expected at most 128 for the chunked delta rule";
  if (value_dim > 256) return "V = " + std::to_string(value_dim) + ", expected at most 256 for the chunked delta rule";
  return {};
}

ChunkedDeltaSpec chunked_delta_spec(const KernelTypes& types, std::int64_t key_dim, std::int64_t value_dim, ChunkedDeltaPhase phase) {
  ChunkedDeltaSpec spec;
  static_cast<KernelTypes&>(spec) = types;
  spec.block_k = key_dim <= 64 ? 64 : 128;
  spec.value_pad = static_cast<int>(std::max<std::int64_t>(64, (value_dim + 63) / 64 * 64));
  spec.phase = phase;
  return spec;
}

std::int64_t chunked_delta_w_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads) {
  return chunks * heads * chunked_delta_chunk * spec.block_k;
}
std::int64_t chunked_delta_u_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads) {
  return chunks * heads * chunked_delta_chunk * spec.value_pad;
}
std::int64_t chunked_delta_h_elements(const ChunkedDeltaSpec& spec, std::int64_t chunks, std::int64_t heads) {
  return chunks * heads * spec.block_k * spec.value_pad;
}

namespace detail {
namespace {

// The kernels' own names (an input called like one of them is renamed).
const std::set<std::string> template_names = {
    "C", "BK", "VPAD", "KLD", "VLD", "ALD", "TLD", "SLD", "warp", "lane", "tid", "gc", "gc0", "cps", "length", "chunks", "chunk",
    "p", "e", "x", "nt", "np", "kt", "acc", "afrag", "bfrag", "smem", "ks", "kb", "vs", "af", "ts", "gs", "betas", "gam", "msum", "a4", "t4", "sv", "a", "pass", "G", "hs0", "es0", "vh", "ov", "vraw", "a_s", "b_s", "tsrc_s", "src_s", "kbuf_s", "ub_s", "es_s", "dec", "u2", "row_decay", "qraw", "LOG2E", "total",
    "qs", "ws", "us", "es", "ets", "ps", "ss", "qscale", "S", "col", "row", "val", "ssum", "inv", "decay", "base", "g_p",
    "beta_p", "live", "use", "vb", "lo", "hi", "mid", "N", "work_w", "work_u", "work_gamma", "chunk_offsets", "tok", "jj",
    "work_k", "work_e", "work_h", "cq", "sum", "d", "col", "kbits", "wb", "kbuf", "ub", "gb", "fetch", "buf", "r0", "c0", "last", "hs",
    "tf", "e0", "e1", "d0", "d1", "half", "raw", "f0", "grp", "m", "s", "r", "i", "j", "step", "t", "src", "ld", "w_part", "col0",
    "PVLD", "pfrag", "off", "REVERSE", "bos", "eos", "n", "h", "b", "o", "q_row", "pair", "tsu", "tsw", "tsrc", "wfac", "t0", "t1", "use_group", "other", "factor", "out"};

}  // namespace

ChunkedDeltaEmitter::ChunkedDeltaEmitter(const ir::Variant& variant_in, const ChunkedDeltaSpec& spec_in)
    : variant(variant_in),
      spec(spec_in),
      prepare(spec_in.phase == ChunkedDeltaPhase::prepare),
      states(spec_in.phase == ChunkedDeltaPhase::states),
      BK(spec_in.block_k),
      id(identifiers(variant_in, template_names)),
      inputs(variant_in.inputs),
      use_of(input_use(variant_in)),
      groups(!prepare && !states && spec_in.value_pad >= 128 ? 2 : 1),
      KLD(BK + 8),
      PVLD(spec_in.value_pad + 8) {}

void ChunkedDeltaEmitter::extra(const std::string& c_type, const std::string& name, KernelParam::Type type, KernelParam::Role role) {
  declarations.push_back(c_type + " " + name);
  kernel.params.push_back({name, c_type, type, role});
}

void ChunkedDeltaEmitter::declare_parameters() {
  declare_params(variant, id, spec, declarations, kernel.params);
  extra("int", "N", KernelParam::Type::i32, KernelParam::Role::sequences);
  if (spec.varlen) extra("const long long*", "chunk_offsets", KernelParam::Type::pointer, KernelParam::Role::chunk_offsets);
  const std::string writes = prepare ? "" : "const ";
  extra(writes + "unsigned short*", "work_w", KernelParam::Type::pointer, KernelParam::Role::delta_w);
  extra(writes + "unsigned short*", "work_u", KernelParam::Type::pointer, KernelParam::Role::delta_u);
  extra(writes + "unsigned short*", "work_k", KernelParam::Type::pointer, KernelParam::Role::delta_k);
  extra(writes + "float*", "work_gamma", KernelParam::Type::pointer, KernelParam::Role::delta_gamma);
  extra(std::string(states ? "" : "const ") + "unsigned short*", "work_e", KernelParam::Type::pointer, KernelParam::Role::delta_e);
  extra(std::string(states ? "" : "const ") + "unsigned short*", "work_h", KernelParam::Type::pointer, KernelParam::Role::delta_h);
}

int ChunkedDeltaEmitter::shared_bytes() const {
  if (prepare)
    return 2 * (C * KLD + 2 * C * TLD) + std::max(4 * 2 * C * ALD, 2 * C * PVLD) + 4 * 4 * C;
  if (states) return 2 * (2 * (2 * C * KLD + C * VLD) + BK * VLD) + 4 * 2 * C;
  return 2 * (2 * C * KLD + groups * (BK * VLD + C * VLD)) + 4 * 2 * C;
}

std::string ChunkedDeltaEmitter::header(const char* phase_name) const {
  std::string header = std::string("ladle: chunked delta rule, ") + phase_name + " kernel " + kernel.name +
                       "\nGenerated by codegen/cuda_chunked_delta.cpp; do not edit.\n\n" + ir::to_string(variant) +
                       "\nchunk C = " + std::to_string(C) + ", block_k = " + std::to_string(BK) + ", value_pad = " +
                       std::to_string(spec.value_pad) + ", " + std::to_string(kernel.threads) + " threads, " +
                       std::to_string(kernel.shared_bytes) + " bytes of dynamic shared memory\n";
  header += prepare ? "launch: grid (chunks over all sequences, H), block (128)\n"
                      "per chunk: gamma, A = strictly lower beta_t exp(gamma_t - gamma_s) k_t . k_s, T = (I + A)^-1 (16 x 16\n"
                      "blocks: their inverses by substitution, then the blocks below), W = T (beta exp(gamma) K), U = T (beta V);\n"
                      "into the work arrays with k (normalised) and gamma\n"
            : states ? "launch: grid (ceil(V / 64), N * H), block (256)\n"
                       "per chunk, in order (the next chunk's W, U, k in flight): h = S_0 and E = U - W S_0 into the work arrays,\n"
                       "S = exp(gamma_last) S_0 + K^T (exp(gamma_last - gamma) E)\n"
                     : "launch: grid (chunks over all sequences, H, ceil(V / " + std::to_string(kernel.block_v) + ")), block (" +
                           std::to_string(kernel.threads) + ")\n"
                       "per chunk: o = scale (exp(gamma) q h + tril(q k^T exp(gamma_t - gamma_s)) E)\n";
  header += "types: " + types_line(variant, id, spec) + "\n";
  header += std::string("loads: ") + (spec.vector_loads ? "q, k, v by 16 bytes (8 features)" : "element by element") + "\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") +
            " initial_state=" + (spec.initial_state ? "1" : "0") + " final_state=" + (spec.final_state ? "1" : "0") + "\n";
  return header;
}

void ChunkedDeltaEmitter::constants() {
  c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", VPAD = " + std::to_string(spec.value_pad) + ";");
  c("constexpr int KLD = " + std::to_string(KLD) + ", VLD = " + std::to_string(VLD) + ", ALD = " + std::to_string(ALD) +
    ", TLD = " + std::to_string(TLD) + ", PVLD = " + std::to_string(PVLD) + ";");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("constexpr float LOG2E = 1.4426950408889634f;  // exp(x) = 2^(x log2 e), on the special function unit");
  c("const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;");
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("");
}

// The block's sequence and chunk(s), the inputs' heads.
void ChunkedDeltaEmitter::sequence_and_chunk() {
  c("const long long cps = (T + C - 1) / C;  // chunks of a batch row (fixed-length sequences)");
  if (!states) {
    c("const long long gc = blockIdx.x;  // this block's chunk over all sequences");
    c("const int h = blockIdx.y;");
    if (!prepare) c("const int vb = blockIdx.z * " + std::to_string(groups) + " + warp / 4;  // this warp's 64 value columns");
    if (spec.varlen) {
      c("int lo = 0, hi = N;  // the sequence whose chunks hold gc: chunk_offsets[lo] <= gc < chunk_offsets[lo + 1]");
      c("while (hi - lo > 1) { const int mid = (lo + hi) / 2; if (chunk_offsets[mid] <= gc) lo = mid; else hi = mid; }");
      c("const int n = lo, b = 0;");
      c("const long long chunk = gc - chunk_offsets[n], bos = cu_seqlens[n], eos = cu_seqlens[n + 1];");
    } else {
      c("const int n = static_cast<int>(gc / cps), b = n;");
      c("const long long chunk = gc % cps, bos = 0, eos = T;");
    }
  } else {
    c("const int vb = blockIdx.x;  // this block's 64 value columns");
    c("const int n = blockIdx.y / H, h = blockIdx.y % H;");
    if (spec.varlen) {
      c("const int b = 0;");
      c("const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1], gc0 = chunk_offsets[n];");
    } else {
      c("const int b = n;");
      c("const long long bos = 0, eos = T, gc0 = static_cast<long long>(n) * cps;");
    }
  }
  c("const long long length = eos - bos;");
  c("(void)N; (void)cps; (void)B;");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!use_of.used[k] || inputs[k].kind == ir::InputKind::scalar) continue;
    c("const int " + id[k] + "_head = h * " + id[k] + "_heads / H;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of.used[k] && inputs[k].kind == ir::InputKind::head)
      c("const float " + id[k] + "_value = ladle_load(" + id[k] + " + b * " + id[k] + "_stride_b + " + id[k] + "_head * " + id[k] +
        "_stride_h);");
  c("");
}

// Stages a tile of C rows (tokens) x `width` features of a slot's expression as bf16 into `tile`:
// groups of 8 features a thread, every group of the tile in flight at once (the loop is unrolled).
// With spec.vector_loads the role input (q, k or v) comes as one 16-byte load a group; any other
// input the expression reads is loaded element by element.
// With `normalize` (the variant's L2 normalisation of q and k) each row is divided by sqrt(sum of
// squares + eps) in fp32 before it is rounded: a row's groups sit on adjacent lanes, so their sums
// meet by shuffles, every row of the unrolled loop in flight at once.
void ChunkedDeltaEmitter::stage_tile(ir::Slot slot, const std::string& tile, const std::string& ld, const std::string& width,
                              const std::string& limit, const std::string& suffix, ir::Role role, bool normalize,
                              const std::string& prefetched) {
  const std::string threads = std::to_string(kernel.threads);
  // Element by element, eight loads a group already: two groups in flight (one at 256 threads, with
  // 128 registers a thread) keep ptxas from spilling.
  const char* unroll = spec.vector_loads ? "LADLE_UNROLL" : kernel.threads == 256 ? "LADLE_UNROLL_1" : "LADLE_UNROLL_2";
  c(std::string(unroll) + " for (int m = 0; m < C * (" + width + ") / 8 / " + threads + "; ++m) {");
  c.in();
  c("const int grp = tid + m * " + threads + ";");
  c("const int p = grp / ((" + width + ") / 8), f0 = grp % ((" + width + ") / 8) * 8;");
  c("const long long step = chunk * C + p;");
  c("const bool live = step < length;");
  c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
  token_rows(c, variant, id, use_of.used, true);
  const std::size_t own = [&] {
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (inputs[k].role == role) return k;
    return inputs.size();
  }();
  const bool value_side = role == ir::Role::value;
  if (spec.vector_loads) {
    c("float raw[8];");
    const std::string unpack = "ladle_unpack8_" + std::string(spec.input_types[own] == DType::bf16 ? "bf16" : "f16");
    if (!prefetched.empty())
      c(unpack + "(raw, " + prefetched + "[m]);");
    else
      c(unpack + "(raw, live && f0 < " + limit + " ? ladle_ld16(" + id[own] + " + " + id[own] + "_row + f0) : ladle_u4{0u, 0u, 0u, 0u});");
  }
  c("float x[8];");
  c("LADLE_UNROLL for (int e = 0; e < 8; ++e) {");
  c.in();
  const std::string index = suffix == "_i" ? "i" : "j";
  c("const int " + index + " = f0 + e;");
  if (spec.vector_loads)
    c("const bool use = live && f0 < " + limit + ";  // K and V are multiples of 8: the group is in or out");
  else
    c("const bool use = live && " + index + " < " + limit + ";");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const bool side = value_side ? use_of.value_side[k] : use_of.key_side[k];
    const bool over_features = inputs[k].kind == (value_side ? ir::InputKind::token_value : ir::InputKind::token_key);
    if (!side || !over_features) continue;
    if (k == own && spec.vector_loads)
      c("const float " + id[k] + suffix + " = raw[e];");
    else
      c("const float " + id[k] + suffix + " = use ? " + row_load(k, index) + " : 0.0f;");
  }
  c("x[e] = use ? " + render(slot, suffix) + " : 0.0f;");
  c.out();
  c("}");
  if (normalize) {
    c("float ssum = 0.0f;");
    c("LADLE_UNROLL for (int e = 0; e < 8; ++e) ssum += x[e] * x[e];");
    c("LADLE_UNROLL for (int off = (" + width + ") / 16; off > 0; off >>= 1) ssum += __shfl_xor_sync(0xffffffffu, ssum, off);");
    c("const float inv = rsqrtf(ssum + " + ir::render_c_literal(ir::l2_normalize_eps) + ");");
    c("LADLE_UNROLL for (int e = 0; e < 8; ++e) x[e] *= inv;");
  }
  c("ladle_st16(&" + tile + "[p * " + ld + " + f0], ladle_u4{ladle_pack_bf16(x[0], x[1]), ladle_pack_bf16(x[2], x[3]), "
    "ladle_pack_bf16(x[4], x[5]), ladle_pack_bf16(x[6], x[7])});");
  c.out();
  c("}");
}

// The token of chunk row p of chunk `chunk_expr` and its per-token locals.
void ChunkedDeltaEmitter::token_of_row(const std::string& chunk_expr) {
  c("const long long step = (" + chunk_expr + ") * C + p;");
  c("const bool live = step < length;");
  c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
  token_rows(c, variant, id, use_of.used, true);
}

// The raw 16-byte groups of the role input's rows into registers, as stage_tile maps them (group tid
// + m * threads), for stage_tile's `prefetched`: the loads are in flight while other work issues.
void ChunkedDeltaEmitter::prefetch_rows(ir::Role role, const std::string& name, const std::string& width, const std::string& limit) {
  std::size_t own = inputs.size();
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].role == role) own = k;
  const std::string threads = std::to_string(kernel.threads);
  c("ladle_u4 " + name + "[C * " + width + " / 8 / " + threads + "];");
  c("LADLE_UNROLL for (int m = 0; m < C * " + width + " / 8 / " + threads + "; ++m) {");
  c.in();
  c("const int grp = tid + m * " + threads + ";");
  c("const int p = grp / (" + width + " / 8), f0 = grp % (" + width + " / 8) * 8;");
  token_of_row("chunk");
  c(name + "[m] = live && f0 < " + limit + " ? ladle_ld16(" + id[own] + " + " + id[own] + "_row + f0) : ladle_u4{0u, 0u, 0u, 0u};");
  c.out();
  c("}");
}

// A-operand fragment (16 x 16, row-major tile) and B-operand fragments (two n-tiles of 8).
void ChunkedDeltaEmitter::mma_rows(const std::string& acc, const std::string& a_tile, const std::string& a_ld, const std::string& a_row0,
                            const std::string& b_tile, const std::string& b_ld, bool b_trans, const std::string& ksteps,
                            const std::string& ntiles, const std::string& b_col0) {
  // Shared-memory addresses as 32-bit byte offsets from each tile's base, converted once: the
  // unrolled steps' offsets fold into the ldmatrix instructions' immediates.
  c("{");
  c.in();
  c("const unsigned a_s = ladle_shared_address(" + a_tile + "), b_s = ladle_shared_address(" + b_tile + ");");
  c("LADLE_UNROLL for (int kt = 0; kt < " + ksteps + "; ++kt) {");
  c.in();
  c("unsigned afrag[4];");
  c("ladle_ldmatrix_x4_at(afrag, a_s + 2u * static_cast<unsigned>((" + a_row0 + " + lane % 16) * " + a_ld +
    " + kt * 16 + (lane / 16) * 8));");
  c("LADLE_UNROLL for (int np = 0; np < " + ntiles + " / 2; ++np) {");
  c.in();
  c("unsigned bfrag[4];");
  if (b_trans)
    c("ladle_ldmatrix_x4_trans_at(bfrag, b_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * " + b_ld + " + " + b_col0 +
      " + np * 16 + (lane / 16) * 8));");
  else
    c("ladle_ldmatrix_x4_at(bfrag, b_s + 2u * static_cast<unsigned>((np * 16 + lane % 8 + (lane / 16) * 8) * " + b_ld +
      " + kt * 16 + ((lane / 8) & 1) * 8));");
  c("ladle_mma_bf16(" + acc + "[2 * np], afrag, bfrag[0], bfrag[1]);");
  c("ladle_mma_bf16(" + acc + "[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
  c.out();
  c("}");
  c.out();
  c("}");
  c.out();
  c("}");
}

void ChunkedDeltaEmitter::zero(const std::string& acc, const std::string& ntiles) {
  c("float " + acc + "[" + ntiles + "][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < " + ntiles + "; ++nt) " + acc + "[nt][0] = " + acc + "[nt][1] = " + acc + "[nt][2] = " +
    acc + "[nt][3] = 0.0f;");
}

ChunkedDeltaKernel ChunkedDeltaEmitter::generate() {
  kernel.threads = states ? 256 : 128 * groups;
  kernel.blocks_per_sm = states || groups == 2 ? 2 : 3;
  kernel.block_v = 64 * groups;
  const char* phase_name = prepare ? "prepare" : states ? "states" : "outputs";
  const std::string spec_key = std::string(phase_name) + "|" + std::to_string(BK) + "|" +
                               std::to_string(spec.value_pad) + (spec.vector_loads ? "|vector" : "") + types_key(spec);
  kernel.name = std::string("ladle_delta_") + phase_name + "_" + hex(fnv1a(spec_key, ir::hash(variant)));
  declare_parameters();
  kernel.shared_bytes = shared_bytes();
  c(comment_block(header(phase_name)) + "\n" + storage_helpers + tensor_core_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kernel.threads) + ", " + std::to_string(kernel.blocks_per_sm) + ") " +
    kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  constants();
  sequence_and_chunk();
  if (prepare) {
    const bool prefetch_v = prepare_stage();
    prepare_gamma();
    prepare_a();
    prepare_inverse();
    prepare_w_u(prefetch_v);
  } else if (states) {
    states_tiles_and_state();
    states_fetch();
    states_chunks();
    if (spec.final_state) states_final();
  } else {
    outputs_loads();
    outputs_products();
  }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace detail

ChunkedDeltaKernel generate_chunked_delta(const ir::Variant& variant, const ChunkedDeltaSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked_delta: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (variant.update != ir::Update::delta) fail("the chunked delta kernels run the delta rule only (" + ir::form_name(variant) + ")");
  if (spec.block_k != 64 && spec.block_k != 128) fail("block_k = " + std::to_string(spec.block_k) + ", expected 64 or 128");
  if (spec.value_pad < 64 || spec.value_pad > 256 || spec.value_pad % 64 != 0)
    fail("value_pad = " + std::to_string(spec.value_pad) + ", expected a multiple of 64 up to 256");
  check_types("generate_chunked_delta", variant, spec);
  if (spec.vector_loads)
    for (std::size_t k = 0; k < variant.inputs.size(); ++k)
      if (variant.inputs[k].role != ir::Role::other && spec.input_types[k] != DType::bf16 && spec.input_types[k] != DType::f16)
        fail("vector_loads needs 16-bit q, k and v (" + variant.inputs[k].name + " is " + dtype_name(spec.input_types[k]) + ")");

  return ChunkedDeltaEmitter(variant, spec).generate();
}

}  // namespace ladle::cuda
