// The kernel a context-parallel call of the recurrent family runs between its collectives
// (ops/context_parallel.h): the fold of the ranks' summaries into the state each piece starts from.
// A rank's summary of a piece of a sequence is what the chunked family's segmented state pass writes
// for a segment (chunked.h): its own final state from zero, L [H][K][V] f32, and its total log2 decay,
// D [H][DL] f32 (DL = chunked_segment_decay_width: K or 1 for the key side, plus V for a value-side
// gate). Over a sequence cut into pieces j = 1, 2, ... in the recurrence's direction, the state after
// piece j is S_j = 2^D_j S_(j-1) + L_j (exact up to rounding: the recurrence is linear in the state
// and a piece's decay is diagonal); the backward's dS folds the same way the other way round.
#pragma once

#include <string>

namespace ladle::cuda {

// The module's source (fixed text, two kernels):
//   ladle_cp_fold(summaries, rank_stride, decays, decay_stride, source, source_type, meta, order, out,
//                 rows_per_rank, H, K, V, decay_width, key_width, value_gate)
// grid (ceil(H K V / 256), rows), 256 threads: out row n [H][K][V] f32 = s after
//   s = source row meta[4n] (f32, bf16 or f16 by source_type 0, 1, 2; zero where meta[4n] < 0),
//   then for c in [meta[4n+1], meta[4n+1] + meta[4n+2]): j = order[c], m = meta[4n+3],
//   s = 2^(D of rank j's row m) s + L of rank j's row m,
// where rank j's summaries start at summaries + j rank_stride (L: [rows_per_rank][H][K][V]) and
// decays + j decay_stride (D: [rows_per_rank][H][decay_width]). D's key part is D[0] (key_width 1)
// or D[k] (key_width K), none for key_width 0; its value part D[key_width + v] where value_gate is 1.
//   ladle_cp_sum_decays(decays, decay_stride, meta, order, out, H, width): grid (ceil(H width / 256),
//                 rows): out row n [H][width] = the sum of the same chain's D (a chain's total decay).
// A rank folds its own pieces' sub-segments with the two (one summary from many state-pass blocks).
std::string context_parallel_source();
inline constexpr const char* context_parallel_fold_kernel = "ladle_cp_fold";
inline constexpr const char* context_parallel_sum_kernel = "ladle_cp_sum_decays";
// ladle_cp_fold_matrix(summaries, rank_stride, transitions, source, source_type, meta, order, out,
//                 rows_per_rank, H, K, V, transpose): the update forms' fold, S = M S + L (M^T S + L with
//                 transpose), M [rows_per_rank][H][K][K] at transitions + j rank_stride; grid (ceil(V / 32),
//                 rows, H), 256 threads, K * 32 floats of shared memory (K <= 256).
inline constexpr const char* context_parallel_matrix_fold_kernel = "ladle_cp_fold_matrix";
// ladle_cp_add(to, to_batch, from, from_batch, n): grid (ceil(n / 256), B): to[b][i] += from[b][i], i < n
// (an attention chunk's key gradients into the whole sequence's, ops/context_parallel.cpp).
inline constexpr const char* context_parallel_add_kernel = "ladle_cp_add";

}  // namespace ladle::cuda
