// The update forms' recurrent backward on the GPU (codegen/cuda/update_backward.h): ladle_bwd_update
// and then ladle_bwd_update_finish run on the host emulation of CUDA (cuda_emulation.h), launched as
// the host launches them (ops/gpu_backward.cpp, update_form), so that CI without a GPU checks every
// gradient they write for the cases of update_backward_cases.h against an fp64 reference written here
// from the forms' definitions; the reference itself is held against central differences of its loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include <ladle/codegen/cuda/update_backward.h>
#include <ladle/dsl/ir.h>
#include <ladle/runtime/driver.h>

#include "cuda_emulation.h"
#include "support/tensors.h"
#include "update_backward_cases.h"

// ladle_bwd_update adds its per-token gradients atomically (the value slices each add theirs).
inline float atomicAdd(float* p, float value) { return std::atomic_ref<float>(*p).fetch_add(value); }

#include "update_backward_kernels.inc"

using namespace ladle;
using update_backward_cases::Case;

namespace {

// A problem's inputs, fp32 values held in double (what the kernel reads); a table the form does not
// read is empty. Token rows r = (b T + t) H + h of [rows, K], [rows, V] or [rows]; h0 and d_final
// [N,H,K,V]. The same struct holds the gradients, each in its input's layout.
struct Inputs {
  std::vector<double> q, k, v, d_out, log_a, log_h, scale_s, beta, bonus, h0, d_final;
  double scale = 0.3;
};

// The inputs that have gradients, by name.
const std::pair<const char*, std::vector<double> Inputs::*> differentiable[] = {
    {"q", &Inputs::q},         {"k", &Inputs::k},         {"v", &Inputs::v},
    {"log_a", &Inputs::log_a}, {"log_h", &Inputs::log_h}, {"scale_s", &Inputs::scale_s},
    {"beta", &Inputs::beta},   {"bonus", &Inputs::bonus}, {"h0", &Inputs::h0}};

std::int64_t sequences(const Case& c) { return c.cu_seqlens.empty() ? c.B : static_cast<std::int64_t>(c.cu_seqlens.size()) - 1; }

// Sequence n's tokens [bos, eos) of its batch row.
std::pair<std::int64_t, std::int64_t> bounds(const Case& c, std::int64_t n) {
  if (c.cu_seqlens.empty()) return {0, c.T};
  return {c.cu_seqlens[static_cast<std::size_t>(n)], c.cu_seqlens[static_cast<std::size_t>(n) + 1]};
}

// The row of step `step` of sequence n, head h, in the recurrence's order.
std::int64_t token_row(const Case& c, std::int64_t n, std::int64_t step, std::int64_t h) {
  const auto [bos, eos] = bounds(c, n);
  const std::int64_t b = c.cu_seqlens.empty() ? n : 0, t = c.spec.reverse ? eos - 1 - step : bos + step;
  return (b * c.T + t) * c.H + h;
}

// Fresh inputs for the case's form: q, k, v, do ~ N(0, 1) (k over sqrt(K) where the delta rule reads
// it unnormalised, which keeps the recurrence contracting), log decays in (-1, -0.01) (a key decay's
// times the case's decay_scale), beta in
// (0.1, 0.9), a bonus ~ N(0, 0.5), a scale table in (0.2, 1). With a scale table the call's scale is
// NaN: the kernels must not read it.
Inputs draw(const Case& c, std::mt19937_64& rng) {
  const auto& s = c.spec;
  const std::int64_t rows = c.B * c.T * c.H, K = c.K, V = c.V, states = sequences(c) * c.H * K * V;
  std::normal_distribution<double> unit(0.0, 1.0);
  std::uniform_real_distribution<double> log_decay(-1.0, -0.01), strength(0.1, 0.9), scales(0.2, 1.0);
  const auto table = [&](std::int64_t n, auto&& value) {
    std::vector<double> t(static_cast<std::size_t>(n));
    for (double& e : t) e = static_cast<float>(value());
    return t;
  };
  const double k_scale = s.delta && !s.l2 ? 1.0 / std::sqrt(static_cast<double>(K)) : 1.0;
  Inputs x;
  x.q = table(rows * K, [&] { return unit(rng); });
  x.k = table(rows * K, [&] { return k_scale * unit(rng); });
  x.v = table(rows * V, [&] { return unit(rng); });
  x.d_out = table(rows * V, [&] { return unit(rng); });
  if (s.key_decay) x.log_a = table(rows * K, [&] { return c.decay_scale * log_decay(rng); });
  if (s.head_decay) x.log_h = table(rows, [&] { return log_decay(rng); });
  if (s.scale_table) x.scale_s = table(rows, [&] { return scales(rng); }), x.scale = std::numeric_limits<double>::quiet_NaN();
  if (s.beta) x.beta = table(rows, [&] { return strength(rng); });
  if (s.bonus) x.bonus = table(rows * K, [&] { return 0.5 * unit(rng); });
  if (s.initial_state) x.h0 = table(states, [&] { return unit(rng); });
  if (s.d_final) x.d_final = table(states, [&] { return unit(rng); });
  return x;
}

// One token's factors: qhat = scale q rq and khat = k rk (rq, rk = (sum x^2 + eps)^(-1/2) where
// L2-normalised, else 1), the rows' decays a_i, beta, and RWKV6's bonus weight qhat . diag(u) khat.
struct Token {
  double scale = 0.0, rq = 1.0, rk = 1.0, beta = 1.0, weight = 0.0;
  std::vector<double> qhat, khat, a;
};

Token token_of(const Case& c, const Inputs& x, std::int64_t r) {
  const auto& s = c.spec;
  const std::int64_t K = c.K;
  const double* q = &x.q[r * K];
  const double* k = &x.k[r * K];
  Token t;
  t.scale = s.scale_table ? x.scale_s[r] : x.scale;
  double qq = 0.0, kk = 0.0;
  for (std::int64_t i = 0; i < K; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
  if (s.l2) t.rq = 1.0 / std::sqrt(qq + ir::l2_normalize_eps), t.rk = 1.0 / std::sqrt(kk + ir::l2_normalize_eps);
  if (s.beta) t.beta = x.beta[r];
  t.qhat.resize(K), t.khat.resize(K), t.a.resize(K);
  for (std::int64_t i = 0; i < K; ++i) {
    t.qhat[i] = t.scale * t.rq * q[i], t.khat[i] = t.rk * k[i];
    t.a[i] = std::exp(s.key_decay ? x.log_a[r * K + i] : s.head_decay ? x.log_h[r] : 0.0);
    if (s.bonus) t.weight += t.qhat[i] * x.bonus[r * K + i] * t.khat[i];
  }
  return t;
}

// The loss L = sum over tokens of do . o + sum d_final * S_final in fp64, and (with `gradients`) its
// gradients by reverse mode, token by token per (sequence, head):
//   the delta rule: P = diag(a) S_{t-1}, c = P^T khat, e = beta (v - c), S_t = P + khat e^T, o = S_t^T qhat;
//   a read before the update: o = S_{t-1}^T qhat + (qhat . diag(u) khat) v, S_t = diag(a) S_{t-1} + khat v^T.
struct Result {
  double loss = 0.0;
  Inputs grad;
};

Result reference(const Case& c, const Inputs& x, bool gradients) {
  const auto& s = c.spec;
  const std::int64_t H = c.H, K = c.K, V = c.V, KV = K * V, rows = c.B * c.T * H;
  Result out;
  Inputs& g = out.grad;
  if (gradients) {
    g.q.assign(rows * K, 0.0), g.k.assign(rows * K, 0.0), g.v.assign(rows * V, 0.0), g.h0.assign(sequences(c) * H * KV, 0.0);
    if (s.key_decay) g.log_a.assign(rows * K, 0.0);
    if (s.head_decay) g.log_h.assign(rows, 0.0);
    if (s.scale_table) g.scale_s.assign(rows, 0.0);
    if (s.beta) g.beta.assign(rows, 0.0);
    if (s.bonus) g.bonus.assign(rows * K, 0.0);
  }
  for (std::int64_t n = 0; n < sequences(c); ++n)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t len = bounds(c, n).second - bounds(c, n).first, at = (n * H + h) * KV;
      std::vector<double> states((len + 1) * KV, 0.0), c_of(len * V);  // S_0 .. S_len; the delta rule's c per step
      if (s.initial_state) std::copy_n(&x.h0[at], KV, states.begin());
      for (std::int64_t step = 0; step < len; ++step) {
        const std::int64_t r = token_row(c, n, step, h);
        const Token t = token_of(c, x, r);
        const double* prev = &states[step * KV];
        double* cur = &states[(step + 1) * KV];
        const double* v = &x.v[r * V];
        std::vector<double> o(V, 0.0);
        if (s.delta) {
          double* cc = &c_of[step * V];
          for (std::int64_t j = 0; j < V; ++j) {
            cc[j] = 0.0;
            for (std::int64_t i = 0; i < K; ++i) cc[j] += t.khat[i] * t.a[i] * prev[i * V + j];
          }
          for (std::int64_t i = 0; i < K; ++i)
            for (std::int64_t j = 0; j < V; ++j) {
              cur[i * V + j] = t.a[i] * prev[i * V + j] + t.khat[i] * t.beta * (v[j] - cc[j]);
              o[j] += cur[i * V + j] * t.qhat[i];
            }
        } else {
          for (std::int64_t i = 0; i < K; ++i)
            for (std::int64_t j = 0; j < V; ++j) {
              o[j] += prev[i * V + j] * t.qhat[i];
              cur[i * V + j] = t.a[i] * prev[i * V + j] + t.khat[i] * v[j];
            }
          for (std::int64_t j = 0; j < V; ++j) o[j] += t.weight * v[j];
        }
        for (std::int64_t j = 0; j < V; ++j) out.loss += x.d_out[r * V + j] * o[j];
      }
      std::vector<double> dS(KV, 0.0);
      if (s.d_final)
        for (std::int64_t e = 0; e < KV; ++e) out.loss += x.d_final[at + e] * states[len * KV + e], dS[e] = x.d_final[at + e];
      if (!gradients) continue;
      for (std::int64_t step = len - 1; step >= 0; --step) {
        const std::int64_t r = token_row(c, n, step, h);
        const Token t = token_of(c, x, r);
        const double* prev = &states[step * KV];
        const double* cur = &states[(step + 1) * KV];
        const double* v = &x.v[r * V];
        const double* d_o = &x.d_out[r * V];
        double* dv = &g.v[r * V];
        std::vector<double> dqhat(K, 0.0), dkhat(K, 0.0), da(K, 0.0);  // da: d log a_i
        if (s.delta) {
          // o = S_t^T qhat: dqhat = S_t do, dS += qhat do^T. S_t = P + khat e^T: dkhat = dS e, de = dS^T khat;
          // e = beta (v - c): dv = beta de, dbeta = de . (v - c), dc = -beta de; c = P^T khat: dkhat += P dc,
          // dP = dS + khat dc^T; P = diag(a) S_{t-1}: d log a_i = dP_i . P_i, dS_{t-1} = diag(a) dP.
          const double* cc = &c_of[step * V];
          std::vector<double> de(V, 0.0);
          for (std::int64_t i = 0; i < K; ++i)
            for (std::int64_t j = 0; j < V; ++j) {
              dqhat[i] += cur[i * V + j] * d_o[j];
              dS[i * V + j] += t.qhat[i] * d_o[j];
              dkhat[i] += dS[i * V + j] * t.beta * (v[j] - cc[j]);
              de[j] += dS[i * V + j] * t.khat[i];
            }
          double dbeta = 0.0;
          for (std::int64_t j = 0; j < V; ++j) dv[j] = t.beta * de[j], dbeta += de[j] * (v[j] - cc[j]);
          for (std::int64_t i = 0; i < K; ++i)
            for (std::int64_t j = 0; j < V; ++j) {
              const double p = t.a[i] * prev[i * V + j], dc = -t.beta * de[j], dp = dS[i * V + j] + t.khat[i] * dc;
              dkhat[i] += p * dc;
              da[i] += dp * p;
              dS[i * V + j] = t.a[i] * dp;
            }
          if (s.beta) g.beta[r] = dbeta;
        } else {
          // o = S_{t-1}^T qhat + w v, w = qhat . diag(u) khat: dqhat = S_{t-1} do + dw diag(u) khat,
          // dkhat += dw diag(u) qhat, du = dw qhat khat, dv = w do, dw = v . do. S_t = diag(a) S_{t-1} + khat v^T:
          // dkhat += dS v, dv += dS^T khat, d log a_i = a_i dS_i . S_{t-1,i}, dS_{t-1} = diag(a) dS + qhat do^T.
          double dw = 0.0;
          for (std::int64_t j = 0; j < V; ++j) dw += v[j] * d_o[j], dv[j] = t.weight * d_o[j];
          for (std::int64_t i = 0; i < K; ++i) {
            for (std::int64_t j = 0; j < V; ++j) {
              dqhat[i] += prev[i * V + j] * d_o[j];
              dkhat[i] += dS[i * V + j] * v[j];
              dv[j] += dS[i * V + j] * t.khat[i];
              da[i] += t.a[i] * dS[i * V + j] * prev[i * V + j];
              dS[i * V + j] = t.a[i] * dS[i * V + j] + t.qhat[i] * d_o[j];
            }
            if (s.bonus) {
              const double u = x.bonus[r * K + i];
              dqhat[i] += dw * u * t.khat[i], dkhat[i] += dw * u * t.qhat[i];
              g.bonus[r * K + i] = dw * t.qhat[i] * t.khat[i];
            }
          }
        }
        // qhat = scale q rq: dq = scale (rq dqhat - q rq^3 (dqhat . q)) where L2-normalised, d scale = rq q . dqhat;
        // khat = k rk likewise without the scale.
        const double* q = &x.q[r * K];
        const double* k = &x.k[r * K];
        double dot_q = 0.0, dot_k = 0.0;
        for (std::int64_t i = 0; i < K; ++i) dot_q += dqhat[i] * q[i], dot_k += dkhat[i] * k[i];
        for (std::int64_t i = 0; i < K; ++i) {
          g.q[r * K + i] = t.scale * (t.rq * dqhat[i] - (s.l2 ? q[i] * t.rq * t.rq * t.rq * dot_q : 0.0));
          g.k[r * K + i] = t.rk * dkhat[i] - (s.l2 ? k[i] * t.rk * t.rk * t.rk * dot_k : 0.0);
          if (s.key_decay) g.log_a[r * K + i] = da[i];
          if (s.head_decay) g.log_h[r] += da[i];
        }
        if (s.scale_table) g.scale_s[r] = t.rq * dot_q;
      }
      std::copy(dS.begin(), dS.end(), g.h0.begin() + at);
    }
  return out;
}

std::vector<float> fp32(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> fp64(const std::vector<float>& x) { return {x.begin(), x.end()}; }
template <class T>
T* or_null(std::vector<T>& x) {
  return x.empty() ? nullptr : x.data();
}

// ladle_bwd_update, then ladle_bwd_update_finish, as ops/gpu_backward.cpp launches them: the
// accumulated gradients zeroed first, the rest (and the scratch) NaN as a GPU's fresh memory might
// hold. Returns their gradients in the inputs' layouts; d_h0 asked for even without an initial
// state (the gradient of a zero one).
const EmulatedKernel& emulated(const std::string& name) {
  for (const EmulatedKernel& kernel : emulated_update_backward_kernels)
    if (name == kernel.name) return kernel;
  FAIL("no emulated kernel " << name << ": the build-time sources are not this generator's");
  std::abort();
}

Inputs run_kernels(const Case& c, const Inputs& x) {
  const auto& s = c.spec;
  const std::int64_t N = sequences(c), H = c.H, K = c.K, V = c.V, rows = c.B * c.T * H;
  std::int64_t longest = 0;
  for (std::int64_t n = 0; n < N; ++n) longest = std::max(longest, bounds(c, n).second - bounds(c, n).first);
  const std::int64_t C = (longest + cuda::update_backward_chunk - 1) / cuda::update_backward_chunk;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> qs = fp32(x.q), kf = fp32(x.k), vf = fp32(x.v), dos = fp32(x.d_out), log_a = fp32(x.log_a), log_h = fp32(x.log_h),
                     scale_s = fp32(x.scale_s), beta_s = fp32(x.beta), bonus_s = fp32(x.bonus), h0 = fp32(x.h0), d_final = fp32(x.d_final);
  std::vector<float> ckpt(cuda::update_backward_ckpt_floats(s, N, H, C, K, V), nan), chunk(cuda::update_backward_chunk_floats(s, N, H, K, V), nan);
  // The recurrent form adds into the zeroed gq and gk; the chunked form writes every token's (its
  // cases' sequences cover every row).
  const float start = s.chunked ? nan : 0.0f;
  std::vector<float> gq(rows * K, start), gk(rows * K, start), gv(rows * V, nan), ga, gh, gscale, gbeta, gbonus, d_h0(N * H * K * V, nan);
  if (s.chunked && s.head_decay) ga.assign(rows, nan);  // the chunked form: d log h per token, written
  else if (s.key_decay || s.head_decay) ga.assign(rows * K, 0.0f);
  if (s.head_decay) gh.assign(rows, nan);
  if (s.scale_table) gscale.assign(rows, nan);
  if (s.beta) gbeta.assign(rows, s.chunked ? nan : 0.0f);
  if (s.bonus) gbonus.assign(rows * K, 0.0f);
  std::vector<long long> offsets(c.cu_seqlens.begin(), c.cu_seqlens.end());
  const float scale = static_cast<float>(x.scale);

  KernelArgs packed;
  const auto in = [](std::vector<float>& t) -> const float* { return or_null(t); };
  packed.add(in(qs)).add(in(kf)).add(in(vf)).add(in(dos)).add(in(log_a)).add(in(log_h)).add(in(scale_s)).add(scale);
  packed.add(in(beta_s)).add(in(bonus_s)).add(in(h0)).add(in(d_final));
  packed.add(ckpt.data()).add(chunk.data());
  packed.add(gq.data()).add(gk.data()).add(gv.data()).add(or_null(ga)).add(or_null(gbeta)).add(or_null(gbonus)).add(d_h0.data());
  packed.add(static_cast<const long long*>(or_null(offsets)));
  packed.add(static_cast<int>(c.T)).add(static_cast<int>(H)).add(static_cast<int>(K)).add(static_cast<int>(V)).add(static_cast<int>(C));
  for (const cuda::UpdateBackwardLaunch& launch : cuda::update_backward_launches(s, N, H, C, K, V)) {
    INFO(launch.name);
    REQUIRE(static_cast<std::size_t>(launch.shared_bytes) <= cuda_emulation::dynamic_shared_bytes);
    const EmulatedKernel& kernel = emulated(launch.name);
    cuda_emulation::launch(launch.grid[0], launch.grid[1], launch.grid[2], launch.threads, [&] { kernel.launch(packed.data()); });
  }
  cuda_emulation::launch(static_cast<unsigned>((rows * 32 + 255) / 256), 1, 256, [&] {
    ladle_bwd_update_finish(qs.data(), kf.data(), or_null(scale_s), scale, gq.data(), gk.data(), s.chunked ? nullptr : or_null(ga),
                            or_null(gscale), s.chunked ? nullptr : or_null(gh),
                            s.l2 ? 1 : 0, ir::l2_normalize_eps, rows, static_cast<int>(K));
  });

  // A head decay's ga holds its per-feature parts, gh their sum; the chunked form writes d log h
  // per token into ga.
  Inputs got;
  got.q = fp64(gq), got.k = fp64(gk), got.v = fp64(gv), got.h0 = fp64(d_h0);
  if (s.key_decay) got.log_a = fp64(ga);
  got.log_h = fp64(s.chunked && s.head_decay ? ga : gh), got.scale_s = fp64(gscale), got.beta = fp64(gbeta), got.bonus = fp64(gbonus);
  return got;
}

}  // namespace

TEST_CASE("the fp64 reference's gradients are central differences of its loss", "[codegen][update_backward]") {
  std::mt19937_64 rng(5300);
  for (Case c : update_backward_cases::all()) {
    // The case's form at a size where every input element is perturbed in turn: packed sequences
    // keep an empty one.
    c.K = 5, c.V = 3;
    if (c.cu_seqlens.empty()) c.B = 2, c.T = 5;
    else c.cu_seqlens = {0, 3, 3, 8}, c.T = 8;
    INFO(c.name);
    Inputs x = draw(c, rng);
    const Result want = reference(c, x, true);
    const double step = 1e-6;
    for (const auto& [name, table] : differentiable) {
      std::vector<double>& input = x.*table;
      if (input.empty()) continue;
      const std::vector<double>& grad = want.grad.*table;
      REQUIRE(grad.size() == input.size());
      double worst = 0.0;
      for (std::size_t e = 0; e < input.size(); ++e) {
        const double kept = input[e];
        input[e] = kept + step;
        const double plus = reference(c, x, false).loss;
        input[e] = kept - step;
        const double minus = reference(c, x, false).loss;
        input[e] = kept;
        worst = std::max(worst, std::abs((plus - minus) / (2 * step) - grad[e]) / (1.0 + std::abs(grad[e])));
      }
      INFO("d" << name << ": worst difference " << worst);
      CHECK(worst < 1e-6);
    }
  }
}

TEST_CASE("the update forms' backward kernels on the host emulation match an fp64 reference", "[codegen][update_backward][emulation]") {
  std::mt19937_64 rng(5400);
  for (const Case& c : update_backward_cases::all()) {
    INFO(c.name);
    const Inputs x = draw(c, rng);
    const Result want = reference(c, x, true);
    const Inputs got = run_kernels(c, x);
    // The recurrent form runs in fp32; the chunked form's products take bf16 operands (fp32
    // accumulators), fla's precision: each rounding 2^-9 relative, a few in a row.
    const double tolerance = c.spec.chunked ? 1.5e-2 : 1e-4;
    for (const auto& [name, table] : differentiable) {
      const std::vector<double>& ref = want.grad.*table;
      if (ref.empty()) continue;
      const double error = test::relative_error(got.*table, ref);
      INFO("d" << name << ": relative error " << error);
      if (std::getenv("LADLE_TEST_VERBOSE")) WARN(c.name << " d" << name << ": relative error " << error);
      CHECK(std::any_of(ref.begin(), ref.end(), [](double e) { return e != 0.0; }));
      CHECK(error < tolerance);
    }
  }
}

TEST_CASE("the chunked form's shared memory is what its kernels carve", "[codegen][update_backward]") {
  cuda::UpdateBackwardSpec spec;
  spec.chunked = true, spec.beta = true;
  for (const bool key : {false, true})
    for (const int block_k : {64, 128})
      for (const std::int64_t V : {20, 64, 72, 256, 512}) {
        spec.block_k = block_k, spec.head_decay = !key, spec.key_decay = key;
        INFO("block_k " << block_k << ", V " << V << (key ? ", a key decay" : ", a head decay"));
        const std::vector<cuda::UpdateBackwardLaunch> launches = cuda::update_backward_launches(spec, 2, 3, 4, block_k, V);
        REQUIRE(launches.size() == 3);
        const int vp = static_cast<int>((V + 63) / 64 * 64);
        const auto check = [&](auto form) {
          using W = decltype(form);
          CHECK(launches[0].shared_bytes == W::prepare_shared(vp));
          CHECK(launches[1].shared_bytes == W::states_shared());
          CHECK(launches[2].shared_bytes == W::gradients_shared());
        };
        if (block_k == 64) key ? check(LadleWy<64, ladle_upd_key_decay>{}) : check(LadleWy<64, 0u>{});
        else key ? check(LadleWy<128, ladle_upd_key_decay>{}) : check(LadleWy<128, 0u>{});
        for (const cuda::UpdateBackwardLaunch& launch : launches) CHECK(launch.shared_bytes <= cuda::update_backward_shared_limit);
      }
  // Past what a block may carve, the form says so and the launches refuse.
  spec.key_decay = true, spec.head_decay = false, spec.block_k = 128;
  CHECK_THAT(cuda::update_backward_unchunked(spec, 128, 1024), Catch::Contains("shared memory"));
  CHECK_THROWS_WITH(cuda::update_backward_launches(spec, 1, 1, 1, 128, 1024), Catch::Contains("V = 1024"));
  CHECK(cuda::update_backward_unchunked(spec, 128, 128).empty());
}
