#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/tune_space.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "tune_fixtures.h"

using namespace ladle;
using test::small_device;
using test::tile;
using test::tile_space;

TEST_CASE("a config prints, parses and serialises in its own order") {
  Config c = tile(64, 32, 4, 2);
  REQUIRE(c.to_string() == "BK=64 BV=32 warps=4 stages=2");
  REQUIRE(Config::parse(c.to_string()) == c);
  REQUIRE(Config::parse("BK=64, BV=32,warps=4 stages=2").to_string() == c.to_string());
  REQUIRE(c.to_json() == R"({"BK":64,"BV":32,"warps":4,"stages":2})");
  REQUIRE(Config::from_json(c.to_json()).to_string() == c.to_string());
  REQUIRE(c["warps"] == 4);
  REQUIRE_FALSE(c.find("chunk").has_value());
  REQUIRE(Config::parse("").empty());
}

TEST_CASE("configs are equal whatever their order, and ordered for maps") {
  Config a{{"BK", 64}, {"BV", 32}};
  Config b{{"BV", 32}, {"BK", 64}};
  REQUIRE(a == b);
  REQUIRE_FALSE(a < b);
  REQUIRE_FALSE(b < a);
  REQUIRE_FALSE(a == Config{{"BK", 64}});
  REQUIRE_FALSE(a == Config({{"BK", 64}, {"BV", 64}}));
  REQUIRE((Config{{"BK", 32}} < Config{{"BK", 64}}));
  a.set("BK", 128);
  REQUIRE(a.to_string() == "BK=128 BV=32");  // replaced in place, order kept
}

TEST_CASE("malformed configs are rejected with the offending text") {
  REQUIRE_THROWS_AS(Config({{"BK", 64}, {"BK", 32}}), InvalidArgument);
  REQUIRE_THROWS_WITH(Config::parse("BK=64 BV=big"),
                      Catch::Contains("'BV'") && Catch::Contains("'big'"));
  REQUIRE_THROWS_WITH(Config::parse("BK64"), Catch::Contains("no '='"));
  REQUIRE_THROWS_WITH(Config::parse("BK=1 BK=2"), Catch::Contains("twice"));
  REQUIRE_THROWS_WITH(Config::from_json(R"({"BK":"64"})"), Catch::Contains("'BK' is not an int"));
  REQUIRE_THROWS_WITH(Config::from_json("[1,2]"), Catch::Contains("not an object"));
  REQUIRE_THROWS_WITH(Config::from_json("{"), Catch::Contains("does not parse"));
  REQUIRE_THROWS_WITH(
      tile(64, 32, 4, 2)["chunk"],
      Catch::Contains("BK=64 BV=32 warps=4 stages=2") && Catch::Contains("'chunk'"));
}

TEST_CASE("a space enumerates every combination, the first parameter slowest") {
  SearchSpace space = tile_space(128, 128);
  REQUIRE(space.size() == 81);
  auto all = space.all();
  REQUIRE(all.size() == 81);
  REQUIRE(all[0] == tile(32, 32, 2, 1));
  REQUIRE(all[1] == tile(32, 32, 2, 2));
  REQUIRE(all[3] == tile(32, 32, 4, 1));
  REQUIRE(all[27] == tile(64, 32, 2, 1));
  REQUIRE(all.back() == tile(128, 128, 8, 3));
  REQUIRE(all[5].to_string() == "BK=32 BV=32 warps=4 stages=3");
  std::set<Config> distinct(all.begin(), all.end());
  REQUIRE(distinct.size() == 81);
}

TEST_CASE("validity: divisibility, threads per block and shared memory") {
  SearchSpace space = tile_space(128, 96);
  const DeviceLimits device = small_device();
  auto valid = space.enumerate(device);
  REQUIRE(valid.size() == 16);
  for (const auto& c : valid) {
    CHECK(c["BV"] == 32);
    CHECK(c["warps"] <= 4);
    CHECK(test::tile_shared_bytes(c) <= 48 * 1024);
  }
  REQUIRE(std::is_sorted(valid.begin(), valid.end(), [&](const Config& a, const Config& b) {
    auto all = space.all();
    return std::find(all.begin(), all.end(), a) < std::find(all.begin(), all.end(), b);
  }));

  REQUIRE(space.why_invalid(tile(64, 64, 2, 1), device) == "BV=64 does not divide V=96");
  REQUIRE(space.why_invalid(tile(64, 32, 8, 1), device) ==
          "256 threads > 128 per block on Test GPU");
  REQUIRE(space.why_invalid(tile(128, 32, 2, 3), device) ==
          "shared memory 60 KiB > 48 KiB per block on Test GPU");
  REQUIRE_FALSE(space.why_invalid(tile(128, 32, 4, 2), device).has_value());

  // A bigger device lifts the limits: more of the same space is valid.
  DeviceLimits big = device;
  big.max_threads_per_block = 1024;
  big.max_shared_per_block = 227 * 1024;
  REQUIRE(space.enumerate(big).size() == 27);

  auto explained = space.explain(device);
  REQUIRE(explained.size() == 81);
  REQUIRE(std::count_if(explained.begin(), explained.end(), [](auto& e) { return !e.second; }) ==
          16);
}

TEST_CASE("a config must name exactly the space's parameters") {
  SearchSpace space = tile_space(128, 96);
  REQUIRE(space.why_invalid(Config{{"BK", 64}, {"BV", 32}, {"warps", 4}}, small_device()) ==
          "parameter 'stages' is missing");
  Config extra = tile(64, 32, 4, 1);
  extra.set("chunk", 64);
  REQUIRE(space.why_invalid(extra, small_device()) == "'chunk' is not a parameter of this space");
  // Off-grid values are allowed (a heuristic may pick one) as long as the rules pass.
  REQUIRE_FALSE(space.why_invalid(tile(16, 32, 1, 1), small_device()).has_value());
}

TEST_CASE("the rule helpers name the limit and the numbers") {
  const DeviceLimits d = small_device();
  REQUIRE_FALSE(rule::shared_memory(48 * 1024, d));
  REQUIRE(rule::shared_memory(48 * 1024 + 1, d) ==
          "shared memory 49153 B > 48 KiB per block on Test GPU");
  REQUIRE_FALSE(rule::threads(128, d));
  REQUIRE(rule::threads(0, d).has_value());
  REQUIRE_FALSE(rule::registers(255, 128, d));
  REQUIRE(rule::registers(256, 32, d) == "256 registers per thread > 255");
  DeviceLimits few = d;
  few.max_registers_per_block = 32768;
  REQUIRE(rule::registers(128, 512, few) ==
          "128 registers x 512 threads = 65536 > 32768 per block on Test GPU");
  REQUIRE(rule::divides("chunk", 48, "T", 4096) == "chunk=48 does not divide T=4096");
  REQUIRE(rule::divides("BK", 0, "K", 128).has_value());
  REQUIRE(rule::first({std::nullopt, Reason("a"), Reason("b")}) == "a");
  REQUIRE_FALSE(rule::first({std::nullopt, std::nullopt}));
}

TEST_CASE("a space rejects parameters declared twice, without values or with repeated values") {
  SearchSpace space;
  space.param("BK", {32, 64});
  REQUIRE_THROWS_WITH(space.param("BK", {16}), Catch::Contains("'BK' is declared twice"));
  REQUIRE_THROWS_WITH(space.param("BV", {}), Catch::Contains("'BV' has no values"));
  REQUIRE_THROWS_WITH(space.param("warps", {4, 8, 4}), Catch::Contains("the value 4 twice"));
}

TEST_CASE("device limits come from the device's properties") {
  DeviceProperties p;
  p.name = "NVIDIA H100 80GB HBM3";
  p.cc_major = 9;
  p.cc_minor = 0;
  p.sm_count = 132;
  p.max_shared_per_block_optin = 232448;
  p.max_shared_per_sm = 233472;
  p.max_registers_per_block = 65536;
  p.max_threads_per_block = 1024;
  const DeviceLimits d = DeviceLimits::from(p);
  REQUIRE(d.name == p.name);
  REQUIRE(d.arch == "sm_90a");
  REQUIRE(d.sm_count == 132);
  REQUIRE(d.max_shared_per_block == 232448);
  REQUIRE(d.max_shared_per_sm == 233472);
  REQUIRE(d.max_registers_per_block == 65536);
  REQUIRE(d.max_threads_per_block == 1024);
}

TEST_CASE("without a cost model the plan is the heuristic, then every other valid config") {
  SearchSpace space = tile_space(128, 96);
  const Config heuristic = tile(64, 32, 4, 2);
  TunePlan plan =
      space.plan(small_device(), Config{{"stages", 2}, {"warps", 4}, {"BV", 32}, {"BK", 64}}, 3);
  REQUIRE(plan.space_size == 81);
  REQUIRE(plan.valid == 16);
  REQUIRE(plan.pruned == 0);
  REQUIRE(plan.configs.size() == 16);  // max_candidates applies only with a model
  REQUIRE(plan.configs[0] == heuristic);
  REQUIRE(plan.configs[0].to_string() == "BK=64 BV=32 warps=4 stages=2");  // the space's order
  REQUIRE(std::count(plan.configs.begin(), plan.configs.end(), heuristic) == 1);
  auto valid = space.enumerate(small_device());
  std::erase(valid, heuristic);
  REQUIRE(std::equal(valid.begin(), valid.end(), plan.configs.begin() + 1));
}

TEST_CASE("a cost model prunes to the N most promising and always keeps the heuristic") {
  SearchSpace space = tile_space(128, 128);
  DeviceLimits device = small_device();
  device.max_threads_per_block = 1024;
  device.max_shared_per_block = 227 * 1024;
  // Predicts bigger tiles as faster; the heuristic (small tiles) ranks last.
  space.cost_model([](const Config& c, const DeviceLimits&) {
    return -100.0 * c["BK"] * c["BV"] + 10.0 * c["stages"] + c["warps"];
  });
  const Config heuristic = tile(32, 32, 2, 1);

  TunePlan plan = space.plan(device, heuristic, 4);
  REQUIRE(plan.valid == 81);
  REQUIRE(plan.configs.size() == 5);  // the heuristic and the 4 best
  REQUIRE(plan.pruned == 81 - 1 - 4);
  REQUIRE(plan.configs[0] == heuristic);
  REQUIRE(plan.configs[1] == tile(128, 128, 2, 1));
  REQUIRE(plan.configs[2] == tile(128, 128, 4, 1));
  REQUIRE(plan.configs[3] == tile(128, 128, 8, 1));
  REQUIRE(plan.configs[4] == tile(128, 128, 2, 2));

  // A heuristic the model ranks among the N best takes one of the N places.
  TunePlan top = space.plan(device, tile(128, 128, 4, 1), 4);
  REQUIRE(top.configs.size() == 4);
  REQUIRE(top.configs[0] == tile(128, 128, 4, 1));
  REQUIRE(top.configs[1] == tile(128, 128, 2, 1));
  REQUIRE(top.configs[2] == tile(128, 128, 8, 1));
  REQUIRE(top.configs[3] == tile(128, 128, 2, 2));

  // A small space is not pruned, only ranked.
  TunePlan all = space.plan(device, heuristic, 1000);
  REQUIRE(all.configs.size() == 81);
  REQUIRE(all.pruned == 0);
  REQUIRE(all.configs[1] == tile(128, 128, 2, 1));
}

TEST_CASE("an invalid heuristic is the family's bug and is reported as such") {
  SearchSpace space = tile_space(128, 96);
  REQUIRE_THROWS_WITH(space.plan(small_device(), tile(64, 64, 4, 1), 8),
                      Catch::Contains("heuristic config 'BK=64 BV=64 warps=4 stages=1'") &&
                          Catch::Contains("BV=64 does not divide V=96"));
}
