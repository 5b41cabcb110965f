// runtime/dlpack.h: DLManagedTensors in and out without a copy, strides and devices kept.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include <ladle/runtime/dlpack.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

using Catch::Contains;
using ladle::DType;
using ladle::Location;
using ladle::Tensor;

namespace {

Tensor random_bf16(std::vector<std::int64_t> shape, std::uint64_t seed) {
  Tensor tensor(DType::bf16, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < tensor.numel(); ++i) tensor.set(i, normal(rng));
  return tensor;
}

// A DLManagedTensor as another framework hands one over: its own memory and a deleter that counts.
struct Foreign {
  std::vector<float> data;
  std::vector<std::int64_t> shape, strides;
  int* deleted;
  DLManagedTensor managed{};
};

DLManagedTensor* foreign(int* deleted, std::vector<float> data, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                         DLDevice device = {kDLCPU, 0}) {
  auto* f = new Foreign{std::move(data), std::move(shape), std::move(strides), deleted, {}};
  DLTensor& t = f->managed.dl_tensor;
  t.data = f->data.data();
  t.device = device;
  t.ndim = static_cast<int>(f->shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = f->shape.data();
  t.strides = f->strides.empty() ? nullptr : f->strides.data();
  t.byte_offset = 0;
  f->managed.manager_ctx = f;
  f->managed.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<Foreign*>(self->manager_ctx);
    ++*owner->deleted;
    delete owner;
  };
  return &f->managed;
}

}  // namespace

TEST_CASE("a host tensor goes out through DLPack and comes back with the same memory", "[runtime][dlpack]") {
  Tensor original = random_bf16({2, 3, 5}, 1);
  const Tensor expected = original;  // a deep copy, to compare against
  const void* data = original.data();
  DLManagedTensor* exported = ladle::to_dlpack(std::move(original));
  CHECK(exported->dl_tensor.data == data);
  CHECK(exported->dl_tensor.device.device_type == kDLCPU);
  CHECK(exported->dl_tensor.dtype.code == kDLBfloat);
  CHECK(exported->dl_tensor.dtype.bits == 16);
  CHECK(exported->dl_tensor.ndim == 3);
  CHECK(exported->dl_tensor.strides[0] == 15);
  const ladle::DLPackTensor imported(exported);  // takes it back; runs the deleter at the end
  CHECK(imported.view().data == data);
  CHECK(imported.view().type == DType::bf16);
  CHECK(imported.view().shape == expected.shape());
  CHECK(imported.view().on_host());
  CHECK(std::memcmp(imported.view().data, expected.data(), expected.bytes()) == 0);
}

TEST_CASE("an imported DLPack tensor keeps its strides and byte offset, and its deleter runs once", "[runtime][dlpack]") {
  int deleted = 0;
  {
    // A [3,2] transpose of a [2,3] row-major array, as torch's .t() hands it over.
    const ladle::DLPackTensor t(foreign(&deleted, {0, 1, 2, 3, 4, 5}, {3, 2}, {1, 3}));
    CHECK(t.view().strides == std::vector<std::int64_t>{1, 3});
    CHECK_FALSE(t.view().is_contiguous());
    const Tensor packed = Tensor::copy_of(t.view(), Location::host());
    for (int i = 0; i < 6; ++i) CHECK(packed.get(i) == std::vector<float>{0, 3, 1, 4, 2, 5}[static_cast<std::size_t>(i)]);
    const ladle::DLPackTensor shared = t;  // copies share the one owner
    CHECK(deleted == 0);
  }
  CHECK(deleted == 1);
  DLManagedTensor* offset = foreign(&deleted, {9, 9, 1, 2}, {2}, {});
  offset->dl_tensor.byte_offset = 8;
  {
    const ladle::DLPackTensor t(offset);
    CHECK(t.view().is_contiguous());
    CHECK(static_cast<const float*>(t.view().data)[0] == 1.0f);
  }
  CHECK(deleted == 2);
}

TEST_CASE("DLPack tensors ladle cannot read are refused by name, and still deleted", "[runtime][dlpack]") {
  int deleted = 0;
  DLManagedTensor* vulkan = foreign(&deleted, {1, 2}, {2}, {}, {kDLVulkan, 0});
  REQUIRE_THROWS_WITH(ladle::DLPackTensor(vulkan), Contains("device type 7") && Contains("expected kDLCPU"));
  CHECK(deleted == 1);
  DLManagedTensor* complex = foreign(&deleted, {1, 2}, {1}, {});
  complex->dl_tensor.dtype = {kDLComplex, 64, 1};
  REQUIRE_THROWS_WITH(ladle::DLPackTensor(complex), Contains("code 5, bits 64, lanes 1") && Contains("has no ladle dtype"));
  CHECK(deleted == 2);
  REQUIRE_THROWS_WITH(ladle::DLPackTensor(nullptr), Contains("managed is null"));
  // A CUDA tensor is a device view: the CPU path would refuse it, the GPU path reads it in place.
  DLManagedTensor* cuda = foreign(&deleted, {1, 2}, {2}, {}, {kDLCUDA, 1});
  {
    const ladle::DLPackTensor t(cuda);
    CHECK(t.view().location == Location::device(1));
  }
  CHECK(deleted == 3);
}

TEST_CASE("a device tensor goes out through DLPack and comes back with the same device memory, or says there is no GPU",
          "[runtime][dlpack][gpu]") {
  if (!ladle::driver_available()) {
    WARN("device DLPack round trip not exercised here: " << ladle::driver_unavailable_reason());
    return;
  }
  const Tensor host = random_bf16({4, 8}, 2);
  Tensor device = host.to(Location::device(0));
  const void* data = device.data();
  DLManagedTensor* exported = ladle::to_dlpack(std::move(device));
  CHECK(exported->dl_tensor.device.device_type == kDLCUDA);
  CHECK(exported->dl_tensor.device.device_id == 0);
  const ladle::DLPackTensor imported(exported);
  CHECK(imported.view().data == data);
  CHECK(imported.view().location == Location::device(0));
  const Tensor back = Tensor::copy_of(imported.view(), Location::host());
  CHECK(std::memcmp(back.data(), host.data(), host.bytes()) == 0);
}
