// GLA on tensors that live in xtensor containers, with no copy either way: ladle::view_of hands an
// xt::xarray (or a strided view of one: here q is kept head-major and transposed on the way in) to
// the op as it is, and ladle::adapt makes the output an xtensor expression over ladle's memory.
// It runs on the GPU when there is one (host tensors are uploaded), else on the CPU, and checks
// the result against the recurrence written out in xtensor. The last line is the verdict:
// `xtensor_inputs: ok`, or `xtensor_inputs: FAILED (why)` and exit status 1.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnorm.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <ladle/ops/gla.h>
#include <ladle/runtime/driver.h>
#include <ladle/tensor/xtensor.h>

#include "verdict.h"

namespace {

// Runs GLA on the xtensor inputs and checks it; returns "" when the check held, else what failed.
std::string run() {
  constexpr std::size_t B = 2, T = 48, H = 4, K = 16, V = 8;
  xt::random::seed(15);
  const xt::xarray<float> q_head_major = xt::random::randn<float>({B, H, T, K});  // [B,H,T,K]
  const xt::xarray<float> k = xt::random::randn<float>({B, T, H, K}) * 0.5f;
  const xt::xarray<float> v = xt::random::randn<float>({B, T, H, V});
  // A log-space gate as GLA makes one: logsigmoid(x) / 16.
  const xt::xarray<float> g = -xt::log1p(xt::exp(-xt::random::randn<float>({B, T, H, K}))) / 16.0f;

  // [B,T,H,K] seen through strides: no element moves.
  auto q = xt::transpose(q_head_major, {0, 2, 1, 3});
  const ladle::TensorView q_view = ladle::view_of(q);
  std::printf("q: %s, strides [%lld,%lld,%lld,%lld], same memory as the xarray: %s\n",
              ladle::describe(q_view).c_str(), static_cast<long long>(q_view.strides[0]),
              static_cast<long long>(q_view.strides[1]), static_cast<long long>(q_view.strides[2]),
              static_cast<long long>(q_view.strides[3]),
              q_view.data == q_head_major.data() ? "yes" : "no");
  if (q_view.data != q_head_major.data()) return "view_of copied q instead of viewing it";
  ladle::GlaOptions options;
  options.return_state = true;
  const ladle::RecurrentResult result =
      ladle::gla(q_view, ladle::view_of(k), ladle::view_of(v), ladle::view_of(g), options);
  const auto o = ladle::adapt<float>(result.o.view());  // [B,T,H,V], over the result's memory

  // The recurrence in xtensor: S = diag(exp(g_t)) S + k_t v_t^T, o_t = (q_t / sqrt(K))^T S.
  xt::xarray<double> expected = xt::zeros<double>({B, T, H, V});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h) {
      xt::xarray<double> S = xt::zeros<double>({K, V});
      for (std::size_t t = 0; t < T; ++t) {
        const xt::xarray<double> decay = xt::exp(xt::cast<double>(xt::view(g, b, t, h, xt::all())));
        const xt::xarray<double> kt = xt::cast<double>(xt::view(k, b, t, h, xt::all()));
        const xt::xarray<double> vt = xt::cast<double>(xt::view(v, b, t, h, xt::all()));
        S = xt::view(decay, xt::all(), xt::newaxis()) * S +
            xt::view(kt, xt::all(), xt::newaxis()) * xt::view(vt, xt::newaxis(), xt::all());
        const xt::xarray<double> qt =
            xt::cast<double>(xt::view(q, b, t, h, xt::all())) / std::sqrt(double(K));
        xt::view(expected, b, t, h, xt::all()) =
            xt::sum(xt::view(qt, xt::all(), xt::newaxis()) * S, {0});
      }
    }
  const double error = xt::norm_l2(xt::cast<double>(o) - expected)() / xt::norm_l2(expected)();
  const double tolerance = 1e-4;
  std::printf("o: %s, relative error against the xtensor recurrence %.2e (< %g)\n",
              ladle::describe(result.o.view()).c_str(), error, tolerance);
  if (!(error < tolerance)) {  // NaN fails too
    char why[128];
    std::snprintf(why, sizeof why,
                  "relative error %.2e against the xtensor recurrence, expected < %g", error,
                  tolerance);
    return why;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (!example::parse_arguments(argc, argv, "example-xtensor-inputs", false)) return 2;
  return example::report("xtensor_inputs", run);
}
