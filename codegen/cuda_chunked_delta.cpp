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

namespace {

// The kernels' own names (an input called like one of them is renamed).
const std::set<std::string> template_names = {
    "C", "BK", "VPAD", "KLD", "VLD", "ALD", "TLD", "SLD", "warp", "lane", "tid", "gc", "gc0", "cps", "length", "chunks", "chunk",
    "p", "e", "x", "nt", "np", "kt", "acc", "afrag", "bfrag", "smem", "ks", "kb", "vs", "af", "ts", "gs", "betas", "gam",
    "qs", "ws", "us", "es", "ets", "ps", "ss", "qscale", "S", "col", "row", "val", "ssum", "inv", "decay", "base", "g_p",
    "beta_p", "live", "use", "vb", "lo", "hi", "mid", "N", "work_w", "work_u", "work_gamma", "chunk_offsets", "tok", "jj"};

}  // namespace

ChunkedDeltaKernel generate_chunked_delta(const ir::Variant& variant, const ChunkedDeltaSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_chunked_delta: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (variant.update != ir::Update::delta) fail("the chunked delta kernels run the delta rule only (" + ir::form_name(variant) + ")");
  if (spec.block_k != 64 && spec.block_k != 128) fail("block_k = " + std::to_string(spec.block_k) + ", expected 64 or 128");
  if (spec.value_pad < 64 || spec.value_pad > 256 || spec.value_pad % 64 != 0)
    fail("value_pad = " + std::to_string(spec.value_pad) + ", expected a multiple of 64 up to 256");
  check_types("generate_chunked_delta", variant, spec);

  const bool prepare = spec.phase == ChunkedDeltaPhase::prepare;
  const int C = chunked_delta_chunk, BK = spec.block_k;
  const std::vector<std::string> id = identifiers(variant, template_names);
  const auto& inputs = variant.inputs;
  const auto has = [&](ir::Slot s) { return variant.has(s); };
  const InputUse use_of = input_use(variant);
  const auto render = [&](ir::Slot s, const std::string& suffix) { return render_slot(variant, id, s, suffix); };
  const auto row_load = [&](std::size_t k, const std::string& index) { return detail::row_load(id, k, index); };

  ChunkedDeltaKernel kernel;
  kernel.threads = prepare ? 128 : 256;
  const std::string spec_key = std::string(prepare ? "prepare" : "serial") + "|" + std::to_string(BK) + "|" +
                               std::to_string(spec.value_pad) + types_key(spec);
  kernel.name = std::string(prepare ? "ladle_delta_prepare_" : "ladle_delta_serial_") + hex(fnv1a(spec_key, ir::hash(variant)));

  std::vector<std::string> declarations;
  declare_params(variant, id, spec, declarations, kernel.params);
  const auto extra = [&](const std::string& c_type, const std::string& name, KernelParam::Type type, KernelParam::Role role) {
    declarations.push_back(c_type + " " + name);
    kernel.params.push_back({name, c_type, type, role});
  };
  extra("int", "N", KernelParam::Type::i32, KernelParam::Role::sequences);
  if (spec.varlen) extra("const long long*", "chunk_offsets", KernelParam::Type::pointer, KernelParam::Role::chunk_offsets);
  extra(std::string(prepare ? "" : "const ") + "unsigned short*", "work_w", KernelParam::Type::pointer, KernelParam::Role::delta_w);
  extra(std::string(prepare ? "" : "const ") + "unsigned short*", "work_u", KernelParam::Type::pointer, KernelParam::Role::delta_u);
  extra(std::string(prepare ? "" : "const ") + "float*", "work_gamma", KernelParam::Type::pointer, KernelParam::Role::delta_gamma);

  // Shared memory (bf16 tiles padded by 8 elements a row, so that ldmatrix's 8 rows hit 8 bank groups).
  const int KLD = BK + 8, VLD = 72, ALD = C + 1, TLD = C + 8, PVLD = spec.value_pad + 8;
  if (prepare)
    kernel.shared_bytes = 2 * (2 * C * KLD + C * PVLD + C * TLD) + 4 * (C * ALD + 3 * C);
  else
    kernel.shared_bytes = 2 * (3 * C * KLD + 4 * C * VLD + BK * VLD) + 4 * 2 * C;

  std::string header = std::string("ladle: chunked delta rule, ") + (prepare ? "prepare" : "serial") + " kernel " + kernel.name +
                       "\nGenerated by codegen/cuda_chunked_delta.cpp; do not edit.\n\n" + ir::to_string(variant) +
                       "\nchunk C = " + std::to_string(C) + ", block_k = " + std::to_string(BK) + ", value_pad = " +
                       std::to_string(spec.value_pad) + ", " + std::to_string(kernel.threads) + " threads, " +
                       std::to_string(kernel.shared_bytes) + " bytes of dynamic shared memory\n";
  header += prepare ? "launch: grid (chunks over all sequences, H), block (128)\n"
                      "per chunk: gamma, A = strictly lower beta_t exp(gamma_t - gamma_s) k_t . k_s, T = (I + A)^-1,\n"
                      "W = T (beta exp(gamma) K), U = T (beta V) into the work arrays\n"
                    : "launch: grid (ceil(V / 64), N * H), block (256)\n"
                      "per chunk, in order: E = U - W S_0; o = exp(gamma) q S_0 + tril(q k^T exp(gamma_t - gamma_s)) E;\n"
                      "S = exp(gamma_last) S_0 + K^T (exp(gamma_last - gamma) E)\n";
  header += "types: " + types_line(variant, id, spec) + "\n";
  header += std::string("reverse=") + (spec.reverse ? "1" : "0") + " varlen=" + (spec.varlen ? "1" : "0") +
            " initial_state=" + (spec.initial_state ? "1" : "0") + " final_state=" + (spec.final_state ? "1" : "0") + "\n";

  Code c;
  c(comment_block(header) + "\n" + storage_helpers + tensor_core_helpers);
  // The serial kernel keeps the state (32 values a thread) beside a product's accumulators: at two
  // blocks an SM (128 registers) ptxas spills 260-500 bytes; at one it needs about 136.
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kernel.threads) + (prepare ? ", 2) " : ", 1) ") + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  c("constexpr int C = " + std::to_string(C) + ", BK = " + std::to_string(BK) + ", VPAD = " + std::to_string(spec.value_pad) + ";");
  c("constexpr int KLD = " + std::to_string(KLD) + ", VLD = " + std::to_string(VLD) + ", ALD = " + std::to_string(ALD) +
    ", TLD = " + std::to_string(TLD) + ", PVLD = " + std::to_string(PVLD) + ";");
  c(std::string("constexpr bool REVERSE = ") + (spec.reverse ? "true" : "false") + ";");
  c("const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;");
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("");

  // ---- The block's sequence and chunk(s)
  c("const long long cps = (T + C - 1) / C;  // chunks of a batch row (fixed-length sequences)");
  if (prepare) {
    c("const long long gc = blockIdx.x;  // this block's chunk over all sequences");
    c("const int h = blockIdx.y;");
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

  // Stages row p (a token of the chunk) of the key side: the k (or q) feature over BK, L2-normalised
  // when the variant says so, as bf16 into `tile`; the warp's lanes take every 32nd feature.
  const auto stage_key_row = [&](ir::Slot slot, const std::string& tile, const std::string& ld) {
    c("{");
    c.in();
    c("float x[BK / 32], ssum = 0.0f;");
    c("LADLE_UNROLL for (int e = 0; e < BK / 32; ++e) {");
    c.in();
    c("const int i = lane + 32 * e;");
    c("const bool use = live && i < K;");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (use_of.key_side[k] && inputs[k].kind == ir::InputKind::token_key)
        c("const float " + id[k] + "_i = use ? " + row_load(k, "i") + " : 0.0f;");
    c("x[e] = use ? " + render(slot, "_i") + " : 0.0f;");
    c("ssum += x[e] * x[e];");
    c.out();
    c("}");
    if (variant.l2_normalize_qk) {
      c("LADLE_UNROLL for (int off = 16; off > 0; off >>= 1) ssum += __shfl_xor_sync(0xffffffffu, ssum, off);");
      c("const float inv = 1.0f / sqrtf(ssum + " + ir::render_c_literal(ir::l2_normalize_eps) + ");");
      c("LADLE_UNROLL for (int e = 0; e < BK / 32; ++e) x[e] *= inv;");
    } else {
      c("(void)ssum;");
    }
    c("LADLE_UNROLL for (int e = 0; e < BK / 32; ++e) " + tile + "[p * " + ld + " + lane + 32 * e] = ladle_bf16_bits(x[e]);");
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
  // A-operand fragment (16 x 16, row-major tile) and B-operand fragments (two n-tiles of 8).
  const auto mma_rows = [&](const std::string& acc, const std::string& a_tile, const std::string& a_ld, const std::string& a_row0,
                            const std::string& b_tile, const std::string& b_ld, bool b_trans, const std::string& ksteps,
                            const std::string& ntiles) {
    c("LADLE_UNROLL for (int kt = 0; kt < " + ksteps + "; ++kt) {");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, ladle_shared_address(&" + a_tile + "[(" + a_row0 + " + lane % 16) * " + a_ld +
      " + kt * 16 + (lane / 16) * 8]));");
    c("LADLE_UNROLL for (int np = 0; np < " + ntiles + " / 2; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    if (b_trans)
      c("ladle_ldmatrix_x4_trans_at(bfrag, ladle_shared_address(&" + b_tile + "[(kt * 16 + lane % 16) * " + b_ld +
        " + np * 16 + (lane / 16) * 8]));");
    else
      c("ladle_ldmatrix_x4_at(bfrag, ladle_shared_address(&" + b_tile + "[(np * 16 + lane % 8 + (lane / 16) * 8) * " + b_ld +
        " + kt * 16 + ((lane / 8) & 1) * 8]));");
    c("ladle_mma_bf16(" + acc + "[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(" + acc + "[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
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
    c("unsigned short* ks = reinterpret_cast<unsigned short*>(smem);  // k (features, normalised), [C][KLD]");
    c("unsigned short* kb = ks + C * KLD;                               // beta exp(gamma) k, [C][KLD]");
    c("unsigned short* vs = kb + C * KLD;                               // beta v, [C][PVLD]");
    c("unsigned short* ts = vs + C * PVLD;                              // T = (I + A)^-1, [C][TLD]");
    c("float* af = reinterpret_cast<float*>(ts + C * TLD);              // A, [C][ALD]");
    c("float* gs = af + C * ALD;                                        // g, then gamma");
    c("float* gam = gs + C;");
    c("float* betas = gam + C;");
    c("");
    c("// 1. Stage the chunk: k (and its norm), beta v, g and beta; a warp a row.");
    c("for (int p = warp; p < C; p += 4) {");
    c.in();
    token_of_row("chunk");
    c("const float g_p = live ? " + g_expr + " : 0.0f;");
    c("const float beta_p = live ? " + beta_expr + " : 0.0f;");
    stage_key_row(ir::Slot::k_feature, "ks", "KLD");
    c("for (int j = lane; j < VPAD; j += 32) {");
    c.in();
    c("const bool use = live && j < V;");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      if (use_of.value_side[k] && inputs[k].kind == ir::InputKind::token_value)
        c("const float " + id[k] + "_j = use ? " + row_load(k, "j") + " : 0.0f;");
    c("vs[p * PVLD + j] = ladle_bf16_bits(use ? beta_p * (" + render(ir::Slot::v, "_j") + ") : 0.0f);");
    c.out();
    c("}");
    c("if (lane == 0) gs[p] = g_p, betas[p] = beta_p;");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// 2. gamma_t = g_0 + ... + g_t (past the sequence's end g = 0: gamma stays).");
    c("if (tid < C) {");
    c.in();
    c("float s = 0.0f;");
    c("for (int r = 0; r <= tid; ++r) s += gs[r];");
    c("gam[tid] = s;");
    c("work_gamma[(gc * H + h) * C + tid] = s;");
    c.out();
    c("}");
    c("__syncthreads();");
    c("for (int e = tid; e < C * BK; e += 128) {");
    c.in();
    c("const int p = e / BK, i = e % BK;");
    c("kb[p * KLD + i] = ladle_bf16_bits(betas[p] * expf(gam[p]) * ladle_bf16_float(ks[p * KLD + i]));");
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
    c("    af[row * ALD + col] = col < row ? betas[row] * expf(gam[row] - gam[col]) * acc[nt][e] : 0.0f;");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// 4. T = (I + A)^-1 by forward substitution, one column a thread (fp32), rounded to bf16.");
    c("if (tid < C) {");
    c.in();
    c("float x[C];");
    c("LADLE_UNROLL for (int r = 0; r < C; ++r) {");
    c.in();
    c("float val = r == tid ? 1.0f : 0.0f;");
    c("LADLE_UNROLL for (int s = 0; s < r; ++s) val -= af[r * ALD + s] * x[s];");
    c("x[r] = val;");
    c("ts[r * TLD + tid] = ladle_bf16_bits(val);");
    c.out();
    c("}");
    c.out();
    c("}");
    c("__syncthreads();");
    c("// 5. W = T (beta exp(gamma) K), U = T (beta V): 64 columns at a time, warp w: rows 16w..16w+15.");
    c("const long long base = (gc * H + h) * C;");
    c("for (int col0 = 0; col0 < BK + VPAD; col0 += 64) {");
    c.in();
    c("const bool w_part = col0 < BK;");
    c("const unsigned short* src = w_part ? kb + col0 : vs + (col0 - BK);");
    c("const int ld = w_part ? KLD : PVLD;");
    zero("acc", "8");
    c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4];");
    c("ladle_ldmatrix_x4_at(afrag, ladle_shared_address(&ts[(warp * 16 + lane % 16) * TLD + kt * 16 + (lane / 16) * 8]));");
    c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, ladle_shared_address(&src[(kt * 16 + lane % 16) * ld + np * 16 + (lane / 16) * 8]));");
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
  } else {
    c("unsigned short* qs = reinterpret_cast<unsigned short*>(smem);  // q (features, normalised), [C][KLD]");
    c("unsigned short* ks = qs + C * KLD;                               // k, [C][KLD]");
    c("unsigned short* ws = ks + C * KLD;                               // W, [C][KLD]");
    c("unsigned short* us = ws + C * KLD;                               // U's 64 columns, [C][VLD]");
    c("unsigned short* es = us + C * VLD;                               // E = U - W S_0, [C][VLD]");
    c("unsigned short* ets = es + C * VLD;                              // exp(gamma_last - gamma) E, [C][VLD]");
    c("unsigned short* ps = ets + C * VLD;                              // q k^T, masked and decayed, [C][VLD]");
    c("unsigned short* ss = ps + C * VLD;                               // S_0 in bf16, [BK][VLD]");
    c("float* gam = reinterpret_cast<float*>(ss + BK * VLD);");
    c("float* qscale = gam + C;");
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
    c("for (long long chunk = 0; chunk < chunks; ++chunk) {");
    c.in();
    c("const long long base = ((gc0 + chunk) * H + h) * C;");
    c("// 1. Stage q, k (through their feature maps), the scale, W and U's columns, gamma.");
    c("for (int p = warp; p < C; p += 8) {");
    c.in();
    token_of_row("chunk");
    stage_key_row(ir::Slot::q_feature, "qs", "KLD");
    stage_key_row(ir::Slot::k_feature, "ks", "KLD");
    c("if (lane == 0) qscale[p] = " + (has(ir::Slot::scale) ? render(ir::Slot::scale, "") : std::string("1.0f")) + ";");
    c.out();
    c("}");
    c("for (int e = tid; e < C * BK / 8; e += 256) {");
    c.in();
    c("const int p = e / (BK / 8), i = e % (BK / 8) * 8;");
    c("ladle_cp_async_16(&ws[p * KLD + i], &work_w[(base + p) * BK + i]);");
    c.out();
    c("}");
    c("for (int e = tid; e < C * 8; e += 256) {");
    c.in();
    c("const int p = e / 8, j = e % 8 * 8;");
    c("ladle_cp_async_16(&us[p * VLD + j], &work_u[(base + p) * VPAD + vb * 64 + j]);");
    c.out();
    c("}");
    c("ladle_cp_async_commit();");
    c("if (tid < C) gam[tid] = work_gamma[base + tid];");
    c("ladle_cp_async_wait<0>();");
    c("__syncthreads();");
    c("");
    c("// 2. Warps 0-3: P = q k^T (masked, decayed) and O = exp(gamma) q S_0; warps 4-7: E = U - W S_0.");
    c("const int r0 = (warp % 4) * 16;");
    zero("acc", "8");
    c("if (warp < 4) {");
    c.in();
    mma_rows("acc", "qs", "KLD", "r0", "ks", "KLD", false, "BK / 16", "8");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int row = r0 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
    c("    const float d0 = col <= row ? expf(gam[row] - gam[col]) : 0.0f, d1 = col + 1 <= row ? expf(gam[row] - gam[col + 1]) : 0.0f;");
    c("    *reinterpret_cast<unsigned*>(&ps[row * VLD + col]) = ladle_pack_bf16(acc[nt][2 * half] * d0, acc[nt][2 * half + 1] * d1);");
    c("    acc[nt][2 * half] = acc[nt][2 * half + 1] = 0.0f;");
    c("  }");
    mma_rows("acc", "qs", "KLD", "r0", "ss", "VLD", true, "BK / 16", "8");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) acc[nt][e] *= expf(gam[r0 + lane / 4 + (e >= 2 ? 8 : 0)]);");
    c.out();
    c("} else {");
    c.in();
    mma_rows("acc", "ws", "KLD", "r0", "ss", "VLD", true, "BK / 16", "8");
    c("const float last = gam[C - 1];");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
    c("    const int row = r0 + lane / 4 + half * 8, col = nt * 8 + (lane % 4) * 2;");
    c("    const float e0 = ladle_bf16_float(us[row * VLD + col]) - acc[nt][2 * half];");
    c("    const float e1 = ladle_bf16_float(us[row * VLD + col + 1]) - acc[nt][2 * half + 1];");
    c("    const float d = expf(last - gam[row]);");
    c("    *reinterpret_cast<unsigned*>(&es[row * VLD + col]) = ladle_pack_bf16(e0, e1);");
    c("    *reinterpret_cast<unsigned*>(&ets[row * VLD + col]) = ladle_pack_bf16(e0 * d, e1 * d);");
    c("  }");
    c.out();
    c("}");
    c("__syncthreads();");
    c("");
    c("// 3. Warps 0-3: O += P E, stored; warps w < BK / 16: S = exp(gamma_last) S + K^T (exp(gamma_last - gamma) E).");
    c("if (warp < 4) {");
    c.in();
    mma_rows("acc", "ps", "VLD", "r0", "es", "VLD", true, "C / 16", "8");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt)");
    c("  LADLE_UNROLL for (int e = 0; e < 4; ++e) {");
    c("    const int row = r0 + lane / 4 + (e >= 2 ? 8 : 0), col = vb * 64 + nt * 8 + (lane % 4) * 2 + (e & 1);");
    c("    const long long step = chunk * C + row;");
    c("    if (step >= length || col >= V) continue;");
    c("    const long long tok = REVERSE ? eos - 1 - step : bos + step;");
    c("    ladle_store(o + b * o_stride_b + tok * o_stride_t + h * o_stride_h + col * o_stride_d, qscale[row] * acc[nt][e]);");
    c("  }");
    c.out();
    c("}");
    c("if (warp < BK / 16) {");
    c.in();
    c("const float decay = expf(gam[C - 1]);");
    c("LADLE_UNROLL for (int nt = 0; nt < 8; ++nt) S[nt][0] *= decay, S[nt][1] *= decay, S[nt][2] *= decay, S[nt][3] *= decay;");
    c("LADLE_UNROLL for (int kt = 0; kt < C / 16; ++kt) {");
    c.in();
    c("unsigned afrag[4];  // K^T: rows are features, the k-dimension tokens");
    c("ladle_ldmatrix_x4_trans_at(afrag, ladle_shared_address(&ks[(kt * 16 + lane % 8 + (lane / 16) * 8) * KLD + warp * 16 + ((lane / 8) & 1) * 8]));");
    c("LADLE_UNROLL for (int np = 0; np < 4; ++np) {");
    c.in();
    c("unsigned bfrag[4];");
    c("ladle_ldmatrix_x4_trans_at(bfrag, ladle_shared_address(&ets[(kt * 16 + lane % 16) * VLD + np * 16 + (lane / 16) * 8]));");
    c("ladle_mma_bf16(S[2 * np], afrag, bfrag[0], bfrag[1]);");
    c("ladle_mma_bf16(S[2 * np + 1], afrag, bfrag[2], bfrag[3]);");
    c.out();
    c("}");
    c.out();
    c("}");
    c.out();
    c("}");
    c("__syncthreads();  // every read of this chunk's tiles and of S_0 is done");
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
  }
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace ladle::cuda
