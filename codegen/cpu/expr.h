// One IR expression evaluated on the CPU a row at a time: each node is computed over all
// the features of a row at once (K or V values, or one value when it does not vary over
// features), so interpreting the DAG costs a dispatch per node and row, not per element.
// The math matches render_c's forms (logsigmoid without overflow, fminf semantics, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include <ladle/dsl/ir.h>

namespace ladle::cpu {

// Fills out[0..n) with input `index` of the variant at the row being evaluated; n is the
// row width for an input over features and 1 otherwise.
class InputLoader {
 public:
  virtual void load(std::int32_t index, float* out, std::int64_t n) const = 0;
  // An attention leaf (score, an index), n values or 1 as the program was built to expect.
  virtual void load_leaf(ir::Op leaf, float* /*out*/, std::int64_t /*n*/) const {
    throw std::logic_error(std::string("RowProgram: no value for leaf ") + ir::op_name(leaf));
  }

 protected:
  ~InputLoader() = default;
};

class RowProgram {
 public:
  RowProgram() = default;
  // A recurrence slot: the row is the K or V features of one token.
  RowProgram(const ir::Variant& variant, const ir::Expr& expr, std::int64_t width);
  // Any row: `varies` says which leaves (inputs, attention leaves) take `width` values
  // along the row (an attention score row: the keys j of one query i) and which take one.
  RowProgram(const ir::Expr& expr, std::int64_t width, const std::function<bool(const ir::Node&)>& varies);

  bool empty() const { return nodes_.empty(); }
  bool varies_over_tokens() const { return varies_over_tokens_; }
  // The result has `width` values when true, one value otherwise.
  bool varies_over_features() const { return varies_over_row_; }
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
  bool varies_over_tokens_ = false;
  bool varies_over_row_ = false;
  std::size_t scratch_size_ = 0;
};

}  // namespace ladle::cpu
