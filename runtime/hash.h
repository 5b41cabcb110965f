// Content hashes for cache keys and entry checksums: 128 bits from two seeded passes of
// xtl's byte hash, as 32 hex digits. Stable across runs and machines of one endianness.
#pragma once

#include <string>
#include <string_view>

namespace ladle {

std::string content_hash(std::string_view bytes);

// Hashes a sequence of fields without ambiguity ("ab"+"c" differs from "a"+"bc").
class FieldHasher {
 public:
  FieldHasher& add(std::string_view field);
  std::string hex() const { return content_hash(buffer_); }

 private:
  std::string buffer_;
};

}  // namespace ladle
