// Lowering a softmax-attention expression to ir::AttentionVariant: q, k, v first, the score
// and keep expressions with their leaves, the flags, printing, hashing and validate().
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>

using namespace ladle;
using ir::InputKind;
using ir::Op;
using ir::Role;

TEST_CASE("a plain scaled softmax lowers to q, k, v, the scale and a two-node score", "[dsl][attention]") {
  const ir::AttentionVariant v = dsl::lower(dsl::softmax(dsl::score * dsl::scalar("scale")), "plain");
  const std::vector<ir::Input> expected = {{"q", InputKind::token_key, Role::query},
                                           {"k", InputKind::token_key, Role::key},
                                           {"v", InputKind::token_value, Role::value},
                                           {"scale", InputKind::scalar, Role::other}};
  CHECK(v.inputs == expected);
  REQUIRE(v.score.nodes.size() == 3);
  CHECK(v.score.nodes[0].op == Op::score);
  CHECK(v.score.nodes[1].op == Op::input);
  CHECK(v.score.nodes[1].input == 3);
  CHECK(v.score.nodes[2].op == Op::mul);
  CHECK(v.keep.empty());
  CHECK_FALSE(v.causal);
  CHECK(ir::validate(v).empty());
}

TEST_CASE("structured masks set flags; mask() twice joins the predicates with and", "[dsl][attention]") {
  const auto m = dsl::pair("attention_mask");
  const auto near = dsl::query_index - dsl::key_index < 100;
  const ir::AttentionVariant v =
      dsl::lower(dsl::softmax(dsl::score).causal().sliding_window().segment_ids().sinks().dropout().mask(m != 0).mask(near));
  CHECK(v.causal);
  CHECK(v.window);
  CHECK(v.segment_ids);
  CHECK(v.sinks);
  CHECK(v.dropout);
  REQUIRE_FALSE(v.keep.empty());
  CHECK(v.keep.nodes.back().op == Op::logical_and);
  CHECK(ir::to_string(v.inputs, v.keep) == "attention_mask != 0 && i - j < 100");
  REQUIRE(v.find_input("attention_mask") == 3);
  CHECK(v.inputs[3].kind == InputKind::pair);
  CHECK(ir::validate(v).empty());
}

TEST_CASE("comparisons print in C's precedence and > becomes < with swapped operands", "[dsl][attention]") {
  const auto slope = dsl::head_param("slope");
  const ir::AttentionVariant v = dsl::lower(
      dsl::softmax(dsl::soft_cap(dsl::score * 0.125f - slope * (dsl::query_index - dsl::key_index), 30))
          .mask(!(dsl::key_index > dsl::query_index) || dsl::head_index == 0));
  CHECK(ir::to_string(v.inputs, v.score) == "30 * tanh((score * 0.125 - slope * (i - j)) / 30)");
  CHECK(ir::to_string(v.inputs, v.keep) == "!(i < j) || h == 0");
  CHECK(ir::to_string(v).find("(causal)") == std::string::npos);
}

TEST_CASE("the hash separates flags, expressions and inputs and ignores the name", "[dsl][attention]") {
  const auto base = dsl::softmax(dsl::score * dsl::scalar("scale"));
  const std::uint64_t plain = ir::hash(dsl::lower(base, "a"));
  CHECK(plain == ir::hash(dsl::lower(base, "b")));
  CHECK(plain != ir::hash(dsl::lower(base.causal())));
  CHECK(ir::hash(dsl::lower(base.causal())) != ir::hash(dsl::lower(base.sliding_window())));
  CHECK(ir::hash(dsl::lower(base.sinks())) != ir::hash(dsl::lower(base.dropout())));
  CHECK(plain != ir::hash(dsl::lower(dsl::softmax(dsl::score * dsl::scalar("temperature")))));
  CHECK(plain != ir::hash(dsl::lower(base.mask(dsl::key_index < 5))));
  CHECK(ir::hash(dsl::lower(base.mask(dsl::key_index < 5))) != ir::hash(dsl::lower(base.mask(dsl::key_index < 6))));
  CHECK(ir::hash_hex(dsl::lower(base)).size() == 16);
}

TEST_CASE("validate names what is wrong with a hand-built attention variant", "[dsl][attention]") {
  ir::AttentionVariant v = dsl::lower(dsl::softmax(dsl::score));
  SECTION("an empty score") {
    v.score = {};
    const auto problems = ir::validate(v);
    REQUIRE(problems.size() == 1);
    CHECK_THAT(problems[0], Catch::Contains("score expression is required"));
  }
  SECTION("a score that reads q directly") {
    ir::Node read_q;
    read_q.op = Op::input;
    read_q.input = 0;
    v.score.nodes = {read_q};
    const auto problems = ir::validate(v);
    REQUIRE_FALSE(problems.empty());
    CHECK_THAT(problems[0], Catch::Contains("reads 'q' directly"));
  }
  SECTION("a per-token input") {
    v.inputs.push_back({"x", InputKind::token_key, Role::other});
    const auto problems = ir::validate(v);
    REQUIRE_FALSE(problems.empty());
    CHECK_THAT(problems[0], Catch::Contains("'x'"));
  }
  SECTION("q missing from the front") {
    std::swap(v.inputs[0], v.inputs[2]);
    CHECK_FALSE(ir::validate(v).empty());
  }
  SECTION("an operand that comes after its user") {
    ir::Node bad;
    bad.op = Op::neg;
    bad.a = 3;
    v.score.nodes.insert(v.score.nodes.begin(), bad);
    const auto problems = ir::validate(v);
    REQUIRE_FALSE(problems.empty());
    CHECK_THAT(problems[0], Catch::Contains("not earlier nodes"));
  }
}

TEST_CASE("a recurrence may not hold attention leaves or pair inputs", "[dsl][attention]") {
  ir::Variant v = dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v), dsl::q));
  ir::Node leaf;
  leaf.op = Op::key_index;
  v.slot(ir::Slot::log_decay_head).nodes = {leaf};
  auto problems = ir::validate(v);
  REQUIRE_FALSE(problems.empty());
  CHECK_THAT(problems[0], Catch::Contains("belongs to softmax attention"));
  v.slot(ir::Slot::log_decay_head) = {};
  v.inputs.push_back({"bias", InputKind::pair, Role::other});
  problems = ir::validate(v);
  REQUIRE_FALSE(problems.empty());
  CHECK_THAT(problems[0], Catch::Contains("pair input"));
}
