#include "tune_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include <ladle/tensor/dtype.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>
#include <ladle/runtime/event_timer.h>

#include "gpu_attention.h"
#include "gpu_attention_backward.h"
#include "tune_recurrent.h"  // the key builder and the memo

namespace ladle::gpu {
namespace {

using Tile = cuda::AttentionTile;

// The tile's tunable fields, in the space's order: the name in a Config, the values the space
// tries, and how a Config reads and writes the field. A new field of AttentionTile is one line
// here (its validity is validate_attention_tile's). mma: 0 = sync, 1 = wgmma, 2 = ws (both
// sm_90a only); stages 3 and 4 are ws only.
struct TileField {
  std::string_view name;
  std::vector<int> values;
  int (*get)(const Tile&);
  void (*set)(Tile&, int);
};

const std::vector<TileField>& tile_fields() {
  static const std::vector<TileField> fields{
      {"block_m", {64, 128, 192}, [](const Tile& t) { return t.block_m; }, [](Tile& t, int v) { t.block_m = v; }},
      {"block_n", {32, 64, 128}, [](const Tile& t) { return t.block_n; }, [](Tile& t, int v) { t.block_n = v; }},
      {"warps", {4, 8, 12}, [](const Tile& t) { return t.warps; }, [](Tile& t, int v) { t.warps = v; }},  // 12: ws only
      {"stages", {1, 2, 3, 4}, [](const Tile& t) { return t.stages; }, [](Tile& t, int v) { t.stages = v; }},
      {"mma", {0, 1, 2}, [](const Tile& t) { return static_cast<int>(t.mma); },
       [](Tile& t, int v) { t.mma = v == 2 ? cuda::AttentionMma::ws : v ? cuda::AttentionMma::wgmma : cuda::AttentionMma::sync; }},
  };
  return fields;
}

std::string joined(const std::vector<std::string>& problems) {
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
  return all;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
int pad16(std::int64_t dim) { return static_cast<int>((dim + 15) / 16 * 16); }

// A rough time of one call in SM cycles (only the ranking matters). Per key tile a block does
// the mma.sync work of q k^T and P V (about 1024 16-bit FMA per cycle per SM; split fp32 three
// products), the softmax's exp on the MUFU (16 per cycle) and a few more elementwise operations
// per score, issues the cp.async copies of the next K/V tile (16 bytes an instruction, about 2
// a cycle with their address arithmetic: what 128-row tiles halve per query row), and waits
// at the tile's barriers and row shuffles; with one stage also for the copy itself. The tensor
// cores reach full rate only with enough resident warps (w / (w + 2)); past 128 fragment
// values per thread the registers left no longer hold the next fragments, so the mma slows
// (x1.5 at the guard's 160). wgmma is modelled at mma.sync's rate: it differs by its registers
// (q stays in shared memory) and its shared memory only, and a tie keeps mma.sync first (the
// enumeration order). ws overlaps the softmax with the products and has no copies to issue and
// no barrier per tile (faster than mma.sync: bench/RESULTS.md, "Evidence behind the heuristics",
// H14). An SM runs the blocks that fit at once (shared memory, registers estimated as 48 + the
// fragment values, threads) and overlaps their waits; the call takes the longer of the total work
// over the SMs and the longest block alone (fewer blocks than SMs leave SMs idle). Not yet
// calibrated on a GPU (bench/RESULTS.md): at H16 bf16, B8 T4096 and B2 T16384, D128 and D64, causal
// or a 1024-key window, it ranks heuristic_attention_tile first (and its 64-row tiles for few
// blocks, its 32-key tiles at D192).
double attention_cycles(const AttentionTuneShape& s, bool split, const Tile& tile, const DeviceLimits& device) {
  const int Dp = pad16(s.D), Dvp = pad16(s.Dv);
  const double bm = tile.block_m, bn = tile.block_n;
  const double pairs = bm * bn;
  const double mma = pairs * (Dp + Dvp) * (split ? 3 : 1) / 1024;
  const double elementwise = pairs * (1.0 / 16 + 6.0 / 128);
  const double copy = bn * (Dp + Dvp) * 2 * (split ? 2 : 1) / 32;
  double waits = 500 + (tile.stages == 1 ? 700 : 0);
  const double per_block = 1000;  // the q tile, the first K/V tile, o's epilogue
  const bool ws = tile.mma == cuda::AttentionMma::ws;
  const bool wgmma = tile.mma == cuda::AttentionMma::wgmma || ws;  // the register guard's count
  const int fragments = wgmma ? tile.block_n / 2 + tile.block_n / 4 + Dvp / 2
                              : Dp / 4 * (split ? 2 : 1) + tile.block_n / 2 + Dvp / 2;
  const double pressure = 1 + std::max(0, fragments - 128) / 64.0;
  const int threads = 32 * tile.warps + (ws ? 128 : 0);
  const int registers = (std::min(255, 48 + fragments) + 7) / 8 * 8;
  const int shared = std::max(1, cuda::attention_shared_bytes(tile, s.D, s.Dv, split));
  const int by_shared = device.max_shared_per_sm > 0 ? device.max_shared_per_sm / shared : 1;
  const int by_registers = device.max_registers_per_sm / (registers * threads);
  const int by_threads = 2048 / threads;
  const std::int64_t fit = std::max(1, std::min({by_shared, by_registers, by_threads}));

  // Key tiles per row block: the causal / window range of its rows, in whole tiles.
  const std::int64_t Tq = std::max<std::int64_t>(1, s.mean_q), Tk = std::max<std::int64_t>(1, s.mean_k);
  const std::int64_t row_blocks = ceil_div(Tq, tile.block_m), offset = Tk - Tq;
  double tiles = 0, longest = 0;
  for (std::int64_t b = 0; b < row_blocks; ++b) {
    const std::int64_t first = b * tile.block_m, last = std::min(Tq, first + tile.block_m) - 1;
    std::int64_t lo = 0, hi = Tk - 1;
    if (s.causal) hi = std::min(hi, last + offset);
    if (s.window_left >= 0) lo = std::max(lo, first + offset - s.window_left);
    if (s.window_right >= 0) hi = std::min(hi, last + offset + s.window_right);
    const double n = hi < lo ? 0 : static_cast<double>(hi / tile.block_n - lo / tile.block_n + 1);
    tiles += n;
    longest = std::max(longest, n);
  }
  const std::int64_t heads = std::max<std::int64_t>(1, s.N * s.H);
  const std::int64_t blocks = heads * row_blocks;
  const int sms = std::max(1, device.sm_count);
  const std::int64_t together = std::min(fit, std::max<std::int64_t>(1, ceil_div(blocks, sms)));
  const auto rate = [&](std::int64_t resident) {
    const double warps = static_cast<double>(resident * tile.warps);
    return warps / (warps + 2);
  };
  // ws: the copies are TMA's (no issue cost), there is no barrier per tile, and the softmax of a
  // tile overlaps the products in flight: the longer of the two, plus a short mbarrier wait.
  const double compute = ws ? std::max(mma * pressure, elementwise) + 0.25 * std::min(mma * pressure, elementwise)
                            : mma * pressure + elementwise;
  const double issue = ws ? 0.0 : copy;
  if (ws) waits = 150 + (tile.stages == 2 ? 100 : 0);
  const double shared_tile = compute / rate(together) + issue + waits / static_cast<double>(together);
  const double alone_tile = compute / rate(1) + issue + waits;
  const double all = (static_cast<double>(heads) * tiles * shared_tile + blocks * per_block / together) / sms;
  return std::max(all, longest * alone_tile + per_block);
}

// Runs tiles on the caller's device inputs into outputs of its own (poisoned before each
// checked run, so that a tile that skips a row shows NaN).
class AttentionCandidate : public Candidate {
 public:
  AttentionCandidate(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                     const cuda::AttentionKernelSpec& spec, double tolerance)
      : variant_(variant), args_(args), spec_(spec), tolerance_(tolerance), arch_(Device::get().properties().arch()) {
    Device::get().synchronize();  // the caller's inputs may still be in flight on its stream
    std::int64_t n = 1;
    for (auto d : args.o.shape) n *= d;
    o_ = DeviceBuffer(static_cast<std::size_t>(n) * dtype_size(args.o.type));
    args_.o = o_.view(args.o.type, args.o.shape);
    if (args.lse) {
      std::int64_t m = 1;
      for (auto d : args.lse->shape) m *= d;
      lse_ = DeviceBuffer(static_cast<std::size_t>(m) * 4);
      args_.lse = lse_.view(DType::f32,
                                         args.lse->shape);
    }
  }

  void prepare(const Config& config) override {
    cuda::AttentionKernelSpec spec = spec_;  // built on the caller's thread: no device here
    spec.tile = to_attention_tile(config);
    compile_attention(variant_, spec, arch_);  // warms the compile cache
  }

  void record_reference(const Config& heuristic) override { reference_ = run(heuristic); }

  Check matches_reference(const Config& config) override {
    const std::vector<std::byte> out = run(config);
    return compare_outputs(out.data(), reference_.data(), out.size() / dtype_size(args_.o.type), args_.o.type, tolerance_);
  }

  double time_ms(const Config& config) override {
    const Tile tile = to_attention_tile(config);
    return time_launches(stream_, [&](int) { run_attention_into(variant_, args_, LaunchOptions{&stream_}, tile); });
  }

 private:
  // The output as the device wrote it (compared raw: compare_outputs).
  std::vector<std::byte> run(const Config& config) {
    o_.fill_bytes(0xff, &stream_);
    run_attention_into(variant_, args_, LaunchOptions{&stream_}, to_attention_tile(config));
    stream_.synchronize();
    std::vector<std::byte> bytes(o_.bytes());
    o_.copy_to_host(bytes.data(), bytes.size());
    return bytes;
  }

  const ir::AttentionVariant& variant_;
  ops::AttentionArgs args_;  // the caller's inputs, this candidate's outputs
  cuda::AttentionKernelSpec spec_;
  double tolerance_;
  std::string arch_;
  Stream stream_;
  DeviceBuffer o_, lse_;
  std::vector<std::byte> reference_;
};

}  // namespace

AttentionTuneShape AttentionTuneShape::of(const ir::AttentionVariant& variant, const ops::AttentionArgs& args) {
  AttentionTuneShape shape;
  shape.N = args.N;
  const auto longest = [&](const std::vector<std::int64_t>& offsets, std::int64_t all) {
    std::int64_t most = 0;
    for (std::size_t n = 0; n + 1 < offsets.size(); ++n) most = std::max(most, offsets[n + 1] - offsets[n]);
    return offsets.empty() ? all : most;
  };
  const auto mean = [&](const std::vector<std::int64_t>& offsets, std::int64_t all) {
    return offsets.empty() ? all : offsets.back() / std::max<std::int64_t>(1, args.N);
  };
  shape.Tq = longest(args.cu_seqlens_q, args.Tq);
  shape.Tk = longest(args.cu_seqlens_k, args.Tk);
  shape.mean_q = mean(args.cu_seqlens_q, args.Tq);
  shape.mean_k = mean(args.cu_seqlens_k, args.Tk);
  shape.H = args.H;
  shape.H_kv = args.H_kv;
  shape.D = args.D;
  shape.Dv = args.Dv;
  shape.causal = variant.causal;
  if (variant.window) shape.window_left = args.window_left, shape.window_right = args.window_right;
  return shape;
}

Config to_config(const cuda::AttentionTile& tile) {
  Config c;
  for (const TileField& field : tile_fields()) c.set(field.name, field.get(tile));
  return c;
}

cuda::AttentionTile to_attention_tile(const Config& config) {
  Tile tile;
  for (const TileField& field : tile_fields()) field.set(tile, config.at(field.name));
  return tile;
}

SearchSpace attention_search_space(const AttentionTuneShape& shape, DType operands, bool async_copy) {
  SearchSpace space;
  for (const TileField& field : tile_fields()) space.param(std::string(field.name), field.values);
  const bool split = operands == DType::f32;
  const int D = static_cast<int>(shape.D), Dv = static_cast<int>(shape.Dv);
  space.rule([D, Dv, split, async_copy](const Config& c, const DeviceLimits& d) -> Reason {
    // Every limit a tile breaks: warps vs block_m, wgmma off sm_90a or with fp32 inputs, the
    // register guard, the opt-in shared memory; ws also needs rows TMA can copy.
    const Tile tile = to_attention_tile(c);
    const auto problems = cuda::validate_attention_tile(tile, D, Dv, d.max_shared_per_block, split, d.arch);
    if (!problems.empty()) return joined(problems);
    if (tile.mma == cuda::AttentionMma::ws && !async_copy)
      return std::string("mma=ws copies q, k, v with TMA: they need 16-byte aligned rows of one 16-bit type");
    return rule::threads(32LL * c.at("warps") + (tile.mma == cuda::AttentionMma::ws ? 128 : 0), d);
  });
  space.cost_model([shape, split](const Config& c, const DeviceLimits& d) {
    return attention_cycles(shape, split, to_attention_tile(c), d);
  });
  return space;
}

namespace {
std::string attention_bucket(const ir::AttentionVariant& variant, const AttentionTuneShape& shape);
}  // namespace

TunedKey attention_tune_key(const ir::AttentionVariant& variant, const cuda::AttentionKernelSpec& spec,
                            const AttentionTuneShape& shape, const DeviceLimits& device) {
  std::vector<DType> types = spec.input_types;
  if (variant.segment_ids) types.insert(types.end(), {spec.q_segment_ids_type, spec.kv_segment_ids_type});
  if (variant.sinks) types.push_back(spec.sinks_type);
  return tune_key(attention_family, ir::hash_hex(variant) + fmt::format("-v{}l{}a{}f{}", spec.varlen, spec.lse, spec.async_copy, spec.positive_logit_factor),
                  types, attention_bucket(variant, shape), spec.output_type, device);
}

namespace {

std::string attention_bucket(const ir::AttentionVariant& variant, const AttentionTuneShape& shape) {
  std::string bucket = shape_bucket({{"N", bucket_pow2(shape.N)},
                                     {"Tq", bucket_pow2(shape.Tq)},
                                     {"Tk", bucket_pow2(shape.Tk)},
                                     {"H", shape.H},
                                     {"Hkv", shape.H_kv},
                                     {"D", shape.D},
                                     {"Dv", shape.Dv}});
  if (variant.window) {
    // The keys a row may see decide the work per block (a 1024-key window is not an 8192-key
    // one): power-of-two buckets of the keys beside the diagonal, an unbounded side counting as Tk.
    const auto side = [&](std::int64_t w) { return w < 0 ? shape.Tk : std::min(w, shape.Tk); };
    const std::string span = shape_bucket({{"W", bucket_pow2(std::max<std::int64_t>(1, side(shape.window_left) + side(shape.window_right)))}});
    bucket.append(1, '-').append(span);
  }
  return bucket;
}

}  // namespace

TuneJob attention_tune_job(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                           const cuda::AttentionTile& heuristic) {
  // The launcher's spec, checks and errors (a heuristic that does not fit throws here).
  const cuda::AttentionKernelSpec spec = plan_attention(variant, args, heuristic, device_target()).spec;
  const DeviceLimits device = DeviceLimits::from(Device::get().properties());
  const AttentionTuneShape shape = AttentionTuneShape::of(variant, args);
  const bool split = cuda::attention_split_f32(variant, spec);
  TunedKey key = attention_tune_key(variant, spec, shape, device);
  // fp32 inputs through split bf16 pairs keep about 16 bits: docs/design.md's fp32 tolerance.
  const double tolerance = split ? 2e-3 : 1e-2;
  CandidateFactory factory = [&variant, &args, spec, tolerance] {
    return std::make_unique<AttentionCandidate>(variant, args, spec, tolerance);
  };
  return TuneJob{std::move(key),
                 Tuner(attention_search_space(shape, split ? DType::f32 : spec.input_types.at(0), spec.async_copy), device,
                       to_config(heuristic)),
                 std::move(factory)};
}

cuda::AttentionTile tuned_attention_tile(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                         const cuda::AttentionTile& heuristic, const TuneOptions& tune_options) {
  const Policy policy = tune_options.policy.value_or(policy_from_env());
  // A decode tile is taken as the heuristic gives it: the space holds no decode tiles (its split
  // count is attention_decode_split's).
  if (policy == Policy::heuristic || heuristic.mma == cuda::AttentionMma::decode) return heuristic;
  return to_attention_tile(tuned_config(attention_tune_job(variant, args, heuristic), policy, tune_options));
}

// ---- The backward

namespace {

// Runs backward tiles on the caller's inputs (q, k, v, o, lse, d_output) into gradients of its own,
// laid out as the caller's (the same strides over buffers of the spans).
class AttentionBackwardCandidate : public Candidate {
 public:
  AttentionBackwardCandidate(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const cpu::AttentionGrads& grads,
                             const cuda::AttentionBackwardSpec& spec)
      : variant_(variant), args_(args), grads_(grads), spec_(spec), arch_(Device::get().properties().arch()) {
    Device::get().synchronize();  // the caller's inputs may still be in flight on its stream
    const auto own = [&](TensorView& view) {
      buffers_.emplace_back(span_bytes(view));
      view.data = reinterpret_cast<void*>(buffers_.back().device_ptr());
    };
    buffers_.reserve(4 + grads.d_tensors.size());
    own(grads_.dq), own(grads_.dk), own(grads_.dv);
    for (auto& d : grads_.d_tensors)
      if (d) own(*d);
    if (grads_.d_softmax_aux) own(*grads_.d_softmax_aux);
  }

  void prepare(const Config& config) override {
    compile_attention_backward(variant_, cuda::with_tile(spec_, to_attention_backward_tile(config)), arch_);  // warms the cache
  }

  void record_reference(const Config& heuristic) override { reference_ = run(heuristic); }

  Check matches_reference(const Config& config) override {
    const std::vector<float> out = run(config);
    return compare_outputs(out.data(), reference_.data(), out.size(), DType::f32, 1e-2);
  }

  double time_ms(const Config& config) override {
    const cuda::AttentionBackwardTile tile = to_attention_backward_tile(config);
    return time_launches(stream_, [&](int) { run_attention_backward_into(variant_, args_, grads_, LaunchOptions{&stream_}, tile); });
  }

 private:
  // Every gradient, concatenated (dk and dv poisoned first: a tile that skips a key shows NaN).
  std::vector<float> run(const Config& config) {
    buffers_[1].fill_bytes(0xff, &stream_);
    buffers_[2].fill_bytes(0xff, &stream_);
    run_attention_backward_into(variant_, args_, grads_, LaunchOptions{&stream_}, to_attention_backward_tile(config));
    stream_.synchronize();
    std::vector<float> values;
    for (const DeviceBuffer& b : buffers_) {
      const std::size_t at = values.size();
      values.resize(at + b.bytes() / 4);
      b.copy_to_host(values.data() + at, b.bytes());
    }
    return values;
  }

  const ir::AttentionVariant& variant_;
  ops::AttentionArgs args_;
  cpu::AttentionGrads grads_;  // d_output the caller's; the gradients over buffers_
  cuda::AttentionBackwardSpec spec_;
  std::string arch_;
  Stream stream_;
  std::vector<DeviceBuffer> buffers_;  // dq, dk, dv, then the wanted inputs' and the sinks' gradients
  std::vector<float> reference_;
};

}  // namespace

Config to_config(const cuda::AttentionBackwardTile& tile) {
  Config c;
  c.set("stages", tile.stages);
  c.set("dq_tma", tile.dq_tma ? 1 : 0);
  return c;
}

cuda::AttentionBackwardTile to_attention_backward_tile(const Config& config) {
  return {config.at("stages"), config.at("dq_tma") != 0};
}

SearchSpace attention_backward_search_space(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& base) {
  SearchSpace space;
  space.param("stages", {2, 3, 4}).param("dq_tma", {1, 0});
  space.rule([variant, base](const Config& c, const DeviceLimits& d) -> Reason {
    const cuda::AttentionBackwardTile tile = to_attention_backward_tile(c);
    if (tile.dq_tma && !base.dq_tma) return std::string("dq_tma: this call's dq is not 16-byte aligned with strides in multiples of 4");
    const cuda::AttentionBackwardSpec spec = cuda::with_tile(base, tile);
    if (tile.dq_tma && !spec.dq_tma)
      return fmt::format("dq_tma: dQ's stage does not fit beside {} stages at D = {}, Dv = {}", tile.stages, base.D, base.Dv);
    cuda::AttentionBackwardSpec on_device = spec;
    on_device.arch = d.arch.empty() ? base.arch : d.arch;
    if (const auto problems = cuda::attention_backward_unsupported(variant, on_device); !problems.empty()) return joined(problems);
    const int bytes = cuda::attention_backward_shared_bytes(spec);
    if (d.max_shared_per_block > 0 && bytes > d.max_shared_per_block)
      return fmt::format("{} bytes of shared memory, more than the device's {} a block", bytes, d.max_shared_per_block);
    return std::nullopt;
  });
  return space;
}

TunedKey attention_backward_tune_key(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& spec,
                                     const AttentionTuneShape& shape, const DeviceLimits& device) {
  std::vector<DType> types = spec.input_types;
  types.push_back(spec.d_output_type);
  if (variant.segment_ids) types.insert(types.end(), {spec.q_segment_ids_type, spec.kv_segment_ids_type});
  if (variant.sinks) types.push_back(spec.sinks_type);
  std::string wanted;
  for (bool g : spec.input_gradients) wanted += g ? 'g' : '-';
  return tune_key(attention_backward_family,
                  ir::hash_hex(variant) + fmt::format("-v{}c{}s{}q{}-{}", spec.varlen, spec.copy_d_output, spec.sinks_gradient, spec.dq_tma, wanted),
                  types, attention_bucket(variant, shape), spec.output_type, device);
}

TuneJob attention_backward_tune_job(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                    const cpu::AttentionGrads& grads, const cuda::AttentionBackwardTile& heuristic) {
  if (const auto problems = gpu_attention_backward_unsupported(variant, args); !problems.empty())
    throw InvalidArgument((variant.name.empty() ? std::string("attention") : variant.name) + " on the GPU: " + problems.front());
  const cuda::AttentionBackwardSpec base = attention_backward_spec(variant, args, grads, Device::get().properties().arch());
  if (base.form == cuda::AttentionBackwardForm::sync)
    throw InvalidArgument((variant.name.empty() ? std::string("attention") : variant.name) +
                          " backward: this call runs the mma.sync form (f32 or mixed q, k, v, or no wgmma), whose tile is decided "
                          "from the target, not tuned");
  const DeviceLimits device = DeviceLimits::from(Device::get().properties());
  TunedKey key = attention_backward_tune_key(variant, base, AttentionTuneShape::of(variant, args), device);
  CandidateFactory factory = [&variant, &args, &grads, base] {
    return std::make_unique<AttentionBackwardCandidate>(variant, args, grads, base);
  };
  return TuneJob{std::move(key), Tuner(attention_backward_search_space(variant, base), device, to_config(heuristic)), std::move(factory)};
}

cuda::AttentionBackwardTile tuned_attention_backward_tile(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                          const cpu::AttentionGrads& grads,
                                                          const cuda::AttentionBackwardTile& heuristic,
                                                          const TuneOptions& tune_options) {
  const Policy policy = tune_options.policy.value_or(policy_from_env());
  if (policy == Policy::heuristic) return heuristic;
  return to_attention_backward_tile(tuned_config(attention_backward_tune_job(variant, args, grads, heuristic), policy, tune_options));
}

}  // namespace ladle::gpu
