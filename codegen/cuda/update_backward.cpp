#include "update_backward.h"

#include <cstdio>
#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

#include <ladle/dsl/ir.h>
#include <ladle/runtime/error.h>

#include "detail/cuda_source.h"

namespace ladle::cuda {

int update_backward_block_v(std::int64_t key_dim, bool delta) {
  if (const char* forced = std::getenv("LADLE_UPDATE_BWD_BLOCK_V")) {  // a measurement knob: 8, 16 or 32 where K allows
    const int v = std::atoi(forced);
    if ((v == 8 && key_dim <= 512) || (v == 16 && key_dim <= 256) || (v == 32 && key_dim <= 128)) return v;
  }
  // The fastest of 8, 16 and 32 at K = 128 (an H100, B8 T4096 H16): 16 for the delta rule and KDA,
  // 8 for RWKV6's read before the update, 7 % ahead of 16 (bench/RESULTS.md, "Issue 36: the update
  // forms' backward on the GPU").
  if (key_dim <= 256) return delta ? 16 : 8;
  if (key_dim <= 512) return 8;
  throw InvalidArgument("the GPU backward of the update forms takes K up to 512 (a thread per row of the state), got K = " +
                        std::to_string(key_dim) + "; options.backend = cpu trains larger K on the CPU");
}

namespace {

std::string spec_key(const UpdateBackwardSpec& s) {
  std::string key = "update-bwd-1|";
  for (bool flag : {s.delta, s.key_decay, s.head_decay, s.beta, s.bonus, s.l2, s.scale_table, s.reverse, s.varlen, s.initial_state, s.d_final})
    key += flag ? '1' : '0';
  return key + "|" + (s.chunked ? "wy" + std::to_string(s.block_k) : std::to_string(s.block_v));
}

// The form as codegen/device/update_backward.cuh's bits, spelled out for the reader.
std::string form_bits(const UpdateBackwardSpec& spec) {
  std::vector<std::string> bits;
  const auto bit = [&](bool on, const char* name) {
    if (on) bits.push_back(name);
  };
  bit(spec.delta, "ladle_upd_delta"), bit(spec.key_decay, "ladle_upd_key_decay"), bit(spec.head_decay, "ladle_upd_head");
  bit(spec.beta, "ladle_upd_beta"), bit(spec.bonus, "ladle_upd_bonus"), bit(spec.l2, "ladle_upd_l2");
  bit(spec.scale_table, "ladle_upd_scale_table"), bit(spec.reverse, "ladle_upd_reverse"), bit(spec.varlen, "ladle_upd_varlen");
  bit(spec.initial_state, "ladle_upd_initial"), bit(spec.d_final, "ladle_upd_d_final");
  std::string form = bits.empty() ? "0u" : bits[0];
  for (std::size_t k = 1; k < bits.size(); ++k) form += " | " + bits[k];
  return form;
}

// The kernels' parameters (update_backward.h) and the LadleUpdateArgs built from them.
constexpr const char* parameters = R"((
    const float* __restrict__ qs, const float* __restrict__ kf, const float* __restrict__ vf, const float* __restrict__ dos,
    const float* __restrict__ log_a, const float* __restrict__ log_h, const float* __restrict__ scale_s, float scale,
    const float* __restrict__ beta_s, const float* __restrict__ bonus_s, const float* __restrict__ h0,
    const float* __restrict__ d_final, float* __restrict__ ckpt, float* __restrict__ chunk, float* __restrict__ gq,
    float* __restrict__ gk, float* __restrict__ gv, float* __restrict__ ga, float* __restrict__ gbeta,
    float* __restrict__ gbonus, float* __restrict__ d_h0, const long long* __restrict__ cu_seqlens, int T, int H, int K,
    int V, int C) {
  const LadleUpdateArgs args{qs, kf, vf, dos, log_a, log_h, scale_s, scale, beta_s, bonus_s, h0, d_final, ckpt, chunk,
                             gq, gk, gv, ga, gbeta, gbonus, d_h0, cu_seqlens, T, H, K, V, C, )";

std::string eps_literal() {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9gf", static_cast<double>(ir::l2_normalize_eps));
  return eps;
}

// The chunked form's kernels' shared memory in bytes (wy_backward.cuh's LadleWyShape, mirrored here):
// prepare, states, gradients.
std::array<int, 3> wy_shared(const UpdateBackwardSpec& spec, std::int64_t V) {
  const int c = update_backward_chunk, kp = spec.block_k, lk = kp + 8, lt = 64 + 8, lc = c + 1, lg = kp + 4;
  const int vp = static_cast<int>((V + 63) / 64 * 64), key = spec.key_decay ? 1 : 0;
  const int r = key && 2 * c * lk > c * (vp + 8) ? 2 * c * lk : c * (vp + 8);
  const int stage = 2 * (3 * c * lk + 2 * c * lt) + 4 * (key ? kp : c);  // the states kernel's, twice
  return {2 * (3 * c * lk + r + c * lt + key * c * lk) + 4 * (2 * c * lc + key * c * lg + 4 * c),
          4 * kp * (64 + 4) + 2 * (kp * lt + c * lt) + 2 * stage,
          2 * (2 * c * lk + c * lt + 2 * (2 * kp * lt + 4 * c * lt)) + 4 * (5 * c + 4 + key * 2 * kp)};
}

// The chunked form's kernels: their names, grids and shared memory.
std::vector<UpdateBackwardLaunch> wy_launches(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H, std::int64_t C,
                                              std::int64_t V) {
  const std::string hash = detail::hex(detail::fnv1a(spec_key(spec)));
  const std::int64_t vp = (V + 63) / 64 * 64;
  const auto u = [](std::int64_t x) { return static_cast<unsigned>(x); };
  const std::array<int, 3> shared = wy_shared(spec, V);
  return {
      {"ladle_bwd_wy_prepare_" + hash, {u(C), u(N * H), 1}, 256, shared[0]},
      {"ladle_bwd_wy_states_" + hash, {u(vp / 64), u(N * H), 1}, 256, shared[1]},
      {"ladle_bwd_wy_gradients_" + hash, {u(C), u(N * H), 1}, 256, shared[2]},
  };
}

}  // namespace

std::string update_backward_name(const UpdateBackwardSpec& spec) {
  return "ladle_bwd_update_" + detail::hex(detail::fnv1a(spec_key(spec)));
}

std::string update_backward_unchunked(const UpdateBackwardSpec& spec, std::int64_t key_dim, std::int64_t value_dim) {
  if (!spec.delta) return "the chunked form runs the delta rule (a read before the update takes the recurrent one)";
  if (key_dim > 128) return "K = " + std::to_string(key_dim) + ", the chunked form takes K up to 128";
  if (value_dim > 0) {
    UpdateBackwardSpec at = spec;
    at.block_k = update_backward_block_k(key_dim);
    for (const int bytes : wy_shared(at, value_dim))
      if (bytes > update_backward_shared_limit)
        return "V = " + std::to_string(value_dim) + ", a chunked kernel would need " + std::to_string(bytes) + " bytes of shared memory (at most " +
               std::to_string(update_backward_shared_limit) + ")";
  }
  return {};
}

std::string update_backward_source(const UpdateBackwardSpec& spec) {
  if (spec.delta && spec.bonus) throw InvalidArgument("update_backward_source: a bonus belongs to a read before the update");
  if (spec.key_decay && spec.head_decay)
    throw InvalidArgument("update_backward_source: a head decay beside a key-side one is folded into log_a (head_decay false)");
  const std::string form = form_bits(spec), eps = eps_literal();
  if (spec.chunked) {
    if (const std::string why = update_backward_unchunked(spec, spec.block_k); !why.empty()) throw InvalidArgument("update_backward_source: " + why);
    if (spec.block_k != 64 && spec.block_k != 128)
      throw InvalidArgument("update_backward_source: block_k must be 64 or 128, got " + std::to_string(spec.block_k));
    std::string s = "// ladle: the delta rule's chunked WY backward (codegen/cuda/update_backward.cpp; do not edit).\n// " + spec_key(spec) + "\n";
    s += "#include <ladle/codegen/device/storage.cuh>\n#include <ladle/codegen/device/tensor_core.cuh>\n";
    s += "#include <ladle/codegen/device/block_mma.cuh>\n#include <ladle/codegen/device/update_backward.cuh>\n";
    s += "#include <ladle/codegen/device/wy_backward.cuh>\n#include <ladle/codegen/device/wy_gradients.cuh>\n";
    const std::vector<UpdateBackwardLaunch> launches = wy_launches(spec, 1, 1, 1, 64);
    const char* const steps[] = {"prepare", "states", "gradients"};
    for (std::size_t k = 0; k < launches.size(); ++k) {
      s += "\nextern \"C\" __global__ void __launch_bounds__(256, " + std::string(k == 0 && !spec.key_decay ? "2" : "1") + ") " + launches[k].name + parameters;
      s += eps + "};\n  LadleWy<" + std::to_string(spec.block_k) + ", " + form + ">::" + steps[k] + "(args);\n}\n";
    }
    return s;
  }
  if (spec.block_v != 8 && spec.block_v != 16 && spec.block_v != 32)
    throw InvalidArgument("update_backward_source: block_v must be 8, 16 or 32, got " + std::to_string(spec.block_v));
  // The most threads update_backward_block_v allows for block_v, and blocks an SM: registers capped
  // at 64 (block_v 8) and 128 (16) a thread, what those forms need without spilling (NVRTC's ptxas
  // report); block_v 32 takes up to 255 (168 used).
  const int threads = spec.block_v == 32 ? 128 : spec.block_v == 16 ? 256 : 512, blocks = spec.block_v == 32 ? 1 : 2;
  std::string s = "// ladle: the update forms' recurrent backward (codegen/cuda/update_backward.cpp; do not edit).\n// " +
                  std::string(spec.delta ? "the delta rule" : "a read before the update") + ", " + std::to_string(spec.block_v) +
                  " value columns a block; " + spec_key(spec) + "\n";
  s += "#include <ladle/codegen/device/storage.cuh>\n#include <ladle/codegen/device/update_backward.cuh>\n\n";
  s += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) + ", " + std::to_string(blocks) + ") " + update_backward_name(spec) + parameters;
  s += eps + "};\n";
  s += "  ladle_update_backward<" + std::to_string(spec.block_v) + ", " + form + ">(args);\n}\n";
  return s;
}

std::vector<UpdateBackwardLaunch> update_backward_launches(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H,
                                                           std::int64_t C, std::int64_t K, std::int64_t V) {
  if (spec.chunked) {
    if (const std::string why = update_backward_unchunked(spec, K, V); !why.empty()) throw InvalidArgument("update_backward_launches: " + why);
    if (K > spec.block_k)
      throw InvalidArgument("update_backward_launches: K = " + std::to_string(K) + " past the spec's block_k " + std::to_string(spec.block_k));
    return wy_launches(spec, N, H, C, V);
  }
  UpdateBackwardLaunch one;
  one.name = update_backward_name(spec);
  one.grid[0] = static_cast<unsigned>((V + spec.block_v - 1) / spec.block_v), one.grid[1] = static_cast<unsigned>(N * H);
  one.threads = static_cast<unsigned>((K + 31) / 32 * 32);
  return {one};
}

std::int64_t update_backward_ckpt_floats(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H, std::int64_t C,
                                         std::int64_t K, std::int64_t V) {
  if (spec.chunked) {  // wy_backward.cuh's LadleWyWork: fourteen bf16 arrays, then g in fp32 ([C] a chunk, [C][KP] per feature)
    const std::int64_t c = update_backward_chunk, kp = spec.block_k, vp = (V + 63) / 64 * 64, chunks = N * H * C;
    const std::int64_t halves = chunks * (5 * c * kp + 5 * c * vp + 2 * kp * vp + 2 * c * c);
    return std::max<std::int64_t>(halves / 2 + chunks * c * (spec.key_decay ? kp : 1), 1);
  }
  const std::int64_t slices = (V + spec.block_v - 1) / spec.block_v, KP = (K + 31) / 32 * 32;
  return std::max<std::int64_t>(N * H * slices * C * spec.block_v * KP, 1);
}

std::int64_t update_backward_chunk_floats(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H, std::int64_t K,
                                          std::int64_t V) {
  if (spec.chunked) return 1;
  const std::int64_t slices = (V + spec.block_v - 1) / spec.block_v, KP = (K + 31) / 32 * 32;
  return std::max<std::int64_t>(N * H * slices * update_backward_chunk * spec.block_v * KP, 1);
}

}  // namespace ladle::cuda
