// ladle-bench-precision: one op's gradients on the GPU, written beside their inputs for
// bench/grad_precision.py, which holds them (and fla's, on the same inputs) against an fp64
// oracle. Inputs are drawn on the host (q, k, v, do ~ N(0,1) in bf16; a GLA gate logsigmoid(x)/16),
// the forward and backward run on device tensors through the named ops' training entry
// (gla_for_backward, recurrent_for_backward) or run_variant_for_backward for the user's gate, and
// every tensor is written as raw little-endian fp32 (<name>.bin) with meta.json naming the op, the
// shape, the scale and each tensor's shape:
//   ladle-bench-precision --op gla -B 1 -T 1000 -H 4 -K 128 -V 128 --out /tmp/precision/gla
// --op gla (g [B,T,H,K]), simple_gla (g [B,T,H], a per-token head gate, as fla's chunk_simple_gla
// takes it), g_gamma (a per-head decay [H], log(1 - 2^(-5 - h / 2)): ladle's simple GLA), user
// (x [B,T,H,K] bf16, tau [H]: the key gate logsigmoid(x) / tau).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/ops/variant.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/tensor.h>

namespace {

using ladle::DType;
using ladle::Tensor;

// A host tensor of `type` filled by `draw`, each value rounded to the type.
template <class Draw>
Tensor host(DType type, std::vector<std::int64_t> shape, Draw draw) {
  Tensor t(type, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, draw());
  return t;
}

// Writes `t` (host or device) as raw fp32 and records its shape.
void write(const std::filesystem::path& dir, const std::string& name, const Tensor& t, nlohmann::json& shapes) {
  const Tensor h = t.location() == ladle::Location::host() ? t : t.to(ladle::Location::host());
  std::vector<float> values(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) values[static_cast<std::size_t>(i)] = h.get(i);
  std::ofstream out(dir / (name + ".bin"), std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + (dir / (name + ".bin")).string());
  shapes[name] = h.shape();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-bench-precision"};
  std::string op = "gla", out_dir;
  int B = 1, T = 1000, H = 4, K = 128, V = 128;
  unsigned seed = 1;
  app.add_option("--op", op)->check(CLI::IsMember({"gla", "simple_gla", "g_gamma", "user"}));
  app.add_option("-B", B)->check(CLI::PositiveNumber);
  app.add_option("-T", T)->check(CLI::PositiveNumber);
  app.add_option("-H", H)->check(CLI::PositiveNumber);
  app.add_option("-K", K)->check(CLI::PositiveNumber);
  app.add_option("-V", V)->check(CLI::PositiveNumber);
  app.add_option("--seed", seed);
  std::string gate_gradients = "boundary_blocks";
  app.add_option("--gate-gradients", gate_gradients, "RunOptions::gate_gradients (ops/variant.h)")
      ->check(CLI::IsMember({"boundary_states", "boundary_blocks", "block_sums"}));
  app.add_option("--out", out_dir, "directory for meta.json and the tensors")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (!ladle::driver_available()) {
      std::fprintf(stderr, "ladle-bench-precision: needs a GPU (%s)\n", ladle::driver_unavailable_reason().c_str());
      return 2;
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto unit = [&] { return normal(rng); };
    const auto gate = [&] {  // logsigmoid(x) / 16
      const float x = normal(rng);
      return (std::fmin(x, 0.0f) - std::log1p(std::exp(-std::fabs(x)))) / 16.0f;
    };
    const Tensor q = host(DType::bf16, {B, T, H, K}, unit), k = host(DType::bf16, {B, T, H, K}, unit),
                 v = host(DType::bf16, {B, T, H, V}, unit), d_o = host(DType::bf16, {B, T, H, V}, unit);
    std::map<std::string, Tensor> inputs;
    if (op == "gla") inputs.emplace("g", host(DType::f32, {B, T, H, K}, gate));
    if (op == "simple_gla") inputs.emplace("g", host(DType::f32, {B, T, H}, gate));
    if (op == "g_gamma") {
      int h = 0;
      inputs.emplace("g_gamma", host(DType::f32, {H}, [&] { return std::log(1.0f - std::exp2(-5.0f - 0.5f * static_cast<float>(h++ % 8))); }));
    }
    if (op == "user") {
      inputs.emplace("x", host(DType::bf16, {B, T, H, K}, unit));
      std::vector<float> taus;
      for (int h = 0; h < H; ++h) taus.push_back(8.0f + static_cast<float>(h % 8));
      std::size_t next = 0;
      inputs.emplace("tau", host(DType::f32, {H}, [&] { return taus[next++]; }));
    }
    const auto device = [](const Tensor& t) { return t.to(ladle::Location::device()); };
    const Tensor dq_ = device(q), dk_ = device(k), dv_ = device(v), ddo = device(d_o);
    std::map<std::string, Tensor> device_inputs;
    for (const auto& [name, t] : inputs) device_inputs.emplace(name, device(t));
    const float scale = 1.0f / std::sqrt(static_cast<float>(K));
    const ladle::GateGradients mode =
        gate_gradients == "block_sums"             ? ladle::GateGradients::block_sums
          : gate_gradients == "boundary_blocks" ? ladle::GateGradients::boundary_blocks
                                                     : ladle::GateGradients::boundary_states;

    ladle::RecurrentForward forward;
    if (op == "gla") {
      ladle::GlaOptions options;
      options.scale = scale;
      options.gate_gradients = mode;
      forward = ladle::gla_for_backward(dq_.view(), dk_.view(), dv_.view(), device_inputs.at("g").view(), options);
    } else if (op == "g_gamma") {
      ladle::RecurrentOptions options;
      options.scale = scale;
      options.g_gamma = device_inputs.at("g_gamma").view();
      options.gate_gradients = mode;
      forward = ladle::recurrent_for_backward(dq_.view(), dk_.view(), dv_.view(), options);
    } else {
      namespace dsl = ladle::dsl;
      const auto scan = dsl::scan(dsl::k, dsl::v);
      const ladle::ir::Variant user =
          op == "simple_gla"
              ? dsl::lower(dsl::read(scan.decay_head(dsl::token_head("g")), dsl::q, dsl::scalar("scale")), "simple_gla")
              : dsl::lower(dsl::read(scan.decay_k(dsl::logsigmoid(dsl::token_key("x")) / dsl::head_param("tau")), dsl::q,
                                     dsl::scalar("scale")),
                           "user_gate");
      ladle::VariantInputs variant_inputs;
      variant_inputs.scalars.emplace("scale", scale);
      for (const auto& [name, t] : device_inputs) variant_inputs.tensors.emplace(name, t.view());
      ladle::RunOptions options;
      options.gate_gradients = mode;
      forward = ladle::run_variant_for_backward(user, dq_.view(), dk_.view(), dv_.view(), variant_inputs, options);
    }
    const ladle::RecurrentGradients grads = ladle::run_variant_backward(forward.saved, ddo.view());

    const std::filesystem::path dir(out_dir);
    std::filesystem::create_directories(dir);
    nlohmann::json meta{{"op", op}, {"gate_gradients", gate_gradients}, {"B", B}, {"T", T}, {"H", H}, {"K", K}, {"V", V}, {"scale", scale}};
    nlohmann::json shapes = nlohmann::json::object();
    write(dir, "q", q, shapes), write(dir, "k", k, shapes), write(dir, "v", v, shapes), write(dir, "do", d_o, shapes);
    for (const auto& [name, t] : inputs) write(dir, name, t, shapes);
    write(dir, "ladle_dq", grads.dq, shapes), write(dir, "ladle_dk", grads.dk, shapes), write(dir, "ladle_dv", grads.dv, shapes);
    for (const auto& [name, t] : grads.inputs) write(dir, "ladle_d" + name, t, shapes);
    meta["tensors"] = shapes;
    std::ofstream(dir / "meta.json") << meta.dump(1) << "\n";
    std::printf("%s\n", fmt::format("ladle-bench-precision: {} B{} T{} H{} K{} V{} -> {}", op, B, T, H, K, V, dir.string()).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ladle-bench-precision: %s\n", e.what());
    return 1;
  }
  return 0;
}
