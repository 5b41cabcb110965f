// The chunked kernel family in CUDA C++: the same recurrences as the fused-recurrent family
// (docs/operations.md), computed a chunk of tokens at a time with the tensor cores
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
// A read before the update (RWKV6's bonus read, o_t = q_t^T S_(t-1) + (q_t . u . k_t) v_t) is the
// same recurrence read a token earlier: q~ carries the gates up to t - 1 (G_(t-1), 0 at the chunk's
// start, which the fit check includes), the intra-chunk scores are strictly causal, and the bonus
// (formed once per chunk from the staged rows) is their diagonal; a one-token step reads against
// t0 - 1, so it reads the state as it entered whatever its own gate. The state pass is unchanged.
//
// Bytes: q, k, v, the gates and o cross global memory once per value tile (block_v = V: once),
// the state once in and once out per sequence; nothing per chunk.
//
// Staging works on 8 consecutive features at a time (one 16-byte load where a row is contiguous
// and aligned, per element otherwise), and the next chunk's raw 16-bit rows are copied into
// shared memory by cp.async while the current chunk computes (chunked_prefetch: where the
// buffers keep a block within 160 KiB), so a chunk does not wait for its loads.
//
// That serial form walks the chunks of a sequence one after the other, so its parallelism is
// N * H * (V / block_v) blocks whatever T is. The split form (a tile with state_block_k > 0)
// runs the same recurrence as two kernels:
//   states:  one block per (sequence, head, key tile, value tile) walks the chunks and does
//            only the state update (no output, no fit check: its factors 2^(G_end - G_t) are
//            decays, at most 1), writing the state entering every chunk to chunk_states
//            ([chunks][H][K][V], bf16 or fp32) and the final state;
//   outputs: one block per (chunk, head, value tile), all chunks at once, reads the state
//            entering its chunk and forms o as the serial form does (the same steps, fit
//            check and fallbacks); it updates the state only between the steps of a chunk
//            too strong for one reference token.
// Bytes of the split form: q, k, v, the gates and o as above (k, v and the gates twice),
// plus the per-chunk states written once and read once (bf16: K * V * 2 bytes per chunk).
//
// The segmented form (ChunkedKernelSpec::segmented, ChunkedSegments below) is the one the library
// runs for few long sequences: each sequence cut into segments, the state pass over every segment
// but the last (from zero: its own state and total decay), then the serial form over every segment
// at once from the state its earlier segments leave. k, v and the gates are read twice for all but
// the last segment; one fp32 state and decay row per segment cross global memory.
//
// The ws form (ChunkedTile::ws, detail/chunked_ws.h; sm_90a) is the serial form warp-specialised for a
// decay of at most a per-head scalar or a key-side gate alone: a TMA producer warpgroup and one wgmma consumer warpgroup per 64
// value columns, 128 * (1 + block_v / 64) threads; it also has a segmented state pass of its own.
//
// Launch: serial: grid (ceil(V / block_v), N * H); states: grid (ceil(V / state_block_v),
// ceil(K / state_block_k), N * H); outputs: grid (chunks * ceil(V / block_v), H), where chunks
// = N * ceil(T / chunk), or the sum over packed sequences; block (32 * warps); dynamic shared
// memory ChunkedKernel::shared_bytes. The parameters are those of the fused-recurrent family,
// plus chunk_states, chunk_offsets (varlen) and N for the split form's kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "target.h"
#include "../kernel.h"

namespace ladle::cuda {

struct ChunkedTile {
  int block_k = 128;  // K <= block_k, a multiple of 16 up to 256
  int chunk = 64;     // tokens per chunk: 16, 32 or 64
  int block_v = 64;   // value columns per block: a multiple of 16 up to 128
  int warps = 8;      // 2, 4 or 8
  // The split form's state pass (0: the serial form): key rows and value columns of the
  // state per block (multiples of 16; the key rows need not cover K) and its warps (1..8).
  int state_block_k = 0;
  int state_block_v = 0;
  int state_warps = 0;
  bool state_f32 = false;  // the per-chunk states in global memory: bf16 (false) or fp32
  // sm_90a (wgmma.mma_async): the serial form's state update S += k_up^T v_up as one
  // m64n(block_v)k16 product per warpgroup and 16 tokens instead of mma.sync; needs the target
  // sm_90a, the serial form (no split), 4 or 8 warps and block_k / 16 a multiple of warps (each
  // warpgroup owns whole 64-row slices of the state).
  bool wgmma = false;
  // sm_90a, the warp-specialised serial form (detail/chunked_ws.h) for a decay of at most a per-head
  // scalar or a key-side gate alone (its inputs 16-bit): a TMA producer warpgroup and one consumer warpgroup per 64 value columns, every product
  // on wgmma; needs chunk 64, block_k and block_v 64 or 128, warps = 4 + block_v / 16 (tools:
  // "128,64,128,12,ws"), q, k and v in bf16.
  bool ws = false;
  bool split() const { return state_block_k > 0; }
  friend bool operator==(const ChunkedTile&, const ChunkedTile&) = default;
};

// Which kernel of the family: the serial form, one of the split form's two, or the segmented
// form's fold (between its state pass and its serial form).
enum class ChunkedPhase { serial, states, outputs, fold };
const char* to_string(ChunkedPhase phase);

struct ChunkedKernelSpec : KernelTypes {
  ChunkedTile tile;
  ChunkedPhase phase = ChunkedPhase::serial;  // states and outputs need a split tile, serial and fold one without
  // The segmented form (serial and states phases; see ChunkedSegments): each block walks one
  // segment of a sequence, named by the `segments` table, instead of a whole sequence. The
  // states phase then starts from zero and writes the segment's own final state and total
  // decay (segment_states, segment_decay), and the serial phase starts from the state its
  // earlier segments leave. Needs varlen = false (the table names every segment's tokens); the
  // states phase needs initial_state = final_state = false.
  bool segmented = false;
  // The segmented state pass in its suffix form (detail/chunked_suffix.h: the whole state tile per
  // block, each gate sum formed once, v read as copied), as the plan asks (gpu::plan_chunked sets it
  // where chunked_suffix_states_unsupported is empty); false: the split form's state pass with the
  // tile's state_* fields. generate_chunked refuses a spec that asks for it where it cannot run.
  bool suffix_states = false;
  // The serial ws form (tile.ws, not segmented, a key-side gate or a head decay: S is the true state at
  // every chunk's start) also writes the state entering each of its chunks, fp32, to chunk_states
  // [chunks][H][K][V] at row first chunk + c (n * ceil(T / 64), or chunk_offsets[n] packed): the
  // recurrent backward's boundary states (ops/gpu_backward.cpp) without a state pass of their own.
  bool chunk_states_out = false;
  // The target the kernel is compiled for (gpu::compile_chunked fills it in): a wgmma tile needs
  // sm_90a or compute_90a.
  std::string arch;
};

// Few long sequences: the segmented form cuts each sequence into segments of a fixed number of
// tokens so that the serial form's blocks cover the GPU. Two kernels:
//   1. the states phase on every segment but the last of its sequence (the table `earlier`):
//      from a zero state, writes the segment's own final state L_s ([S'][H][K][V] f32) and its
//      total log2 decay D_s ([S'][H][DL] f32, DL = K or 1 for the key-side gate, plus V for a
//      value-side one);
//   2. the fold phase (one thread per state element and head, over `all`; the last segment of
//      each sequence with earlier ones does its sequence): from S = h0_n, for j = 0, 1, ... in
//      order, S = 2^D_j S + L_j, written back in place of L_j: row j then holds the state
//      entering segment j + 1;
//   3. the serial phase on every segment (the table `all`): a block of segment i of sequence n
//      starts from h0_n (i = 0) or from row i - 1 (what the fold left), then walks its own
//      chunks; the last segment writes the final state.
// The fold and serial kernels take the same parameters.
// The recurrence is linear in the state and the decay across a segment is diagonal, so this is
// exact up to rounding. Rows of both tables, 8 long long each: {b, first token, end token,
// sequence, index of the segment in its sequence (in the recurrence's direction), the row in
// `earlier` of the sequence's first segment, 1 if last in its sequence, 0}; the tokens are
// positions in the batch row b (b = 0 for packed sequences) and walk backwards when reversed.
struct ChunkedSegments {
  std::vector<long long> all, earlier;  // 8 per row
  std::int64_t segments() const { return static_cast<std::int64_t>(all.size() / 8); }
  std::int64_t earlier_segments() const { return static_cast<std::int64_t>(earlier.size() / 8); }
};
// The segments of N sequences (of T tokens, or packed: cu_seqlens [N+1]) of at most
// segment_tokens tokens each (> 0); an empty sequence keeps one empty segment.
// state_pieces > 1: the state pass runs each earlier segment as that many pieces of
// ceil(segment_tokens / state_pieces) tokens (rows of `earlier`, folded in order like segments),
// so that its blocks cover the GPU; then a row of `all` names in field 4 the number of pieces
// before its segment (i * state_pieces), and the serial form starts segment i from row
// field 5 + field 4 - 1 as before.
ChunkedSegments chunked_segments(std::int64_t sequences, std::int64_t tokens, const std::vector<std::int64_t>& cu_seqlens,
                                 std::int64_t segment_tokens, bool reverse, std::int64_t state_pieces = 1);
// DL of segment_decay for this variant and K, V (0: the variant has no gate).
std::int64_t chunked_segment_decay_width(const ir::Variant& variant, std::int64_t key_dim, std::int64_t value_dim);

struct ChunkedKernel {
  std::string name;                 // the extern "C" symbol
  std::string source;
  std::vector<KernelParam> params;  // the kernel's parameters, in order
  unsigned threads = 0;             // block size
  int block_v = 0;                  // value columns per block
  int block_k = 0;                  // key rows per block (the states kernel: grid.y = ceil(K / block_k))
  int shared_bytes = 0;             // dynamic shared memory per block
  ChunkedPhase phase = ChunkedPhase::serial;
};

// The grid of a kernel of the family for these sizes: chunks is the number of chunks over
// all sequences (N * ceil(T / chunk), or the sum over packed sequences).
struct ChunkedGrid {
  unsigned x = 1, y = 1, z = 1;
};
ChunkedGrid chunked_grid(const ChunkedKernel& kernel, std::int64_t sequences, std::int64_t heads, std::int64_t key_dim,
                         std::int64_t value_dim, std::int64_t chunks);

// Why the chunked family cannot run this variant (empty: it can). It needs no normaliser, and runs
// the additive update read after or before it (not the delta rule: cuda_chunked_delta.h).
std::string chunked_unsupported(const ir::Variant& variant);

// Dynamic shared memory a block of this variant, tile and phase needs, in bytes.
int chunked_shared_bytes(const ir::Variant& variant, const ChunkedTile& tile,
                         ChunkedPhase phase = ChunkedPhase::serial);

// Whether a block of this variant, tile and phase copies the next chunk's raw 16-bit rows into
// shared memory (cp.async) while it computes the current chunk: where the buffers keep the
// block within 160 KiB of shared memory.
bool chunked_prefetch(const ir::Variant& variant, const ChunkedTile& tile, ChunkedPhase phase = ChunkedPhase::serial);

ChunkedTile default_chunked_tile(std::int64_t key_dim, std::int64_t value_dim);
// What is wrong with a tile for these sizes (empty: usable). max_shared_bytes: the device's
// opt-in limit per block (0: not checked); arch: the target (a wgmma tile needs sm_90a; empty:
// not checked).
std::vector<std::string> validate_chunked_tile(const ChunkedTile& tile, const ir::Variant& variant,
                                               std::int64_t key_dim, std::int64_t value_dim,
                                               int max_shared_bytes = 0, const std::string& arch = "");
// Whether the variant's decay is at most a per-head scalar (no key-side vector gate, no value-side
// gate): the serial form then forms P beside the state's read copy and issues the state update
// before the output, with no pass over the staged rows between them.
bool chunked_head_decay_only(const ir::Variant& variant);
// Why this spec's kernel cannot be the segmented state pass in its suffix form (empty: it can; the
// spec's own suffix_states is not read): it needs phase states, segmented, and a variant, types and
// tile it takes.
std::string chunked_suffix_states_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec);
// "block_k=128 chunk=64 block_v=64 warps=8", then " states=64x64x4" (" f32") when split, " wgmma", " ws".
std::string to_string(const ChunkedTile& tile);
// Why the ws form cannot run this variant with these types (empty: it can); for spec.phase states, its
// segmented state pass (which also takes a key-side gate alone, GLA).
std::string chunked_ws_unsupported(const ir::Variant& variant, const ChunkedKernelSpec& spec);
// The per-token inputs of the gate the ws kernels copy by TMA: a key-side gate's token_key inputs
// (beside k) or a value-side gate's token_value ones (beside v).
std::vector<int> chunked_ws_gate_inputs(const ir::Variant& variant);
// The tools' form: "block_k,chunk,block_v,warps[,wgmma|,ws]" (serial) or
// "block_k,chunk,block_v,warps,state_block_k,state_block_v,state_warps[,f32]" (split).
ChunkedTile parse_chunked_tile(const std::string& text);

// Throws InvalidArgument for a malformed or unsupported variant, a tile that fails the
// size-independent rules, or input_types of the wrong length.
ChunkedKernel generate_chunked(const ir::Variant& variant, const ChunkedKernelSpec& spec);

}  // namespace ladle::cuda
