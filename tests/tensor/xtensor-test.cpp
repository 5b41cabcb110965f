// tensor/xtensor.h: xtensor containers and ladle views, both ways, on the same memory.
#include <catch2/catch.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>

#include <ladle/runtime/error.h>
#include <ladle/runtime/tensor.h>
#include <ladle/tensor/xtensor.h>

using Catch::Contains;
using ladle::DType;

TEST_CASE("an xt::xarray becomes a view of the same memory, and the view adapts back onto it", "[tensor][xtensor]") {
  xt::random::seed(7);
  xt::xarray<float> values = xt::random::randn<float>({2, 3, 4});
  const ladle::TensorView view = ladle::view_of(values);
  CHECK(view.data == values.data());
  CHECK(view.type == DType::f32);
  CHECK(view.shape == std::vector<std::int64_t>{2, 3, 4});
  CHECK(view.strides == std::vector<std::int64_t>{12, 4, 1});
  CHECK(view.on_host());
  auto back = ladle::adapt<float>(view);
  CHECK(back.data() == values.data());
  CHECK(bool(back == values));
  back(1, 2, 3) = 42.0f;  // writes through to the xarray
  CHECK(values(1, 2, 3) == 42.0f);
}

TEST_CASE("strides survive both ways: a transposed xtensor view and a strided ladle view", "[tensor][xtensor]") {
  xt::xtensor<double, 2> values = xt::random::rand<double>({3, 5});
  auto transposed = xt::transpose(values);
  const ladle::TensorView view = ladle::view_of(transposed);
  CHECK(view.data == values.data());
  CHECK(view.shape == std::vector<std::int64_t>{5, 3});
  CHECK(view.strides == std::vector<std::int64_t>{1, 5});
  const auto adapted = ladle::adapt<double>(view);
  CHECK(adapted.data() == values.data());
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 3; ++j) CHECK(adapted(i, j) == values(j, i));
  // A ladle tensor's memory seen by xtensor and handed back: the same pointer all the way.
  const ladle::Tensor tensor(DType::bf16, {4, 6}, 0.5f);
  auto bf16 = ladle::adapt<ladle::bfloat16>(tensor.view());
  CHECK(ladle::view_of(bf16).data == tensor.data());
  CHECK(static_cast<float>(bf16(3, 5)) == 0.5f);
}

TEST_CASE("adapt refuses a device view, another dtype and negative strides, naming them", "[tensor][xtensor]") {
  ladle::Tensor tensor(DType::f32, {2, 3}, 1.0f);
  ladle::TensorView device = tensor.view();
  device.location = ladle::Location::device(0);
  REQUIRE_THROWS_AS(ladle::adapt<float>(device), ladle::InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::adapt<float>(device), Contains("adapt: view is f32[2,3] on cuda:0, expected host memory"));
  REQUIRE_THROWS_WITH(ladle::adapt<double>(tensor.view()), Contains("adapt: view is f32[2,3] on host, expected dtype f64"));
  ladle::TensorView reversed = tensor.view();
  reversed.strides = {-3, 1};
  REQUIRE_THROWS_WITH(ladle::adapt<float>(reversed), Contains("negative stride on axis 0"));
}
