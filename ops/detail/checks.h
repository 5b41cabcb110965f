// The argument checks every op family shares: shape patterns with named axes, dtypes, data
// pointers, canonical ranks and integer reads of index tensors, each failing with one
// InvalidArgument that names the op, the argument and the expectation.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <ladle/tensor/tensor_view.h>
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
  // A variant's validate() list: fails with every problem when there is one.
  void well_formed(const std::vector<std::string>& problems) const {
    if (problems.empty()) return;
    std::string all;
    for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
    fail("the variant is malformed: " + all);
  }

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
    const DType t = view.type;
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16)
      fail(std::string(name) + " has dtype " + dtype_name(t) + ", expected f32, f16 or bf16");
  }
  void type(const char* name, const TensorView& view, DType want, const char* why) const {
    if (view.type != want)
      fail(std::string(name) + " has dtype " + dtype_name(view.type) + ", expected " + why + " (" +
           dtype_name(want) + ")");
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

// A per-head-and-feature input ([H,K] or [B,H,K]) as the recurrence reads it, [B,T,H,K] constant
// over the tokens (and over B for [H,K]): a per-token input over K whose row does not move. The
// same view over a gradient's memory is where every token adds its part.
inline TensorView head_key_view(const TensorView& view, std::int64_t B, std::int64_t T) {
  const TensorView bhk = lead_with_ones(view, 3);
  TensorView canonical = bhk;
  canonical.shape = {B, T, bhk.shape[1], bhk.shape[2]};
  canonical.strides = {bhk.shape[0] == 1 ? 0 : bhk.strides[0], 0, bhk.strides[1], bhk.strides[2]};
  return canonical;
}

// A variant input given by name: the scalar, or the tensor, with an error that names it
// (and says so when it was given as the other kind).
inline float named_scalar(const Checker& check, const std::string& name, const std::map<std::string, float>& scalars,
                          const std::map<std::string, TensorView>& tensors) {
  const auto found = scalars.find(name);
  if (found == scalars.end())
    check.fail("the variant reads the scalar " + name + ", which was not given" +
               (tensors.count(name) ? " (it was given as a tensor; pass it among the scalars)" : ""));
  return found->second;
}
inline const TensorView& named_tensor(const Checker& check, const std::string& name, const std::string& shape,
                                      const std::map<std::string, float>& scalars,
                                      const std::map<std::string, TensorView>& tensors) {
  const auto found = tensors.find(name);
  if (found == tensors.end())
    check.fail("the variant reads " + name + " " + shape + ", which was not given" +
               (scalars.count(name) ? " (it was given as a scalar; pass it among the tensors)" : ""));
  return found->second;
}

inline std::int64_t integer_at(const TensorView& view, std::int64_t i) { return load_integer(view, i * view.strides[0]); }

// Offsets [N+1] of packed sequences, read on the host: i32 or i64, starting at 0,
// non-decreasing, ending at the token count of the packed axis (`tokens_name` = tokens).
inline std::vector<std::int64_t> read_offsets(const Checker& check, const std::string& name, const TensorView& cu,
                                              std::int64_t tokens, const std::string& tokens_name) {
  if (cu.type != DType::i32 && cu.type != DType::i64)
    check.fail(name + " has dtype " + dtype_name(cu.type) + ", expected i32 or i64");
  if (cu.rank() != 1 || cu.shape[0] < 1 || cu.strides.size() != 1)
    check.fail(name + " has shape " + shape_text(cu.shape) + ", expected [N+1] with N >= 0");
  check.data(name.c_str(), cu);
  std::vector<std::int64_t> out(static_cast<std::size_t>(cu.shape[0]));
  for (std::int64_t i = 0; i < cu.shape[0]; ++i) out[i] = integer_at(cu, i);
  if (out[0] != 0) check.fail(name + " must start at 0, but " + name + "[0] = " + std::to_string(out[0]));
  for (std::size_t i = 1; i < out.size(); ++i)
    if (out[i] < out[i - 1])
      check.fail(name + " must be non-decreasing, but " + name + "[" + std::to_string(i) + "] = " + std::to_string(out[i]) +
                 " < " + name + "[" + std::to_string(i - 1) + "] = " + std::to_string(out[i - 1]));
  if (out.back() > tokens)
    check.fail(name + " ends at " + std::to_string(out.back()) + ", past the token count " + tokens_name + " = " +
               std::to_string(tokens));
  if (out.back() < tokens)
    check.fail(name + " ends at " + std::to_string(out.back()) + ", before the token count " + tokens_name + " = " +
               std::to_string(tokens) + " (every token must belong to a sequence)");
  return out;
}

}  // namespace ladle::ops::detail
