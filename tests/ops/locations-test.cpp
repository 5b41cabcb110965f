// Every op takes host or device tensors through the same entry points: the CPU path refuses a
// device tensor by name, the GPU path refuses host tensors when uploads are off, and on a GPU a
// pointer said to live on the wrong side is caught before any kernel reads it. On a GPU, an op on
// device tensors on a user's stream matches the CPU path and returns device tensors.
#include <catch2/catch.hpp>

#include <deque>
#include <random>

#include <ladle/ops/attention.h>
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
  // The backward keeps host tensors: a device one is refused by name, whatever the backend.
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
