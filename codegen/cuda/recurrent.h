// The fused recurrent kernel family in CUDA C++: one ir::Variant and one tile
// configuration in, one readable kernel source out (compiled by the runtime through NVRTC;
// nothing here compiles or launches). One thread block owns the state tile [K, block_v] of
// one (sequence, query head) in registers and walks the tokens in order; the gate math of
// each slot is emitted inline through render_c, so a gate written as logsigmoid(x) / tau in
// the DSL is computed from x next to its load.
//
// Launch: grid (ceil(V / block_v), N * H), block (32 * warps); K <= block_k. The kernel's
// parameters, in order, are listed by RecurrentKernel::params.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include <ladle/tensor/tensor_view.h>

#include "../kernel.h"

namespace ladle::cuda {

struct RecurrentTile {
  int block_k = 64;  // key rows of the state per block: covers all of K (K <= block_k)
  int block_v = 32;  // value columns of the state per block (grid.x = ceil(V / block_v))
  int warps = 4;     // 32 * warps threads share the tile: block_v columns x row groups
  friend bool operator==(const RecurrentTile&, const RecurrentTile&) = default;
};

struct RecurrentKernelSpec : KernelTypes {
  RecurrentTile tile;
};


struct RecurrentKernel {
  std::string name;                 // the extern "C" symbol
  std::string source;
  std::vector<KernelParam> params;  // the kernel's parameters, in order
  unsigned threads = 0;             // block size
  int block_v = 0;                  // grid.x = ceil(V / block_v), grid.y = N * H
};

// A reasonable tile for these sizes (block_k: K rounded up to a power of two, at least 16).
RecurrentTile default_tile(std::int64_t key_dim, std::int64_t value_dim);
// What is wrong with a tile for these sizes (empty: usable).
std::vector<std::string> validate_tile(const RecurrentTile& tile, std::int64_t key_dim, std::int64_t value_dim);
// The same, and what the variant's update form adds (the delta rule: at most 32 row groups).
std::vector<std::string> validate_tile(const RecurrentTile& tile, std::int64_t key_dim, std::int64_t value_dim, const ir::Variant& variant);
std::string to_string(const RecurrentTile& tile);  // "block_k=64 block_v=32 warps=4"

// Throws InvalidArgument for a malformed variant, a tile that fails validate_tile's
// size-independent rules, or input_types of the wrong length.
RecurrentKernel generate_recurrent(const ir::Variant& variant, const RecurrentKernelSpec& spec);

}  // namespace ladle::cuda
