#include "dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ladle/runtime/error.h>

namespace ladle {

namespace detail {
void throw_unknown_dtype(int value) {
  throw InvalidArgument(fmt::format("DType value {} is not one of ladle's dtypes", value));
}
}  // namespace detail

namespace {

struct DTypeNames {
  DType dtype;
  std::array<std::string_view, 4> aliases;  // after dtype_name; "" where a dtype has fewer
};

constexpr std::array<DTypeNames, 7> kDTypeNames{{
    {DType::f32, {"float32", "fp32", "float", ""}},
    {DType::f16, {"float16", "fp16", "half", ""}},
    {DType::bf16, {"bfloat16", "", "", ""}},
    {DType::f64, {"float64", "fp64", "double", ""}},
    {DType::i32, {"int32", "int", "", ""}},
    {DType::i64, {"int64", "", "", ""}},
    {DType::u8, {"uint8", "", "", ""}},
}};

}  // namespace

DType parse_dtype(std::string_view name) {
  std::string lowered(name);
  std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<std::string> accepted;
  for (const auto& names : kDTypeNames) {
    if (lowered == dtype_name(names.dtype)) return names.dtype;
    std::string listed = dtype_name(names.dtype);
    for (const std::string_view alias : names.aliases) {
      if (alias.empty()) continue;
      if (lowered == alias) return names.dtype;
      listed += fmt::format("/{}", alias);
    }
    accepted.push_back(std::move(listed));
  }
  throw InvalidArgument(fmt::format("parse_dtype: '{}' is not a dtype; expected one of {}", name, fmt::join(accepted, ", ")));
}

}  // namespace ladle
