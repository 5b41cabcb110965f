// The update forms in the DSL (delta rule, gated delta rule, read before the update with a
// bonus): what each primitive lowers to, what validate() reports for hand-built variants that
// mix the forms, the hash, and the printout's formula.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

using namespace ladle;
using ir::InputKind;
using ir::Role;
using ir::Slot;

namespace {

constexpr auto beta = dsl::token_head("beta");
constexpr auto g = dsl::token_head("g");
constexpr auto w = dsl::token_key("w");
constexpr auto u = dsl::head_key("u");
constexpr auto scale = dsl::scalar("scale");

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  for (const std::string& p : problems)
    if (p.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("delta(beta) sets the update and fills write_strength; decay_head makes it gated", "[dsl][update_forms]") {
  const ir::Variant plain = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).delta(beta), dsl::q, scale), "delta_rule");
  CHECK(plain.update == ir::Update::delta);
  CHECK_FALSE(plain.read_before_update);
  CHECK_FALSE(plain.l2_normalize_qk);
  REQUIRE(plain.has(Slot::write_strength));
  CHECK(plain.inputs[static_cast<std::size_t>(plain.slot(Slot::write_strength).nodes[0].input)] == ir::Input{"beta", InputKind::token_head, Role::other});
  CHECK_FALSE(plain.has(Slot::log_decay_head));
  CHECK(ir::validate(plain).empty());
  CHECK(ir::form_name(plain) == "the delta rule");

  // The decay and beta given in either order lower to the same variant.
  const auto a = dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g).delta(beta), dsl::q, scale).l2_normalized();
  const auto b = dsl::read(dsl::scan(dsl::k, dsl::v).delta(beta).decay_head(g), dsl::q, scale).l2_normalized();
  const ir::Variant gated = dsl::lower(a);
  CHECK(ir::hash(gated) == ir::hash(dsl::lower(b)));
  CHECK(ir::to_string(gated) == ir::to_string(dsl::lower(b)));
  CHECK(gated.has(Slot::log_decay_head));
  CHECK(gated.l2_normalize_qk);
  CHECK(ir::form_name(gated) == "the gated delta rule");
  CHECK(ir::validate(gated).empty());
  CHECK_FALSE(gated.plain_form());
}

TEST_CASE("read_before(...).bonus(u) reads before the update; u is a per-head input over K", "[dsl][update_forms]") {
  const ir::Variant rwkv = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(w), dsl::q, scale).bonus(u));
  CHECK(rwkv.update == ir::Update::additive);
  CHECK(rwkv.read_before_update);
  REQUIRE(rwkv.has(Slot::bonus));
  CHECK(rwkv.has(Slot::log_decay_k));
  CHECK(rwkv.inputs.back() == ir::Input{"u", InputKind::head_key, Role::other});
  CHECK(ir::extent(rwkv, rwkv.slot(Slot::bonus)) == ir::Extent{false, true, ir::Feature::key});
  CHECK(ir::shape_of(InputKind::head_key, Role::other) == "[H,K] or [B,H,K]");
  CHECK(ir::validate(rwkv).empty());
  // Without a bonus the read sees only the past.
  const ir::Variant past = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v), dsl::q));
  CHECK(past.read_before_update);
  CHECK_FALSE(past.has(Slot::bonus));
  CHECK(ir::form_name(past) == "a read before the update");
  // The bonus may be any expression over K or none: u * 2, a constant.
  CHECK(ir::validate(dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v), dsl::q).bonus(dsl::exp(u) * 2))).empty());
}

TEST_CASE("validate reports hand-built variants that mix the forms", "[dsl][update_forms]") {
  // The DSL refuses these at compile time (tests/dsl/compile_fail); built by hand, validate() names them.
  ir::Variant gla = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(w), dsl::q));
  ir::Variant v = gla;
  v.update = ir::Update::delta;
  CHECK(ir::validate(v).empty());  // a key-side decay with the delta rule: KDA
  CHECK(ir::form_name(v) == "the delta rule with a key-side decay (KDA)");
  v.slot(Slot::log_decay_v) = gla.slot(Slot::log_decay_k);
  CHECK(mentions(ir::validate(v), "not by a value-side decay"));
  v = gla;
  v.l2_normalize_qk = true;
  CHECK(mentions(ir::validate(v), "l2_normalize_qk belongs to the delta rule"));
  v = gla;
  v.slot(Slot::write_strength) = gla.slot(Slot::log_decay_k);
  CHECK(mentions(ir::validate(v), "write_strength (beta) belongs to the delta rule"));
  CHECK(mentions(ir::validate(v), "must not vary over features"));
  v = gla;
  v.slot(Slot::bonus) = gla.slot(Slot::log_decay_k);
  CHECK(mentions(ir::validate(v), "slot bonus belongs to a read before the update"));
  v = gla;
  v.read_before_update = true;
  v.normalize = true;
  CHECK(mentions(ir::validate(v), "a read before the update has no normaliser"));
  ir::Variant delta = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).delta(beta), dsl::q));
  delta.read_before_update = true;
  CHECK(mentions(ir::validate(delta), "the delta rule is read after its update"));
  // A head_key input cannot be q, k or v.
  ir::Variant bad_role = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v), dsl::q).bonus(u));
  bad_role.inputs.back().role = Role::key;
  CHECK(mentions(ir::validate(bad_role), "per-head parameter over K"));
}

TEST_CASE("the forms hash apart; the diagonal form's hash is unchanged by them", "[dsl][update_forms][hash]") {
  const ir::Variant gla = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g), dsl::q, scale));
  const ir::Variant delta = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g).delta(beta), dsl::q, scale));
  const ir::Variant delta_l2 = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g).delta(beta), dsl::q, scale).l2_normalized());
  const ir::Variant delta_one = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g).delta(1), dsl::q, scale));
  const ir::Variant before = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_head(g), dsl::q, scale));
  const ir::Variant bonus = dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_head(g), dsl::q, scale).bonus(u));
  const std::uint64_t hashes[] = {ir::hash(gla), ir::hash(delta), ir::hash(delta_l2), ir::hash(delta_one), ir::hash(before), ir::hash(bonus)};
  for (std::size_t i = 0; i < std::size(hashes); ++i)
    for (std::size_t j = i + 1; j < std::size(hashes); ++j) CHECK(hashes[i] != hashes[j]);
  // Flipping the flag alone (same slots) changes the hash too.
  ir::Variant flipped = before;
  flipped.read_before_update = false;
  CHECK(ir::hash(flipped) != ir::hash(before));
  CHECK(ir::hash(flipped) == ir::hash(dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g), dsl::q, scale))));
}

TEST_CASE("the printout shows each form's formula and its slots", "[dsl][update_forms][print]") {
  const std::string delta = ir::to_string(
      dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_head(g).delta(dsl::sigmoid(beta)), dsl::q, scale).l2_normalized(), "gdn"));
  CHECK_THAT(delta, Catch::Contains("the gated delta rule"));
  CHECK_THAT(delta, Catch::Contains("S_t = exp(log_decay_head) (I - write_strength k_hat k_hat^T) S_{t-1} + write_strength k_hat v^T"));
  CHECK_THAT(delta, Catch::Contains("o_t = (scale q_hat)^T S_t"));
  CHECK_THAT(delta, Catch::Contains("k_feature / sqrt(sum over K of x^2 + 1e-06)"));
  CHECK_THAT(delta, Catch::Contains("write_strength = sigmoid(beta)"));
  CHECK_THAT(delta, !Catch::Contains("bonus"));
  const std::string rwkv = ir::to_string(dsl::lower(dsl::read_before(dsl::scan(dsl::k, dsl::v).decay_k(w), dsl::q, scale).bonus(u)));
  CHECK_THAT(rwkv, Catch::Contains("o_t = (scale q_feature)^T (S_{t-1} + diag(bonus) k_feature v^T)  (read before the update)"));
  CHECK_THAT(rwkv, Catch::Contains("S_t = diag(exp(log_decay_k)) S_{t-1} + k_feature v^T"));
  CHECK_THAT(rwkv, Catch::Contains("bonus          = u"));
  CHECK_THAT(rwkv, Catch::Contains("u          other  [H,K] or [B,H,K]"));
  CHECK_THAT(rwkv, !Catch::Contains("write_strength"));
}
