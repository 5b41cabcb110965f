// The variant hash: the same expression gives the same 64-bit value on every run and
// machine (it keys tuned configurations on disk), and different expressions differ.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

#include <map>

using namespace ladle;

namespace {

ir::Variant gla() {
  return dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::token_key("g")), dsl::q, dsl::scalar("scale")), "gla");
}

}  // namespace

TEST_CASE("the hash is pinned: it depends only on the variant's content", "[dsl][hash]") {
  // These values are part of the on-disk contract (tuned-config keys). If the encoding must
  // change, bump the version string in ir.cpp and update them together.
  CHECK(ir::hash_hex(gla()) == "7a5235b17bb84c55");
  const auto all_gates = dsl::scan(dsl::k, dsl::v)
                             .decay_k(dsl::token_key("g"))
                             .decay_k(dsl::token_key("gk"))
                             .decay_v(dsl::token_value("gv"))
                             .decay_head(dsl::head_param("g_gamma"));
  CHECK(ir::hash_hex(dsl::lower(dsl::read(all_gates, dsl::q, dsl::scalar("scale")))) == "fdb4b05e5363c1e4");
}

TEST_CASE("the same expression lowered twice is equal and hashes equal; the name does not count", "[dsl][hash]") {
  ir::Variant a = gla(), b = gla();
  CHECK(a.slots == b.slots);
  CHECK(ir::hash(a) == ir::hash(b));
  b.name = "something else";
  CHECK(ir::hash(a) == ir::hash(b));
}

TEST_CASE("different expressions hash apart", "[dsl][hash]") {
  const auto x = dsl::token_key("x");
  const auto xt = dsl::token_head("x");
  const auto scan = dsl::scan(dsl::k, dsl::v);
  const auto scale = dsl::scalar("scale");
  std::map<std::string, ir::Variant> variants = {
      {"plain", dsl::lower(dsl::read(scan, dsl::q))},
      {"scaled", dsl::lower(dsl::read(scan, dsl::q, scale))},
      {"gla", gla()},
      {"x/16", dsl::lower(dsl::read(scan.decay_k(dsl::logsigmoid(x) / 16), dsl::q))},
      {"x/15", dsl::lower(dsl::read(scan.decay_k(dsl::logsigmoid(x) / 15), dsl::q))},
      {"16/x", dsl::lower(dsl::read(scan.decay_k(16 / dsl::logsigmoid(x)), dsl::q))},
      {"softplus", dsl::lower(dsl::read(scan.decay_k(-dsl::softplus(x) / 16), dsl::q))},
      {"token gate on k", dsl::lower(dsl::read(scan.decay_k(xt), dsl::q))},
      {"token gate per head", dsl::lower(dsl::read(scan.decay_head(xt), dsl::q))},
      {"token gate on v", dsl::lower(dsl::read(scan.decay_v(xt), dsl::q))},
      {"normalized", dsl::lower(dsl::read(scan, dsl::q).normalized())},
      {"normalized eps", dsl::lower(dsl::read(scan, dsl::q).normalized(1e-5f))},
      {"feature map q", dsl::lower(dsl::read(scan, dsl::elu(dsl::q) + 1))},
      {"feature map k", dsl::lower(dsl::read(dsl::scan(dsl::elu(dsl::k) + 1, dsl::v), dsl::q))},
      {"renamed gate", dsl::lower(dsl::read(scan.decay_k(dsl::token_key("y")), dsl::q))},
      {"gate x", dsl::lower(dsl::read(scan.decay_k(x), dsl::q))},
      {"+0", dsl::lower(dsl::read(scan.decay_k(x + 0.0), dsl::q))},
      {"-0", dsl::lower(dsl::read(scan.decay_k(x + -0.0), dsl::q))},
      {"x+g", dsl::lower(dsl::read(scan.decay_k(x + dsl::token_key("g")), dsl::q))},
      {"g+x", dsl::lower(dsl::read(scan.decay_k(dsl::token_key("g") + x), dsl::q))},
      {"per-head param", dsl::lower(dsl::read(scan.decay_head(dsl::head_param("x")), dsl::q))},
      {"scalar", dsl::lower(dsl::read(scan.decay_head(dsl::scalar("x")), dsl::q))},
  };
  std::map<std::uint64_t, std::string> seen;
  for (const auto& [name, variant] : variants) {
    INFO(name << ":\n" << ir::to_string(variant));
    REQUIRE(ir::validate(variant).empty());
    const auto [it, inserted] = seen.emplace(ir::hash(variant), name);
    INFO("same hash as " << it->second);
    CHECK(inserted);
  }
}
