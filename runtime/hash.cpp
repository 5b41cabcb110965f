#include "hash.h"

#include <cstdint>

#include <fmt/format.h>
#include <xtl/xhash.hpp>

namespace ladle {

std::string content_hash(std::string_view bytes) {
  const std::uint64_t low = xtl::hash_bytes(bytes.data(), bytes.size(), 0x9e3779b97f4a7c15ull);
  const std::uint64_t high = xtl::hash_bytes(bytes.data(), bytes.size(), 0xc2b2ae3d27d4eb4full);
  return fmt::format("{:016x}{:016x}", high, low);
}

FieldHasher& FieldHasher::add(std::string_view field) {
  buffer_ += std::to_string(field.size());
  buffer_ += ':';
  buffer_ += field;
  return *this;
}

}  // namespace ladle
