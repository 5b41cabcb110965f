// Every bad input to attention() raises InvalidArgument whose message names the argument:
// shapes of q, k, v (head dims, GQA, token counts, batch), bias and masks that do not
// broadcast, windows, sinks, packed-sequence offsets, dropout_p, the soft cap, segment ids,
// the caller's outputs; and for run_attention, inputs and run-time parts that do not match
// the user's variant.
#include <catch2/catch.hpp>

#include <ladle/dsl/softmax.h>
#include <ladle/ops/attention.h>
#include <ladle/runtime/error.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

using Catch::Contains;
using ladle::DType;
using ladle::Tensor;
using ladle::TensorView;

namespace {

// Owns the tensors a test makes; views stay valid for the test's lifetime.
class Tensors {
 public:
  TensorView make(std::vector<std::int64_t> shape, DType type = DType::f32) {
    Tensor& t = store_.emplace_back(type, std::move(shape), 0.5f);
    if (type == DType::u8) std::memset(t.data(), 1, static_cast<std::size_t>(t.numel()));
    return t.view();
  }
  TensorView integers(std::vector<std::int64_t> values, std::vector<std::int64_t> shape = {},
                      DType type = DType::i64) {
    if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
    Tensor& t = store_.emplace_back(type, std::move(shape), 0.0f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (type == DType::i32) {
        const auto v = static_cast<std::int32_t>(values[i]);
        std::memcpy(static_cast<char*>(t.data()) + 4 * i, &v, 4);
      } else {
        std::memcpy(static_cast<char*>(t.data()) + 8 * i, &values[i], 8);
      }
    }
    return t.view();
  }

 private:
  std::deque<Tensor> store_;
};

// The message names `word` as a whole word: "k" in "k has shape", not in "mask" or "keys".
class Names : public Catch::MatcherBase<std::string> {
 public:
  explicit Names(std::string word) : word_(std::move(word)) {}
  bool match(const std::string& message) const override {
    const auto identifier = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (std::size_t at = message.find(word_); at != std::string::npos; at = message.find(word_, at + 1)) {
      const bool starts = at == 0 || !identifier(message[at - 1]);
      const std::size_t end = at + word_.size();
      if (starts && (end == message.size() || !identifier(message[end]))) return true;
    }
    return false;
  }
  std::string describe() const override { return "names " + word_; }

 private:
  std::string word_;
};

// B=2, Tq=Tk=6, H=4, H_kv=2, D=8, Dv=5 on the CPU: a valid call each test breaks one way.
struct Problem {
  Tensors t;
  TensorView q = t.make({2, 6, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  ladle::AttentionOptions options() const {
    ladle::AttentionOptions o;
    o.backend = ladle::Backend::cpu;
    return o;
  }
  ladle::AttentionResult run(const ladle::AttentionOptions& o) { return ladle::attention(q, k, v, o); }
};

}  // namespace

#define CHECK_INVALID(call, matcher)                         \
  do {                                                       \
    CHECK_THROWS_AS(call, ladle::InvalidArgument);           \
    CHECK_THROWS_WITH(call, matcher);                        \
  } while (false)

TEST_CASE("attention: the valid base problem runs", "[ops][attention][errors]") {
  Problem p;
  REQUIRE_NOTHROW(p.run(p.options()));
}

TEST_CASE("attention: q, k and v must agree on batch, head dim, tokens and heads", "[ops][attention][errors]") {
  Problem p;
  const auto o = p.options();
  Tensors& t = p.t;
  // q and k head dims differ
  CHECK_INVALID(ladle::attention(p.q, t.make({2, 6, 2, 7}), p.v, o), Names("k"));
  // H not divisible by H_kv
  CHECK_INVALID(ladle::attention(t.make({2, 6, 6, 8}), t.make({2, 6, 4, 8}), t.make({2, 6, 4, 5}), o),
                Names("q") || Names("k"));
  // k and v disagree on heads or tokens
  CHECK_INVALID(ladle::attention(p.q, p.k, t.make({2, 6, 1, 5}), o), Names("v"));
  CHECK_INVALID(ladle::attention(p.q, p.k, t.make({2, 5, 2, 5}), o), Names("v"));
  // batch differs
  CHECK_INVALID(ladle::attention(p.q, t.make({1, 6, 2, 8}), t.make({1, 6, 2, 5}), o), Names("k"));
  // ranks: [T,H,D] needs cu_seqlens; 5 dimensions never
  CHECK_INVALID(ladle::attention(t.make({6, 4, 8}), t.make({6, 2, 8}), t.make({6, 2, 5}), o), Names("q"));
  CHECK_INVALID(ladle::attention(t.make({2, 6, 4, 8, 1}), p.k, p.v, o), Names("q"));
  // integer inputs
  CHECK_INVALID(ladle::attention(t.make({2, 6, 4, 8}, DType::i32), p.k, p.v, o), Names("q"));
  // Tq != Tk is fine
  REQUIRE_NOTHROW(ladle::attention(t.make({2, 3, 4, 8}), p.k, p.v, o));
}

TEST_CASE("attention: bias and attention_mask must broadcast to [B,H,Tq,Tk]", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  for (auto shape : {std::vector<std::int64_t>{2, 4, 6, 5}, {2, 4, 5, 6}, {3, 4, 6, 6}, {2, 2, 6, 6},
                     {1, 2, 4, 6, 6}, {7}}) {
    INFO("shape of " << shape.size() << " dims, last " << shape.back());
    o = p.options();
    o.bias = p.t.make(shape);
    CHECK_INVALID(p.run(o), Contains("bias"));
    o = p.options();
    o.attention_mask = p.t.make(shape, DType::u8);
    CHECK_INVALID(p.run(o), Contains("attention_mask"));
  }
  o = p.options();
  // (Broadcasts over Tq and Tk are attention-test's "masks and biases broadcast" case.)
  o.bias = p.t.make({1, 4, 6, 6});
  o.attention_mask = p.t.make({2, 1, 6, 6}, DType::u8);
  REQUIRE_NOTHROW(p.run(o));
}

TEST_CASE("attention: window sizes below -1 are rejected", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  for (auto window : {std::pair<std::int64_t, std::int64_t>{-2, 0}, {0, -3}, {-5, -5}}) {
    o.sliding_window = window;
    CHECK_INVALID(p.run(o), Contains("sliding_window"));
  }
  for (auto window : {std::pair<std::int64_t, std::int64_t>{-1, -1}, {0, 0}, {-1, 0}, {100, -1}}) {
    o.sliding_window = window;
    REQUIRE_NOTHROW(p.run(o));
  }
}

TEST_CASE("attention: softmax_aux must be [H,S] or [S]", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  for (auto shape : {std::vector<std::int64_t>{3, 2}, {2, 4, 2}, {2, 2}, {4, 2, 1}}) {
    o.softmax_aux = p.t.make(shape);
    CHECK_INVALID(p.run(o), Contains("softmax_aux"));
  }
  o.softmax_aux = p.t.make({4, 2}, DType::i32);
  CHECK_INVALID(p.run(o), Contains("softmax_aux"));
  for (auto shape : {std::vector<std::int64_t>{4, 2}, {3}, {4, 1}}) {
    o.softmax_aux = p.t.make(shape);
    REQUIRE_NOTHROW(p.run(o));
  }
}

TEST_CASE("attention: cu_seqlens must be offsets from 0 to the token count, the same N for q and k", "[ops][attention][errors]") {
  Tensors t;
  const auto q = t.make({1, 6, 4, 8}), k = t.make({1, 9, 2, 8}), v = t.make({1, 9, 2, 5});
  ladle::AttentionOptions o;
  o.backend = ladle::Backend::cpu;
  const auto with = [&](std::vector<std::int64_t> cu_q, std::vector<std::int64_t> cu_k) {
    ladle::AttentionOptions w = o;
    w.cu_seqlens_q = t.integers(std::move(cu_q));
    w.cu_seqlens_k = t.integers(std::move(cu_k));
    return w;
  };
  REQUIRE_NOTHROW(ladle::attention(q, k, v, with({0, 2, 2, 6}, {0, 4, 4, 9})));
  REQUIRE_NOTHROW(ladle::attention(t.make({6, 4, 8}), t.make({9, 2, 8}), t.make({9, 2, 5}), with({0, 6}, {0, 9})));
  CHECK_INVALID(ladle::attention(q, k, v, with({1, 2, 6}, {0, 4, 9})), Contains("cu_seqlens_q"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 2, 6}, {2, 4, 9})), Contains("cu_seqlens_k"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 4, 3, 6}, {0, 4, 5, 9})), Contains("cu_seqlens_q"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 3, 6}, {0, 5, 4})), Contains("cu_seqlens_k"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 3, 5}, {0, 4, 9})), Contains("cu_seqlens_q"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 3, 7}, {0, 4, 9})), Contains("cu_seqlens_q"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 3, 6}, {0, 4, 8})), Contains("cu_seqlens_k"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0, 3, 6}, {0, 2, 4, 9})), Contains("cu_seqlens"));
  CHECK_INVALID(ladle::attention(q, k, v, with({0}, {0})), Contains("cu_seqlens"));
  // only one side given
  ladle::AttentionOptions one = o;
  one.cu_seqlens_q = t.integers({0, 6});
  CHECK_INVALID(ladle::attention(q, k, v, one), Contains("cu_seqlens_k"));
  one = o;
  one.cu_seqlens_k = t.integers({0, 9});
  CHECK_INVALID(ladle::attention(q, k, v, one), Contains("cu_seqlens_q"));
  // batch != 1
  CHECK_INVALID(ladle::attention(t.make({2, 3, 4, 8}), t.make({2, 4, 2, 8}), t.make({2, 4, 2, 5}), with({0, 3}, {0, 4})),
                Contains("cu_seqlens"));
  // not offsets: wrong rank or a floating type
  ladle::AttentionOptions bad = o;
  bad.cu_seqlens_q = t.integers({0, 6}, {1, 2});
  bad.cu_seqlens_k = t.integers({0, 9});
  CHECK_INVALID(ladle::attention(q, k, v, bad), Contains("cu_seqlens_q"));
  bad.cu_seqlens_q = t.make({2});
  CHECK_INVALID(ladle::attention(q, k, v, bad), Contains("cu_seqlens_q"));
}

TEST_CASE("attention: dropout_p must lie in [0, 1)", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  for (float bad : {-0.1f, 1.0f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    o.dropout_p = bad;
    CHECK_INVALID(p.run(o), Contains("dropout_p"));
  }
  o.dropout_p = 0.999f;
  REQUIRE_NOTHROW(p.run(o));
}

TEST_CASE("attention: logits_soft_cap must be positive", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    o.logits_soft_cap = bad;
    CHECK_INVALID(p.run(o), Contains("logits_soft_cap"));
  }
}

TEST_CASE("attention: segment ids come in pairs of [B,Tq] and [B,Tk] integers", "[ops][attention][errors]") {
  Tensors t;
  const auto q = t.make({2, 4, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  ladle::AttentionOptions o;
  o.backend = ladle::Backend::cpu;
  const auto ids = [&](std::int64_t B, std::int64_t T, DType type = DType::i32) {
    return t.integers(std::vector<std::int64_t>(std::size_t(B * T), 0), {B, T}, type);
  };
  o.q_segment_ids = ids(2, 4), o.kv_segment_ids = ids(2, 6);
  REQUIRE_NOTHROW(ladle::attention(q, k, v, o));
  o.q_segment_ids = ids(2, 6);
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("q_segment_ids"));
  o.q_segment_ids = ids(1, 4);
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("q_segment_ids"));
  o.q_segment_ids = ids(2, 4), o.kv_segment_ids = ids(2, 4);
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("kv_segment_ids"));
  o.kv_segment_ids = t.integers(std::vector<std::int64_t>(12, 0), {2, 6, 1});
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("kv_segment_ids"));
  o.kv_segment_ids = t.make({2, 6});
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("kv_segment_ids"));
  // one without the other
  o.kv_segment_ids.reset();
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("kv_segment_ids"));
  o.kv_segment_ids = ids(2, 6), o.q_segment_ids.reset();
  CHECK_INVALID(ladle::attention(q, k, v, o), Contains("q_segment_ids"));
}

TEST_CASE("attention_into: the caller's o and lse must have the result's shape", "[ops][attention][errors]") {
  Problem p;
  auto o = p.options();
  Tensors& t = p.t;
  REQUIRE_NOTHROW(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 5}), std::nullopt}));
  CHECK_INVALID(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 8}), std::nullopt}), Names("o"));
  CHECK_INVALID(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 5}, DType::f16), std::nullopt}),
                Names("o"));
  o.return_lse = true;
  CHECK_INVALID(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 5}), std::nullopt}), Names("lse"));
  CHECK_INVALID(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 5}), t.make({2, 6, 4})}), Names("lse"));
  REQUIRE_NOTHROW(ladle::attention_into(p.q, p.k, p.v, o, {t.make({2, 6, 4, 5}), t.make({2, 4, 6})}));
}

TEST_CASE("run_attention: inputs and run-time parts must match what the variant reads", "[ops][attention][errors]") {
  namespace dsl = ladle::dsl;
  Problem p;
  const auto alibi = dsl::lower(
      dsl::softmax(dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index)),
      "alibi");
  const auto slope = p.t.make({4});
  ladle::AttentionRunOptions o;
  o.backend = ladle::Backend::cpu;
  REQUIRE_NOTHROW(ladle::run_attention(alibi, p.q, p.k, p.v, {{{"slope", slope}}, {{"scale", 0.5f}}}, o));
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, {{}, {{"scale", 0.5f}}}, o), Contains("slope"));
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, {{{"slope", slope}}, {}}, o), Contains("scale"));
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, {{{"slope", p.t.make({3})}}, {{"scale", 0.5f}}}, o),
                Contains("slope"));
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v,
                                     {{{"slope", slope}, {"bias", p.t.make({2, 4, 6, 6})}}, {{"scale", 0.5f}}}, o),
                Contains("bias"));
  // run-time parts the variant has no place for
  const ladle::VariantInputs inputs{{{"slope", slope}}, {{"scale", 0.5f}}};
  ladle::AttentionRunOptions bad = o;
  bad.window_left = 4;
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, inputs, bad), Contains("window"));
  bad = o;
  bad.softmax_aux = p.t.make({4, 2});
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, inputs, bad), Contains("softmax_aux"));
  bad = o;
  bad.dropout_p = 0.5f;
  CHECK_INVALID(ladle::run_attention(alibi, p.q, p.k, p.v, inputs, bad), Contains("dropout_p"));
  // and parts it has that were not given
  const auto with_sinks = dsl::lower(dsl::softmax(dsl::score).sinks().segment_ids(), "sinks");
  CHECK_INVALID(ladle::run_attention(with_sinks, p.q, p.k, p.v, {}, o), Contains("segment_ids") || Contains("softmax_aux"));
}
