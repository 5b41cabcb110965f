// The plain form's backward a block of 64 steps at a time, from the states at the blocks' boundaries
// (issue 36; docs/design.md, "Gradients"). The recurrent backward (ops/gpu_backward.cpp) gets the
// gradients of the plain form S_t = diag(a_t) S_(t-1) + k_t v_t^T, o_t = scale S_t^T q_t from three
// recurrences over the slots; the decays' gradients are sums of qs . u - kf . dk, whose terms inside
// a block cancel: dq's and dk's views of the same products dA_ts e^(G_t - G_s) q_t k_s. Taken from two
// recurrences, each rounded to bf16 on its own, they left the gate's gradient 3.5x fla's error. Here
// one block forms both from one set of products in fp32, from
//   S_0, the state entering the block (the forward's, fp32: the split form's chunk states, or h0), and
//   R, the gradient reaching the state after the block, divided by the scale (dv's recurrence's entry
//     state, fp32; d_final / scale after a sequence's last block),
// so that only fp32 rounding is left where the terms cancel:
//   u_t  = scale (e^(G_t) (S_0 do_t) + sum_(s <= t) dA_ts e^(G_t - G_s) . k_s)        (= scale S_t do_t)
//   dk_s = scale (e^(G_L - G_s) (R v_s) + sum_(t >= s) dA_ts e^(G_t - G_s) . q_t)     (= scale dS_s v_s / scale)
// with dA = do v^T (s <= t), G_t the block's log decays summed to step t (per key feature; a head's decay
// broadcast) and G_L = G_(L-1) plus the decay of the step after the block. The products over the
// values (dA, S_0 do^T, R v^T) run on the tensor cores: dA from the 16-bit slots exactly, the states
// split into a bf16 high and low part (two products, about 16 bits of mantissa). The sums over steps
// run in fp32 on the CUDA cores, between 16-step sub-blocks through references at the sub-blocks'
// edges (every factor at most 1: strong decays and hard resets stay exact), inside a sub-block
// element by element.
//
// Entry point ladle_bwd_block_bf16: grid (C, N H), 256 threads, LADLE_BLOCK_SHARED bytes of dynamic
// shared memory; K and V up to 128, bf16 slots. Needs storage.cuh, tensor_core.cuh and block_mma.cuh first.
#ifndef LADLE_PLAIN_BACKWARD
#define LADLE_PLAIN_BACKWARD

#define LADLE_BLOCK_STEPS 64
#define LADLE_BLOCK_FEATURES 128
#define LADLE_BLOCK_LD 136  // 16-bit rows: 128 features and 8 of padding (ldmatrix without bank conflicts)
#define LADLE_BLOCK_LG 132  // fp32 rows of G and of the scaled key / query rows
#define LADLE_BLOCK_LA 68   // fp32 rows of dA
#define LADLE_BLOCK_LOG_FLOOR (-110.0f)  // a log decay below counts as this one (its exp is 0 in fp32; -inf included)

// The dynamic shared memory (bytes): q, k, v, do (16-bit, [64][LD]); the state's high and low parts
// ([128][LD] each); G ([64][LG], log2 units); the scaled rows ([64][LG]); dA ([64][LA]); G_L ([128]).
// A value of a tensor whose type is named by `type` (0 f32, 1 bf16, 2 f16).
__device__ __forceinline__ float ladle_block_load(const void* p, int type, long long at) {
  if (type == 1) return ladle_load(static_cast<const ladle_bf16*>(p) + at);
  if (type == 2) return ladle_load(static_cast<const ladle_f16*>(p) + at);
  return static_cast<const float*>(p)[at];
}

#define LADLE_BLOCK_SHARED (2 * (4 * LADLE_BLOCK_STEPS * LADLE_BLOCK_LD + 2 * LADLE_BLOCK_FEATURES * LADLE_BLOCK_LD) + \
                            4 * (2 * LADLE_BLOCK_STEPS * LADLE_BLOCK_LG + LADLE_BLOCK_STEPS * LADLE_BLOCK_LA + LADLE_BLOCK_FEATURES))

// A [B,T,H,D] tensor by its strides (B = 1 with cu_seqlens: t is the packed token).
struct LadleBlockView {
  const void* data;
  long long sb, st, sh, sd;
};

struct LadleBlockArgs {
  LadleBlockView qs, kf, vf, dos;        // the slots, bf16
  LadleBlockView log_a;                  // the step's log decay per key feature (a head's added; type a_type), or null data
  int a_type;                            // 0 f32, 1 bf16, 2 f16 (log_a and log_a_next)
  const float* log_h;                    // a head's alone [rows], row (b T + t) H + h, or null
  const void* log_a_next;                // the next step's (0 after a sequence's last), [rows][K], read at a block's last step
  int an_type;
  const float* log_h_next;
  const float* s_states;                 // the state entering every block: row s_first[n] - 1 + c (c > 0)
  const long long* s_first;
  const float* h0;                       // block 0's: [N,H,K,V] or null (0)
  const float* d_states;                 // R after block c < chunks - 1: row first[n] + chunks - 2 - c
  const long long* first;
  const float* d_final;                  // after the last block: [N,H,K,V] (d_final / scale) or null (0)
  float scale;
  float* u;                              // scale S_t do_t, [B,T,H,K] by the strides below
  long long u_sb, u_st, u_sh, u_sd;
  float* dk;                             // scale dS_t v_t / scale
  long long dk_sb, dk_st, dk_sh, dk_sd;
  const long long* cu_seqlens;
  int T, H, K, V, reverse;
};

struct LadleBlockBackward {
  static constexpr int C = LADLE_BLOCK_STEPS, F = LADLE_BLOCK_FEATURES, LD = LADLE_BLOCK_LD, LG = LADLE_BLOCK_LG,
                       LA = LADLE_BLOCK_LA;
  static constexpr float log2e = 1.4426950408889634f;

  const LadleBlockArgs& p;
  unsigned short *q, *k, *v, *dO, *hi, *lo;
  float *g, *w, *dA, *gl;
  int n, h, b, L, chunks, c;
  long long bos, eos, s0;

  __device__ LadleBlockBackward(const LadleBlockArgs& args, unsigned char* smem) : p(args) {
    q = reinterpret_cast<unsigned short*>(smem);
    k = q + C * LD, v = k + C * LD, dO = v + C * LD, hi = dO + C * LD, lo = hi + F * LD;
    g = reinterpret_cast<float*>(lo + F * LD), w = g + C * LG, dA = w + C * LG, gl = dA + C * LA;
    n = static_cast<int>(blockIdx.y) / p.H, h = static_cast<int>(blockIdx.y) % p.H, c = static_cast<int>(blockIdx.x);
    if (p.cu_seqlens) b = 0, bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
    else b = n, bos = 0, eos = p.T;
    chunks = static_cast<int>((eos - bos + C - 1) / C);
    s0 = static_cast<long long>(c) * C;
    L = c < chunks ? static_cast<int>(eos - bos - s0 < C ? eos - bos - s0 : C) : 0;
  }

  __device__ long long token(int t) const { return p.reverse ? eos - 1 - (s0 + t) : bos + s0 + t; }
  __device__ long long row(int t) const { return (static_cast<long long>(b) * p.T + token(t)) * p.H + h; }
  __device__ long long at(const LadleBlockView& x, int t, int f) const { return b * x.sb + token(t) * x.st + h * x.sh + f * x.sd; }
  __device__ unsigned short bits(const LadleBlockView& x, int t, int f) const {
    return static_cast<const ladle_bf16*>(x.data)[at(x, t, f)].bits;
  }

  // The slots into shared memory (0 past the block's steps and the features), G in log2 units (past
  // the block's last step: its value there, so that every factor stays at most 1) and G_L.
  __device__ void stage() {
    for (int x = threadIdx.x; x < C * F; x += blockDim.x) {
      const int t = x / F, f = x % F;
      const bool key = t < L && f < p.K, value = t < L && f < p.V;
      q[t * LD + f] = key ? bits(p.qs, t, f) : 0;
      k[t * LD + f] = key ? bits(p.kf, t, f) : 0;
      v[t * LD + f] = value ? bits(p.vf, t, f) : 0;
      dO[t * LD + f] = value ? bits(p.dos, t, f) : 0;
    }
    for (int f = threadIdx.x; f < F; f += blockDim.x) {
      float run = 0.0f;
      for (int t = 0; t < C; ++t) {
        if (t < L && f < p.K) {
          float la = (p.log_a.data ? ladle_block_load(p.log_a.data, p.a_type, at(p.log_a, t, f)) : 0.0f) + (p.log_h ? p.log_h[row(t)] : 0.0f);
          run += (la > LADLE_BLOCK_LOG_FLOOR ? la : LADLE_BLOCK_LOG_FLOOR) * log2e;
        }
        g[t * LG + f] = run;
      }
      float next = 0.0f;
      if (L > 0 && f < p.K) {
        const long long r = row(L - 1);
        next = (p.log_a_next ? ladle_block_load(p.log_a_next, p.an_type, r * p.K + f) : 0.0f) + (p.log_h_next ? p.log_h_next[r] : 0.0f);
        next = next > LADLE_BLOCK_LOG_FLOOR ? next : LADLE_BLOCK_LOG_FLOOR;
      }
      gl[f] = run + next * log2e;
    }
  }

  // A [K][V] fp32 state (null: 0) as its bf16 high and low parts, [i][j] (the products' B as [n][k]).
  __device__ void stage_state(const float* state) {
    for (int x = threadIdx.x; x < F * F; x += blockDim.x) {
      const int i = x / F, j = x % F;
      const float s = state && i < p.K && j < p.V ? state[static_cast<long long>(i) * p.V + j] : 0.0f;
      const unsigned short top = ladle_bf16_bits(s);
      hi[i * LD + j] = top;
      lo[i * LD + j] = ladle_bf16_bits(s - ladle_bf16_float(top));
    }
  }

  __device__ const float* entry_state() const {
    const long long area = static_cast<long long>(p.K) * p.V;
    if (c == 0) return p.h0 ? p.h0 + blockIdx.y * area : nullptr;
    return p.s_states + ((p.s_first[n] - 1 + c) * p.H + h) * area;
  }
  __device__ const float* exit_gradient() const {
    const long long area = static_cast<long long>(p.K) * p.V;
    if (c == chunks - 1) return p.d_final ? p.d_final + blockIdx.y * area : nullptr;
    return p.d_states + ((p.first[n] + chunks - 2 - c) * p.H + h) * area;
  }

  // dA = do v^T on and below the diagonal (8 warps, one 16 x 32 tile each).
  __device__ void scores() {
    const int warp = threadIdx.x >> 5, m0 = (warp >> 1) * 16, n0 = (warp & 1) * 32;
    LadleTileAcc acc;
    ladle_tile_zero(acc);
    ladle_tile_mma<false, false>(acc, dO, LD, v, LD, m0, n0, F);
    ladle_tile_each(acc, m0, n0, [&](int t, int s, float x) { dA[t * LA + s] = s <= t ? x : 0.0f; });
  }

  // w[s] = k_s e^(G_r - G_s), r the last step of s's sub-block (keys = true), or w[t] = q_t e^(G_t - G_p),
  // p the step before t's sub-block (t >= 16).
  __device__ void scaled(bool keys) {
    for (int x = threadIdx.x; x < C * F; x += blockDim.x) {
      const int t = x / F, f = x % F;
      const int ref = keys ? (t | 15) : (t & ~15) - 1;
      float value = 0.0f;
      if (ref >= 0) {
        const float base = ladle_bf16_float(keys ? k[t * LD + f] : q[t * LD + f]);
        value = base * ladle_exp2(keys ? g[ref * LG + f] - g[t * LG + f] : g[t * LG + f] - g[ref * LG + f]);
      }
      w[t * LG + f] = value;
    }
  }

  // sum_(s <= t) dA_ts e^(G_t - G_s) k_s at feature f: the earlier sub-blocks through w (the keys
  // scaled to their sub-block's last step) and e^(G_p - G_r) between references, then t's own.
  __device__ float intra_u(int t, int f) const {
    const int bt = t >> 4;
    float total = 0.0f;
    if (bt > 0) {
      const float gp = g[(16 * bt - 1) * LG + f];
      for (int bs = 0; bs < bt; ++bs) {
        float sum = 0.0f;
        LADLE_UNROLL
        for (int s = 16 * bs; s < 16 * bs + 16; ++s) sum += dA[t * LA + s] * w[s * LG + f];
        total += ladle_exp2(gp - g[(16 * bs + 15) * LG + f]) * sum;
      }
      total *= ladle_exp2(g[t * LG + f] - gp);
    }
    const float gt = g[t * LG + f];
    for (int s = 16 * bt; s <= t; ++s) total += dA[t * LA + s] * ladle_exp2(gt - g[s * LG + f]) * ladle_bf16_float(k[s * LD + f]);
    return total;
  }

  // sum_(t >= s) dA_ts e^(G_t - G_s) q_t at feature f: the later sub-blocks through w (the queries
  // scaled to the step before their sub-block), then s's own.
  __device__ float intra_dk(int s, int f) const {
    const int bs = s >> 4;
    float total = 0.0f;
    if (bs < 3) {
      const float gr = g[(16 * bs + 15) * LG + f];
      for (int bt = bs + 1; bt < 4; ++bt) {
        float sum = 0.0f;
        LADLE_UNROLL
        for (int t = 16 * bt; t < 16 * bt + 16; ++t) sum += dA[t * LA + s] * w[t * LG + f];
        total += ladle_exp2(g[(16 * bt - 1) * LG + f] - gr) * sum;
      }
      total *= ladle_exp2(gr - g[s * LG + f]);
    }
    const float gs = g[s * LG + f];
    for (int t = s; t < 16 * bs + 16; ++t) total += dA[t * LA + s] * ladle_exp2(g[t * LG + f] - gs) * ladle_bf16_float(q[t * LD + f]);
    return total;
  }

  // out[t][f] = scale (e^(factor) (A state^T)[t][f] + intra(t, f)) for t < L, f < K: A (do or v) times
  // the staged state's two parts, each warp two 16 x 32 tiles of the [64][128] result.
  template <bool U>
  __device__ void finish(float* out, long long sb, long long st, long long sh, long long sd) {
    const unsigned short* A = U ? dO : v;
    ladle_tiles(C, F, [&](int m0, int n0) {
      LadleTileAcc acc;
      ladle_tile_zero(acc);
      ladle_tile_mma<false, false>(acc, A, LD, hi, LD, m0, n0, F);
      ladle_tile_mma<false, false>(acc, A, LD, lo, LD, m0, n0, F);
      ladle_tile_each(acc, m0, n0, [&](int t, int f, float x) {
        if (t >= L || f >= p.K) return;
        const float decay = U ? ladle_exp2(g[t * LG + f]) : ladle_exp2(gl[f] - g[t * LG + f]);
        const float value = p.scale * (decay * x + (U ? intra_u(t, f) : intra_dk(t, f)));
        out[b * sb + token(t) * st + h * sh + f * sd] = value;
      });
    });
  }

  __device__ void run() {
    if (L <= 0) return;
    stage();
    stage_state(entry_state());
    __syncthreads();
    scores();
    scaled(true);
    __syncthreads();
    finish<true>(p.u, p.u_sb, p.u_st, p.u_sh, p.u_sd);
    __syncthreads();
    stage_state(exit_gradient());
    scaled(false);
    __syncthreads();
    finish<false>(p.dk, p.dk_sb, p.dk_st, p.dk_sh, p.dk_sd);
  }
};

extern "C" __global__ void __launch_bounds__(256) ladle_bwd_block_bf16(
    const void* qs, long long q_sb, long long q_st, long long q_sh, long long q_sd, const void* kf, long long k_sb, long long k_st,
    long long k_sh, long long k_sd, const void* vf, long long v_sb, long long v_st, long long v_sh, long long v_sd, const void* dos,
    long long o_sb, long long o_st, long long o_sh, long long o_sd, const void* log_a, long long a_sb, long long a_st, long long a_sh,
    long long a_sd, int a_type, const float* __restrict__ log_h, const void* __restrict__ log_a_next, int an_type,
    const float* __restrict__ log_h_next, const float* __restrict__ s_states, const long long* __restrict__ s_first,
    const float* __restrict__ h0, const float* __restrict__ d_states, const long long* __restrict__ first,
    const float* __restrict__ d_final, float scale, float* __restrict__ u, long long u_sb, long long u_st, long long u_sh,
    long long u_sd, float* __restrict__ dk, long long dk_sb, long long dk_st, long long dk_sh, long long dk_sd,
    const long long* __restrict__ cu_seqlens, int T, int H, int K, int V, int reverse) {
  LADLE_DYNAMIC_SHARED(smem);
  const LadleBlockArgs args{{qs, q_sb, q_st, q_sh, q_sd}, {kf, k_sb, k_st, k_sh, k_sd}, {vf, v_sb, v_st, v_sh, v_sd},
                            {dos, o_sb, o_st, o_sh, o_sd}, {log_a, a_sb, a_st, a_sh, a_sd}, a_type, log_h, log_a_next, an_type,
                            log_h_next, s_states, s_first, h0, d_states, first, d_final, scale, u, u_sb, u_st, u_sh, u_sd, dk,
                            dk_sb, dk_st, dk_sh, dk_sd, cu_seqlens, T, H, K, V, reverse};
  LadleBlockBackward block(args, smem);
  block.run();
}

#endif  // LADLE_PLAIN_BACKWARD
