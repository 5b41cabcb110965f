// The argument checks every op family shares: shape patterns with named axes, dtypes, data
// pointers, canonical ranks and integer reads of index tensors, each failing with one
// InvalidArgument that names the op, the argument and the expectation.
#pragma once

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <ladle/codegen/tensor_view.h>
#include <ladle/runtime/error.h>

namespace ladle::ops::detail {

// One named axis of an expected shape; a value of -1 leaves it free (any size >= 1).
struct Axis {
  const char* name;
  std::int64_t value;
};
using Pattern = std::vector<Axis>;

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// "[B,T,H,K] = [2,64,8,128]"; a free axis shows its name among the values.
inline std::string pattern_text(const Pattern& pattern) {
  std::string names = "[", values = "[";
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (i) {
      names += ',';
      values += ',';
    }
    names += pattern[i].name;
    values += pattern[i].value < 0 ? std::string(pattern[i].name) : std::to_string(pattern[i].value);
  }
  return names + "] = " + values + "]";
}

inline bool matches(const TensorView& view, const Pattern& pattern) {
  if (view.rank() != static_cast<int>(pattern.size())) return false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const std::int64_t want = pattern[i].value;
    if (want < 0 ? view.shape[i] < 1 : view.shape[i] != want) return false;
  }
  return true;
}

class Checker {
 public:
  explicit Checker(std::string_view op) : op_(op) {}

  [[noreturn]] void fail(const std::string& message) const { throw InvalidArgument(std::string(op_) + ": " + message); }

  void shape(const char* name, const TensorView& view, const Pattern& pattern) const {
    if (view.strides.size() != view.shape.size())
      fail(std::string(name) + " has " + std::to_string(view.strides.size()) + " strides for its " +
           std::to_string(view.shape.size()) + " dimensions");
    if (!matches(view, pattern))
      fail(std::string(name) + " has shape " + shape_text(view.shape) + ", expected " + pattern_text(pattern));
  }
  void shape_either(const char* name, const TensorView& view, const Pattern& a, const Pattern& b) const {
    if (view.strides.size() == view.shape.size() && (matches(view, a) || matches(view, b))) return;
    fail(std::string(name) + " has shape " + shape_text(view.shape) + ", expected " + pattern_text(a) + " or " +
         pattern_text(b));
  }
  void floating(const char* name, const TensorView& view) const {
    const ElementType t = view.type;
    if (t != ElementType::f32 && t != ElementType::f16 && t != ElementType::bf16)
      fail(std::string(name) + " has dtype " + element_type_name(t) + ", expected f32, f16 or bf16");
  }
  void type(const char* name, const TensorView& view, ElementType want, const char* why) const {
    if (view.type != want)
      fail(std::string(name) + " has dtype " + element_type_name(view.type) + ", expected " + why + " (" +
           element_type_name(want) + ")");
  }
  void data(const char* name, const TensorView& view) const {
    if (view.data == nullptr && view.numel() > 0)
      fail(std::string(name) + " has " + std::to_string(view.numel()) + " elements but no data (a null pointer)");
  }

 private:
  std::string_view op_;
};

// A canonical view for the CPU path: `rank` dimensions, size-1 axes added in front.
inline TensorView lead_with_ones(TensorView view, int rank) {
  while (view.rank() < rank) {
    view.shape.insert(view.shape.begin(), 1);
    view.strides.insert(view.strides.begin(), 0);
  }
  return view;
}

inline std::int64_t integer_at(const TensorView& view, std::int64_t i) {
  const auto* base = static_cast<const std::byte*>(view.data) + i * view.strides[0] * static_cast<std::int64_t>(element_size(view.type));
  if (view.type == ElementType::i32) {
    std::int32_t value;
    std::memcpy(&value, base, sizeof value);
    return value;
  }
  std::int64_t value;
  std::memcpy(&value, base, sizeof value);
  return value;
}

}  // namespace ladle::ops::detail
