// The tile rules of the softmax-attention family (codegen/cuda_attention.h): which tiles are
// valid for which head dims, and what shared memory they take.
#include <string>
#include <vector>

#include "../cuda_attention.h"

namespace ladle::cuda {

namespace {
int align16(int bytes) { return (bytes + 15) / 16 * 16; }
int pad16(int dim) { return (dim + 15) / 16 * 16; }  // head dims round up to the tensor-core step
}  // namespace

int attention_shared_bytes(const AttentionTile& tile, int D, int Dv, bool split_f32) {
  D = pad16(D), Dv = pad16(Dv);
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

std::string to_string(const AttentionTile& tile) {
  return "block_m=" + std::to_string(tile.block_m) + " block_n=" + std::to_string(tile.block_n) +
         " warps=" + std::to_string(tile.warps) + " stages=" + std::to_string(tile.stages);
}

std::vector<std::string> validate_attention_tile(const AttentionTile& tile, int D, int Dv, int max_shared_bytes,
                                                 bool split_f32) {
  std::vector<std::string> problems;
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  if (tile.warps != 4 && tile.warps != 8) say("warps = " + std::to_string(tile.warps) + ", expected 4 or 8");
  if (tile.block_m != 64 && tile.block_m != 128) say("block_m = " + std::to_string(tile.block_m) + ", expected 64 or 128");
  else if (tile.block_m != 16 * tile.warps)
    say("block_m = " + std::to_string(tile.block_m) + " with " + std::to_string(tile.warps) +
        " warps, expected block_m = 16 * warps (each warp owns 16 query rows)");
  if (tile.block_n != 32 && tile.block_n != 64 && tile.block_n != 128)
    say("block_n = " + std::to_string(tile.block_n) + ", expected 32, 64 or 128");
  if (tile.stages != 1 && tile.stages != 2) say("stages = " + std::to_string(tile.stages) + ", expected 1 or 2");
  if (D < 1 || D > 256) say("D = " + std::to_string(D) + ", expected 1 to 256");
  if (Dv < 1 || Dv > 256) say("Dv = " + std::to_string(Dv) + ", expected 1 to 256");
  if (!problems.empty()) return problems;
  // Registers per thread: q fragments D/4 (x2 split), scores block_n/2, o_acc Dv/2.
  const int registers = pad16(D) / 4 * (split_f32 ? 2 : 1) + tile.block_n / 2 + pad16(Dv) / 2;
  if (registers > 160)
    say("each thread would hold " + std::to_string(registers) +
        " fragment values in registers (D/4 + block_n/2 + Dv/2), expected at most 160");
  if (max_shared_bytes > 0 && attention_shared_bytes(tile, D, Dv, split_f32) > max_shared_bytes)
    say("needs " + std::to_string(attention_shared_bytes(tile, D, Dv, split_f32)) +
        " bytes of shared memory, the device allows " + std::to_string(max_shared_bytes));
  return problems;
}

}  // namespace ladle::cuda
