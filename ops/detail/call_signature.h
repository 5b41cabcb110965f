// A call's signature: every property of its arguments that the GPU launchers' checks and choices
// read, except where the data is (its alignment is kept: TMA's copies need 16-byte addresses). A
// launcher remembers what it chose for a signature (CallMemo) and a repeated call skips the choosing
// (the algorithm, the heuristic tile, the plan): a cached call's host cost (issue 40, bench/RESULTS.md
// "Issue 40"). Exact: the words are compared, not only hashed. Internal to ops (not installed).
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <ladle/tensor/tensor_view.h>

namespace ladle::ops::detail {

class CallSignature {
 public:
  CallSignature& add(std::uint64_t word) {
    words_.push_back(word);
    return *this;
  }
  CallSignature& add_float(float value) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    return add(bits);
  }
  // Its length, then its bytes eight to a word.
  CallSignature& add(std::string_view text) {
    add(text.size());
    for (std::size_t i = 0; i < text.size(); i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, text.data() + i, std::min<std::size_t>(8, text.size() - i));
      add(word);
    }
    return *this;
  }
  // dtype, where, rank, shape and strides, and the address modulo 256 (0 for none).
  CallSignature& add(const TensorView& view) {
    add(static_cast<std::uint64_t>(view.type) | static_cast<std::uint64_t>(view.location.kind) << 8 |
        static_cast<std::uint64_t>(static_cast<std::uint32_t>(view.location.ordinal)) << 16 |
        static_cast<std::uint64_t>(view.rank()) << 48);
    add(reinterpret_cast<std::uintptr_t>(view.data) & 255u);
    for (const std::int64_t extent : view.shape) add(static_cast<std::uint64_t>(extent));
    for (const std::int64_t stride : view.strides) add(static_cast<std::uint64_t>(stride));
    return *this;
  }
  CallSignature& add(const std::optional<TensorView>& view) {
    add(view.has_value());
    return view ? add(*view) : *this;
  }

  friend bool operator==(const CallSignature&, const CallSignature&) = default;
  std::size_t hash() const {
    std::uint64_t h = 1469598103934665603ull;
    for (const std::uint64_t word : words_) h = (h ^ word) * 1099511628211ull ^ (h >> 29);
    return static_cast<std::size_t>(h);
  }

 private:
  std::vector<std::uint64_t> words_;
};

// What a launcher chose, by signature, for the process (thread-safe; bounded: it starts again empty
// after 4,096 signatures).
template <class Value>
class CallMemo {
 public:
  std::optional<Value> find(const CallSignature& signature) const {
    const std::lock_guard lock(mutex_);
    const auto it = values_.find(signature);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  void remember(const CallSignature& signature, const Value& value) {
    const std::lock_guard lock(mutex_);
    if (values_.size() >= 4096) values_.clear();
    values_.insert_or_assign(signature, value);
  }

 private:
  struct Hash {
    std::size_t operator()(const CallSignature& s) const { return s.hash(); }
  };
  mutable std::mutex mutex_;
  std::unordered_map<CallSignature, Value, Hash> values_;
};

}  // namespace ladle::ops::detail
