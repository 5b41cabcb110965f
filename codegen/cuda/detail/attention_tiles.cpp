// The tile rules of the softmax-attention family (codegen/cuda/attention.h): which tiles are
// valid for which head dims, and what shared memory they take.
#include <cstdio>
#include <string>
#include <vector>

#include <ladle/runtime/error.h>

#include "../attention.h"

namespace ladle::cuda {

namespace {
int align16(int bytes) { return (bytes + 15) / 16 * 16; }
int align128(int bytes) { return (bytes + 127) / 128 * 128; }
int pad16(int dim) { return (dim + 15) / 16 * 16; }  // head dims round up to the tensor-core step
}  // namespace

// The ws layout with q_tiles q tiles: the alignment slack, q, the K and V rings, then the
// mbarriers (full and empty per stage for K and for V; full and empty for up to two q tiles) and
// a work item per q tile, then (128-byte aligned) 1 KB of ones, the row sums' B operand.
int attention_ws_shared_bytes(const AttentionTile& tile, int D, int Dv, int q_tiles) {
  const int d64 = (D + 63) / 64 * 64, dv64 = (Dv + 63) / 64 * 64;
  const int barriers_end = q_tiles * tile.block_m * d64 * 2 + tile.stages * tile.block_n * (d64 + dv64) * 2 + 8 * (4 * tile.stages + 6);
  return 1024 + (barriers_end + 127) / 128 * 128 + 1024;
}

int attention_ws_q_stages(const AttentionTile& tile, int D, int Dv) {
  return attention_ws_shared_bytes(tile, D, Dv, 2) <= 227 * 1024 ? 2 : 1;
}

int attention_shared_bytes(const AttentionTile& tile, int D, int Dv, bool split_f32) {
  if (tile.mma == AttentionMma::ws) {
    // 1024 bytes to align the tiles to the 128-byte swizzle's 1024-byte pattern; q [BM][D], K and V
    // [BN][D] per stage, each as boxes of 64 head-dim columns (128-byte rows); the mbarriers.
    // A second q tile where it fits in 227 KB (attention_ws_q_stages: the persistent form copies the
    // next item's q while this one's is read).
    return attention_ws_shared_bytes(tile, D, Dv, attention_ws_q_stages(tile, D, Dv));
  }
  D = pad16(D), Dv = pad16(Dv);
  if (tile.mma == AttentionMma::decode) {  // the sync layout, and room for the key warps' merge after the loop
    AttentionTile sync = tile;
    sync.mma = AttentionMma::sync;
    const int merge = tile.warps > tile.block_m / 16 ? tile.warps * 16 * (Dv + 2) * 4 : 0;
    const int stages = attention_shared_bytes(sync, D, Dv, split_f32);
    return stages > merge ? stages : merge;
  }
  if (tile.mma == AttentionMma::wgmma)  // core-matrix tiles, no padding: q [BM][D] beside the K/V stages
    return align128(tile.block_m * D * 2) + tile.stages * (align128(tile.block_n * D * 2) + align128(tile.block_n * Dv * 2));
  const int halves = split_f32 ? 2 : 1;  // split fp32: a hi and a lo copy of every operand
  const int stage = align16(tile.block_n * (D + 8) * 2) + align16(tile.block_n * (Dv + 8) * 2);
  const int stages = tile.stages * stage * halves;
  const int q_tile = align16(tile.block_m * (D + 8) * 2) * halves;  // borrows the stages at the start
  return stages > q_tile ? stages : q_tile;
}

AttentionTile default_attention_tile(int D, int Dv) {
  AttentionTile tile;
  if (D > 128 || Dv > 128) tile.block_n = 32;  // o_acc and q fragments fill the registers (D = Dv = 256 does not fit)
  return tile;
}

AttentionTile parse_attention_tile(const std::string& text) {
  AttentionTile tile;
  char mma[16] = {};
  const int fields =
      std::sscanf(text.c_str(), "%d,%d,%d,%d,%15s", &tile.block_m, &tile.block_n, &tile.warps, &tile.stages, mma);
  const std::string kind = mma;
  if ((fields != 4 && fields != 5) || (fields == 5 && kind != "sync" && kind != "wgmma" && kind != "ws" && kind != "decode"))
    throw InvalidArgument("attention tile '" + text + "', expected block_m,block_n,warps,stages[,sync|wgmma|ws|decode]");
  if (kind == "wgmma") tile.mma = AttentionMma::wgmma;
  if (kind == "ws") tile.mma = AttentionMma::ws;
  if (kind == "decode") tile.mma = AttentionMma::decode;
  return tile;
}

std::string to_string(const AttentionTile& tile) {
  return "block_m=" + std::to_string(tile.block_m) + " block_n=" + std::to_string(tile.block_n) +
         " warps=" + std::to_string(tile.warps) + " stages=" + std::to_string(tile.stages) +
         (tile.mma == AttentionMma::wgmma ? " mma=wgmma"
          : tile.mma == AttentionMma::ws  ? " mma=ws"
          : tile.mma == AttentionMma::decode ? " mma=decode"
                                             : "");
}


std::vector<std::string> validate_attention_tile(const AttentionTile& tile, int D, int Dv, int max_shared_bytes,
                                                 bool split_f32, const std::string& arch) {
  std::vector<std::string> problems;
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  const bool decode = tile.mma == AttentionMma::decode;
  bool block_m_ok = false;
  if (decode) {  // a group's packed rows: 16 to 64, 16 a warp; the warps of a row group split each key tile
    if (tile.warps != 1 && tile.warps != 2 && tile.warps != 4 && tile.warps != 8)
      say("warps = " + std::to_string(tile.warps) + ", expected 1, 2, 4 or 8 (mma=decode)");
    if (tile.block_m != 16 && tile.block_m != 32 && tile.block_m != 64)
      say("block_m = " + std::to_string(tile.block_m) + ", expected 16, 32 or 64 (mma=decode)");
    else if (tile.warps % (tile.block_m / 16) != 0)
      say("block_m = " + std::to_string(tile.block_m) + " with " + std::to_string(tile.warps) +
          " warps, expected a multiple of block_m / 16 warps (each row group of 16 takes the same number of key warps)");
    else if (tile.block_n % (16 * (tile.warps / (tile.block_m / 16))) != 0)
      say("block_n = " + std::to_string(tile.block_n) + " over " + std::to_string(tile.warps / (tile.block_m / 16)) +
          " key warps, expected 16 keys or a multiple of 16 a warp");
  } else if (tile.mma == AttentionMma::ws) {  // one to three consumer warpgroups of 64 rows each
    if (tile.warps != 4 && tile.warps != 8 && tile.warps != 12) say("warps = " + std::to_string(tile.warps) + ", expected 4, 8 or 12 (mma=ws)");
    block_m_ok = tile.block_m == 64 || tile.block_m == 128 || tile.block_m == 192;
    if (!block_m_ok) say("block_m = " + std::to_string(tile.block_m) + ", expected 64, 128 or 192 (mma=ws)");
  } else {
    if (tile.warps != 4 && tile.warps != 8) say("warps = " + std::to_string(tile.warps) + ", expected 4 or 8");
    block_m_ok = tile.block_m == 64 || tile.block_m == 128;
    if (!block_m_ok) say("block_m = " + std::to_string(tile.block_m) + ", expected 64 or 128");
  }
  if (block_m_ok && !decode && tile.block_m != 16 * tile.warps)
    say("block_m = " + std::to_string(tile.block_m) + " with " + std::to_string(tile.warps) +
        " warps, expected block_m = 16 * warps (each warp owns 16 query rows)");
  if (tile.block_n != 32 && tile.block_n != 64 && tile.block_n != 128)
    say("block_n = " + std::to_string(tile.block_n) + ", expected 32, 64 or 128");
  const bool ws = tile.mma == AttentionMma::ws;
  if (ws && (tile.stages < 2 || tile.stages > 4)) say("stages = " + std::to_string(tile.stages) + ", expected 2 to 4 (mma=ws)");
  if (decode && (tile.stages < 1 || tile.stages > 4)) say("stages = " + std::to_string(tile.stages) + ", expected 1 to 4 (mma=decode)");
  if (!ws && !decode && tile.stages != 1 && tile.stages != 2) say("stages = " + std::to_string(tile.stages) + ", expected 1 or 2");
  if (D < 1 || D > 256) say("D = " + std::to_string(D) + ", expected 1 to 256");
  if (Dv < 1 || Dv > 256) say("Dv = " + std::to_string(Dv) + ", expected 1 to 256");
  if (tile.mma != AttentionMma::sync && tile.mma != AttentionMma::wgmma && !ws && !decode) say("mma is none of sync, wgmma, ws, decode");
  if (tile.mma == AttentionMma::wgmma || ws) {
    const std::string name = ws ? "mma=ws" : "mma=wgmma";
    if (!has_wgmma(arch))
      say(name + " needs the target sm_90a (wgmma.mma_async), the target is " + (arch.empty() ? std::string("not given") : arch));
    if (split_f32) say(name + " takes f16/bf16 q, k, v (fp32 inputs: mma=sync)");
  }
  if (ws && (D % 8 != 0 || Dv % 8 != 0))
    say("mma=ws copies rows with TMA: D = " + std::to_string(D) + " and Dv = " + std::to_string(Dv) + ", expected multiples of 8");
  if (!problems.empty()) return problems;
  // Registers per thread. sync: q fragments D/4 (x2 split), scores block_n/2, o_acc Dv/2.
  // wgmma: q stays in shared memory; scores block_n/2, P packed block_n/4, o_acc Dv/2.
  // ws: the same as wgmma; two consumer warpgroups get 240 registers each (setmaxnreg), so up to 192
  // of them; three get 160, so up to 128.
  const bool wgmma = tile.mma == AttentionMma::wgmma || ws;
  const int registers = wgmma ? tile.block_n / 2 + tile.block_n / 4 + pad16(Dv) / 2
                              : pad16(D) / 4 * (split_f32 ? 2 : 1) + tile.block_n / 2 + pad16(Dv) / 2;
  const int most = ws ? (tile.warps == 12 ? 128 : 192) : 160;
  if (registers > most)
    say("each thread would hold " + std::to_string(registers) + " fragment values in registers (" +
        (wgmma ? "3 block_n/4 + Dv/2" : "D/4 + block_n/2 + Dv/2") + "), expected at most " + std::to_string(most));
  if (max_shared_bytes > 0 && attention_shared_bytes(tile, D, Dv, split_f32) > max_shared_bytes)
    say("needs " + std::to_string(attention_shared_bytes(tile, D, Dv, split_f32)) +
        " bytes of shared memory, the device allows " + std::to_string(max_shared_bytes));
  return problems;
}

}  // namespace ladle::cuda
