// An op on device tensors, on the application's own stream: the inputs are copied to the GPU once
// (as an application's tensors would already be there), GLA runs on them with uploads turned off
// (so no hidden host round trip can happen) and returns device tensors; the result comes back to
// the host only to be checked against the CPU path. Without a GPU it says why and runs the same
// call on host tensors on the CPU path, checked against a plain loop. The last line is the
// verdict: `device_stream: ok`, or `device_stream: FAILED (why)` and exit status 1.
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <ladle/ops/gla.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/tensor.h>

#include "verdict.h"

namespace {

constexpr std::int64_t B = 2, T = 256, H = 4, K = 64, V = 64;

ladle::Tensor random(std::mt19937& rng, ladle::DType type, std::vector<std::int64_t> shape, bool gate = false) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ladle::Tensor t(type, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float x = normal(rng);
    t.set(i, gate ? -std::log1p(std::exp(-x)) / 16.0f : x);
  }
  return t;
}

double relative_error(const ladle::Tensor& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double d = out.get(i) - ref[static_cast<std::size_t>(i)];
    diff += d * d, norm += ref[static_cast<std::size_t>(i)] * ref[static_cast<std::size_t>(i)];
  }
  return std::isfinite(diff) ? std::sqrt(diff / norm) : INFINITY;
}

// GLA as a loop in double (scale 1/sqrt(K)).
std::vector<double> loop(const ladle::Tensor& q, const ladle::Tensor& k, const ladle::Tensor& v, const ladle::Tensor& g) {
  std::vector<double> out(static_cast<std::size_t>(B * T * H * V));
  const auto at = [](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t D, std::int64_t d) {
    return ((b * T + t) * H + h) * D + d;
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> S(K * V, 0.0);
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t j = 0; j < V; ++j) {
          double o = 0;
          for (std::int64_t i = 0; i < K; ++i) {
            double& s = S[i * V + j];
            s = std::exp(g.get(at(b, t, h, K, i))) * s + double(k.get(at(b, t, h, K, i))) * v.get(at(b, t, h, V, j));
            o += q.get(at(b, t, h, K, i)) / std::sqrt(double(K)) * s;
          }
          out[static_cast<std::size_t>(at(b, t, h, V, j))] = o;
        }
    }
  return out;
}

// "" when `error` is below the tolerance, else what failed.
std::string check(double error, const char* against) {
  const double tolerance = 1e-2;  // bf16 inputs
  std::printf("relative error against %s %.2e (< %g)\n", against, error, tolerance);
  if (error < tolerance) return "";  // NaN fails too
  char why[128];
  std::snprintf(why, sizeof why, "relative error %.2e against %s, expected < %g", error, against,
                tolerance);
  return why;
}

// GLA on the GPU on device tensors, checked against the CPU path; without a GPU, on host
// tensors on the CPU path, checked against the loop. Returns "" when the check held.
std::string run() {
  std::mt19937 rng(15);
  const ladle::DType bf16 = ladle::DType::bf16;
  const ladle::Tensor q = random(rng, bf16, {B, T, H, K}), k = random(rng, bf16, {B, T, H, K}),
                      v = random(rng, bf16, {B, T, H, V}), g = random(rng, ladle::DType::f32, {B, T, H, K}, true);
  if (!ladle::driver_available()) {
    const ladle::RecurrentResult result = ladle::gla(q.view(), k.view(), v.view(), g.view());
    std::printf("o: %s\n", ladle::describe(result.o.view()).c_str());
    return check(relative_error(result.o, loop(q, k, v, g)), "the loop");
  }
  const ladle::Stream stream;  // the application's stream
  const ladle::Location gpu = ladle::Location::device(0);
  const ladle::Tensor dq = q.to(gpu, &stream), dk = k.to(gpu, &stream), dv = v.to(gpu, &stream),
                      dg = g.to(gpu, &stream);
  ladle::GlaOptions options;
  options.gpu.stream = &stream;
  options.gpu.upload_host_tensors = false;  // every tensor is on the device: nothing may be copied
  const ladle::RecurrentResult result =
      ladle::gla(dq.view(), dk.view(), dv.view(), dg.view(), options);
  std::printf("ran on %s: o is %s, queued on the application's stream\n",
              ladle::Device::get().properties().name.c_str(),
              ladle::describe(result.o.view()).c_str());
  const ladle::Tensor o = result.o.to(ladle::Location::host(), &stream);  // waits for the stream
  ladle::GlaOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  const ladle::Tensor expected = ladle::gla(q.view(), k.view(), v.view(), g.view(), cpu).o;
  std::vector<double> reference(static_cast<std::size_t>(expected.numel()));
  for (std::int64_t i = 0; i < expected.numel(); ++i)
    reference[static_cast<std::size_t>(i)] = expected.get(i);
  return check(relative_error(o, reference), "the CPU path");
}

}  // namespace

int main(int argc, char** argv) {
  if (!example::parse_arguments(argc, argv, "example-device-stream", false)) return 2;
  return example::report("device_stream", run, "running on the CPU, on host tensors");
}
