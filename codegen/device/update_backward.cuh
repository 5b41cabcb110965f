// The update forms' recurrent backward, device side: ladle_update_backward<VB, FORM>(args), which
// each generated kernel ladle_bwd_update_<hash> calls with its form (codegen/cuda/update_backward.h
// says what it computes, the block's layout and the tables' layouts). VB: value columns a block;
// FORM: the ladle_upd_* bits below. The host emulation compiles the same text. Needs storage.cuh
// (LADLE_UNROLL) included first.
#ifndef LADLE_UPDATE_BACKWARD
#define LADLE_UPDATE_BACKWARD

// The form's bits.
enum : unsigned {
  ladle_upd_delta = 1u,         // the delta rule, read after its update; else a read before an additive update
  ladle_upd_key_decay = 2u,     // log_a [rows,K] (a head decay added)
  ladle_upd_head = 4u,          // log_h [rows], a head decay alone
  ladle_upd_beta = 8u,          // beta_s [rows]
  ladle_upd_bonus = 16u,        // bonus_s [rows,K]
  ladle_upd_l2 = 32u,           // q and k L2-normalised over K
  ladle_upd_scale_table = 64u,  // scale_s [rows]; else args.scale
  ladle_upd_reverse = 128u,
  ladle_upd_varlen = 256u,      // cu_seqlens
  ladle_upd_initial = 512u,     // h0 [N,H,K,V]
  ladle_upd_d_final = 1024u,    // d_final [N,H,K,V]
};

// The kernel's parameters, in its order (update_backward.h).
struct LadleUpdateArgs {
  const float *qs, *kf, *vf, *dos, *log_a, *log_h, *scale_s;
  float scale;
  const float *beta_s, *bonus_s, *h0, *d_final;
  float *ckpt, *chunk, *gq, *gk, *gv, *ga, *gbeta, *gbonus, *d_h0;
  const long long* cu_seqlens;
  int T, H, K, V, C;
  float eps;  // the L2 normalisation's
};

#define LADLE_UPD_CHUNK 64  // steps between checkpoints
#define LADLE_UPD_FULL 0xffffffffu

// One level of a butterfly over VB values a lane: lanes with bit OFF set keep the upper half of x,
// the others the lower, each adding its partner's; the levels unrolled by the template, so that
// every index is a constant (x stays in registers).
template <int VB, int OFF>
__device__ __forceinline__ void ladle_upd_tree(float (&x)[VB], int lane) {
  if constexpr (OFF >= 1) {
    const bool upper = (lane & OFF) != 0;
    LADLE_UNROLL
    for (int m = 0; m < OFF; ++m) {
      const float send = upper ? x[m] : x[m + OFF];
      const float keep = upper ? x[m + OFF] : x[m];
      x[m] = keep + __shfl_xor_sync(LADLE_UPD_FULL, send, OFF);
    }
    ladle_upd_tree<VB, OFF / 2>(x, lane);
  }
}

// The sum over the block's threads (the state's rows) of x[m], m < VB: the lanes above VB folded in,
// a transposing butterfly in each warp (lane l ends with column l % VB), the warps' sums through
// shared memory (red, warps x VB); every thread then reads every column's sum in out[VB]. Two barriers.
template <int VB>
__device__ __forceinline__ void ladle_upd_colsum(float (&x)[VB], float* red, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  LADLE_UNROLL
  for (int off = 16; off >= VB; off >>= 1)
    LADLE_UNROLL
    for (int m = 0; m < VB; ++m) x[m] += __shfl_xor_sync(LADLE_UPD_FULL, x[m], off);
  ladle_upd_tree<VB, VB / 2>(x, lane);
  if (lane < VB) red[warp * VB + lane] = x[0];
  __syncthreads();
  if (threadIdx.x < VB) {
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += red[w * VB + threadIdx.x];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

// The chunk's per-token values, in shared memory.
template <int VB>
struct LadleUpdateShared {
  float v[LADLE_UPD_CHUNK][VB], d_o[LADLE_UPD_CHUNK][VB];  // v and do of this block's columns
  float c[LADLE_UPD_CHUNK][VB];                             // the delta rule's k^T a S_{t-1}
  float qscale[LADLE_UPD_CHUNK], krn[LADLE_UPD_CHUNK];      // qhat = q qscale, khat = k krn
  float beta[LADLE_UPD_CHUNK], head[LADLE_UPD_CHUNK];       // beta, exp(log_h)
  float weight[LADLE_UPD_CHUNK];                            // RWKV6's qhat . diag(u) khat
  float red[16 * VB], col[VB];                              // ladle_upd_colsum's
};

// One block: sequence n, head h, columns [j0, j0 + VB) of the state; thread i holds row i of S and dS.
template <int VB, unsigned FORM>
struct LadleUpdateBlock {
  static constexpr bool delta = (FORM & ladle_upd_delta) != 0, key_decay = (FORM & ladle_upd_key_decay) != 0;
  static constexpr bool head = (FORM & ladle_upd_head) != 0, has_beta = (FORM & ladle_upd_beta) != 0;
  static constexpr bool bonus = (FORM & ladle_upd_bonus) != 0, l2 = (FORM & ladle_upd_l2) != 0;
  static constexpr bool scale_table = (FORM & ladle_upd_scale_table) != 0, reverse = (FORM & ladle_upd_reverse) != 0;
  static constexpr bool varlen = (FORM & ladle_upd_varlen) != 0, initial = (FORM & ladle_upd_initial) != 0;
  static constexpr bool d_final = (FORM & ladle_upd_d_final) != 0;

  // This thread's row of a step's slots: qhat_i, khat_i, the row's decay a_i, the bonus u_i.
  struct Row {
    float q, k, a, u;
  };

  const LadleUpdateArgs& p;
  LadleUpdateShared<VB>& sh;
  int K, V, i, lane, warp, warps, KP, j0, b;
  bool row;
  long long bos, eos, len, chunks, blk, state_at;
  float S[VB], dS[VB];

  __device__ __forceinline__ LadleUpdateBlock(const LadleUpdateArgs& args, LadleUpdateShared<VB>& shared) : p(args), sh(shared) {
    const int n = blockIdx.y / p.H;
    K = p.K, V = p.V, i = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    KP = blockDim.x, j0 = blockIdx.x * VB, row = i < K;
    if (varlen) b = 0, bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
    else b = n, bos = 0, eos = p.T;
    len = eos - bos, chunks = (len + LADLE_UPD_CHUNK - 1) / LADLE_UPD_CHUNK;
    blk = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
    state_at = (static_cast<long long>(blockIdx.y) * K + i) * V + j0;  // row i of [N,H,K,V], column j0
    LADLE_UNROLL
    for (int m = 0; m < VB; ++m) {
      const bool live = row && j0 + m < V;
      S[m] = initial && live ? p.h0[state_at + m] : 0.0f;
      dS[m] = d_final && live ? p.d_final[state_at + m] : 0.0f;
    }
  }

  __device__ __forceinline__ long long token_row(long long s) const {
    const long long t = reverse ? eos - 1 - s : bos + s;
    return (static_cast<long long>(b) * p.T + t) * p.H + blockIdx.y % p.H;
  }

  // Steps [s0, s0 + L) into shared memory: a warp a token for the per-token values (the L2 norms,
  // RWKV6's bonus weight), then v and do of this block's columns.
  __device__ __forceinline__ void stage(long long s0, int L) {
    for (int st = warp; st < L; st += warps) {
      const long long r = token_row(s0 + st);
      float qq = 0.0f, kk = 0.0f, qbk = 0.0f;
      for (int f = lane; f < K; f += 32) {
        const float q = p.qs[r * K + f], k = p.kf[r * K + f];
        qq += q * q, kk += k * k;
        if (bonus) qbk += q * p.bonus_s[r * K + f] * k;
      }
      for (int off = 16; off > 0; off >>= 1) {
        qq += __shfl_xor_sync(LADLE_UPD_FULL, qq, off), kk += __shfl_xor_sync(LADLE_UPD_FULL, kk, off);
        qbk += __shfl_xor_sync(LADLE_UPD_FULL, qbk, off);
      }
      if (lane == 0) {
        const float sc = scale_table ? p.scale_s[r] : p.scale;
        const float qrn = l2 ? rsqrtf(qq + p.eps) : 1.0f, krn = l2 ? rsqrtf(kk + p.eps) : 1.0f;
        sh.qscale[st] = sc * qrn, sh.krn[st] = krn, sh.weight[st] = sc * qrn * krn * qbk;
        sh.beta[st] = has_beta ? p.beta_s[r] : 1.0f;
        sh.head[st] = head ? expf(p.log_h[r]) : 1.0f;
      }
    }
    for (int e = threadIdx.x; e < L * VB; e += blockDim.x) {
      const int st = e / VB, m = e % VB;
      const long long r = token_row(s0 + st);
      const bool live = j0 + m < V;
      sh.v[st][m] = live ? p.vf[r * V + j0 + m] : 0.0f;
      sh.d_o[st][m] = live ? p.dos[r * V + j0 + m] : 0.0f;
    }
    __syncthreads();
  }

  __device__ __forceinline__ Row row_of(long long s0, int st) const {
    Row x{0.0f, 0.0f, 1.0f, 0.0f};
    if (!row) return x;  // a padding row: nothing in, nothing out
    const long long r = token_row(s0 + st);
    x.q = p.qs[r * K + i] * sh.qscale[st];
    x.k = p.kf[r * K + i] * sh.krn[st];
    x.a = key_decay ? expf(p.log_a[r * K + i]) : sh.head[st];
    if (bonus) x.u = p.bonus_s[r * K + i];
    return x;
  }

  // One step forward: S becomes S_t; the delta rule keeps its step's c = (a S_{t-1})^T k in sh.c.
  __device__ __forceinline__ void forward(const Row& x, int st) {
    if (delta) {
      float c[VB];
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) c[m] = x.k * x.a * S[m];
      ladle_upd_colsum<VB>(c, sh.red, sh.col);
      const float beta = sh.beta[st];
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) S[m] = x.a * S[m] + x.k * beta * (sh.v[st][m] - sh.col[m]);
      if (threadIdx.x < VB) sh.c[st][threadIdx.x] = sh.col[threadIdx.x];
    } else {
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) S[m] = x.a * S[m] + x.k * sh.v[st][m];
    }
  }

  // Chunk c's steps forward from S, each step's row loaded a step ahead.
  __device__ __forceinline__ void forward_chunk(long long s0, int L, float* states) {
    Row next = row_of(s0, 0);
    for (int st = 0; st < L; ++st) {
      if (states) {
        LADLE_UNROLL
        for (int m = 0; m < VB; ++m) states[(st * VB + m) * KP] = S[m];
      }
      const Row x = next;
      if (st + 1 < L) next = row_of(s0, st + 1);
      forward(x, st);
    }
  }

  // One step back: dS = dL/dS_t becomes dL/dS_{t-1}; the slots' gradients of token r (those summed
  // over the rows added atomically: the value slices each add theirs).
  __device__ __forceinline__ void backward(const Row& x, long long r, int st, const float (&prev)[VB]) {
    float dq = 0.0f, dk = 0.0f, da = 0.0f, sum[VB];
    if (delta) {
      // o = qhat^T S_t, S_t = P + khat e^T, P = a S_{t-1}, e = beta (v - c), c = P^T khat.
      const float beta = sh.beta[st];
      float e[VB];
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) {
        e[m] = beta * (sh.v[st][m] - sh.c[st][m]);
        dq += (x.a * prev[m] + x.k * e[m]) * sh.d_o[st][m];
        dS[m] += x.q * sh.d_o[st][m];
        sum[m] = dS[m] * x.k;
        dk += dS[m] * e[m];
      }
      ladle_upd_colsum<VB>(sum, sh.red, sh.col);  // de = dS^T khat
      float dbeta = 0.0f;
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) {
        const float de = sh.col[m], dc = -beta * de, pm = x.a * prev[m];
        dbeta += de * (sh.v[st][m] - sh.c[st][m]);
        dk += pm * dc;
        const float dp = dS[m] + x.k * dc;
        da += dp * pm;
        dS[m] = x.a * dp;
      }
      if (threadIdx.x < VB && j0 + static_cast<int>(threadIdx.x) < V) p.gv[r * V + j0 + threadIdx.x] = beta * sh.col[threadIdx.x];
      if (has_beta && threadIdx.x == 0) atomicAdd(p.gbeta + r, dbeta);
    } else {
      // o = qhat^T S_{t-1} + (qhat . diag(u) khat) v, S_t = a S_{t-1} + khat v^T.
      float dweight = 0.0f;
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) dweight += sh.v[st][m] * sh.d_o[st][m];
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) {
        const float d = dS[m];
        dq += prev[m] * sh.d_o[st][m];
        dk += d * sh.v[st][m];
        da += d * prev[m];
        sum[m] = d * x.k;
        dS[m] = x.a * d + x.q * sh.d_o[st][m];
      }
      da *= x.a;
      if (bonus) {
        dq += x.u * x.k * dweight;
        dk += x.q * x.u * dweight;
        if (row) atomicAdd(p.gbonus + r * K + i, x.q * x.k * dweight);
      }
      ladle_upd_colsum<VB>(sum, sh.red, sh.col);  // dv = dS^T khat (+ the bonus' weight do)
      if (threadIdx.x < VB && j0 + static_cast<int>(threadIdx.x) < V)
        p.gv[r * V + j0 + threadIdx.x] = sh.col[threadIdx.x] + sh.weight[st] * sh.d_o[st][threadIdx.x];
    }
    if (row) {
      atomicAdd(p.gq + r * K + i, dq);
      atomicAdd(p.gk + r * K + i, dk);
      if (key_decay || head) atomicAdd(p.ga + r * K + i, da);
    }
  }

  // Chunk c backwards: its states again from its checkpoint (each thread keeps its own rows in
  // `mine`, scratch only it reads back), then its steps backwards, rows and states loaded a step ahead.
  __device__ __forceinline__ void backward_chunk(long long c) {
    const long long s0 = c * LADLE_UPD_CHUNK;
    const int L = static_cast<int>(len - s0 < LADLE_UPD_CHUNK ? len - s0 : LADLE_UPD_CHUNK);
    const float* const at = p.ckpt + ((blk * p.C + c) * VB) * KP + i;
    LADLE_UNROLL
    for (int m = 0; m < VB; ++m) S[m] = at[m * KP];
    stage(s0, L);
    float* const mine = p.chunk + (blk * LADLE_UPD_CHUNK * VB) * KP + i;
    forward_chunk(s0, L, mine);
    __syncthreads();  // sh.c complete
    Row next = row_of(s0, L - 1);
    float ahead[VB];
    LADLE_UNROLL
    for (int m = 0; m < VB; ++m) ahead[m] = mine[((L - 1) * VB + m) * KP];
    for (int st = L - 1; st >= 0; --st) {
      const Row x = next;
      float prev[VB];
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) prev[m] = ahead[m];
      if (st > 0) {
        next = row_of(s0, st - 1);
        LADLE_UNROLL
        for (int m = 0; m < VB; ++m) ahead[m] = mine[((st - 1) * VB + m) * KP];
      }
      backward(x, token_row(s0 + st), st, prev);
    }
    __syncthreads();  // the next chunk's staging overwrites this one's
  }

  __device__ __forceinline__ void run() {
    // 1. Forward: the state entering every chunk.
    for (long long c = 0; c < chunks; ++c) {
      const long long s0 = c * LADLE_UPD_CHUNK;
      const int L = static_cast<int>(len - s0 < LADLE_UPD_CHUNK ? len - s0 : LADLE_UPD_CHUNK);
      float* const at = p.ckpt + ((blk * p.C + c) * VB) * KP + i;
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m) at[m * KP] = S[m];
      stage(s0, L);
      forward_chunk(s0, L, nullptr);
      __syncthreads();  // the next chunk's staging overwrites this one's
    }
    // 2. The chunks backwards; then dS is d initial_state.
    for (long long c = chunks - 1; c >= 0; --c) backward_chunk(c);
    if (p.d_h0 && row) {
      LADLE_UNROLL
      for (int m = 0; m < VB; ++m)
        if (j0 + m < V) p.d_h0[state_at + m] = dS[m];
    }
  }
};

template <int VB, unsigned FORM>
__device__ __forceinline__ void ladle_update_backward(const LadleUpdateArgs& args) {
  __shared__ LadleUpdateShared<VB> shared;
  LadleUpdateBlock<VB, FORM> block(args, shared);
  block.run();
}

#endif
