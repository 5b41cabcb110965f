// The delta rule's chunked backward on the tensor cores (the delta rule, the gated delta rule and KDA),
// device side: three kernels over the same parameters as ladle_bwd_update (update_backward.cuh:
// LadleUpdateArgs, the slots the generated slots kernel wrote, the slots' gradients out), args.ckpt
// their work arrays. codegen/cuda/update_backward.h says what each computes, its grid and its work
// arrays' layout. This header: the work arrays, prepare and states; wy_gradients.cuh: the gradients
// kernel and the entry points (LadleWy).
// Within a chunk of C = 64 tokens with cumulative log decay g (g_t = log_a_1 + ... + log_a_t, per key
// feature for KDA, one a token for a head decay; 0 without a decay), Gamma_ts = exp(g_t - g_s) (per
// feature), the forward is
//   L = tril(diag(beta) (K K^T . Gamma), -1), T = (I + L)^(-1), W = T diag(beta) (K . e^g), U = T diag(beta) V,
//   E = U - W S_0, O = (Q . e^g) S_0 + (Q K^T . Gamma)_(t >= s) E,
//   S_C = diag(e^(g_C)) S_0 + (K . e^(g_C - g))^T E,
// where for a per-feature decay (X Y^T . Gamma)_ts means sum_f x_tf y_sf e^(g_tf - g_sf), and q and k
// are as the recurrence reads them (qhat, khat: scaled and L2-normalised). The products run on
// mma.sync from bf16 tiles in shared memory (block_mma.cuh), fp32 accumulators; the states, T's
// substitution and every gate and strength gradient are fp32. A per-feature decay's products below
// the diagonal take references per 16-token block, so that no factor exceeds 1 however strong the
// decay; the diagonal blocks' are summed element by element. Needs storage.cuh, tensor_core.cuh,
// block_mma.cuh and update_backward.cuh first.
#ifndef LADLE_WY_BACKWARD
#define LADLE_WY_BACKWARD

#define LADLE_WY_C 64          // tokens a chunk
#define LADLE_WY_VS 64         // value columns a block of the states and gradient kernels
#define LADLE_WY_LOG_FLOOR (-110.0f) // a log decay below counts as this one (exp: 0 in fp32; a hard reset's -inf included)
#define LADLE_WY_SPAN 60.0f          // a per-feature decay's diagonal block on the tensor cores where its log decay spans at most this

// e^x as 2^(x log2 e) on the special function unit (ex2.approx.ftz: 2 ulp; below 2^-126, 0): the
// decays' factors, differences of cumulative log decays.
#define LADLE_WY_LOG2E 1.4426950408889634f
__device__ __forceinline__ float ladle_wy_exp(float x) { return ladle_exp2(LADLE_WY_LOG2E * x); }

// A per-feature decay's span over each 16-token block, max over f of g_(16I, f) - g_(16I + 15, f), into
// out[I] (a warp a block); g [C][ldg] cumulative. The caller synchronises.
template <int C, int KP>
__device__ __forceinline__ void ladle_wy_spans(const float* g, int ldg, float* out) {
  const int lane = threadIdx.x & 31, I = threadIdx.x >> 5;
  if (I >= C / 16) return;
  float d = 0.0f;
  for (int f = lane; f < KP; f += 32) d = fmaxf(d, g[16 * I * ldg + f] - g[(16 * I + 15) * ldg + f]);
  for (int off = 16; off > 0; off >>= 1) d = fmaxf(d, __shfl_xor_sync(0xffffffffu, d, off));
  if (lane == 0) out[I] = d;
}

// The form's constants and each kernel's shared memory in bytes (update_backward.cpp's wy_launches
// mirrors them). KP key rows (64 or 128); GN: g's floats a token in the work arrays.
template <int KP, unsigned FORM>
struct LadleWyShape {
  static constexpr int C = LADLE_WY_C, VS = LADLE_WY_VS, LK = KP + 8, LT = LADLE_WY_VS + 8, LC = LADLE_WY_C + 1, LS = LADLE_WY_VS + 4;
  static constexpr int LG = KP + 4;  // a per-feature g's row stride in shared memory (floats)
  static constexpr bool head = (FORM & ladle_upd_head) != 0, key = (FORM & ladle_upd_key_decay) != 0;
  static constexpr bool has_beta = (FORM & ladle_upd_beta) != 0, l2 = (FORM & ladle_upd_l2) != 0;
  static constexpr bool scale_table = (FORM & ladle_upd_scale_table) != 0;
  static constexpr int GN = key ? KP : 1;
  // prepare: qhat, khat, beta e^g khat [C][LK]; R (v, and before it a key decay's scaled operands);
  // T [C][LT]; a key decay's k e^(g_rho - g) [C][LK]; L, T [C][LC] fp32; a key decay's g [C][LG]; four [C].
  static constexpr int prepare_r(int VP) { return key && 2 * C * LK > C * (VP + 8) ? 2 * C * LK : C * (VP + 8); }
  static constexpr int prepare_shared(int VP) {
    return 2 * (3 * C * LK + prepare_r(VP) + C * LT + (key ? C * LK : 0)) + 4 * (2 * C * LC + (key ? C * LG : 0) + 4 * C);
  }
  // states: S or dS [KP][LS] fp32, its bf16 copy [KP][LT], E or dE [C][LT], two stages of W, kd, qg
  // [C][LK], M and U or dO [C][LT] and g (its last row for a key decay).
  static constexpr int stage_bytes = 2 * (3 * C * LK + 2 * C * LT) + 4 * (key ? KP : C);
  static constexpr int states_shared() { return 4 * KP * LS + 2 * (KP * LT + C * LT) + 2 * stage_bytes; }
  // gradients: qhat, khat [C][LK]; T [C][LT]; two value slices (h, dh [KP][LT], E, dE, dO, v [C][LT]);
  // floats: g, beta, dg, d beta, ds [C], four, and a key decay's two [KP].
  static constexpr int slice_halves = 2 * KP * LT + 4 * C * LT;
  static constexpr int gradients_shared() { return 2 * (2 * C * LK + C * LT + 2 * slice_halves) + 4 * (5 * C + 4 + (key ? 2 * KP : 0)); }
};

// The work arrays, carved from args.ckpt in this order, for `chunks` = N H C chunks (C: chunks of
// the longest sequence) with KP key rows and VP = 64 ceil(V / 64) value columns, row-major per chunk,
// bf16: qhat, khat, kd = e^(g_C - g) khat, qg = e^g qhat, W [C][KP]; U, E, dE, dO, v [C][VP]; h (the
// state entering the chunk), dh (dL/d the state leaving it) [KP][VP]; M = (Q K^T . Gamma)_(t >= s),
// T [C][C]; then g [C][GN] in fp32 (a key decay's in log2 units, times log2 e). update_backward_ckpt_floats mirrors it.
struct LadleWyWork {
  unsigned short *qh, *kh, *kd, *qg, *w, *u, *e, *de, *dov, *vv, *h, *dh, *m, *t;
  float* g;
  __device__ __forceinline__ LadleWyWork(float* base, long long chunks, int KP, int VP) {
    unsigned short* p = reinterpret_cast<unsigned short*>(base);
    const long long ck = chunks * LADLE_WY_C * KP, cv = chunks * LADLE_WY_C * VP, kv = chunks * KP * VP;
    const long long cc = chunks * LADLE_WY_C * LADLE_WY_C;
    qh = p, p += ck, kh = p, p += ck, kd = p, p += ck, qg = p, p += ck, w = p, p += ck;
    u = p, p += cv, e = p, p += cv, de = p, p += cv, dov = p, p += cv, vv = p, p += cv;
    h = p, p += kv, dh = p, p += kv;
    m = p, p += cc, t = p, p += cc;
    g = reinterpret_cast<float*>(p);
  }
};
// One (sequence, head): its tokens' rows of the slots in the recurrence's order.
template <unsigned FORM>
struct LadleWySequence {
  long long bos = 0, eos = 0, len = 0, T = 0;
  int b = 0, h = 0, H = 0;
  __device__ __forceinline__ LadleWySequence(const LadleUpdateArgs& p, int nh) : T(p.T), H(p.H) {
    const int n = nh / p.H;
    h = nh % p.H;
    if (FORM & ladle_upd_varlen) b = 0, bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
    else b = n, bos = 0, eos = p.T;
    len = eos - bos;
  }
  __device__ __forceinline__ long long row(long long step) const {
    const long long t = (FORM & ladle_upd_reverse) ? eos - 1 - step : bos + step;
    return (static_cast<long long>(b) * T + t) * H + h;
  }
};

// rows x cols 16-bit values (cols a multiple of 8) from global (row stride gs) into shared (row stride
// ss) by cp.async: complete after ladle_cp_async_wait (the caller commits).
__device__ __forceinline__ void ladle_wy_fetch(void* dst, int ss, const void* src, long long gs, int rows, int cols) {
  const int per = cols / 8;
  unsigned short* const d = static_cast<unsigned short*>(dst);
  const unsigned short* const g = static_cast<const unsigned short*>(src);
  for (int e = threadIdx.x; e < rows * per; e += blockDim.x) {
    const int r = e / per, c = (e % per) * 8;
    ladle_cp_async_16(d + r * ss + c, g + r * gs + c);
  }
}

// The same from shared to global, 16 bytes a thread at a time.
__device__ __forceinline__ void ladle_wy_store(unsigned short* dst, long long gs, const unsigned short* src, int ss, int rows, int cols) {
  const int per = cols / 8;
  for (int e = threadIdx.x; e < rows * per; e += blockDim.x) {
    const int r = e / per, c = (e % per) * 8;
    ladle_st16(dst + r * gs + c, ladle_ld16(src + r * ss + c));
  }
}

// x[u] = row[f + u] for f + u < n, else 0: one 16-byte load where n is a multiple of 4 and the row
// aligned. Through the read-only path on the GPU (the slots are not written during the kernel), so
// that the compiler may issue an unrolled loop's loads ahead of its stores.
__device__ __forceinline__ void ladle_wy_load4(float (&x)[4], const float* row, int f, int n) {
  if ((n & 3) == 0 && (reinterpret_cast<unsigned long long>(row) & 15ull) == 0) {
#if defined(__CUDA_ARCH__)
    const float4 v = __ldg(reinterpret_cast<const float4*>(row + f));
#else
    const ladle_f4 v = ladle_ld4(row + f);
#endif
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    LADLE_UNROLL
    for (int u = 0; u < 4; ++u) x[u] = f + u < n ? row[f + u] : 0.0f;
  }
}

// Four bf16 values, each x[u] times `by`, at p (8-byte aligned).
__device__ __forceinline__ void ladle_wy_put4(unsigned short* p, const float (&x)[4], float by) {
  unsigned* const w = reinterpret_cast<unsigned*>(p);
  w[0] = ladle_pack_bf16(x[0] * by, x[1] * by);
  w[1] = ladle_pack_bf16(x[2] * by, x[3] * by);
}

// p[0] += a (where first) and p[1] += b (where second): one vector reduction on sm_90 where both

__device__ __forceinline__ void ladle_tile_sub(LadleTileAcc& acc, const LadleTileAcc& other) {
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int r = 0; r < 4; ++r) acc[j][r] -= other[j][r];
}

// Four bf16 values x[u] by[u] times `by` at p (8-byte aligned).
__device__ __forceinline__ void ladle_wy_put4s(unsigned short* p, const float (&x)[4], float by, const float (&s)[4]) {
  unsigned* const w = reinterpret_cast<unsigned*>(p);
  w[0] = ladle_pack_bf16(x[0] * by * s[0], x[1] * by * s[1]);
  w[1] = ladle_pack_bf16(x[2] * by * s[2], x[3] * by * s[3]);
}

// T = (I + L)^(-1) for a strictly lower C x C matrix L (fp32, row stride LC) into t (fp32, the same
// stride), in 16 x 16 blocks: the diagonal blocks by substitution, a lane a column of its warp's
// block (T_ij = [i = j] - sum_(j <= m < i) L_im T_mj reads only its own column); then the blocks
// below them by distance d = 1, 2, 3: T_IJ = -T_II sum_(J <= M < I) L_IM T_MJ, through x [3][16][16]
// (fp32 scratch). Above the diagonal blocks: zero. Ends on a barrier.
template <int C, int LC>
__device__ __forceinline__ void ladle_wy_solve(const float* lf, float* tf, float* xs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < C * C; e += blockDim.x)
    if ((e % C) / 16 > (e / C) / 16) tf[(e / C) * LC + e % C] = 0.0f;
  if (warp < C / 16 && lane < 16) {
    const int o = 16 * warp, j = lane;
    for (int i = 0; i < 16; ++i) {
      float x = i == j ? 1.0f : 0.0f;
      for (int m = j; m < i; ++m) x -= lf[(o + i) * LC + o + m] * tf[(o + m) * LC + o + j];
      tf[(o + i) * LC + o + j] = x;
    }
  }
  __syncthreads();
  for (int d = 1; d < C / 16; ++d) {
    const int pairs = C / 16 - d;
    for (int e = threadIdx.x; e < pairs * 256; e += blockDim.x) {
      const int J = e / 256, I = J + d, r = (e % 256) / 16, col = e % 16;
      float x = 0.0f;
      for (int m = 16 * J; m < 16 * I; ++m) x += lf[(16 * I + r) * LC + m] * tf[m * LC + 16 * J + col];
      xs[e] = x;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < pairs * 256; e += blockDim.x) {
      const int J = e / 256, I = J + d, r = (e % 256) / 16, col = e % 16;
      float x = 0.0f;
      for (int k = 0; k < 16; ++k) x -= tf[(16 * I + r) * LC + 16 * I + k] * xs[J * 256 + k * 16 + col];
      tf[(16 * I + r) * LC + 16 * J + col] = x;
    }
    __syncthreads();
  }
}

// The prepare kernel's block (grid: C, N H; 256 threads): chunk blockIdx.x of (sequence, head)
// blockIdx.y. Writes every tile the later kernels read, in bf16 (qhat, khat, kd, qg, dO, v), g, M,
// T (by substitution, fp32), W and U.
template <int KP, unsigned FORM>
struct LadleWyPrepare : LadleWyShape<KP, FORM> {
  using S = LadleWyShape<KP, FORM>;
  using S::C, S::LK, S::LT, S::LC, S::LG, S::head, S::key, S::has_beta, S::l2, S::scale_table;
  const LadleUpdateArgs& p;
  const LadleWySequence<FORM> seq;
  const int VP, LV, K, V;
  const long long s0, q;
  const int L;
  const LadleWyWork work;
  // qhat, khat, beta e^g khat [C][LK]; R; T [C][LT]; k e^(g_rho - g) [C][LK] (a key decay's)
  unsigned short *const qb, *const kb, *const kgb, *const rb, *const tb, *const kr;
  // L, T [C][LC]; g [C][LG] (a key decay's); g (a head decay's), beta, q's and k's factors [C]
  float *const lf, *const tf, *const gk, *const gs, *const bs, *const qsc, *const krn;

  __device__ __forceinline__ LadleWyPrepare(const LadleUpdateArgs& args, unsigned char* smem)
      : p(args), seq(args, blockIdx.y), VP((args.V + 63) / 64 * 64), LV(VP + 8), K(args.K), V(args.V),
        s0(static_cast<long long>(blockIdx.x) * C), q(static_cast<long long>(blockIdx.y) * args.C + blockIdx.x),
        L(static_cast<int>(seq.len - s0 < C ? seq.len - s0 : C)),
        work(args.ckpt, static_cast<long long>(args.C) * gridDim.y, KP, (args.V + 63) / 64 * 64),
        qb(reinterpret_cast<unsigned short*>(smem)), kb(qb + C * LK), kgb(kb + C * LK), rb(kgb + C * LK), tb(rb + S::prepare_r(VP)),
        kr(tb + C * LT), lf(reinterpret_cast<float*>(kr + (key ? C * LK : 0))), tf(lf + C * LC), gk(tf + C * LC),
        gs(gk + (key ? C * LG : 0)), bs(gs + C), qsc(bs + C), krn(qsc + C) {}

  __device__ __forceinline__ bool empty() const { return s0 >= seq.len; }

  // The norms, the strength and a head decay per token (zero past the chunk's tokens); a key decay's
  // tile; then cumulative (the rows past the chunk's tokens keep its last).
  __device__ __forceinline__ void tokens() {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    // A key decay's tile, four features a thread at a time with the loads in flight together; the
    // norms, four features a lane, eight tokens a warp at a time. Then the tile summed over the tokens
    // by a thread a feature, sixteen rows read before they are written.
    if (key) {
      LADLE_UNROLL_8
      for (int e = threadIdx.x; e < C * KP / 4; e += blockDim.x) {
        const int t = e / (KP / 4), f = 4 * (e % (KP / 4));
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (t < L && f < K) ladle_wy_load4(x, p.log_a + seq.row(s0 + t) * K, f, K);
        LADLE_UNROLL
        for (int u = 0; u < 4; ++u) gk[t * LG + f + u] = fmaxf(x[u], LADLE_WY_LOG_FLOOR);  // 0 past K and past the tokens
      }
    }
    {
      const int norm_warps = warps;
      for (int t0 = warp; t0 < C; t0 += 8 * norm_warps) {
        float qq[8], kk[8];
        LADLE_UNROLL
        for (int i = 0; i < 8; ++i) {
          const int t = t0 + i * norm_warps;
          float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if (t < L && 4 * lane < K) {
            const long long r = seq.row(s0 + t);
            ladle_wy_load4(x, p.qs + r * K, 4 * lane, K);
            ladle_wy_load4(y, p.kf + r * K, 4 * lane, K);
          }
          qq[i] = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
          kk[i] = y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3];
        }
        LADLE_UNROLL
        for (int i = 0; i < 8; ++i) {
          const int t = t0 + i * norm_warps;
          for (int off = 16; off > 0; off >>= 1) qq[i] += __shfl_xor_sync(0xffffffffu, qq[i], off), kk[i] += __shfl_xor_sync(0xffffffffu, kk[i], off);
          if (lane == 0 && t < C) {
            const bool live = t < L;
            const long long r = seq.row(s0 + (live ? t : 0));
            const float sc = scale_table ? (live ? p.scale_s[r] : 0.0f) : p.scale;
            qsc[t] = live ? sc * (l2 ? rsqrtf(qq[i] + p.eps) : 1.0f) : 0.0f;
            krn[t] = live ? (l2 ? rsqrtf(kk[i] + p.eps) : 1.0f) : 0.0f;
            bs[t] = live ? (has_beta ? p.beta_s[r] : 1.0f) : 0.0f;
            gs[t] = live && head ? fmaxf(p.log_h[r], LADLE_WY_LOG_FLOOR) : 0.0f;
          }
        }
      }
    }
    __syncthreads();
    if (key && static_cast<int>(threadIdx.x) < KP) {
      const int f = threadIdx.x;
      float run = 0.0f;
      for (int t0 = 0; t0 < C; t0 += 16) {
        float x[16];
        LADLE_UNROLL
        for (int i = 0; i < 16; ++i) x[i] = gk[(t0 + i) * LG + f];
        LADLE_UNROLL
        for (int i = 0; i < 16; ++i) run += x[i], gk[(t0 + i) * LG + f] = run;
      }
    } else if (!key && threadIdx.x == 0) {
      float run = 0.0f;
      for (int t = 0; t < C; ++t) run += gs[t], gs[t] = run;
    }
    __syncthreads();
  }

  // For each four columns of each of the chunk's rows: x and y from the slots a and b ([rows][n]; zero
  // past the chunk's tokens and past n), then put(t, f, x, y); `width` columns a row (n padded).
  template <class Put>
  __device__ __forceinline__ void stage_rows(const float* a, const float* b, int n, int width, Put&& put) const {
    LADLE_UNROLL_4
    for (int e = threadIdx.x; e < C * width / 4; e += blockDim.x) {
      const int t = e / (width / 4), f = (e % (width / 4)) * 4;
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < L && f < n) {
        const long long r = seq.row(s0 + t);
        ladle_wy_load4(x, a + r * n, f, n);
        ladle_wy_load4(y, b + r * n, f, n);
      }
      put(t, f, x, y);
    }
  }

  // q and k: the tiles in shared memory and in the work arrays, and g.
  __device__ __forceinline__ void stage() {
    const float last = gs[C - 1];
    stage_rows(p.qs, p.kf, K, KP, [&](int t, int f, const float (&x)[4], const float (&y)[4]) {
      const long long at = (q * C + t) * KP + f;
      ladle_wy_put4(qb + t * LK + f, x, qsc[t]);
      ladle_wy_put4(kb + t * LK + f, y, krn[t]);
      ladle_wy_put4(work.qh + at, x, qsc[t]);
      ladle_wy_put4(work.kh + at, y, krn[t]);
      if (key) {  // per feature: e^g, e^(g_C - g), e^(g_rho - g) with rho the last row of t's 16-token block
        const float* const g = gk + t * LG + f;
        float eg[4], ed[4], er[4];
        LADLE_UNROLL
        for (int u = 0; u < 4; ++u)
          eg[u] = ladle_wy_exp(g[u]), ed[u] = ladle_wy_exp(gk[(C - 1) * LG + f + u] - g[u]), er[u] = ladle_wy_exp(gk[(t | 15) * LG + f + u] - g[u]);
        ladle_wy_put4s(kgb + t * LK + f, y, bs[t] * krn[t], eg);
        ladle_wy_put4s(kr + t * LK + f, y, krn[t], er);
        ladle_wy_put4s(work.kd + at, y, krn[t], ed);
        ladle_wy_put4s(work.qg + at, x, qsc[t], eg);
      } else {
        const float eg = ladle_wy_exp(gs[t]);
        ladle_wy_put4(kgb + t * LK + f, y, bs[t] * eg * krn[t]);
        ladle_wy_put4(work.kd + at, y, ladle_wy_exp(last - gs[t]) * krn[t]);
        ladle_wy_put4(work.qg + at, x, eg * qsc[t]);
      }
    });
    if (key)
      for (int e = threadIdx.x; e < C * KP; e += blockDim.x) work.g[q * C * KP + e] = LADLE_WY_LOG2E * gk[(e / KP) * LG + e % KP];
    else if (threadIdx.x < C)
      work.g[q * C + threadIdx.x] = gs[threadIdx.x];
    __syncthreads();
  }

};

// The prepare kernel's products: M and L (a head decay's or none, or per feature), then T, W and U.
template <int KP, unsigned FORM>
struct LadleWyScores : LadleWyPrepare<KP, FORM> {
  using B = LadleWyPrepare<KP, FORM>;
  using B::B, B::C, B::LK, B::LT, B::LC, B::LG, B::key;
  using B::p, B::VP, B::LV, B::V, B::q, B::work, B::qb, B::kb, B::kgb, B::rb, B::tb, B::kr, B::lf, B::tf, B::gk, B::gs, B::bs;
  using B::stage_rows;

  // M = (Q K^T . Gamma)_(t >= s) into the work array; L = tril(diag(beta) (K K^T . Gamma), -1).
  __device__ __forceinline__ void scores_head() {
    ladle_tiles(C, C, [&](int m0, int n0) {
      LadleTileAcc acc, gram;
      ladle_tile_zero(acc);
      ladle_tile_zero(gram);
      ladle_tile_mma<false, false>(acc, qb, LK, kb, LK, m0, n0, KP);
      ladle_tile_mma<false, false>(gram, kb, LK, kb, LK, m0, n0, KP);
      ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
        *reinterpret_cast<unsigned*>(work.m + q * C * C + i * C + j) =
            ladle_pack_bf16(i >= j ? ladle_wy_exp(gs[i] - gs[j]) * x : 0.0f, i >= j + 1 ? ladle_wy_exp(gs[i] - gs[j + 1]) * y : 0.0f);
      });
      ladle_tile_each(gram, m0, n0, [&](int i, int j, float x) { lf[i * LC + j] = i > j ? bs[i] * ladle_wy_exp(gs[i] - gs[j]) * x : 0.0f; });
    });
    __syncthreads();
  }

  // The same per feature. The diagonal 16 x 16 blocks whose decay spans at most LADLE_WY_SPAN on the
  // tensor cores: q and k times e^(g - g_rho) (at least 1, at most e^span; rho the block's last row)
  // against kr; the others element by element; zero above them. Below them, for each column block J,
  // q and k of the rows after it against rho = J's last row (q e^(g - g_rho), at most 1) times kr
  // (k e^(g_rho - g), at most 1) on the tensor cores.
  __device__ __forceinline__ void scores_key() {
    unsigned short* const m = work.m + q * C * C;
    unsigned short *const qj = rb, *const kj = rb + C * LK;
    float* const span = gs;  // the head decay's, unused here
    ladle_wy_spans<C, KP>(gk, LG, span);
    __syncthreads();
    for (int e = threadIdx.x; e < C * KP / 2; e += blockDim.x) {
      const int t = e / (KP / 2), f = 2 * (e % (KP / 2)), rho = t | 15;
      const bool fits = span[t / 16] <= LADLE_WY_SPAN;
      const float w0 = fits ? ladle_wy_exp(gk[t * LG + f] - gk[rho * LG + f]) : 0.0f, w1 = fits ? ladle_wy_exp(gk[t * LG + f + 1] - gk[rho * LG + f + 1]) : 0.0f;
      *reinterpret_cast<unsigned*>(qj + t * LK + f) = ladle_pack_bf16(w0 * ladle_bf16_float(qb[t * LK + f]), w1 * ladle_bf16_float(qb[t * LK + f + 1]));
      *reinterpret_cast<unsigned*>(kj + t * LK + f) = ladle_pack_bf16(w0 * ladle_bf16_float(kb[t * LK + f]), w1 * ladle_bf16_float(kb[t * LK + f + 1]));
    }
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
      const int t = e / C, s = e % C;
      if (s / 16 > t / 16) m[t * C + s] = 0, lf[t * LC + s] = 0.0f;
    }
    __syncthreads();
    if (const int I = threadIdx.x >> 5; I < C / 16 && span[I] <= LADLE_WY_SPAN) {
      const int n0 = 16 * I < C - 32 ? 16 * I : C - 32;
      LadleTileAcc acc, gram;
      ladle_tile_zero(acc);
      ladle_tile_zero(gram);
      ladle_tile_mma<false, false>(acc, qj, LK, kr, LK, 16 * I, n0, KP);
      ladle_tile_mma<false, false>(gram, kj, LK, kr, LK, 16 * I, n0, KP);
      ladle_tile_each_pair(acc, 16 * I, n0, [&](int i, int j, float x, float y) {
        if (j >= 16 * I && j < 16 * I + 16) *reinterpret_cast<unsigned*>(m + i * C + j) = ladle_pack_bf16(i >= j ? x : 0.0f, i >= j + 1 ? y : 0.0f);
      });
      ladle_tile_each(gram, 16 * I, n0, [&](int i, int j, float x) {
        if (j >= 16 * I && j < 16 * I + 16) lf[i * LC + j] = i > j ? bs[i] * x : 0.0f;
      });
    }
    for (int e = threadIdx.x; e < C * 16; e += blockDim.x) {
      const int t = 16 * (e / 256) + (e % 256) / 16, s = 16 * (e / 256) + e % 16;
      if (span[t / 16] <= LADLE_WY_SPAN) continue;
      float mq = 0.0f, mk = 0.0f;
      if (s <= t)
        for (int f = 0; f < KP; ++f) {
          const float w = ladle_wy_exp(gk[t * LG + f] - gk[s * LG + f]) * ladle_bf16_float(kb[s * LK + f]);
          mq += ladle_bf16_float(qb[t * LK + f]) * w, mk += ladle_bf16_float(kb[t * LK + f]) * w;
        }
      m[t * C + s] = ladle_bf16_bits(mq);
      lf[t * LC + s] = s < t ? bs[t] * mk : 0.0f;
    }
    __syncthreads();
    for (int J = 0; J < C / 16 - 1; ++J) {
      const int rho = 16 * J + 15;
      for (int e = threadIdx.x; e < C * KP / 2; e += blockDim.x) {
        const int t = e / (KP / 2), f = 2 * (e % (KP / 2));
        const float w0 = t > rho ? ladle_wy_exp(gk[t * LG + f] - gk[rho * LG + f]) : 0.0f;
        const float w1 = t > rho ? ladle_wy_exp(gk[t * LG + f + 1] - gk[rho * LG + f + 1]) : 0.0f;
        *reinterpret_cast<unsigned*>(qj + t * LK + f) =
            ladle_pack_bf16(w0 * ladle_bf16_float(qb[t * LK + f]), w1 * ladle_bf16_float(qb[t * LK + f + 1]));
        *reinterpret_cast<unsigned*>(kj + t * LK + f) =
            ladle_pack_bf16(w0 * ladle_bf16_float(kb[t * LK + f]), w1 * ladle_bf16_float(kb[t * LK + f + 1]));
      }
      __syncthreads();
      const int I = J + 1 + (threadIdx.x >> 5);
      if (I < C / 16) {  // the 16 x 16 block (I, J): the tile's first two n8 blocks
        LadleTileAcc acc, gram;
        ladle_tile_zero(acc);
        ladle_tile_zero(gram);
        ladle_tile_mma<false, false>(acc, qj, LK, kr, LK, 16 * I, 16 * J, KP);
        ladle_tile_mma<false, false>(gram, kj, LK, kr, LK, 16 * I, 16 * J, KP);
        ladle_tile_each_pair(acc, 16 * I, 16 * J, [&](int i, int j, float x, float y) {
          if (j < 16 * J + 16) *reinterpret_cast<unsigned*>(m + i * C + j) = ladle_pack_bf16(x, y);
        });
        ladle_tile_each(gram, 16 * I, 16 * J, [&](int i, int j, float x) {
          if (j < 16 * J + 16) lf[i * LC + j] = bs[i] * x;
        });
      }
      __syncthreads();
    }
  }

  // T, then v and dO staged (beta v into R), W = T diag(beta e^g) K, U = T diag(beta) V.
  __device__ __forceinline__ void wy() {
    ladle_wy_solve<C, LC>(lf, tf, reinterpret_cast<float*>(tb));
    for (int e = threadIdx.x; e < C * C / 2; e += blockDim.x) {
      const int i = (2 * e) / C, j = (2 * e) % C;
      const unsigned pair = ladle_pack_bf16(tf[i * LC + j], tf[i * LC + j + 1]);
      *reinterpret_cast<unsigned*>(tb + i * LT + j) = pair;
      *reinterpret_cast<unsigned*>(work.t + q * C * C + 2 * e) = pair;
    }
    unsigned short* const vb = rb;
    stage_rows(p.vf, p.dos, V, VP, [&](int t, int j, const float (&x)[4], const float (&d)[4]) {
      const long long at = (q * C + t) * VP + j;
      ladle_wy_put4(vb + t * LV + j, x, bs[t]);
      ladle_wy_put4(work.vv + at, x, 1.0f);
      ladle_wy_put4(work.dov + at, d, 1.0f);
    });
    __syncthreads();
    ladle_tiles(C, KP, [&](int m0, int n0) {
      LadleTileAcc acc;
      ladle_tile_zero(acc);
      ladle_tile_mma<false, true>(acc, tb, LT, kgb, LK, m0, n0, C);
      ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
        *reinterpret_cast<unsigned*>(work.w + (q * C + i) * KP + j) = ladle_pack_bf16(x, y);
      });
    });
    ladle_tiles(C, VP, [&](int m0, int n0) {
      LadleTileAcc acc;
      ladle_tile_zero(acc);
      ladle_tile_mma<false, true>(acc, tb, LT, vb, LV, m0, n0, C);
      ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
        *reinterpret_cast<unsigned*>(work.u + (q * C + i) * VP + j) = ladle_pack_bf16(x, y);
      });
    });
  }
};

// The states kernel (grid: VP / 64, N H; 256 threads): the serial pass over one sequence's chunks for
// 64 value columns, the state in shared memory (fp32), each step's tiles fetched (cp.async) during
// the step before. Forward: h = S_0, E = U - W S_0, S_C; then backward from d_final: dh = dS (the
// gradient of the state leaving the chunk), dE = M^T dO + kd dS, dS becomes
// diag(e^(g_C)) dS + qg^T dO - W^T dE; at the end d initial_state.
template <int KP, unsigned FORM>
struct LadleWyStates : LadleWyShape<KP, FORM> {
  using S = LadleWyShape<KP, FORM>;
  using S::C, S::VS, S::LK, S::LT, S::LS, S::key, S::stage_bytes;
  struct Stage {
    unsigned short *w, *kd, *qg, *m, *x;  // x: U (forward) or dO (backward)
    float* g;                             // g's last row (a key decay's [KP]; else the whole [C])
  };

  static __device__ void run(const LadleUpdateArgs& p) {
    const int VP = (p.V + 63) / 64 * 64, K = p.K, V = p.V, nh = blockIdx.y, j0 = blockIdx.x * VS;
    const LadleWySequence<FORM> seq(p, nh);
    const long long chunks = (seq.len + C - 1) / C, steps = 2 * chunks;
    const LadleWyWork work(p.ckpt, static_cast<long long>(p.C) * gridDim.y, KP, VP);
    LADLE_DYNAMIC_SHARED(smem);
    float* const sf = reinterpret_cast<float*>(smem);                            // S, then dS [KP][LS]
    unsigned short* const sb = reinterpret_cast<unsigned short*>(sf + KP * LS);  // S or dS in bf16 [KP][LT]
    unsigned short* const eb = sb + KP * LT;                                     // E, then dE [C][LT]
    unsigned char* const stages = reinterpret_cast<unsigned char*>(eb + C * LT);
    const auto stage = [&](long long k) {
      unsigned short* const b = reinterpret_cast<unsigned short*>(stages + (k & 1) * stage_bytes);
      return Stage{b, b + C * LK, b + 2 * C * LK, b + 3 * C * LK, b + 3 * C * LK + C * LT,
                   reinterpret_cast<float*>(b + 3 * C * LK + 2 * C * LT)};
    };
    const auto chunk_of = [&](long long k) { return k < chunks ? k : steps - 1 - k; };
    const auto issue = [&](long long k) {
      const Stage s = stage(k);
      const long long q = static_cast<long long>(nh) * p.C + chunk_of(k);
      ladle_wy_fetch(s.w, LK, work.w + q * C * KP, KP, C, KP);
      ladle_wy_fetch(s.kd, LK, work.kd + q * C * KP, KP, C, KP);
      if (key) ladle_wy_fetch(s.g, 8, work.g + (q * C + C - 1) * KP, 8, KP / 4, 8);  // floats as 16-bit pairs
      else ladle_wy_fetch(s.g, 8, work.g + q * C, 8, C / 4, 8);
      if (k < chunks) {
        ladle_wy_fetch(s.x, LT, work.u + q * C * VP + j0, VP, C, VS);
      } else {
        ladle_wy_fetch(s.qg, LK, work.qg + q * C * KP, KP, C, KP);
        ladle_wy_fetch(s.m, LT, work.m + q * C * C, C, C, C);
        ladle_wy_fetch(s.x, LT, work.dov + q * C * VP + j0, VP, C, VS);
      }
      ladle_cp_async_commit();
    };
    const long long state_at = static_cast<long long>(nh) * K * V;
    const auto load_state = [&](const float* from) {  // h0 or d_final's columns, or zero
      for (int e = threadIdx.x; e < KP * VS; e += blockDim.x) {
        const int f = e / VS, j = e % VS;
        sf[f * LS + j] = from && f < K && j0 + j < V ? from[state_at + static_cast<long long>(f) * V + j0 + j] : 0.0f;
      }
    };
    const float* const d_final = (FORM & ladle_upd_d_final) ? p.d_final : nullptr;
    load_state((FORM & ladle_upd_initial) ? p.h0 : nullptr);
    if (steps > 0) issue(0);
    for (long long k = 0; k < steps; ++k) {
      if (k + 1 < steps) {
        issue(k + 1);
        ladle_cp_async_wait<1>();
      } else {
        ladle_cp_async_wait<0>();
      }
      if (k == chunks) load_state(d_final);
      __syncthreads();
      const Stage s = stage(k);
      const long long q = static_cast<long long>(nh) * p.C + chunk_of(k);
      const float head_decay = key ? 0.0f : ladle_wy_exp(s.g[C - 1]);
      const auto decay = [&](int f) { return key ? ladle_exp2(s.g[f]) : head_decay; };  // a key decay's g in log2 units
      for (int e = threadIdx.x; e < KP * VS / 2; e += blockDim.x) {  // S or dS in bf16, and into h or dh
        const int f = (2 * e) / VS, j = (2 * e) % VS;
        *reinterpret_cast<unsigned*>(sb + f * LT + j) = ladle_pack_bf16(sf[f * LS + j], sf[f * LS + j + 1]);
      }
      __syncthreads();
      ladle_wy_store((k < chunks ? work.h : work.dh) + q * KP * VP + j0, VP, sb, LT, KP, VS);
      if (k < chunks) {
        ladle_tiles(C, VS, [&](int m0, int n0) {  // E = U - W S_0
          LadleTileAcc acc;
          ladle_tile_zero(acc);
          ladle_tile_mma<false, true>(acc, s.w, LK, sb, LT, m0, n0, KP);
          ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
            *reinterpret_cast<unsigned*>(eb + i * LT + j) =
                ladle_pack_bf16(ladle_bf16_float(s.x[i * LT + j]) - x, ladle_bf16_float(s.x[i * LT + j + 1]) - y);
          });
        });
        __syncthreads();
        ladle_wy_store(work.e + q * C * VP + j0, VP, eb, LT, C, VS);
        ladle_tiles(KP, VS, [&](int m0, int n0) {  // S_C = diag(e^(g_C)) S_0 + kd^T E
          LadleTileAcc acc;
          ladle_tile_zero(acc);
          ladle_tile_mma<true, true>(acc, s.kd, LK, eb, LT, m0, n0, C);
          ladle_tile_each(acc, m0, n0, [&](int f, int j, float x) { sf[f * LS + j] = decay(f) * sf[f * LS + j] + x; });
        });
      } else {
        ladle_tiles(C, VS, [&](int m0, int n0) {  // dE = M^T dO + kd dS
          LadleTileAcc acc;
          ladle_tile_zero(acc);
          ladle_tile_mma<true, true>(acc, s.m, LT, s.x, LT, m0, n0, C);
          ladle_tile_mma<false, true>(acc, s.kd, LK, sb, LT, m0, n0, KP);
          ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
            *reinterpret_cast<unsigned*>(eb + i * LT + j) = ladle_pack_bf16(x, y);
          });
        });
        __syncthreads();
        ladle_wy_store(work.de + q * C * VP + j0, VP, eb, LT, C, VS);
        ladle_tiles(KP, VS, [&](int m0, int n0) {  // dS = diag(e^(g_C)) dS + qg^T dO - W^T dE
          LadleTileAcc acc, minus;
          ladle_tile_zero(acc);
          ladle_tile_zero(minus);
          ladle_tile_mma<true, true>(acc, s.qg, LK, s.x, LT, m0, n0, C);
          ladle_tile_mma<true, true>(minus, s.w, LK, eb, LT, m0, n0, C);
          ladle_tile_sub(acc, minus);
          ladle_tile_each(acc, m0, n0, [&](int f, int j, float x) { sf[f * LS + j] = decay(f) * sf[f * LS + j] + x; });
        });
      }
      __syncthreads();
    }
    if (chunks == 0) {
      load_state(d_final);
      __syncthreads();
    }
    if (p.d_h0)
      for (int e = threadIdx.x; e < K * VS; e += blockDim.x) {
        const int f = e / VS, j = e % VS;
        if (j0 + j < V) p.d_h0[state_at + static_cast<long long>(f) * V + j0 + j] = sf[f * LS + j];
      }
  }
};

#endif  // LADLE_WY_BACKWARD
