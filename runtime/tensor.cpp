#include "tensor.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "error.h"

namespace ladle {

namespace {

template <class T>
constexpr bool is_16bit_float = std::same_as<T, half> || std::same_as<T, bfloat16>;

// What fmt prints for an element: the 16-bit floats have no formatter, their float does.
template <class T>
auto printable(T value) {
  if constexpr (is_16bit_float<T>) {
    return static_cast<float>(value);
  } else if constexpr (std::same_as<T, std::uint8_t>) {
    return static_cast<unsigned>(value);  // not a character
  } else {
    return value;
  }
}

// int64 values beyond 2^53 would round once into double and again into the 16-bit format,
// which can land on the wrong side of a tie. Rounding to the target's precision in integer
// arithmetic first leaves a value that double holds exactly, so only one rounding happens.
template <class To>
To narrow_int64(std::int64_t value) {
  constexpr int precision = std::numeric_limits<To>::digits;
  const bool negative = value < 0;
  std::uint64_t magnitude = negative ? 0 - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value);
  const int dropped_bits = std::bit_width(magnitude) - precision;
  if (dropped_bits > 0) {
    std::uint64_t kept = magnitude >> dropped_bits;
    const std::uint64_t dropped = magnitude & ((std::uint64_t{1} << dropped_bits) - 1);
    const std::uint64_t halfway = std::uint64_t{1} << (dropped_bits - 1);
    if (dropped > halfway || (dropped == halfway && (kept & 1) != 0)) ++kept;
    magnitude = kept << dropped_bits;
  }
  const auto exact = static_cast<double>(magnitude);
  return To(negative ? -exact : exact);
}

// Converts one element; false when an integer target cannot hold the value (NaN, infinity
// or out of range), which would otherwise be undefined behaviour.
template <class To, class From>
bool convert_element(From value, To& result) {
  if constexpr (std::is_integral_v<To>) {
    if constexpr (std::is_integral_v<From>) {
      if (!std::in_range<To>(value)) return false;
      result = static_cast<To>(value);
    } else {
      const double truncated = std::trunc(static_cast<double>(value));
      const auto lower = static_cast<double>(std::numeric_limits<To>::min());
      const double upper_exclusive = std::ldexp(1.0, std::numeric_limits<To>::digits);
      if (!(truncated >= lower && truncated < upper_exclusive)) return false;  // NaN fails too
      result = static_cast<To>(truncated);
    }
  } else if constexpr (is_16bit_float<To> && std::same_as<From, std::int64_t>) {
    result = narrow_int64<To>(value);
  } else if constexpr (is_16bit_float<To>) {
    // Every other source is exact in double, so this is the one rounding.
    result = To(static_cast<double>(value));
  } else if constexpr (is_16bit_float<From>) {
    result = static_cast<To>(static_cast<float>(value));
  } else {
    result = static_cast<To>(value);
  }
  return true;
}

template <class To, class From>
void convert_all(const From* source, To* target, std::size_t count, std::string_view context) {
  for (std::size_t i = 0; i < count; ++i) {
    if (!convert_element(source[i], target[i])) {
      throw InvalidArgument(fmt::format("{}: element {} is {}, which {} cannot represent",
                                        context, i, printable(source[i]),
                                        dtype_name(dtype_of<To>)));
    }
  }
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

std::size_t checked_numel(const std::vector<std::size_t>& shape, std::string_view context) {
  std::size_t count = 1;
  for (const std::size_t extent : shape) {
    if (extent != 0 && count > std::numeric_limits<std::size_t>::max() / extent) {
      throw InvalidArgument(fmt::format("{}: shape {} has more elements than size_t can count",
                                        context, shape_text(shape)));
    }
    count *= extent;
  }
  return count;
}

// Fixed engine and transforms: mt19937_64's sequence is specified by the standard, unlike
// the algorithms behind std::normal_distribution and friends.
class RandomStream {
 public:
  explicit RandomStream(std::uint64_t seed) : engine_(seed) {}

  // [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }

  // Box-Muller, using both values of each pair.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform()));  // 1 - u is in (0, 1]
    const double angle = 2.0 * std::numbers::pi * uniform();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Fills a new tensor from draw(), which yields doubles; integer dtypes get round_integer()
// of each draw. Throws if every element came out zero.
template <class Draw, class RoundInteger>
Tensor random_tensor(const std::vector<std::size_t>& shape, DType dtype, std::string_view context,
                     std::string_view parameters, Draw&& draw, RoundInteger&& round_integer) {
  Tensor tensor(dtype, shape);
  bool any_nonzero = false;
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto& values = tensor.array<T>();
    T* target = values.data();
    for (std::size_t i = 0; i < values.size(); ++i) {
      double value = draw();
      if constexpr (std::is_integral_v<T>) value = round_integer(value);
      if (!convert_element(value, target[i])) {
        throw InvalidArgument(fmt::format("{}: drew {} for element {}, which {} cannot represent ({})",
                                          context, value, i, dtype_name(dtype), parameters));
      }
      any_nonzero = any_nonzero || static_cast<double>(target[i]) != 0.0;
    }
  });
  if (tensor.numel() > 0 && !any_nonzero) {
    throw InvalidArgument(fmt::format("{}: every value drawn for {} rounded to zero ({}); expected "
                                      "a distribution that {} can tell from zero",
                                      context, tensor.describe(), parameters, dtype_name(dtype)));
  }
  return tensor;
}

// Up to `count` elements from `begin` on, as double (exact for every dtype but int64).
void read_as_double(const Tensor& tensor, std::size_t begin, std::size_t count, double* target) {
  visit_dtype(tensor.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* source = tensor.array<T>().data() + begin;
    for (std::size_t i = 0; i < count; ++i) target[i] = static_cast<double>(source[i]);
  });
}

}  // namespace

Tensor::Tensor() : storage_(xt::xarray<float>::from_shape(std::vector<std::size_t>{0})) {}

Tensor::Tensor(DType dtype, std::vector<std::size_t> shape) {
  checked_numel(shape, "Tensor");
  storage_ = visit_dtype(dtype, [&](auto tag) -> Storage {
    using T = typename decltype(tag)::type;
    auto values = xt::xarray<T>::from_shape(shape);
    std::fill(values.data(), values.data() + values.size(), T{});
    return values;
  });
}

Tensor::Tensor(const Tensor& other) = default;
Tensor::Tensor(Tensor&& other) noexcept = default;
Tensor& Tensor::operator=(const Tensor& other) = default;
Tensor& Tensor::operator=(Tensor&& other) noexcept = default;
Tensor::~Tensor() = default;

std::vector<std::size_t> Tensor::shape() const {
  return std::visit(
      [](const auto& values) {
        return std::vector<std::size_t>(values.shape().begin(), values.shape().end());
      },
      storage_);
}

std::size_t Tensor::rank() const {
  return std::visit([](const auto& values) { return values.dimension(); }, storage_);
}

std::size_t Tensor::numel() const {
  return std::visit([](const auto& values) { return values.size(); }, storage_);
}

void* Tensor::data() {
  return std::visit([](auto& values) -> void* { return values.data(); }, storage_);
}

const void* Tensor::data() const {
  return std::visit([](const auto& values) -> const void* { return values.data(); }, storage_);
}

void Tensor::throw_dtype_mismatch(DType requested) const {
  throw InvalidArgument(fmt::format("Tensor::array: tensor has dtype {}, requested {}",
                                    dtype_name(dtype()), dtype_name(requested)));
}

Tensor Tensor::to(DType target) const {
  const std::string context = fmt::format("Tensor::to({})", dtype_name(target));
  return std::visit(
      [&](const auto& source) {
        return visit_dtype(target, [&](auto tag) {
          using To = typename decltype(tag)::type;
          auto converted = xt::xarray<To>::from_shape(source.shape());
          convert_all(source.data(), converted.data(), source.size(), context);
          return Tensor::from(std::move(converted));
        });
      },
      storage_);
}

Tensor Tensor::random_normal(std::vector<std::size_t> shape, DType dtype, std::uint64_t seed,
                             double mean, double stddev) {
  const std::string_view context = "Tensor::random_normal";
  if (!std::isfinite(mean)) {
    throw InvalidArgument(fmt::format("{}: mean is {}, expected a finite value", context, mean));
  }
  if (!(std::isfinite(stddev) && stddev > 0.0)) {
    throw InvalidArgument(
        fmt::format("{}: stddev is {}, expected a finite value > 0", context, stddev));
  }
  RandomStream stream(seed);
  return random_tensor(
      shape, dtype, context, fmt::format("mean {}, stddev {}", mean, stddev),
      [&] { return mean + stddev * stream.normal(); },
      [](double value) { return std::round(value); });
}

Tensor Tensor::random_uniform(std::vector<std::size_t> shape, DType dtype, std::uint64_t seed,
                              double lo, double hi) {
  const std::string_view context = "Tensor::random_uniform";
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi)) {
    throw InvalidArgument(
        fmt::format("{}: range [{}, {}) is not valid, expected finite lo < hi", context, lo, hi));
  }
  RandomStream stream(seed);
  return random_tensor(
      shape, dtype, context, fmt::format("range [{}, {})", lo, hi),
      [&] { return lo + (hi - lo) * stream.uniform(); },
      [](double value) { return std::floor(value); });
}

void Tensor::fill(double value) {
  std::visit(
      [&](auto& values) {
        using T = typename std::decay_t<decltype(values)>::value_type;
        T converted{};
        if (!convert_element(value, converted)) {
          throw InvalidArgument(fmt::format("Tensor::fill: value {} cannot be represented in {}",
                                            value, dtype_name(dtype())));
        }
        std::fill(values.data(), values.data() + values.size(), converted);
      },
      storage_);
}

std::string Tensor::describe() const {
  return fmt::format("{}{}", dtype_name(dtype()), shape_text(shape()));
}

Tensor Tensor::reshape(std::vector<std::size_t> shape) const {
  const std::size_t count = checked_numel(shape, "Tensor::reshape");
  if (count != numel()) {
    throw InvalidArgument(fmt::format("Tensor::reshape: new shape {} holds {} elements, tensor {} "
                                      "holds {}",
                                      shape_text(shape), count, describe(), numel()));
  }
  Tensor reshaped(*this);
  std::visit([&](auto& values) { values.reshape(shape); }, reshaped.storage_);
  return reshaped;
}

double relative_l2_error(const Tensor& out, const Tensor& ref) {
  if (out.shape() != ref.shape()) {
    throw InvalidArgument(fmt::format(
        "relative_l2_error: out is {} and ref is {}, expected the same shape", out.describe(),
        ref.describe()));
  }
  // Chunks keep the double copies small however large the tensors are.
  constexpr std::size_t kChunk = 4096;
  std::array<double, kChunk> out_values{};
  std::array<double, kChunk> ref_values{};
  double difference_squares = 0.0;
  double ref_squares = 0.0;
  double out_squares = 0.0;
  bool out_finite = true;
  const std::size_t count = out.numel();
  for (std::size_t begin = 0; begin < count; begin += kChunk) {
    const std::size_t chunk = std::min(kChunk, count - begin);
    read_as_double(out, begin, chunk, out_values.data());
    read_as_double(ref, begin, chunk, ref_values.data());
    for (std::size_t i = 0; i < chunk; ++i) {
      const double o = out_values[i];
      const double r = ref_values[i];
      if (!std::isfinite(r)) {
        throw InvalidArgument(fmt::format(
            "relative_l2_error: ref element {} is {}, expected a finite reference", begin + i, r));
      }
      out_finite = out_finite && std::isfinite(o);
      difference_squares += (o - r) * (o - r);
      ref_squares += r * r;
      out_squares += o * o;
    }
  }
  if (!out_finite) return std::numeric_limits<double>::infinity();
  const double ref_norm = std::sqrt(ref_squares);
  if (ref_norm == 0.0) return std::sqrt(out_squares);
  return std::sqrt(difference_squares) / ref_norm;
}

}  // namespace ladle
