#include "update_backward.h"

#include <cstdio>
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
  return key + "|" + std::to_string(s.block_v);
}

}  // namespace

std::string update_backward_name(const UpdateBackwardSpec& spec) {
  return "ladle_bwd_update_" + detail::hex(detail::fnv1a(spec_key(spec)));
}

std::string update_backward_source(const UpdateBackwardSpec& spec) {
  if (spec.block_v != 8 && spec.block_v != 16 && spec.block_v != 32)
    throw InvalidArgument("update_backward_source: block_v must be 8, 16 or 32, got " + std::to_string(spec.block_v));
  if (spec.delta && spec.bonus) throw InvalidArgument("update_backward_source: a bonus belongs to a read before the update");
  if (spec.key_decay && spec.head_decay)
    throw InvalidArgument("update_backward_source: a head decay beside a key-side one is folded into log_a (head_decay false)");
  // The form as codegen/device/update_backward.cuh's bits, spelled out for the reader.
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
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9gf", static_cast<double>(ir::l2_normalize_eps));
  // The most threads update_backward_block_v allows for block_v, and blocks an SM: registers capped
  // at 64 (block_v 8) and 128 (16) a thread, what those forms need without spilling (NVRTC's ptxas
  // report); block_v 32 takes up to 255 (168 used).
  const int threads = spec.block_v == 32 ? 128 : spec.block_v == 16 ? 256 : 512, blocks = spec.block_v == 32 ? 1 : 2;
  std::string s = "// ladle: the update forms' recurrent backward (codegen/cuda/update_backward.cpp; do not edit).\n// " +
                  std::string(spec.delta ? "the delta rule" : "a read before the update") + ", " + std::to_string(spec.block_v) +
                  " value columns a block; " + spec_key(spec) + "\n";
  s += "#include <ladle/codegen/device/storage.cuh>\n#include <ladle/codegen/device/update_backward.cuh>\n\n";
  s += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) + ", " + std::to_string(blocks) + ") " + update_backward_name(spec) + "(\n";
  s += R"(    const float* __restrict__ qs, const float* __restrict__ kf, const float* __restrict__ vf, const float* __restrict__ dos,
    const float* __restrict__ log_a, const float* __restrict__ log_h, const float* __restrict__ scale_s, float scale,
    const float* __restrict__ beta_s, const float* __restrict__ bonus_s, const float* __restrict__ h0,
    const float* __restrict__ d_final, float* __restrict__ ckpt, float* __restrict__ chunk, float* __restrict__ gq,
    float* __restrict__ gk, float* __restrict__ gv, float* __restrict__ ga, float* __restrict__ gbeta,
    float* __restrict__ gbonus, float* __restrict__ d_h0, const long long* __restrict__ cu_seqlens, int T, int H, int K,
    int V, int C) {
  const LadleUpdateArgs args{qs, kf, vf, dos, log_a, log_h, scale_s, scale, beta_s, bonus_s, h0, d_final, ckpt, chunk,
                             gq, gk, gv, ga, gbeta, gbonus, d_h0, cu_seqlens, T, H, K, V, C, )";
  s += std::string(eps) + "};\n";
  s += "  ladle_update_backward<" + std::to_string(spec.block_v) + ", " + form + ">(args);\n}\n";
  return s;
}

}  // namespace ladle::cuda
