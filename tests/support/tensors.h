// Test inputs and comparisons: random tensors in a given dtype together with the exact
// values they hold (what the fp64 reference is fed), poisoned outputs, relative errors.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <ladle/runtime/tensor.h>

namespace test {

struct Filled {
  ladle::Tensor tensor;
  std::vector<double> values;  // what the tensor holds, element by element
};

template <class Draw>
Filled filled(ladle::DType type, std::vector<std::int64_t> shape, Draw&& draw) {
  Filled f{ladle::Tensor(type, std::move(shape)), {}};
  f.values.resize(static_cast<std::size_t>(f.tensor.numel()));
  for (std::int64_t i = 0; i < f.tensor.numel(); ++i) {
    f.tensor.set(i, static_cast<float>(draw()));
    f.values[i] = f.tensor.get(i);
  }
  return f;
}

inline Filled normal(std::mt19937_64& rng, ladle::DType type, std::vector<std::int64_t> shape,
                     double stddev = 1.0) {
  std::normal_distribution<double> dist(0.0, stddev);
  return filled(type, std::move(shape), [&] { return dist(rng); });
}

// A log-space gate as GLA makes one: logsigmoid(x) / 16, x ~ N(0, 1); in (-0.3, 0).
inline Filled log_gate(std::mt19937_64& rng, ladle::DType type, std::vector<std::int64_t> shape) {
  std::normal_distribution<double> dist(0.0, 1.0);
  return filled(type, std::move(shape), [&] {
    const double x = dist(rng);
    return -std::log1p(std::exp(-x)) / 16.0;
  });
}

inline double logsigmoid(double x) { return std::fmin(x, 0.0) - std::log1p(std::exp(-std::fabs(x))); }

// ||out - ref|| / ||ref||; infinite when out holds a NaN or an infinity anywhere.
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

inline std::vector<double> values_of(const ladle::Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) out[i] = t.get(i);
  return out;
}

inline double relative_error(const ladle::Tensor& out, const std::vector<double>& ref) {
  return relative_error(values_of(out), ref);
}

inline double tolerance(ladle::DType type) { return type == ladle::DType::f32 ? 1e-5 : 1e-2; }

}  // namespace test
