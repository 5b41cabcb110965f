// The recurrent backward's helper kernels (backward.h: backward_helpers_source, backward_helper_source):
// small kernels of fixed text, each also a program of its own.
#include "backward.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <ladle/runtime/error.h>

#include "detail/cuda_source.h"

namespace ladle::cuda {

using detail::storage_helpers;

namespace {

// The helpers' source in pieces (backward_helpers_source, backward_helper_source): what each needs,
// then each kernel's text; the convert and normalized kernels are one macro each, instantiated per type.
std::string helper_prelude() {
  return "\n#define LADLE_BWD_CHUNK " + std::to_string(backward_chunk) + "\n" + R"(// The sequence of (sequence n): its batch row and tokens [bos, eos).
__device__ __forceinline__ void ladle_bwd_bounds(const long long* cu_seqlens, int n, int T, int& b, long long& bos, long long& eos) {
  if (cu_seqlens) b = 0, bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
  else b = n, bos = 0, eos = T;
}

)";
}
constexpr const char* carry_helper = R"(
// One thread per (n, h, f < K + V): carry[(n H + h) C + c][f] = init + the totals of the blocks after c,
// init = factor sum_j d_final[i][j] S[i][j] (f = i < K) or sum_i (f = K + j), d_final [N,H,K,VS] and S read from
// s_t [N,H,VS,K] (VS = V, or V + 1 with the normaliser's column).
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_carry(
    const float* __restrict__ totals, const float* __restrict__ d_final, float factor, const float* __restrict__ s_t,
    float* __restrict__ carry, const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int VS, int C) {
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int KV = K + V;
  if (index >= static_cast<long long>(N) * H * KV) return;
  const long long p = index / KV;
  const int f = static_cast<int>(index % KV), n = static_cast<int>(p / H);
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, n, T, b, bos, eos);
  const long long chunks = (eos - bos + LADLE_BWD_CHUNK - 1) / LADLE_BWD_CHUNK;
  float acc = 0.0f;
  if (d_final) {
    if (f < K)
      for (int j = 0; j < VS; ++j) acc += d_final[(p * K + f) * VS + j] * s_t[(p * VS + j) * K + f];
    else
      for (int i = 0; i < K; ++i) acc += d_final[(p * K + i) * VS + (f - K)] * s_t[(p * VS + (f - K)) * K + i];
  }
  acc *= factor;
  for (long long c = chunks - 1; c >= 0; --c) {
    carry[(p * C + c) * KV + f] = acc;
    acc += totals[(p * C + c) * KV + f];
  }
}
)";
constexpr const char* update_finish_helper = R"(
// The update forms (update_backward.h), one warp per token row r < rows: gq holds dL/d qhat and
// becomes dL/d q_feature (qhat = scale q rn_q, rn = (sum x^2 + eps)^(-1/2) where l2, else 1: dq = scale
// (rn dqhat - q rn^3 (dqhat . q))), gk likewise without the scale; gscale[r] = rn_q q . dqhat (null:
// none); gh[r] = sum over K of ga (null: none). scale_s null: the call's scale.
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_update_finish(
    const float* __restrict__ qs, const float* __restrict__ kf, const float* __restrict__ scale_s, float scale,
    float* __restrict__ gq, float* __restrict__ gk, const float* __restrict__ ga, float* __restrict__ gscale,
    float* __restrict__ gh, int l2, float eps, long long rows, int K) {
  const long long r = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float qq = 0.0f, kk = 0.0f, dotq = 0.0f, dotk = 0.0f, hs = 0.0f;
  for (int f = lane; f < K; f += 32) {
    const float q = qs[r * K + f], k = kf[r * K + f];
    qq += q * q, kk += k * k;
    dotq += gq[r * K + f] * q, dotk += gk[r * K + f] * k;
    if (gh) hs += ga[r * K + f];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    qq += __shfl_xor_sync(0xffffffffu, qq, offset), kk += __shfl_xor_sync(0xffffffffu, kk, offset);
    dotq += __shfl_xor_sync(0xffffffffu, dotq, offset), dotk += __shfl_xor_sync(0xffffffffu, dotk, offset);
    hs += __shfl_xor_sync(0xffffffffu, hs, offset);
  }
  const float qrn = l2 ? rsqrtf(qq + eps) : 1.0f, krn = l2 ? rsqrtf(kk + eps) : 1.0f;
  const float sc = scale_s ? scale_s[r] : scale;
  if (lane == 0) {
    if (gscale) gscale[r] = qrn * dotq;
    if (gh) gh[r] = hs;
  }
  for (int f = lane; f < K; f += 32) {
    const float q = qs[r * K + f], k = kf[r * K + f];
    gq[r * K + f] = sc * (qrn * gq[r * K + f] - (l2 ? q * qrn * qrn * qrn * dotq : 0.0f));
    gk[r * K + f] = krn * gk[r * K + f] - (l2 ? k * krn * krn * krn * dotk : 0.0f);
  }
}
)";
constexpr const char* carry_states_helper = R"(
// The carries from the states at the blocks' boundaries: block (c, n H + h) of LADLE_BWD_CHUNK steps,
// e its last step, has carry[f] = factor sum over the state's elements of S_e . A_(e+1) D_(e+1) . B_(e+1)
// (f = i < K: over row i; f = K + j: over column j), S_e the forward's state after step e (s_states
// row s_first[n] + c: the split form's chunk states, the first row of each sequence's being h0, skipped) and D_(e+1) the gradient reaching it from later steps, divided by factor (d_states row
// first[n] + chunks - 2 - c), A and B the decays at step e + 1 (log_a_next, log_h_next and log_b_next of
// step e, null where the variant has none; their types by a_type and b_type). The sequence's last block
// takes factor sum(d_final * S_T) as ladle_bwd_carry does (d_final [N,H,K,V], s_t [N,H,V,K]; null: 0).
// Grid (C, N H), block 256; K up to 1024.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LADLE_BWD_UNROLL_4 _Pragma("unroll 4")
#else
#define LADLE_BWD_UNROLL_4
#endif
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_carry_states(
    const float* __restrict__ s_states, const float* __restrict__ d_states, const long long* __restrict__ s_first,
    const long long* __restrict__ first,
    const void* __restrict__ log_a_next, int a_type, const float* __restrict__ log_h_next, const void* __restrict__ log_b_next,
    int b_type, const float* __restrict__ d_final, float factor, const float* __restrict__ s_t, float* __restrict__ carry,
    const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int C, int reverse) {
  __shared__ float rows[1024], decay_a[1024];
  const int p = blockIdx.y, n = p / H, h = p % H, c = blockIdx.x, KV = K + V;
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, n, T, b, bos, eos);
  const long long chunks = (eos - bos + LADLE_BWD_CHUNK - 1) / LADLE_BWD_CHUNK;
  if (c >= chunks) return;
  float* const out = carry + (static_cast<long long>(p) * C + c) * KV;
  if (c == chunks - 1) {  // after the sequence: d_final and S_T
    for (int f = threadIdx.x; f < KV; f += blockDim.x) {
      float acc = 0.0f;
      if (d_final && f < K)
        for (int j = 0; j < V; ++j) acc += d_final[(static_cast<long long>(p) * K + f) * V + j] * s_t[(static_cast<long long>(p) * V + j) * K + f];
      else if (d_final)
        for (int i = 0; i < K; ++i) acc += d_final[(static_cast<long long>(p) * K + i) * V + (f - K)] * s_t[(static_cast<long long>(p) * V + (f - K)) * K + i];
      out[f] = factor * acc;
    }
    return;
  }
  const long long e = static_cast<long long>(c) * LADLE_BWD_CHUNK + LADLE_BWD_CHUNK - 1;
  const long long r = (static_cast<long long>(b) * T + (reverse ? eos - 1 - e : bos + e)) * H + h;  // step e's slot row
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    float la = log_a_next ? ladle_load_typed(log_a_next, a_type, r * K + i) : 0.0f;
    if (log_h_next) la += log_h_next[r];
    decay_a[i] = expf(la);
    rows[i] = 0.0f;
  }
  __syncthreads();
  const long long area = static_cast<long long>(K) * V;
  const float* const S = s_states + ((s_first[n] + c) * H + h) * area;
  const float* const D = d_states + ((first[n] + chunks - 2 - c) * H + h) * area;
  // Warp w takes rows w, w + 8, ...; a lane the columns j0 + lane + 32 m of each 128-column group: every
  // load of a row in flight at once, the row's sum by shuffles (its warp alone writes it: no atomics),
  // the columns' partial sums in registers, then over the warps through shared memory. x = S D b_j; a
  // row sums a_i x, a column a_i x over the rows.
  __shared__ float columns[8][128];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j0 = 0; j0 < V; j0 += 128) {
    float decay_b[4], column[4];
    for (int m = 0; m < 4; ++m) {
      const int j = j0 + lane + 32 * m;
      decay_b[m] = j < V ? (log_b_next ? expf(ladle_load_typed(log_b_next, b_type, r * V + j)) : 1.0f) : 0.0f;
      column[m] = 0.0f;
    }
    LADLE_BWD_UNROLL_4 for (int i = warp; i < K; i += warps) {
      const float* const s_row = S + static_cast<long long>(i) * V + j0 + lane;
      const float* const d_row = D + static_cast<long long>(i) * V + j0 + lane;
      float row = 0.0f;
      for (int m = 0; m < 4; ++m) {
        const bool live = j0 + lane + 32 * m < V;
        const float x = live ? s_row[32 * m] * d_row[32 * m] * decay_b[m] : 0.0f;
        column[m] += decay_a[i] * x;
        row += x;
      }
      for (int offset = 16; offset > 0; offset /= 2) row += __shfl_xor_sync(0xffffffffu, row, offset);
      if (lane == 0) rows[i] += decay_a[i] * row;
    }
    for (int m = 0; m < 4; ++m) columns[warp][lane + 32 * m] = column[m];
    __syncthreads();
    for (int t = threadIdx.x; t < 128; t += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < warps; ++w) sum += columns[w][t];
      if (j0 + t < V) out[K + j0 + t] = factor * sum;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < K; i += blockDim.x) out[i] = factor * rows[i];
}
)";
constexpr const char* initial_helper = R"(
// One thread per (n, h, i, j): d_h0 = factor exp(log_a_0[i]) dS_0 exp(log_b_0[j]), the total log decays at the sequence's
// first step from first_decay [N,H,K+V] (null: no decay); dS_0 alone for an empty sequence.
extern "C" __global__ void __launch_bounds__(256) ladle_bwd_initial(
    const float* __restrict__ ds0, const float* __restrict__ first_decay, float factor, float* __restrict__ d_h0,
    const long long* __restrict__ cu_seqlens, int N, int T, int H, int K, int V, int VS) {
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<long long>(N) * H * K * V) return;
  const long long p = index / (static_cast<long long>(K) * V);
  const int i = static_cast<int>(index / V % K), j = static_cast<int>(index % V);
  int b; long long bos, eos;
  ladle_bwd_bounds(cu_seqlens, static_cast<int>(p / H), T, b, bos, eos);
  float x = factor * ds0[(p * K + i) * VS + j];  // ds0 [N,H,K,VS]
  if (eos > bos && first_decay) x *= expf(first_decay[p * (K + V) + i] + first_decay[p * (K + V) + K + j]);
  d_h0[index] = x;
}
)";
constexpr const char* convert_helper = R"(
// One thread per element of a strided [N,H,R,C] tensor, times factor: out [N,H,R,CP] and out_t [N,H,CP,R], fp32 (either
// may be null; CP >= C, the padding left as it was).
#define LADLE_BWD_CONVERT(NAME, E)                                                                            \
extern "C" __global__ void __launch_bounds__(256) NAME(                                                       \
    const E* __restrict__ in, long long s0, long long s1, long long s2, long long s3, int N, int H, int R, int C, \
    int CP, float factor, float* __restrict__ out, float* __restrict__ out_t) {                               \
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;                      \
  if (index >= static_cast<long long>(N) * H * R * C) return;                                                  \
  const int c = static_cast<int>(index % C), r = static_cast<int>(index / C % R);                              \
  const long long p = index / (static_cast<long long>(R) * C);                                                 \
  const float x = factor * ladle_load(in + (p / H) * s0 + (p % H) * s1 + r * s2 + c * s3);                     \
  if (out) out[(p * R + r) * CP + c] = x;                                                                     \
  if (out_t) out_t[(p * CP + c) * R + r] = x;                                                                 \
}
)";
constexpr const char* normalized_helper = R"(
// A normalised read o = num / den, den = (scale q)^T n + eps, from num' [rows][V + 1] (the read of the state with the
// normaliser's column: num, then den - eps): do' [rows][V + 1] = do / den, then d den = -sum_j do_j num_j / den^2.
// One warp per row r = (b T + t) H + h; block (256).
#define LADLE_BWD_NORMALIZED(NAME, E)                                                                         \
extern "C" __global__ void __launch_bounds__(256) NAME(                                                       \
    const float* __restrict__ num, const E* __restrict__ d_out, long long sb, long long st, long long sh, long long sd, \
    int B, int T, int H, int V, float eps, float* __restrict__ d_num) {                                       \
  const long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;                    \
  const int lane = threadIdx.x % 32;                                                                          \
  if (r >= static_cast<long long>(B) * T * H) return;                                                         \
  const int h = static_cast<int>(r % H);                                                                      \
  const long long t = r / H % T, b = r / H / T;                                                               \
  const float* const row = num + r * (V + 1);                                                                 \
  const float den = row[V] + eps;                                                                             \
  float dot = 0.0f;                                                                                           \
  for (int j = lane; j < V; j += 32) {                                                                        \
    const float g = ladle_load(d_out + b * sb + t * st + h * sh + j * sd);                                    \
    dot += g * row[j];                                                                                        \
    d_num[r * (V + 1) + j] = g / den;                                                                         \
  }                                                                                                           \
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);             \
  if (lane == 0) d_num[r * (V + 1) + V] = -dot / (den * den);                                                  \
}
)";

// Each named kernel: its text, or (convert, normalized) its macro and the element type it takes.
struct HelperText {
  const char* text;
  const char* macro;  // null: text is the kernel
  const char* type;
};

std::optional<HelperText> helper_text(const std::string& name) {
  if (name == "ladle_bwd_carry") return HelperText{carry_helper, nullptr, nullptr};
  if (name == "ladle_bwd_update_finish") return HelperText{update_finish_helper, nullptr, nullptr};
  if (name == "ladle_bwd_carry_states") return HelperText{carry_states_helper, nullptr, nullptr};
  if (name == "ladle_bwd_initial") return HelperText{initial_helper, nullptr, nullptr};
  for (const auto& [suffix, type] : {std::pair{"f32", "float"}, std::pair{"bf16", "ladle_bf16"}, std::pair{"f16", "ladle_f16"}}) {
    if (name == std::string("ladle_bwd_convert_") + suffix) return HelperText{convert_helper, "LADLE_BWD_CONVERT", type};
    if (name == std::string("ladle_bwd_normalized_") + suffix) return HelperText{normalized_helper, "LADLE_BWD_NORMALIZED", type};
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& backward_helper_names() {
  static const std::vector<std::string> names{"ladle_bwd_carry", "ladle_bwd_update_finish", "ladle_bwd_carry_states", "ladle_bwd_initial",
                                              "ladle_bwd_normalized_f32", "ladle_bwd_normalized_bf16", "ladle_bwd_normalized_f16",
                                              "ladle_bwd_convert_f32", "ladle_bwd_convert_bf16", "ladle_bwd_convert_f16"};
  return names;
}

std::string backward_helpers_source() {
  std::string s = "// ladle: the recurrent backward's helper kernels (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += helper_prelude();
  for (const char* text : {carry_helper, update_finish_helper, carry_states_helper, initial_helper, convert_helper, normalized_helper}) {
    s += text;
    s += "\n";
  }
  for (const char* suffix : {"f32", "bf16", "f16"}) {
    const HelperText t = *helper_text(std::string("ladle_bwd_normalized_") + suffix);
    s += fmt::format("{}(ladle_bwd_normalized_{}, {})\n", t.macro, suffix, t.type);
  }
  for (const char* suffix : {"f32", "bf16", "f16"}) {
    const HelperText t = *helper_text(std::string("ladle_bwd_convert_") + suffix);
    s += fmt::format("{}(ladle_bwd_convert_{}, {})\n", t.macro, suffix, t.type);
  }
  return s;
}

std::string backward_helper_source(const std::string& name) {
  const std::optional<HelperText> t = helper_text(name);
  if (!t) throw InvalidArgument("backward_helper_source: '" + name + "' is not a helper kernel (backward_helper_names lists them)");
  std::string s = "// ladle: the recurrent backward's helper kernel " + name + " (codegen/cuda/backward.cpp; do not edit).\n";
  s += storage_helpers;
  s += helper_prelude();
  s += t->text;
  s += "\n";
  if (t->macro) s += fmt::format("{}({}, {})\n", t->macro, name, t->type);
  return s;
}

}  // namespace ladle::cuda
