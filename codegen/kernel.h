// The vocabulary every CUDA kernel family shares: what a kernel is specialised for besides its
// variant and tile (KernelTypes), and each kernel parameter with the role that tells a launcher
// what to pass for it (KernelParam). The fused-recurrent, chunked, chunked delta-rule and backward
// families all speak it; it lives here rather than in one family's header.
#pragma once

#include <string>
#include <vector>

#include <ladle/tensor/dtype.h>

namespace ladle::cuda {

// What a kernel is specialised for besides the variant and its tile: dtypes and
// launch-time choices that change the code (compile-time constants in the kernel). Shared by
// the fused-recurrent and chunked families.
struct KernelTypes {
  std::vector<DType> input_types;  // one per variant input: f32, f16 or bf16 (scalars: ignored)
  DType output_type = DType::f32;
  bool reverse = false;
  bool varlen = false;                   // cu_seqlens [N+1]
  DType cu_seqlens_type = DType::i64;
  bool initial_state = false;            // [N,H,K,V] contiguous
  DType initial_state_type = DType::f32;
  bool final_state = false;              // [N,H,K,V] contiguous f32
};

// One kernel parameter and what a launcher passes for it.
struct KernelParam {
  enum class Type { pointer, i64, i32, f32, tensor_map };
  enum class Role {
    input,            // the data pointer of variant input `input` (a float for a scalar input)
    input_stride_b,   // its strides in elements, as in the canonical views of the CPU path:
    input_stride_t,   //   token_key/value [B,T,X,D], token_head [B,T,X], head [B,H] (stride_b 0
    input_stride_h,   //   for an [H] parameter)
    input_stride_d,
    input_heads,      // X, its number of heads
    output,           // o and its strides [B,T,H,V]
    output_stride_b,
    output_stride_t,
    output_stride_h,
    output_stride_d,
    initial_state,    // [N,H,K,V], contiguous
    final_state,      // [N,H,K,V], contiguous, f32
    cu_seqlens,       // [N+1]
    batch,            // B, T, H, K, V
    tokens,
    heads,
    key_dim,
    value_dim,
    chunk_states,     // the chunked family's split form: the state entering every chunk,
                      //   [chunks][H][K][V] contiguous (bf16 or f32)
    chunk_offsets,    // [N+1] long long: the first chunk of each packed sequence (varlen)
    sequences,        // N
    segments,         // the chunked family's segments: [S][8] long long, see ChunkedSegments
    segment_states,   //   [S'][H][K][V] f32: each earlier segment's own final state (from zero)
    segment_decay,    //   [S'][H][DL] f32: its total log2 decay (key side, then value side)
    input_tensor_map, // the chunked family's ws form: the TMA map of input `input` (q, k or v) as
                      //   [B,T,X,D], boxes of 64 features by box_rows tokens (runtime/tensor_map.h)
    delta_w,          // the chunked delta rule's work arrays (codegen/cuda/chunked_delta.h): W, U,
    delta_u,          //   k (normalised), E and the state entering the chunk h of every chunk, bf16,
    delta_k,          //   and the chunk's cumulative log decay gamma, f32
    delta_e,
    delta_h,
    delta_gamma,
  };
  std::string name;
  std::string c_type;  // "const ladle_bf16*", "long long", "float", ...
  Type type;
  Role role;
  int input = -1;      // for the input roles: index into Variant::inputs
  int box_rows = 0;    // input_tensor_map: tokens per box
};

}  // namespace ladle::cuda
