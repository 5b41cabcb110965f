// The chunked kernel family in CUDA C++: the same recurrences as the fused-recurrent family
// (DESIGN.md section 1), computed a chunk of tokens at a time with the tensor cores
// (mma.sync m16n8k16, bf16 operands, fp32 accumulation; sm_80 and later).
//
// One thread block owns the state tile [K, block_v] of one (sequence, query head) in fp32
// registers and walks the sequence chunk by chunk. Per chunk it stages q, k, v and the gates
// in shared memory once, forms the cumulative log2 gates, and then
//   o      = q~ S~ + mask(q~ k~^T) v~          (inter-chunk read + intra-chunk attention)
//   S      = decay * S + k_up^T v_up            (the state carried to the next chunk)
// where every ~ factor is the gate product relative to a reference token in the middle of
// the chunk, so each factor is 2^x with |x| bounded (checked per chunk). A chunk whose gates
// are too strong for one reference (|x| > 100 in log2, i.e. gates averaging below about -2
// per token across half a chunk) is walked in 16-token steps, and those in single tokens: no
// overflow for any gate strength, at the price of speed only where it is needed. A per-head
// scalar decay (g_gamma, or a per-token head gate) needs no reference: its factors are
// applied exactly per (t, s) pair and per row. A log2 gate below -256 (-inf: a hard reset,
// exp(-inf) = 0) counts as -256: 2^-256 = 0 in fp32 wipes the state exactly, a step with one
// after its first token fails the check, and the sums after it are kept apart from it so the
// small gates that follow keep their precision (normal chunks: one compare and add per gate).
//
// Bytes: q, k, v, the gates and o cross global memory once per value tile (block_v = V: once),
// the state once in and once out per sequence; nothing per chunk.
//
// Launch: grid (ceil(V / block_v), N * H), block (32 * warps), dynamic shared memory
// ChunkedKernel::shared_bytes. The parameters are those of the fused-recurrent family.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "cuda_recurrent.h"

namespace ladle::cuda {

struct ChunkedTile {
  int block_k = 128;  // K <= block_k, a multiple of 16 up to 256
  int chunk = 64;     // tokens per chunk: 16, 32 or 64
  int block_v = 64;   // value columns per block: a multiple of 16 up to 128
  int warps = 8;      // 2, 4 or 8
  friend bool operator==(const ChunkedTile&, const ChunkedTile&) = default;
};

struct ChunkedKernelSpec : KernelTypes {
  ChunkedTile tile;
};

struct ChunkedKernel {
  std::string name;                 // the extern "C" symbol
  std::string source;
  std::vector<KernelParam> params;  // the kernel's parameters, in order
  unsigned threads = 0;             // block size
  int block_v = 0;                  // grid.x = ceil(V / block_v), grid.y = N * H
  int shared_bytes = 0;             // dynamic shared memory per block
};

// Why the chunked family cannot run this variant (empty: it can). It needs no normaliser.
std::string chunked_unsupported(const ir::Variant& variant);

// Dynamic shared memory a block of this variant and tile needs, in bytes.
int chunked_shared_bytes(const ir::Variant& variant, const ChunkedTile& tile);

ChunkedTile default_chunked_tile(std::int64_t key_dim, std::int64_t value_dim);
// What is wrong with a tile for these sizes (empty: usable). max_shared_bytes: the device's
// opt-in limit per block (0: not checked).
std::vector<std::string> validate_chunked_tile(const ChunkedTile& tile, const ir::Variant& variant,
                                               std::int64_t key_dim, std::int64_t value_dim,
                                               int max_shared_bytes = 0);
std::string to_string(const ChunkedTile& tile);  // "block_k=128 chunk=64 block_v=64 warps=8"

// Throws InvalidArgument for a malformed or unsupported variant, a tile that fails the
// size-independent rules, or input_types of the wrong length.
ChunkedKernel generate_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec);

}  // namespace ladle::cuda
