// A softmax-attention variant that no fixed-function attention API offers, in a few lines:
// a prefix language model (every query sees the whole prefix, then the causal past) with
// ALiBi position biases (a per-head slope times the distance) and a soft cap on the logits:
//     logit = 30 * tanh((scale * q.k - slope[h] * |i - j|) / 30)
//     attend where j < prefix or j <= i
// The mask and the bias are evaluated inside the kernel from the indices, so nothing of
// size Tq x Tk is ever built in memory. The variant runs on the GPU when there is one, else
// on the CPU path, and is checked against a plain loop; its CUDA kernel is compiled through
// NVRTC either way (`example-prefix-lm --dump` prints it). The last line is the verdict:
// `prefix_lm: ok`, or `prefix_lm: FAILED (why)` and exit status 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/runtime/driver.h>

#include "verdict.h"

namespace {

// Runs the variant and checks it; returns "" when everything held, else what failed.
std::string run(bool dump) {
  using namespace ladle;

  // 1. The variant, as an expression. Nothing runs until lower().
  const auto slope = dsl::head_param("slope");
  const auto distance = dsl::abs(dsl::query_index - dsl::key_index);
  const auto logit = dsl::soft_cap(dsl::score * dsl::scalar("scale") - slope * distance, 30.0f);
  const auto visible = dsl::key_index < dsl::scalar("prefix") || dsl::key_index <= dsl::query_index;
  const ir::AttentionVariant variant = dsl::lower(dsl::softmax(logit).mask(visible), "prefix_lm_alibi");
  std::printf("%s\n", ir::to_string(variant).c_str());

  // 2. Inputs: B=2 sequences of T=48 tokens, H=4 query heads sharing H_kv=2 key/value heads.
  const int B = 2, T = 48, H = 4, H_kv = 2, D = 32, prefix = 12;
  const float scale = 1.0f / std::sqrt(float(D));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::size_t n) {
    std::vector<float> data(n);
    for (float& e : data) e = normal(rng);
    return data;
  };
  const std::vector<float> q = random(std::size_t(B) * T * H * D), k = random(std::size_t(B) * T * H_kv * D),
                           v = random(std::size_t(B) * T * H_kv * D);
  std::vector<float> slopes(H);
  for (int h = 0; h < H; ++h) slopes[h] = std::pow(2.0f, -8.0f * float(h + 1) / float(H));  // ALiBi's geometric slopes
  const auto f32 = [](const std::vector<float>& data, std::vector<std::int64_t> shape) {
    return TensorView::contiguous(data.data(), DType::f32, std::move(shape));
  };

  // 3. Run it.
  VariantInputs inputs;
  inputs.tensors = {{"slope", f32(slopes, {H})}};
  inputs.scalars = {{"scale", scale}, {"prefix", float(prefix)}};
  const AttentionResult result =
      run_attention(variant, f32(q, {B, T, H, D}), f32(k, {B, T, H_kv, D}), f32(v, {B, T, H_kv, D}), inputs);

  // 4. The same attention as a plain loop, in double.
  double diff = 0, norm = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const int hk = h / (H / H_kv);
        std::vector<double> p(T, 0.0);
        double top = -INFINITY, sum = 0;
        for (int j = 0; j < T; ++j) {
          if (!(j < prefix || j <= i)) continue;
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += double(q[((std::size_t(b) * T + i) * H + h) * D + d]) * k[((std::size_t(b) * T + j) * H_kv + hk) * D + d];
          p[j] = 30.0 * std::tanh((scale * s - slopes[h] * std::abs(i - j)) / 30.0);
          top = std::max(top, p[j]);
        }
        for (int j = 0; j < T; ++j) sum += (j < prefix || j <= i) ? std::exp(p[j] - top) : 0.0;
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int j = 0; j < T; ++j)
            if (j < prefix || j <= i) o += std::exp(p[j] - top) / sum * v[((std::size_t(b) * T + j) * H_kv + hk) * D + d];
          const double got = result.o.get(((std::int64_t(b) * T + i) * H + h) * D + d);
          diff += (got - o) * (got - o);
          norm += o * o;
        }
      }
  const double error = std::sqrt(diff / norm);
  const double tolerance = driver_available() ? 2e-3 : 1e-5;  // fp32 inputs meet the tensor cores on a GPU
  if (std::string failed = example::check_error("prefix_lm_alibi", error, tolerance); !failed.empty()) return failed;

  // 5. The kernel ladle generates for it (bf16 inputs, D = 128), compiled by NVRTC for Hopper.
  ladle::CallShape shape;
  shape.batch = 1, shape.tokens = 1024, shape.heads = 8, shape.key_dim = shape.value_dim = 128;
  return example::show_kernels(variant, shape, ladle::AttentionRunOptions{}, dump);
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<bool> dump = example::parse_arguments(argc, argv, "example-prefix-lm", true);
  if (!dump) return 2;
  return example::report("prefix_lm", [&] { return run(*dump); });
}
