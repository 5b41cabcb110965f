#include "fingerprint.h"

#include <algorithm>
#include <cstring>

#include <ladle/codegen/cpu/parallel.h>
#include <ladle/runtime/error.h>

#include "loaded_kernel.h"

namespace ladle::ops::detail {
namespace {

// The kernel's parameter of the view's merged axes (struct ladle_hash_layout in the source).
struct KernelLayout {
  long long shape[max_hash_rank];
  long long strides[max_hash_rank];
};

struct ContentHashKernel {
  std::string name;
};

}  // namespace

HashLayout hash_layout(const TensorView& view) {
  HashLayout out;
  out.count = view.numel();
  if (out.count == 0) return out;
  for (int d = 0; d < view.rank(); ++d) {
    const std::int64_t extent = view.shape[static_cast<std::size_t>(d)], stride = view.strides[static_cast<std::size_t>(d)];
    if (extent == 1) continue;
    if (!out.shape.empty() && out.strides.back() == stride * extent) {
      out.shape.back() *= extent;
      out.strides.back() = stride;
    } else {
      out.shape.push_back(extent);
      out.strides.push_back(stride);
    }
  }
  if (out.shape.empty()) out.shape = {1}, out.strides = {1};  // one element
  return out;
}

std::uint64_t layout_seed(const TensorView& view) {
  std::uint64_t seed = splitmix64(static_cast<std::uint64_t>(view.type) + 1);
  seed = splitmix64(seed ^ static_cast<std::uint64_t>(view.rank()));
  for (const std::int64_t extent : view.shape) seed = splitmix64(seed ^ static_cast<std::uint64_t>(extent));
  return seed;
}

namespace {

std::uint64_t term(std::int64_t w, std::uint64_t word, std::uint64_t seed) {
  return splitmix64(word ^ splitmix64(static_cast<std::uint64_t>(w) + seed));
}

// Words [first, last) of a contiguous view of `bytes` bytes (the last word's tail zero). The host is
// little-endian, as the GPU is: a word's low bytes hold its first element, as the kernel packs them.
std::uint64_t contiguous_sum(const unsigned char* data, std::size_t bytes, std::uint64_t seed, std::int64_t first, std::int64_t last) {
  std::uint64_t sum = 0;
  const auto whole = static_cast<std::int64_t>(bytes / 8);
  for (std::int64_t w = first; w < std::min(last, whole); ++w) {
    std::uint64_t word;
    std::memcpy(&word, data + 8 * w, 8);
    sum += term(w, word, seed);
  }
  if (last > whole && bytes % 8 != 0) {
    std::uint64_t word = 0;
    std::memcpy(&word, data + 8 * whole, bytes % 8);
    sum += term(whole, word, seed);
  }
  return sum;
}

// Elements [first, last) of a strided view in row-major order (first a multiple of the elements a
// word holds), packed into words as the kernel packs them: runs along the last axis, the
// multi-index carried between runs.
template <class Element>
std::uint64_t strided_sum(const unsigned char* data, const HashLayout& layout, std::uint64_t seed, std::int64_t first, std::int64_t last) {
  constexpr std::int64_t per = 8 / sizeof(Element);
  const int rank = static_cast<int>(layout.shape.size());
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  std::int64_t offset = 0, rest = first;  // offset in elements from data
  for (int d = rank - 1; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    index[u] = rest % layout.shape[u];
    rest /= layout.shape[u];
    offset += index[u] * layout.strides[u];
  }
  const auto inner = static_cast<std::size_t>(rank - 1);
  const std::int64_t extent = layout.shape[inner], stride = layout.strides[inner];
  std::uint64_t sum = 0, word = 0;
  std::int64_t e = first;
  while (e < last) {
    const std::int64_t run = std::min(extent - index[inner], last - e);
    const unsigned char* p = data + offset * static_cast<std::int64_t>(sizeof(Element));
    for (std::int64_t r = 0; r < run; ++r, ++e) {
      Element bits;
      std::memcpy(&bits, p + r * stride * static_cast<std::int64_t>(sizeof(Element)), sizeof(Element));
      word |= static_cast<std::uint64_t>(bits) << (8 * sizeof(Element) * static_cast<std::size_t>(e % per));
      if (e % per == per - 1) sum += term(e / per, word, seed), word = 0;
    }
    offset += run * stride;
    if ((index[inner] += run) < extent) continue;
    offset -= extent * stride;
    index[inner] = 0;
    for (int d = rank - 2; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      offset += layout.strides[u];
      if (++index[u] < layout.shape[u]) break;
      offset -= index[u] * layout.strides[u];
      index[u] = 0;
    }
  }
  if (e % per != 0) sum += term(e / per, word, seed);  // the last word's tail zero
  return sum;
}

}  // namespace

std::uint64_t content_hash(const TensorView& view, std::uint64_t seed) {
  const HashLayout layout = hash_layout(view);
  if (layout.count == 0) return 0;
  const std::size_t size = dtype_size(view.type);
  const std::int64_t per = static_cast<std::int64_t>(8 / size);
  const std::int64_t words = (layout.count + per - 1) / per;
  const auto* data = static_cast<const unsigned char*>(view.data);
  const bool contiguous = layout.shape.size() == 1 && layout.strides[0] == 1;
  const auto part_sum = [&](std::int64_t first, std::int64_t last) -> std::uint64_t {  // words [first, last)
    if (contiguous) return contiguous_sum(data, static_cast<std::size_t>(layout.count) * size, seed, first, last);
    const std::int64_t begin = first * per, end = std::min(last * per, layout.count);
    switch (size) {
      case 1: return strided_sum<std::uint8_t>(data, layout, seed, begin, end);
      case 2: return strided_sum<std::uint16_t>(data, layout, seed, begin, end);
      case 4: return strided_sum<std::uint32_t>(data, layout, seed, begin, end);
      default: return strided_sum<std::uint64_t>(data, layout, seed, begin, end);
    }
  };
  // The sum does not depend on its order: a large tensor is summed in parts of 2 MiB over threads.
  constexpr std::int64_t part_words = std::int64_t{1} << 18;
  const std::int64_t parts = (words + part_words - 1) / part_words;
  if (parts <= 1) return part_sum(0, words);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(parts), 0);
  cpu::detail::parallel_items(parts, 0, [&] {
    return [&](std::int64_t part) {
      sums[static_cast<std::size_t>(part)] = part_sum(part * part_words, std::min(words, (part + 1) * part_words));
    };
  });
  std::uint64_t sum = 0;
  for (const std::uint64_t s : sums) sum += s;
  return sum;
}

std::string content_hash_kernel_source() {
  return R"(// ladle: the content hash of a strided tensor (ops/detail/fingerprint.cpp; do not edit).
// Over the view's elements in row-major order cut into 8-byte words w_i (elements packed from the low
// byte, the last word's tail zero): out += sum_i mix(w_i ^ mix(i + seed)) mod 2^64, mix splitmix64's
// finaliser. The sum does not depend on the order it is formed in, so each thread takes words by a
// grid-stride loop, a block sums its threads' by shuffles and shared memory, and one atomic a block
// adds it to *out (zeroed by the caller).
#define LADLE_HASH_MAX_RANK )" + std::to_string(max_hash_rank) + R"(
struct ladle_hash_layout {
  long long shape[LADLE_HASH_MAX_RANK];
  long long strides[LADLE_HASH_MAX_RANK];  // in elements
};

__device__ __forceinline__ unsigned long long ladle_splitmix64(unsigned long long z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long ladle_hash_load(const unsigned char* p, int size) {
  if (size == 1) return *p;
  if (size == 2) return *reinterpret_cast<const unsigned short*>(p);
  if (size == 4) return *reinterpret_cast<const unsigned int*>(p);
  return *reinterpret_cast<const unsigned long long*>(p);
}

// data: element 0 of the view; size: bytes an element (1, 2, 4 or 8); rank and layout: its merged
// axes (one axis of stride 1 when contiguous); count: its elements. 256 threads a block.
extern "C" __global__ void __launch_bounds__(256) ladle_content_hash(
    const unsigned char* __restrict__ data, int size, int rank, ladle_hash_layout layout, long long count,
    unsigned long long seed, unsigned long long* __restrict__ out) {
  const long long per = 8 / size;
  const long long words = (count + per - 1) / per;
  // Contiguous and 8-byte aligned: whole words load as they lie.
  const bool direct = rank == 1 && layout.strides[0] == 1 && (reinterpret_cast<unsigned long long>(data) & 7ull) == 0;
  unsigned long long sum = 0;
  for (long long w = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
       w += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long first = w * per;
    unsigned long long word = 0;
    if (direct && first + per <= count) {
      word = reinterpret_cast<const unsigned long long*>(data)[w];
    } else {
      // The multi-index of the word's first element, then stepped in row-major order. The loops over
      // the axes run to the fixed bound (guarded by rank), so that they unroll and index lives in
      // registers, not in local memory.
      long long index[LADLE_HASH_MAX_RANK];
      long long offset = 0, rest = first;
      for (int d = LADLE_HASH_MAX_RANK - 1; d >= 0; --d) {
        index[d] = 0;
        if (d < rank) {
          index[d] = rest % layout.shape[d];
          rest /= layout.shape[d];
          offset += index[d] * layout.strides[d];
        }
      }
      for (long long j = 0; j < per && first + j < count; ++j) {
        word |= ladle_hash_load(data + offset * size, size) << (8 * size * j);
        bool carry = true;
        for (int d = LADLE_HASH_MAX_RANK - 1; d >= 0; --d) {
          if (carry && d < rank) {
            offset += layout.strides[d];
            if (++index[d] < layout.shape[d]) {
              carry = false;
            } else {
              offset -= index[d] * layout.strides[d];
              index[d] = 0;
            }
          }
        }
      }
    }
    sum += ladle_splitmix64(word ^ ladle_splitmix64(static_cast<unsigned long long>(w) + seed));
  }
  for (int lanes = 16; lanes > 0; lanes /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, lanes);
  __shared__ unsigned long long warp_sums[8];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long block_sum = 0;
    for (unsigned i = 0; i < blockDim.x / 32; ++i) block_sum += warp_sums[i];
    atomicAdd(out, block_sum);
  }
}
)";
}

CompiledProgram compile_content_hash_kernel(const std::string& arch) {
  return gpu::detail::compile_named(content_hash_kernel_source(), "ladle_content_hash", arch);
}

std::vector<std::uint64_t> device_content_hashes(const std::vector<TensorView>& views, const std::vector<std::uint64_t>& seeds,
                                                 const Stream* stream) {
  std::vector<std::uint64_t> sums(views.size(), 0);
  if (views.empty()) return sums;
  std::vector<HashLayout> layouts;
  for (const TensorView& view : views) {
    layouts.push_back(hash_layout(view));
    if (layouts.back().shape.size() > static_cast<std::size_t>(max_hash_rank))
      throw InvalidArgument("fingerprint: a device tensor " + describe(view) + " has " + std::to_string(layouts.back().shape.size()) +
                            " axes once its contiguous ones are merged, expected at most " + std::to_string(max_hash_rank));
  }
  const Device& device = Device::get(views.front().location.ordinal);
  const std::string arch = device.properties().arch();
  const auto& loaded = gpu::detail::loaded_kernel<ContentHashKernel>("content hash", arch, [](const std::string& target) {
    struct {
      ContentHashKernel kernel;
      CompiledProgram program;
    } out{{"ladle_content_hash"}, compile_content_hash_kernel(target)};
    return out;
  });
  // One word a view, zeroed on the stream before the kernels add into it.
  DeviceBuffer out = DeviceBuffer::on_stream(8 * views.size(), stream);
  out.fill_bytes(0, stream);
  constexpr unsigned threads = 256;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const TensorView& view = views[i];
    const HashLayout& layout = layouts[i];
    if (layout.count == 0) continue;
    KernelLayout kernel_layout{};
    for (std::size_t d = 0; d < layout.shape.size(); ++d) {
      kernel_layout.shape[d] = layout.shape[d];
      kernel_layout.strides[d] = layout.strides[d];
    }
    const std::int64_t per = static_cast<std::int64_t>(8 / dtype_size(view.type));
    const std::int64_t words = (layout.count + per - 1) / per;
    // A few blocks an SM keep every SM's loads in flight; the grid-stride loop takes the rest.
    const std::int64_t cap = static_cast<std::int64_t>(std::max(1, device.properties().sm_count)) * 8;
    const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>((words + threads - 1) / threads, 1, cap));
    KernelArgs args;
    args.add(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(view.data)))
        .add(static_cast<int>(dtype_size(view.type)))
        .add(static_cast<int>(layout.shape.size()))
        .add(kernel_layout)
        .add(static_cast<long long>(layout.count))
        .add(static_cast<unsigned long long>(seeds[i]))
        .add(out.device_ptr() + 8 * i);
    loaded.function->launch({blocks, 1, 1}, {threads, 1, 1}, args, 0, stream);
  }
  copy_device_to_host(sums.data(), out.device_ptr(), 8 * sums.size(), stream);  // waits for the stream
  return sums;
}

namespace {

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = splitmix64(name.size());
  for (const char c : name) h = splitmix64(h ^ static_cast<unsigned char>(c));
  return h;
}

}  // namespace

std::uint64_t fingerprint(const std::vector<std::optional<TensorView>>& views, const std::map<std::string, TensorView>& tensors,
                          const std::map<std::string, float>& scalars, const Stream* stream) {
  // Every tensor in the order it is mixed in, with what names its place.
  struct Entry {
    std::uint64_t place;
    const TensorView* view;  // null: absent
  };
  std::vector<Entry> entries;
  for (std::size_t i = 0; i < views.size(); ++i) entries.push_back({splitmix64(i), views[i] ? &*views[i] : nullptr});
  for (const auto& [name, view] : tensors) entries.push_back({name_hash(name), &view});

  // The device views' sums first, in one batch (one wait), then everything in order.
  std::vector<TensorView> on_device;
  std::vector<std::uint64_t> seeds;
  for (const Entry& e : entries)
    if (e.view && e.view->on_device() && e.view->numel() > 0) on_device.push_back(*e.view), seeds.push_back(layout_seed(*e.view));
  const std::vector<std::uint64_t> device_sums = device_content_hashes(on_device, seeds, stream);

  std::uint64_t h = 0x6c61646c65ull;  // "ladle"
  const auto mix = [&h](std::uint64_t x) { h = splitmix64(h ^ x); };
  std::size_t next_device = 0;
  for (const Entry& e : entries) {
    mix(e.place);
    if (!e.view) {
      mix(0xab5e17ull);  // absent
      continue;
    }
    const std::uint64_t seed = layout_seed(*e.view);
    mix(seed);
    mix(e.view->on_device() && e.view->numel() > 0 ? device_sums[next_device++] : content_hash(*e.view, seed));
  }
  for (const auto& [name, value] : scalars) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    mix(name_hash(name));
    mix(bits);
  }
  return h;
}

}  // namespace ladle::ops::detail
