// Products of bf16 tiles in shared memory on mma.sync (m16n8k16, fp32 accumulators), for kernels that
// chain many small products a block (the chunked WY backward, wy_backward.cuh). A warp owns a 16 x 32
// tile of the result at a time: ladle_tiles hands a block's warps the tiles of an M x N result,
// ladle_tile_mma adds A B over a depth to the tile's accumulators, ladle_tile_each visits them.
// Either operand may be stored either way round, so that no product needs a transposed copy:
// A as [m][k] or [k][m] (ldmatrix .trans), B as [n][k] or [k][n] (.trans). Rows 16-byte aligned,
// their stride a multiple of 8 elements (padded by 8 against bank conflicts). Needs tensor_core.cuh.
#ifndef LADLE_BLOCK_MMA
#define LADLE_BLOCK_MMA

typedef float LadleTileAcc[4][4];  // [n8 block j][fragment register]: rows l/4 (0, 1) and l/4 + 8 (2, 3)

__device__ __forceinline__ void ladle_tile_zero(LadleTileAcc& acc) {
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.0f;
}

// acc += A B for the tile at (m0, n0), over k in [0, depth) (a multiple of 16). A_KM: A stored
// [k][m] (row stride lda), else [m][k]; B_KN: B stored [k][n], else [n][k].
template <bool A_KM, bool B_KN>
__device__ __forceinline__ void ladle_tile_mma(LadleTileAcc& acc, const unsigned short* A, int lda, const unsigned short* B, int ldb,
                                               int m0, int n0, int depth) {
  const int l = threadIdx.x & 31, row8 = l & 7, second = (l >> 3) & 1, upper = l >> 4;
  // This lane's row addresses in the shared window (32-bit), each k step a constant offset on.
  const unsigned a = ladle_shared_address(A_KM ? A + (row8 + upper * 8) * lda + m0 + second * 8 : A + (m0 + row8 + second * 8) * lda + upper * 8);
  const unsigned b = ladle_shared_address(B_KN ? B + (row8 + second * 8) * ldb + n0 + upper * 8 : B + (n0 + row8 + upper * 8) * ldb + second * 8);
  const unsigned a_step = 2u * (A_KM ? 16u * lda : 16u), b_step = 2u * (B_KN ? 16u * ldb : 16u), b_next = 2u * (B_KN ? 16u : 16u * ldb);
  for (int k0 = 0; k0 < depth; k0 += 16) {
    const unsigned ak = a + (k0 / 16) * a_step, bk = b + (k0 / 16) * b_step;
    unsigned af[4];  // matrices (m, k), (m + 8, k), (m, k + 8), (m + 8, k + 8)
    if (A_KM) ladle_ldmatrix_x4_trans_at(af, ak);
    else ladle_ldmatrix_x4_at(af, ak);
    LADLE_UNROLL
    for (int p = 0; p < 2; ++p) {
      unsigned bf[4];  // n blocks 2p and 2p + 1: (k, n), (k + 8, n), then the same at n + 8
      if (B_KN) ladle_ldmatrix_x4_trans_at(bf, bk + p * b_next);
      else ladle_ldmatrix_x4_at(bf, bk + p * b_next);
      ladle_mma_bf16(acc[2 * p], af, bf[0], bf[1]);
      ladle_mma_bf16(acc[2 * p + 1], af, bf[2], bf[3]);
    }
  }
}

// f(row, column, value, next) for the tile's values in pairs of adjacent columns (column even).
template <class F>
__device__ __forceinline__ void ladle_tile_each_pair(const LadleTileAcc& acc, int m0, int n0, F&& f) {
  const int l = threadIdx.x & 31;
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int h = 0; h < 2; ++h) f(m0 + (l >> 2) + h * 8, n0 + 8 * j + 2 * (l & 3), acc[j][2 * h], acc[j][2 * h + 1]);
}

// f(row, column, value) for the tile's 16 values this lane holds: rows m0 + l/4 and m0 + l/4 + 8,
// columns n0 + 8j + 2(l % 4) and the one after.
template <class F>
__device__ __forceinline__ void ladle_tile_each(const LadleTileAcc& acc, int m0, int n0, F&& f) {
  ladle_tile_each_pair(acc, m0, n0, [&](int r, int c, float x, float y) {
    f(r, c, x);
    f(r, c + 1, y);
  });
}

// f(m0, n0) for each 16 x 32 tile of an M x N result (M a multiple of 16, N of 32) this warp owns.
template <class F>
__device__ __forceinline__ void ladle_tiles(int M, int N, F&& f) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, across = N / 32;
  for (int t = warp; t < (M / 16) * across; t += warps) f((t / across) * 16, (t % across) * 32);
}

// out[m0 + l/4] += top and out[m0 + l/4 + 8] += bottom summed over the tile's four lanes of a row
// (a row's 32 columns): the sums of a tile's rows, added into shared memory.
__device__ __forceinline__ void ladle_tile_rows_add(float* out, int m0, float top, float bottom) {
  top += __shfl_xor_sync(0xffffffffu, top, 1);
  top += __shfl_xor_sync(0xffffffffu, top, 2);
  bottom += __shfl_xor_sync(0xffffffffu, bottom, 1);
  bottom += __shfl_xor_sync(0xffffffffu, bottom, 2);
  const int l = threadIdx.x & 31;
  if ((l & 3) == 0) {
    atomicAdd(out + m0 + (l >> 2), top);
    atomicAdd(out + m0 + (l >> 2) + 8, bottom);
  }
}

// out[n0 + 8j + 2(l % 4) + e] += cols[j][e] summed over the tile's eight lanes of a column (its 16
// rows, two a lane): the sums of a tile's columns, added into shared memory by four lanes.
__device__ __forceinline__ void ladle_tile_cols_add(float* out, int n0, float (&cols)[4][2]) {
  const int l = threadIdx.x & 31;
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int e = 0; e < 2; ++e)
      for (int off = 4; off < 32; off <<= 1) cols[j][e] += __shfl_xor_sync(0xffffffffu, cols[j][e], off);
  if (l < 4)
    LADLE_UNROLL
    for (int j = 0; j < 4; ++j)
      LADLE_UNROLL
      for (int e = 0; e < 2; ++e) atomicAdd(out + n0 + 8 * j + 2 * l + e, cols[j][e]);
}

#endif  // LADLE_BLOCK_MMA
