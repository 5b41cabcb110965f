// cuda::target: what each architecture offers the generators, decided in one place.
#include <catch2/catch.hpp>

#include <ladle/codegen/cuda/target.h>
#include <ladle/runtime/error.h>

using ladle::cuda::target;

TEST_CASE("target: what sm_80, sm_90 and sm_90a offer") {
  const auto ampere = target("sm_80");
  CHECK(ampere.version == 80);
  CHECK(ampere.mma_sync);
  CHECK_FALSE(ampere.wgmma);
  CHECK_FALSE(ampere.tma);
  CHECK(ampere.max_shared_bytes == 163 * 1024);

  const auto hopper = target("sm_90a");
  CHECK(hopper.version == 90);
  CHECK(hopper.arch_specific);
  CHECK(hopper.mma_sync);
  CHECK(hopper.wgmma);
  CHECK(hopper.tma);
  CHECK(hopper.max_shared_bytes == 227 * 1024);

  // wgmma needs the arch-specific target: plain sm_90 code must run on later GPUs too.
  CHECK_FALSE(target("sm_90").wgmma);
  CHECK(target("sm_90").tma);
  CHECK(target("compute_90a").wgmma);
  CHECK_FALSE(target("sm_100a").wgmma);  // Blackwell's tensor cores are tcgen05, not wgmma
  CHECK(target("sm_86").max_shared_bytes == 99 * 1024);
  CHECK(ladle::cuda::has_wgmma(ladle::cuda::Target::hopper));
  CHECK_FALSE(ladle::cuda::has_wgmma("compute_80"));
}

TEST_CASE("target: an unknown arch offers nothing; a malformed one is refused by name") {
  const auto none = target("");
  CHECK(none.version == 0);
  CHECK_FALSE(none.mma_sync);
  CHECK(none.max_shared_bytes == 0);
  CHECK(target("sm_75").max_shared_bytes == 0);  // not in the table: not checked
  CHECK_FALSE(target("sm_75").mma_sync);
  for (const char* bad : {"sm90", "ampere", "sm_9", "sm_90b"}) {
    INFO(bad);
    CHECK_THROWS_AS(target(bad), ladle::InvalidArgument);
    CHECK_THROWS_WITH(target(bad), Catch::Contains("arch '" + std::string(bad) + "'"));
  }
}
