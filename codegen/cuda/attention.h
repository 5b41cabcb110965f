// The softmax-attention kernel family in CUDA C++ (flash-attention-2 style forward): one
// ir::AttentionVariant and one tile in, one readable kernel out. The score and keep
// expressions are rendered inline into the tile loop, so a soft cap, a bias, an ALiBi slope or
// a user predicate costs a few instructions per score and no pass over memory.
//
// One thread block owns block_m query rows of one (sequence, query head); each of its warps
// owns 16 rows, keeps their q fragments in registers and walks the key tiles the structured
// masks leave (causal, sliding window: the loop bounds come from the range, so a window costs
// work in proportion to its width and only the boundary tiles test the mask per element):
//   score = q k^T                     mma.sync m16n8k16, 16-bit operands, fp32 accumulation
//   logit = <score expression>        masked entries -inf
//   online softmax in fp32 (base 2, log2 e folded into the logit), P in registers as the
//   A operand of o_acc += P V (V through ldmatrix.trans)
// K and V tiles are staged in shared memory with cp.async (16-bit inputs with a contiguous
// head dimension), double-buffered when stages = 2. fp32 inputs are split into two bf16
// halves (x = hi + lo) and multiplied as hi*hi + hi*lo + lo*hi: about 16 bits of mantissa,
// well inside docs/design.md's 2e-3 for fp32 through tensor cores.
//
// AttentionTile::mma picks the tensor-core instruction. `sync` (the default, sm_80 and later)
// is the above. `wgmma` (sm_90a only; 16-bit q, k, v) gives each warpgroup (4 warps) 64 query
// rows: score = q k^T is one wgmma.mma_async m64n<block_n>k16 per 16 of D with q and k read
// from shared memory through matrix descriptors (no-swizzle core-matrix layout: 8 rows x 16
// bytes contiguous), o_acc += P V one m64n<Dv>k16 per 16 keys with P from registers and V
// N-major through its descriptor. Its accumulators have the mma.sync fragment layout per warp,
// so the logit, mask, online softmax and epilogue text is the same for both.
//
// `ws` (sm_90a only; q, k, v of one 16-bit type, D and Dv multiples of 8, rows 16-byte aligned)
// is the warp-specialised Hopper pipeline. A producer warpgroup (its registers given back with
// setmaxnreg) loads the q tile once and the K and V tiles into a ring of `stages` shared-memory
// stages with TMA (cp.async.bulk.tensor, 128-byte swizzle, zero fill past the tensor), each stage
// guarded by mbarriers: full (the copy's bytes have landed) and empty (every consumer warp is done
// with it), separately for K and V. The consumer warpgroups (64 query rows each) run the same
// logit, mask and online-softmax text, with the products on wgmma reading the swizzled tiles
// directly, and overlap them: tile t's q k^T and tile t-1's P V are in flight together while the
// previous results are read, and the softmax of tile t runs while P V of tile t-1 finishes. No
// __syncthreads in the key loop. The launcher passes three tensor maps (runtime/tensor_map.h).
//
// `decode` (sm_80 and later) is the mma.sync path shaped for a few query tokens against many
// keys (flash decoding): a block takes one (sequence, key/value head) and packs the query heads
// of its GQA group as rows (row rho = token * G + g, G = H / H_kv), so that K and V are read once
// per group, and the keys are split over gridDim.x: split s takes keys [s split_len, (s + 1)
// split_len) of its rows' causal / window range. Each block writes its rows' partial o (normalised
// by its own sum) and lse (log2 units, -inf where it attended nothing) in fp32; a second kernel
// of the same source, <name>_merge (AttentionKernel::merge_params), merges the splits by lse per
// (sequence, head, token), adds the sinks to the denominator and stores o and lse as the forward
// does. Grid attention_decode_grid(splits, ceil(rows G / block_m), N H_kv); the merge kernel's
// attention_merge_blocks(N H rows), 128 threads (a block a row).
//
// Launch: grid attention_grid(N * H, ceil(Tq / block_m)), block (AttentionKernel::threads: 32 * warps, plus a
// producer warpgroup of 128 for ws), dynamic shared memory AttentionKernel::shared_bytes. The
// parameters are listed by AttentionKernel::params.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ladle/dsl/attention_ir.h>

#include <ladle/tensor/tensor_view.h>

#include "target.h"

namespace ladle::cuda {

// The tensor-core instruction of a tile: mma.sync m16n8k16 (sm_80 and later), Hopper's
// wgmma.mma_async with cp.async staging and a barrier per tile (sm_90a only), the
// warp-specialised TMA + mbarrier + wgmma pipeline (ws, sm_90a only), or mma.sync in the decode
// form (a GQA group's heads as rows, the keys split over blocks, a merge kernel).
enum class AttentionMma { sync, wgmma, ws, decode };

struct AttentionTile {
  int block_m = 128;  // query rows per block: 16 per warp (64 or 128; decode: 16, 32 or 64 packed rows)
  int block_n = 64;   // keys per tile: 32, 64 or 128
  int warps = 8;      // 4 or 8 (decode: 1, 2 or 4); block_m = 16 * warps (wgmma, ws: one warpgroup per 64 rows; ws adds a
                      // producer warpgroup)
  int stages = 2;     // K/V tiles in flight: 1 or 2 (double-buffered); ws: 2 to 4 ring stages
  AttentionMma mma = AttentionMma::sync;
  friend bool operator==(const AttentionTile&, const AttentionTile&) = default;
};

// What a kernel is specialised for besides the variant and the tile.
struct AttentionKernelSpec {
  std::vector<DType> input_types;  // one per variant input: f32, f16 or bf16 (scalars: ignored)
  DType output_type = DType::bf16;
  int D = 128, Dv = 128;                 // head dims, 1 to 256 (compile-time constants; padded to 16 inside)
  bool varlen = false;                   // cu_seqlens_q / cu_seqlens_k, int64 [N+1]
  bool lse = false;                      // also write lse [B,H,Tq] f32
  DType q_segment_ids_type = DType::i64;  // i32 or i64, when the variant has segment ids
  DType kv_segment_ids_type = DType::i64;
  DType sinks_type = DType::f32;          // softmax_aux, when the variant has sinks
  // q, k, v rows are 16-byte aligned with unit stride over the head dimension, so K/V tiles
  // can be copied with cp.async (16-bit inputs with D, Dv multiples of 8 only; the launcher
  // checks the pointers).
  bool async_copy = true;
  // The logit is factor * rest with a factor of scalar inputs and constants that is positive at
  // this call (attention_logit_factor): a wgmma or ws kernel keeps its running maxima in rest's
  // units and forms each p = 2^(factor rest - factor max) with one FFMA, one multiply fewer per
  // element (mma.sync tiles form the whole logit either way).
  bool positive_logit_factor = false;
  AttentionTile tile;
  // ws tiles only: the block is persistent. The launcher starts attention_persistent_blocks(items,
  // SMs) blocks, each walking work items (a row block of one (sequence, head), in the order the
  // grid would run them: a group's heads, the row blocks longest first under a causal mask, the
  // groups) handed out by a counter in global memory (work_counter, zeroed before the launch), so
  // that the producer copies the next item's q, K and V while the consumers finish this one's last
  // product and store its o, and a block that drew short items draws more.
  bool persistent = false;
  // The target the kernel is compiled for ("sm_90a", "compute_80", ...; empty: unknown). A wgmma
  // tile needs sm_90a / compute_90a; mma.sync kernels do not depend on it.
  std::string arch;
};

// One kernel parameter and what a launcher passes for it.
struct AttentionParam {
  enum class Type { pointer, i64, i32, f32, u64, tensor_map };
  enum class Role {
    input,            // data pointer of variant input `input` (a float for a scalar input)
    input_stride_b,   // strides in elements of the canonical views (ops/attention_bind.h):
    input_stride_t,   //   q/k/v [B,T,X,D]: b, t, h, d; pair [B,H,Tq,Tk]: b, h, i (stride_t),
    input_stride_h,   //   j (stride_d); head [B,H]: b, h
    input_stride_d,
    input_heads,      // q/k/v: the number of heads (H or H_kv)
    output,           // o [B,Tq,H,Dv] and its strides
    output_stride_b,
    output_stride_t,
    output_stride_h,
    output_stride_d,
    lse,              // [B,H,Tq] f32, contiguous (packed: [1,H,total_q])
    q_segment_ids,    // [B,Tq] and its strides b, t
    q_segment_stride_b,
    q_segment_stride_t,
    kv_segment_ids,   // [B,Tk]
    kv_segment_stride_b,
    kv_segment_stride_t,
    softmax_aux,      // [H,S] logits and its strides over H (0 for [S]) and S
    softmax_aux_stride_h,
    softmax_aux_stride_s,
    sinks,            // S
    cu_seqlens_q,     // int64 [N+1] each
    cu_seqlens_k,
    window_left,      // keys before / after the diagonal, -1 unbounded
    window_right,
    dropout_p,
    seed,
    batch,            // B, Tq, Tk, H
    q_tokens,
    k_tokens,
    heads,
    tensor_map,       // ws: the TMA map of variant input `input` (q, k or v) as [B,T,X,D], boxes of
                      // 64 head-dim elements by box_rows tokens (runtime/tensor_map.h)
    // The backward's (codegen/cuda/attention_backward.h); `output` and `lse` above are the forward's.
    d_output,         // dL/do [B,Tq,H,Dv] as the caller gave it, and its strides
    d_output_stride_b,
    d_output_stride_t,
    d_output_stride_h,
    d_output_stride_d,
    d_output_copy,    // [B,Tq,H,Dv] in q's 16-bit type, contiguous (prep writes it when asked)
    d_output_map,     // the TMA map of the 16-bit d_output main reads (the caller's or the copy)
    dq_map,           // the TMA map (fp32, 32-float boxes of box_rows rows) of dq, which main's reductions add into
    row_stats,        // [B,H,Tq] float2 {lse log2 e, delta}
    dq,               // [B,Tq,H,D] f32, unit stride over D, and its strides b, t, h
    dq_stride_b,
    dq_stride_t,
    dq_stride_h,
    dk,               // [B,Tk,H_kv,D] f32 and its strides b, t, h, d
    dk_stride_b,
    dk_stride_t,
    dk_stride_h,
    dk_stride_d,
    dv,               // [B,Tk,H_kv,Dv] f32
    dv_stride_b,
    dv_stride_t,
    dv_stride_h,
    dv_stride_d,
    d_input,          // the gradient of variant input `input` (f32, its canonical view: pair
    d_input_stride_b, //   [B,H,Tq,Tk] with i as "t" and j as "d", head [B,H]; broadcast axes at
    d_input_stride_t, //   stride 0, added atomically)
    d_input_stride_h,
    d_input_stride_d,
    d_softmax_aux,    // the sinks' gradient [H,S] f32 and its strides
    d_softmax_aux_stride_h,
    d_softmax_aux_stride_s,
    // decode: the splits' partial results and their geometry (the launcher's scratch).
    partial_o,        // [splits][N][H][partial_rows][Dv] f32: each split's o, normalised by its own sum
    partial_lse,      // [splits][N][H][partial_rows] f32, log2 units (-inf: nothing attended)
    partial_rows,     // the longest query sequence
    split_len,        // keys per split, a multiple of block_n
    kv_splits,        // the number of splits (the merge kernel's)
    sequences,        // N (the merge kernel's; the persistent forward's)
    // The persistent forward's (AttentionKernelSpec::persistent): its work.
    work_counter,     // unsigned, 0 at the launch: items handed out past the first gridDim.x
    row_blocks,       // ceil(longest query sequence / block_m): items = N * H * row_blocks
  };
  std::string name;
  std::string c_type;
  Type type;
  Role role;
  int input = -1;  // for the input roles: index into AttentionVariant::inputs
  int box_rows = 0;  // tensor_map: tokens per box
};

struct AttentionKernel {
  std::string name;  // the extern "C" symbol
  std::string source;
  std::vector<AttentionParam> params;
  unsigned threads = 0;  // block size
  int block_m = 0;       // grid: attention_grid(N * H, ceil(Tq / block_m)) (varlen: of the longest sequence)
  bool persistent = false;  // grid: attention_persistent_blocks(N * H * ceil(Tq / block_m), SMs), a zeroed work_counter
  int shared_bytes = 0;  // dynamic shared memory per block
  // decode: the merge kernel in the same source (empty name: none) and its parameters.
  std::string merge_name;
  std::vector<AttentionParam> merge_params;
};


// The launch grid of the attention kernels (forward, and the backward's main kernel) over `heads`
// (sequences x heads; x kv heads for the backward) and `blocks` (query row blocks; key blocks for
// the backward): x the heads of a group (4, 2 or 1: what divides heads), y the blocks, z the
// groups; the kernels read head blockIdx.z * gridDim.x + blockIdx.x and block blockIdx.y. Blocks
// start in that order, so a group's heads run their blocks side by side (what they read stays in
// L2; heads varying fastest over the whole grid were slower both ways: bench/RESULTS.md, issue
// 35) and the heaviest blocks of every group start first (causal: the forward's last row blocks,
// the backward's first key blocks), leaving the light ones to fill the tail. Throws InvalidArgument past the grid's
// limits (65535 blocks along y, 65535 groups along z), naming the counts.
struct AttentionGrid {
  unsigned x = 1, y = 1, z = 1;
};
AttentionGrid attention_grid(std::int64_t heads, std::int64_t blocks);
// The persistent forward's grid (AttentionKernelSpec::persistent): one block per SM (its shared
// memory holds one), no more than there are items; x alone. Throws InvalidArgument for items or
// sms below 1, or items past what a 32-bit int counts.
unsigned attention_persistent_blocks(std::int64_t items, int sms);

// decode: the grid of the split kernel (x the splits, y the row blocks of a group's packed rows,
// z the (sequence, key/value head) pairs) and the merge kernel's blocks of 128 threads, one per
// (sequence, head, token) row. Throw InvalidArgument past the grid's limits, naming the counts. A
// call takes at most attention_merge_splits splits (the merge keeps their weights in shared memory).
AttentionGrid attention_decode_grid(std::int64_t splits, std::int64_t row_blocks, std::int64_t groups);
unsigned attention_merge_blocks(std::int64_t rows);
constexpr unsigned attention_merge_threads = 128;
constexpr int attention_merge_splits = 1024;

// Dynamic shared memory a block needs: the K/V stages (sync: the q tile borrows them at the
// start; wgmma: the q tile stays beside them, read by every score product).
int attention_shared_bytes(const AttentionTile& tile, int D, int Dv, bool split_f32);
// ws: the q tiles the persistent form's layout holds, 2 where a second fits within 227 KB (the next
// item's q lands in it while this item's is read), else 1; and a ws kernel's dynamic shared memory
// with q_tiles of them (the grid form holds one; attention_shared_bytes is the larger, for checks).
int attention_ws_q_stages(const AttentionTile& tile, int D, int Dv);
int attention_ws_shared_bytes(const AttentionTile& tile, int D, int Dv, int q_tiles);
// A reasonable tile for these head dims (128 x 64, 8 warps, 2 stages; narrower past D = 128).
AttentionTile default_attention_tile(int D, int Dv);
// What is wrong with a tile for these head dims (empty: usable). max_shared_bytes: the
// device's opt-in limit per block (0: not checked). arch: the target (a wgmma tile needs
// sm_90a or compute_90a, and 16-bit inputs: split_f32 false; empty arch: no wgmma).
std::vector<std::string> validate_attention_tile(const AttentionTile& tile, int D, int Dv, int max_shared_bytes = 0,
                                                 bool split_f32 = false, const std::string& arch = "");
// "block_m=128 block_n=64 warps=8 stages=2" (a wgmma or ws tile adds " mma=wgmma" / " mma=ws")
std::string to_string(const AttentionTile& tile);
// Reads the tools' form "block_m,block_n,warps,stages[,sync|wgmma|ws]"; throws InvalidArgument
// quoting the text otherwise.
AttentionTile parse_attention_tile(const std::string& text);
// Whether q, k, v of these types go through the tensor cores as split bf16 pairs (fp32 inputs).
bool attention_split_f32(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec);

// The logit's leading factor (log2 units) at these scalar values (index-aligned with
// variant.inputs): for a logit log2 e * expression that the kernels form as factor * rest, the
// factor's value, where it is a product of constants and scalar inputs only (score * scale: log2
// e * scale; a soft cap: log2 e * cap); nullopt where the logit has no such factor (a sum at
// its top, a per-head factor). A positive value lets a launcher set positive_logit_factor.
std::optional<double> attention_logit_factor(const ir::AttentionVariant& variant, const std::vector<float>& scalars);

// Throws InvalidArgument for a malformed variant, a tile that fails the rules, or input_types
// of the wrong length.
AttentionKernel generate_attention(const ir::AttentionVariant& variant, const AttentionKernelSpec& spec);

}  // namespace ladle::cuda
