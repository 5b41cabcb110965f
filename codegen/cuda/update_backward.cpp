#include "update_backward.h"

#include <cstdio>
#include <cstdlib>

#include <ladle/dsl/ir.h>
#include <ladle/runtime/error.h>

#include "detail/cuda_source.h"

namespace ladle::cuda {

int update_backward_block_v(std::int64_t key_dim) {
  if (const char* forced = std::getenv("LADLE_UPDATE_BWD_BLOCK_V")) {  // a measurement knob: 8, 16 or 32 where K allows
    const int v = std::atoi(forced);
    if ((v == 8 && key_dim <= 512) || (v == 16 && key_dim <= 256) || (v == 32 && key_dim <= 128)) return v;
  }
  if (key_dim <= 128) return 32;
  if (key_dim <= 256) return 16;
  if (key_dim <= 512) return 8;
  throw InvalidArgument("the GPU backward of the update forms takes K up to 512 (a thread per row of the state), got K = " +
                        std::to_string(key_dim) + "; options.backend = cpu trains larger K on the CPU");
}

namespace {

std::string spec_key(const UpdateBackwardSpec& s) {
  std::string key = "update-bwd-1|";
  for (bool flag : {s.delta, s.key_decay, s.head_decay, s.beta, s.bonus, s.l2, s.scale_table, s.reverse, s.varlen, s.initial_state, s.d_final})
    key += flag ? '1' : '0';
  return key + "|" + std::to_string(s.block_v);
}

// The kernel's text; LADLE_* macros select its form.
constexpr const char* body = R"(
#define FULL 0xffffffffu
#define CHUNK )" "64" R"(

// The sum over the block's threads (the state's rows) of x[m], m < VB: a transposing butterfly in
// each warp (lane l ends with column l % VB), the warps' sums through shared memory; every thread
// gets every column's sum in out[]. Two barriers.
// One level of the butterfly: lanes above OFF keep the upper half of x, those below the lower, each
// adding its partner's; levels unrolled by the template so that every index is a constant.
template <int OFF>
__device__ __forceinline__ void ladle_upd_tree(float (&x)[VB], int lane) {
  if constexpr (OFF >= 1) {
    const bool upper = (lane & OFF) != 0;
#pragma unroll
    for (int m = 0; m < OFF; ++m) {
      const float send = upper ? x[m] : x[m + OFF];
      const float keep = upper ? x[m + OFF] : x[m];
      x[m] = keep + __shfl_xor_sync(FULL, send, OFF);
    }
    ladle_upd_tree<OFF / 2>(x, lane);
  }
}

__device__ __forceinline__ void ladle_upd_colsum(float (&x)[VB], float* red, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off >= VB; off >>= 1)
#pragma unroll
    for (int m = 0; m < VB; ++m) x[m] += __shfl_xor_sync(FULL, x[m], off);
  ladle_upd_tree<VB / 2>(x, lane);
  if (lane < VB) red[warp * VB + lane] = x[0];
  __syncthreads();
  if (threadIdx.x < VB) {
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += red[w * VB + threadIdx.x];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS) KERNEL_NAME(
    const float* __restrict__ qs, const float* __restrict__ kf, const float* __restrict__ vf, const float* __restrict__ dos,
    const float* __restrict__ log_a, const float* __restrict__ log_h, const float* __restrict__ scale_s, float scale,
    const float* __restrict__ beta_s, const float* __restrict__ bonus_s, const float* __restrict__ h0,
    const float* __restrict__ d_final, float* __restrict__ ckpt, float* __restrict__ chunk, float* __restrict__ gq,
    float* __restrict__ gk, float* __restrict__ gv, float* __restrict__ ga, float* __restrict__ gbeta,
    float* __restrict__ gbonus, float* __restrict__ d_h0, const long long* __restrict__ cu_seqlens, int T, int H, int K,
    int V, int C) {
  __shared__ float v_s[CHUNK][VB], do_s[CHUNK][VB], c_s[CHUNK][VB];
  __shared__ float qscale_s[CHUNK], krn_s[CHUNK], beta_sm[CHUNK], head_s[CHUNK], weight_s[CHUNK];
  __shared__ float red[16 * VB], col[VB];
  const int n = blockIdx.y / H, h = blockIdx.y % H, j0 = blockIdx.x * VB;
  const int i = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int KP = blockDim.x;
  const bool row = i < K;
#if LADLE_VARLEN
  const int b = 0;
  const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
#else
  const int b = n;
  const long long bos = 0, eos = T;
  (void)cu_seqlens;
#endif
  const long long len = eos - bos, chunks = (len + CHUNK - 1) / CHUNK;
  const long long blk = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
  const long long state_at = (static_cast<long long>(blockIdx.y) * K + i) * V + j0;  // row i of [N,H,K,V], column j0
  float S[VB], dS[VB];
#pragma unroll
  for (int m = 0; m < VB; ++m) {
    S[m] = 0.0f, dS[m] = 0.0f;
#if LADLE_INITIAL
    if (row && j0 + m < V) S[m] = h0[state_at + m];
#endif
#if LADLE_DFINAL
    if (row && j0 + m < V) dS[m] = d_final[state_at + m];
#endif
  }
  const auto token_row = [&](long long s) -> long long {
    const long long t = LADLE_REVERSE ? eos - 1 - s : bos + s;
    return (static_cast<long long>(b) * T + t) * H + h;
  };
  // The chunk's per-token values in shared memory: qhat's and khat's factors (the scale and the L2
  // norms), beta, the head decay, RWKV6's bonus weight qhat . diag(u) khat; v and do of this slice.
  const auto stage = [&](long long s0, int L) {
    for (int st = warp; st < L; st += warps) {
      const long long r = token_row(s0 + st);
      float qq = 0.0f, kk = 0.0f, qbk = 0.0f;
      for (int f = lane; f < K; f += 32) {
        const float q = qs[r * K + f], k = kf[r * K + f];
        qq += q * q, kk += k * k;
#if LADLE_BONUS
        qbk += q * bonus_s[r * K + f] * k;
#endif
      }
      for (int off = 16; off > 0; off >>= 1) {
        qq += __shfl_xor_sync(FULL, qq, off), kk += __shfl_xor_sync(FULL, kk, off);
        qbk += __shfl_xor_sync(FULL, qbk, off);
      }
      if (lane == 0) {
#if LADLE_SCALE_TABLE
        const float sc = scale_s[r];
#else
        const float sc = scale;
#endif
#if LADLE_L2
        const float qrn = rsqrtf(qq + L2_EPS), krn = rsqrtf(kk + L2_EPS);
#else
        const float qrn = 1.0f, krn = 1.0f;
#endif
        qscale_s[st] = sc * qrn, krn_s[st] = krn;
        weight_s[st] = sc * qrn * krn * qbk;
#if LADLE_BETA
        beta_sm[st] = beta_s[r];
#else
        beta_sm[st] = 1.0f;
#endif
#if LADLE_HEAD
        head_s[st] = expf(log_h[r]);
#else
        head_s[st] = 1.0f;
#endif
      }
    }
    for (int e = threadIdx.x; e < L * VB; e += blockDim.x) {
      const int st = e / VB, m = e % VB;
      const long long r = token_row(s0 + st);
      const bool live = j0 + m < V;
      v_s[st][m] = live ? vf[r * V + j0 + m] : 0.0f;
      do_s[st][m] = live ? dos[r * V + j0 + m] : 0.0f;
    }
    __syncthreads();
  };
  // This thread's row of step st's slots: khat_i, qhat_i, the row's decay a_i.
  struct Row {
    float q, k, a, u;
  };
  const auto row_of = [&](long long s0, int st) -> Row {
    Row x{0.0f, 0.0f, 1.0f, 0.0f};
    if (!row) return x;
    const long long r = token_row(s0 + st);
    x.q = qs[r * K + i] * qscale_s[st];
    x.k = kf[r * K + i] * krn_s[st];
#if LADLE_KEY_DECAY
    x.a = expf(log_a[r * K + i]);
#else
    x.a = head_s[st];
#endif
#if LADLE_BONUS
    x.u = bonus_s[r * K + i];
#endif
    return x;
  };
  // One step forward: S becomes S_t (the delta rule keeps c = k^T a S_{t-1} of its step in c_s).
  const auto forward = [&](const Row& x, int st) {
#if LADLE_DELTA
    float p[VB];
#pragma unroll
    for (int m = 0; m < VB; ++m) p[m] = x.k * x.a * S[m];
    ladle_upd_colsum(p, red, col);
    const float beta = beta_sm[st];
#pragma unroll
    for (int m = 0; m < VB; ++m) {
      const float c = col[m];
      S[m] = x.a * S[m] + x.k * beta * (v_s[st][m] - c);
    }
    if (threadIdx.x < VB) c_s[st][threadIdx.x] = col[threadIdx.x];
#else
#pragma unroll
    for (int m = 0; m < VB; ++m) S[m] = x.a * S[m] + x.k * v_s[st][m];
#endif
  };

  // 1. Forward: the state entering every chunk.
  for (long long c = 0; c < chunks; ++c) {
    const long long s0 = c * CHUNK;
    const int L = static_cast<int>(len - s0 < CHUNK ? len - s0 : CHUNK);
    float* const at = ckpt + ((blk * C + c) * VB) * KP + i;
#pragma unroll
    for (int m = 0; m < VB; ++m) at[m * KP] = S[m];
    stage(s0, L);
    // Each step's row loads issued a step ahead (their latency behind the step before).
    Row next = row_of(s0, 0);
    for (int st = 0; st < L; ++st) {
      const Row x = next;
      if (st + 1 < L) next = row_of(s0, st + 1);
      forward(x, st);
    }
    __syncthreads();  // the next chunk's staging overwrites this one's
  }

  // 2. The chunks backwards: their states again, then their steps backwards.
  for (long long c = chunks - 1; c >= 0; --c) {
    const long long s0 = c * CHUNK;
    const int L = static_cast<int>(len - s0 < CHUNK ? len - s0 : CHUNK);
    {
      const float* const at = ckpt + ((blk * C + c) * VB) * KP + i;
#pragma unroll
      for (int m = 0; m < VB; ++m) S[m] = at[m * KP];
    }
    stage(s0, L);
    float* const mine = chunk + (blk * CHUNK * VB) * KP + i;
    Row next = row_of(s0, 0);
    for (int st = 0; st < L; ++st) {
#pragma unroll
      for (int m = 0; m < VB; ++m) mine[(st * VB + m) * KP] = S[m];
      const Row x = next;
      if (st + 1 < L) next = row_of(s0, st + 1);
      forward(x, st);
    }
    __syncthreads();  // c_s complete
    // Backwards, each step's row and state loaded a step ahead.
    next = row_of(s0, L - 1);
    float ahead[VB];
#pragma unroll
    for (int m = 0; m < VB; ++m) ahead[m] = mine[((L - 1) * VB + m) * KP];
    for (int st = L - 1; st >= 0; --st) {
      const Row x = next;
      const long long r = token_row(s0 + st);
      float prev[VB];
#pragma unroll
      for (int m = 0; m < VB; ++m) prev[m] = ahead[m];
      if (st > 0) {
        next = row_of(s0, st - 1);
#pragma unroll
        for (int m = 0; m < VB; ++m) ahead[m] = mine[((st - 1) * VB + m) * KP];
      }
      float dq = 0.0f, dk = 0.0f, da = 0.0f;
#if LADLE_DELTA
      // o = qhat^T S_t, S_t = P + k e^T, P = a S_{t-1}, e = beta (v - c), c = P^T k.
      const float beta = beta_sm[st];
      float e[VB], x_[VB];
#pragma unroll
      for (int m = 0; m < VB; ++m) {
        e[m] = beta * (v_s[st][m] - c_s[st][m]);
        const float s_t = x.a * prev[m] + x.k * e[m];
        dq += s_t * do_s[st][m];
        dS[m] += x.q * do_s[st][m];
        x_[m] = dS[m] * x.k;
        dk += dS[m] * e[m];
      }
      ladle_upd_colsum(x_, red, col);  // de = dS^T k
      float dbeta = 0.0f;
#pragma unroll
      for (int m = 0; m < VB; ++m) {
        const float de = col[m], dc = -beta * de, p = x.a * prev[m];
        dbeta += de * (v_s[st][m] - c_s[st][m]);
        dk += p * dc;
        const float dp = dS[m] + x.k * dc;
        da += dp * p;
        dS[m] = x.a * dp;
      }
      if (threadIdx.x < VB && j0 + threadIdx.x < V) gv[r * V + j0 + threadIdx.x] = beta * col[threadIdx.x];
#if LADLE_BETA
      if (threadIdx.x == 0) atomicAdd(gbeta + r, dbeta);
#else
      (void)dbeta;
#endif
#else
      // o = qhat^T S_{t-1} + (qhat . diag(u) khat) v, S_t = a S_{t-1} + khat v^T.
      float dweight = 0.0f, x_[VB];
#pragma unroll
      for (int m = 0; m < VB; ++m) dweight += v_s[st][m] * do_s[st][m];
#pragma unroll
      for (int m = 0; m < VB; ++m) {
        const float d = dS[m];
        dq += prev[m] * do_s[st][m];
        dk += d * v_s[st][m];
        da += d * prev[m];
        x_[m] = d * x.k;
        dS[m] = x.a * d + x.q * do_s[st][m];
      }
      da *= x.a;
#if LADLE_BONUS
      dq += x.u * x.k * dweight;
      dk += x.q * x.u * dweight;
      if (row) atomicAdd(gbonus + r * K + i, x.q * x.k * dweight);
#else
      (void)dweight;
#endif
      ladle_upd_colsum(x_, red, col);  // dv = dS^T k (+ the bonus' weight do)
      if (threadIdx.x < VB && j0 + threadIdx.x < V)
        gv[r * V + j0 + threadIdx.x] = col[threadIdx.x] + weight_s[st] * do_s[st][threadIdx.x];
#endif
      if (row) {
        atomicAdd(gq + r * K + i, dq);
        atomicAdd(gk + r * K + i, dk);
#if LADLE_KEY_DECAY || LADLE_HEAD
        atomicAdd(ga + r * K + i, da);
#else
        (void)da;
#endif
      }
    }
    __syncthreads();  // the next chunk's staging overwrites this one's
  }
  if (d_h0 && row) {
#pragma unroll
    for (int m = 0; m < VB; ++m)
      if (j0 + m < V) d_h0[state_at + m] = dS[m];
  }
}
)";

}  // namespace

std::string update_backward_name(const UpdateBackwardSpec& spec) {
  return "ladle_bwd_update_" + detail::hex(detail::fnv1a(spec_key(spec)));
}

std::string update_backward_source(const UpdateBackwardSpec& spec) {
  if (spec.block_v != 8 && spec.block_v != 16 && spec.block_v != 32)
    throw InvalidArgument("update_backward_source: block_v must be 8, 16 or 32, got " + std::to_string(spec.block_v));
  if (spec.delta && spec.bonus) throw InvalidArgument("update_backward_source: a bonus belongs to a read before the update");
  if (spec.key_decay && spec.head_decay)
    throw InvalidArgument("update_backward_source: a head decay beside a key-side one is folded into log_a (head_decay false)");
  const auto flag = [](const char* name, bool on) { return std::string("#define ") + name + (on ? " 1\n" : " 0\n"); };
  std::string s = "// ladle: the update forms' recurrent backward (codegen/cuda/update_backward.cpp; do not edit).\n// " +
                  spec_key(spec) + "\n";
  s += "#define KERNEL_NAME " + update_backward_name(spec) + "\n";
  s += "#define VB " + std::to_string(spec.block_v) + "\n";
  s += "#define MAX_THREADS " + std::to_string(spec.block_v == 32 ? 128 : spec.block_v == 16 ? 256 : 512) + "  // K of update_backward_block_v\n";
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9gf", static_cast<double>(ir::l2_normalize_eps));
  s += std::string("#define L2_EPS ") + eps + "\n";
  s += flag("LADLE_DELTA", spec.delta) + flag("LADLE_KEY_DECAY", spec.key_decay) + flag("LADLE_HEAD", spec.head_decay) +
       flag("LADLE_BETA", spec.beta) + flag("LADLE_BONUS", spec.bonus) + flag("LADLE_L2", spec.l2) +
       flag("LADLE_SCALE_TABLE", spec.scale_table) + flag("LADLE_REVERSE", spec.reverse) + flag("LADLE_VARLEN", spec.varlen) +
       flag("LADLE_INITIAL", spec.initial_state) + flag("LADLE_DFINAL", spec.d_final);
  return s + body;
}

}  // namespace ladle::cuda
