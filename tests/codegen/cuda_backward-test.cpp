// The recurrent backward's generated kernels (codegen/cuda/backward.h) on the host emulation of CUDA
// (cuda_emulation.h), so that CI without a GPU checks what they compute: the slots kernel against the
// CPU path's slots (cpu::materialize_slots), shifted decays included; the chain kernel, given random
// recurrence outputs and carries, against the same running sums and the CPU path's chain rule
// (cpu::chain_slot_gradients). On a GPU, ops-backward checks the whole backward against finite differences.
#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <random>
#include <variant>

#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/codegen/cuda/backward.h>
#include <ladle/ops/bind.h>
#include <ladle/runtime/driver.h>

#include "backward_cases.h"
#include "cuda_emulation.h"
#include "ops/detail/checks.h"
#include "ops/detail/pack_input.h"
#include "support/tensors.h"

// The chain kernel adds shared gradients atomically (GQA, per-token and per-head inputs).
inline float atomicAdd(float* p, float value) { return std::atomic_ref<float>(*p).fetch_add(value); }

#include "backward_kernels.inc"

using namespace ladle;

namespace {

using Extra = std::variant<std::uint64_t, long long, int, float>;
std::uint64_t address(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

KernelArgs pack(const cuda::BackwardKernel& kernel, const ir::Variant& variant, const cpu::RecurrentArgs& a,
                const std::map<std::string, Extra>& extras) {
  KernelArgs packed;
  for (const cuda::KernelParam& p : kernel.params) REQUIRE(gpu::detail::pack_input(packed, p, variant, a));
  for (const std::string& name : kernel.extra_params) {
    const auto found = extras.find(name);
    INFO("kernel parameter " << name);
    REQUIRE(found != extras.end());
    std::visit([&](auto value) { packed.add(value); }, found->second);
  }
  return packed;
}

double worst(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double w = 0.0;
  for (std::size_t e = 0; e < got.size(); ++e) w = std::max(w, std::abs(double(got[e]) - want[e]) / std::max(1.0, std::abs(double(want[e]))));
  return w;
}

}  // namespace

TEST_CASE("the backward's slots and chain kernels, run on the host emulation, compute what the CPU path computes",
          "[codegen][backward][emulation]") {
  int index = 0;
  for (const backward_cases::Case& c : backward_cases::all()) {
    INFO(c.name);
    std::mt19937_64 rng(static_cast<std::uint64_t>(4100 + index));
    const std::int64_t B = c.B, T = c.T, H = c.H, K = c.K, V = c.V;
    const std::int64_t N = c.cu_seqlens.empty() ? B : static_cast<std::int64_t>(c.cu_seqlens.size()) - 1;
    std::vector<test::Filled> keep;
    keep.reserve(16);
    const auto add = [&](test::Filled f) -> const Tensor& {
      keep.push_back(std::move(f));
      return keep.back().tensor;
    };
    const Tensor& q = add(test::normal(rng, DType::f32, {B, T, H, K}));
    const Tensor& k = add(test::normal(rng, DType::f32, {B, T, c.H_kv, K}));
    const Tensor& v = add(test::normal(rng, DType::f32, {B, T, c.H_kv, V}));
    VariantInputs inputs;
    for (const ir::Input& in : c.variant.inputs) {
      if (in.kind == ir::InputKind::scalar) {
        inputs.scalars.emplace(in.name, 0.3f);
        continue;
      }
      if (in.role != ir::Role::other) continue;
      const std::vector<std::int64_t> shape = in.kind == ir::InputKind::head         ? std::vector<std::int64_t>{H}
                                              : in.kind == ir::InputKind::token_head ? std::vector<std::int64_t>{B, T, H}
                                              : std::vector<std::int64_t>{B, T, H, in.kind == ir::InputKind::token_value ? V : K};
      std::uniform_real_distribution<double> tau(8.0, 16.0);
      const Tensor& t = in.name == "tau"                  ? add(test::filled(DType::f32, shape, [&] { return tau(rng); }))
                            : in.name == "x" || in.name == "s" ? add(test::normal(rng, DType::f32, shape))
                                                               : add(test::log_gate(rng, DType::f32, shape));
      inputs.tensors.emplace(in.name, t.view());
    }
    RunOptions options;
    options.reverse = c.reverse;
    Tensor offsets(DType::i64, {static_cast<std::int64_t>(c.cu_seqlens.size())});
    std::copy(c.cu_seqlens.begin(), c.cu_seqlens.end(), static_cast<std::int64_t*>(offsets.data()));
    if (!c.cu_seqlens.empty()) options.cu_seqlens = offsets.view();
    const ops::BoundInputs bound = ops::bind_inputs(c.name, c.variant, q.view(), k.view(), v.view(), inputs, options);
    const cpu::RecurrentArgs& a = bound.args;
    const cpu::RecurrentSlotTensors slots = cpu::materialize_slots(c.variant, a);
    const bool decays_v = c.variant.has(ir::Slot::log_decay_v);

    // The steps of each sequence, in the recurrence's order.
    const auto bounds = [&](std::int64_t n) {
      return c.cu_seqlens.empty() ? std::pair<std::int64_t, std::int64_t>{0, T}
                                  : std::pair{c.cu_seqlens[static_cast<std::size_t>(n)], c.cu_seqlens[static_cast<std::size_t>(n) + 1]};
    };
    const auto row = [&](std::int64_t n, std::int64_t step, std::int64_t h) {
      const auto [bos, eos] = bounds(n);
      const std::int64_t b = c.cu_seqlens.empty() ? n : 0, t = c.reverse ? eos - 1 - step : bos + step;
      return (b * T + t) * H + h;
    };
    std::int64_t longest = 0;
    for (std::int64_t n = 0; n < N; ++n) longest = std::max(longest, bounds(n).second - bounds(n).first);
    const std::int64_t C = (longest + cuda::backward_chunk - 1) / cuda::backward_chunk, rows = B * T * H;
    const unsigned threads = cuda::backward_threads(K, V);

    const Tensor& d_o = add(test::normal(rng, DType::f32, {B, T, H, V}));
    const auto d_o_at = [&](std::int64_t r, std::int64_t j) { return static_cast<const float*>(d_o.data())[r * V + j]; };
    std::vector<float> qs(rows * K), kf(rows * K), vf(rows * V), dos(rows * V), log_a(rows * K), log_a_next(rows * K), log_b(rows * V),
        log_b_next(rows * V), first_decay(N * H * (K + V), -7.0f);
    std::map<std::string, Extra> extras{
        {"B", int(B)}, {"T", int(T)}, {"H", int(H)}, {"K", int(K)}, {"V", int(V)}, {"VS", int(V)}, {"C", int(C)},
        {"cu_seqlens", address(offsets.data())}, {"qs", address(qs.data())}, {"kf", address(kf.data())}, {"vf", address(vf.data())},
        {"dos", address(dos.data())}, {"log_a", address(log_a.data())}, {"log_a_next", address(log_a_next.data())},
        {"log_b", address(log_b.data())}, {"log_b_next", address(log_b_next.data())}, {"first_decay", address(first_decay.data())},
        {"d_out", address(d_o.data())},
        {"d_out_stride_b", (long long)(T * H * V)}, {"d_out_stride_t", (long long)(H * V)}, {"d_out_stride_h", (long long)V},
        {"d_out_stride_d", 1LL}};

    // ---- slots
    {
      const cuda::BackwardKernel kernel = cuda::generate_backward(c.variant, backward_cases::spec(c, cuda::BackwardPhase::slots));
      REQUIRE(kernel.name == emulated_backward_kernels[index].name);  // the build-time sources are this generator's
      KernelArgs packed = pack(kernel, c.variant, a, extras);
      cuda_emulation::launch(unsigned(C), unsigned(N * H), threads, [&] { emulated_backward_kernels[index].launch(packed.data()); });
      std::vector<float> want_qs(rows * K), want_dos(rows * V), want_a_next(rows * K, 0.0f), want_b_next(rows * V, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t f = 0; f < K; ++f) want_qs[r * K + f] = slots.q[r * K + f] * slots.scale[r];
        for (std::int64_t j = 0; j < V; ++j) want_dos[r * V + j] = d_o_at(r, j);
      }
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t s = 0; s + 1 < bounds(n).second - bounds(n).first; ++s) {
            std::copy_n(&slots.log_a[row(n, s + 1, h) * K], K, &want_a_next[row(n, s, h) * K]);
            std::copy_n(&slots.log_b[row(n, s + 1, h) * V], V, &want_b_next[row(n, s, h) * V]);
          }
      CHECK(worst(qs, want_qs) < 1e-6);
      CHECK(worst(kf, slots.k) < 1e-6);
      CHECK(worst(vf, slots.v) < 1e-6);
      CHECK(worst(dos, want_dos) == 0.0);
      CHECK(worst(log_a, slots.log_a) < 1e-6);
      CHECK(worst(log_a_next, want_a_next) < 1e-6);
      // The total log decays at each sequence's first step, 0 on a side without decays.
      std::vector<float> want_first(first_decay.size(), 0.0f);
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H; ++h) {
          if (bounds(n).second == bounds(n).first) continue;
          std::copy_n(&slots.log_a[row(n, 0, h) * K], K, &want_first[(n * H + h) * (K + V)]);
          std::copy_n(&slots.log_b[row(n, 0, h) * V], V, &want_first[(n * H + h) * (K + V) + K]);
        }
      for (std::int64_t n = 0; n < N; ++n)  // an empty sequence's entries are not written
        if (bounds(n).second == bounds(n).first)
          for (std::int64_t e = n * H * (K + V); e < (n + 1) * H * (K + V); ++e) want_first[e] = -7.0f;
      CHECK(worst(first_decay, want_first) < 1e-6);
      if (decays_v) {
        CHECK(worst(log_b, slots.log_b) < 1e-6);
        CHECK(worst(log_b_next, want_b_next) < 1e-6);
      }
    }
    ++index;

    // ---- chain: random recurrence outputs and carries; the same running sums and the CPU chain rule
    {
      std::normal_distribution<float> unit(0.0f, 1.0f);
      const auto random = [&](std::int64_t n) {
        std::vector<float> x(static_cast<std::size_t>(n));
        for (float& e : x) e = unit(rng);
        return x;
      };
      const std::vector<float> u = random(rows * K), dks = random(rows * K), dvs = random(rows * V), o_f = random(rows * V),
                               carry = random(N * H * C * (K + V));
      cpu::RecurrentSlotTensors g;
      g.q.resize(rows * K), g.k = dks, g.v = dvs, g.log_a.assign(rows * K, 0.0f), g.log_b.assign(rows * V, 0.0f), g.scale.assign(rows, 0.0f);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t f = 0; f < K; ++f) {
          g.q[r * K + f] = slots.scale[r] * u[r * K + f];
          g.scale[r] += slots.q[r * K + f] * u[r * K + f];
        }
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t blk = 0; blk < C; ++blk) {
            const std::int64_t len = bounds(n).second - bounds(n).first, s0 = blk * cuda::backward_chunk;
            if (s0 >= len) continue;
            const std::int64_t carry_row = ((n * H + h) * C + blk) * (K + V);
            for (std::int64_t f = 0; f < K; ++f) {
              float ga = carry[carry_row + f];
              for (std::int64_t s = std::min(len, s0 + cuda::backward_chunk) - 1; s >= s0; --s) {
                const std::int64_t r = row(n, s, h);
                ga += slots.q[r * K + f] * slots.scale[r] * u[r * K + f] - slots.k[r * K + f] * dks[r * K + f];
                g.log_a[r * K + f] = ga;
              }
            }
            if (decays_v)
              for (std::int64_t j = 0; j < V; ++j) {
                float gb = carry[carry_row + K + j];
                for (std::int64_t s = std::min(len, s0 + cuda::backward_chunk) - 1; s >= s0; --s) {
                  const std::int64_t r = row(n, s, h);
                  gb += o_f[r * V + j] * d_o_at(r, j) - slots.v[r * V + j] * dvs[r * V + j];
                  g.log_b[r * V + j] = gb;
                }
              }
          }
      // The inputs' gradients: the CPU chain rule's, and the kernel's.
      std::vector<Tensor> want, got;
      std::vector<std::optional<TensorView>> d_tensors(c.variant.inputs.size());
      for (std::size_t i = 0; i < c.variant.inputs.size(); ++i) {
        const ir::Input& in = c.variant.inputs[i];
        if (in.kind == ir::InputKind::scalar) continue;
        const TensorView& given = in.role == ir::Role::query ? q.view() : in.role == ir::Role::key ? k.view() : in.role == ir::Role::value ? v.view()
                                                                                                               : inputs.tensors.at(in.name);
        want.emplace_back(DType::f32, given.shape, 0.0f);
        got.emplace_back(DType::f32, given.shape, 0.0f);
      }
      want.reserve(want.size()), got.reserve(got.size());
      std::size_t slot = 0;
      for (std::size_t i = 0; i < c.variant.inputs.size(); ++i) {
        const ir::Input& in = c.variant.inputs[i];
        if (in.kind == ir::InputKind::scalar) continue;
        const int rank = in.kind == ir::InputKind::head ? 2 : in.kind == ir::InputKind::token_head ? 3 : 4;
        TensorView canonical = ops::detail::lead_with_ones(want[slot].view(), rank);
        if (in.kind == ir::InputKind::head) canonical.shape[0] = B;  // [H] broadcasts over B
        d_tensors[i] = canonical;
        const TensorView mine = ops::detail::lead_with_ones(got[slot].view(), rank);
        const std::string key = "d/" + in.name;
        extras[key] = address(mine.data);
        extras[key + "/sb"] = (long long)(in.kind == ir::InputKind::head && got[slot].view().rank() == 1 ? 0 : mine.strides[0]);
        extras[key + "/st"] = (long long)(rank >= 3 ? mine.strides[1] : 0);
        extras[key + "/sh"] = (long long)mine.strides[rank == 2 ? 1 : 2];
        extras[key + "/sd"] = (long long)(rank == 4 ? mine.strides[3] : 0);
        ++slot;
      }
      cpu::chain_slot_gradients(c.variant, a, g, d_tensors);
      extras["u"] = address(u.data()), extras["dks"] = address(dks.data()), extras["dvs"] = address(dvs.data());
      extras["o_f"] = address(o_f.data()), extras["carry"] = address(carry.data());
      const cuda::BackwardKernel kernel = cuda::generate_backward(c.variant, backward_cases::spec(c, cuda::BackwardPhase::chain));
      REQUIRE(kernel.name == emulated_backward_kernels[index].name);
      KernelArgs packed = pack(kernel, c.variant, a, extras);
      cuda_emulation::launch(unsigned(C), unsigned(N * H), threads, [&] { emulated_backward_kernels[index].launch(packed.data()); });
      slot = 0;
      for (std::size_t i = 0; i < c.variant.inputs.size(); ++i) {
        if (c.variant.inputs[i].kind == ir::InputKind::scalar) continue;
        const double error = test::relative_error(got[slot], test::values_of(want[slot]));
        INFO("d" << c.variant.inputs[i].name << ": relative error " << error);
        CHECK(test::values_of(want[slot]) != std::vector<double>(static_cast<std::size_t>(want[slot].numel()), 0.0));
        CHECK(error < 1e-5);
        ++slot;
      }
    }
    ++index;
  }
  CHECK(index == static_cast<int>(std::size(emulated_backward_kernels)));
}

TEST_CASE("the backward's helper kernels, run on the host emulation, compute what they say", "[codegen][backward][emulation]") {
  std::mt19937_64 rng(4200);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  const auto random = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = unit(rng);
    return x;
  };
  const int N = 2, H = 3, K = 5, V = 4, VS = 5, T = 150, C = 3;  // VS = V + 1: a normalised read's padding
  const std::vector<long long> cu{0, 150, 170};                  // packed: 150 and 20 tokens (3 blocks and 1)
  const std::vector<long long> chunks_of{3, 1};

  SECTION("convert: a strided bf16 state, scaled, into padded [N,H,K,VS] and [N,H,VS,K]") {
    std::vector<ladle_bf16> in(N * H * V * K * 2);
    const std::vector<float> values = random(in.size());
    for (std::size_t e = 0; e < in.size(); ++e) ladle_store(&in[e], values[e]);
    // [N,H,K,V] read with strides (H*V*K*2, V*K*2, 1, K*2): K innermost, every other column set
    const long long s0 = H * V * K * 2, s1 = V * K * 2, s2 = 1, s3 = K * 2;
    std::vector<float> out(N * H * K * VS, -7.0f), out_t(N * H * VS * K, -7.0f);
    cuda_emulation::launch((N * H * K * V + 255) / 256, 1, 256,
                           [&] { ladle_bwd_convert_bf16(in.data(), s0, s1, s2, s3, N, H, K, V, VS, 0.5f, out.data(), out_t.data()); });
    for (int p = 0; p < N * H; ++p)
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < VS; ++j) {
          const float want = j < V ? 0.5f * ladle_load(&in[(p / H) * s0 + (p % H) * s1 + i * s2 + j * s3]) : -7.0f;  // padding untouched
          CHECK(out[(p * K + i) * VS + j] == want);
          CHECK(out_t[(p * VS + j) * K + i] == want);
        }
  }
  SECTION("carry: the later blocks' totals plus factor * sum(d_final * S)") {
    const std::vector<float> totals = random(N * H * C * (K + V)), d_final = random(N * H * K * VS), s_t = random(N * H * VS * K);
    std::vector<float> carry(totals.size(), -7.0f);
    cuda_emulation::launch((N * H * (K + V) + 255) / 256, 1, 256, [&] {
      ladle_bwd_carry(totals.data(), d_final.data(), 2.0f, s_t.data(), carry.data(), cu.data(), N, T, H, K, V, VS, C);
    });
    for (int p = 0; p < N * H; ++p)
      for (int f = 0; f < K + V; ++f) {
        double acc = 0.0;
        if (f < K)
          for (int j = 0; j < VS; ++j) acc += double(d_final[(p * K + f) * VS + j]) * s_t[(p * VS + j) * K + f];
        else
          for (int i = 0; i < K; ++i) acc += double(d_final[(p * K + i) * VS + f - K]) * s_t[(p * VS + f - K) * K + i];
        acc *= 2.0;
        for (long long c = chunks_of[p / H] - 1; c >= 0; --c) {
          CHECK(std::abs(carry[(p * C + c) * (K + V) + f] - acc) < 1e-4 * std::max(1.0, std::abs(acc)));
          acc += totals[(p * C + c) * (K + V) + f];
        }
        for (long long c = chunks_of[p / H]; c < C; ++c) CHECK(carry[(p * C + c) * (K + V) + f] == -7.0f);  // past the sequence
      }
  }
  SECTION("carry_states: factor sum of S_e A dS_(e+1) B by row and column at each boundary, d_final * S_T after the last") {
    const int TP = 170;  // the packed row: sequences of 150 tokens (blocks 0-2: rows 0 and 1 of the tables) and 20 (one block)
    const std::vector<long long> first{0, 2};
    const std::vector<float> s_states = random(2 * H * K * V), d_states = random(2 * H * K * V), d_final = random(N * H * K * V),
                             s_t = random(N * H * V * K), log_h = random(TP * H);
    std::vector<ladle_bf16> log_a(TP * H * K);
    std::vector<ladle_f16> log_b(TP * H * V);
    for (auto& x : log_a) ladle_store(&x, 0.3f * unit(rng));
    for (auto& x : log_b) ladle_store(&x, 0.3f * unit(rng));
    for (const int reverse : {0, 1}) {
      INFO("reverse " << reverse);
      std::vector<float> carry(N * H * C * (K + V), -7.0f);
      cuda_emulation::launch(C, N * H, 256, [&] {
        ladle_bwd_carry_states(s_states.data(), d_states.data(), first.data(), first.data(), log_a.data(), 1, log_h.data(), log_b.data(), 2,
                               d_final.data(), 2.0f, s_t.data(), carry.data(), cu.data(), N, TP, H, K, V, C, reverse);
      });
      for (int p = 0; p < N * H; ++p) {
        const int n = p / H, h = p % H;
        const long long bos = cu[n], eos = cu[n + 1], chunks = chunks_of[n];
        for (long long c = 0; c < C; ++c)
          for (int f = 0; f < K + V; ++f) {
            const float got = carry[(p * C + c) * (K + V) + f];
            if (c >= chunks) {
              CHECK(got == -7.0f);  // past the sequence
              continue;
            }
            double want = 0.0;
            if (c == chunks - 1) {
              for (int x = 0; x < (f < K ? V : K); ++x) {
                const int i = f < K ? f : x, j = f < K ? x : f - K;
                want += double(d_final[(p * K + i) * V + j]) * s_t[(p * V + j) * K + i];
              }
            } else {
              const long long e = c * 64 + 63, t = reverse ? eos - 1 - e : bos + e, r = t * H + h;
              const long long srow = first[n] + c, drow = first[n] + chunks - 2 - c;
              for (int x = 0; x < (f < K ? V : K); ++x) {
                const int i = f < K ? f : x, j = f < K ? x : f - K;
                const double decay = std::exp(double(ladle_load(&log_a[r * K + i])) + log_h[r] + double(ladle_load(&log_b[r * V + j])));
                want += decay * s_states[((srow * H + h) * K + i) * V + j] * d_states[((drow * H + h) * K + i) * V + j];
              }
            }
            want *= 2.0;
            CHECK(std::abs(got - want) < 1e-4 * std::max(1.0, std::abs(want)));
          }
      }
    }
  }
  SECTION("initial: factor exp(log_a_0) dS_0 exp(log_b_0), dS_0 read from [N,H,K,VS]") {
    const std::vector<float> ds0 = random(N * H * K * VS), first = random(N * H * (K + V));
    std::vector<float> d_h0(N * H * K * V, -7.0f);
    const std::vector<long long> with_empty{0, 150, 150};  // the second sequence empty: dS_0 alone
    cuda_emulation::launch((N * H * K * V + 255) / 256, 1, 256,
                           [&] { ladle_bwd_initial(ds0.data(), first.data(), 0.5f, d_h0.data(), with_empty.data(), N, T, H, K, V, VS); });
    for (int p = 0; p < N * H; ++p)
      for (int i = 0; i < K; ++i)
        for (int j = 0; j < V; ++j) {
          double want = 0.5 * ds0[(p * K + i) * VS + j];
          if (p / H == 0) want *= std::exp(double(first[p * (K + V) + i]) + first[p * (K + V) + K + j]);
          CHECK(std::abs(d_h0[(p * K + i) * V + j] - want) < 1e-5 * std::max(1.0, std::abs(want)));
        }
  }
  SECTION("normalized: do' = do / den over V columns, then -sum(do num) / den^2") {
    const int B = 1, TT = 7;
    std::vector<float> num = random(B * TT * H * (V + 1)), d_out = random(B * TT * H * V), d_num(num.size(), -7.0f);
    for (int r = 0; r < B * TT * H; ++r) num[r * (V + 1) + V] = 1.5f + std::abs(num[r * (V + 1) + V]);  // den away from 0
    cuda_emulation::launch((B * TT * H * 32 + 255) / 256, 1, 256, [&] {
      ladle_bwd_normalized_f32(num.data(), d_out.data(), TT * H * V, H * V, V, 1, B, TT, H, V, 1e-6f, d_num.data());
    });
    for (int r = 0; r < B * TT * H; ++r) {
      const double den = num[r * (V + 1) + V] + 1e-6;
      double dot = 0.0;
      for (int j = 0; j < V; ++j) {
        CHECK(std::abs(d_num[r * (V + 1) + j] - d_out[r * V + j] / den) < 1e-6);
        dot += double(d_out[r * V + j]) * num[r * (V + 1) + j];
      }
      CHECK(std::abs(d_num[r * (V + 1) + V] + dot / (den * den)) < 1e-5);
    }
  }
}

// ladle_bwd_block_bf16 against the plain form's recurrence token by token in fp64: the states it
// reads at the blocks' boundaries are that recurrence's (rounded to fp32), as the backward's state
// passes give them; u and dk must be the recurrence's scale S_t do_t and dS_t v_t. The decays'
// gradients are sums of qs . u - kf . dk whose terms cancel inside a block: those sums must hold fp32
// precision (1e-4 of the terms' magnitude; the recurrences' bf16-rounded outputs, which this kernel
// replaces, were about 2e-3 off).
TEST_CASE("ladle_bwd_block_bf16, on the host emulation: u and dk of the plain form from the boundary states, block sums at fp32 precision",
          "[codegen][backward][emulation]") {
  STATIC_REQUIRE(LADLE_BLOCK_SHARED == cuda::backward_block_shared);
  STATIC_REQUIRE(LADLE_BLOCK_FEATURES == cuda::backward_block_features);
  STATIC_REQUIRE(LADLE_BLOCK_STEPS == cuda::backward_chunk);
  STATIC_REQUIRE(LADLE_BLOCK_KEYS == cuda::backward_block_keys);
  struct Case {
    const char* name;
    int B, T, H, K, V;
    std::vector<long long> cu;  // empty: B sequences of T
    bool key, head, reverse, h0, d_final;
    int a_type;  // log_a's and log_a_next's: 0 f32, 1 bf16
  };
  const std::vector<Case> cases{
      {"packed (150, 0, 20 tokens, 5 outside), a bf16 key decay, h0 and d_final, K 40 V 24", 1, 175, 2, 40, 24, {0, 150, 150, 170}, true,
       false, false, true, true, 1},
      {"the same reversed, key and head decay together, f32", 1, 175, 2, 40, 24, {0, 150, 150, 170}, true, true, true, true, true, 0},
      {"a head decay alone, K = V = 128, B 2 T 130, no initial state", 2, 130, 1, 128, 128, {}, false, true, false, false, false, 0},
      {"a key decay with strong steps, K 128 V 72, reversed, d_final only", 1, 64, 2, 128, 72, {}, true, false, true, false, true, 0},
  };
  for (const Case& cs : cases) {
    INFO(cs.name);
    std::mt19937_64 rng(4300 + cs.K + cs.T);
    std::uniform_real_distribution<float> sym(-1.0f, 1.0f), decay(0.0f, 0.6f);
    const int B = cs.B, T = cs.T, H = cs.H, K = cs.K, V = cs.V, VP = V + 3;  // do strided: rows VP apart
    const int N = cs.cu.empty() ? B : static_cast<int>(cs.cu.size()) - 1;
    const long long rows = static_cast<long long>(B) * T * H;
    const float scale = 0.7f;
    const auto bf16s = [&](std::size_t count) {
      std::vector<ladle_bf16> x(count);
      for (auto& e : x) ladle_store(&e, sym(rng));
      return x;
    };
    const std::vector<ladle_bf16> q = bf16s(rows * K), k = bf16s(rows * K), v = bf16s(rows * V), d_out = bf16s(rows * VP);
    std::vector<float> log_a32(rows * K), log_h(rows);
    std::vector<ladle_bf16> log_a16(rows * K);
    for (long long e = 0; e < rows * K; ++e) {
      float x = -decay(rng);
      if (!cs.cu.empty() || cs.T == 64) x = e % 97 == 0 ? -40.0f : x;  // strong steps: factors that underflow
      ladle_store(&log_a16[e], x);
      log_a32[e] = cs.a_type == 1 ? ladle_load(&log_a16[e]) : x;
    }
    for (float& x : log_h) x = -0.5f * decay(rng);
    const auto la = [&](long long r, int i) { return (cs.key ? double(log_a32[r * K + i]) : 0.0) + (cs.head ? double(log_h[r]) : 0.0); };
    std::vector<float> h0(N * H * K * V), d_final(N * H * K * V);
    for (float& x : h0) x = sym(rng);
    for (float& x : d_final) x = sym(rng);

    // The sequences, their chunks and the tables' first rows (as ops/gpu_backward.cpp lays them out).
    std::vector<long long> bos(N), len(N), s_first(N), first(N);
    long long s_rows = 0, d_rows = 0;
    for (int n = 0; n < N; ++n) {
      bos[n] = cs.cu.empty() ? 0 : cs.cu[n], len[n] = cs.cu.empty() ? T : cs.cu[n + 1] - cs.cu[n];
      const long long chunks = (len[n] + 63) / 64;
      s_first[n] = s_rows + 1, first[n] = d_rows;
      s_rows += chunks, d_rows += chunks > 0 ? chunks - 1 : 0;
    }
    const long long area = static_cast<long long>(K) * V;
    std::vector<float> s_states(std::max(1LL, s_rows) * H * area, -7.0f), d_states(std::max(1LL, d_rows) * H * area, -7.0f);
    std::vector<float> log_a_next32(rows * K, 0.0f), log_h_next(rows, 0.0f);
    std::vector<ladle_bf16> log_a_next16(rows * K);
    std::vector<double> u_want(rows * K, -7.0), dk_want(rows * K, -7.0);
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < H; ++h) {
        const int b = cs.cu.empty() ? n : 0, p = n * H + h;
        const auto row = [&](long long s) {
          return (static_cast<long long>(b) * T + (cs.reverse ? bos[n] + len[n] - 1 - s : bos[n] + s)) * H + h;
        };
        std::vector<double> S(area, 0.0);
        if (cs.h0)
          for (long long e = 0; e < area; ++e) S[e] = h0[p * area + e];
        for (long long s = 0; s < len[n]; ++s) {
          const long long r = row(s);
          if (s % 64 == 0)
            for (long long e = 0; e < area; ++e) s_states[((s_first[n] - 1 + s / 64) * H + h) * area + e] = static_cast<float>(S[e]);
          for (int i = 0; i < K; ++i)
            for (int j = 0; j < V; ++j)
              S[i * V + j] = std::exp(la(r, i)) * S[i * V + j] + double(ladle_load(&k[r * K + i])) * ladle_load(&v[r * V + j]);
          for (int i = 0; i < K; ++i) {
            double acc = 0.0;
            for (int j = 0; j < V; ++j) acc += S[i * V + j] * ladle_load(&d_out[r * VP + j]);
            u_want[r * K + i] = scale * acc;
          }
          const bool last = s + 1 == len[n];
          for (int i = 0; i < K; ++i) {
            const double next = last ? 0.0 : (cs.key ? double(log_a32[row(s + 1) * K + i]) : 0.0);
            ladle_store(&log_a_next16[r * K + i], static_cast<float>(next));
            log_a_next32[r * K + i] = static_cast<float>(next);
          }
          log_h_next[r] = last ? 0.0f : log_h[row(s + 1)];
        }
        std::vector<double> R(area, 0.0);
        if (cs.d_final)
          for (long long e = 0; e < area; ++e) R[e] = d_final[p * area + e];
        const long long chunks = (len[n] + 63) / 64;
        for (long long s = len[n] - 1; s >= 0; --s) {
          const long long r = row(s), c = s / 64;
          if ((s % 64 == 63 || s + 1 == len[n]) && c < chunks - 1)
            for (long long e = 0; e < area; ++e) d_states[((first[n] + chunks - 2 - c) * H + h) * area + e] = static_cast<float>(R[e]);
          const bool last = s + 1 == len[n];
          for (int i = 0; i < K; ++i)
            for (int j = 0; j < V; ++j) {
              const double next = last ? 0.0 : la(row(s + 1), i);
              R[i * V + j] = std::exp(next) * R[i * V + j] + double(ladle_load(&q[r * K + i])) * ladle_load(&d_out[r * VP + j]);
            }
          for (int i = 0; i < K; ++i) {
            double acc = 0.0;
            for (int j = 0; j < V; ++j) acc += R[i * V + j] * ladle_load(&v[r * V + j]);
            dk_want[r * K + i] = scale * acc;
          }
        }
      }

    std::vector<float> u(rows * K, -7.0f), dk(rows * K, -7.0f);
    const long long kst = static_cast<long long>(H) * K, vst = static_cast<long long>(H) * V, ost = static_cast<long long>(H) * VP;
    const void* log_a = cs.key ? (cs.a_type == 1 ? static_cast<const void*>(log_a16.data()) : log_a32.data()) : nullptr;
    const void* log_a_next = cs.key ? (cs.a_type == 1 ? static_cast<const void*>(log_a_next16.data()) : log_a_next32.data()) : nullptr;
    const int C = static_cast<int>((*std::max_element(len.begin(), len.end()) + 63) / 64);
    cuda_emulation::launch(C, N * H, (K + cuda::backward_block_keys - 1) / cuda::backward_block_keys, 256, [&] {
      ladle_bwd_block_bf16(q.data(), T * kst, kst, K, 1, k.data(), T * kst, kst, K, 1, v.data(), T * vst, vst, V, 1, d_out.data(), T * ost, ost,
                           VP, 1, log_a, T * kst, kst, K, 1, cs.a_type, cs.head ? log_h.data() : nullptr, log_a_next, cs.a_type,
                           cs.head ? log_h_next.data() : nullptr, s_states.data(), s_first.data(), cs.h0 ? h0.data() : nullptr,
                           d_states.data(), first.data(), cs.d_final ? d_final.data() : nullptr, scale, u.data(), T * kst, kst, K, 1,
                           dk.data(), T * kst, kst, K, 1, cs.cu.empty() ? nullptr : cs.cu.data(), T, H, K, V, cs.reverse ? 1 : 0);
    });
    double worst_u = 0.0, worst_dk = 0.0, worst_sum = 0.0;
    for (long long e = 0; e < rows * K; ++e) {
      if (u_want[e] == -7.0) {  // a token outside every sequence: untouched
        CHECK(u[e] == -7.0f);
        CHECK(dk[e] == -7.0f);
        continue;
      }
      worst_u = std::max(worst_u, std::abs(u[e] - u_want[e]) / (1.0 + std::abs(u_want[e])));
      worst_dk = std::max(worst_dk, std::abs(dk[e] - dk_want[e]) / (1.0 + std::abs(dk_want[e])));
    }
    // The decays' block sums: sum over a block's tokens of q u - k dk per feature, against the terms' size.
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < H; ++h)
        for (long long c = 0; c * 64 < len[n]; ++c)
          for (int i = 0; i < K; ++i) {
            double got = 0.0, want = 0.0, size = 0.0;
            for (long long s = c * 64; s < std::min(len[n], c * 64 + 64); ++s) {
              const int b = cs.cu.empty() ? n : 0;
              const long long r = (static_cast<long long>(b) * T + (cs.reverse ? bos[n] + len[n] - 1 - s : bos[n] + s)) * H + h;
              const double qi = ladle_load(&q[r * K + i]), ki = ladle_load(&k[r * K + i]);
              got += qi * u[r * K + i] - ki * dk[r * K + i];
              want += qi * u_want[r * K + i] - ki * dk_want[r * K + i];
              size += std::abs(qi * u_want[r * K + i]) + std::abs(ki * dk_want[r * K + i]);
            }
            worst_sum = std::max(worst_sum, std::abs(got - want) / std::max(1e-30, size));
          }
    INFO("worst u " << worst_u << ", dk " << worst_dk << ", block sums " << worst_sum << " of their terms' size");
    CHECK(worst_u < 1e-4);
    CHECK(worst_dk < 1e-4);
    CHECK(worst_sum < 1e-4);
    WARN(cs.name << ": worst u " << worst_u << ", dk " << worst_dk << ", block sums " << worst_sum);
  }
}
