// A fingerprint of what a forward call read (its tensors' dtypes, shapes and contents, its named
// tensors' and scalars' names, its scalars' values), so that a backward can tell that the saved
// value it is handed still matches the tensors behind its views. Internal to ops.
//
// A tensor's contents hash as a sum, so that a GPU can form it in parallel where the tensor lives:
// the elements' bytes in row-major order (whatever the strides) are cut into 8-byte words w_i (the
// last padded with zeros), and the hash is sum_i mix(w_i ^ mix(i + seed)) mod 2^64, with mix
// splitmix64's finaliser and seed from the dtype and shape. mix is a bijection, so one changed word
// always changes the sum; the index inside makes moved words change it too. A device view is hashed
// by a kernel on the call's stream (content_hash_kernel_source) and only the sums come back: one
// copy of 8 bytes a device tensor and one wait for the stream per fingerprint, at the forward and
// again at the backward. A host view is hashed on the host by the same function, so a tensor hashes
// alike wherever it lives.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/tensor/tensor_view.h>

namespace ladle::ops::detail {

// splitmix64's finaliser (the step after its counter): a bijection of 64-bit words whose every
// output bit depends on every input bit.
constexpr std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The kernel's limit on the axes of a view once merged (hash_layout); the ops' tensors have at most
// five before merging.
constexpr int max_hash_rank = 8;

// A view's elements in row-major order, its axes merged where that order allows: size-1 axes dropped
// and an axis folded into the next where it steps over exactly the next one's extent (so a
// contiguous view is one axis of stride 1). The row-major index of every element is unchanged.
struct HashLayout {
  std::vector<std::int64_t> shape, strides;  // in elements; one axis at least when count > 0
  std::int64_t count = 0;
};
HashLayout hash_layout(const TensorView& view);

// The seed a view's contents are hashed with: its dtype and shape (not its strides), so that equal
// words in a tensor of another dtype or shape hash apart.
std::uint64_t layout_seed(const TensorView& view);

// The contents' hash of a host view, as the header says: the same value the kernel forms for the
// same elements in device memory. Contiguous views are read 8 bytes at a time.
std::uint64_t content_hash(const TensorView& view, std::uint64_t seed);

// The contents' hashes of device views (all on one device), each with its seed, formed on the
// device on `stream`; waits for the stream once, for the sums' copy.
std::vector<std::uint64_t> device_content_hashes(const std::vector<TensorView>& views, const std::vector<std::uint64_t>& seeds,
                                                 const Stream* stream);

// The kernel device_content_hashes launches (ladle_content_hash), and it compiled through the cache
// for `arch` (empty: this GPU's).
std::string content_hash_kernel_source();
CompiledProgram compile_content_hash_kernel(const std::string& arch = "");

// Over the given views in order (an absent one counts as absent) and the named tensors and scalars,
// on the host or the device (device views hashed on `stream`).
std::uint64_t fingerprint(const std::vector<std::optional<TensorView>>& views, const std::map<std::string, TensorView>& tensors,
                          const std::map<std::string, float>& scalars, const Stream* stream);

}  // namespace ladle::ops::detail
