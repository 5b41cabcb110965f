// The sync form of the attention backward's main kernel (codegen/cuda/attention_backward.h): mma.sync
// m16n8k16 on sm_80 and later, for what the warp-specialised form refuses (f32 or mixed q, k, v, head
// dims past 128, targets without wgmma). A block of 4 warps owns 64 keys (a warp 16) and one column
// part of their dK and dV; it walks the query tiles the masks leave, for every query head of its
// group, one step a tile: q and do staged in shared memory (16 bits, or bf16 hi + lo halves), S^T
// and dP^T per warp, the ws form's element-wise text, dV and dK from registers, dS^T through
// shared memory for dQ, which atomics add into dq.
#include "attention_backward.h"

#include <algorithm>
#include <tuple>

#include "attention_parts.h"

namespace ladle::cuda::detail {

namespace {

std::string mma(const AttentionBackwardParts& parts) { return parts.f16 ? "ladle_mma_f16" : "ladle_mma_bf16"; }

// Rows [0, rows) of a [.., width] operand into a 16-bit tile [rows][ld] (and its lo halves when
// split), 8 columns a thread at a time; rows that fail `row_ok` and columns past `width` are zero.
struct SyncStage {
  std::string row_src;  // row r's first element (a typed pointer expression)
  std::string stride_d, row_ok, rows, width, padded, ld, dst, dst_lo;
};

void emit_sync_stage(Code& c, const AttentionBackwardParts& parts, const SyncStage& s) {
  c("for (int e = threadIdx.x; e < " + s.rows + " * (" + s.padded + " / 8); e += THREADS) {");
  c.in();
  c("const int r = e / (" + s.padded + " / 8), col = e % (" + s.padded + " / 8) * 8;");
  c("float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};");
  c("if (" + s.row_ok + " && col < " + s.width + ") ladle_load8(x, " + s.row_src + " + col * " + s.stride_d + ", " + s.stride_d + ", 8);");
  const std::string pk = parts.f16 ? "ladle_pack_f16" : "ladle_pack_bf16";
  c("ladle_st16(" + s.dst + " + r * " + s.ld + " + col, ladle_u4{" + pk + "(x[0], x[1]), " + pk + "(x[2], x[3]), " + pk + "(x[4], x[5]), " +
    pk + "(x[6], x[7])});");
  if (parts.split)
    c("ladle_st16(" + s.dst_lo + " + r * " + s.ld +
      " + col, ladle_u4{ladle_pack_lo_bf16(x[0], x[1]), ladle_pack_lo_bf16(x[2], x[3]), ladle_pack_lo_bf16(x[4], x[5]), "
      "ladle_pack_lo_bf16(x[6], x[7])});");
  c.out();
  c("}");
}

// acc[2 np], acc[2 np + 1] += a (16 x 16) times the two 8-column blocks of b; split: a_lo b + a b_lo
// too, with b_lo loaded by `load_lo` into b.
void emit_sync_product(Code& c, const AttentionBackwardParts& parts, const std::string& acc, const std::string& a, const std::string& a_lo,
                       const std::string& load_b, const std::string& load_b_lo) {
  const std::string m = mma(parts);
  c("unsigned b_frag[4];");
  c(load_b);
  c(m + "(" + acc + "[2 * np], " + a + ", b_frag[0], b_frag[1]);");
  c(m + "(" + acc + "[2 * np + 1], " + a + ", b_frag[2], b_frag[3]);");
  if (parts.split) {
    c(m + "(" + acc + "[2 * np], " + a_lo + ", b_frag[0], b_frag[1]);  // lo x hi");
    c(m + "(" + acc + "[2 * np + 1], " + a_lo + ", b_frag[2], b_frag[3]);");
    c(load_b_lo);
    c(m + "(" + acc + "[2 * np], " + a + ", b_frag[0], b_frag[1]);  // hi x lo");
    c(m + "(" + acc + "[2 * np + 1], " + a + ", b_frag[2], b_frag[3]);");
  }
}

// Step 3: S^T = K q^T and dP^T = V do^T for this warp's 16 keys and the step's BM queries.
void emit_sync_scores(Code& c, const AttentionBackwardParts& parts) {
  c("// 3. S^T = K q^T and dP^T = V do^T: this warp's 16 keys as rows, the step's queries as columns.");
  c("float s_acc[BM / 8][4], dp_acc[BM / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < BM / 8; ++nt) {");
  c("  s_acc[nt][0] = s_acc[nt][1] = s_acc[nt][2] = s_acc[nt][3] = 0.0f;");
  c("  dp_acc[nt][0] = dp_acc[nt][1] = dp_acc[nt][2] = dp_acc[nt][3] = 0.0f;");
  c("}");
  for (const auto& [acc, a_tile, b_tile, width, ld] : {std::tuple{"s_acc", "k_s", "q_s", "DP", "LD"}, std::tuple{"dp_acc", "v_s", "do_s", "DVP", "VLD"}}) {
    const std::string A = a_tile, B = b_tile, L = ld;
    c("LADLE_UNROLL for (int kt = 0; kt < " + std::string(width) + " / 16; ++kt) {");
    c.in();
    c("unsigned a_frag[4];");
    c("ladle_ldmatrix_x4(a_frag, &" + A + "[(warp * 16 + lane % 16) * " + L + " + kt * 16 + (lane / 16) * 8]);");
    if (parts.split) {
      c("unsigned a_lo[4];");
      c("ladle_ldmatrix_x4(a_lo, &" + A + "_lo[(warp * 16 + lane % 16) * " + L + " + kt * 16 + (lane / 16) * 8]);");
    }
    c("LADLE_UNROLL for (int np = 0; np < BM / 16; ++np) {");
    c.in();
    const std::string at = "[(np * 16 + lane % 8 + (lane / 16) * 8) * " + L + " + kt * 16 + ((lane / 8) & 1) * 8]";
    emit_sync_product(c, parts, acc, "a_frag", "a_lo", "ladle_ldmatrix_x4(b_frag, &" + B + at + ");",
                      "ladle_ldmatrix_x4(b_frag, &" + B + "_lo" + at + ");");
    c.out();
    c("}");
    c.out();
    c("}");
  }
  c("");
}

// Step 5: dV += P^T do and dK += dS^T q over the part's columns, P and dS from registers.
void emit_sync_key_products(Code& c, const AttentionBackwardParts& parts) {
  c("// 5. dV += P^T do and dK += dS^T q over the part's columns (A from registers, 16 queries a product).");
  c("LADLE_UNROLL for (int kk = 0; kk < BM / 16; ++kk) {");
  c.in();
  for (const auto& [acc, a, a_lo, b_tile, width, ld] :
       {std::tuple{"dv_acc", "p_frag[kk]", "p_lo[kk]", "do_s", "DVP", "VLD"}, std::tuple{"dk_acc", "ds_frag[kk]", "ds_lo[kk]", "q_s", "DP", "LD"}}) {
    const std::string B = b_tile, L = ld;
    c("LADLE_UNROLL for (int np = 0; np < CW / 16; ++np) {");
    c.in();
    c("if (c0 + np * 16 >= " + std::string(width) + ") break;");
    const std::string at = "[(kk * 16 + lane % 16) * " + L + " + c0 + np * 16 + (lane / 16) * 8]";
    emit_sync_product(c, parts, acc, a, a_lo, "ladle_ldmatrix_x4_trans(b_frag, &" + B + at + ");",
                      "ladle_ldmatrix_x4_trans(b_frag, &" + B + "_lo" + at + ");");
    c.out();
    c("}");
  }
  c.out();
  c("}");
}

// Step 6: dS^T into shared memory, then dQ = dS K over the block's 64 keys for the part's columns of
// D, each warp a row block of the step's queries and a slice of the columns, added into dq.
void emit_sync_dq(Code& c, const AttentionBackwardParts& parts) {
  c("// 6. dS^T into shared memory [key][query] (16-bit pairs; split: hi and lo), then dQ = dS K: warp w takes");
  c("//    the step's rows 16 (w % RB).. and columns SLICE (w / RB).. of the part, added into dq by atomics.");
  c("LADLE_UNROLL for (int nt = 0; nt < BM / 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int at = (warp * 16 + gid + 8 * half) * DSLD + nt * 8 + tig * 2;");
  c("    *reinterpret_cast<unsigned*>(ds_s + at) = ds_frag[nt / 2][(nt % 2) * 2 + half];");
  if (parts.split) c("    *reinterpret_cast<unsigned*>(ds_s_lo + at) = ds_lo[nt / 2][(nt % 2) * 2 + half];");
  c("  }");
  c("__syncthreads();");
  c("{");
  c.in();
  c("constexpr int RB = BM / 16, SLICE = CW / (4 / RB), CHUNK = SLICE < 64 ? SLICE : 64;");
  c("const int rb = warp % RB, s0 = c0 + (warp / RB) * SLICE;");
  c("float* const dq_head = dq + b * dq_stride_b + h * dq_stride_h;");
  c("LADLE_UNROLL for (int ch = 0; ch < SLICE; ch += CHUNK) {");
  c.in();
  c("if (s0 + ch >= DP) break;");
  c("float dq_acc[CHUNK / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < CHUNK / 8; ++nt) dq_acc[nt][0] = dq_acc[nt][1] = dq_acc[nt][2] = dq_acc[nt][3] = 0.0f;");
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk) {");
  c.in();
  c("unsigned a_frag[4];  // dS rows rb.., keys 16 kk.., from dS^T (transposed by ldmatrix)");
  const std::string ds_at = "[(kk * 16 + (lane / 16) * 8 + lane % 8) * DSLD + rb * 16 + ((lane / 8) & 1) * 8]";
  c("ladle_ldmatrix_x4_trans(a_frag, &ds_s" + ds_at + ");");
  if (parts.split) {
    c("unsigned a_lo[4];");
    c("ladle_ldmatrix_x4_trans(a_lo, &ds_s_lo" + ds_at + ");");
  }
  c("LADLE_UNROLL for (int np = 0; np < CHUNK / 16; ++np) {");
  c.in();
  c("if (s0 + ch + np * 16 >= DP) break;");
  const std::string k_at = "[(kk * 16 + lane % 16) * LD + s0 + ch + np * 16 + (lane / 16) * 8]";
  emit_sync_product(c, parts, "dq_acc", "a_frag", "a_lo", "ladle_ldmatrix_x4_trans(b_frag, &k_s" + k_at + ");",
                    "ladle_ldmatrix_x4_trans(b_frag, &k_s_lo" + k_at + ");");
  c.out();
  c("}");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int nt = 0; nt < CHUNK / 8; ++nt)");
  c("  LADLE_UNROLL for (int half = 0; half < 2; ++half) {");
  c("    const int i = m0 + rb * 16 + gid + 8 * half, col = s0 + ch + nt * 8 + tig * 2;");
  c("    if (i < q_len && col < D) ladle_red_add_pair(dq_head + (q_bos + i) * dq_stride_t + col, dq_acc[nt][2 * half], dq_acc[nt][2 * half + 1]);");
  c("  }");
  c.out();
  c("}");
  c.out();
  c("}");
}

}  // namespace

void emit_sync_main(Code& c, const AttentionBackwardParts& parts, const std::string& name, const std::vector<std::string>& decl) {
  const AttentionBackwardSpec& spec = parts.spec;
  const std::vector<std::string>& id = parts.id;
  const int CW = spec.sync_columns, parts_count = (std::max(parts.DP, parts.DVP) + CW - 1) / CW;
  c("// ---- main (mma.sync): the gradients of q, k, v" + std::string(decl.empty() ? "" : " and the score's inputs"));
  c("extern \"C\" __global__ void __launch_bounds__(128) " + name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < decl.size(); ++p) c(decl[p] + (p + 1 < decl.size() ? "," : ") {"));
  c.out();
  c("constexpr int BM = " + std::to_string(spec.sync_rows) + ", BN = 64, THREADS = 128, CW = " + std::to_string(CW) +
    ", PARTS = " + std::to_string(parts_count) + ";");
  c("constexpr int D = " + std::to_string(spec.D) + ", DV = " + std::to_string(spec.Dv) + ", DP = " + std::to_string(parts.DP) +
    ", DVP = " + std::to_string(parts.DVP) + ";");
  c("constexpr int LD = DP + 8, VLD = DVP + 8, DSLD = BM + 8;  // shared rows padded by 16 bytes: ldmatrix without bank conflicts");
  c("constexpr float LOG2E = 1.4426950408889634f;");
  c("(void)LOG2E;");
  c("// Warp w = 0..3 owns keys 16 w.. of the block (S^T's rows).");
  c("const int lane = threadIdx.x % 32, warp = static_cast<int>(threadIdx.x / 32), gid = lane / 4, tig = lane % 4;");
  c("constexpr int warpgroup = 0;  // the element step's interior test reads the block's keys as j_block + warpgroup * 64");
  c("(void)warpgroup;");
  c("// The grid (attention_grid): x a group's kv heads, y the key blocks times the column parts, z the groups.");
  c("const int head = static_cast<int>(blockIdx.z * gridDim.x + blockIdx.x), n = head / H_kv, hk = head % H_kv, group = H / H_kv;");
  emit_attention_bounds(c, spec.varlen);
  c("(void)Tk;");
  c("const int part = static_cast<int>(blockIdx.y) % PARTS, j_block = static_cast<int>(blockIdx.y) / PARTS * BN, c0 = part * CW;");
  c("const bool input_part = part == 0;  // the score inputs' gradients: the first column part adds them");
  c("(void)input_part;");
  emit_block_query_tiles(c, parts.variant);

  c("// Shared memory: K [BN][LD], V [BN][VLD], q [BM][LD], do [BM][VLD], dS^T [BN][DSLD] in 16 bits" +
    std::string(parts.split ? ", then the lo halves of each" : "") + ", the step's row statistics [BM].");
  c("LADLE_DYNAMIC_SHARED(smem);");
  c("unsigned short* const k_s = reinterpret_cast<unsigned short*>(smem);");
  c("unsigned short* const v_s = k_s + BN * LD;");
  c("unsigned short* const q_s = v_s + BN * VLD;");
  c("unsigned short* const do_s = q_s + BM * LD;");
  c("unsigned short* const ds_s = do_s + BM * VLD;");
  if (parts.split) {
    c("unsigned short* const k_s_lo = ds_s + BN * DSLD;");
    c("unsigned short* const v_s_lo = k_s_lo + BN * LD;");
    c("unsigned short* const q_s_lo = v_s_lo + BN * VLD;");
    c("unsigned short* const do_s_lo = q_s_lo + BM * LD;");
    c("unsigned short* const ds_s_lo = do_s_lo + BM * VLD;");
    c("float2* const stats_s = reinterpret_cast<float2*>(ds_s_lo + BN * DSLD);");
  } else {
    c("float2* const stats_s = reinterpret_cast<float2*>(ds_s + BN * DSLD);");
  }
  c("");
  c("// 1. K and V of the block's keys, every column, once.");
  c("{");
  c.in();
  c("const long long k_base = b * " + id[1] + "_stride_b + (k_bos + j_block) * " + id[1] + "_stride_t + hk * " + id[1] + "_stride_h;");
  c("const long long v_base = b * " + id[2] + "_stride_b + (k_bos + j_block) * " + id[2] + "_stride_t + hk * " + id[2] + "_stride_h;");
  emit_sync_stage(c, parts, {"(" + id[1] + " + k_base + r * " + id[1] + "_stride_t)", id[1] + "_stride_d", "j_block + r < k_len", "BN", "D", "DP",
                             "LD", "k_s", "k_s_lo"});
  emit_sync_stage(c, parts, {"(" + id[2] + " + v_base + r * " + id[2] + "_stride_t)", id[2] + "_stride_d", "j_block + r < k_len", "BN", "DV",
                             "DVP", "VLD", "v_s", "v_s_lo"});
  c.out();
  c("}");
  c("// 2. This thread's keys and their accumulators: dK's and dV's columns c0.. of the part.");
  emit_key_row_values(c, parts);
  c("float dk_acc[CW / 8][4], dv_acc[CW / 8][4];");
  c("LADLE_UNROLL for (int nt = 0; nt < CW / 8; ++nt) {");
  c("  dk_acc[nt][0] = dk_acc[nt][1] = dk_acc[nt][2] = dk_acc[nt][3] = 0.0f;");
  c("  dv_acc[nt][0] = dv_acc[nt][1] = dv_acc[nt][2] = dv_acc[nt][3] = 0.0f;");
  c("}");
  c("");
  c("for (int step = 0; step < steps; ++step) {");
  c.in();
  c("const int h = hk * group + step / tiles, m0 = (tile_begin + step % tiles) * BM;");
  c("__syncthreads();  // the last step's q, do, dS^T and statistics are read");
  c("{");
  c.in();
  c("const long long q_base = b * " + id[0] + "_stride_b + (q_bos + m0) * " + id[0] + "_stride_t + h * " + id[0] + "_stride_h;");
  c("const long long do_base = b * d_output_stride_b + (q_bos + m0) * d_output_stride_t + h * d_output_stride_h;");
  emit_sync_stage(c, parts, {"(" + id[0] + " + q_base + r * " + id[0] + "_stride_t)", id[0] + "_stride_d", "m0 + r < q_len", "BM", "D", "DP", "LD",
                             "q_s", "q_s_lo"});
  emit_sync_stage(c, parts, {"(d_output + do_base + r * d_output_stride_t)", "d_output_stride_d", "m0 + r < q_len", "BM", "DV", "DVP", "VLD",
                             "do_s", "do_s_lo"});
  c("if (threadIdx.x < BM) stats_s[threadIdx.x] = load_stats(step);");
  c.out();
  c("}");
  c("__syncthreads();");
  c("const float2* const stats = stats_s;");
  emit_step_values(c, parts);
  emit_sync_scores(c, parts);
  emit_elements(c, parts);
  emit_sync_key_products(c, parts);
  emit_sync_dq(c, parts);
  emit_head_input_gradients(c, parts);
  c.out();
  c("}");
  c("");
  emit_key_gradients(c, parts);
  c.out();
  c("}");
}

}  // namespace ladle::cuda::detail
