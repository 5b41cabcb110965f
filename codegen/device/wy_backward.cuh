// The delta rule's and the gated delta rule's chunked backward on the tensor cores, device side: three
// kernels over the same parameters as ladle_bwd_update (update_backward.cuh: LadleUpdateArgs, the
// slots the generated slots kernel wrote, the slots' gradients out), args.ckpt their work arrays.
// codegen/cuda/update_backward.h says what each computes, its grid and its work arrays' layout.
// Within a chunk of C = 64 tokens with cumulative log decay g (g_t = log_h_1 + ... + log_h_t; 0
// without a decay), Gamma_ts = exp(g_t - g_s), the forward is
//   L = tril(diag(beta) (K K^T . Gamma), -1), T = (I + L)^(-1), W = T diag(beta e^g) K, U = T diag(beta) V,
//   E = U - W S_0, O = diag(e^g) Q S_0 + (Q K^T . Gamma)_(t >= s) E,
//   S_C = e^(g_C) S_0 + (diag(e^(g_C - g)) K)^T E,
// with q and k as the recurrence reads them (qhat, khat: scaled and L2-normalised). The products
// run on mma.sync from bf16 tiles in shared memory (block_mma.cuh), fp32 accumulators; the states,
// T's substitution and every gate and strength gradient are fp32. Needs storage.cuh, tensor_core.cuh,
// block_mma.cuh and update_backward.cuh first.
#ifndef LADLE_WY_BACKWARD
#define LADLE_WY_BACKWARD

#define LADLE_WY_C 64          // tokens a chunk
#define LADLE_WY_VS 64         // value columns a block of the states and gradient kernels
#define LADLE_WY_LOG_FLOOR (-110.0f) // a log decay below counts as this one (exp: 0 in fp32; a hard reset's -inf included)

// The work arrays, carved from args.ckpt in this order, for `chunks` = N H C chunks (C: chunks of
// the longest sequence) with KP key rows and VP = 64 ceil(V / 64) value columns, row-major per chunk,
// bf16: qhat, khat, kd = e^(g_C - g) khat, qg = e^g qhat, W [C][KP]; U, E, dE, dO, v [C][VP]; h (the
// state entering the chunk), dh (dL/d the state leaving it) [KP][VP]; M = (Q K^T . Gamma)_(t >= s),
// T [C][C]; then g [C] in fp32. update_backward_ckpt_floats mirrors it.
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
// are in and p is 8-byte aligned, else atomic adds.
__device__ __forceinline__ void ladle_red_add2(float* p, float a, float b, bool second, bool first) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (second && (reinterpret_cast<unsigned long long>(p) & 7ull) == 0) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
    return;
  }
#endif
  if (first) atomicAdd(p, a);
  if (second) atomicAdd(p + 1, b);
}

__device__ __forceinline__ void ladle_tile_sub(LadleTileAcc& acc, const LadleTileAcc& other) {
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int r = 0; r < 4; ++r) acc[j][r] -= other[j][r];
}

// One block of LadleWy's gradients kernel (below): chunk blockIdx.x of (sequence, head)
// blockIdx.y, its shared memory, and the steps LadleWy::gradients runs in order. In each tile: this
// lane's rows m0 + row8 + 8h, h < 2, and columns n0 + 8j + col2 + e, j < 4, e < 2, fragment register
// 2h + e; a warp owns tile (cm, cn) of a C x C result and tiles (km(i), kn(i)), i < NT, of a C x KP one.
template <int KP, unsigned FORM>
struct LadleWyGradients {
  static constexpr int C = LADLE_WY_C, VS = LADLE_WY_VS, LK = KP + 8, LT = LADLE_WY_VS + 8;
  static constexpr int NT = KP / 64, across = KP / 32;  // a warp's 16 x 32 tiles of a C x KP result; tiles across it
  static constexpr bool head = (FORM & ladle_upd_head) != 0, has_beta = (FORM & ladle_upd_beta) != 0;
  // A value slice's tiles: h, dh [KP][LT]; E, dE, dO, v [C][LT] (16-bit halves).
  static constexpr int slice_halves = 2 * KP * LT + 4 * C * LT;
  static constexpr int shared_bytes = 2 * (2 * C * LK + C * LT + 2 * slice_halves) + 4 * (5 * C + 4);
  struct Slice {
    unsigned short *h, *dh, *e, *de, *dO, *v;
  };

  const LadleUpdateArgs& p;
  const LadleWySequence<FORM> seq;
  const int VP, K, V;
  const long long s0, q;
  const int L;
  const LadleWyWork work;
  unsigned short *const qb, *const kb, *const tb, *const slices;  // qhat, khat [C][LK]; T [C][LT]; two slices
  // After the slices, in the first one's space: dW [C][LK]; dM . Gamma (lower), dT, dT T^T, D + D^T [C][LT].
  unsigned short *const dwb, *const dmb, *const dtb, *const xb, *const dsb;
  // g, beta, dL/dg, dL/d beta, the state's part of dL/d g_C by row; dlast[0]: e^(g_C) <dh, h>.
  float *const gs, *const bs, *const dg, *const db, *const ds, *const dlast;
  const int warp, l, row8, col2, cm, cn;

  __device__ __forceinline__ LadleWyGradients(const LadleUpdateArgs& args, unsigned char* smem)
      : p(args), seq(args, blockIdx.y), VP((args.V + 63) / 64 * 64), K(args.K), V(args.V),
        s0(static_cast<long long>(blockIdx.x) * C), q(static_cast<long long>(blockIdx.y) * args.C + blockIdx.x),
        L(static_cast<int>(seq.len - s0 < C ? seq.len - s0 : C)),
        work(args.ckpt, static_cast<long long>(args.C) * gridDim.y, KP, (args.V + 63) / 64 * 64),
        qb(reinterpret_cast<unsigned short*>(smem)), kb(qb + C * LK), tb(kb + C * LK), slices(tb + C * LT),
        dwb(slices), dmb(dwb + C * LK), dtb(dmb + C * LT), xb(dtb + C * LT), dsb(xb + C * LT),
        gs(reinterpret_cast<float*>(slices + 2 * slice_halves)), bs(gs + C), dg(bs + C), db(dg + C), ds(db + C), dlast(ds + C),
        warp(threadIdx.x >> 5), l(threadIdx.x & 31), row8((threadIdx.x & 31) >> 2), col2(2 * (threadIdx.x & 3)),
        cm((warp / 2) * 16), cn((warp % 2) * 32) {}

  __device__ __forceinline__ bool empty() const { return s0 >= seq.len; }
  __device__ __forceinline__ int km(int i) const { return ((warp + 8 * i) / across) * 16; }
  __device__ __forceinline__ int kn(int i) const { return ((warp + 8 * i) % across) * 32; }
  __device__ __forceinline__ Slice slice(int n) const {
    unsigned short* const b = slices + (n & 1) * slice_halves;
    return Slice{b, b + KP * LT, b + 2 * KP * LT, b + 2 * KP * LT + C * LT, b + 2 * KP * LT + 2 * C * LT, b + 2 * KP * LT + 3 * C * LT};
  }
  __device__ __forceinline__ void fetch_slice(int n) const {
    const Slice b = slice(n);
    const int j0 = n * VS;
    ladle_wy_fetch(b.h, LT, work.h + q * KP * VP + j0, VP, KP, VS);
    ladle_wy_fetch(b.dh, LT, work.dh + q * KP * VP + j0, VP, KP, VS);
    ladle_wy_fetch(b.e, LT, work.e + q * C * VP + j0, VP, C, VS);
    ladle_wy_fetch(b.de, LT, work.de + q * C * VP + j0, VP, C, VS);
    ladle_wy_fetch(b.dO, LT, work.dov + q * C * VP + j0, VP, C, VS);
    ladle_wy_fetch(b.v, LT, work.vv + q * C * VP + j0, VP, C, VS);
    ladle_cp_async_commit();
  }

  // 1. The value slices, each fetched during the one before: dm = dO E^T, dev = dE V^T, dqs = dO h^T,
  //    dws = dE h^T, dks = E dh^T summed over them; dv and d beta's v part per slice; e^(g_C) <dh, h>.
  __device__ __forceinline__ void slices_pass(LadleTileAcc& dm, LadleTileAcc& dev, LadleTileAcc (&dqs)[NT], LadleTileAcc (&dws)[NT],
                                              LadleTileAcc (&dks)[NT]) {
    ladle_wy_fetch(qb, LK, work.qh + q * C * KP, KP, C, KP);
    ladle_wy_fetch(kb, LK, work.kh + q * C * KP, KP, C, KP);
    ladle_wy_fetch(tb, LT, work.t + q * C * C, C, C, C);
    ladle_wy_fetch(gs, 8, work.g + q * C, 8, C / 4, 8);  // C floats as 16-bit pairs
    fetch_slice(0);  // one group with the above
    if (threadIdx.x < C) {
      const int t = threadIdx.x;
      bs[t] = t < L ? (has_beta ? p.beta_s[seq.row(s0 + t)] : 1.0f) : 0.0f;
      dg[t] = db[t] = ds[t] = 0.0f;
    }
    if (threadIdx.x == 0) dlast[0] = 0.0f;
    const int slices_n = VP / VS;
    ladle_tile_zero(dm);
    ladle_tile_zero(dev);
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) ladle_tile_zero(dqs[i]), ladle_tile_zero(dws[i]), ladle_tile_zero(dks[i]);
    for (int n = 0; n < slices_n; ++n) {  // slice n's tiles, slice n + 1's in flight
      if (n + 1 < slices_n) {
        fetch_slice(n + 1);
        ladle_cp_async_wait<1>();
      } else {
        ladle_cp_async_wait<0>();
      }
      __syncthreads();
      const int j0 = n * VS;
      const Slice sl = slice(n);
      unsigned short *const hb = sl.h, *const dhb = sl.dh, *const eb = sl.e, *const deb = sl.de, *const dob = sl.dO, *const vb = sl.v;
      ladle_tile_mma<false, false>(dm, dob, LT, eb, LT, cm, cn, VS);
      ladle_tile_mma<false, false>(dev, deb, LT, vb, LT, cm, cn, VS);
      LADLE_UNROLL
      for (int i = 0; i < NT; ++i) {
        ladle_tile_mma<false, false>(dqs[i], dob, LT, hb, LT, km(i), kn(i), VS);
        ladle_tile_mma<false, false>(dws[i], deb, LT, hb, LT, km(i), kn(i), VS);
        ladle_tile_mma<false, false>(dks[i], eb, LT, dhb, LT, km(i), kn(i), VS);
      }
      {  // dV_b = T^T dE: dv = beta dV_b, dbeta += v . dV_b (this warp's C x 64 tile of the slice)
        LadleTileAcc acc;
        ladle_tile_zero(acc);
        ladle_tile_mma<true, true>(acc, tb, LT, deb, LT, cm, cn, C);
        float rows[2] = {0.0f, 0.0f};
        LADLE_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int i = cm + row8 + 8 * h;
          if (i >= L) continue;
          const long long r = seq.row(s0 + i);
          const float b = bs[i];
          LADLE_UNROLL
          for (int j = 0; j < 4; ++j)
            LADLE_UNROLL
            for (int e = 0; e < 2; ++e) {
              const int col = j0 + cn + 8 * j + col2 + e;
              if (col < V) {
                const float x = acc[j][2 * h + e];
                p.gv[r * V + col] = b * x;
                rows[h] += x * p.vf[r * V + col];
              }
            }
        }
        if (has_beta) ladle_tile_rows_add(db, cm, rows[0], rows[1]);
      }
      if (head) {  // e^(g_C) <dh, h>: d g_C through S_C = e^(g_C) S_0 + ...
        float part = 0.0f;
        for (int e = threadIdx.x; e < KP * VS; e += blockDim.x) {
          const int f = e / VS, j = e % VS;
          part += ladle_bf16_float(dhb[f * LT + j]) * ladle_bf16_float(hb[f * LT + j]);
        }
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        if (l == 0) atomicAdd(dlast, expf(gs[C - 1]) * part);
      }
      __syncthreads();  // slice n's space is the next fetch's (and, after the last, dW's and the C x C tiles')
    }
  }

  // 2. dM . Gamma (masked) and its gate terms, dW = -dE h^T, then dq = diag(e^g) dO h^T + dM K.
  __device__ __forceinline__ void dq_pass(const LadleTileAcc& dm, const LadleTileAcc (&dws)[NT], const LadleTileAcc (&dqs)[NT]) {
    {  // dM . Gamma, masked: dq += dM K, dk += dM^T Q, dg_t += dM_ts P_ts, dg_s -= dM_ts P_ts (P = Q K^T)
      LadleTileAcc qk;
      if (head) {
        ladle_tile_zero(qk);
        ladle_tile_mma<false, false>(qk, qb, LK, kb, LK, cm, cn, KP);
      }
      float rows[2] = {0.0f, 0.0f}, cols[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int i = cm + row8 + 8 * h;
        const float gi = gs[i];
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int s = cn + 8 * j + col2;
          float d[2];
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            d[e] = i >= s + e ? expf(gi - gs[s + e]) * dm[j][2 * h + e] : 0.0f;
            if (head) {
              const float t = d[e] * qk[j][2 * h + e];
              rows[h] += t, cols[j][e] -= t;
            }
          }
          *reinterpret_cast<unsigned*>(dmb + i * LT + s) = ladle_pack_bf16(d[0], d[1]);
        }
      }
      if (head) {
        ladle_tile_rows_add(dg, cm, rows[0], rows[1]);
        ladle_tile_cols_add(dg, cn, cols);
      }
    }
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i)  // dW = -dE h^T
      ladle_tile_each_pair(dws[i], km(i), kn(i), [&](int r, int f, float x, float y) {
        *reinterpret_cast<unsigned*>(dwb + r * LK + f) = ladle_pack_bf16(-x, -y);
      });
    __syncthreads();
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) {  // dq = diag(e^g) dO h^T + dM K; dg_t += e^(g_t) qhat_t . (dO h^T)_t
      const int m0 = km(i), n0 = kn(i);
      LadleTileAcc local;
      ladle_tile_zero(local);
      ladle_tile_mma<false, true>(local, dmb, LT, kb, LK, m0, n0, C);
      float rows[2] = {0.0f, 0.0f};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + row8 + 8 * h;
        const float eg = expf(gs[r]);
        float* const out = p.gq + seq.row(s0 + (r < L ? r : 0)) * K;
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int f = n0 + 8 * j + col2;
          float d[2];
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float x = eg * dqs[i][j][2 * h + e];
            if (head) rows[h] += x * ladle_bf16_float(qb[r * LK + f + e]);
            d[e] = x + local[j][2 * h + e];
          }
          if (r < L && f < K) ladle_store2(out + f, d[0], d[1], f + 1 < K);
        }
      }
      if (head) ladle_tile_rows_add(dg, m0, rows[0], rows[1]);
    }
  }

  // 3. The WY chain: dT, X = dT T^T, dL = -(T^T X) below the diagonal and D + D^T.
  __device__ __forceinline__ void wy_pass(const LadleTileAcc& dev) {
    {  // dT = (dW (diag(beta e^g) K)^T + dE (diag(beta) V)^T)
      LadleTileAcc keys;
      ladle_tile_zero(keys);
      ladle_tile_mma<false, false>(keys, dwb, LK, kb, LK, cm, cn, KP);
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int s = cn + 8 * j + col2;
        const float b0 = bs[s], b1 = bs[s + 1], e0 = expf(gs[s]), e1 = expf(gs[s + 1]);
        LADLE_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int i = cm + row8 + 8 * h;
          *reinterpret_cast<unsigned*>(dtb + i * LT + s) =
              ladle_pack_bf16(b0 * (e0 * keys[j][2 * h] + dev[j][2 * h]), b1 * (e1 * keys[j][2 * h + 1] + dev[j][2 * h + 1]));
        }
      }
    }
    __syncthreads();
    {  // X = dT T^T
      LadleTileAcc acc;
      ladle_tile_zero(acc);
      ladle_tile_mma<false, false>(acc, dtb, LT, tb, LT, cm, cn, C);
      ladle_tile_each_pair(acc, cm, cn, [&](int i, int j, float x, float y) {
        *reinterpret_cast<unsigned*>(xb + i * LT + j) = ladle_pack_bf16(x, y);
      });
    }
    __syncthreads();
    {  // dL = -(T^T X) below the diagonal: dbeta_t += dL_ts Gamma_ts G_ts, dg_t += dL_ts L_ts,
       // dg_s -= dL_ts L_ts, D = dL . beta Gamma (the Gram's gradient) into D + D^T.
      LadleTileAcc acc, gram;  // T^T X, K K^T
      ladle_tile_zero(acc);
      ladle_tile_zero(gram);
      ladle_tile_mma<true, true>(acc, tb, LT, xb, LT, cm, cn, C);
      if (head || has_beta) ladle_tile_mma<false, false>(gram, kb, LK, kb, LK, cm, cn, KP);
      float rows[2] = {0.0f, 0.0f}, brows[2] = {0.0f, 0.0f}, cols[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int i = cm + row8 + 8 * h;
        const float gi = gs[i], bi = bs[i];
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j)
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int s = cn + 8 * j + col2 + e;
            if (i < s) continue;  // written with (s, i)
            if (i == s || i >= L) {
              dsb[i * LT + s] = dsb[s * LT + i] = 0;
              continue;
            }
            const float gamma = expf(gi - gs[s]), dl = -acc[j][2 * h + e], plain = dl * gamma * gram[j][2 * h + e];
            const unsigned short bits = ladle_bf16_bits(dl * bi * gamma);
            dsb[i * LT + s] = bits, dsb[s * LT + i] = bits;
            brows[h] += plain;
            if (head) rows[h] += bi * plain, cols[j][e] -= bi * plain;
          }
      }
      if (has_beta) ladle_tile_rows_add(db, cm, brows[0], brows[1]);
      if (head) {
        ladle_tile_rows_add(dg, cm, rows[0], rows[1]);
        ladle_tile_cols_add(dg, cn, cols);
      }
    }
    __syncthreads();
  }

  // 4. dk, then each token's d beta and d log h.
  __device__ __forceinline__ void dk_pass(const LadleTileAcc (&dks)[NT]) {
    const float last = gs[C - 1];
    // dk = dM^T Q + diag(e^(g_C - g)) E dh^T + diag(beta e^g) T^T dW + (D + D^T) K;
    // ds_t = e^(g_C - g_t) khat_t . (E dh^T)_t; dbeta_t += e^(g_t) khat_t . (T^T dW)_t, dg_t += beta_t that.
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) {
      const int m0 = km(i), n0 = kn(i);
      LadleTileAcc local, wy, gram;
      ladle_tile_zero(local);
      ladle_tile_zero(wy);
      ladle_tile_zero(gram);
      ladle_tile_mma<true, true>(local, dmb, LT, qb, LK, m0, n0, C);
      ladle_tile_mma<true, true>(wy, tb, LT, dwb, LK, m0, n0, C);
      ladle_tile_mma<false, true>(gram, dsb, LT, kb, LK, m0, n0, C);
      float srows[2] = {0.0f, 0.0f}, wrows[2] = {0.0f, 0.0f};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + row8 + 8 * h;
        const float fwd = expf(last - gs[r]), eg = expf(gs[r]), bi = bs[r];
        float* const out = p.gk + seq.row(s0 + (r < L ? r : 0)) * K;
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int f = n0 + 8 * j + col2;
          float d[2];
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int x = 2 * h + e;
            const float sx = fwd * dks[i][j][x], wx = eg * wy[j][x];
            if (head || has_beta) {
              const float k = ladle_bf16_float(kb[r * LK + f + e]);
              srows[h] += k * sx, wrows[h] += k * wx;
            }
            d[e] = local[j][x] + sx + bi * wx + gram[j][x];
          }
          if (r < L && f < K) ladle_store2(out + f, d[0], d[1], f + 1 < K);
        }
      }
      if (head) ladle_tile_rows_add(ds, m0, srows[0], srows[1]);
      if (has_beta) ladle_tile_rows_add(db, m0, wrows[0], wrows[1]);
      if (head) ladle_tile_rows_add(dg, m0, bs[m0 + row8] * wrows[0], bs[m0 + row8 + 8] * wrows[1]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (has_beta)
        for (int t = 0; t < L; ++t) p.gbeta[seq.row(s0 + t)] = db[t];
      if (head) {
        // d g_C: e^(g_C) <dh, h> + sum_s ds_s; each row's own -ds. Then d log_h_t = sum_(i >= t) dg_i.
        float total = dlast[0];
        for (int t = 0; t < L; ++t) total += ds[t], dg[t] -= ds[t];
        dg[L - 1] += total;
        float run = 0.0f;
        for (int t = L - 1; t >= 0; --t) {
          run += dg[t];
          p.ga[seq.row(s0 + t)] = run;  // the chunked form's ga: d log h per token
        }
      }
    }
  }
};

template <int KP, unsigned FORM>
struct LadleWy {
  static constexpr int C = LADLE_WY_C, VS = LADLE_WY_VS, LK = KP + 8, LT = LADLE_WY_VS + 8, LC = LADLE_WY_C + 1, LS = LADLE_WY_VS + 4;
  static constexpr bool head = (FORM & ladle_upd_head) != 0, has_beta = (FORM & ladle_upd_beta) != 0, l2 = (FORM & ladle_upd_l2) != 0;
  static constexpr bool scale_table = (FORM & ladle_upd_scale_table) != 0;
  // The states kernel's stage: W, kd, qg [C][LK]; M, then U or dO [C][LT]; g [C].
  static constexpr int stage_bytes = 2 * (3 * C * LK + 2 * C * LT) + 4 * C;

  // Shared memory of each kernel in bytes (update_backward.cpp's wy_launches mirrors them).
  static constexpr int prepare_shared(int VP) { return 2 * (3 * C * LK + C * (VP + 8) + C * LT) + 4 * (2 * C * LC + 4 * C); }
  static constexpr int states_shared() { return 4 * KP * LS + 2 * (KP * LT + C * LT) + 2 * stage_bytes; }
  static constexpr int gradients_shared() { return LadleWyGradients<KP, FORM>::shared_bytes; }

  // For each four columns of each of the chunk's rows: x and y from the slots a and b ([rows][n]; zero
  // past the chunk's tokens and past n), then put(t, f, x, y); `width` columns a row (n padded).
  template <class Put>
  static __device__ __forceinline__ void stage_rows(const LadleWySequence<FORM>& seq, long long s0, int L, const float* a, const float* b,
                                                    int n, int width, Put&& put) {
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

  // 1. prepare (grid: C, N H; 256 threads): chunk blockIdx.x of (sequence, head) blockIdx.y: every
  //    tile the later kernels read, in bf16 (qhat, khat, kd, qg, dO, v), g, M, T (by substitution,
  //    fp32), W and U.
  static __device__ void prepare(const LadleUpdateArgs& p) {
    const int VP = (p.V + 63) / 64 * 64, LV = VP + 8, K = p.K, V = p.V, c = blockIdx.x, nh = blockIdx.y;
    const LadleWySequence<FORM> seq(p, nh);
    const long long s0 = static_cast<long long>(c) * C;
    if (s0 >= seq.len) return;
    const int L = static_cast<int>(seq.len - s0 < C ? seq.len - s0 : C);
    const LadleWyWork work(p.ckpt, static_cast<long long>(p.C) * gridDim.y, KP, VP);
    const long long q = static_cast<long long>(nh) * p.C + c;
    LADLE_DYNAMIC_SHARED(smem);
    unsigned short* const qb = reinterpret_cast<unsigned short*>(smem);  // qhat [C][LK]
    unsigned short* const kb = qb + C * LK;                               // khat [C][LK]
    unsigned short* const kgb = kb + C * LK;                              // beta e^g khat [C][LK]
    unsigned short* const vb = kgb + C * LK;                              // beta v [C][LV]
    unsigned short* const tb = vb + C * LV;                               // T [C][LT]
    float* const lf = reinterpret_cast<float*>(tb + C * LT);              // L [C][LC]
    float* const tf = lf + C * LC;                                        // T [C][LC]
    float* const gs = tf + C * LC;
    float* const bs = gs + C;
    float* const qsc = bs + C;
    float* const krn = qsc + C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;

    // A warp a token: the norms, the strength and the log decay (zero past the chunk's tokens).
    for (int t = warp; t < C; t += warps) {
      float qq = 0.0f, kk = 0.0f;
      const long long r = seq.row(s0 + (t < L ? t : 0));
      if (t < L)
        for (int f = lane; f < K; f += 32) {
          const float x = p.qs[r * K + f], y = p.kf[r * K + f];
          qq += x * x, kk += y * y;
        }
      for (int off = 16; off > 0; off >>= 1) qq += __shfl_xor_sync(0xffffffffu, qq, off), kk += __shfl_xor_sync(0xffffffffu, kk, off);
      if (lane == 0) {
        const bool live = t < L;
        const float sc = scale_table ? (live ? p.scale_s[r] : 0.0f) : p.scale;
        qsc[t] = live ? sc * (l2 ? rsqrtf(qq + p.eps) : 1.0f) : 0.0f;
        krn[t] = live ? (l2 ? rsqrtf(kk + p.eps) : 1.0f) : 0.0f;
        bs[t] = live ? (has_beta ? p.beta_s[r] : 1.0f) : 0.0f;
        gs[t] = live && head ? fmaxf(p.log_h[r], LADLE_WY_LOG_FLOOR) : 0.0f;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // cumulative; the rows past the chunk's tokens keep its last
      float run = 0.0f;
      for (int t = 0; t < C; ++t) run += gs[t], gs[t] = run;
    }
    __syncthreads();
    const float last = gs[C - 1];
    stage_rows(seq, s0, L, p.qs, p.kf, K, KP, [&](int t, int f, const float (&x)[4], const float (&y)[4]) {
      const long long at = (q * C + t) * KP + f;
      const float eg = expf(gs[t]);
      ladle_wy_put4(qb + t * LK + f, x, qsc[t]);
      ladle_wy_put4(kb + t * LK + f, y, krn[t]);
      ladle_wy_put4(kgb + t * LK + f, y, bs[t] * eg * krn[t]);
      ladle_wy_put4(work.qh + at, x, qsc[t]);
      ladle_wy_put4(work.kh + at, y, krn[t]);
      ladle_wy_put4(work.kd + at, y, expf(last - gs[t]) * krn[t]);
      ladle_wy_put4(work.qg + at, x, eg * qsc[t]);
    });
    stage_rows(seq, s0, L, p.vf, p.dos, V, VP, [&](int t, int j, const float (&x)[4], const float (&d)[4]) {
      const long long at = (q * C + t) * VP + j;
      ladle_wy_put4(vb + t * LV + j, x, bs[t]);
      ladle_wy_put4(work.vv + at, x, 1.0f);
      ladle_wy_put4(work.dov + at, d, 1.0f);
    });
    if (threadIdx.x < C) work.g[q * C + threadIdx.x] = gs[threadIdx.x];
    __syncthreads();
    // M = (Q K^T . Gamma)_(t >= s) into the work array; L = tril(diag(beta) (K K^T . Gamma), -1).
    ladle_tiles(C, C, [&](int m0, int n0) {
      LadleTileAcc acc, gram;
      ladle_tile_zero(acc);
      ladle_tile_zero(gram);
      ladle_tile_mma<false, false>(acc, qb, LK, kb, LK, m0, n0, KP);
      ladle_tile_mma<false, false>(gram, kb, LK, kb, LK, m0, n0, KP);
      ladle_tile_each_pair(acc, m0, n0, [&](int i, int j, float x, float y) {
        *reinterpret_cast<unsigned*>(work.m + q * C * C + i * C + j) =
            ladle_pack_bf16(i >= j ? expf(gs[i] - gs[j]) * x : 0.0f, i >= j + 1 ? expf(gs[i] - gs[j + 1]) * y : 0.0f);
      });
      ladle_tile_each(gram, m0, n0, [&](int i, int j, float x) { lf[i * LC + j] = i > j ? bs[i] * expf(gs[i] - gs[j]) * x : 0.0f; });
    });
    __syncthreads();
    // T = (I + L)^(-1) in 16 x 16 blocks. The diagonal blocks by substitution, a lane a column of
    // its warp's block (T_ij = [i = j] - sum_(j <= m < i) L_im T_mj reads only its own column); then
    // the blocks below them by distance d = 1, 2, 3: T_IJ = -T_II sum_(J <= M < I) L_IM T_MJ, through
    // X [3][16][16] (in tb's space until T is whole). Above the diagonal blocks: zero.
    {
      float* const xs = reinterpret_cast<float*>(tb);
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
    for (int e = threadIdx.x; e < C * C / 2; e += blockDim.x) {
      const int i = (2 * e) / C, j = (2 * e) % C;
      const unsigned pair = ladle_pack_bf16(tf[i * LC + j], tf[i * LC + j + 1]);
      *reinterpret_cast<unsigned*>(tb + i * LT + j) = pair;
      *reinterpret_cast<unsigned*>(work.t + q * C * C + 2 * e) = pair;
    }
    __syncthreads();
    // W = T diag(beta e^g) K, U = T diag(beta) V
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

  // 2. states (grid: VP / 64, N H; 256 threads): the serial pass over one sequence's chunks for 64
  //    value columns, the state in shared memory (fp32), each step's tiles fetched (cp.async) during
  //    the step before. Forward: h = S_0, E = U - W S_0, S_C; then backward from d_final: dh = dS (the
  //    gradient of the state leaving the chunk), dE = M^T dO + kd dS, dS becomes
  //    e^(g_C) dS + qg^T dO - W^T dE; at the end d initial_state.
  static __device__ void states(const LadleUpdateArgs& p) {
    const int VP = (p.V + 63) / 64 * 64, K = p.K, V = p.V, nh = blockIdx.y, j0 = blockIdx.x * VS;
    const LadleWySequence<FORM> seq(p, nh);
    const long long chunks = (seq.len + C - 1) / C, steps = 2 * chunks;
    const LadleWyWork work(p.ckpt, static_cast<long long>(p.C) * gridDim.y, KP, VP);
    LADLE_DYNAMIC_SHARED(smem);
    float* const sf = reinterpret_cast<float*>(smem);                            // S, then dS [KP][LS]
    unsigned short* const sb = reinterpret_cast<unsigned short*>(sf + KP * LS);  // S or dS in bf16 [KP][LT]
    unsigned short* const eb = sb + KP * LT;                                     // E, then dE [C][LT]
    unsigned char* const stages = reinterpret_cast<unsigned char*>(eb + C * LT);
    struct Stage {
      unsigned short *w, *kd, *qg, *m, *x;  // x: U (forward) or dO (backward)
      float* g;
    };
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
      ladle_wy_fetch(s.g, 8, work.g + q * C, 8, C / 4, 8);  // C floats as 16-bit pairs
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
      const float decay = expf(s.g[C - 1]);
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
        ladle_tiles(KP, VS, [&](int m0, int n0) {  // S_C = e^(g_C) S_0 + kd^T E
          LadleTileAcc acc;
          ladle_tile_zero(acc);
          ladle_tile_mma<true, true>(acc, s.kd, LK, eb, LT, m0, n0, C);
          ladle_tile_each(acc, m0, n0, [&](int f, int j, float x) { sf[f * LS + j] = decay * sf[f * LS + j] + x; });
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
        ladle_tiles(KP, VS, [&](int m0, int n0) {  // dS = e^(g_C) dS + qg^T dO - W^T dE
          LadleTileAcc acc, minus;
          ladle_tile_zero(acc);
          ladle_tile_zero(minus);
          ladle_tile_mma<true, true>(acc, s.qg, LK, s.x, LT, m0, n0, C);
          ladle_tile_mma<true, true>(minus, s.w, LK, eb, LT, m0, n0, C);
          ladle_tile_sub(acc, minus);
          ladle_tile_each(acc, m0, n0, [&](int f, int j, float x) { sf[f * LS + j] = decay * sf[f * LS + j] + x; });
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

  // 3. gradients (grid: C, N H; 256 threads, 8 warps): every chunk at once, from h, dh, E, dE and T,
  //    the value width 64 columns at a time: what sums over the values (dM = dO E^T, dE V^T, dO h^T,
  //    dW = -dE h^T, E dh^T) accumulates in each warp's registers over the slices, dv is written per
  //    slice; then the chunk's C x C chain once, and dL/d qhat, d khat, d beta and d log_h (args.ga:
  //    [rows], not the recurrent form's [rows, K]) written (no other block writes this chunk's tokens).
  //    LadleWyGradients holds the steps.
  static __device__ void gradients(const LadleUpdateArgs& p) {
    using G = LadleWyGradients<KP, FORM>;
    LADLE_DYNAMIC_SHARED(smem);
    G block(p, smem);
    if (block.empty()) return;
    LadleTileAcc dm, dev, dqs[G::NT], dws[G::NT], dks[G::NT];  // dO E^T, dE V^T; dO h^T, dE h^T, E dh^T
    block.slices_pass(dm, dev, dqs, dws, dks);
    block.dq_pass(dm, dws, dqs);
    block.wy_pass(dev);
    block.dk_pass(dks);
  }
};

#endif  // LADLE_WY_BACKWARD
