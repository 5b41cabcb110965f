// Training a variant written as an expression: the key-side gate gk = logsigmoid(x) / tau[h] with
// a learned per-head temperature tau. A teacher with known temperatures makes the targets; the
// student starts from tau = 1 and follows the gradient that ladle derives from the same expression
// (run_variant_for_backward, then run_variant_backward: d tau comes from ir::derivative of the gate
// math), and also learns its per-token gate input x. Then a small Gated DeltaNet layer,
//   S_t = exp(logsigmoid(a_t) / 4) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  beta_t = sigmoid(b_t),
// q and k L2-normalised in it, learns its decay and write-strength inputs a and b from a teacher the
// same way (the update forms' backward). Each loss must fall by 10x: the last line is the verdict,
// `train_gate: ok`, or `train_gate: FAILED (why)` and exit status 1.
// Both run on the GPU when there is one (the gate's backward by composition over the GPU's
// recurrence kernels, the Gated DeltaNet layer's in ladle_bwd_update), else on the CPU path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/driver.h>

#include "verdict.h"

namespace {

// L = mean((o - target)^2); d_o = dL/do = 2 (o - target) / n.
double mean_squared_error(const ladle::Tensor& o, const ladle::Tensor& target, ladle::Tensor& d_o) {
  const std::int64_t n = o.numel();
  d_o = ladle::Tensor(ladle::DType::f32, o.shape());
  double loss = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double diff = double(o.get(i)) - double(target.get(i));
    loss += diff * diff / double(n);
    d_o.set(i, float(2.0 * diff / double(n)));
  }
  return loss;
}

// Trains the student; returns "" when the loss fell by 10x, else what failed.
std::string train() {
  using namespace ladle;
  const ir::Variant variant = dsl::lower(
      dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")), dsl::q,
                dsl::scalar("scale")),
      "learned_gate");

  const std::int64_t B = 2, T = 48, H = 2, K = 8, V = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::vector<std::int64_t> shape, float stddev) {
    Tensor t(DType::f32, std::move(shape));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, stddev * normal(rng));
    return t;
  };
  const Tensor q = random({B, T, H, K}, 1.0f), k = random({B, T, H, K}, 0.5f), v = random({B, T, H, V}, 1.0f);
  const Tensor x_teacher = random({B, T, H, K}, 1.0f);
  Tensor tau_teacher(DType::f32, {H});
  tau_teacher.set(0, 4.0f), tau_teacher.set(1, 0.5f);

  RunOptions options;  // backend automatic: the GPU when there is one
  const auto inputs = [&](const Tensor& x, const Tensor& tau) {
    VariantInputs in;
    in.tensors.emplace("x", x.view());
    in.tensors.emplace("tau", tau.view());
    in.scalars.emplace("scale", 1.0f / std::sqrt(float(K)));
    return in;
  };
  const RecurrentResult target = run_variant(variant, q.view(), k.view(), v.view(), inputs(x_teacher, tau_teacher), options);

  // The student: x starts as the teacher's plus noise, tau at 1.
  Tensor x = random({B, T, H, K}, 0.7f), tau(DType::f32, {H}, 1.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) + x_teacher.get(i));
  const float lr_x = 4.0f, lr_tau = 2.0f;
  double first = 0.0, last = 0.0;
  for (int step = 0; step <= 150; ++step) {
    const RecurrentForward forward = run_variant_for_backward(variant, q.view(), k.view(), v.view(), inputs(x, tau), options);
    const std::int64_t n = forward.result.o.numel();
    Tensor d_o;
    const double loss = mean_squared_error(forward.result.o, target.o, d_o);
    if (step == 0) first = loss;
    last = loss;
    if (step % 25 == 0) std::printf("step %2d  loss %.6f  tau = [%.3f, %.3f]\n", step, loss, tau.get(0), tau.get(1));
    if (step == 150) break;
    const RecurrentGradients grads = run_variant_backward(forward.saved, d_o.view());
    // Plain gradient descent; tau kept positive.
    const Tensor& dx = grads.inputs.at("x");
    const Tensor& dtau = grads.inputs.at("tau");
    for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) - lr_x * float(n) / float(x.numel()) * dx.get(i));
    for (std::int64_t h = 0; h < H; ++h) tau.set(h, std::max(0.05f, tau.get(h) - lr_tau * dtau.get(h)));
  }
  std::printf("loss %.6f -> %.6f, must fall by 10x or more\n", first, last);
  if (!(last * 10.0 <= first)) {  // NaN fails too
    char why[128];
    std::snprintf(why, sizeof why, "loss %.6f -> %.6f fell by %.3gx, expected 10x or more", first,
                  last, first / last);
    return why;
  }
  return "";
}

// The Gated DeltaNet layer: a and b [B,T,H] learned from a teacher's outputs.
std::string train_gated_deltanet() {
  using namespace ladle;
  namespace d = dsl;
  const ir::Variant variant = d::lower(
      d::read(d::scan(d::k, d::v).decay_head(d::logsigmoid(d::token_head("a")) / 4.0f).delta(d::sigmoid(d::token_head("b"))), d::q,
              d::scalar("scale"))
          .l2_normalized(),
      "gated_deltanet");
  const std::int64_t B = 2, T = 40, H = 2, K = 8, V = 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](std::vector<std::int64_t> shape, float stddev) {
    Tensor t(DType::f32, std::move(shape));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, stddev * normal(rng));
    return t;
  };
  const Tensor q = random({B, T, H, K}, 1.0f), k = random({B, T, H, K}, 1.0f), v = random({B, T, H, V}, 1.0f);
  const Tensor a_teacher = random({B, T, H}, 1.5f), b_teacher = random({B, T, H}, 1.5f);
  RunOptions options;  // the GPU when there is one, else the CPU
  const auto inputs = [&](const Tensor& a, const Tensor& b) {
    VariantInputs in;
    in.tensors.emplace("a", a.view());
    in.tensors.emplace("b", b.view());
    in.scalars.emplace("scale", 1.0f / std::sqrt(float(K)));
    return in;
  };
  const RecurrentResult target = run_variant(variant, q.view(), k.view(), v.view(), inputs(a_teacher, b_teacher), options);
  Tensor a = random({B, T, H}, 1.0f), b = random({B, T, H}, 1.0f);
  for (std::int64_t i = 0; i < a.numel(); ++i) a.set(i, a.get(i) + a_teacher.get(i)), b.set(i, b.get(i) + b_teacher.get(i));
  const float lr = 1000.0f;  // the loss is a mean over 1,280 outputs: each input's gradient is small
  double first = 0.0, last = 0.0;
  for (int step = 0; step <= 200; ++step) {
    const RecurrentForward forward = run_variant_for_backward(variant, q.view(), k.view(), v.view(), inputs(a, b), options);
    Tensor d_o;
    const double loss = mean_squared_error(forward.result.o, target.o, d_o);
    if (step == 0) first = loss;
    last = loss;
    if (step % 50 == 0) std::printf("Gated DeltaNet step %3d  loss %.6f\n", step, loss);
    if (step == 200) break;
    const RecurrentGradients grads = run_variant_backward(forward.saved, d_o.view());
    const Tensor &da = grads.inputs.at("a"), &db = grads.inputs.at("b");
    for (std::int64_t i = 0; i < a.numel(); ++i) a.set(i, a.get(i) - lr * da.get(i)), b.set(i, b.get(i) - lr * db.get(i));
  }
  std::printf("Gated DeltaNet loss %.6f -> %.6f, must fall by 10x or more\n", first, last);
  if (!(last * 10.0 <= first)) {
    char why[128];
    std::snprintf(why, sizeof why, "Gated DeltaNet loss %.6f -> %.6f fell by %.3gx, expected 10x or more", first, last, first / last);
    return why;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (!example::parse_arguments(argc, argv, "example-train-gate", false)) return 2;
  if (ladle::driver_available()) std::printf("training on the GPU\n");
  return example::report("train_gate", [] {
    const std::string gate = train();
    const std::string deltanet = train_gated_deltanet();
    return gate.empty() ? deltanet : deltanet.empty() ? gate : gate + "; " + deltanet;
  }, "training on the CPU");
}
