// attention() on the CPU path against the fp64 reference (tests/reference/attention_reference.h)
// on fresh random inputs with NaN-poisoned outputs: every mask (none, causal, sliding window,
// causal + window, explicit mask in two broadcast shapes, segment ids) with every score
// modifier (plain, bias, soft cap, both), sinks [H,S] and [S], GQA, Tq != Tk either way,
// D != Dv, packed sequences with empty and one-token sequences, dropout, lse, f32/f16/bf16;
// and run_attention on variants a user writes in the DSL (ALiBi, predicates on (b, h, i, j)).
#include <catch2/catch.hpp>

#include <ladle/dsl/softmax.h>
#include <ladle/ops/attention.h>

#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "reference/attention_reference.h"
#include "support/backends.h"
#include "support/tensors.h"

using ladle::DType;
using ladle::Tensor;

namespace {

using Shape = std::vector<std::int64_t>;

struct Case {
  int B = 2, Tq = 7, Tk = 7, H = 4, H_kv = 2, D = 8, Dv = 8;
  DType type = DType::f32;
  std::optional<float> scale;
  Shape bias_shape;  // empty: no bias; else broadcastable to [B,H,Tq,Tk]
  DType bias_type = DType::f32;
  std::optional<float> soft_cap;
  bool causal = false;
  std::optional<std::pair<std::int64_t, std::int64_t>> window;
  Shape mask_shape;  // empty: no mask; else broadcastable to [B,H,Tq,Tk]
  DType mask_type = DType::u8;
  bool segments = false;
  Shape sinks_shape;  // empty: no sinks; [H,S] or [S]
  float dropout_p = 0;
  std::uint64_t seed = 0;
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;  // packed: B = 1, Tq, Tk the totals
  bool packed_rank3 = false;                              // q, k, v [T,H,D] instead of [1,T,H,D]
  DType index_type = DType::i64;              // of cu_seqlens and segment ids
  bool return_lse = true;

  std::string describe() const {
    std::ostringstream s;
    const auto shape = [&](const Shape& v) {
      std::string out = "[";
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(v[i]);
      }
      return out + "]";
    };
    s << "B=" << B << " Tq=" << Tq << " Tk=" << Tk << " H=" << H << " H_kv=" << H_kv << " D=" << D << " Dv=" << Dv
      << " dtype=" << ladle::dtype_name(type) << " scale=" << (scale ? std::to_string(*scale) : "default");
    if (!bias_shape.empty()) s << " bias" << shape(bias_shape) << ladle::dtype_name(bias_type);
    if (soft_cap) s << " soft_cap=" << *soft_cap;
    if (causal) s << " causal";
    if (window) s << " window=(" << window->first << "," << window->second << ")";
    if (!mask_shape.empty()) s << " mask" << shape(mask_shape) << ladle::dtype_name(mask_type);
    if (segments) s << " segment_ids";
    if (!sinks_shape.empty()) s << " sinks" << shape(sinks_shape);
    if (dropout_p > 0) s << " dropout=" << dropout_p << " seed=" << seed;
    if (!cu_seqlens_q.empty()) s << " cu_seqlens_q=" << shape(cu_seqlens_q) << " cu_seqlens_k=" << shape(cu_seqlens_k);
    if (packed_rank3) s << " rank3";
    s << " index=" << ladle::dtype_name(index_type) << " lse=" << return_lse;
    return s.str();
  }
};

// The inputs' random seed: from the description, less the dropout seed and return_lse, so
// that two cases differing only in those see the same inputs.
std::uint64_t seed_of(Case c) {
  c.seed = 0, c.return_lse = true;
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : c.describe()) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

// An integer tensor (i32, i64 or u8) holding `values`.
Tensor integers(DType type, Shape shape, const std::vector<std::int64_t>& values) {
  Tensor t(type, std::move(shape));
  REQUIRE(t.numel() == static_cast<std::int64_t>(values.size()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    char* at = static_cast<char*>(t.data()) + i * ladle::dtype_size(type);
    if (type == DType::i64) {
      std::memcpy(at, &values[i], 8);
    } else if (type == DType::i32) {
      const auto v = static_cast<std::int32_t>(values[i]);
      std::memcpy(at, &v, 4);
    } else {
      const auto v = static_cast<std::uint8_t>(values[i]);
      std::memcpy(at, &v, 1);
    }
  }
  return t;
}

// Expands a tensor broadcastable to [B,H,Tq,Tk] (numpy rules: aligned on the right, each
// axis equal or 1) into the dense array the reference takes.
template <class T>
std::vector<T> expand(const std::vector<T>& values, const Shape& shape, const Case& c) {
  const Shape full{c.B, c.H, c.Tq, c.Tk};
  Shape padded(4 - shape.size(), 1);
  padded.insert(padded.end(), shape.begin(), shape.end());
  std::vector<T> out;
  out.reserve(std::size_t(c.B) * c.H * c.Tq * c.Tk);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t i = 0; i < c.Tq; ++i)
        for (std::int64_t j = 0; j < c.Tk; ++j) {
          const std::int64_t index[4] = {b, h, i, j};
          std::int64_t at = 0;
          for (int d = 0; d < 4; ++d) at = at * padded[d] + (padded[d] == 1 ? 0 : index[d]);
          out.push_back(values[static_cast<std::size_t>(at)]);
        }
  return out;
}

// lse rows the reference leaves at -inf must be -inf; the rest compare as a relative error.
double lse_error(const Tensor& out, const std::vector<double>& ref) {
  if (out.numel() != static_cast<std::int64_t>(ref.size())) return std::numeric_limits<double>::infinity();
  std::vector<double> a, b;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double x = out.get(static_cast<std::int64_t>(i));
    if (std::isinf(ref[i])) {
      if (x != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    a.push_back(x), b.push_back(ref[i]);
  }
  return test::relative_error(a, b);
}

// Packed cases: B = 1 and Tq, Tk the token totals.
void resolve(Case& c) {
  if (c.cu_seqlens_q.empty()) return;
  c.B = 1;
  c.Tq = static_cast<int>(c.cu_seqlens_q.back());
  c.Tk = static_cast<int>(c.cu_seqlens_k.back());
}

Shape token_shape(const Case& c, int T, int heads, int features) {
  if (c.packed_rank3) return Shape{T, heads, features};
  return Shape{c.B, T, heads, features};
}

// Random q, k, v of a (resolved) case and the reference problem holding them.
struct Qkv {
  test::Filled q, k, v;
  reference::Attention ref;
};

Qkv make_qkv(std::mt19937_64& rng, const Case& c) {
  Qkv out{test::normal(rng, c.type, token_shape(c, c.Tq, c.H, c.D)), test::normal(rng, c.type, token_shape(c, c.Tk, c.H_kv, c.D)),
          test::normal(rng, c.type, token_shape(c, c.Tk, c.H_kv, c.Dv)), {}};
  reference::Attention& ref = out.ref;
  ref.B = c.B, ref.Tq = c.Tq, ref.Tk = c.Tk, ref.H = c.H, ref.H_kv = c.H_kv, ref.D = c.D, ref.Dv = c.Dv;
  ref.q = out.q.values, ref.k = out.k.values, ref.v = out.v.values;
  ref.scale = c.scale ? double(*c.scale) : 1.0 / std::sqrt(double(c.D));
  ref.cu_seqlens_q = c.cu_seqlens_q, ref.cu_seqlens_k = c.cu_seqlens_k;
  return out;
}

struct Run {
  reference::AttentionOutput expected;
  Tensor o;
  std::optional<Tensor> lse;
};

// o (and lse when asked) within the dtype's tolerance of the reference; rows that attend to
// nothing exactly zero.
void compare(const Run& run, DType type, ladle::Backend backend) {
  // fp32 inputs meet the tensor cores on the GPU (split into bf16 halves): docs/design.md's 2e-3.
  const double tolerance = backend == ladle::Backend::gpu && type == DType::f32 ? 2e-3 : test::tolerance(type);
  const double o_error = test::relative_error(run.o, run.expected.o);
  INFO("o error " << o_error);
  CHECK(o_error < tolerance);
  const std::size_t Dv = static_cast<std::size_t>(run.o.shape().back());
  for (std::size_t row = 0; row * Dv < run.expected.o.size(); ++row) {
    bool zero = true;
    for (std::size_t e = 0; e < Dv; ++e) zero = zero && run.expected.o[row * Dv + e] == 0.0;
    if (!zero) continue;
    for (std::size_t e = 0; e < Dv; ++e) REQUIRE(run.o.get(static_cast<std::int64_t>(row * Dv + e)) == 0.0f);
  }
  if (run.lse) {
    const double error = lse_error(*run.lse, run.expected.lse);
    INFO("lse error " << error);
    CHECK(error < tolerance);
  }
}

// Builds the inputs of one case, runs attention_into on the CPU with NaN-poisoned outputs,
// and checks o (and lse) against the reference.
Run check_case(Case c) {
  const bool packed = !c.cu_seqlens_q.empty();
  INFO(c.describe());
  std::mt19937_64 rng(seed_of(c));
  resolve(c);
  Qkv qkv = make_qkv(rng, c);
  const test::Filled &q = qkv.q, &k = qkv.k, &v = qkv.v;
  reference::Attention& ref = qkv.ref;

  ladle::AttentionOptions options;
  options.scale = c.scale;
  options.return_lse = c.return_lse;
  options.backend = ladle::Backend::cpu;
  options.threads = 2;

  std::optional<test::Filled> bias, sinks;
  Tensor mask, q_segments, kv_segments, cu_q, cu_k;
  if (!c.bias_shape.empty()) {
    bias = test::normal(rng, c.bias_type, c.bias_shape);
    options.bias = bias->tensor.view();
    ref.bias = expand(bias->values, c.bias_shape, c);
  }
  if (c.soft_cap) {
    options.logits_soft_cap = c.soft_cap;
    ref.soft_cap = *c.soft_cap;
  }
  options.causal = ref.causal = c.causal;
  if (c.window) {
    options.sliding_window = c.window;
    ref.window = true;
    ref.window_left = c.window->first, ref.window_right = c.window->second;
  }
  if (!c.mask_shape.empty()) {
    // About one pair in four masked out, so that some rows of small masks lose every key.
    std::bernoulli_distribution attend(0.75);
    std::vector<std::int64_t> bits(static_cast<std::size_t>(ladle::TensorView::contiguous(nullptr, c.mask_type, c.mask_shape).numel()));
    for (auto& bit : bits) bit = attend(rng) ? 1 : 0;
    if (c.mask_type == DType::u8) {
      mask = integers(DType::u8, c.mask_shape, bits);
    } else {
      mask = Tensor(c.mask_type, c.mask_shape);
      for (std::size_t i = 0; i < bits.size(); ++i) mask.set(static_cast<std::int64_t>(i), bits[i] ? 1.0f : 0.0f);
    }
    options.attention_mask = mask.view();
    std::vector<bool> keep(bits.begin(), bits.end());
    ref.mask = expand(keep, c.mask_shape, c);
  }
  if (c.segments) {
    // Sorted ids as packing makes them, with a different split on the key side when Tq != Tk.
    std::uniform_int_distribution<int> id(0, 2);
    std::vector<std::int64_t> qs, ks;
    for (int b = 0; b < c.B; ++b) {
      std::vector<std::int64_t> row_q(c.Tq), row_k(c.Tk);
      for (auto& x : row_q) x = id(rng);
      for (auto& x : row_k) x = id(rng);
      std::sort(row_q.begin(), row_q.end());
      std::sort(row_k.begin(), row_k.end());
      qs.insert(qs.end(), row_q.begin(), row_q.end());
      ks.insert(ks.end(), row_k.begin(), row_k.end());
    }
    q_segments = integers(c.index_type, {c.B, c.Tq}, qs);
    kv_segments = integers(c.index_type, {c.B, c.Tk}, ks);
    options.q_segment_ids = q_segments.view();
    options.kv_segment_ids = kv_segments.view();
    ref.q_segment_ids = qs, ref.kv_segment_ids = ks;
  }
  if (!c.sinks_shape.empty()) {
    sinks = test::normal(rng, DType::f32, c.sinks_shape);
    options.softmax_aux = sinks->tensor.view();
    ref.S = static_cast<int>(c.sinks_shape.back());
    for (int h = 0; h < c.H; ++h)
      for (int s = 0; s < ref.S; ++s) ref.sinks.push_back(sinks->values[(c.sinks_shape.size() == 2 ? h * ref.S : 0) + s]);
  }
  options.dropout_p = c.dropout_p, ref.dropout_p = c.dropout_p;
  options.seed = c.seed, ref.seed = c.seed;
  if (packed) {
    cu_q = integers(c.index_type, {static_cast<std::int64_t>(c.cu_seqlens_q.size())}, c.cu_seqlens_q);
    cu_k = integers(c.index_type, {static_cast<std::int64_t>(c.cu_seqlens_k.size())}, c.cu_seqlens_k);
    options.cu_seqlens_q = cu_q.view(), options.cu_seqlens_k = cu_k.view();
    ref.cu_seqlens_q = c.cu_seqlens_q, ref.cu_seqlens_k = c.cu_seqlens_k;
  }

  // The CPU path always, the GPU too where there is one; the CPU run is returned.
  const reference::AttentionOutput expected = reference::attention(ref);
  std::optional<Run> cpu_run;
  for (const ladle::Backend backend : test::backends()) {
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    options.backend = backend;
    Run run{expected, Tensor(c.type, token_shape(c, c.Tq, c.H, c.Dv)), std::nullopt};
    ladle::AttentionOutputs outputs{run.o.view(), std::nullopt};
    if (c.return_lse) {
      // [H,total_q] for packed [T,H,D] inputs, else [B,H,Tq] (B = 1 when packed)
      run.lse = Tensor(DType::f32, c.packed_rank3 ? Shape{c.H, c.Tq} : Shape{c.B, c.H, c.Tq});
      outputs.lse = run.lse->view();
    }
    ladle::attention_into(q.tensor.view(), k.tensor.view(), v.tensor.view(), options, outputs);
    compare(run, c.type, backend);
    if (backend == ladle::Backend::cpu) cpu_run.emplace(std::move(run));
  }
  return std::move(*cpu_run);
}

enum class Mask { none, causal, window_both, window_left_unbounded, window_right_unbounded, causal_window,
                  mask_broadcast, mask_full, segments };
enum class Modifier { plain, bias, soft_cap, bias_soft_cap };

const char* name(Mask m) {
  switch (m) {
    case Mask::none: return "none";
    case Mask::causal: return "causal";
    case Mask::window_both: return "window(2,1)";
    case Mask::window_left_unbounded: return "window(-1,2)";
    case Mask::window_right_unbounded: return "window(3,-1)";
    case Mask::causal_window: return "causal+window(3,-1)";
    case Mask::mask_broadcast: return "mask[1,1,Tq,Tk]";
    case Mask::mask_full: return "mask[B,H,Tq,Tk]";
    case Mask::segments: return "segment_ids";
  }
  return "?";
}

void apply(Case& c, Mask m) {
  switch (m) {
    case Mask::none: break;
    case Mask::causal: c.causal = true; break;
    case Mask::window_both: c.window = {{2, 1}}; break;
    case Mask::window_left_unbounded: c.window = {{-1, 2}}; break;
    case Mask::window_right_unbounded: c.window = {{3, -1}}; break;
    case Mask::causal_window: c.causal = true, c.window = {{3, -1}}; break;
    case Mask::mask_broadcast: c.mask_shape = {1, 1, c.Tq, c.Tk}; break;
    case Mask::mask_full: c.mask_shape = {c.B, c.H, c.Tq, c.Tk}; break;
    case Mask::segments: c.segments = true; break;
  }
}

void apply(Case& c, Modifier m) {
  if (m == Modifier::bias || m == Modifier::bias_soft_cap) c.bias_shape = {c.B, c.H, c.Tq, c.Tk};
  if (m == Modifier::soft_cap || m == Modifier::bias_soft_cap) c.soft_cap = 1.5f;  // scores ~N(0, 1.4): it bites
}

const Mask all_masks[] = {Mask::none, Mask::causal, Mask::window_both, Mask::window_left_unbounded,
                          Mask::window_right_unbounded, Mask::causal_window, Mask::mask_broadcast,
                          Mask::mask_full, Mask::segments};
const Modifier all_modifiers[] = {Modifier::plain, Modifier::bias, Modifier::soft_cap, Modifier::bias_soft_cap};
const DType all_types[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("the library's dropout hash is the one spelled out in attention.h", "[ops][attention]") {
  std::mt19937_64 rng(42);
  for (int n = 0; n < 1000; ++n) {
    const std::uint64_t seed = rng(), sequence = rng() % 64, head = rng() % 64, i = rng() % 100000, j = rng() % 100000;
    INFO(seed << " " << sequence << " " << head << " " << i << " " << j);
    REQUIRE(ladle::dropout_uniform(seed, sequence, head, i, j) == reference::dropout_uniform(seed, sequence, head, i, j));
  }
}

TEST_CASE("attention matches the fp64 reference for every mask and score modifier", "[ops][attention]") {
  // Square, fewer queries than keys (decode-like: the diagonal sits at the right), more queries
  // than keys (causal leaves the first Tq - Tk rows with no key).
  for (auto [Tq, Tk] : {std::pair{7, 7}, std::pair{5, 9}, std::pair{9, 5}})
    for (Mask mask : all_masks)
      for (Modifier modifier : all_modifiers) {
        INFO("mask " << name(mask) << ", modifier " << int(modifier));
        Case c;
        c.Tq = Tq, c.Tk = Tk;
        apply(c, mask);
        apply(c, modifier);
        check_case(c);
      }
}

TEST_CASE("attention matches the reference in f16 and bf16 with every mask", "[ops][attention]") {
  for (DType type : {DType::f16, DType::bf16})
    for (Mask mask : all_masks) {
      Case c;
      c.type = c.bias_type = type;
      c.Tq = 6, c.Tk = 10;
      apply(c, mask);
      apply(c, Modifier::bias_soft_cap);
      check_case(c);
    }
}

TEST_CASE("a soft cap of 30 with logits at the cap: the kernels' fast tanh stays within the 16-bit tolerance", "[ops][attention]") {
  // scale 3 makes the scores ~N(0, 34^2): most logits saturate near +-30, where tanh.approx's
  // relative error (2^-11) is largest in logit units (about 0.015). Over several key tiles,
  // causal, GQA, D = Dv = 128 (on sm_90a the ws tile).
  for (DType type : {DType::f16, DType::bf16}) {
    Case c;
    c.type = type;
    c.B = 1, c.Tq = c.Tk = 300, c.H = 4, c.H_kv = 2, c.D = c.Dv = 128;
    c.scale = 3.0f;
    c.soft_cap = 30.0f;
    c.causal = true;
    check_case(c);
  }
}

TEST_CASE("head dims to 64 on shapes that fill the GPU: three consumer warpgroups on sm_90a", "[ops][attention]") {
  // 2 x 34 heads x 3 row blocks of 192 = 204 blocks, more than an H100's or H200's 132 SMs: the
  // heuristic's 192-row ws tile (three consumer warpgroups) there; causal, a sliding window with a
  // soft cap, and sinks with GQA; bf16.
  for (int variant = 0; variant < 3; ++variant) {
    Case c;
    c.type = DType::bf16;
    c.B = 2, c.Tq = c.Tk = 400, c.H = 34, c.H_kv = variant == 2 ? 17 : 34, c.D = c.Dv = 64;
    if (variant == 0) c.causal = true;
    if (variant == 1) c.window = std::pair<std::int64_t, std::int64_t>{100, 0}, c.soft_cap = 30.0f;
    if (variant == 2) c.causal = true, c.sinks_shape = {34, 2};
    check_case(c);
  }
}

TEST_CASE("masks and biases broadcast over B and H, with leading axes left out; masks may be float", "[ops][attention]") {
  Case base;
  base.Tq = 5, base.Tk = 8;
  for (Shape shape : {Shape{1, 1, 5, 8}, Shape{2, 4, 5, 8}, Shape{2, 1, 5, 8}, Shape{4, 5, 8}, Shape{5, 8}}) {
    Case c = base;
    c.mask_shape = shape;
    check_case(c);
    c.mask_type = DType::f32;
    check_case(c);
    c = base;
    c.bias_shape = shape;
    check_case(c);
    c.bias_type = DType::bf16;
    check_case(c);
  }
}

TEST_CASE("masks and biases broadcast over Tq and Tk too: a [B,1,1,Tk] key padding mask", "[ops][attention]") {
  // attention.h promises "broadcastable to [B,H,Tq,Tk]", as PyTorch's SDPA takes attn_mask;
  // the padding mask [B,1,1,Tk] and a per-query bias [1,H,Tq,1] are the common cases.
  Case base;
  base.Tq = 5, base.Tk = 8;
  for (Shape shape : {Shape{2, 1, 1, 8}, Shape{1, 4, 5, 1}, Shape{1, 8}, Shape{8}}) {
    Case c = base;
    c.mask_shape = shape;
    CHECK_NOTHROW(check_case(c));
    c = base;
    c.bias_shape = shape;
    CHECK_NOTHROW(check_case(c));
  }
}

TEST_CASE("sinks [H,S] and [S] add to the denominator only, with and without masks", "[ops][attention]") {
  for (Shape sinks : {Shape{4, 3}, Shape{2}, Shape{4, 1}})
    for (Mask mask : {Mask::none, Mask::causal, Mask::causal_window, Mask::mask_full})
      for (DType type : all_types) {
        Case c;
        c.Tq = 9, c.Tk = 6;  // causal leaves rows with only the sinks
        c.type = type;
        c.sinks_shape = sinks;
        apply(c, mask);
        check_case(c);
      }
}

TEST_CASE("GQA 4:2 and 4:1, D != Dv, and an explicit scale", "[ops][attention]") {
  for (int H_kv : {4, 2, 1})
    for (auto [D, Dv] : {std::pair{8, 8}, std::pair{16, 4}, std::pair{3, 20}}) {
      Case c;
      c.H_kv = H_kv, c.D = D, c.Dv = Dv;
      c.Tq = 6, c.Tk = 11;
      c.causal = true;
      check_case(c);
      c.scale = 0.3f;
      c.soft_cap = 2.0f;
      check_case(c);
    }
}

TEST_CASE("head dims past 192 run with the tile the library picks: D = Dv = 256, D != Dv", "[ops][attention]") {
  // On the GPU the default tile (mma.sync, q in registers) does not fit these: the heuristic
  // falls back to one that does (wgmma on sm_90a), with no tile named.
  for (DType type : {DType::bf16, DType::f16})
    for (auto [D, Dv] : {std::pair{256, 256}, std::pair{200, 256}, std::pair{256, 40}}) {
      Case c;
      c.type = c.bias_type = type;
      c.D = D, c.Dv = Dv;
      c.Tq = 70, c.Tk = 70;
      c.causal = true;
      check_case(c);
    }
}

TEST_CASE("packed sequences attend within themselves, including empty and one-token ones", "[ops][attention]") {
  // Sequence lengths (q, k): (2,4) (0,1) (1,1) (4,0) (3,5) (1,3): an empty query side, an
  // empty key side (rows with no key), a single token, and Tq_n > Tk_n and Tq_n < Tk_n.
  const std::vector<std::int64_t> cu_q{0, 2, 2, 3, 7, 10, 11}, cu_k{0, 4, 5, 6, 6, 11, 14};
  for (Mask mask : {Mask::none, Mask::causal, Mask::window_both, Mask::causal_window})
    for (DType type : all_types)
      for (DType index : {DType::i32, DType::i64}) {
        Case c;
        c.cu_seqlens_q = cu_q, c.cu_seqlens_k = cu_k;
        c.type = type, c.index_type = index;
        c.packed_rank3 = index == DType::i32;
        apply(c, mask);
        check_case(c);
        c.sinks_shape = {c.H, 2};
        c.soft_cap = 1.5f;
        check_case(c);
      }
  Case same;  // the same offsets on both sides: the usual self-attention packing
  same.cu_seqlens_q = same.cu_seqlens_k = {0, 5, 6, 6, 13};
  same.causal = true;
  check_case(same);
}

TEST_CASE("decode-shaped calls (a few query tokens against many keys) match the reference for every mask and modifier", "[ops][attention][decode]") {
  // On the GPU these take the decode form (a GQA group's heads as rows, the keys split over
  // blocks, the merge kernel by lse): each mask and modifier at 1 and 4 query tokens against 300
  // keys, GQA 8:2, bf16; sinks in the merge; 16 tokens x 8:1 (128 rows, two row blocks, several key
  // splits) in f32;
  // packed sequences with an empty one, queries with no keys and keys past every split.
  for (int Tq : {1, 4})
    for (Mask mask : all_masks)
      for (Modifier modifier : all_modifiers) {
        INFO("mask " << name(mask) << ", modifier " << int(modifier));
        Case c;
        c.Tq = Tq, c.Tk = 300, c.H = 8, c.H_kv = 2, c.D = c.Dv = 32, c.B = 2;
        c.type = c.bias_type = DType::bf16;
        apply(c, mask);
        apply(c, modifier);
        check_case(c);
      }
  Case sinks;
  sinks.Tq = 2, sinks.Tk = 500, sinks.H = 4, sinks.H_kv = 1, sinks.D = 64, sinks.Dv = 48, sinks.type = DType::f16;
  sinks.sinks_shape = {4, 3}, sinks.causal = true, sinks.soft_cap = 1.5f;
  check_case(sinks);
  Case wide;
  wide.B = 1, wide.Tq = 16, wide.Tk = 4000, wide.H = 8, wide.H_kv = 1, wide.D = wide.Dv = 16, wide.causal = true;  // 7 splits on a GPU
  check_case(wide);
  Case packed;
  packed.cu_seqlens_q = {0, 1, 1, 4, 6}, packed.cu_seqlens_k = {0, 260, 260, 900, 900};
  packed.H = 4, packed.H_kv = 2, packed.D = packed.Dv = 32, packed.type = DType::bf16, packed.causal = true;
  check_case(packed);
}

TEST_CASE("dropout with a seed is deterministic and matches the reference", "[ops][attention]") {
  for (Mask mask : {Mask::none, Mask::causal, Mask::window_both})
    for (DType type : all_types) {
      Case c;
      c.Tq = 8, c.Tk = 12;
      c.type = type;
      c.dropout_p = 0.3f;
      c.seed = 0x5eed;
      apply(c, mask);
      const Run first = check_case(c);
      const Run second = check_case(c);
      REQUIRE(std::memcmp(first.o.data(), second.o.data(), first.o.numel() * ladle::dtype_size(type)) == 0);
      // The same inputs under another dropout seed drop other elements.
      Case other = c;
      other.seed = 0x5eee;
      const Run third = check_case(other);
      CHECK(test::relative_error(third.o, first.expected.o) > 0.05);
    }
  Case packed;
  packed.cu_seqlens_q = {0, 3, 3, 9}, packed.cu_seqlens_k = {0, 4, 6, 13};
  packed.causal = true;
  packed.dropout_p = 0.5f;
  packed.seed = 99;
  check_case(packed);
  packed.sinks_shape = {2};
  check_case(packed);
}

TEST_CASE("lse is optional and o does not depend on asking for it", "[ops][attention]") {
  Case c;
  c.causal = true;
  c.Tq = 9, c.Tk = 5;
  c.return_lse = false;
  const Run without = check_case(c);
  c.return_lse = true;
  const Run with = check_case(c);
  REQUIRE(std::memcmp(without.o.data(), with.o.data(), without.o.numel() * 4) == 0);

  // attention() allocates the outputs; lse only when asked.
  std::mt19937_64 rng(3);
  test::Filled q = test::normal(rng, DType::f32, {1, 3, 2, 4});
  test::Filled k = test::normal(rng, DType::f32, {1, 5, 2, 4});
  test::Filled v = test::normal(rng, DType::f32, {1, 5, 2, 6});
  ladle::AttentionOptions options;
  options.backend = ladle::Backend::cpu;
  ladle::AttentionResult result = ladle::attention(q.tensor.view(), k.tensor.view(), v.tensor.view(), options);
  CHECK(result.o.shape() == Shape{1, 3, 2, 6});
  CHECK(result.o.type() == DType::f32);
  CHECK_FALSE(result.lse.has_value());
  options.return_lse = true;
  result = ladle::attention(q.tensor.view(), k.tensor.view(), v.tensor.view(), options);
  REQUIRE(result.lse.has_value());
  CHECK(result.lse->shape() == Shape{1, 2, 3});
  CHECK(result.lse->type() == DType::f32);
}

// ---- run_attention: variants a user writes with dsl::softmax --------------------------------

namespace {

namespace dsl = ladle::dsl;

// Runs a user's variant on the CPU with NaN-poisoned o and lse and checks both against the
// reference problem (which the caller has given the same score modifier and predicate).
Run check_variant(const ladle::ir::AttentionVariant& variant, const Case& c, const Qkv& qkv,
                  const ladle::VariantInputs& inputs, ladle::AttentionRunOptions options = {}) {
  INFO(c.describe() << "\n" << ladle::ir::to_string(variant));
  options.threads = 2;
  options.return_lse = true;
  Tensor cu_q, cu_k;
  if (!c.cu_seqlens_q.empty()) {
    cu_q = integers(DType::i64, {static_cast<std::int64_t>(c.cu_seqlens_q.size())}, c.cu_seqlens_q);
    cu_k = integers(DType::i64, {static_cast<std::int64_t>(c.cu_seqlens_k.size())}, c.cu_seqlens_k);
    options.cu_seqlens_q = cu_q.view(), options.cu_seqlens_k = cu_k.view();
  }
  const reference::AttentionOutput expected = reference::attention(qkv.ref);
  std::optional<Run> cpu_run;
  for (const ladle::Backend backend : test::backends()) {
    INFO("backend " << (backend == ladle::Backend::gpu ? "gpu" : "cpu"));
    options.backend = backend;
    Run run{expected, Tensor(c.type, token_shape(c, c.Tq, c.H, c.Dv)),
            Tensor(DType::f32, c.packed_rank3 ? Shape{c.H, c.Tq} : Shape{c.B, c.H, c.Tq})};
    ladle::run_attention_into(variant, qkv.q.tensor.view(), qkv.k.tensor.view(), qkv.v.tensor.view(), inputs, options,
                              {run.o.view(), run.lse->view()});
    compare(run, c.type, backend);
    if (backend == ladle::Backend::cpu) cpu_run.emplace(std::move(run));
  }
  return std::move(*cpu_run);
}

// The user's logit for each modifier: score * scale, + pair("bias"), under soft_cap(., 1.5).
ladle::ir::AttentionVariant user_variant(Modifier modifier, Mask mask, bool sinks, bool predicate) {
  const auto finish = [&](auto softmax) {
    if (mask == Mask::causal || mask == Mask::causal_window) softmax = softmax.causal();
    if (mask == Mask::window_both || mask == Mask::causal_window) softmax = softmax.sliding_window();
    if (mask == Mask::segments) softmax = softmax.segment_ids();
    if (sinks) softmax = softmax.sinks();
    // A prefix that every query sees in full, then a diagonal band that moves with the head
    // and the batch row: the predicate reads all four indices and a run-time scalar.
    const auto prefix = dsl::key_index < dsl::scalar("prefix");
    const auto band = dsl::key_index + dsl::head_index != dsl::query_index + dsl::batch_index;
    if (predicate) return dsl::lower(softmax.mask(prefix || band), "user_predicate");
    return dsl::lower(softmax, "user");
  };
  const auto logit = dsl::score * dsl::scalar("scale");
  switch (modifier) {
    case Modifier::plain: return finish(dsl::softmax(logit));
    case Modifier::bias: return finish(dsl::softmax(logit + dsl::pair("bias")));
    case Modifier::soft_cap: return finish(dsl::softmax(dsl::soft_cap(logit, 1.5f)));
    case Modifier::bias_soft_cap: return finish(dsl::softmax(dsl::soft_cap(logit + dsl::pair("bias"), 1.5f)));
  }
  throw std::logic_error("modifier");
}

// The reference's copy of user_variant's predicate (prefix 2).
bool user_predicate(int b, int h, int i, int j) { return j < 2 || j + h != i + b; }

}  // namespace

TEST_CASE("run_attention matches the reference for a user predicate with every mask and modifier", "[ops][attention][dsl]") {
  for (auto [Tq, Tk] : {std::pair{7, 7}, std::pair{5, 9}, std::pair{9, 5}})
    for (Mask mask : {Mask::none, Mask::causal, Mask::window_both, Mask::causal_window, Mask::segments})
      for (Modifier modifier : all_modifiers)
        for (bool predicate : {false, true}) {
          Case c;
          c.Tq = Tq, c.Tk = Tk;
          c.scale = 0.4f;
          apply(c, mask);
          apply(c, modifier);
          c.sinks_shape = mask == Mask::causal ? Shape{c.H, 2} : Shape{};
          INFO("mask " << name(mask) << ", modifier " << int(modifier) << ", predicate " << predicate);
          std::mt19937_64 rng(seed_of(c) + predicate);
          Qkv qkv = make_qkv(rng, c);
          ladle::VariantInputs inputs;
          inputs.scalars = {{"scale", 0.4f}};
          if (predicate) inputs.scalars["prefix"] = 2.0f;
          ladle::AttentionRunOptions options;
          if (c.window) {
            options.window_left = c.window->first, options.window_right = c.window->second;
            qkv.ref.window = true, qkv.ref.window_left = c.window->first, qkv.ref.window_right = c.window->second;
          }
          qkv.ref.causal = c.causal;
          std::optional<test::Filled> bias, sinks;
          if (!c.bias_shape.empty()) {
            bias = test::normal(rng, DType::f32, {1, c.H, c.Tq, c.Tk});  // broadcast over B
            inputs.tensors.emplace("bias", bias->tensor.view());
            qkv.ref.bias = expand(bias->values, {1, c.H, c.Tq, c.Tk}, c);
          }
          if (c.soft_cap) qkv.ref.soft_cap = *c.soft_cap;
          Tensor q_segments, kv_segments;
          if (c.segments) {
            std::vector<std::int64_t> qs, ks;
            for (int b = 0; b < c.B; ++b) {
              for (int i = 0; i < c.Tq; ++i) qs.push_back(3 * i / c.Tq);  // three segments per row
              for (int j = 0; j < c.Tk; ++j) ks.push_back(3 * j / c.Tk);
            }
            q_segments = integers(DType::i32, {c.B, c.Tq}, qs);
            kv_segments = integers(DType::i32, {c.B, c.Tk}, ks);
            options.q_segment_ids = q_segments.view(), options.kv_segment_ids = kv_segments.view();
            qkv.ref.q_segment_ids = qs, qkv.ref.kv_segment_ids = ks;
          }
          if (!c.sinks_shape.empty()) {
            sinks = test::normal(rng, DType::f32, c.sinks_shape);
            options.softmax_aux = sinks->tensor.view();
            qkv.ref.S = 2, qkv.ref.sinks = sinks->values;
          }
          if (predicate) qkv.ref.keep = user_predicate;
          check_variant(user_variant(modifier, mask, !c.sinks_shape.empty(), predicate), c, qkv, inputs, options);
        }
}

TEST_CASE("run_attention runs ALiBi: a per-head slope times the query-key distance", "[ops][attention][dsl]") {
  const auto alibi = dsl::lower(
      dsl::softmax(dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index))
          .causal(),
      "alibi");
  for (bool per_batch : {false, true})
    for (DType type : all_types) {
      Case c;
      c.Tq = 6, c.Tk = 10;
      c.type = type;
      std::mt19937_64 rng(seed_of(c) + per_batch);
      Qkv qkv = make_qkv(rng, c);
      std::uniform_real_distribution<double> slope(0.05, 0.5);
      test::Filled slopes = test::filled(DType::f32, per_batch ? Shape{c.B, c.H} : Shape{c.H}, [&] { return slope(rng); });
      qkv.ref.scale = 0.35;
      qkv.ref.causal = true;
      qkv.ref.score_mod = [&](double s, int b, int h, int i, int j) {
        return s - slopes.values[(per_batch ? b * c.H : 0) + h] * (i - j);
      };
      check_variant(alibi, c, qkv, {{{"slope", slopes.tensor.view()}}, {{"scale", 0.35f}}});
    }
}

TEST_CASE("run_attention follows logits that climb along the keys: the running maximum moves mid-row", "[ops][attention][dsl]") {
  // ALiBi without a causal mask over several key tiles: slope (j - i) climbs by 0.6 to 40 a
  // 128-key tile, so the kernels' running maximum sometimes stays (a climb under 8 in log2
  // units, p up to 2^8) and sometimes moves (o_acc rescaled) inside one row.
  const auto alibi = dsl::lower(
      dsl::softmax(dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index)),
      "climbing");
  for (DType type : all_types) {
    Case c;
    c.Tq = 200, c.Tk = 300, c.H = 4;
    c.type = type;
    std::mt19937_64 rng(seed_of(c) + 17);
    Qkv qkv = make_qkv(rng, c);
    std::uniform_real_distribution<double> slope(0.005, 0.3);
    test::Filled slopes = test::filled(DType::f32, Shape{c.H}, [&] { return slope(rng); });
    qkv.ref.scale = 0.35;
    qkv.ref.score_mod = [&](double s, int, int h, int i, int j) { return s - slopes.values[h] * (i - j); };
    check_variant(alibi, c, qkv, {{{"slope", slopes.tensor.view()}}, {{"scale", 0.35f}}});
  }
}

TEST_CASE("run_attention counts i, j and b per packed sequence", "[ops][attention][dsl]") {
  // ALiBi and the predicate both read the indices: under cu_seqlens they restart at each
  // sequence and batch_index is the sequence's number.
  const auto variant = dsl::lower(
      dsl::softmax(dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index))
          .mask(dsl::key_index < dsl::scalar("prefix") || dsl::key_index + dsl::head_index != dsl::query_index + dsl::batch_index)
          .sinks(),
      "packed_user");
  for (bool rank3 : {false, true}) {
    Case c;
    c.cu_seqlens_q = {0, 2, 2, 3, 7, 10, 11}, c.cu_seqlens_k = {0, 4, 5, 6, 6, 11, 14};
    c.packed_rank3 = rank3;
    std::mt19937_64 rng(seed_of(c));
    resolve(c);
    Qkv qkv = make_qkv(rng, c);
    test::Filled slopes = test::normal(rng, DType::f32, {c.H}, 0.2);
    test::Filled sinks = test::normal(rng, DType::f32, {1});
    qkv.ref.scale = 0.35;
    qkv.ref.score_mod = [&](double s, int, int h, int i, int j) { return s - slopes.values[h] * (i - j); };
    qkv.ref.keep = user_predicate;
    qkv.ref.S = 1;
    qkv.ref.sinks.assign(c.H, sinks.values[0]);
    ladle::AttentionRunOptions options;
    options.softmax_aux = sinks.tensor.view();
    check_variant(variant, c, qkv, {{{"slope", slopes.tensor.view()}}, {{"scale", 0.35f}, {"prefix", 2.0f}}}, options);
  }
}

TEST_CASE("run_attention applies dropout where the variant asks for it", "[ops][attention][dsl]") {
  const auto variant = dsl::lower(dsl::softmax(dsl::score * 0.3f).sliding_window().dropout(), "window_dropout");
  Case c;
  c.Tq = 8, c.Tk = 8;
  std::mt19937_64 rng(seed_of(c));
  Qkv qkv = make_qkv(rng, c);
  qkv.ref.scale = 0.3;
  qkv.ref.window = true, qkv.ref.window_left = 3, qkv.ref.window_right = 3;
  qkv.ref.dropout_p = 0.25, qkv.ref.seed = 7;
  ladle::AttentionRunOptions options;
  options.window_left = options.window_right = 3;
  options.dropout_p = 0.25f, options.seed = 7;
  const Run first = check_variant(variant, c, qkv, {}, options);
  const Run second = check_variant(variant, c, qkv, {}, options);
  REQUIRE(std::memcmp(first.o.data(), second.o.data(), first.o.numel() * 4) == 0);
}
