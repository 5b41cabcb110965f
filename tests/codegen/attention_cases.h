// The softmax-attention kernels the codegen-cuda_attention test runs on the host emulation:
// every mask and modifier of the op, a user score modifier and predicate, GQA, varlen with an
// empty sequence, D = 64 / 128 with Dv != D, f16 / bf16 / f32, and a sweep of tiles. Sizes
// are small (one fiber per CUDA thread) but span several tiles and partial ones. The
// last ones (hopper()) run the Hopper paths (mma = wgmma and ws, sm_90a) over the same kinds of cases.
// attention_emit renders them at build time.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ladle/codegen/cuda/attention.h>
#include <ladle/codegen/cuda/attention_backward.h>
#include <ladle/dsl/dsl.h>
#include <ladle/ops/attention.h>

namespace attention_cases {

using ladle::DType;

struct Case {
  std::string name;
  ladle::ir::AttentionVariant variant;
  DType type = DType::bf16;  // q, k, v and o
  int B = 1, Tq = 48, Tk = 48, H = 2, H_kv = 2, D = 64, Dv = 64;
  ladle::cuda::AttentionTile tile{64, 32, 4, 2};
  bool lse = true;
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;  // both or neither
  std::int64_t window_left = -1, window_right = -1;
  int sinks = 0;
  float dropout_p = 0;
  DType segment_type = DType::i64;
  bool user_alibi = false;  // the user variant below (slope, keep predicate)
  double slope_step = 0.05;  // user_alibi: slope[h] = slope_step * (h + 1)
  bool negative_scale = false;  // scale -1.5 / sqrt(D) instead of 1.5 / sqrt(D)

  // The scalar inputs the test binds (index-aligned with the variant's inputs).
  std::vector<float> scalars() const {
    std::vector<float> values(variant.inputs.size(), 0.0f);
    for (std::size_t k = 0; k < variant.inputs.size(); ++k) {
      if (variant.inputs[k].name == "scale") values[k] = (negative_scale ? -1.5f : 1.5f) / std::sqrt(static_cast<float>(D));
      if (variant.inputs[k].name == "logits_soft_cap") values[k] = 2.0f;
    }
    return values;
  }
  bool async_copy = true;   // cp.async staging (16-bit inputs only)
  bool d_output_f32 = false;  // backward: d_output in fp32 (prep copies it to the case's type)
  int stages = 2;             // backward: the q / d_output ring
  bool dq_pairs = false;      // backward: dq added by red.global.add.v2 (the launcher's form for a dq not 16-byte aligned)
  std::string backward_arch = "sm_90a";  // backward: the target (the form follows: ws where it runs, else sync)
  int sync_rows = 0;                      // backward, sync form: the rows a step (0: with_sync_tile's)
  int splits = 0;             // decode tiles: the key splits the test asks for (0: the launcher's attention_decode_split)
  bool persistent = false;    // ws tiles: the persistent form (LADLE_ATTENTION_PERSISTENT=1), else a block per row block
  bool o_wide_rows = false;   // o a view into rows of Dv + 1 elements (odd strides: the epilogue's element stores)

  ladle::cuda::AttentionKernelSpec spec() const {
    ladle::cuda::AttentionKernelSpec s;
    for (const ladle::ir::Input& in : variant.inputs)
      s.input_types.push_back(in.kind == ladle::ir::InputKind::scalar ? DType::f32
                              : in.role != ladle::ir::Role::other     ? type
                              : in.name == "attention_mask"           ? DType::u8
                                                                      : DType::f32);
    s.output_type = type;
    s.D = D;
    s.Dv = Dv;
    s.varlen = !cu_seqlens_q.empty();
    s.lse = lse;
    s.q_segment_ids_type = s.kv_segment_ids_type = segment_type;
    s.async_copy = async_copy;
    s.tile = tile;
    s.persistent = persistent && tile.mma == ladle::cuda::AttentionMma::ws;
    if (tile.mma != ladle::cuda::AttentionMma::sync) s.arch = "sm_90a";
    // As the launcher decides it: the factor folded into p's FFMA where it is positive.
    const std::optional<double> factor = ladle::cuda::attention_logit_factor(variant, scalars());
    s.positive_logit_factor = factor && *factor > 0.0;
    return s;
  }
};

// ALiBi as a user writes it, with a user predicate over the indices, the head and the batch:
//   logit = score * scale - slope[h] * (i - j);  keep j < 2 i + 3 || h + b == 1
inline ladle::ir::AttentionVariant user_alibi() {
  namespace dsl = ladle::dsl;
  const auto logit = dsl::score * dsl::scalar("scale") - dsl::head_param("slope") * (dsl::query_index - dsl::key_index);
  const auto keep = dsl::key_index < dsl::query_index * 2.0f + 3.0f || dsl::head_index + dsl::batch_index == 1.0f;
  return dsl::lower(dsl::softmax(logit).mask(keep), "user_alibi");
}

inline Case make(std::string name, ladle::ir::AttentionVariant variant) {
  Case c;
  c.name = std::move(name);
  c.variant = std::move(variant);
  return c;
}

// The Hopper paths over one set of cases, each with its own tiles (sm_90a): wgmma (one warpgroup
// per 64 rows, cp.async staging) and ws (a TMA producer warpgroup, mbarrier rings, consumer
// warpgroups overlapping wgmma with the softmax). Both: plain, causal Tq < Tk, window, soft cap +
// bias, user ALiBi + predicate, sinks, dropout with mask and segments, GQA, varlen with an empty
// sequence, f16 and bf16, D = 64 and 128, head dims padded inside. wgmma adds one stage and the
// converted-store path; ws adds rings that wrap many times, three and four stages, D = Dv = 256 and
// head dims that are parts of 64-column boxes (the copies' zero fill).
inline std::vector<Case> hopper(ladle::cuda::AttentionMma kind) {
  using Tile = ladle::cuda::AttentionTile;
  const bool ws = kind == ladle::cuda::AttentionMma::ws;
  const auto variant = [](const char* list) { return ladle::attention_variant(ladle::parse_attention_features(list)); };
  std::vector<Case> cases;
  // A case with the tile of this kind (wgmma's, ws's).
  const auto add = [&](Case c, Tile for_wgmma, Tile for_ws) {
    c.name = (ws ? "ws: " : "wgmma: ") + c.name;
    c.tile = ws ? for_ws : for_wgmma;
    c.tile.mma = kind;
    if (ws) {  // each ws case in both forms: a block per row block (the launcher's default), and persistent
      Case persistent = c;
      persistent.name += " (persistent)", persistent.persistent = true;
      cases.push_back(std::move(persistent));
    }
    cases.push_back(std::move(c));
  };
  const Tile small{64, 32, 4, 2};
  {
    Case c = make("plain, bf16, D=64, two batch rows", variant(""));
    c.B = 2, c.Tq = 70, c.Tk = 50;
    add(c, small, small);
  }
  {
    // A negative scale: the leading factor is not positive, the logit is formed whole.
    Case c = make("causal, negative scale, bf16", variant("causal"));
    c.Tq = c.Tk = 100, c.negative_scale = true;
    add(c, small, small);
  }
  {
    Case c = make("causal, Tq < Tk, f16", variant("causal"));
    c.type = DType::f16, c.Tq = 20, c.Tk = ws ? 300 : 75;  // ws: the ring wraps (10 tiles, 2 stages)
    add(c, {64, 64, 4, 1}, small);
  }
  {
    Case c = make("sliding window (5, 3), 128 rows (two warpgroups)", variant("window"));
    c.Tq = c.Tk = 150, c.window_left = 5, c.window_right = 3;
    add(c, {128, 32, 8, 2}, {128, 32, 8, 3});
  }
  {
    Case c = make("soft cap + bias, Tq != Tk", variant("bias,softcap"));
    c.Tq = 40, c.Tk = 56;
    add(c, small, small);
  }
  {
    Case c = make("user ALiBi score and keep predicate, f16, two batch rows", user_alibi());
    c.type = DType::f16, c.B = 2, c.Tq = 36, c.Tk = 40, c.user_alibi = true;
    add(c, small, small);
  }
  {
    Case c = make("sinks (3), causal, Tq > Tk", variant("causal,sinks"));
    c.Tq = 80, c.Tk = 30, c.sinks = 3;
    add(c, small, small);
  }
  {
    // slope (j - i) climbs 6.9 and 13.9 (log2 units) a 32-key tile at heads 1, 2: the running
    // maximum stays on some tiles (p up to 2^8) and moves on others, mid-row.
    Case c = make("user ALiBi with logits climbing along the keys, bf16", user_alibi());
    c.Tq = 40, c.Tk = 200, c.user_alibi = true, c.slope_step = 0.15;
    add(c, small, small);
  }
  {
    Case c = make("dropout 0.25, causal, mask and segment ids", variant("causal,dropout,mask,segments"));
    c.Tq = c.Tk = 45, c.dropout_p = 0.25f;
    add(c, small, small);
  }
  {
    Case c = make("GQA 4:2, causal, D=128, Dv=64, bf16", variant("causal"));
    c.H = 4, c.H_kv = 2, c.D = 128, c.Dv = 64, c.Tq = c.Tk = 140;
    add(c, {128, 64, 8, 2}, {128, 64, 8, 2});
  }
  {
    Case c = make("GQA 4:1, sinks, D=Dv=128, f16, block_n 128", variant("sinks"));
    c.type = DType::f16, c.H = 4, c.H_kv = 1, c.D = c.Dv = 128, c.Tq = 40, c.Tk = ws ? 300 : 150, c.sinks = 2;
    add(c, {64, 128, 4, 2}, {64, 128, 4, 3});
  }
  {
    Case c = make("causal, D=Dv=128, bf16, 128 x 128 tile", variant("causal"));
    c.D = c.Dv = 128, c.Tq = c.Tk = ws ? 260 : 130;
    add(c, {128, 128, 8, 2}, {128, 128, 8, 2});
  }
  {
    Case c = make("varlen, uneven lengths and an empty sequence, causal", variant("causal"));
    c.cu_seqlens_q = {0, 30, 30, 100, 101}, c.cu_seqlens_k = {0, 45, 45, 115, 140};
    c.Tq = 101, c.Tk = 140;
    add(c, {64, 64, 4, 2}, small);
  }
  {
    Case c = make("o's rows Dv + 1 elements apart (element stores), causal, two batch rows", variant("causal"));
    c.B = 2, c.Tq = c.Tk = 70, c.o_wide_rows = true;
    add(c, small, small);
  }
  {
    Case c = make("head dims D=40 Dv=24, padded inside, causal", variant("causal"));
    c.D = 40, c.Dv = 24, c.Tq = c.Tk = 50;
    add(c, small, small);
  }
  if (!ws) {
    Case c = make("bf16 without cp.async (converted stores), window", variant("window"));
    c.Tq = c.Tk = 70, c.window_left = 20, c.window_right = 20, c.async_copy = false;
    add(c, small, small);
  } else {
    Case wraps = make("causal, D=64, 4 stages, the ring wraps", variant("causal"));
    wraps.Tq = wraps.Tk = 200;
    add(wraps, small, {64, 64, 4, 4});
    Case wide = make("head dims D=Dv=256, causal, block_n 64", variant("causal"));
    wide.D = wide.Dv = 256, wide.Tq = wide.Tk = 70, wide.H = 1, wide.H_kv = 1;
    add(wide, small, {128, 64, 8, 2});
    Case boxes = make("head dims D=136 Dv=72 (a box and a part), window", variant("window"));
    boxes.D = 136, boxes.Dv = 72, boxes.Tq = boxes.Tk = 90, boxes.window_left = 30, boxes.window_right = 0;
    add(boxes, small, {64, 64, 4, 3});
    Case two = make("causal, two batch rows, two consumer warpgroups, 64-key tiles", variant("causal"));
    two.B = 2, two.Tq = two.Tk = 150;
    add(two, small, {128, 64, 8, 2});
    // Three consumer warpgroups (192 rows a block, 160 registers each): D = 64's tile. 400 rows: two
    // whole row blocks and a part; 128-key tiles in three stages.
    Case three = make("causal, D=64, three consumer warpgroups, 128-key tiles, 3 stages", variant("causal"));
    three.Tq = three.Tk = 400;
    add(three, small, {192, 128, 12, 3});
  }
  return cases;
}

// The decode form (mma = decode): a GQA group's query heads as the rows of one block, the keys
// split over blocks, the merge kernel. One to 20 query tokens against up to 300 keys; groups of 1
// to 8 heads (3: not a power of two), rows past a block (two row blocks), splits that end inside
// a tile's range and splits a causal or window range leaves empty; every mask and modifier the
// forward takes but dropout: causal, window, soft cap, bias, a u8 mask, segment ids, sinks (in the
// merge), a user score with a per-head slope and a predicate over the head and batch; varlen with
// an empty sequence and a sequence of queries with no keys; f16, bf16, f32 (split operands); the
// converted-copy path.
inline std::vector<Case> decode() {
  const auto variant = [](const char* list) { return ladle::attention_variant(ladle::parse_attention_features(list)); };
  using Tile = ladle::cuda::AttentionTile;
  constexpr auto kind = ladle::cuda::AttentionMma::decode;
  std::vector<Case> cases;
  const auto add = [&](Case c, Tile tile, int splits) {
    c.name = "decode: " + c.name;
    c.tile = tile;
    c.splits = splits;
    cases.push_back(std::move(c));
  };
  {
    Case c = make("one token, GQA 8:2, causal, D=64, bf16, 2 splits, a ring of 4 stages that wraps", variant("causal"));
    c.H = 8, c.H_kv = 2, c.Tq = 1, c.Tk = 300;
    add(c, {16, 32, 1, 4, kind}, 2);
    c.name = "one token, GQA 8:2, causal, four key warps (16 keys each), one split, a ring of 3 that wraps";
    add(c, {16, 64, 4, 3, kind}, 1);
  }
  {
    Case c = make("5 tokens, GQA 4:1 (20 rows, two warps), window (40, 0) + soft cap + sinks (2), D=Dv=128, f16", variant("window,softcap,sinks"));
    c.type = DType::f16, c.H = 4, c.H_kv = 1, c.D = c.Dv = 128, c.Tq = 5, c.Tk = 260, c.window_left = 40, c.window_right = 0, c.sinks = 2;
    add(c, {32, 64, 4, 2, kind}, 3);  // two row warps, two key warps each
  }
  {
    Case c = make("user ALiBi (a slope per head) and keep predicate, GQA 4:2, 3 tokens, two batch rows, f16", user_alibi());
    c.type = DType::f16, c.B = 2, c.H = 4, c.H_kv = 2, c.Tq = 3, c.Tk = 200, c.user_alibi = true;
    add(c, {16, 32, 2, 1, kind}, 5);  // two key warps, one stage
  }
  {
    Case c = make("varlen (an empty sequence, queries with no keys), bias, mask, segment ids, causal, GQA 2:1",
                  variant("bias,mask,segments,causal"));
    c.H = 2, c.H_kv = 1;
    c.cu_seqlens_q = {0, 1, 1, 5, 7}, c.cu_seqlens_k = {0, 50, 50, 180, 180};
    c.Tq = 7, c.Tk = 180;
    add(c, {16, 64, 2, 3, kind}, 3);
  }
  {
    Case c = make("f32 inputs (split operands), causal, GQA 3:1, 2 tokens, D=32", variant("causal,softcap"));
    c.type = DType::f32, c.H = 3, c.H_kv = 1, c.Tq = 2, c.Tk = 150, c.D = c.Dv = 32;
    add(c, {16, 32, 1, 2, kind}, 2);
  }
  {
    Case c = make("20 tokens x GQA 4:1 = 80 rows (two row blocks of 64), window (30, 2), no cp.async, D=40 Dv=24", variant("window"));
    c.H = 4, c.H_kv = 1, c.Tq = 20, c.Tk = 230, c.D = 40, c.Dv = 24, c.window_left = 30, c.window_right = 2, c.async_copy = false;
    add(c, {64, 32, 4, 2, kind}, 4);
  }
  {
    Case c = make("one token, MHA (G = 1), plain, one split, lse off, 3 stages", variant(""));
    c.H = c.H_kv = 2, c.Tq = 1, c.Tk = 140, c.lse = false;
    add(c, {16, 32, 1, 3, kind}, 1);
  }
  return cases;
}

inline std::vector<Case> all() {
  const auto variant = [](const char* list) { return ladle::attention_variant(ladle::parse_attention_features(list)); };
  std::vector<Case> cases;
  const auto add = [&](Case c) { cases.push_back(std::move(c)); };
  {
    Case c = make("plain, bf16, D=64, two batch rows", variant(""));
    c.B = 2, c.Tq = 50, c.Tk = 50;
    add(c);
  }
  {
    Case c = make("causal, Tq == Tk, f16", variant("causal"));
    c.type = DType::f16, c.Tq = c.Tk = 70;
    add(c);
  }
  {
    Case c = make("causal, Tq < Tk (queries at the end), single stage", variant("causal"));
    c.Tq = 20, c.Tk = 75, c.tile.stages = 1;
    add(c);
  }
  {
    Case c = make("causal, Tq > Tk (early rows see nothing)", variant("causal"));
    c.Tq = 75, c.Tk = 20;
    add(c);
  }
  {
    Case c = make("sliding window (5, 3), smaller than a tile", variant("window"));
    c.Tq = c.Tk = 90, c.window_left = 5, c.window_right = 3;
    add(c);
  }
  {
    Case c = make("causal + sliding window (40, -1) spanning tiles, f16", variant("causal,window"));
    c.type = DType::f16, c.Tq = c.Tk = 110, c.window_left = 40;
    add(c);
  }
  {
    Case c = make("soft cap + bias, Tq != Tk", variant("bias,softcap"));
    c.Tq = 40, c.Tk = 56;
    add(c);
  }
  {
    Case c = make("user ALiBi score and keep predicate, f16, two batch rows", user_alibi());
    c.type = DType::f16, c.B = 2, c.Tq = 36, c.Tk = 40, c.user_alibi = true;
    add(c);
  }
  {
    Case c = make("attention_mask (u8) and segment ids (i32)", variant("mask,segments"));
    c.Tq = c.Tk = 60, c.segment_type = DType::i32;
    add(c);
  }
  {
    Case c = make("segment ids (i64), causal", variant("causal,segments"));
    c.Tq = c.Tk = 60;
    add(c);
  }
  {
    Case c = make("sinks (3), causal, Tq > Tk", variant("causal,sinks"));
    c.Tq = 50, c.Tk = 30, c.sinks = 3;
    add(c);
  }
  {
    Case c = make("dropout 0.25, causal", variant("causal,dropout"));
    c.Tq = c.Tk = 45, c.dropout_p = 0.25f;
    add(c);
  }
  {
    Case c = make("GQA 4:2, D=128, Dv=64, 128x64 tile, 8 warps", variant("causal"));
    c.H = 4, c.H_kv = 2, c.D = 128, c.Dv = 64, c.Tq = c.Tk = 140, c.tile = {128, 64, 8, 2};
    add(c);
  }
  {
    Case c = make("GQA 4:1, D=128, Dv=128, f16, 64x128 tile", variant("sinks"));
    c.type = DType::f16, c.H = 4, c.H_kv = 1, c.D = c.Dv = 128, c.Tq = 40, c.Tk = 150, c.tile = {64, 128, 4, 2};
    c.sinks = 2;
    add(c);
  }
  {
    Case c = make("varlen, uneven lengths and an empty sequence, causal", variant("causal"));
    c.cu_seqlens_q = {0, 30, 30, 100, 101}, c.cu_seqlens_k = {0, 45, 45, 115, 140};
    c.Tq = 101, c.Tk = 140;
    add(c);
  }
  {
    Case c = make("varlen with bias, window and dropout, D=32 Dv=48", variant("bias,window,dropout"));
    c.cu_seqlens_q = {0, 40, 77}, c.cu_seqlens_k = {0, 33, 90};
    c.Tq = 77, c.Tk = 90, c.D = 32, c.Dv = 48, c.window_left = 12, c.window_right = 20, c.dropout_p = 0.1f;
    add(c);
  }
  {
    Case c = make("f32 inputs (split bf16 operands), causal", variant("causal,softcap"));
    c.type = DType::f32, c.Tq = c.Tk = 40, c.D = 32, c.Dv = 32;
    add(c);
  }
  {
    Case c = make("bf16 without cp.async (strided copy path), window", variant("window"));
    c.Tq = c.Tk = 70, c.window_left = 20, c.window_right = 20, c.async_copy = false;
    add(c);
  }
  {
    Case c = make("head dims D=40 Dv=24, padded to 48 and 32 (cp.async, zero columns), causal", variant("causal"));
    c.D = 40, c.Dv = 24, c.Tq = c.Tk = 50;
    add(c);
  }
  {
    Case c = make("head dims D=20 Dv=12 (not multiples of 8: converted loads), f16, sinks", variant("sinks"));
    c.type = DType::f16, c.D = 20, c.Dv = 12, c.Tq = 30, c.Tk = 44, c.sinks = 1;
    add(c);
  }
  for (auto kind : {ladle::cuda::AttentionMma::wgmma, ladle::cuda::AttentionMma::ws})
    for (Case& c : hopper(kind)) cases.push_back(std::move(c));
  for (Case& c : decode()) cases.push_back(std::move(c));
  return cases;
}

// The backward's cases (codegen/cuda/attention_backward.h, sm_90a): every mask and modifier with
// its gradients (a bias's, an ALiBi slope's, the sinks'), D = Dv = 64 (one warpgroup forms dQ) and
// D = 128, Dv != D and head dims padded inside a box, GQA, Tq != Tk, varlen with an empty sequence,
// f16 and bf16, a d_output of another dtype (prep's copy), rings that wrap. Sizes span several key
// blocks and query tiles, with partial ones.
inline std::vector<Case> backward() {
  const auto variant = [](const char* list) { return ladle::attention_variant(ladle::parse_attention_features(list)); };
  std::vector<Case> cases;
  const auto add = [&](Case c) { cases.push_back(std::move(c)); };
  {
    Case c = make("backward: causal, bf16, D=Dv=64, partial tiles", variant("causal"));
    c.Tq = c.Tk = 150;
    add(c);
  }
  {
    Case c = make("backward: plain, GQA 4:2, Tq < Tk, D=128 Dv=64, f16, f32 d_output", variant(""));
    c.type = DType::f16, c.H = 4, c.H_kv = 2, c.D = 128, c.Dv = 64, c.Tq = 70, c.Tk = 200, c.d_output_f32 = true;
    add(c);
  }
  {
    Case c = make("backward: soft cap + window (30, 10) + sinks (2), D=96 Dv=128, 3 stages", variant("softcap,window,sinks"));
    c.Tq = c.Tk = 260, c.D = 96, c.Dv = 128, c.window_left = 30, c.window_right = 10, c.sinks = 2, c.stages = 3;
    add(c);
  }
  {
    Case c = make("backward: bias + dropout 0.2, causal, Tq > Tk, two batch rows", variant("bias,causal,dropout"));
    c.B = 2, c.Tq = 90, c.Tk = 70, c.dropout_p = 0.2f;
    add(c);
  }
  {
    Case c = make("backward: user ALiBi score and keep predicate (d slope), f16", user_alibi());
    c.type = DType::f16, c.B = 2, c.Tq = 66, c.Tk = 140, c.user_alibi = true;
    add(c);
  }
  {
    Case c = make("backward: attention_mask (u8), segment ids, causal, dq by red.global", variant("mask,segments,causal"));
    c.Tq = c.Tk = 130;
    c.dq_pairs = true;
    add(c);
  }
  {
    Case c = make("backward: varlen, uneven lengths and an empty sequence, causal, GQA 2:1", variant("causal"));
    c.H = 2, c.H_kv = 1;
    c.cu_seqlens_q = {0, 30, 30, 170, 171}, c.cu_seqlens_k = {0, 45, 45, 185, 210};
    c.Tq = 171, c.Tk = 210;
    add(c);
  }
  {
    Case c = make("backward: f16 D=192 Dv=128 (warpgroup 1 has no dV columns), causal, GQA 2:1, Tq < Tk", variant("causal"));
    c.type = DType::f16, c.H = 2, c.H_kv = 1, c.D = 192, c.Dv = 128, c.Tq = 90, c.Tk = 170;
    add(c);
  }
  // The sync form (mma.sync): what the ws form refuses.
  {
    Case c = make("backward sync: f32 (split), varlen with an empty sequence, causal, GQA 4:2, D=Dv=64", variant("causal"));
    c.type = DType::f32, c.H = 4, c.H_kv = 2;
    c.cu_seqlens_q = {0, 40, 40, 100}, c.cu_seqlens_k = {0, 50, 50, 130};
    c.Tq = 100, c.Tk = 130;
    add(c);
  }
  {
    Case c = make("backward: bf16 D=256 Dv=192 (the warpgroups split the columns), soft cap + window (40, 8) + sinks (2), f32 d_output",
                  variant("softcap,window,sinks"));
    c.Tq = c.Tk = 150, c.D = 256, c.Dv = 192, c.window_left = 40, c.window_right = 8, c.sinks = 2, c.d_output_f32 = true;
    add(c);
  }
  {
    Case c = make("backward sync: f32 D=Dv=256 (32 rows a step, four column parts), bias + dropout 0.1, causal, Tq > Tk", variant("bias,causal,dropout"));
    c.type = DType::f32, c.B = 2, c.Tq = 70, c.Tk = 50, c.D = c.Dv = 256, c.dropout_p = 0.1f;
    add(c);
  }
  {
    Case c = make("backward sync: sm_80, f16, user ALiBi and keep predicate (d slope), D=Dv=96, 16 rows a step", user_alibi());
    c.type = DType::f16, c.B = 2, c.Tq = 66, c.Tk = 140, c.D = c.Dv = 96, c.user_alibi = true, c.backward_arch = "sm_80", c.sync_rows = 16;
    add(c);
  }
  {
    Case c = make("backward sync: sm_86, bf16 D=256 Dv=224 (16 rows a step), attention_mask (u8), segment ids, causal",
                  variant("mask,segments,causal"));
    c.D = 256, c.Dv = 224, c.backward_arch = "sm_86", c.Tq = c.Tk = 130;
    add(c);
  }
  return cases;
}

// The backward's kernel spec for a case, as gpu::attention_backward_spec gives it for the case's bound
// arguments (every gradient wanted; d_output in the case's dtype, contiguous, unless d_output_f32).
inline ladle::cuda::AttentionBackwardSpec backward_spec(const Case& c) {
  ladle::cuda::AttentionBackwardSpec s;
  const ladle::cuda::AttentionKernelSpec forward = c.spec();
  s.input_types = forward.input_types;
  s.D = c.D, s.Dv = c.Dv;
  s.varlen = !c.cu_seqlens_q.empty();
  s.q_segment_ids_type = s.kv_segment_ids_type = c.segment_type;
  s.output_type = c.type;
  s.d_output_type = c.d_output_f32 ? DType::f32 : c.type;
  s.copy_d_output = c.d_output_f32;
  s.sinks_gradient = c.variant.sinks && c.sinks > 0;
  for (std::size_t k = 0; k < c.variant.inputs.size(); ++k) {
    const ladle::ir::Input& in = c.variant.inputs[k];
    s.input_gradients.push_back((in.kind == ladle::ir::InputKind::pair || in.kind == ladle::ir::InputKind::head) &&
                                s.input_types[k] != DType::u8);
  }
  s.arch = c.backward_arch;
  s.form = ladle::cuda::attention_backward_form(s.input_types, s.D, s.Dv, s.arch);
  if (s.form == ladle::cuda::AttentionBackwardForm::sync) {
    s = ladle::cuda::with_sync_tile(s);
    if (c.sync_rows) s.sync_rows = c.sync_rows;
    return s;
  }
  s.stages = c.stages;
  s.dq_tma = !c.dq_pairs;
  s = ladle::cuda::with_tile(s, {c.stages, s.dq_tma});  // as the launcher: red.global where dQ's stage does not fit
  return s;
}

}  // namespace attention_cases
