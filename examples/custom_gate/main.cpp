// A new linear-attention variant in a few lines: the key-side gate is computed inside the
// kernel from a raw input x and a per-head temperature tau,
//     gk = logsigmoid(x) / tau[h],
// so no separate pass writes the gate to memory. The variant runs on the GPU when there is
// one, else on the CPU path, and is checked here against a plain loop over the recurrence.
// Its generated CUDA is compiled through NVRTC either way (PTX, and an sm_90a cubin with
// its resource usage); `example-custom-gate --dump` prints the whole kernel source. The last
// line is the verdict: `custom_gate: ok`, or `custom_gate: FAILED (why)` and exit status 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/driver.h>

#include "verdict.h"

namespace {

// Runs the variant and checks it; returns "" when everything held, else what failed.
std::string run(bool dump) {
  using namespace ladle;

  // 1. The variant, as an expression. Nothing runs until lower().
  const auto x = dsl::token_key("x");      // [B,T,H,K], raw gate input
  const auto tau = dsl::head_param("tau");  // [H], per-head temperature
  const auto state = dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau);
  const ir::Variant variant = dsl::lower(dsl::read(state, dsl::q, dsl::scalar("scale")), "custom_gate");
  std::printf("%s\n", ir::to_string(variant).c_str());

  // 2. Inputs: B=2 sequences of T=32 tokens, H=4 query heads sharing H_kv=2 key/value heads.
  const int B = 2, T = 32, H = 4, H_kv = 2, K = 16, V = 8;
  const float scale = 1.0f / std::sqrt(float(K));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::size_t n) {
    std::vector<float> data(n);
    for (float& e : data) e = normal(rng);
    return data;
  };
  const std::vector<float> q = random(std::size_t(B) * T * H * K), k = random(std::size_t(B) * T * H_kv * K),
                           v = random(std::size_t(B) * T * H_kv * V), xs = random(std::size_t(B) * T * H * K);
  const std::vector<float> taus = {4.0f, 8.0f, 16.0f, 32.0f};
  const auto f32 = [](const std::vector<float>& data, std::vector<std::int64_t> shape) {
    return TensorView::contiguous(data.data(), DType::f32, std::move(shape));
  };

  // 3. Run it.
  VariantInputs inputs;
  inputs.tensors = {{"x", f32(xs, {B, T, H, K})}, {"tau", f32(taus, {H})}};
  inputs.scalars = {{"scale", scale}};
  const RecurrentResult result =
      run_variant(variant, f32(q, {B, T, H, K}), f32(k, {B, T, H_kv, K}), f32(v, {B, T, H_kv, V}), inputs);

  // 4. The same recurrence as a plain loop, in double.
  double diff = 0, norm = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / H_kv);
      std::vector<double> S(std::size_t(K) * V, 0.0);
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < K; ++i) {
          const double xi = xs[((std::size_t(b) * T + t) * H + h) * K + i];
          const double gate = (std::fmin(xi, 0.0) - std::log1p(std::exp(-std::fabs(xi)))) / taus[h];
          const double ki = k[((std::size_t(b) * T + t) * H_kv + hk) * K + i];
          for (int j = 0; j < V; ++j)
            S[i * V + j] = std::exp(gate) * S[i * V + j] + ki * v[((std::size_t(b) * T + t) * H_kv + hk) * V + j];
        }
        for (int j = 0; j < V; ++j) {
          double o = 0;
          for (int i = 0; i < K; ++i) o += scale * q[((std::size_t(b) * T + t) * H + h) * K + i] * S[i * V + j];
          const double got = result.o.get(((std::int64_t(b) * T + t) * H + h) * V + j);
          diff += (got - o) * (got - o);
          norm += o * o;
        }
      }
    }
  const double error = std::sqrt(diff / norm), tolerance = 1e-5;
  if (std::string failed = example::check_error("custom_gate", error, tolerance); !failed.empty()) return failed;

  // 5. The kernels ladle generates for it at this shape in fp32, compiled by NVRTC for Hopper.
  ladle::CallShape shape;
  shape.batch = B, shape.tokens = T, shape.heads = H, shape.kv_heads = H_kv, shape.key_dim = K, shape.value_dim = V;
  shape.type = DType::f32;
  return example::show_kernels(variant, shape, ladle::RunOptions{}, dump);
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<bool> dump = example::parse_arguments(argc, argv, "example-custom-gate", true);
  if (!dump) return 2;
  return example::report("custom_gate", [&] { return run(*dump); });
}
