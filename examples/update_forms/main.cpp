// The update forms beyond a diagonal decay, each written as one DSL expression and run as it is
// (on the GPU when there is one, else on the CPU path), then checked against a plain loop:
//   DeltaNet          scan(k, v).delta(beta)                        S = (I - b k k^T) S + b k v^T
//   Gated DeltaNet    scan(k, v).decay_head(g).delta(beta)          S = a (I - b k k^T) S + b k v^T
//                     with the model's own gates: b = sigmoid(x), g = -exp(A) softplus(y + dt)
//   RWKV6             read_before(scan(k, v).decay_k(w), r).bonus(u)  o = r^T (S + diag(u) k v^T), then S = diag(exp(w)) S + k v^T
// The named ops (ladle::delta_rule, gated_delta_rule, rwkv6) are these expressions with fla's argument
// conventions; `example-update-forms --dump` prints each lowered variant. The last line is the
// verdict: `update_forms: ok`, or `update_forms: FAILED (why)` and exit status 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/driver.h>

#include "verdict.h"

namespace {

using namespace ladle;

constexpr int B = 2, T = 40, H = 2, K = 16, V = 8;

std::vector<float> random(std::mt19937& rng, std::size_t n, float spread = 1.0f) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

TensorView view(const std::vector<float>& data, std::vector<std::int64_t> shape) {
  return TensorView::contiguous(data.data(), DType::f32, std::move(shape));
}

// The recurrence as a loop, in double: `step(b, t, h, S, o)` updates S [K][V] and writes o [V].
template <class Step>
std::vector<double> loop(Step step) {
  std::vector<double> out(std::size_t(B) * T * H * V);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      std::vector<double> S(K * V, 0.0);
      for (int t = 0; t < T; ++t) step(b, t, h, S, &out[((std::size_t(b) * T + t) * H + h) * V]);
    }
  return out;
}

double error(const Tensor& o, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) diff += std::pow(o.get(static_cast<std::int64_t>(i)) - ref[i], 2), norm += ref[i] * ref[i];
  return std::sqrt(diff / norm);
}

// Runs each form and checks it against its loop; returns "" when all held, else which failed.
std::string run(bool dump) {
  std::mt19937 rng(14);
  const std::size_t rows = std::size_t(B) * T * H;
  const auto q = random(rng, rows * K), k = random(rng, rows * K, 0.25f), v = random(rng, rows * V);
  const auto x = random(rng, rows), y = random(rng, rows), w = random(rng, rows * K), u = random(rng, std::size_t(H) * K);
  const std::vector<float> A = {0.1f, -0.5f}, dt = {0.2f, 0.0f};
  const auto at = [&](const std::vector<float>& a, int b, int t, int h, int i, int width) { return double(a[((std::size_t(b) * T + t) * H + h) * width + i]); };
  const auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  const double tolerance = 1e-4;
  std::string failed;  // "DeltaNet relative error 3.1e-02, RWKV6 ..."
  const auto report = [&](const char* name, const ir::Variant& variant, const VariantInputs& inputs, const std::vector<double>& ref) {
    if (dump) std::printf("%s\n", ir::to_string(variant).c_str());
    const RecurrentResult r = run_variant(variant, view(q, {B, T, H, K}), view(k, {B, T, H, K}), view(v, {B, T, H, V}), inputs);
    const double e = error(r.o, ref);
    std::printf("%-16s relative error against the loop: %.2e (< %g)\n", name, e, tolerance);
    if (!(e < tolerance)) {  // NaN fails too
      char why[96];
      std::snprintf(why, sizeof why, "%s%s relative error %.2e", failed.empty() ? "" : ", ", name,
                    e);
      failed += why;
    }
  };

  // DeltaNet and Gated DeltaNet: one expression each; the gated one computes its gates in the kernel.
  const auto beta = dsl::sigmoid(dsl::token_head("x"));
  const auto gate = -dsl::exp(dsl::head_param("A")) * dsl::softplus(dsl::token_head("y") + dsl::head_param("dt"));
  const ir::Variant delta = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).delta(beta), dsl::q), "deltanet");
  const ir::Variant gated = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(gate).delta(beta), dsl::q), "gated_deltanet");
  const auto delta_loop = [&](bool gated_form) {
    return loop([&](int b, int t, int h, std::vector<double>& S, double* o) {
      const double bt = sigmoid(at(x, b, t, h, 0, 1));
      const double a = gated_form ? std::exp(-std::exp(A[h]) * std::log1p(std::exp(at(y, b, t, h, 0, 1) + dt[h]))) : 1.0;
      for (int j = 0; j < V; ++j) {
        double kS = 0;
        for (int i = 0; i < K; ++i) kS += at(k, b, t, h, i, K) * a * S[i * V + j];
        for (int i = 0; i < K; ++i) S[i * V + j] = a * S[i * V + j] + bt * at(k, b, t, h, i, K) * (at(v, b, t, h, j, V) - kS);
        o[j] = 0;
        for (int i = 0; i < K; ++i) o[j] += at(q, b, t, h, i, K) * S[i * V + j];
      }
    });
  };
  report("DeltaNet", delta, {{{"x", view(x, {B, T, H})}}, {}}, delta_loop(false));
  report("Gated DeltaNet", gated,
         {{{"x", view(x, {B, T, H})}, {"y", view(y, {B, T, H})}, {"A", view(A, {H})}, {"dt", view(dt, {H})}}, {}}, delta_loop(true));

  // RWKV6: read before the update, with the bonus u on the current token; w = -exp(w_raw) as RWKV6 makes it.
  const ir::Variant rwkv = dsl::lower(
      dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(-dsl::exp(dsl::token_key("w"))), dsl::q).bonus(dsl::head_key("u")), "rwkv6_user");
  report("RWKV6", rwkv, {{{"w", view(w, {B, T, H, K})}, {"u", view(u, {H, K})}}, {}},
         loop([&](int b, int t, int h, std::vector<double>& S, double* o) {
           for (int j = 0; j < V; ++j) {
             o[j] = 0;
             for (int i = 0; i < K; ++i)
               o[j] += at(q, b, t, h, i, K) * (S[i * V + j] + u[std::size_t(h) * K + i] * at(k, b, t, h, i, K) * at(v, b, t, h, j, V));
             for (int i = 0; i < K; ++i)
               S[i * V + j] = std::exp(-std::exp(at(w, b, t, h, i, K))) * S[i * V + j] + at(k, b, t, h, i, K) * at(v, b, t, h, j, V);
           }
         }));
  if (failed.empty()) return "";
  char expected[32];
  std::snprintf(expected, sizeof expected, ", expected < %g", tolerance);
  return failed + expected;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<bool> dump = example::parse_arguments(argc, argv, "example-update-forms", true);
  if (!dump) return 2;
  return example::report("update_forms", [&] { return run(*dump); });
}
