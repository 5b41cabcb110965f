// Every op takes host or device tensors through the same entry points: the CPU path refuses a
// device tensor by name, the GPU path refuses host tensors when uploads are off, and on a GPU a
// pointer said to live on the wrong side is caught before any kernel reads it. On a GPU, an op on
// device tensors on a user's stream matches the CPU path and returns device tensors. The same for
// the backward entry points: their forwards, their backwards and the saved values between them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <random>

#include <ladle/ops/attention.h>
#include <ladle/ops/detail/fingerprint.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/tensor.h>

#include "support/tensors.h"

using Catch::Contains;
using ladle::DType;
using ladle::Location;
using ladle::Tensor;
using ladle::TensorView;

namespace {

// A view of a tensor's host memory that claims to be device memory: what a caller gets wrong.
TensorView said_to_be_device(const Tensor& tensor) {
  TensorView view = tensor.view();
  view.location = Location::device(0);
  return view;
}

}  // namespace

TEST_CASE("the CPU path refuses a device tensor, naming it and what it expected", "[ops][locations]") {
  std::mt19937_64 rng(15);
  const Tensor q = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, k = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor,
               v = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, g = test::log_gate(rng, DType::f32, {1, 8, 2, 4}).tensor;
  ladle::GlaOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  REQUIRE_THROWS_AS(ladle::gla(q.view(), said_to_be_device(k), v.view(), g.view(), cpu), ladle::InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::gla(q.view(), said_to_be_device(k), v.view(), g.view(), cpu),
                      Contains("gla: k is f32[1,8,2,4] on cuda:0, expected host memory"));
  REQUIRE_THROWS_WITH(ladle::gla(q.view(), k.view(), v.view(), said_to_be_device(g), cpu),
                      Contains("gla: g is f32[1,8,2,4] on cuda:0, expected host memory"));
  Tensor o(DType::f32, {1, 8, 2, 4});
  REQUIRE_THROWS_WITH(ladle::gla_into(q.view(), k.view(), v.view(), g.view(), cpu, {said_to_be_device(o), std::nullopt}),
                      Contains("gla: o is f32[1,8,2,4] on cuda:0, expected host memory"));

  ladle::AttentionOptions attention_cpu;
  attention_cpu.backend = ladle::Backend::cpu;
  REQUIRE_THROWS_WITH(ladle::attention(said_to_be_device(q), k.view(), v.view(), attention_cpu),
                      Contains("attention: q is f32[1,8,2,4] on cuda:0, expected host memory"));
  // The forward kept for a backward follows the same rules.
  REQUIRE_THROWS_WITH(ladle::attention_for_backward(q.view(), said_to_be_device(k), v.view(), attention_cpu),
                      Contains("attention: k is f32[1,8,2,4] on cuda:0, expected host memory"));
  // Nothing was written.
  for (std::int64_t i = 0; i < o.numel(); ++i) REQUIRE(std::isnan(o.get(i)));
}

TEST_CASE("the GPU path refuses host tensors by name when uploads are off", "[ops][locations]") {
  std::mt19937_64 rng(16);
  const Tensor q = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor, k = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor,
               v = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor;
  ladle::RecurrentOptions options;
  options.backend = ladle::Backend::gpu;
  options.gpu.upload_host_tensors = false;
  REQUIRE_THROWS_WITH(ladle::recurrent(q.view(), k.view(), v.view(), options),
                      Contains("recurrent: q is bf16[1,16,2,8] on host, expected device memory: upload_host_tensors is off"));
  ladle::AttentionOptions attention;
  attention.backend = ladle::Backend::gpu;
  attention.gpu.upload_host_tensors = false;
  REQUIRE_THROWS_WITH(ladle::attention(q.view(), k.view(), v.view(), attention),
                      Contains("attention: q is bf16[1,16,2,8] on host, expected device memory: upload_host_tensors is off"));
  // The device launcher takes device tensors only.
  ladle::RecurrentOutputs outputs{Tensor(DType::bf16, {1, 16, 2, 8}).view(), std::nullopt};
  REQUIRE_THROWS_WITH(ladle::gpu::run_variant_into(ladle::recurrent_variant(false, false, false, false), q.view(), k.view(),
                                                   v.view(), {{}, {{"scale", 0.5f}}}, {}, outputs),
                      Contains("recurrent: q is bf16[1,16,2,8] on host, expected device memory"));
}

TEST_CASE("on a GPU, a host pointer given as device memory and a device pointer given as host memory are refused",
          "[ops][locations][gpu]") {
  if (!ladle::driver_available()) {
    WARN("not exercised here (it needs a GPU): " << ladle::driver_unavailable_reason());
    return;
  }
  std::mt19937_64 rng(17);
  const Tensor q = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, k = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor,
               v = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor;
  const Tensor device_k = k.to(Location::device(0));
  TensorView device_k_said_host = device_k.view();
  device_k_said_host.location = Location::host();
  ladle::RecurrentOptions gpu;
  gpu.backend = ladle::Backend::gpu;
  REQUIRE_THROWS_WITH(ladle::recurrent(q.view(), said_to_be_device(k), v.view(), gpu),
                      Contains("recurrent: k is f32[1,8,2,4] on cuda:0, but the driver does not know its address"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q.view(), device_k_said_host, v.view(), gpu),
                      Contains("recurrent: k is f32[1,8,2,4] on host, but its address") && Contains("is device memory of cuda:0"));
}

TEST_CASE("on a GPU, an op on device tensors on a user's stream matches the CPU path and returns device tensors",
          "[ops][locations][gpu]") {
  if (!ladle::driver_available()) {
    WARN("not exercised here (it needs a GPU): " << ladle::driver_unavailable_reason());
    return;
  }
  std::mt19937_64 rng(18);
  const std::int64_t B = 2, T = 40, H = 2, K = 16, V = 8;
  const test::Filled q = test::normal(rng, DType::bf16, {B, T, H, K}), k = test::normal(rng, DType::bf16, {B, T, H, K}),
                     v = test::normal(rng, DType::bf16, {B, T, H, V}), g = test::log_gate(rng, DType::f32, {B, T, H, K});
  ladle::GlaOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  cpu.return_state = true;
  const ladle::RecurrentResult reference = ladle::gla(q.tensor.view(), k.tensor.view(), v.tensor.view(), g.tensor.view(), cpu);

  const ladle::Stream stream;
  const Tensor dq = q.tensor.to(Location::device(0), &stream), dk = k.tensor.to(Location::device(0), &stream),
               dv = v.tensor.to(Location::device(0), &stream), dg = g.tensor.to(Location::device(0), &stream);
  ladle::GlaOptions on_device;
  on_device.return_state = true;
  on_device.gpu.stream = &stream;
  on_device.gpu.upload_host_tensors = false;  // nothing may be copied: every tensor is on the device
  const ladle::RecurrentResult result = ladle::gla(dq.view(), dk.view(), dv.view(), dg.view(), on_device);
  CHECK(result.o.location() == Location::device(0));
  REQUIRE(result.final_state);
  CHECK(result.final_state->location() == Location::device(0));
  const Tensor o = result.o.to(Location::host(), &stream), state = result.final_state->to(Location::host(), &stream);
  CHECK(test::relative_error(o, test::values_of(reference.o)) < 1e-2);
  CHECK(test::relative_error(state, test::values_of(*reference.final_state)) < 1e-2);

  // Host outputs from device inputs: written back before the call returns.
  Tensor host_o(DType::bf16, {B, T, H, V});
  ladle::GlaOptions mixed;
  mixed.gpu.stream = &stream;
  ladle::gla_into(dq.view(), dk.view(), dv.view(), dg.view(), mixed, {host_o.view(), std::nullopt});
  CHECK(test::relative_error(host_o, test::values_of(reference.o)) < 1e-2);
}

TEST_CASE("the backward on the CPU path refuses a device tensor, naming it, and reads none", "[ops][locations][backward]") {
  std::mt19937_64 rng(19);
  const Tensor q = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, k = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor,
               v = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, g = test::log_gate(rng, DType::f32, {1, 8, 2, 4}).tensor,
               d_o = test::normal(rng, DType::f32, {1, 8, 2, 4}).tensor, d_s = test::normal(rng, DType::f32, {1, 2, 4, 4}).tensor;
  const ladle::ir::Variant& gla = ladle::gla_variant(false);
  ladle::RunOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  cpu.return_state = true;
  REQUIRE_THROWS_WITH(ladle::run_variant_for_backward(gla, q.view(), k.view(), v.view(),
                                                      {{{"g", said_to_be_device(g)}}, {{"scale", 0.5f}}}, cpu),
                      Contains("gla: g is f32[1,8,2,4] on cuda:0, expected host memory"));
  const ladle::RecurrentForward forward =
      ladle::run_variant_for_backward(gla, q.view(), k.view(), v.view(), {{{"g", g.view()}}, {{"scale", 0.5f}}}, cpu);
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(forward.saved, said_to_be_device(d_o)),
                      Contains("gla backward: d_output is f32[1,8,2,4] on cuda:0, expected host memory"));
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(forward.saved, d_o.view(), said_to_be_device(d_s)),
                      Contains("gla backward: d_final_state is f32[1,2,4,4] on cuda:0, expected host memory"));
  REQUIRE_THROWS_WITH(ladle::run_variant_backward_composed(forward.saved, said_to_be_device(d_o), std::nullopt, ladle::Backend::cpu),
                      Contains("gla backward: d_output is f32[1,8,2,4] on cuda:0, expected host memory"));
  // A saved value holding a device view (as a GPU forward's may) is refused by the CPU backward, not read.
  ladle::RecurrentSaved saved_on_device = forward.saved;
  saved_on_device.q = said_to_be_device(q);
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(saved_on_device, d_o.view()),
                      Contains("gla backward: q is f32[1,8,2,4] on cuda:0, expected host memory"));
  REQUIRE_THROWS_WITH(ladle::run_variant_backward_composed(saved_on_device, d_o.view(), std::nullopt, ladle::Backend::cpu),
                      Contains("gla backward: q is f32[1,8,2,4] on cuda:0, expected host memory"));
  const ladle::RecurrentGradients gradients = ladle::run_variant_backward(forward.saved, d_o.view(), d_s.view());
  CHECK(gradients.dq.location() == Location::host());
  CHECK(std::isfinite(gradients.inputs.at("g").get(0)));

  ladle::AttentionOptions attention_cpu;
  attention_cpu.backend = ladle::Backend::cpu;
  const ladle::AttentionForward attention = ladle::attention_for_backward(q.view(), k.view(), v.view(), attention_cpu);
  REQUIRE_THROWS_WITH(ladle::run_attention_backward(attention.saved, said_to_be_device(d_o)),
                      Contains("attention backward: d_output is f32[1,8,2,4] on cuda:0, expected host memory"));
  ladle::AttentionSaved attention_on_device = attention.saved;
  attention_on_device.v = said_to_be_device(v);
  REQUIRE_THROWS_WITH(ladle::run_attention_backward(attention_on_device, d_o.view()),
                      Contains("attention backward: v is f32[1,8,2,4] on cuda:0, expected host memory"));
  CHECK(ladle::run_attention_backward(attention.saved, d_o.view()).dq.location() == Location::host());
}

// A saved value as a GPU forward makes it (no checkpoints; o and lse kept for attention), forged from
// a CPU forward's so that this runs without a GPU: the GPU backward refuses its host tensors by name
// when uploads are off, before any device work.
TEST_CASE("the backward on the GPU path refuses host tensors by name when uploads are off", "[ops][locations][backward]") {
  std::mt19937_64 rng(20);
  const Tensor q = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor, k = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor,
               v = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor, g = test::log_gate(rng, DType::f32, {1, 16, 2, 8}).tensor,
               d_o = test::normal(rng, DType::bf16, {1, 16, 2, 8}).tensor;
  const ladle::ir::Variant& gla = ladle::gla_variant(false);
  const ladle::VariantInputs inputs{{{"g", g.view()}}, {{"scale", 0.5f}}};
  ladle::RunOptions gpu;
  gpu.backend = ladle::Backend::gpu;
  gpu.gpu.upload_host_tensors = false;
  REQUIRE_THROWS_WITH(ladle::run_variant_for_backward(gla, q.view(), k.view(), v.view(), inputs, gpu),
                      Contains("gla: q is bf16[1,16,2,8] on host, expected device memory: upload_host_tensors is off"));

  ladle::RunOptions cpu;
  cpu.backend = ladle::Backend::cpu;
  ladle::RecurrentSaved saved = ladle::run_variant_for_backward(gla, q.view(), k.view(), v.view(), inputs, cpu).saved;
  saved.checkpoints = nullptr;
  saved.options.backend = ladle::Backend::gpu;
  saved.options.gpu.upload_host_tensors = false;
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(saved, d_o.view()),
                      Contains("gla backward: q is bf16[1,16,2,8] on host, expected device memory: upload_host_tensors is off"));

  ladle::AttentionOptions attention_cpu;
  attention_cpu.backend = ladle::Backend::cpu;
  attention_cpu.return_lse = true;
  ladle::AttentionForward attention = ladle::attention_for_backward(q.view(), k.view(), v.view(), attention_cpu);
  ladle::AttentionSaved attention_saved = attention.saved;
  attention_saved.o = std::make_shared<const Tensor>(attention.result.o);
  attention_saved.lse = std::make_shared<const Tensor>(*attention.result.lse);
  attention_saved.options.backend = ladle::Backend::gpu;
  attention_saved.options.gpu.upload_host_tensors = false;
  REQUIRE_THROWS_WITH(ladle::run_attention_backward(attention_saved, d_o.view()),
                      Contains("attention backward: q is bf16[1,16,2,8] on host, expected device memory: upload_host_tensors is off"));
}

namespace {

// Random bytes in every element (the hash reads bits, NaNs included).
void fill_bytes(std::mt19937_64& rng, Tensor& t) {
  auto* bytes = static_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()) * ladle::dtype_size(t.type()); ++i)
    bytes[i] = static_cast<unsigned char>(rng());
}

// The byte offset from view.data of the element with row-major index i.
std::int64_t byte_offset(const TensorView& view, std::int64_t i) {
  std::int64_t offset = 0;
  for (int d = view.rank() - 1; d >= 0; --d) {
    offset += i % view.shape[static_cast<std::size_t>(d)] * view.strides[static_cast<std::size_t>(d)];
    i /= view.shape[static_cast<std::size_t>(d)];
  }
  return offset * static_cast<std::int64_t>(ladle::dtype_size(view.type));
}

// Writes dense's elements (row-major) through `view`, a strided view of other memory.
void write_through(const TensorView& view, const Tensor& dense) {
  const std::size_t size = ladle::dtype_size(view.type);
  for (std::int64_t i = 0; i < dense.numel(); ++i)
    std::memcpy(static_cast<std::byte*>(view.data) + byte_offset(view, i), static_cast<const std::byte*>(dense.data()) + i * size, size);
}

// A view with dense's shape over `storage` (as many elements), axes stored in reverse order (a
// transpose of every axis), starting `skip` elements in.
TensorView reversed_axes(Tensor& storage, const std::vector<std::int64_t>& shape, std::int64_t skip = 0) {
  TensorView view = storage.view();
  view.data = static_cast<std::byte*>(storage.data()) + skip * static_cast<std::int64_t>(ladle::dtype_size(storage.type()));
  view.shape = shape;
  view.strides.assign(shape.size(), 1);
  for (std::size_t d = 1; d < shape.size(); ++d) view.strides[d] = view.strides[d - 1] * shape[d - 1];
  return view;
}

std::uint64_t hash_of(const TensorView& view) { return ladle::ops::detail::content_hash(view, ladle::ops::detail::layout_seed(view)); }

std::uint64_t fingerprint_of(const TensorView& view, const ladle::Stream* stream = nullptr) {
  return ladle::ops::detail::fingerprint({view}, {}, {}, stream);
}

}  // namespace

// The fingerprint hashes a tensor's elements in row-major order: the same contents in another
// layout (axes transposed, a reversed axis, a broadcast one, an unaligned start) hash alike.
TEST_CASE("the fingerprint of equal contents in different strided layouts is the same", "[ops][locations][backward][fingerprint]") {
  std::mt19937_64 rng(24);
  for (const DType type : {DType::u8, DType::bf16, DType::f32, DType::f64}) {
    INFO(ladle::dtype_name(type));
    const std::vector<std::int64_t> shape = {3, 5, 7};  // 105 elements: a partial last word for every size but 8
    Tensor dense(type, shape);
    fill_bytes(rng, dense);
    Tensor storage(type, {1 + 105});
    const TensorView transposed = reversed_axes(storage, shape, 1);  // also one element past an 8-byte boundary
    write_through(transposed, dense);
    CHECK(hash_of(transposed) == hash_of(dense.view()));
    CHECK(fingerprint_of(transposed) == fingerprint_of(dense.view()));

    // The middle axis reversed (a negative stride) and a broadcast axis, against their dense copy.
    TensorView strided = dense.view();
    strided.shape = {3, 2, 5, 7};
    strided.strides = {35, 0, -7, 1};
    strided.data = static_cast<std::byte*>(dense.data()) + 4 * 7 * static_cast<std::int64_t>(ladle::dtype_size(type));
    Tensor copied(type, strided.shape);
    for (std::int64_t i = 0; i < copied.numel(); ++i)
      std::memcpy(static_cast<std::byte*>(copied.data()) + i * static_cast<std::int64_t>(ladle::dtype_size(type)),
                  static_cast<const std::byte*>(strided.data) + byte_offset(strided, i), ladle::dtype_size(type));
    CHECK(hash_of(strided) == hash_of(copied.view()));
    CHECK(fingerprint_of(strided) == fingerprint_of(copied.view()));
  }
}

// Past 2 MiB the host sums its words in parts over threads: the parts of a contiguous view and of
// a transposed one (which cut the row-major order at other places in memory) add up alike.
TEST_CASE("the fingerprint of a large tensor summed in parts is the same in every layout", "[ops][locations][backward][fingerprint]") {
  std::mt19937_64 rng(29);
  for (const DType type : {DType::bf16, DType::f32}) {
    INFO(ladle::dtype_name(type));
    const std::vector<std::int64_t> shape = {2, 1031, 4, 130};  // > 1M elements
    Tensor dense(type, shape), storage(type, {1 + dense.numel()});
    fill_bytes(rng, dense);
    const TensorView transposed = reversed_axes(storage, shape, 1);
    write_through(transposed, dense);
    const std::uint64_t want = hash_of(dense.view());
    CHECK(hash_of(transposed) == want);
    auto* last = static_cast<unsigned char*>(transposed.data) + byte_offset(transposed, dense.numel() - 1);
    *last ^= 1;
    CHECK(hash_of(transposed) != want);
  }
}

TEST_CASE("the fingerprint changes with any one element, the last included", "[ops][locations][backward][fingerprint]") {
  std::mt19937_64 rng(25);
  for (const DType type : {DType::u8, DType::bf16, DType::f32, DType::f64}) {
    INFO(ladle::dtype_name(type));
    const std::vector<std::int64_t> shape = {3, 5, 7};
    Tensor dense(type, shape), storage(type, {1 + 105});
    fill_bytes(rng, dense);
    const TensorView transposed = reversed_axes(storage, shape, 1);
    write_through(transposed, dense);
    const std::uint64_t want = fingerprint_of(dense.view());
    const std::size_t size = ladle::dtype_size(type);
    for (std::int64_t i = 0; i < dense.numel(); ++i) {
      INFO("element " << i);
      for (const TensorView& view : {dense.view(), transposed}) {
        auto* byte = static_cast<unsigned char*>(view.data) + byte_offset(view, i) + static_cast<std::int64_t>(size) - 1;
        *byte ^= 0x10;  // one bit of the element's high byte
        CHECK(fingerprint_of(view) != want);
        *byte ^= 0x10;
        CHECK(fingerprint_of(view) == want);
      }
    }
    // Two elements swapped: the same bytes, in other places.
    Tensor swapped = dense;
    std::memcpy(swapped.data(), static_cast<const std::byte*>(dense.data()) + size, size);
    std::memcpy(static_cast<std::byte*>(swapped.data()) + size, dense.data(), size);
    if (std::memcmp(swapped.data(), dense.data(), 2 * size) != 0) CHECK(fingerprint_of(swapped.view()) != want);
  }
}

TEST_CASE("the fingerprint tells dtypes, shapes, names, absent tensors and scalars apart", "[ops][locations][backward][fingerprint]") {
  std::mt19937_64 rng(26);
  Tensor t(DType::f32, {2, 8});
  fill_bytes(rng, t);
  TensorView as_i32 = t.view(), reshaped = t.view(), as_bf16 = t.view();
  as_i32.type = DType::i32;
  reshaped.shape = {4, 4}, reshaped.strides = {4, 1};
  as_bf16.type = DType::bf16, as_bf16.shape = {2, 16}, as_bf16.strides = {16, 1};  // the same bytes
  const std::uint64_t f32 = fingerprint_of(t.view());
  CHECK(fingerprint_of(as_i32) != f32);
  CHECK(fingerprint_of(reshaped) != f32);
  CHECK(fingerprint_of(as_bf16) != f32);
  using ladle::ops::detail::fingerprint;
  CHECK(fingerprint({t.view(), std::nullopt}, {}, {}, nullptr) != fingerprint({std::nullopt, t.view()}, {}, {}, nullptr));
  CHECK(fingerprint({t.view()}, {}, {}, nullptr) != fingerprint({t.view(), std::nullopt}, {}, {}, nullptr));
  CHECK(fingerprint({}, {{"a", t.view()}}, {}, nullptr) != fingerprint({}, {{"b", t.view()}}, {}, nullptr));
  CHECK(fingerprint({}, {}, {{"scale", 0.5f}}, nullptr) != fingerprint({}, {}, {{"scale", 0.25f}}, nullptr));
  CHECK(fingerprint({}, {}, {{"scale", 0.5f}}, nullptr) != fingerprint({}, {}, {{"tau", 0.5f}}, nullptr));
  CHECK(fingerprint({}, {}, {{"scale", 0.5f}}, nullptr) == fingerprint({}, {}, {{"scale", 0.5f}}, nullptr));
}

// On a GPU a device tensor is hashed by a kernel where it lives; the sum must be the host's for
// the same elements, or a GPU backward could not check a forward that read host tensors uploaded.
TEST_CASE("on a GPU, the fingerprint of a device tensor is the host's of the same contents, and a changed element is caught",
          "[ops][locations][backward][fingerprint][gpu]") {
  if (!ladle::driver_available()) {
    WARN("not exercised here (it needs a GPU): " << ladle::driver_unavailable_reason());
    return;
  }
  std::mt19937_64 rng(27);
  const ladle::Stream stream;
  struct Case {
    DType type;
    std::vector<std::int64_t> shape;
  };
  const Case cases[] = {{DType::bf16, {3, 5, 7}},          {DType::f32, {3, 5, 7}},          {DType::u8, {3, 5, 7}},
                        {DType::f64, {3, 5, 7}},           {DType::bf16, {2, 1031, 4, 130}},  // > 1M elements, odd extents
                        {DType::f32, {2, 1031, 4, 130}}};
  for (const Case& c : cases) {
    INFO(ladle::dtype_name(c.type) << " " << c.shape.size() << " axes, " << c.shape[1] << " in the second");
    Tensor dense(c.type, c.shape);
    fill_bytes(rng, dense);
    const std::int64_t n = dense.numel();
    Tensor storage(c.type, {1 + n});
    const TensorView host_transposed = reversed_axes(storage, c.shape, 1);
    write_through(host_transposed, dense);
    const Tensor device_dense = dense.to(Location::device(0), &stream), device_storage = storage.to(Location::device(0), &stream);
    TensorView device_transposed = host_transposed;  // the same strides over the device copy
    device_transposed.location = Location::device(0);
    device_transposed.data = static_cast<std::byte*>(device_storage.view().data) + ladle::dtype_size(c.type);
    // An unaligned contiguous view: the storage from its second element (the device's direct path
    // needs 8-byte alignment, so it gathers).
    TensorView host_unaligned = TensorView::contiguous(static_cast<std::byte*>(storage.data()) + ladle::dtype_size(c.type), c.type, {n});
    TensorView device_unaligned = host_unaligned;
    device_unaligned.data = device_transposed.data, device_unaligned.location = Location::device(0);

    const std::vector<TensorView> device_views = {device_dense.view(), device_transposed, device_unaligned};
    const std::vector<TensorView> host_views = {dense.view(), host_transposed, host_unaligned};
    std::vector<std::uint64_t> seeds;
    for (const TensorView& view : host_views) seeds.push_back(ladle::ops::detail::layout_seed(view));
    const std::vector<std::uint64_t> sums = ladle::ops::detail::device_content_hashes(device_views, seeds, &stream);
    for (std::size_t i = 0; i < host_views.size(); ++i) {
      INFO("view " << i << " (dense, transposed, unaligned)");
      CHECK(sums[i] == ladle::ops::detail::content_hash(host_views[i], seeds[i]));
      CHECK(fingerprint_of(device_views[i], &stream) == fingerprint_of(host_views[i]));
    }
    CHECK(fingerprint_of(device_transposed, &stream) == fingerprint_of(dense.view()));

    // One element changed on the device (the first, one inside, the last): caught.
    const std::uint64_t want = fingerprint_of(dense.view());
    const std::size_t size = ladle::dtype_size(c.type);
    for (const std::int64_t i : {std::int64_t{0}, n / 3, n - 1}) {
      INFO("element " << i);
      for (const TensorView& view : {device_dense.view(), device_transposed}) {
        const auto address = reinterpret_cast<std::uintptr_t>(view.data) + static_cast<std::uintptr_t>(byte_offset(view, i));
        unsigned char byte = 0;
        ladle::copy_device_to_host(&byte, address + size - 1, 1, &stream);
        const unsigned char changed = byte ^ 0x10;
        ladle::copy_host_to_device(address + size - 1, &changed, 1, &stream);
        CHECK(fingerprint_of(view, &stream) != want);
        ladle::copy_host_to_device(address + size - 1, &byte, 1, &stream);
        CHECK(fingerprint_of(view, &stream) == want);
      }
    }
  }
}

namespace {

// A device gradient against the same gradient from host tensors: the same kernels on the same values,
// only where the tensors started differs (the tolerance allows for sums whose order atomics decide).
void check_device_gradient(const std::string& name, const Tensor& got, const Tensor& want, const ladle::Stream& stream) {
  INFO("d" << name);
  CHECK(got.location() == Location::device(0));
  CHECK(want.location() == Location::host());
  REQUIRE(got.shape() == want.shape());
  const double error = test::relative_error(got.to(Location::host(), &stream), test::values_of(want));
  INFO("relative error " << error);
  CHECK(error < 1e-4);
}

}  // namespace

TEST_CASE("on a GPU, the recurrent backward on device tensors matches the one on host tensors and returns device gradients",
          "[ops][locations][backward][gpu]") {
  if (!ladle::driver_available()) {
    WARN("not exercised here (it needs a GPU): " << ladle::driver_unavailable_reason());
    return;
  }
  std::mt19937_64 rng(22);
  const std::int64_t B = 2, T = 100, H = 2, K = 64, V = 64;
  const Tensor q = test::normal(rng, DType::bf16, {B, T, H, K}).tensor, k = test::normal(rng, DType::bf16, {B, T, H, K}, 0.25).tensor,
               v = test::normal(rng, DType::bf16, {B, T, H, V}).tensor, g = test::log_gate(rng, DType::f32, {B, T, H, K}).tensor,
               h0 = test::normal(rng, DType::f32, {B, H, K, V}, 0.1).tensor, d_o = test::normal(rng, DType::bf16, {B, T, H, V}).tensor,
               d_s = test::normal(rng, DType::f32, {B, H, K, V}, 0.1).tensor;
  const ladle::ir::Variant& gla = ladle::gla_variant(false);
  ladle::RunOptions host_options;
  host_options.backend = ladle::Backend::gpu;
  host_options.initial_state = h0.view();
  host_options.return_state = true;
  const ladle::RecurrentForward host_forward =
      ladle::run_variant_for_backward(gla, q.view(), k.view(), v.view(), {{{"g", g.view()}}, {{"scale", 0.125f}}}, host_options);
  const ladle::RecurrentGradients want = ladle::run_variant_backward(host_forward.saved, d_o.view(), d_s.view());

  const ladle::Stream stream;
  const auto to_device = [&](const Tensor& t) { return t.to(Location::device(0), &stream); };
  Tensor device_q = to_device(q), device_k = to_device(k), device_v = to_device(v), device_g = to_device(g), device_h0 = to_device(h0),
         device_d_o = to_device(d_o), device_d_s = to_device(d_s);
  ladle::RunOptions device_options = host_options;
  device_options.initial_state = device_h0.view();
  device_options.gpu.stream = &stream;
  device_options.gpu.upload_host_tensors = false;  // nothing may be uploaded: every tensor is on the device
  const ladle::RecurrentForward forward = ladle::run_variant_for_backward(
      gla, device_q.view(), device_k.view(), device_v.view(), {{{"g", device_g.view()}}, {{"scale", 0.125f}}}, device_options);
  CHECK(forward.result.o.location() == Location::device(0));
  CHECK(forward.saved.q.on_device());
  CHECK(test::relative_error(forward.result.o.to(Location::host(), &stream), test::values_of(host_forward.result.o)) < 1e-4);
  const ladle::RecurrentGradients got = ladle::run_variant_backward(forward.saved, device_d_o.view(), device_d_s.view());
  check_device_gradient("q", got.dq, want.dq, stream);
  check_device_gradient("k", got.dk, want.dk, stream);
  check_device_gradient("v", got.dv, want.dv, stream);
  check_device_gradient("g", got.inputs.at("g"), want.inputs.at("g"), stream);
  REQUIRE(got.d_initial_state);
  check_device_gradient("_initial_state", *got.d_initial_state, *want.d_initial_state, stream);

  // Uploads off: a host d_output is refused by name.
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(forward.saved, d_o.view(), device_d_s.view()),
                      Contains("gla backward: d_output is bf16[2,100,2,64] on host, expected device memory: upload_host_tensors is off"));

  // Mixed, uploads on: device q, k, v, a host gate and initial state, a host d_output; the gradients live
  // where q lives.
  ladle::RunOptions mixed_options = host_options;
  mixed_options.gpu.stream = &stream;
  const ladle::RecurrentForward mixed = ladle::run_variant_for_backward(gla, device_q.view(), device_k.view(), device_v.view(),
                                                                       {{{"g", g.view()}}, {{"scale", 0.125f}}}, mixed_options);
  const ladle::RecurrentGradients mixed_got = ladle::run_variant_backward(mixed.saved, d_o.view(), device_d_s.view());
  check_device_gradient("q (mixed)", mixed_got.dq, want.dq, stream);
  check_device_gradient("g (mixed)", mixed_got.inputs.at("g"), want.inputs.at("g"), stream);

  // A device tensor changed since the forward: its hash, formed on the device, tells.
  copy(test::normal(rng, DType::bf16, {B, T, H, K}).tensor.view(), device_k.view(), &stream);
  REQUIRE_THROWS_WITH(ladle::run_variant_backward(forward.saved, device_d_o.view(), device_d_s.view()),
                      Contains("saved") && Contains("forward read"));

  // Packed sequences (one empty) with cu_seqlens on the device too: the checks read a host copy of it.
  const std::int64_t total = 200;
  Tensor cu(DType::i64, {4});
  const std::int64_t offsets[4] = {0, 60, 60, total};
  std::memcpy(cu.data(), offsets, sizeof offsets);
  const Tensor packed_q = test::normal(rng, DType::bf16, {1, total, H, K}).tensor,
               packed_k = test::normal(rng, DType::bf16, {1, total, H, K}, 0.25).tensor,
               packed_v = test::normal(rng, DType::bf16, {1, total, H, V}).tensor,
               packed_g = test::log_gate(rng, DType::f32, {1, total, H, K}).tensor,
               packed_d_o = test::normal(rng, DType::bf16, {1, total, H, V}).tensor;
  ladle::RunOptions packed_options;
  packed_options.backend = ladle::Backend::gpu;
  packed_options.cu_seqlens = cu.view();
  const ladle::RecurrentForward packed_host_forward = ladle::run_variant_for_backward(
      gla, packed_q.view(), packed_k.view(), packed_v.view(), {{{"g", packed_g.view()}}, {{"scale", 0.125f}}}, packed_options);
  const ladle::RecurrentGradients packed_want = ladle::run_variant_backward(packed_host_forward.saved, packed_d_o.view());
  const Tensor device_cu = to_device(cu), device_packed_q = to_device(packed_q), device_packed_k = to_device(packed_k),
               device_packed_v = to_device(packed_v), device_packed_g = to_device(packed_g), device_packed_d_o = to_device(packed_d_o);
  packed_options.cu_seqlens = device_cu.view();
  packed_options.gpu.stream = &stream;
  packed_options.gpu.upload_host_tensors = false;
  const ladle::RecurrentForward packed_forward =
      ladle::run_variant_for_backward(gla, device_packed_q.view(), device_packed_k.view(), device_packed_v.view(),
                                      {{{"g", device_packed_g.view()}}, {{"scale", 0.125f}}}, packed_options);
  const ladle::RecurrentGradients packed_got = ladle::run_variant_backward(packed_forward.saved, device_packed_d_o.view());
  check_device_gradient("q (packed)", packed_got.dq, packed_want.dq, stream);
  check_device_gradient("k (packed)", packed_got.dk, packed_want.dk, stream);
  check_device_gradient("v (packed)", packed_got.dv, packed_want.dv, stream);
  check_device_gradient("g (packed)", packed_got.inputs.at("g"), packed_want.inputs.at("g"), stream);
}

TEST_CASE("on a GPU, the attention backward on device tensors matches the one on host tensors and returns device gradients",
          "[ops][locations][backward][gpu]") {
  if (!ladle::driver_available()) {
    WARN("not exercised here (it needs a GPU): " << ladle::driver_unavailable_reason());
    return;
  }
  std::mt19937_64 rng(23);
  const std::int64_t B = 2, T = 130, H = 2, D = 64;
  const Tensor q = test::normal(rng, DType::bf16, {B, T, H, D}).tensor, k = test::normal(rng, DType::bf16, {B, T, H, D}).tensor,
               v = test::normal(rng, DType::bf16, {B, T, H, D}).tensor, bias = test::normal(rng, DType::f32, {T, T}).tensor,
               sinks = test::normal(rng, DType::f32, {H, 3}).tensor, d_o = test::normal(rng, DType::bf16, {B, T, H, D}).tensor;
  ladle::AttentionOptions host_options;
  host_options.backend = ladle::Backend::gpu;  // the GPU backward (sm_90a) or an error naming why not
  host_options.scale = 0.125f;
  host_options.causal = true;
  host_options.bias = bias.view();  // broadcast over B and H: its gradient sums over them
  host_options.softmax_aux = sinks.view();
  const ladle::AttentionForward host_forward = ladle::attention_for_backward(q.view(), k.view(), v.view(), host_options);
  const ladle::AttentionGradients want = ladle::run_attention_backward(host_forward.saved, d_o.view());

  const ladle::Stream stream;
  const auto to_device = [&](const Tensor& t) { return t.to(Location::device(0), &stream); };
  Tensor device_q = to_device(q), device_k = to_device(k), device_v = to_device(v), device_bias = to_device(bias),
         device_sinks = to_device(sinks), device_d_o = to_device(d_o);
  ladle::AttentionOptions device_options = host_options;
  device_options.bias = device_bias.view();
  device_options.softmax_aux = device_sinks.view();
  device_options.gpu.stream = &stream;
  device_options.gpu.upload_host_tensors = false;  // nothing may be uploaded: every tensor is on the device
  const ladle::AttentionForward forward =
      ladle::attention_for_backward(device_q.view(), device_k.view(), device_v.view(), device_options);
  CHECK(forward.result.o.location() == Location::device(0));
  REQUIRE(forward.saved.o);
  CHECK(forward.saved.o->location() == Location::device(0));
  CHECK(test::relative_error(forward.result.o.to(Location::host(), &stream), test::values_of(host_forward.result.o)) < 1e-4);
  const ladle::AttentionGradients got = ladle::run_attention_backward(forward.saved, device_d_o.view());
  check_device_gradient("q", got.dq, want.dq, stream);
  check_device_gradient("k", got.dk, want.dk, stream);
  check_device_gradient("v", got.dv, want.dv, stream);
  check_device_gradient(" bias", got.inputs.at("bias"), want.inputs.at("bias"), stream);
  REQUIRE(got.d_softmax_aux);
  check_device_gradient(" softmax_aux", *got.d_softmax_aux, *want.d_softmax_aux, stream);

  // Uploads off: a host d_output is refused by name.
  REQUIRE_THROWS_WITH(ladle::run_attention_backward(forward.saved, d_o.view()),
                      Contains("attention backward: d_output is bf16[2,130,2,64] on host, expected device memory: "
                               "upload_host_tensors is off"));
  // A device tensor changed since the forward: its hash, formed on the device, tells.
  copy(test::normal(rng, DType::bf16, {B, T, H, D}).tensor.view(), device_v.view(), &stream);
  REQUIRE_THROWS_WITH(ladle::run_attention_backward(forward.saved, device_d_o.view()), Contains("saved") && Contains("forward read"));
}
