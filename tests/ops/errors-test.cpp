// Every bad input to the recurrent ops raises InvalidArgument with a message that names the
// argument and what was expected.
#include <catch2/catch.hpp>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/error.h>

#include <cstring>
#include <deque>

using Catch::Contains;
using ladle::DType;
using ladle::Tensor;
using ladle::TensorView;

namespace {

// Owns the tensors a test makes; views stay valid for the test's lifetime.
class Tensors {
 public:
  TensorView make(std::vector<std::int64_t> shape, DType type = DType::f32) {
    return store_.emplace_back(type, std::move(shape), 0.5f).view();
  }
  TensorView offsets(std::vector<std::int64_t> values, DType type = DType::i64) {
    Tensor& t = store_.emplace_back(type, std::vector<std::int64_t>{static_cast<std::int64_t>(values.size())}, 0.0f);
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

}  // namespace

TEST_CASE("the gate shape error reads as the design's example", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({2, 64, 8, 128}), k = t.make({2, 64, 8, 128}), v = t.make({2, 64, 8, 32});
  REQUIRE_THROWS_AS(ladle::gla(q, k, v, t.make({2, 64, 8, 64})), ladle::InvalidArgument);
  REQUIRE_THROWS_WITH(ladle::gla(q, k, v, t.make({2, 64, 8, 64})),
                      "gla: g has shape [2,64,8,64], expected [B,T,H,K] = [2,64,8,128]");
}

TEST_CASE("rank and shape mismatches between q, k and v are named", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({2, 6, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  REQUIRE_NOTHROW(ladle::recurrent(q, k, v));
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({6, 4, 8, 1, 1}), k, v),
                      Contains("recurrent: q has shape [6,4,8,1,1], expected [B,T,H,K]"));
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({6, 4, 8}), t.make({6, 2, 8}), t.make({6, 2, 5})),
                      Contains("q has shape [6,4,8], expected [B,T,H,K] (the 3-dimensional [T,H,K] needs cu_seqlens)"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, t.make({2, 6, 8}), v),
                      Contains("recurrent: k has shape [2,6,8], expected [B,T,H_k,K] = [2,6,H_k,8]"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, t.make({2, 6, 2, 7}), v),
                      Contains("k has shape [2,6,2,7], expected [B,T,H_k,K] = [2,6,H_k,8]"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, t.make({1, 6, 2, 8}), v), Contains("k has shape [1,6,2,8]"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, t.make({2, 5, 2, 5})),
                      Contains("v has shape [2,5,2,5], expected [B,T,H_v,V] = [2,6,H_v,V]"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, t.make({2, 6, 4, 5})),
                      Contains("recurrent: q has 4 heads, k 2 and v 4: k and v share their heads (GQA)"));
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, t.make({2, 6, 8, 5})),
                      Contains("grouped value heads (v with more heads than q) need k with q's heads (4)"));
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({2, 6, 0, 8}), k, v), Contains("q has shape [2,6,0,8]"));
}

TEST_CASE("GQA needs the key/value heads to divide the query heads", "[ops][errors]") {
  Tensors t;
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 6, 8}), t.make({1, 4, 4, 8}), t.make({1, 4, 4, 8})),
                      "recurrent: q has 6 heads, which the 4 heads of k and v do not divide (GQA needs H % H_kv == 0)");
}

TEST_CASE("gates must match q's heads and their own feature axis", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({2, 6, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  ladle::RecurrentOptions o;
  o.g = t.make({2, 6, 2, 8});  // H_kv heads instead of H
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: g has shape [2,6,2,8], expected [B,T,H,K] = [2,6,4,8]");
  o = {};
  o.gk = t.make({2, 6, 4, 5});  // over V instead of K
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("gk has shape [2,6,4,5], expected [B,T,H,K] = [2,6,4,8]"));
  o = {};
  o.gv = t.make({2, 6, 4, 8});  // over K instead of V
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("gv has shape [2,6,4,8], expected [B,T,H,V] = [2,6,4,5]"));
  o = {};
  o.gv = t.make({2, 6, 4});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("gv has shape [2,6,4], expected [B,T,H,V]"));
}

TEST_CASE("g_gamma must be [H] or [B,H]", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({2, 6, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  ladle::RecurrentOptions o;
  for (std::vector<std::int64_t> ok : {std::vector<std::int64_t>{4}, {2, 4}}) {
    o.g_gamma = t.make(ok);
    REQUIRE_NOTHROW(ladle::recurrent(q, k, v, o));
  }
  for (std::vector<std::int64_t> bad : {std::vector<std::int64_t>{3}, {4, 2}, {1, 4, 1}, {}}) {
    o.g_gamma = t.make(bad);
    REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o),
                        Contains("recurrent: g_gamma has shape [") && Contains("], expected [H] = [4] or [B,H] = [2,4]"));
  }
  ladle::GlaOptions gla;
  gla.g_gamma = t.make({8});
  REQUIRE_THROWS_WITH(ladle::gla(q, k, v, t.make({2, 6, 4, 8}), gla), "gla: g_gamma has shape [8], expected [H] = [4] or [B,H] = [2,4]");
}

TEST_CASE("initial_state must be [N,H,K,V] of a floating type", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({2, 6, 4, 8}), k = t.make({2, 6, 2, 8}), v = t.make({2, 6, 2, 5});
  ladle::RecurrentOptions o;
  o.initial_state = t.make({2, 4, 5, 8});  // K and V swapped
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o),
                      "recurrent: initial_state has shape [2,4,5,8], expected [N,H,K,V] = [2,4,8,5]");
  o.initial_state = t.make({2, 2, 8, 5});  // H_kv heads
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("initial_state has shape [2,2,8,5]"));
  o.initial_state = t.make({2, 4, 8, 5}, DType::i32);
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: initial_state has dtype i32, expected f32, f16 or bf16");

  // N counts sequences under cu_seqlens.
  o.cu_seqlens = t.offsets({0, 3, 6, 6});
  o.initial_state = t.make({2, 4, 8, 5});
  const auto q1 = t.make({1, 6, 4, 8}), k1 = t.make({1, 6, 2, 8}), v1 = t.make({1, 6, 2, 5});
  REQUIRE_THROWS_WITH(ladle::recurrent(q1, k1, v1, o), Contains("initial_state has shape [2,4,8,5], expected [N,H,K,V] = [3,4,8,5]"));
}

TEST_CASE("cu_seqlens is checked: batch 1, starts at 0, non-decreasing, ends at T", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({1, 10, 2, 4}), k = t.make({1, 10, 2, 4}), v = t.make({1, 10, 2, 3});
  ladle::RecurrentOptions o;
  o.cu_seqlens = t.offsets({0, 4, 4, 10});
  REQUIRE_NOTHROW(ladle::recurrent(q, k, v, o));
  o.cu_seqlens = t.offsets({0, 4, 4, 10}, DType::i32);
  REQUIRE_NOTHROW(ladle::recurrent(q, k, v, o));

  o.cu_seqlens = t.offsets({0, 2, 4});
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({2, 4, 2, 4}), t.make({2, 4, 2, 4}), t.make({2, 4, 2, 3}), o),
                      "recurrent: cu_seqlens needs batch 1, but q has batch 2 (pack the sequences into [1,total,H,K])");
  o.cu_seqlens = t.offsets({1, 4, 10});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: cu_seqlens must start at 0, but cu_seqlens[0] = 1");
  o.cu_seqlens = t.offsets({0, 6, 4, 10});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o),
                      "recurrent: cu_seqlens must be non-decreasing, but cu_seqlens[2] = 4 < cu_seqlens[1] = 6");
  o.cu_seqlens = t.offsets({0, 4, 12});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: cu_seqlens ends at 12, past the token count T = 10");
  o.cu_seqlens = t.offsets({0, 4, 8});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("cu_seqlens ends at 8, before the token count T = 10"));
  o.cu_seqlens = t.make({3});
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: cu_seqlens has dtype f32, expected i32 or i64");
  o.cu_seqlens = t.make({1, 3}, DType::i64);
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), "recurrent: cu_seqlens has shape [1,3], expected [N+1] with N >= 0");
  o.cu_seqlens = t.make({0}, DType::i64);
  REQUIRE_THROWS_WITH(ladle::recurrent(q, k, v, o), Contains("cu_seqlens has shape [0], expected [N+1]"));
}

TEST_CASE("unsupported and mismatched dtypes are named", "[ops][errors]") {
  Tensors t;
  using E = DType;
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 2, 4}, E::f64), t.make({1, 4, 2, 4}, E::f64), t.make({1, 4, 2, 3}, E::f64)),
                      "recurrent: q has dtype f64, expected f32, f16 or bf16");
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 2, 4}, E::i32), t.make({1, 4, 2, 4}), t.make({1, 4, 2, 3})),
                      Contains("q has dtype i32"));
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 2, 4}), t.make({1, 4, 2, 4}, E::f16), t.make({1, 4, 2, 3})),
                      "recurrent: k has dtype f16, expected the dtype of q (f32)");
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 2, 4}, E::bf16), t.make({1, 4, 2, 4}, E::bf16), t.make({1, 4, 2, 3}, E::f16)),
                      "recurrent: v has dtype f16, expected the dtype of q (bf16)");
  ladle::RecurrentOptions o;
  o.g = t.make({1, 4, 2, 4}, E::u8);
  REQUIRE_THROWS_WITH(ladle::recurrent(t.make({1, 4, 2, 4}), t.make({1, 4, 2, 4}), t.make({1, 4, 2, 3}), o),
                      "recurrent: g has dtype u8, expected f32, f16 or bf16");
}

TEST_CASE("caller-owned outputs are checked", "[ops][errors]") {
  Tensors t;
  const auto q = t.make({1, 4, 2, 4}), k = t.make({1, 4, 2, 4}), v = t.make({1, 4, 2, 3});
  ladle::RecurrentOptions o;
  REQUIRE_NOTHROW(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 3}), std::nullopt}));
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 4}), std::nullopt}),
                      "recurrent: o has shape [1,4,2,4], expected [B,T,H,V] = [1,4,2,3]");
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 3}, DType::bf16), std::nullopt}),
                      "recurrent: o has dtype bf16, expected the dtype of q (f32)");
  {  // 16-bit inputs may write an fp32 o (what the backward's recurrences do), nothing else
    const auto hq = t.make({1, 4, 2, 4}, DType::bf16), hk = t.make({1, 4, 2, 4}, DType::bf16),
               hv = t.make({1, 4, 2, 3}, DType::bf16);
    REQUIRE_NOTHROW(ladle::recurrent_into(hq, hk, hv, o, {t.make({1, 4, 2, 3}), std::nullopt}));
    REQUIRE_THROWS_WITH(ladle::recurrent_into(hq, hk, hv, o, {t.make({1, 4, 2, 3}, DType::f16), std::nullopt}),
                        "recurrent: o has dtype f16, expected the dtype of q (bf16) or f32");
  }
  o.return_state = true;
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 3}), std::nullopt}),
                      "recurrent: return_state is set but no final_state output was given");
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 3}), t.make({1, 2, 4, 3}, DType::f16)}),
                      "recurrent: final_state has dtype f16, expected the fp32 state (f32)");
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, o, {t.make({1, 4, 2, 3}), t.make({1, 2, 3, 4})}),
                      "recurrent: final_state has shape [1,2,3,4], expected [N,H,K,V] = [1,2,4,3]");
  TensorView no_data = t.make({1, 4, 2, 3});
  no_data.data = nullptr;
  REQUIRE_THROWS_WITH(ladle::recurrent_into(q, k, v, {}, {no_data, std::nullopt}),
                      "recurrent: o has 24 elements but no data (a null pointer)");
  TensorView q_no_data = q;
  q_no_data.data = nullptr;
  REQUIRE_THROWS_WITH(ladle::recurrent(q_no_data, k, v), "recurrent: q has 32 elements but no data (a null pointer)");
}

TEST_CASE("empty sequences are accepted: no tokens, no batch rows", "[ops][errors]") {
  Tensors t;
  REQUIRE_NOTHROW(ladle::recurrent(t.make({2, 0, 2, 4}), t.make({2, 0, 2, 4}), t.make({2, 0, 2, 3})));
  ladle::RecurrentOptions o;
  o.return_state = true;
  o.initial_state = t.make({0, 2, 4, 3});
  const auto out = ladle::recurrent(t.make({0, 5, 2, 4}), t.make({0, 5, 2, 4}), t.make({0, 5, 2, 3}), o);
  CHECK(out.o.numel() == 0);
  CHECK(out.final_state->shape() == std::vector<std::int64_t>{0, 2, 4, 3});
}

TEST_CASE("a user variant's named inputs are checked by name", "[ops][errors]") {
  using namespace ladle;
  const auto x = dsl::token_key("x");
  const auto tau = dsl::head_param("tau");
  const ir::Variant variant =
      dsl::lower(dsl::read(dsl::scan(dsl::k, dsl::v).decay_k(dsl::logsigmoid(x) / tau), dsl::q, dsl::scalar("scale")), "custom_gate");
  Tensors t;
  const auto q = t.make({1, 4, 2, 4}), k = t.make({1, 4, 2, 4}), v = t.make({1, 4, 2, 3});
  VariantInputs in;
  in.tensors = {{"x", t.make({1, 4, 2, 4})}, {"tau", t.make({2})}};
  in.scalars = {{"scale", 0.5f}};
  REQUIRE_NOTHROW(run_variant(variant, q, k, v, in));

  VariantInputs missing = in;
  missing.tensors.erase("tau");
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, missing),
                      "custom_gate: the variant reads tau [H] or [B,H], which was not given");
  VariantInputs no_scale = in;
  no_scale.scalars.clear();
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, no_scale), "custom_gate: the variant reads the scalar scale, which was not given");
  VariantInputs scale_as_tensor = no_scale;
  scale_as_tensor.tensors.emplace("scale", t.make({1}));
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, scale_as_tensor), Contains("(it was given as a tensor; pass it among the scalars)"));
  VariantInputs extra = in;
  extra.tensors.emplace("y", t.make({1}));
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, extra),
                      "custom_gate: y is not an input of the variant (it reads q, k, v, x, tau, scale)");
  VariantInputs q_by_name = in;
  q_by_name.tensors.emplace("q", q);
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, q_by_name), Contains("q is given among the named inputs, but the variant takes it as query"));
  VariantInputs wrong_x = in;
  wrong_x.tensors["x"] = t.make({1, 4, 2, 3});
  REQUIRE_THROWS_WITH(run_variant(variant, q, k, v, wrong_x), "custom_gate: x has shape [1,4,2,3], expected [B,T,H,K] = [1,4,2,4]");
}

TEST_CASE("a malformed variant is rejected before it runs", "[ops][errors]") {
  using namespace ladle;
  ir::Variant variant = recurrent_variant(false, false, false, false);
  variant.slot(ir::Slot::k_feature) = {};
  Tensors t;
  REQUIRE_THROWS_WITH(run_variant(variant, t.make({1, 4, 2, 4}), t.make({1, 4, 2, 4}), t.make({1, 4, 2, 3}), {{}, {{"scale", 1.0f}}}),
                      "recurrent: the variant is malformed: slot k_feature is required but empty");
}

TEST_CASE("the chunked form's segments are checked", "[ops][errors]") {
  Tensors t;
  const TensorView q = t.make({1, 8, 2, 4}), v = t.make({1, 8, 2, 4});
  ladle::RecurrentOptions options;
  options.backend = ladle::Backend::cpu;
  options.chunked_segment_tokens = -1;
  CHECK_THROWS_WITH(ladle::recurrent(q, q, v, options),
                    Catch::Contains("recurrent: chunked_segment_tokens = -1, expected >= 0"));
  options.chunked_segment_tokens = 64;
  options.chunked_tile = ladle::cuda::ChunkedTile{16, 16, 16, 4, 16, 16, 4, false};
  CHECK_THROWS_WITH(ladle::recurrent(q, q, v, options),
                    Catch::Contains("chunked_segment_tokens = 64 with a split chunked_tile (block_k=16"));
  options.chunked_segment_tokens = 0;  // whole sequences: fine with a split tile
  CHECK_NOTHROW(ladle::recurrent(q, q, v, options));
}
