#include "tensor_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ladle/runtime/error.h>

namespace ladle {

std::string describe(const TensorView& view) {
  return fmt::format("{}[{}] on {}", dtype_name(view.type), fmt::join(view.shape, ","), to_string(view.location));
}

void require_host(const std::string& op, const std::string& argument, const TensorView& view, const std::string& why) {
  if (view.on_host()) return;
  throw InvalidArgument(fmt::format("{}: {} is {}, expected host memory: {}", op, argument, describe(view), why));
}

void require_device(const std::string& op, const std::string& argument, const TensorView& view, const std::string& why) {
  if (view.on_device()) return;
  throw InvalidArgument(fmt::format("{}: {} is {}, expected device memory: {}", op, argument, describe(view), why));
}

void copy_host(const TensorView& source, const TensorView& target) {
  require_host("copy_host", "source", source);
  require_host("copy_host", "target", target);
  if (source.type != target.type || source.shape != target.shape)
    throw InvalidArgument(fmt::format("copy_host: source is {}, target is {}, expected the same dtype and shape",
                                      describe(source), describe(target)));
  const std::size_t size = dtype_size(source.type);
  if (source.is_contiguous() && target.is_contiguous()) {
    if (source.numel() > 0) std::memmove(target.data, source.data, static_cast<std::size_t>(source.numel()) * size);
    return;
  }
  // Gathered first, so that overlapping views copy what the source held.
  std::vector<std::byte> dense(static_cast<std::size_t>(source.numel()) * size);
  const auto* from = static_cast<const std::byte*>(source.data);
  for_each_offset(source, [&](std::int64_t i, std::int64_t offset) {
    std::memcpy(dense.data() + i * size, from + offset * static_cast<std::int64_t>(size), size);
  });
  auto* to = static_cast<std::byte*>(target.data);
  for_each_offset(target, [&](std::int64_t i, std::int64_t offset) {
    std::memcpy(to + offset * static_cast<std::int64_t>(size), dense.data() + i * size, size);
  });
}

}  // namespace ladle
