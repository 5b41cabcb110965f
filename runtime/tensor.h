// ladle::Tensor: an owning, contiguous, row-major host tensor of one of a few dtypes, backed
// by xt::xarray. It carries kernel inputs and outputs, CPU references and .npy files, and
// relative_l2_error compares a result to its reference.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <xtensor/xarray.hpp>

#include <ladle/tensor/dtype.h>

namespace ladle {

class Tensor {
 public:
  // float32 of shape [0]: no elements (a bare xt::xarray would hold one).
  Tensor();
  // Zero-filled. An empty shape is a scalar (rank 0, one element).
  Tensor(DType dtype, std::vector<std::size_t> shape);
  template <TensorElement T>
  static Tensor from(xt::xarray<T> values) {
    Tensor tensor;
    tensor.storage_ = std::move(values);
    return tensor;
  }

  // Defined in tensor.cpp so that users do not instantiate the storage variant's copies.
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  DType dtype() const noexcept { return static_cast<DType>(storage_.index()); }
  std::vector<std::size_t> shape() const;
  std::size_t rank() const;
  std::size_t numel() const;
  std::size_t bytes() const { return numel() * dtype_size(dtype()); }
  // Row-major, contiguous; may be null when numel() is 0.
  void* data();
  const void* data() const;

  // The backing array. Throws InvalidArgument when T is not dtype().
  template <TensorElement T>
  xt::xarray<T>& array() {
    if (auto* values = std::get_if<xt::xarray<T>>(&storage_)) return *values;
    throw_dtype_mismatch(dtype_of<T>);
  }
  template <TensorElement T>
  const xt::xarray<T>& array() const {
    if (const auto* values = std::get_if<xt::xarray<T>>(&storage_)) return *values;
    throw_dtype_mismatch(dtype_of<T>);
  }

  // A converted copy. Floating targets round to nearest-even in one step from the source
  // value (so float64 -> float16 is correctly rounded). Integer targets truncate toward zero
  // like numpy's astype, but a NaN, an infinity or a value out of the target's range throws
  // InvalidArgument naming the element instead of wrapping.
  Tensor to(DType target) const;

  // Deterministic for a seed on a given platform: a fixed engine (mt19937_64) and fixed
  // transforms rather than std:: distributions, whose algorithms differ between standard
  // libraries. Values are drawn in double and rounded to dtype, so random_uniform's hi can
  // appear in a 16-bit tensor. Integer dtypes get normal draws rounded to nearest and uniform
  // draws floored. Throws InvalidArgument when stddev <= 0, lo >= hi, a parameter is not
  // finite, or every drawn value came out zero (the result is never all zeros).
  static Tensor random_normal(std::vector<std::size_t> shape, DType dtype, std::uint64_t seed,
                              double mean = 0.0, double stddev = 1.0);
  static Tensor random_uniform(std::vector<std::size_t> shape, DType dtype, std::uint64_t seed,
                               double lo = -1.0, double hi = 1.0);

  // Sets every element to value, converted as to() converts.
  void fill(double value);

  // "bfloat16[2,64,8,128]"; a scalar is "float32[]".
  std::string describe() const;

  // A copy with a new shape of the same element count; throws InvalidArgument otherwise.
  Tensor reshape(std::vector<std::size_t> shape) const;

 private:
  using Storage =
      std::variant<xt::xarray<float>, xt::xarray<half>, xt::xarray<bfloat16>, xt::xarray<double>,
                   xt::xarray<std::int32_t>, xt::xarray<std::int64_t>, xt::xarray<std::uint8_t>>;

  [[noreturn]] void throw_dtype_mismatch(DType requested) const;

  Storage storage_;
};

// .npy files (format versions 1.0, 2.0 and 3.0 are read; 1.0 is written, 2.0 when the header
// needs it). Descriptors: float32 '<f4', float64 '<f8', float16 '<f2', int32 '<i4', int64
// '<i8', uint8 '|u1'; a bool file ('|b1') loads as uint8.
//
// bfloat16 has no numpy descriptor of its own. numpy saves an ml_dtypes.bfloat16 array with
// descr '<V2' (a 2-byte void) and loads that back as '|V2', to be viewed as bfloat16 with
// `.view(ml_dtypes.bfloat16)`. save_npy writes '<V2' for bfloat16, the same bytes Python
// writes, and load_npy reads both '<V2' and '|V2' as bfloat16 (so any 2-byte void is taken
// to be bfloat16).
//
// A file in Fortran order is transposed into row-major on load, so values land at the same
// indices as in numpy. Big-endian data, structured dtypes, and any other descriptor throw
// InvalidArgument naming the file and the descriptor, as do a missing file, a bad magic
// string, a malformed header and data shorter than the header promises.
Tensor load_npy(const std::filesystem::path& path);
// Throws InvalidArgument when the file cannot be created, Error when writing it fails.
void save_npy(const std::filesystem::path& path, const Tensor& tensor);

// ||out - ref||_2 / ||ref||_2 over all elements, computed in double; the two tensors may have
// any dtypes but must have the same shape. +infinity when out holds a NaN or an infinity;
// ||out||_2 when ||ref||_2 is 0. Throws InvalidArgument on a shape mismatch or a non-finite
// ref element (a reference that is itself broken cannot judge anything).
double relative_l2_error(const Tensor& out, const Tensor& ref);

}  // namespace ladle
