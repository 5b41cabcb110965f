// The Hopper path of the softmax-attention family (AttentionTile::mma = wgmma, sm_90a): the
// score and P V products on wgmma.mma_async, and their device helpers.
//
// Operands in shared memory use the no-swizzle ("interleave") canonical layouts of the PTX ISA
// (9.7.15.5.1.2, T = 8 16-bit elements = 16 bytes), with every tile stored as 8 x 8 core
// matrices of 128 contiguous bytes, core matrices row-major over the tile (core_matrix_offset):
//   q [BM][DP] and K [BN][DP] K-major, ((8,m),(T,2k)):((1T,SBO),(1,LBO)):
//     LBO = 128 bytes (the next 8 of D), SBO = DP * 16 bytes (the next 8 rows);
//   V [BN][DVP] as B of o += P V, N-major (imm-trans-b = 1), ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)):
//     SBO = 128 bytes (the next 8 of Dv), LBO = DVP * 16 bytes (the next 8 keys).
// P is the register A operand of m64nNk16: per warp, the mma.m16n8k16 A layout, which is the
// accumulator layout of the score product packed in pairs.
#include "attention_parts.h"

namespace ladle::cuda::detail {

namespace {

// One wgmma.mma_async specialisation: d[N / 8][4] = A B + (accumulate ? d : 0), A from a
// descriptor (ss) or four registers (rs), B from a descriptor; accumulate is the instruction's
// scale-d (0: the first product of a fresh accumulator, which then needs no zeroing).
// ss only: trans_a / trans_b give imm-trans-a / imm-trans-b = 1 (an MN-major operand) and the
// suffix _ta, _tb or _tab.
std::string wgmma_specialisation(bool registers_a, int n, bool f16, bool trans_a = false, bool trans_b = false) {
  const std::string type = f16 ? "f16" : "bf16";
  const std::string transposed = trans_a && trans_b ? "_tab" : trans_a ? "_ta" : trans_b ? "_tb" : "";
  const std::string name = std::string("ladle_wgmma_") + (registers_a ? "rs_" : "ss_") + type + transposed;
  const std::string guard = "LADLE_WGMMA_" + std::string(registers_a ? "RS_" : "SS_") + (f16 ? "F16_" : "BF16_") + transposed + "_" + std::to_string(n);
  const int accumulators = n / 2;
  std::string list, outputs;
  for (int i = 0; i < accumulators; ++i) {
    list += (i ? ", %" : "%") + std::to_string(i);
    outputs += std::string(i ? ", " : "") + "\"+f\"(d[" + std::to_string(i / 4) + "][" + std::to_string(i % 4) + "])";
  }
  std::string a_operand, inputs;
  int next = accumulators;
  if (registers_a) {
    a_operand = "{%" + std::to_string(next) + ", %" + std::to_string(next + 1) + ", %" + std::to_string(next + 2) + ", %" +
                std::to_string(next + 3) + "}";
    inputs = "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), ";
    next += 4;
  } else {
    a_operand = "%" + std::to_string(next++);
    inputs = "\"l\"(a), ";
  }
  const std::string b_operand = "%" + std::to_string(next++);
  const std::string scale_d = "%" + std::to_string(next++);
  inputs += "\"l\"(b), \"r\"(accumulate)";
  // imm-scale-a, imm-scale-b = 1; ss: imm-trans-a = imm-trans-b = 0 (K-major); rs: imm-trans-b = 1 (N-major V).
  const std::string immediates = registers_a ? "1, 1, 1" : std::string("1, 1, ") + (trans_a ? "1" : "0") + ", " + (trans_b ? "1" : "0");
  std::string text = "#if !defined(LADLE_WGMMA_EMULATED) && !defined(" + guard + ")\n#define " + guard + "\n";
  text += "template <>\n__device__ __forceinline__ void " + name + "<" + std::to_string(n) + ">(float (&d)[" +
          std::to_string(n / 8) + "][4], " + (registers_a ? "const unsigned (&a)[4]" : "unsigned long long a") +
          ", unsigned long long b, int accumulate) {\n";
  text += "  asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, " + scale_d + ", 0;\\nwgmma.mma_async.sync.aligned.m64n" +
          std::to_string(n) + "k16.f32." + type + "." + type + " {" + list + "}, " + a_operand + ", " + b_operand + ", p, " +
          immediates + ";\\n}\\n\"\n";
  text += "               : " + outputs + "\n               : " + inputs + "\n               : \"memory\");\n}\n#endif\n";
  return text;
}

}  // namespace

std::string wgmma_helpers(int score_n, int out_n, bool qk_f16, bool pv_f16) {
  std::string text = "#include <ladle/codegen/device/wgmma.cuh>\n";
  text += wgmma_specialisation(false, score_n, qk_f16);
  text += wgmma_specialisation(true, out_n, pv_f16);
  return text;
}

std::string wgmma_product(bool registers_a, int n, bool f16, bool trans_a, bool trans_b) {
  return wgmma_specialisation(registers_a, n, f16, trans_a, trans_b);
}

std::string wgmma_transposed_helpers(int n) {
  std::string text = R"(#ifndef LADLE_WGMMA_TRANSPOSED
#define LADLE_WGMMA_TRANSPOSED
// ss products with MN-major operands (imm-trans = 1): _tb a K-major A and an N-major B, _tab both
// MN-major (A read as its transpose: the 128-byte rows run along M).
template <int N> __device__ void ladle_wgmma_ss_bf16_tb(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1);
template <int N> __device__ void ladle_wgmma_ss_bf16_tab(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1);
#endif  // LADLE_WGMMA_TRANSPOSED
)";
  text += wgmma_specialisation(false, n, false, false, true);
  text += wgmma_specialisation(false, n, false, true, true);
  return text;
}

std::string core_matrix_offset(const std::string& row, const std::string& col, const std::string& padded) {
  return "((" + row + ") / 8 * (" + padded + " / 8) + (" + col + ") / 8) * 64 + (" + row + ") % 8 * 8 + (" + col + ") % 8";
}

void emit_wgmma_scores(Code& c, const AttentionParts& parts) {
  const std::string mma = parts.qk_f16 ? "ladle_wgmma_ss_f16<BN>" : "ladle_wgmma_ss_bf16<BN>";
  c("// 3. score = q k^T for this warpgroup's 64 rows and the tile's BN keys: one wgmma.mma_async");
  c("//    m64nBNk16 per 16 of D, q and K K-major in shared memory (LBO 128 bytes: the next 8 of D;");
  c("//    SBO DP * 16 bytes: the next 8 rows). Each warp receives its 16 rows in the mma.sync layout.");
  c("//    The first product overwrites score (scale-d = 0): no zeroing.");
  c("float score[BN / 8][4];");
  c("ladle_wgmma_fence_operand<BN>(score);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kt = 0; kt < DP / 16; ++kt)");
  c("  " + mma + "(score, ladle_wgmma_desc(q_tile + warpgroup * 64 * DP + kt * 128, 128, DP * 16),");
  c("      ladle_wgmma_desc(k_s + kt * 128, 128, DP * 16), kt > 0);");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<BN>(score);");
  c("");
}

void emit_pack_p(Code& c, const AttentionParts& parts) {
  const std::string pack = parts.pv_f16 ? "ladle_pack_f16" : "ladle_pack_bf16";
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk) {");
  c("  p_frag[kk][0] = " + pack + "(p[2 * kk][0], p[2 * kk][1]);");
  c("  p_frag[kk][1] = " + pack + "(p[2 * kk][2], p[2 * kk][3]);");
  c("  p_frag[kk][2] = " + pack + "(p[2 * kk + 1][0], p[2 * kk + 1][1]);");
  c("  p_frag[kk][3] = " + pack + "(p[2 * kk + 1][2], p[2 * kk + 1][3]);");
  c("}");
}

void emit_wgmma_pv(Code& c, const AttentionParts& parts) {
  const std::string mma = parts.pv_f16 ? "ladle_wgmma_rs_f16<DVP>" : "ladle_wgmma_rs_bf16<DVP>";
  c("// 6. o_acc += P V: one wgmma.mma_async m64nDVPk16 per 16 keys, P from registers (the score");
  c("//    accumulator layout packed in pairs is the A fragment), V N-major in shared memory");
  c("//    (imm-trans-b = 1; SBO 128 bytes: the next 8 of Dv; LBO DVP * 16 bytes: the next 8 keys).");
  c("unsigned p_frag[BN / 16][4];");
  emit_pack_p(c, parts);
  c("ladle_wgmma_fence_operand<DVP>(o_acc);");
  c("ladle_wgmma_fence();");
  c("LADLE_UNROLL for (int kk = 0; kk < BN / 16; ++kk)");
  c("  " + mma + "(o_acc, p_frag[kk], ladle_wgmma_desc(v_s + kk * 16 * DVP, DVP * 16, 128));");
  c("ladle_wgmma_commit();");
  c("ladle_wgmma_wait<0>();");
  c("ladle_wgmma_fence_operand<DVP>(o_acc);");
}

}  // namespace ladle::cuda::detail
