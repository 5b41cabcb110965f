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
// split into a bf16 high and low part in registers (two products, about 16 bits of mantissa). The sums
// over steps between 16-step sub-blocks run on the tensor cores too, through references at the
// sub-blocks' edges (every factor at most 1: strong decays and hard resets stay exact), both operands
// split into high and low parts (three products); inside a sub-block they run element by element in
// fp32, a thread per (sub-block, feature) forming u's and dk's terms from one exponential each.
//
// Entry point ladle_bwd_block_bf16: grid (C, N H, ceil(K / 64)): a block takes 64 key features of a
// 64-step block; 256 threads, two blocks an SM, LADLE_BLOCK_SHARED bytes of dynamic shared memory;
// K and V up to 128, bf16 slots. Needs storage.cuh, tensor_core.cuh and block_mma.cuh first.
#ifndef LADLE_PLAIN_BACKWARD
#define LADLE_PLAIN_BACKWARD

#define LADLE_BLOCK_STEPS 64
#define LADLE_BLOCK_FEATURES 128     // K and V at most
#define LADLE_BLOCK_KEYS 64          // key features a block
#define LADLE_BLOCK_LQ 72            // 16-bit rows of q, k ([64 steps][64 features]) and of dA's parts ([64][64])
#define LADLE_BLOCK_LW 66            // 16-bit rows of the scaled rows ([64 features][64 steps]; 33 words: no bank conflicts)
#define LADLE_BLOCK_LV 136           // 16-bit rows of v, do ([64][128]; 8 of padding: ldmatrix without bank conflicts)
#define LADLE_BLOCK_LG 68            // fp32 rows of G
#define LADLE_BLOCK_LOG_FLOOR (-110.0f)  // a log decay below counts as this one (its exp is 0 in fp32; -inf included)

// The dynamic shared memory (bytes): q, k and dA's bf16 high and low parts ([64][LQ], 16-bit); v, do
// ([64][LV]); the scaled rows' high and low parts ([64][LW] each); G ([64][LG], fp32, log2 units); dA's
// diagonal 16 x 16 blocks ([4][16][17], fp32); E ([6][64]); G_L ([64]).
#define LADLE_BLOCK_SHARED \
  (2 * (4 * LADLE_BLOCK_STEPS * LADLE_BLOCK_LQ + 2 * LADLE_BLOCK_KEYS * LADLE_BLOCK_LW + 2 * LADLE_BLOCK_STEPS * LADLE_BLOCK_LV) + \
   4 * (LADLE_BLOCK_STEPS * LADLE_BLOCK_LG + 4 * 16 * 17 + 7 * LADLE_BLOCK_KEYS))

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

struct alignas(8) LadleBlockPair {
  float x, y;
};

// x as its bf16 high part and the bf16 of what remains (a pair packed for an mma fragment register).
__device__ __forceinline__ void ladle_block_split(float x0, float x1, unsigned& hi, unsigned& lo) {
  hi = ladle_pack_bf16(x0, x1);
  lo = ladle_pack_bf16(x0 - ladle_bf16_float(static_cast<unsigned short>(hi & 0xffffu)),
                       x1 - ladle_bf16_float(static_cast<unsigned short>(hi >> 16)));
}

// A block's tiles: where its steps and features are, the slots and G in shared memory, and the boundary
// states it reads.
struct LadleBlockTiles {
  static constexpr int C = LADLE_BLOCK_STEPS, F = LADLE_BLOCK_KEYS, VP = LADLE_BLOCK_FEATURES, LQ = LADLE_BLOCK_LQ,
                       LW = LADLE_BLOCK_LW, LV = LADLE_BLOCK_LV, LG = LADLE_BLOCK_LG;
  static constexpr float log2e = 1.4426950408889634f;

  const LadleBlockArgs& p;
  unsigned short *q, *k, *ahi, *alo, *v, *dO, *whi, *wlo;
  float *g, *dd, *e, *gl;
  int n, h, b, L, chunks, c, f0, lane, warp;
  long long bos, eos, s0;

  __device__ LadleBlockTiles(const LadleBlockArgs& args, unsigned char* smem) : p(args) {
    q = reinterpret_cast<unsigned short*>(smem);
    k = q + C * LQ, ahi = k + C * LQ, alo = ahi + C * LQ, v = alo + C * LQ, dO = v + C * LV, whi = dO + C * LV, wlo = whi + F * LW;
    g = reinterpret_cast<float*>(wlo + F * LW), dd = g + C * LG, e = dd + 4 * 16 * 17, gl = e + 6 * F;
    n = static_cast<int>(blockIdx.y) / p.H, h = static_cast<int>(blockIdx.y) % p.H, c = static_cast<int>(blockIdx.x);
    f0 = static_cast<int>(blockIdx.z) * F;
    lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    if (p.cu_seqlens) b = 0, bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
    else b = n, bos = 0, eos = p.T;
    chunks = static_cast<int>((eos - bos + C - 1) / C);
    s0 = static_cast<long long>(c) * C;
    L = c < chunks ? static_cast<int>(eos - bos - s0 < C ? eos - bos - s0 : C) : 0;
  }

  __device__ long long token(int t) const { return p.reverse ? eos - 1 - (s0 + t) : bos + s0 + t; }
  __device__ long long row(int t) const { return (static_cast<long long>(b) * p.T + token(t)) * p.H + h; }
  __device__ long long at(const LadleBlockView& x, int t, int f) const { return b * x.sb + token(t) * x.st + h * x.sh + f * x.sd; }

  // Eight 16-bit values of step t's row of x (features f ... f + 7, 0 from count on, and 0 past the block's
  //    steps) into shared memory at dst (16-byte aligned): one 16-byte cp.async where the row is contiguous
  //    and aligned there (complete at the caller's wait), else one load a value.
  __device__ void stage8(unsigned short* dst, const LadleBlockView& x, int t, int f, int count) const {
    ladle_u4 w{0u, 0u, 0u, 0u};
    if (t < L && f < count) {
      const ladle_bf16* src = static_cast<const ladle_bf16*>(x.data) + at(x, t, f);
      if (x.sd == 1 && f + 8 <= count && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0) {
        ladle_cp_async_16(dst, src);
        return;
      }
      unsigned bits[8];
      LADLE_UNROLL
      for (int u = 0; u < 8; ++u) bits[u] = f + u < count ? src[u * x.sd].bits : 0u;
      w = ladle_u4{bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16), bits[4] | (bits[5] << 16), bits[6] | (bits[7] << 16)};
    }
    ladle_st16(dst, w);
  }

  // Eight log decays of step t (features f0 + f ...) of a live row: where the row is contiguous and aligned,
  //    copied as stored by cp.async into raw (32 bytes a task: f32, or 16-bit in the first 16; complete at
  //    the caller's wait) and true returned; else read one value at a time into la (false).
  __device__ bool decays8(unsigned char* raw, float (&la)[8], int t, int f) const {
    const long long a0 = at(p.log_a, t, f0 + f);
    const bool whole = p.log_a.sd == 1 && f0 + f + 8 <= p.K;
    const unsigned char* const src = static_cast<const unsigned char*>(p.log_a.data) + a0 * (p.a_type == 0 ? 4 : 2);
    if (whole && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0) {
      ladle_cp_async_16(raw, src);
      if (p.a_type == 0) ladle_cp_async_16(raw + 16, src + 16);
      return true;
    }
    LADLE_UNROLL
    for (int u = 0; u < 8; ++u) la[u] = f0 + f + u < p.K ? ladle_load_typed(p.log_a.data, p.a_type, a0 + u * p.log_a.sd) : 0.0f;
    return false;
  }

  // 1. The slots into shared memory (0 past the block's steps and the features), 16 bytes a thread at a
  //    time, and the log decays as stored (into the scaled rows' space, free until scaled()), all in
  //    flight at once; then G: each feature's log decays (floored, log2 units) summed along the block
  //    (past its last step: its value there, so that every factor stays at most 1), and G_L.
  __device__ void stage() {
    LADLE_UNROLL
    for (int i = 0; i < C * (F / 8) / 256; ++i) {  // 2 tasks a thread (256 threads)
      const int x = threadIdx.x + 256 * i, t = x / (F / 8), f = 8 * (x % (F / 8));
      stage8(q + t * LQ + f, p.qs, t, f0 + f, p.K);
      stage8(k + t * LQ + f, p.kf, t, f0 + f, p.K);
    }
    unsigned char* const raw = reinterpret_cast<unsigned char*>(whi);  // [64 steps][64 features] x 4 bytes <= 2 F LW x 2
    bool copied[C * (F / 8) / 256];
    float la[C * (F / 8) / 256][8];
    LADLE_UNROLL
    for (int i = 0; i < C * (F / 8) / 256; ++i) {
      const int x = threadIdx.x + 256 * i, t = x / (F / 8), f = 8 * (x % (F / 8));
      copied[i] = false;
      LADLE_UNROLL
      for (int u = 0; u < 8; ++u) la[i][u] = 0.0f;
      if (t < L && f0 + f < p.K && p.log_a.data) copied[i] = decays8(raw + 4 * (t * F + f), la[i], t, f);
    }
    LADLE_UNROLL
    for (int i = 0; i < C * (VP / 8) / 256; ++i) {  // 4 tasks a thread
      const int x = threadIdx.x + 256 * i, t = x / (VP / 8), j = 8 * (x % (VP / 8));
      stage8(v + t * LV + j, p.vf, t, j, p.V);
      stage8(dO + t * LV + j, p.dos, t, j, p.V);
    }
    ladle_cp_async_commit();
    float head[C * (F / 8) / 256];
    LADLE_UNROLL
    for (int i = 0; i < C * (F / 8) / 256; ++i) {
      const int x = threadIdx.x + 256 * i, t = x / (F / 8), f = 8 * (x % (F / 8));
      head[i] = t < L && f0 + f < p.K && p.log_h ? p.log_h[row(t)] : 0.0f;
    }
    ladle_cp_async_wait<0>();  // each thread converts the decays it copied itself: no barrier before
    LADLE_UNROLL
    for (int i = 0; i < C * (F / 8) / 256; ++i) {
      const int x = threadIdx.x + 256 * i, t = x / (F / 8), f = 8 * (x % (F / 8));
      const unsigned char* const at_ = raw + 4 * (t * F + f);
      if (copied[i]) {
        if (p.a_type == 0) {
          const ladle_f4 lo4 = ladle_ld4(reinterpret_cast<const float*>(at_)), hi4 = ladle_ld4(reinterpret_cast<const float*>(at_) + 4);
          la[i][0] = lo4.x, la[i][1] = lo4.y, la[i][2] = lo4.z, la[i][3] = lo4.w, la[i][4] = hi4.x, la[i][5] = hi4.y, la[i][6] = hi4.z,
          la[i][7] = hi4.w;
        } else if (p.a_type == 1) {
          ladle_unpack8_bf16(la[i], ladle_ld16(reinterpret_cast<const unsigned short*>(at_)));
        } else {
          ladle_unpack8_f16(la[i], ladle_ld16(reinterpret_cast<const unsigned short*>(at_)));
        }
      }
      const bool live = t < L && f0 + f < p.K;
      LADLE_UNROLL
      for (int u = 0; u < 8; ++u) {
        const float x_ = la[i][u] + head[i];
        g[t * LG + f + u] = live && f0 + f + u < p.K ? (x_ > LADLE_BLOCK_LOG_FLOOR ? x_ : LADLE_BLOCK_LOG_FLOOR) * log2e : 0.0f;
      }
    }
    __syncthreads();
    // G: four threads a feature, each summing 16 steps, then the parts before each added.
    {
      const int f = threadIdx.x % F, part = threadIdx.x / F;
      float run = 0.0f;
      LADLE_UNROLL
      for (int t = 16 * part; t < 16 * part + 16; ++t) g[t * LG + f] = run += g[t * LG + f];
      dd[threadIdx.x] = run;  // dd is free until scores()
      __syncthreads();
      float before = 0.0f;
      for (int q_ = 0; q_ < part; ++q_) before += dd[q_ * F + f];
      if (part > 0)
        LADLE_UNROLL
        for (int t = 16 * part; t < 16 * part + 16; ++t) g[t * LG + f] += before;
      __syncthreads();
    }
    if (static_cast<int>(threadIdx.x) < F) {
      const int f = threadIdx.x;
      const float run = g[(C - 1) * LG + f];
      float next = 0.0f;
      if (f0 + f < p.K) {
        const long long r = row(L - 1);
        next = (p.log_a_next ? ladle_load_typed(p.log_a_next, p.an_type, r * p.K + f0 + f) : 0.0f) + (p.log_h_next ? p.log_h_next[r] : 0.0f);
        next = next > LADLE_BLOCK_LOG_FLOOR ? next : LADLE_BLOCK_LOG_FLOOR;
      }
      gl[f] = run + next * log2e;
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

};

// The products: dA, the diagonal sub-blocks, the scaled rows and the two outputs (the steps of run()).
struct LadleBlockBackward : LadleBlockTiles {
  using LadleBlockTiles::LadleBlockTiles;

  // 2. dA = do v^T on and below the diagonal (8 warps, one 16 x 32 tile each) as bf16 high and low parts, its
  //    diagonal blocks in fp32 too; E[bt, bs] = e^(G_p - G_r) between
  //    the step before sub-block bt (p) and the last of sub-block bs (r), bs < bt, at index bt (bt - 1) / 2 + bs.
  __device__ void scores() {
    const int m0 = (warp >> 1) * 16, n0 = (warp & 1) * 32;
    LadleTileAcc acc;
    ladle_tile_zero(acc);
    ladle_tile_mma<false, false>(acc, dO, LV, v, LV, m0, n0, VP);
    ladle_tile_each_pair(acc, m0, n0, [&](int t, int s, float x0, float x1) {
      x0 = s <= t ? x0 : 0.0f, x1 = s + 1 <= t ? x1 : 0.0f;
      unsigned hi, lo;
      ladle_block_split(x0, x1, hi, lo);
      *reinterpret_cast<unsigned*>(ahi + t * LQ + s) = hi;
      *reinterpret_cast<unsigned*>(alo + t * LQ + s) = lo;
      if ((t >> 4) == (s >> 4)) {
        float* const block = dd + (t >> 4) * 16 * 17 + (t & 15) * 17 + (s & 15);
        block[0] = x0, block[1] = x1;
      }
    });
    for (int x = threadIdx.x; x < 6 * F; x += blockDim.x) {
      const int pair = x / F, f = x % F, bt = pair < 1 ? 1 : pair < 3 ? 2 : 3, bs = pair - bt * (bt - 1) / 2;
      e[x] = ladle_exp2(g[(16 * bt - 1) * LG + f] - g[(16 * bs + 15) * LG + f]);
    }
  }

  // 3. Inside each 16-step sub-block, a thread per (sub-block, feature): for s <= t, x = dA_ts e^(G_t - G_s)
  //    adds x k_s into u's t and x q_t into dk's s, both written to u and dk as partial sums (the
  //    epilogues add the rest). One exponential a pair serves both.
  __device__ void diagonal() {
    const int sb = threadIdx.x / F, f = threadIdx.x % F, base = 16 * sb;
    float gv[16], qv[16], kv[16], ud[16], kd[16];
    LADLE_UNROLL
    for (int t = 0; t < 16; ++t) {
      gv[t] = g[(base + t) * LG + f];
      qv[t] = ladle_bf16_float(q[(base + t) * LQ + f]);
      kv[t] = ladle_bf16_float(k[(base + t) * LQ + f]);
      ud[t] = kd[t] = 0.0f;
    }
    LADLE_UNROLL
    for (int t = 0; t < 16; ++t)
      LADLE_UNROLL
      for (int s = 0; s <= t; ++s) {
        const float x = dd[sb * 16 * 17 + t * 17 + s] * ladle_exp2(gv[t] - gv[s]);
        ud[t] += x * kv[s];
        kd[s] += x * qv[t];
      }
    if (f0 + f < p.K && base < L) {  // a step's row is the previous one's plus or minus a token stride
      float* pu = p.u + b * p.u_sb + token(base) * p.u_st + h * p.u_sh + (f0 + f) * p.u_sd;
      float* pk = p.dk + b * p.dk_sb + token(base) * p.dk_st + h * p.dk_sh + (f0 + f) * p.dk_sd;
      const long long su = p.reverse ? -p.u_st : p.u_st, sk = p.reverse ? -p.dk_st : p.dk_st;
      LADLE_UNROLL
      for (int t = 0; t < 16; ++t) {
        if (base + t < L) *pu = ud[t], *pk = kd[t];
        pu += su, pk += sk;
      }
    }
  }

  // The scaled rows, transposed ([feature][step], rows LW apart) as bf16 high and low parts: keys (k_s e^(G_r - G_s),
  // r the last step of s's sub-block) or queries (q_t e^(G_t - G_p), p the step before t's sub-block; 0 in the
  // first). A thread two steps of a feature: one 4-byte store of each part.
  __device__ void scaled(bool keys) {
    LADLE_UNROLL_2
    for (int i = 0; i < C * F / 2 / 256; ++i) {  // 8 tasks a thread
      const int x = threadIdx.x + 256 * i, f = x % F, t = 2 * (x / F);
      float value[2];
      LADLE_UNROLL
      for (int u = 0; u < 2; ++u) {
        const int ref = keys ? ((t + u) | 15) : ((t + u) & ~15) - 1;
        const float base = ladle_bf16_float(keys ? k[(t + u) * LQ + f] : q[(t + u) * LQ + f]);
        const float d = keys ? g[ref * LG + f] - g[(t + u) * LG + f] : g[(t + u) * LG + f] - g[(ref < 0 ? 0 : ref) * LG + f];
        value[u] = ref >= 0 ? base * ladle_exp2(d) : 0.0f;
      }
      unsigned hi, lo;
      ladle_block_split(value[0], value[1], hi, lo);
      *reinterpret_cast<unsigned*>(whi + f * LW + t) = hi;
      *reinterpret_cast<unsigned*>(wlo + f * LW + t) = lo;
    }
  }

  // The state's B fragments of this lane (k = value column j, n = feature: the state's row f0 + 8 warp +
  //    lane / 4), every load issued here, before scaled(): finish() finds them arrived.
  __device__ void load_state(const float* state, float (&sv)[8][4]) const {
    const int fs = f0 + 8 * warp + (lane >> 2), c2 = 2 * (lane & 3);
    const bool live_row = state && fs < p.K;
    LADLE_UNROLL
    for (int k0 = 0; k0 < 8; ++k0)
      LADLE_UNROLL
      for (int i = 0; i < 4; i += 2) {  // columns j and j + 1 (j even): one 8-byte load where V is even
        const int j = 16 * k0 + c2 + 8 * (i >> 1);
        const float* const at_ = state + static_cast<long long>(fs) * p.V + j;
        if (live_row && j + 1 < p.V && (p.V & 1) == 0) {
          const LadleBlockPair pair = *reinterpret_cast<const LadleBlockPair*>(at_);
          sv[k0][i] = pair.x, sv[k0][i + 1] = pair.y;
        } else {
          sv[k0][i] = live_row && j < p.V ? at_[0] : 0.0f;
          sv[k0][i + 1] = live_row && j + 1 < p.V ? at_[1] : 0.0f;
        }
      }
  }

  // 4. out[t][f] for the warp's eight features (f0 + 8 warp ...) and every step: U (u): A = do, the state S_0
  //    (sv, from load_state), the earlier sub-blocks through dA and the scaled keys; else (dk): A = v, the
  //    gradient R, the later sub-blocks through dA^T and the scaled queries. Then scale (decay A state^T +
  //    references + the partial sums the diagonal wrote).
  template <bool U>
  __device__ void finish(const float (&sv)[8][4], float* out, long long sb, long long st, long long sh, long long sd) {
    const int r = lane >> 2, c2 = 2 * (lane & 3), fw = 8 * warp;
    const unsigned short* A = U ? dO : v;
    float acc[4][4];
    LADLE_UNROLL
    for (int m = 0; m < 4; ++m)
      LADLE_UNROLL
      for (int x = 0; x < 4; ++x) acc[m][x] = 0.0f;
    const int row8 = lane & 7, second = (lane >> 3) & 1, upper = lane >> 4;
    LADLE_UNROLL
    for (int k0 = 0; k0 < 8; ++k0) {
      unsigned bhi[2], blo[2];
      ladle_block_split(sv[k0][0], sv[k0][1], bhi[0], blo[0]);
      ladle_block_split(sv[k0][2], sv[k0][3], bhi[1], blo[1]);
      LADLE_UNROLL
      for (int m = 0; m < 4; ++m) {
        unsigned a[4];
        ladle_ldmatrix_x4(a, A + (16 * m + row8 + second * 8) * LV + 16 * k0 + upper * 8);
        ladle_mma_bf16(acc[m], a, bhi[0], bhi[1]);
        ladle_mma_bf16(acc[m], a, blo[0], blo[1]);
      }
    }
    float ref[4][4];
    LADLE_UNROLL
    for (int m = 0; m < 4; ++m)
      LADLE_UNROLL
      for (int x = 0; x < 4; ++x) ref[m][x] = 0.0f;
    // The other sub-blocks: for U, row block m (m >= 1) from each earlier one (depth 16); else row block m
    // (m <= 2) from each later one. Each pair's product scaled by E per feature before it adds.
    LADLE_UNROLL
    for (int m = 0; m < 4; ++m)
      LADLE_UNROLL
      for (int o = 0; o < 4; ++o) {
        if (U ? o >= m : o <= m) continue;
        const int bt = U ? m : o, bs = U ? o : m, pair = bt * (bt - 1) / 2 + bs;
        unsigned ah[4], al[4], bhi[2], blo[2];
        if (U) {  // A = dA [t][s], rows of sub-block m, columns of o
          const int at_ = (16 * m + row8 + second * 8) * LQ + 16 * o + upper * 8;
          ladle_ldmatrix_x4(ah, ahi + at_);
          ladle_ldmatrix_x4(al, alo + at_);
        } else {  // A = dA^T: stored [k = t][m = s]
          const int at_ = (16 * o + row8 + upper * 8) * LQ + 16 * m + second * 8;
          ladle_ldmatrix_x4_trans(ah, ahi + at_);
          ladle_ldmatrix_x4_trans(al, alo + at_);
        }
        LADLE_UNROLL
        for (int i = 0; i < 2; ++i) {  // B (k = step of sub-block o, n = feature): the scaled rows, [feature][step]
          const int at_ = (fw + r) * LW + 16 * o + c2 + 8 * i;
          bhi[i] = *reinterpret_cast<const unsigned*>(whi + at_);
          blo[i] = *reinterpret_cast<const unsigned*>(wlo + at_);
        }
        float prod[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        ladle_mma_bf16(prod, ah, bhi[0], bhi[1]);
        ladle_mma_bf16(prod, ah, blo[0], blo[1]);
        ladle_mma_bf16(prod, al, bhi[0], bhi[1]);
        LADLE_UNROLL
        for (int x = 0; x < 4; ++x) ref[m][x] += e[pair * F + fw + c2 + (x & 1)] * prod[x];
      }
    // The diagonal's partial sums, loaded before the sub-blocks' products: in flight during them. A lane's rows: 16 m + r and
    // 16 m + r + 8; its columns f0 + fw + c2 and the next (sd apart).
    // Step t's row is step r's plus (t - r) token strides (minus, reversed).
    float* const row_r = out + b * sb + token(r) * st + h * sh + (f0 + fw + c2) * sd;
    const long long step = p.reverse ? -st : st;
    float part[4][4];
    LADLE_UNROLL
    for (int m = 0; m < 4; ++m)
      LADLE_UNROLL
      for (int x = 0; x < 4; ++x) {
        const int t = 16 * m + r + 8 * (x >> 1), f = fw + c2 + (x & 1);
        part[m][x] = t < L && f0 + f < p.K ? row_r[(t - r) * step + (x & 1) * sd] : 0.0f;
      }
    LADLE_UNROLL
    for (int m = 0; m < 4; ++m)
      LADLE_UNROLL
      for (int x = 0; x < 4; ++x) {
        const int t = 16 * m + r + 8 * (x >> 1), f = fw + c2 + (x & 1);
        if (t >= L || f0 + f >= p.K) continue;
        const float gt = g[t * LG + f];
        const float decay = U ? ladle_exp2(gt) : ladle_exp2(gl[f] - gt);
        float value = decay * acc[m][x] + part[m][x];
        if (U && m > 0) value += ladle_exp2(gt - g[(16 * m - 1) * LG + f]) * ref[m][x];
        if (!U && m < 3) value += ladle_exp2(g[(16 * m + 15) * LG + f] - gt) * ref[m][x];
        row_r[(t - r) * step + (x & 1) * sd] = p.scale * value;
      }
  }

  __device__ void run() {
    if (L <= 0) return;
    stage();
    __syncthreads();
    scores();
    __syncthreads();
    diagonal();
    {
      float sv[8][4];  // the states' loads in flight while the rows are scaled
      load_state(entry_state(), sv);
      scaled(true);
      __syncthreads();
      finish<true>(sv, p.u, p.u_sb, p.u_st, p.u_sh, p.u_sd);
    }
    __syncthreads();
    {
      float sv[8][4];
      load_state(exit_gradient(), sv);
      scaled(false);
      __syncthreads();
      finish<false>(sv, p.dk, p.dk_sb, p.dk_st, p.dk_sh, p.dk_sd);
    }
  }
};

extern "C" __global__ void __launch_bounds__(256, 2) ladle_bwd_block_bf16(
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
