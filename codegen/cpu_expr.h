// One IR expression evaluated on the CPU a row at a time: each node is computed over all
// the features of a row at once (K or V values, or one value when it does not vary over
// features), so interpreting the DAG costs a dispatch per node and row, not per element.
// The math matches render_c's forms (logsigmoid without overflow, fminf semantics, ...).
#pragma once

#include <cstdint>
#include <vector>

#include <ladle/dsl/ir.h>

namespace ladle::cpu {

// Fills out[0..n) with input `index` of the variant at the row being evaluated; n is the
// row width for an input over features and 1 otherwise.
class InputLoader {
 public:
  virtual void load(std::int32_t index, float* out, std::int64_t n) const = 0;

 protected:
  ~InputLoader() = default;
};

class RowProgram {
 public:
  RowProgram() = default;
  RowProgram(const ir::Variant& variant, const ir::Expr& expr, std::int64_t width);

  bool empty() const { return nodes_.empty(); }
  bool varies_over_tokens() const { return extent_.token; }
  // The result has `width` values when true, one value otherwise.
  bool varies_over_features() const { return extent_.feature != ir::Feature::none; }
  // Floats of scratch space one evaluation needs.
  std::size_t scratch_size() const { return scratch_size_; }

  // Returns the result row, which lives in `scratch` (scratch_size() floats).
  const float* evaluate(const InputLoader& loader, float* scratch) const;

 private:
  struct Step {
    ir::Node node;
    std::int64_t length = 1;  // width or 1
    std::size_t offset = 0;   // into scratch
  };
  std::vector<Step> nodes_;
  ir::Extent extent_;
  std::size_t scratch_size_ = 0;
};

}  // namespace ladle::cpu
