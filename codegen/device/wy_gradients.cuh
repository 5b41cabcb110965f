// The chunked delta backward's gradients kernel and the three kernels' entry points (LadleWy); the
// forms, the work arrays, prepare and states are wy_backward.cuh's (included first).
#ifndef LADLE_WY_GRADIENTS
#define LADLE_WY_GRADIENTS

// out_tf += sum_(s in t's block, s <= t) X_ts b_sf 2^(g_tf - g_sf) (LOWER), or
// out_sf += sum_(t in s's block, t >= s) w_t X_ts b_tf 2^(g_tf - g_sf) (else; w null: 1); X is zero
// outside those ranges (dM masked, dL strictly lower). The lane's two rows r0 and r1 = r0 + 8 share
// one exponential an element: the row whose terms start later takes it as is, the other times
// 2^(g_r1 - g_r0) (at most 1); exponents clamped at 0 where X is 0, so that nothing overflows.
template <bool LOWER>
__device__ __forceinline__ void ladle_wy_diagonal(LadleTileAcc& out, const unsigned short* X, int ldx, const unsigned short* b, int ldb,
                                                  const float* g, int ldg, const float* w, int m0, int n0) {
  const int l = threadIdx.x & 31, r0 = m0 + (l >> 2), r1 = r0 + 8, col2 = 2 * (l & 3);
  float own0[4][2], own1[4][2], ratio[4][2];
  LADLE_UNROLL
  for (int j = 0; j < 4; ++j)
    LADLE_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int f = n0 + 8 * j + col2 + e;
      own0[j][e] = g[r0 * ldg + f], own1[j][e] = g[r1 * ldg + f], ratio[j][e] = ladle_exp2(own1[j][e] - own0[j][e]);
    }
  for (int o = m0; o < m0 + 16; ++o) {  // o: s (LOWER) or t
    const bool second = LOWER ? o > r0 : o >= r1;  // the exponential is row r1's
    const float wo = LOWER || !w ? 1.0f : w[o];
    const float x0 = ladle_bf16_float(LOWER ? X[r0 * ldx + o] : X[o * ldx + r0]) * wo;
    const float x1 = ladle_bf16_float(LOWER ? X[r1 * ldx + o] : X[o * ldx + r1]) * wo;
    LADLE_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int f = n0 + 8 * j + col2;
      const unsigned pair = *reinterpret_cast<const unsigned*>(b + o * ldb + f);
      const float bv[2] = {ladle_bf16_float(static_cast<unsigned short>(pair & 0xffffu)), ladle_bf16_float(static_cast<unsigned short>(pair >> 16))};
      LADLE_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float go = g[o * ldg + f + e], ref = second ? own1[j][e] : own0[j][e];
        const float be = bv[e] * ladle_exp2(fminf(LOWER ? ref - go : go - ref, 0.0f));
        if (LOWER) out[j][e] += x0 * be, out[j][2 + e] += x1 * be * (second ? 1.0f : ratio[j][e]);
        else out[j][2 + e] += x1 * be, out[j][e] += x0 * be * (second ? ratio[j][e] : 1.0f);
      }
    }
  }
}

// A per-feature decay's products of a C x C matrix X (bf16 [t][s], row stride ldx) with a C x KP
// one, for the 16 x 32 tile (m0, n0) of the result (this lane's values as in block_mma.cuh), g the
// cumulative log decays [C][ldg] in log2 units (fp32; e^(g_t - g_s) = 2^(g2_t - g2_s)); X is zero
// where the sum takes no term:
//   lower: out_tf = sum_(s <= t) X_ts b_sf e^(g_tf - g_sf). Below the diagonal blocks on the tensor
//          cores from bt = b e^(g_rho - g) (rho: the last row of each row's 16-token block), block by
//          block J with the partial sum carried from J - 1's reference to J's (a factor
//          e^(g_rhoJ - g_rho(J-1)) per column, at most 1);
//   upper: out_sf = sum_(t >= s) w_t X_ts c_tf e^(g_tf - g_sf) (w null: 1). Below the diagonal blocks
//          from ct = w c e^(g - g_lambda) (lambda: the first row of each row's block), blocks I from
//          the last down.
// Every factor is at most 1, so no decay, however strong, overflows. Then the diagonal block
// (ladle_wy_diagonal), element by element from the unscaled tile b or c: there the products for dq
// and for dk (whose q . dq - k . dk sum in d log a cancels over the block) take the same rounded
// operands, so that the gate's gradients keep their precision. (On the tensor cores with scaled
// copies, as prepare forms M and L, each side took its own rounding: KDA's d A_log and d dt_bias,
// sums of d log a over every token, went from within 1.5e-2 to 7.6e-2 and 1.0e-1 of the fp64
// reference.)
template <int C>
__device__ __forceinline__ void ladle_wy_lower(LadleTileAcc& out, const unsigned short* X, int ldx, const unsigned short* bt,
                                               const unsigned short* b, int ldb, const float* g, int ldg, int m0, int n0) {
  const int l = threadIdx.x & 31, row8 = l >> 2, col2 = 2 * (l & 3), I = m0 / 16;
  ladle_tile_zero(out);
  for (int J = 0; J < I; ++J) {
    if (J > 0)
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j)
        LADLE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int f = n0 + 8 * j + col2 + e;
          const float w = ladle_exp2(g[(16 * J + 15) * ldg + f] - g[(16 * J - 1) * ldg + f]);
          out[j][e] *= w, out[j][2 + e] *= w;
        }
    ladle_tile_mma<false, true>(out, X + 16 * J, ldx, bt + 16 * J * ldb, ldb, m0, n0, 16);
  }
  if (I > 0)
    LADLE_UNROLL
    for (int h = 0; h < 2; ++h)
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j)
        LADLE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int t = m0 + row8 + 8 * h, f = n0 + 8 * j + col2 + e;
          out[j][2 * h + e] *= ladle_exp2(g[t * ldg + f] - g[(16 * I - 1) * ldg + f]);
        }
  ladle_wy_diagonal<true>(out, X, ldx, b, ldb, g, ldg, nullptr, m0, n0);
}

template <int C>
__device__ __forceinline__ void ladle_wy_upper(LadleTileAcc& out, const unsigned short* X, int ldx, const unsigned short* ct,
                                               const unsigned short* c, const float* w, int ldc, const float* g, int ldg, int m0,
                                               int n0) {
  const int l = threadIdx.x & 31, row8 = l >> 2, col2 = 2 * (l & 3), J = m0 / 16;
  ladle_tile_zero(out);
  for (int I = C / 16 - 1; I > J; --I) {
    if (I < C / 16 - 1)
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j)
        LADLE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int f = n0 + 8 * j + col2 + e;
          const float carry = ladle_exp2(g[(16 * I + 16) * ldg + f] - g[16 * I * ldg + f]);
          out[j][e] *= carry, out[j][2 + e] *= carry;
        }
    ladle_tile_mma<true, true>(out, X + 16 * I * ldx, ldx, ct + 16 * I * ldc, ldc, m0, n0, 16);
  }
  if (J < C / 16 - 1)
    LADLE_UNROLL
    for (int h = 0; h < 2; ++h)
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j)
        LADLE_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int s = m0 + row8 + 8 * h, f = n0 + 8 * j + col2 + e;
          out[j][2 * h + e] *= ladle_exp2(g[(16 * J + 16) * ldg + f] - g[s * ldg + f]);
        }
  ladle_wy_diagonal<false>(out, X, ldx, c, ldc, g, ldg, w, m0, n0);
}

// One block of the gradients kernel: chunk blockIdx.x of (sequence, head) blockIdx.y and its shared
// memory. In each tile: this lane's rows m0 + row8 + 8h, h < 2, and columns n0 + 8j + col2 + e,
// j < 4, e < 2, fragment register 2h + e; a warp owns tile (cm, cn) of a C x C result and tiles
// (km(i), kn(i)), i < NT, of a C x KP one.
template <int KP, unsigned FORM>
struct LadleWyBlock : LadleWyShape<KP, FORM> {
  using S = LadleWyShape<KP, FORM>;
  using S::C, S::VS, S::LK, S::LT, S::LG, S::head, S::key, S::has_beta, S::slice_halves;
  static constexpr int NT = KP / 64, across = KP / 32;  // a warp's 16 x 32 tiles of a C x KP result; tiles across it
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
  // After the slices, in their space: dW [C][LK]; dM (. Gamma, a head decay's), dT, dT T^T, dL's
  // (D + D^T for a head decay) [C][LT]; a key decay's kr = khat e^(g_rho - g), ql = qhat e^(g - g_lambda)
  // (first khat e^g), bkl = beta khat e^(g - g_lambda) [C][LK] and g [C][LG] (fp32, log2 units).
  unsigned short *const dwb, *const dmb, *const dtb, *const xb, *const dsb, *const kr, *const ql, *const bkl;
  float* const gk;
  // g, beta, dL/dg, dL/d beta, the state's part of dL/d g_C by row [C]; dlast[0]: e^(g_C) <dh, h>;
  // a key decay's dL/d g_C and <dh, h> per feature [KP].
  float *const gs, *const bs, *const dg, *const db, *const ds, *const dlast, *const gc, *const dhh;
  const int warp, l, row8, col2, cm, cn;

  __device__ __forceinline__ LadleWyBlock(const LadleUpdateArgs& args, unsigned char* smem)
      : p(args), seq(args, blockIdx.y), VP((args.V + 63) / 64 * 64), K(args.K), V(args.V),
        s0(static_cast<long long>(blockIdx.x) * C), q(static_cast<long long>(blockIdx.y) * args.C + blockIdx.x),
        L(static_cast<int>(seq.len - s0 < C ? seq.len - s0 : C)),
        work(args.ckpt, static_cast<long long>(args.C) * gridDim.y, KP, (args.V + 63) / 64 * 64),
        qb(reinterpret_cast<unsigned short*>(smem)), kb(qb + C * LK), tb(kb + C * LK), slices(tb + C * LT),
        dwb(slices), dmb(dwb + C * LK), dtb(dmb + C * LT), xb(dtb + C * LT), dsb(xb + C * LT), kr(dsb + C * LT), ql(kr + C * LK),
        bkl(ql + C * LK), gk(reinterpret_cast<float*>(bkl + C * LK)),
        gs(reinterpret_cast<float*>(slices + 2 * slice_halves)), bs(gs + C), dg(bs + C), db(dg + C), ds(db + C), dlast(ds + C),
        gc(dlast + 4), dhh(gc + KP), warp(threadIdx.x >> 5), l(threadIdx.x & 31), row8((threadIdx.x & 31) >> 2),
        col2(2 * (threadIdx.x & 3)), cm((warp / 2) * 16), cn((warp % 2) * 32) {}

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
  // A key decay's tile dst [C][LK] = khat or qhat (src) times beta (by_beta) and e^(sign (g_t - g_ref(t))),
  // ref(t) a row (or -1: g_ref = 0); then a barrier.
  template <class Ref>
  __device__ __forceinline__ void scaled(unsigned short* dst, const unsigned short* src, bool by_beta, float sign, Ref&& ref) const {
    for (int e = threadIdx.x; e < C * KP / 2; e += blockDim.x) {
      const int t = e / (KP / 2), f = 2 * (e % (KP / 2)), r = ref(t);
      const float b = by_beta ? bs[t] : 1.0f, r0 = r < 0 ? 0.0f : gk[r * LG + f], r1 = r < 0 ? 0.0f : gk[r * LG + f + 1];
      *reinterpret_cast<unsigned*>(dst + t * LK + f) = ladle_pack_bf16(b * ladle_bf16_float(src[t * LK + f]) * ladle_exp2(sign * (gk[t * LG + f] - r0)),
                                                                       b * ladle_bf16_float(src[t * LK + f + 1]) * ladle_exp2(sign * (gk[t * LG + f + 1] - r1)));
    }
    __syncthreads();
  }
};

// The gradients kernel's first steps: the value slices, then dq.
template <int KP, unsigned FORM>
struct LadleWyFront : LadleWyBlock<KP, FORM> {
  using B = LadleWyBlock<KP, FORM>;
  using B::B, B::C, B::VS, B::LK, B::LT, B::LG, B::head, B::key, B::has_beta, B::NT;
  using B::p, B::seq, B::VP, B::K, B::V, B::s0, B::q, B::L, B::work, B::qb, B::kb, B::tb, B::dwb, B::dmb, B::kr, B::gk;
  using B::gs, B::bs, B::dg, B::db, B::ds, B::dlast, B::gc, B::dhh, B::warp, B::l, B::row8, B::col2, B::cm, B::cn;
  using B::km, B::kn, B::slice, B::fetch_slice, B::scaled;

  // 1. The value slices, each fetched during the one before: dm = dO E^T, dev = dE V^T, dqs = dO h^T,
  //    dws = dE h^T, dks = E dh^T summed over them; dv and d beta's v part per slice; <dh, h> (times
  //    e^(g_C) for a head decay; per feature for a key one).
  __device__ __forceinline__ void slices_pass(LadleTileAcc& dm, LadleTileAcc& dev, LadleTileAcc (&dqs)[NT], LadleTileAcc (&dws)[NT],
                                              LadleTileAcc (&dks)[NT]) {
    ladle_wy_fetch(qb, LK, work.qh + q * C * KP, KP, C, KP);
    ladle_wy_fetch(kb, LK, work.kh + q * C * KP, KP, C, KP);
    ladle_wy_fetch(tb, LT, work.t + q * C * C, C, C, C);
    if (!key) ladle_wy_fetch(gs, 8, work.g + q * C, 8, C / 4, 8);  // C floats as 16-bit pairs
    fetch_slice(0);  // one group with the above
    if (threadIdx.x < C) {
      const int t = threadIdx.x;
      bs[t] = t < L ? (has_beta ? p.beta_s[seq.row(s0 + t)] : 1.0f) : 0.0f;
      dg[t] = db[t] = ds[t] = 0.0f;
    }
    if (key && threadIdx.x < KP) gc[threadIdx.x] = dhh[threadIdx.x] = 0.0f;
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
      const typename B::Slice sl = slice(n);
      ladle_tile_mma<false, false>(dm, sl.dO, LT, sl.e, LT, cm, cn, VS);
      ladle_tile_mma<false, false>(dev, sl.de, LT, sl.v, LT, cm, cn, VS);
      LADLE_UNROLL
      for (int i = 0; i < NT; ++i) {
        ladle_tile_mma<false, false>(dqs[i], sl.dO, LT, sl.h, LT, km(i), kn(i), VS);
        ladle_tile_mma<false, false>(dws[i], sl.de, LT, sl.h, LT, km(i), kn(i), VS);
        ladle_tile_mma<false, false>(dks[i], sl.e, LT, sl.dh, LT, km(i), kn(i), VS);
      }
      {  // dV_b = T^T dE: dv = beta dV_b, dbeta += v . dV_b (this warp's C x 64 tile of the slice; v's
         // bf16 copy, in shared memory already, as fla's products take it)
        LadleTileAcc acc;
        ladle_tile_zero(acc);
        ladle_tile_mma<true, true>(acc, tb, LT, sl.de, LT, cm, cn, C);
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
                rows[h] += x * ladle_bf16_float(sl.v[i * LT + cn + 8 * j + col2 + e]);  // v from the slice (bf16)
              }
            }
        }
        if (has_beta) ladle_tile_rows_add(db, cm, rows[0], rows[1]);
      }
      if (key) {  // <dh, h> per feature (a warp a row of the state; each row one warp's)
        for (int f = warp; f < KP; f += 8) {
          float part = 0.0f;
          for (int j = l; j < VS; j += 32) part += ladle_bf16_float(sl.dh[f * LT + j]) * ladle_bf16_float(sl.h[f * LT + j]);
          for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
          if (l == 0) dhh[f] += part;
        }
      } else if (head) {  // e^(g_C) <dh, h>: d g_C through S_C = e^(g_C) S_0 + ...
        float part = 0.0f;
        for (int e = threadIdx.x; e < KP * VS; e += blockDim.x) {
          const int f = e / VS, j = e % VS;
          part += ladle_bf16_float(sl.dh[f * LT + j]) * ladle_bf16_float(sl.h[f * LT + j]);
        }
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        if (l == 0) atomicAdd(dlast, ladle_wy_exp(gs[C - 1]) * part);
      }
      __syncthreads();  // slice n's space is the next fetch's (and, after the last, dW's and the C x C tiles')
    }
  }

  // dM masked (t >= s), times Gamma for a head decay: into dmb; its gate terms for a head decay
  // (dg_t += dM_ts P_ts, dg_s -= dM_ts P_ts, P = Q K^T); dW = -dE h^T into dwb.
  __device__ __forceinline__ void stage_dm(const LadleTileAcc& dm, const LadleTileAcc (&dws)[NT]) {
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
          d[e] = i >= s + e ? (head ? ladle_wy_exp(gi - gs[s + e]) : 1.0f) * dm[j][2 * h + e] : 0.0f;
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
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i)
      ladle_tile_each_pair(dws[i], km(i), kn(i), [&](int r, int f, float x, float y) {
        *reinterpret_cast<unsigned*>(dwb + r * LK + f) = ladle_pack_bf16(-x, -y);
      });
  }

  // 2. dM, dW, then dq = diag(e^g) dO h^T + (dM . Gamma) K; the decay's terms: dg_t += e^(g_t) qhat_t .
  //    (dO h^T)_t for a head decay, dgk = qhat . dq (per feature, fp32, in registers) for a key one.
  __device__ __forceinline__ void dq_pass(const LadleTileAcc& dm, const LadleTileAcc (&dws)[NT], const LadleTileAcc (&dqs)[NT],
                                          LadleTileAcc (&dgk)[NT]) {
    if (key) {
      ladle_wy_fetch(gk, 2 * LG, work.g + q * C * KP, 2 * KP, C, 2 * KP);  // floats as 16-bit pairs
      ladle_cp_async_commit();
    }
    stage_dm(dm, dws);
    if (key) {
      ladle_cp_async_wait<0>();
      __syncthreads();
      scaled(kr, kb, false, -1.0f, [](int t) { return t | 15; });
    } else {
      __syncthreads();
    }
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) {
      const int m0 = km(i), n0 = kn(i);
      LadleTileAcc local;
      if (key) {
        ladle_wy_lower<C>(local, dmb, LT, kr, kb, LK, gk, LG, m0, n0);
      } else {
        ladle_tile_zero(local);
        ladle_tile_mma<false, true>(local, dmb, LT, kb, LK, m0, n0, C);
      }
      float rows[2] = {0.0f, 0.0f};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + row8 + 8 * h;
        const float eg = key ? 0.0f : ladle_wy_exp(gs[r]);
        float* const out = p.gq + seq.row(s0 + (r < L ? r : 0)) * K;
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int f = n0 + 8 * j + col2;
          float d[2];
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float x = (key ? ladle_exp2(gk[r * LG + f + e]) : eg) * dqs[i][j][2 * h + e], qf = ladle_bf16_float(qb[r * LK + f + e]);
            if (head) rows[h] += x * qf;
            d[e] = x + local[j][2 * h + e];
            dgk[i][j][2 * h + e] = key ? qf * d[e] : 0.0f;
          }
          if (r < L && f < K) ladle_store2(out + f, d[0], d[1], f + 1 < K);
        }
      }
      if (head) ladle_tile_rows_add(dg, m0, rows[0], rows[1]);
    }
  }
};

// The gradients kernel's last steps: the WY chain, dk, and each token's d beta and d log decay.
template <int KP, unsigned FORM>
struct LadleWyBack : LadleWyFront<KP, FORM> {
  using F = LadleWyFront<KP, FORM>;
  using F::F, F::C, F::LK, F::LT, F::LG, F::head, F::key, F::has_beta, F::NT;
  using F::p, F::seq, F::K, F::s0, F::L, F::qb, F::kb, F::tb, F::dwb, F::dmb, F::dtb, F::xb, F::dsb, F::kr, F::ql, F::bkl, F::gk;
  using F::gs, F::bs, F::dg, F::db, F::ds, F::dlast, F::gc, F::dhh, F::row8, F::col2, F::cm, F::cn, F::km, F::kn, F::scaled;

  // 3. The WY chain: dT, X = dT T^T, dL = -(T^T X) below the diagonal; for a head decay its terms and
  //    D + D^T (D = dL . beta Gamma, the Gram's gradient) into dsb, for a key decay dL itself.
  __device__ __forceinline__ void wy_pass(const LadleTileAcc& dev) {
    if (key) scaled(ql, kb, false, 1.0f, [](int) { return -1; });  // khat e^g, for dT
    {  // dT = (dW (diag(beta) (K . e^g))^T + dE (diag(beta) V)^T)
      LadleTileAcc keys;
      ladle_tile_zero(keys);
      ladle_tile_mma<false, false>(keys, dwb, LK, key ? ql : kb, LK, cm, cn, KP);
      LADLE_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int s = cn + 8 * j + col2;
        const float b0 = bs[s], b1 = bs[s + 1], e0 = key ? 1.0f : ladle_wy_exp(gs[s]), e1 = key ? 1.0f : ladle_wy_exp(gs[s + 1]);
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
    // dL = -(T^T X) below the diagonal: for a head decay dbeta_t += dL_ts Gamma_ts G_ts, dg_t += dL_ts
    // L_ts, dg_s -= dL_ts L_ts, D + D^T.
    LadleTileAcc acc, gram;  // T^T X, K K^T
    ladle_tile_zero(acc);
    ladle_tile_mma<true, true>(acc, tb, LT, xb, LT, cm, cn, C);
    if (key) {
      ladle_tile_each(acc, cm, cn, [&](int i, int s, float x) { dsb[i * LT + s] = ladle_bf16_bits(i > s && i < L ? -x : 0.0f); });
      __syncthreads();
      return;
    }
    ladle_tile_zero(gram);
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
          const float gamma = ladle_wy_exp(gi - gs[s]), dl = -acc[j][2 * h + e], plain = dl * gamma * gram[j][2 * h + e];
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
    __syncthreads();
  }

  // 4. dk = dM^T Q + diag(e^(g_C - g)) E dh^T + diag(beta e^g) T^T dW + (D + D^T) K (a head decay or
  //    none); ds_t = e^(g_C - g_t) khat_t . (E dh^T)_t; dbeta_t += e^(g_t) khat_t . (T^T dW)_t, dg_t +=
  //    beta_t that.
  __device__ __forceinline__ void dk_pass(const LadleTileAcc (&dks)[NT]) {
    const float last = gs[C - 1];
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
        const float fwd = ladle_wy_exp(last - gs[r]), eg = ladle_wy_exp(gs[r]), bi = bs[r];
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

  // 4, a key decay's. dk = (dM . Gamma)^T Q + e^(g_C - g) . E dh^T + beta e^g . T^T dW + beta (dL . Gamma) K
  //    + (dL . Gamma)^T (beta K), per feature; dgk (from dq_pass) gains khat times each term's part in
  //    d g; d beta_t += khat_t . (e^g . T^T dW + (dL . Gamma) K)_t; d g_C per feature. Then each
  //    token's d log a (sums over the later tokens, per feature) and d beta.
  __device__ __forceinline__ void dk_key(const LadleTileAcc (&dks)[NT], LadleTileAcc (&dgk)[NT]) {
    scaled(ql, qb, false, 1.0f, [](int t) { return t & ~15; });
    scaled(bkl, kb, true, 1.0f, [](int t) { return t & ~15; });
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) {
      const int m0 = km(i), n0 = kn(i);
      LadleTileAcc local, wy, a, b;  // (dM . Gamma)^T Q, T^T dW, (dL . Gamma) K, (dL . Gamma)^T (beta K)
      ladle_wy_upper<C>(local, dmb, LT, ql, qb, nullptr, LK, gk, LG, m0, n0);
      ladle_wy_lower<C>(a, dsb, LT, kr, kb, LK, gk, LG, m0, n0);
      ladle_wy_upper<C>(b, dsb, LT, bkl, kb, bs, LK, gk, LG, m0, n0);
      ladle_tile_zero(wy);
      ladle_tile_mma<true, true>(wy, tb, LT, dwb, LK, m0, n0, C);
      float wrows[2] = {0.0f, 0.0f}, cols[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
      LADLE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + row8 + 8 * h;
        const float bi = bs[r];
        float* const out = p.gk + seq.row(s0 + (r < L ? r : 0)) * K;
        LADLE_UNROLL
        for (int j = 0; j < 4; ++j) {
          const int f = n0 + 8 * j + col2;
          float d[2];
          LADLE_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int x = 2 * h + e;
            const float g = gk[r * LG + f + e], k = ladle_bf16_float(kb[r * LK + f + e]);
            const float sx = ladle_exp2(gk[(C - 1) * LG + f + e] - g) * dks[i][j][x], wx = ladle_exp2(g) * wy[j][x];
            d[e] = local[j][x] + sx + bi * (wx + a[j][x]) + b[j][x];
            dgk[i][j][x] += k * (bi * (wx + a[j][x]) - local[j][x] - sx - b[j][x]);
            wrows[h] += k * (wx + a[j][x]);
            cols[j][e] += k * sx;
          }
          if (r < L && f < K) ladle_store2(out + f, d[0], d[1], f + 1 < K);
        }
      }
      if (has_beta) ladle_tile_rows_add(db, m0, wrows[0], wrows[1]);
      ladle_tile_cols_add(gc, n0, cols);
    }
    __syncthreads();
    float* const dgt = reinterpret_cast<float*>(kr);  // dgk [C][LG], in the scaled tiles' space
    LADLE_UNROLL
    for (int i = 0; i < NT; ++i) ladle_tile_each(dgk[i], km(i), kn(i), [&](int r, int f, float x) { dgt[r * LG + f] = x; });
    __syncthreads();
    if (has_beta)
      for (int t = threadIdx.x; t < L; t += blockDim.x) p.gbeta[seq.row(s0 + t)] = db[t];
    if (static_cast<int>(threadIdx.x) < K) {  // d g_C: e^(g_C) <dh, h> + sum_s khat_s . (e^(g_C - g_s) E dh^T)_s, at the last token
      const int f = threadIdx.x;
      float run = gc[f] + ladle_exp2(gk[(C - 1) * LG + f]) * dhh[f];
      for (int t = L - 1; t >= 0; --t) {
        run += dgt[t * LG + f];
        p.ga[seq.row(s0 + t) * K + f] = run;
      }
    }
  }
};

// The three kernels' entry points (the generated kernels call them) and their shared memory.
template <int KP, unsigned FORM>
struct LadleWy : LadleWyShape<KP, FORM> {
  // 1. prepare (grid: C, N H; 256 threads): LadleWyPrepare, then LadleWyScores.
  static __device__ void prepare(const LadleUpdateArgs& p) {
    LADLE_DYNAMIC_SHARED(smem);
    LadleWyScores<KP, FORM> block(p, smem);
    if (block.empty()) return;
    block.tokens();
    block.stage();
    if constexpr (LadleWyShape<KP, FORM>::key) block.scores_key();
    else block.scores_head();
    block.wy();
  }

  // 2. states (grid: VP / 64, N H; 256 threads): LadleWyStates.
  static __device__ void states(const LadleUpdateArgs& p) { LadleWyStates<KP, FORM>::run(p); }

  // 3. gradients (grid: C, N H; 256 threads, 8 warps): every chunk at once, from h, dh, E, dE and T,
  //    the value width 64 columns at a time: what sums over the values (dM = dO E^T, dE V^T, dO h^T,
  //    dW = -dE h^T, E dh^T) accumulates in each warp's registers over the slices, dv is written per
  //    slice; then the chunk's C x C chain once, and dL/d qhat, d khat, d beta and the decay's (args.ga:
  //    a head decay's d log h [rows], a key decay's d log a [rows, K]) written (no other block writes
  //    this chunk's tokens).
  static __device__ void gradients(const LadleUpdateArgs& p) {
    using G = LadleWyBack<KP, FORM>;
    LADLE_DYNAMIC_SHARED(smem);
    G block(p, smem);
    if (block.empty()) return;
    LadleTileAcc dm, dev, dqs[G::NT], dws[G::NT], dks[G::NT], dgk[G::NT];  // dO E^T, dE V^T; dO h^T, dE h^T, E dh^T; d g
    block.slices_pass(dm, dev, dqs, dws, dks);
    block.dq_pass(dm, dws, dqs, dgk);
    block.wy_pass(dev);
    if constexpr (LadleWyShape<KP, FORM>::key) block.dk_key(dks, dgk);
    else block.dk_pass(dks);
  }
};

#endif  // LADLE_WY_GRADIENTS
