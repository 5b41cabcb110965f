#include "cuda_chunked_delta.h"

#include <algorithm>

#include <ladle/runtime/error.h>

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

  const bool prepare = spec.phase == ChunkedDeltaPhase::prepare, states = spec.phase == ChunkedDeltaPhase::states;
  const int C = chunked_delta_chunk, BK = spec.block_k;
  const std::vector<std::string> id = identifiers(variant, template_names);
  const auto& inputs = variant.inputs;
  const auto has = [&](ir::Slot s) { return variant.has(s); };
  const InputUse use_of = input_use(variant);
  const auto render = [&](ir::Slot s, const std::string& suffix) { return render_slot(variant, id, s, suffix); };
  const auto row_load = [&](std::size_t k, const std::string& index) { return detail::row_load(id, k, index); };

  ChunkedDeltaKernel kernel;
  // The outputs kernel covers 128 value columns a block where V allows (eight warps: q and k staged
  // once for both halves), else 64 (four warps).
  const int groups = !prepare && !states && spec.value_pad >= 128 ? 2 : 1;
  kernel.threads = states ? 256 : 128 * groups;
  kernel.blocks_per_sm = states || groups == 2 ? 2 : 3;
  kernel.block_v = 64 * groups;
  const char* phase_name = prepare ? "prepare" : states ? "states" : "outputs";
  const std::string spec_key = std::string(phase_name) + "|" + std::to_string(BK) + "|" +
                               std::to_string(spec.value_pad) + (spec.vector_loads ? "|vector" : "") + types_key(spec);
  kernel.name = std::string("ladle_delta_") + phase_name + "_" + hex(fnv1a(spec_key, ir::hash(variant)));

  std::vector<std::string> declarations;
  declare_params(variant, id, spec, declarations, kernel.params);
  const auto extra = [&](const std::string& c_type, const std::string& name, KernelParam::Type type, KernelParam::Role role) {
    declarations.push_back(c_type + " " + name);
    kernel.params.push_back({name, c_type, type, role});
  };
  extra("int", "N", KernelParam::Type::i32, KernelParam::Role::sequences);
  if (spec.varlen) extra("const long long*", "chunk_offsets", KernelParam::Type::pointer, KernelParam::Role::chunk_offsets);
  const std::string writes = prepare ? "" : "const ";
  extra(writes + "unsigned short*", "work_w", KernelParam::Type::pointer, KernelParam::Role::delta_w);
  extra(writes + "unsigned short*", "work_u", KernelParam::Type::pointer, KernelParam::Role::delta_u);
  extra(writes + "unsigned short*", "work_k", KernelParam::Type::pointer, KernelParam::Role::delta_k);
  extra(writes + "float*", "work_gamma", KernelParam::Type::pointer, KernelParam::Role::delta_gamma);
  extra(std::string(states ? "" : "const ") + "unsigned short*", "work_e", KernelParam::Type::pointer, KernelParam::Role::delta_e);
  extra(std::string(states ? "" : "const ") + "unsigned short*", "work_h", KernelParam::Type::pointer, KernelParam::Role::delta_h);

  // Shared memory (bf16 tiles padded by 8 elements a row, so that ldmatrix's 8 rows hit 8 bank groups).
  const int KLD = BK + 8, VLD = 72, ALD = C + 4, TLD = C + 8, PVLD = spec.value_pad + 8;
  if (prepare)
    kernel.shared_bytes = 2 * (C * KLD + 2 * C * TLD) + std::max(4 * 2 * C * ALD, 2 * C * PVLD) + 4 * 4 * C;
  else if (states)
    kernel.shared_bytes = 2 * (2 * (2 * C * KLD + C * VLD) + BK * VLD) + 4 * 2 * C;
  else
    kernel.shared_bytes = 2 * (2 * C * KLD + groups * (BK * VLD + C * VLD)) + 4 * 2 * C;

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

  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kernel.threads) + ", " + std::to_string(kernel.blocks_per_sm) + ") " +
    kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", VPAD = " + std::to_string(spec.value_pad) + ";");
  c("constexpr int KLD = " + std::to_string(KLD) + ", VLD = " + std::to_string(VLD) + ", ALD = " + std::to_string(ALD) +
    ", TLD = " + std::to_string(TLD) + ", PVLD = " + std::to_string(PVLD) + ";");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("constexpr float LOG2E = 1.4426950408889634f;  // exp(x) = 2^(x log2 e), on the special function unit");
  c("const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;");
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("");

  // ---- The block's sequence and chunk(s)
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

  // Stages a tile of C rows (tokens) x `width` features of a slot's expression as bf16 into `tile`:
  // groups of 8 features a thread, every group of the tile in flight at once (the loop is unrolled).
  // With spec.vector_loads the role input (q, k or v) comes as one 16-byte load a group; any other
  // input the expression reads is loaded element by element.
  // With `normalize` (the variant's L2 normalisation of q and k) each row is divided by sqrt(sum of
  // squares + eps) in fp32 before it is rounded: a row's groups sit on adjacent lanes, so their sums
  // meet by shuffles, every row of the unrolled loop in flight at once.
  const auto stage_tile = [&](ir::Slot slot, const std::string& tile, const std::string& ld, const std::string& width,
                              const std::string& limit, const std::string& suffix, ir::Role role, bool normalize = false,
                              const std::string& prefetched = "") {
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
  };
  // The token of chunk row p of chunk `chunk_expr` and its per-token locals.
  const auto token_of_row = [&](const std::string& chunk_expr) {
    c("const long long step = (" + chunk_expr + ") * C + p;");
    c("const bool live = step < length;");
    c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
    token_rows(c, variant, id, use_of.used, true);
  };
  // The raw 16-byte groups of the role input's rows into registers, as stage_tile maps them (group tid
  // + m * threads), for stage_tile's `prefetched`: the loads are in flight while other work issues.
  const auto prefetch_rows = [&](ir::Role role, const std::string& name, const std::string& width, const std::string& limit) {
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
  };
  // A-operand fragment (16 x 16, row-major tile) and B-operand fragments (two n-tiles of 8).
  const auto mma_rows = [&](const std::string& acc, const std::string& a_tile, const std::string& a_ld, const std::string& a_row0,
                            const std::string& b_tile, const std::string& b_ld, bool b_trans, const std::string& ksteps,
                            const std::string& ntiles, const std::string& b_col0 = "0") {
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
  };
  const auto zero = [&](const std::string& acc, const std::string& ntiles) {
    c("float " + acc + "[" + ntiles + "][4];");
    c("LADLE_UNROLL for (int nt = 0; nt < " + ntiles + "; ++nt) " + acc + "[nt][0] = " + acc + "[nt][1] = " + acc + "[nt][2] = " +
      acc + "[nt][3] = 0.0f;");
  };
  const std::string g_expr = has(ir::Slot::log_decay_head) ? render(ir::Slot::log_decay_head, "") : std::string("0.0f");
  const std::string beta_expr = has(ir::Slot::write_strength) ? render(ir::Slot::write_strength, "") : std::string("1.0f");

  if (prepare) {
    c("// A and T in fp32 share their space with v, which is staged once T is solved (three blocks an SM).");
    c("unsigned short* ks = reinterpret_cast<unsigned short*>(smem);  // k (features, normalised), [C][KLD]");
    c("unsigned short* tsu = ks + C * KLD;                              // T diag(beta), [C][TLD]");
    c("unsigned short* ts = tsu + C * TLD;                              // T diag(beta exp(gamma)), [C][TLD]");
    c("float* af = reinterpret_cast<float*>(ts + C * TLD);              // A, [C][ALD]");
    c("float* tf = af + C * ALD;                                        // T in fp32, [C][ALD]");
    c("unsigned short* vs = reinterpret_cast<unsigned short*>(af);      // v, [C][PVLD], after the solve");
    c("float* gs = reinterpret_cast<float*>(smem + " + std::to_string(2 * (C * KLD + 2 * C * TLD) + std::max(4 * 2 * C * ALD, 2 * C * PVLD)) +
      ");  // g");
    c("float* gam = gs + C;");
    c("float* betas = gam + C;");
    c("float* wfac = betas + C;                                         // beta exp(gamma), W's column factors of T");
    c("");
    c("// 1. Stage the chunk: g and beta a thread a row; k and v, every load in flight at once.");
    c("if (tid < C) {");
    c.in();
    c("const int p = tid;");
    token_of_row("chunk");
    c("gs[p] = live ? " + g_expr + " : 0.0f;");
    c("betas[p] = live ? " + beta_expr + " : 0.0f;");
    c.out();
    c("}");
    stage_tile(ir::Slot::k_feature, "ks", "KLD", "BK", "K", "_i", ir::Role::key, variant.l2_normalize_qk);
    // v's raw rows are loaded now into registers (eight 16-byte groups a thread at V <= 128) and staged
    // once the solve is done: their latency passes behind the solve instead of after it.
    const bool prefetch_v = spec.vector_loads && spec.value_pad <= 128;
    if (prefetch_v) prefetch_rows(ir::Role::value, "vraw", "VPAD", "V");
    c("__syncthreads();");
    c("// 2. gamma_t = g_0 + ... + g_t (past the sequence's end g = 0: gamma stays); k normalised.");
    c("if (tid < C) {  // an inclusive scan by shuffles in each of warps 0 and 1, then warp 1 adds warp 0's total");
    c.in();
    c("float s = gs[tid];");
    c("LADLE_UNROLL for (int off = 1; off < 32; off <<= 1) {");
    c("  const float other = __shfl_up_sync(0xffffffffu, s, off);");
    c("  if (lane >= off) s += other;");
    c("}");
    c("if (tid >= 32) {  // warp 0's total, by shuffles over its 32 values");
    c("  float total = gs[lane];");
    c("  LADLE_UNROLL for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);");
    c("  s += total;");
    c("}");
    c("gam[tid] = s;");
    c("wfac[tid] = betas[tid] * expf(s);");
    c("work_gamma[(gc * H + h) * C + tid] = s;");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// k, normalised, for the states and outputs kernels: 16 bytes at a time.");
    c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / 128; ++m) {");
    c.in();
    c("const int e = tid + m * 128;");
    c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
    c("ladle_st16(&work_k[((gc * H + h) * C + p) * BK + i], ladle_ld16(&ks[p * KLD + i]));");
    c.out();
    c("}");
    c("// 3. A = beta_t exp(gamma_t - gamma_s) k_t . k_s below the diagonal (fp32); warp w: rows 16w..16w+15.");
    c("{");
    c.in();
    zero("acc", "8");
    mma_rows("acc", "ks", "KLD", "warp * 16", "ks", "KLD", false, "BK / 16", "8");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
    c("    const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = nt * 8 + (lane % 4) * 2 + (e & 1);");
    c("    af[row * ALD + col] = col < row ? betas[row] * ladle_exp2((gam[row] - gam[col]) * LOG2E) * acc[nt][e] : 0.0f;");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// 4. T = (I + A)^-1 in 16 x 16 blocks (fp32): the diagonal blocks' inverses by forward substitution,");
    c("//    one column a thread; then block row i = 1..3: T_ij = -T_ii (sum over j <= m < i of A_im T_mj).");
    c("if (tid < C) {");
    c.in();
    c("const int d = tid / 16 * 16, col = tid % 16;  // block d, column d + col");
    c("float x[16];");
    c("LADLE_UNROLL for (int r = 0; r < 16; ++r) {");
    c.in();
    c("float val = r == col ? 1.0f : 0.0f;");
    c("LADLE_UNROLL for (int s = 0; s < r; ++s) val -= af[(d + r) * ALD + d + s] * x[s];");
    c("x[r] = val;");
    c("tf[(d + r) * ALD + d + col] = val;");
    c.out();
    c("}");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// Block row i = 1..3: M_ij = sum over j <= m < i of A_im T_mj for every j < i, then T_ij = -T_ii M_ij;");
    c("// a thread four columns of one row of a block (i * 64 groups), 16-byte loads of T and M.");
    c("LADLE_UNROLL for (int i = 1; i < C / 16; ++i) {");
    c.in();
    c("float msum[2][4];");
    c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
    c.in();
    c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
    c("msum[pass][0] = msum[pass][1] = msum[pass][2] = msum[pass][3] = 0.0f;");
    c("if (grp < i * 64)");
    c("  for (int m = j * 16; m < i * 16; ++m) {");
    c("    const float a = af[(i * 16 + r) * ALD + m];");
    c("    const ladle_f4 t4 = ladle_ld4(&tf[m * ALD + j * 16 + cq]);");
    c("    msum[pass][0] += a * t4.x, msum[pass][1] += a * t4.y, msum[pass][2] += a * t4.z, msum[pass][3] += a * t4.w;");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();  // A's block row i is read for the last time: M_ij takes A_ij's place");
    c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
    c.in();
    c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
    c("if (grp < i * 64) ladle_st4(&af[(i * 16 + r) * ALD + j * 16 + cq], ladle_f4{msum[pass][0], msum[pass][1], msum[pass][2], msum[pass][3]});");
    c.out();
    c("}");
    c("__syncthreads();");
    c("LADLE_UNROLL for (int pass = 0; pass < 2; ++pass) {");
    c.in();
    c("const int grp = tid + 128 * pass, j = grp / 64, r = grp % 64 / 4, cq = grp % 4 * 4;");
    c("if (grp >= i * 64) continue;");
    c("float sv[4] = {0.0f, 0.0f, 0.0f, 0.0f};");
    c("LADLE_UNROLL for (int m = 0; m < 16; ++m) {");
    c("  const float a = tf[(i * 16 + r) * ALD + i * 16 + m];");
    c("  const ladle_f4 a4 = ladle_ld4(&af[(i * 16 + m) * ALD + j * 16 + cq]);");
    c("  sv[0] += a * a4.x, sv[1] += a * a4.y, sv[2] += a * a4.z, sv[3] += a * a4.w;");
    c("}");
    c("ladle_st4(&tf[(i * 16 + r) * ALD + j * 16 + cq], ladle_f4{-sv[0], -sv[1], -sv[2], -sv[3]});");
    c.out();
    c("}");
    c("__syncthreads();");
    c.out();
    c("}");
    c("// W = (T diag(beta exp(gamma))) K and U = (T diag(beta)) V: T's columns scaled, two bf16 copies.");
    c("// T is block lower triangular: the blocks above the diagonal were never written, and are zero.");
    c("LADLE_UNROLL for (int m = 0; m < C * C / 2 / 128; ++m) {");
    c.in();
    c("const int e = tid + m * 128;");
    c("const int r = e / (C / 2), s = e % (C / 2) * 2;");
    c("const bool below = s / 16 <= r / 16;");
    c("const float t0 = below ? tf[r * ALD + s] : 0.0f, t1 = below ? tf[r * ALD + s + 1] : 0.0f;");
    c("*reinterpret_cast<unsigned*>(&ts[r * TLD + s]) = ladle_pack_bf16(t0 * wfac[s], t1 * wfac[s + 1]);");
    c("*reinterpret_cast<unsigned*>(&tsu[r * TLD + s]) = ladle_pack_bf16(t0 * betas[s], t1 * betas[s + 1]);");
    c.out();
    c("}");
    c("__syncthreads();  // A and T are read for the last time: v takes their space");
    stage_tile(ir::Slot::v, "vs", "PVLD", "VPAD", "V", "_j", ir::Role::value, false, prefetch_v ? "vraw" : "");
    c("__syncthreads();");
    c("// 5. W = T (beta exp(gamma) K), U = T (beta V): 64 columns at a time, warp w: rows 16w..16w+15.");
    c("const unsigned short* tsw = ts;");
    c("const long long base = (gc * H + h) * C;");
    c("for (int col0 = 0; col0 < BK + VPAD; col0 += 64) {");
    c.in();
    c("const bool w_part = col0 < BK;");
    c("const unsigned short* src = w_part ? ks + col0 : vs + (col0 - BK);");
    c("const unsigned short* tsrc = w_part ? tsw : tsu;");
    c("const int ld = w_part ? KLD : PVLD;");
    c("const unsigned tsrc_s = ladle_shared_address(tsrc), src_s = ladle_shared_address(src);");
    zero("acc", "8");
    c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, tsrc_s + 2u * static_cast<unsigned>((warp * 16 + lane % 16) * TLD + kt * 16 + (lane / 16) * 8));");
    c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, src_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * ld + np * 16 + (lane / 16) * 8));");
    c("ladle_mma_bf16(acc[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(acc[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int row = warp * 16 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
    c("    const unsigned pair = ladle_pack_bf16(acc[nt][2 * half], acc[nt][2 * half + 1]);");
    c("    if (w_part) *reinterpret_cast<unsigned*>(&work_w[(base + row) * BK + col0 + col]) = pair;");
    c("    else *reinterpret_cast<unsigned*>(&work_u[(base + row) * VPAD + col0 - BK + col]) = pair;");
    c("  }");
    c.out();
    c("}");
  } else if (states) {
    c("// Double-buffered tiles of chunk c % 2: W and k [C][KLD], U [C][VLD] (E's decayed copy overwrites U in place).");
    c("unsigned short* ws = reinterpret_cast<unsigned short*>(smem);");
    c("unsigned short* ks = ws + 2 * C * KLD;");
    c("unsigned short* us = ks + 2 * C * KLD;");
    c("unsigned short* ss = us + 2 * C * VLD;  // S_0 in bf16, [BK][VLD]");
    c("float* gam = reinterpret_cast<float*>(ss + BK * VLD);  // [2][C]");
    c("");
    c("// The state: warp w < BK / 16 keeps rows 16w..16w+15 of its 64 columns in mma accumulator order.");
    c("float S[8][4];");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
    c("    const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = vb * 64 + nt * 8 + (lane % 4) * 2 + (e & 1);");
    if (spec.initial_state)
      c("    S[nt][e] = warp < BK / 16 && row < K && col < V ? ladle_load(initial_state + ((static_cast<long long>(n) * H + h) * K + row) * V + col) : 0.0f;");
    else
      c("    S[nt][e] = 0.0f;");
    c("    if (warp < BK / 16) ss[row * VLD + nt * 8 + (lane % 4) * 2 + (e & 1)] = ladle_bf16_bits(S[nt][e]);");
    c("  }");
    c("const long long chunks = (length + C - 1) / C;");
    c("// Chunk c's W, k, U and gamma into buffer c % 2, as one cp.async group.");
    c("const auto fetch = [&](long long chunk) {");
    c.in();
    c("const long long base = ((gc0 + chunk) * H + h) * C;");
    c("const int buf = static_cast<int>(chunk & 1);");
    c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / 256; ++m) {");
    c.in();
    c("const int e = tid + m * 256;");
    c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
    c("ladle_cp_async_16(&ws[(buf * C + p) * KLD + i], &work_w[(base + p) * BK + i]);");
    c("ladle_cp_async_16(&ks[(buf * C + p) * KLD + i], &work_k[(base + p) * BK + i]);");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int m = 0; m < C * 8 / 256; ++m) {");
    c.in();
    c("const int e = tid + m * 256;");
    c("const int p = e / 8, j = e % 8 * 8;");
    c("ladle_cp_async_16(&us[(buf * C + p) * VLD + j], &work_u[(base + p) * VPAD + vb * 64 + j]);");
    c.out();
    c("}");
    c("if (tid < C / 4) ladle_cp_async_16(&gam[buf * C + tid * 4], &work_gamma[base + tid * 4]);");
    c("ladle_cp_async_commit();");
    c.out();
    c("};");
    c("if (chunks > 0) fetch(0);");
    c("for (long long chunk = 0; chunk < chunks; ++chunk) {");
    c.in();
    c("const long long base = ((gc0 + chunk) * H + h) * C;");
    c("const int buf = static_cast<int>(chunk & 1);");
    c("ladle_cp_async_wait<0>();  // this chunk's tiles, the only group in flight");
    c("__syncthreads();  // ... from every thread's copies; every warp is done with the previous chunk (its buffer, S_0's copy)");
    c("if (chunk + 1 < chunks) fetch(chunk + 1);  // into the other buffer, whose last readers passed the barrier above");
    c("const unsigned short* wb = ws + buf * C * KLD;");
    c("const unsigned short* kbuf = ks + buf * C * KLD;");
    c("unsigned short* ub = us + buf * C * VLD;");
    c("const float* gb = gam + buf * C;");
    c("// 1. h = S_0 into the work array (16 bytes a thread at a time); E = U - W S_0: warp w, rows 16 (w % 4),");
    c("//    columns 32 (w / 4); E into the work array, exp(gamma_last - gamma) E over U.");
    c("LADLE_UNROLL_2 for (int m = 0; m < BK * 8 / 256; ++m) {  // (unrolled fully, ptxas spills at 128 registers with states)");
    c.in();
    c("const int e = tid + m * 256;");
    c("const int row = e / 8, j = e % 8 * 8;");
    c("ladle_st16(&work_h[(((gc0 + chunk) * H + h) * BK + row) * VPAD + vb * 64 + j], ladle_ld16(&ss[row * VLD + j]));");
    c.out();
    c("}");
    c("{");
    c.in();
    c("const int r0 = (warp % 4) * 16, c0 = (warp / 4) * 32;");
    zero("acc", "4");
    mma_rows("acc", "wb", "KLD", "r0", "ss", "VLD", true, "BK / 16", "4", "c0");
    c("const float last = gb[C - 1];");
    c("// The two rows' decays first: the stores below could alias gamma's buffer for the compiler.");
    c("const float dec[2] = {expf(last - gb[r0 + lane / 4]), expf(last - gb[r0 + lane / 4 + 8])};");
    c("LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int row = r0 + lane / 4 + half * 8, col = c0 + nt * 8 + (lane % 4) * 2;");
    c("    const unsigned u2 = *reinterpret_cast<const unsigned*>(&ub[row * VLD + col]);");
    c("    const float e0 = ladle_bits_float(u2 << 16) - acc[nt][2 * half];");
    c("    const float e1 = ladle_bits_float(u2 & 0xffff0000u) - acc[nt][2 * half + 1];");
    c("    const float d = dec[half];");
    c("    *reinterpret_cast<unsigned*>(&work_e[(base + row) * VPAD + vb * 64 + col]) = ladle_pack_bf16(e0, e1);");
    c("    *reinterpret_cast<unsigned*>(&ub[row * VLD + col]) = ladle_pack_bf16(e0 * d, e1 * d);");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// 2. S = exp(gamma_last) S + K^T (exp(gamma_last - gamma) E): warp w < BK / 16, rows 16w..16w+15.");
    c("if (warp < BK / 16) {");
    c.in();
    c("const float decay = expf(gb[C - 1]);");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt) S[nt][0] *= decay, S[nt][1] *= decay, S[nt][2] *= decay, S[nt][3] *= decay;");
    c("const unsigned kbuf_s = ladle_shared_address(kbuf), ub_s = ladle_shared_address(ub);");
    c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4];  // K^T: rows are features, the k-dimension tokens");
    c("ladle_ldmatrix_x4_trans_at(afrag, kbuf_s + 2u * static_cast<unsigned>((kt * 16 + lane % 8 + (lane / 16) * 8) * KLD + warp * 16 + ((lane / 8) & 1) * 8));");
    c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, ub_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * VLD + np * 16 + (lane / 16) * 8));");
    c("ladle_mma_bf16(S[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(S[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    c("// S_0's copy is overwritten without a barrier: its readers (step 1) passed the one before step 2, its next");
    c("// readers come after the next chunk's first.");
    c("if (warp < BK / 16)");
    c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("    LADLE_UNROLL for (int half = 0; half < 2; ++half)");
    c("      *reinterpret_cast<unsigned*>(&ss[(warp * 16 + lane / 4 + half * 8) * VLD + nt * 8 + (lane % 4) * 2]) =");
    c("          ladle_pack_bf16(S[nt][2 * half], S[nt][2 * half + 1]);");
    c.out();
    c("}");
    if (spec.final_state) {
      c("if (warp < BK / 16)");
      c("  LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
      c("    LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
      c("      const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = vb * 64 + nt * 8 + (lane % 4) * 2 + (e & 1);");
      c("      if (row < K && col < V) final_state[((static_cast<long long>(n) * H + h) * K + row) * V + col] = S[nt][e];");
      c("    }");
    }
  } else {
    const std::string G = std::to_string(groups), threads = std::to_string(kernel.threads);
    c("constexpr int G = " + G + ";  // 64-column groups a block: warps 4g..4g+3 take group g");
    c("unsigned short* qs = reinterpret_cast<unsigned short*>(smem);  // q (features, normalised), [C][KLD]");
    c("unsigned short* ks = qs + C * KLD;                               // k (normalised), [C][KLD]");
    c("unsigned short* hs = ks + C * KLD + warp / 4 * BK * VLD;         // h = S_0's 64 columns of this warp's group, [BK][VLD]");
    c("unsigned short* es = ks + C * KLD + G * BK * VLD + warp / 4 * C * VLD;  // E's 64 columns, [C][VLD]");
    c("float* gam = reinterpret_cast<float*>(ks + C * KLD + G * (BK * VLD + C * VLD));");
    c("float* qscale = gam + C;");
    c("const long long base = (gc * H + h) * C;");
    c("// 1. q's raw rows into registers first; k, each group's h and E, and gamma by cp.async; then q through");
    c("//    its feature map into shared memory; the scale.");
    const bool prefetch_q = spec.vector_loads && chunked_delta_chunk * spec.block_k / 8 / static_cast<int>(kernel.threads) <= 8;
    if (prefetch_q) prefetch_rows(ir::Role::query, "qraw", "BK", "K");
    c("LADLE_UNROLL for (int m = 0; m < C * BK / 8 / " + threads + "; ++m) {");
    c.in();
    c("const int e = tid + m * " + threads + ";");
    c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
    c("ladle_cp_async_16(&ks[p * KLD + i], &work_k[(base + p) * BK + i]);");
    c.out();
    c("}");
    c("unsigned short* const hs0 = ks + C * KLD;");
    c("unsigned short* const es0 = hs0 + G * BK * VLD;");
    c("LADLE_UNROLL for (int m = 0; m < G * BK * 8 / " + threads + "; ++m) {");
    c.in();
    c("const int e = tid + m * " + threads + ";");
    c("const int grp = e / (BK * 8), row = e % (BK * 8) / 8, j = e % 8 * 8, col = (blockIdx.z * G + grp) * 64 + j;");
    c("if (col < VPAD) ladle_cp_async_16(&hs0[(grp * BK + row) * VLD + j], &work_h[((gc * H + h) * BK + row) * VPAD + col]);");
    c.out();
    c("}");
    c("LADLE_UNROLL for (int m = 0; m < G * C * 8 / " + threads + "; ++m) {");
    c.in();
    c("const int e = tid + m * " + threads + ";");
    c("const int grp = e / (C * 8), p = e % (C * 8) / 8, j = e % 8 * 8, col = (blockIdx.z * G + grp) * 64 + j;");
    c("if (col < VPAD) ladle_cp_async_16(&es0[(grp * C + p) * VLD + j], &work_e[(base + p) * VPAD + col]);");
    c.out();
    c("}");
    c("if (tid < C / 4) ladle_cp_async_16(&gam[tid * 4], &work_gamma[base + tid * 4]);");
    c("ladle_cp_async_commit();");
    c("if (tid < C) {");
    c.in();
    c("const int p = tid;");
    token_of_row("chunk");
    c("qscale[p] = " + (has(ir::Slot::scale) ? render(ir::Slot::scale, "") : std::string("1.0f")) + ";");
    c.out();
    c("}");
    stage_tile(ir::Slot::q_feature, "qs", "KLD", "BK", "K", "_i", ir::Role::query, variant.l2_normalize_qk, prefetch_q ? "qraw" : "");
    c("ladle_cp_async_wait<0>();");
    c("__syncthreads();");
    c("if (vb * 64 >= VPAD) return;  // a group past V (V over 128 with an odd number of 64-column blocks)");
    c("// 2. Warp w, rows 16 (w % 4)..+15: P = q k^T (masked, decayed), kept in registers as the A operand of");
    c("//    P E (an accumulator tile is an A fragment's layout); O = exp(gamma) q h + P E.");
    c("const int r0 = warp % 4 * 16;");
    zero("acc", "8");
    mma_rows("acc", "qs", "KLD", "r0", "ks", "KLD", false, "BK / 16", "8");
    c("unsigned pfrag[C / 16][4];");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int row = r0 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
    c("    const float d0 = col <= row ? ladle_exp2((gam[row] - gam[col]) * LOG2E) : 0.0f, d1 = col + 1 <= row ? ladle_exp2((gam[row] - gam[col + 1]) * LOG2E) : 0.0f;");
    c("    pfrag[nt / 2][(nt % 2) * 2 + half] = ladle_pack_bf16(acc[nt][2 * half] * d0, acc[nt][2 * half + 1] * d1);");
    c("  }");
    c("// 32 columns at a time (16 accumulators beside P's 16 registers: 128 registers a thread at 256 threads).");
    c("const unsigned es_s = ladle_shared_address(es);");
    c("const float row_decay[2] = {expf(gam[r0 + lane / 4]), expf(gam[r0 + lane / 4 + 8])};");
    c("LADLE_UNROLL_1 for (int vh = 0; vh < 2; ++vh) {");
    c.in();
    zero("ov", "4");
    mma_rows("ov", "qs", "KLD", "r0", "hs", "VLD", true, "BK / 16", "4", "vh * 32");
    c("LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) ov[nt][e] *= row_decay[e / 2];");
    c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt)");
    c("  LADLE_UNROLL for (int np = 0; np < 2; ++np) {");
    c("    unsigned bfrag[4];");
    c("    ladle_ldmatrix_x4_trans_at(bfrag, es_s + 2u * static_cast<unsigned>((kt * 16 + lane % 16) * VLD + vh * 32 + np * 16 + (lane / 16) * 8));");
    c("    ladle_mma_bf16(ov[2 * np], pfrag[kt], bfrag[0], bfrag[1]);");
    c("    ladle_mma_bf16(ov[2 * np + 1], pfrag[kt], bfrag[2], bfrag[3]);");
    c("  }");
    c("LADLE_UNROLL for (int half = 0; half < 2; ++half) {  // rows lane / 4 and lane / 4 + 8: one address each");
    c.in();
    c("const int row = r0 + lane / 4 + half * 8;");
    c("const long long step = chunk * C + row;");
    c("if (step >= length) continue;");
    c("const long long tok = REVERSE ? eos - 1 - step : bos + step;");
    c("const float factor = qscale[row];");
    c("const int col0 = vb * 64 + vh * 32 + (lane % 4) * 2;");
    c("auto* const out = o + b * o_stride_b + tok * o_stride_t + h * o_stride_h + static_cast<long long>(col0) * o_stride_d;");
    c("if (o_stride_d == 1 && (reinterpret_cast<unsigned long long>(out) & (2 * sizeof(*out) - 1)) == 0 && col0 + 25 < V) {");
    c("  // every pair aligned and inside the row: one store a pair");
    c("  LADLE_UNROLL for (int nt = 0; nt < 4; ++nt) ladle_store_pair(out + nt * 8, factor * ov[nt][2 * half], factor * ov[nt][2 * half + 1]);");
    c("} else {");
    c("  LADLE_UNROLL for (int nt = 0; nt < 4; ++nt)");
    c("    LADLE_UNROLL for (int e = 0; e < 2; ++e)");
    c("      if (col0 + nt * 8 + e < V) ladle_store(out + (nt * 8 + e) * o_stride_d, factor * ov[nt][2 * half + e]);");
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
  }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace ladle::cuda
