#include "tune_recurrent.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include <ladle/tensor/dtype.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/event_timer.h>

#include "chunked_plan.h"
#include "gpu_recurrent.h"

namespace ladle::gpu {
namespace {

// What differs between the two families' candidates: which tile field of RunOptions a
// config sets (with the algorithm forced, so that ladle-tune --algo runs that family
// whatever the shape would choose), how a config compiles, and the output tolerance.
struct RecurrentFamily {
  static void set_tile(RunOptions& options, const Config& config) {
    options.algorithm = Algorithm::recurrent;
    options.tile = to_recurrent_tile(config);
  }
  static void compile(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                      const std::string& arch, const GpuTarget&) {
    compile_recurrent(variant, kernel_spec(variant, bound, options), arch);
  }
  // fp32 throughout: only the summation order differs between tiles.
  static double tolerance(DType output) { return output == DType::f32 ? 1e-4 : 1e-2; }
};

struct ChunkedFamily {
  static void set_tile(RunOptions& options, const Config& config) {
    options.algorithm = Algorithm::chunked;
    options.chunked_tile = to_chunked_tile(config);
  }
  // Every kernel the call launches with this tile (a segmented call's state pass and fold too),
  // so that none is left to compile on the tuner's own thread, one after another.
  static void compile(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                      const std::string& arch, const GpuTarget& target) {
    for (const ChunkedLaunch& each : plan_chunked(variant, bound, options, target).launches) compile_chunked(variant, each.spec, arch);
  }
  // bf16 tensor-core operands whatever the output type: another chunk length or reference
  // token rounds different products, so an fp32 output gets the 16-bit tolerance too.
  static double tolerance(DType) { return 1e-2; }
};

// Everything a run needs besides the tile: the caller's device inputs, fresh outputs.
template <class Family>
class TileCandidate : public Candidate {
 public:
  TileCandidate(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options, TensorView q,
                TensorView k, TensorView v, VariantInputs inputs)
      : variant_(variant), bound_(bound), options_(options), q_(q), k_(k), v_(v), inputs_(std::move(inputs)),
        arch_(Device::get().properties().arch()), target_(device_target()) {
    const auto& dims = bound.dims;
    // q, k and v are the canonical views ([B,T,H,D] also for packed [T,H,D] inputs): o takes their rank.
    const std::vector<std::int64_t> o_shape = {dims.B, dims.T, dims.H, dims.V};
    std::int64_t n = 1;
    for (auto s : o_shape) n *= s;
    o_ = DeviceBuffer(static_cast<std::size_t>(n) * dtype_size(dims.type));
    outputs_.o = o_.view(dims.type, o_shape);
    if (options.return_state) {
      std::int64_t s = 1;
      for (auto d : dims.state_shape()) s *= d;
      state_ = DeviceBuffer(static_cast<std::size_t>(s) * 4);
      outputs_.final_state =
          state_.view(DType::f32, dims.state_shape());
    }
  }

  void prepare(const Config& config) override {
    Family::compile(variant_, bound_, with_tile(config), arch_, target_);  // warms the compile cache
  }

  void record_reference(const Config& heuristic) override { reference_ = run(heuristic); }

  Check matches_reference(const Config& config) override {
    const std::vector<std::byte> out = run(config);
    return compare_outputs(out.data(), reference_.data(), out.size() / dtype_size(bound_.dims.type), bound_.dims.type,
                           Family::tolerance(bound_.dims.type));
  }

  double time_ms(const Config& config) override {
    const RunOptions options = with_tile(config);
    return time_launches(stream_, [&](int) {
      run_variant_into(variant_, q_, k_, v_, inputs_, options, outputs_, {&stream_});
    });
  }

 private:
  RunOptions with_tile(const Config& config) const {
    RunOptions options = options_;
    Family::set_tile(options, config);
    return options;
  }

  // The output as the device wrote it (compared raw: compare_outputs).
  std::vector<std::byte> run(const Config& config) {
    o_.fill_bytes(0xff);
    run_variant_into(variant_, q_, k_, v_, inputs_, with_tile(config), outputs_, {&stream_});
    stream_.synchronize();
    std::vector<std::byte> bytes(o_.bytes());
    o_.copy_to_host(bytes.data(), bytes.size());
    return bytes;
  }

  const ir::Variant& variant_;
  const ops::BoundInputs& bound_;
  RunOptions options_;
  TensorView q_, k_, v_;
  VariantInputs inputs_;
  std::string arch_;
  GpuTarget target_;  // this GPU's, read on the caller's thread (prepare() runs on workers without a context)
  Stream stream_;
  DeviceBuffer o_, state_;
  RecurrentOutputs outputs_;
  std::vector<std::byte> reference_;
};

// The candidate runs on the caller's device inputs (bound.args holds canonical views).
template <class Family>
CandidateFactory candidate_factory(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options) {
  return [&variant, &bound, options] {
    const auto& a = bound.args;
    auto find = [&](ir::Role role) {
      for (std::size_t i = 0; i < variant.inputs.size(); ++i)
        if (variant.inputs[i].role == role) return a.tensors[i];
      return TensorView{};
    };
    VariantInputs named;
    for (std::size_t i = 0; i < variant.inputs.size(); ++i) {
      const auto& input = variant.inputs[i];
      if (input.role != ir::Role::other) continue;
      if (input.kind == ir::InputKind::scalar) {
        named.scalars.emplace(input.name, a.scalars[i]);
      } else if (input.kind == ir::InputKind::head_key) {
        // The canonical view is [B,T,H,K] with a zero token stride: back to the [B,H,K] it was bound from.
        TensorView bhk = a.tensors[i];
        bhk.shape = {bhk.shape[0], bhk.shape[2], bhk.shape[3]};
        bhk.strides = {bhk.strides[0], bhk.strides[2], bhk.strides[3]};
        named.tensors.emplace(input.name, bhk);
      } else {
        named.tensors.emplace(input.name, a.tensors[i]);
      }
    }
    RunOptions run = options;
    run.initial_state = a.initial_state;
    return std::make_unique<TileCandidate<Family>>(variant, bound, run, find(ir::Role::query), find(ir::Role::key),
                                                   find(ir::Role::value), std::move(named));
  };
}

std::string joined(const std::vector<std::string>& problems) {
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
  return all;
}

// A rough time of a chunked tile in SM cycles (only the ranking matters), fitted to the H100's
// measurements of GLA at H16 K=V=128 (bench/RESULTS.md, issue 11; the fitted parts' times in
// "Evidence behind the heuristics", H15): per chunk a block pays a fixed part (barriers, the serial
// sum of the gates), the staging and products that scale with the chunk's keys (C x block_k) and
// values (C x block_v), and, where the next chunk's rows are not prefetched (chunked_prefetch), the
// latency of loading them. An SM runs its share of the blocks in rounds of those that fit at once
// (shared memory, registers estimated from the state values a thread keeps, threads); fewer blocks
// than SMs leave SMs idle. It ranks the measured tiles in their measured order at B32 T1024, B8
// T4096 and B2 T16384 (block_v 128 at 32-token chunks first where the (sequence, head) pairs fill
// the GPU, block_v 32 at B2 T16384), which is heuristic_chunked_tile's choice.
double chunked_cycles(const ir::Variant& variant, const TuneShape& shape, const cuda::ChunkedTile& tile,
                      const DeviceLimits& device) {
  const double C = tile.chunk, bk = tile.block_k, bv = tile.block_v;
  const int threads = 32 * tile.warps;
  const double fixed = 2800, per_key = 1.1, per_value = 1.2, unprefetched = 8000;
  // wgmma's state update: a little less per chunk than mma.sync's (bench/RESULTS.md, "Evidence
  // behind the heuristics", H16).
  // ws (a TMA producer beside wgmma consumers, a per-head decay): the fixed part overlaps the loads;
  // predicted at about 0.6 of the serial form's chunk (issue 11, eighth step).
  const double chunk_cycles = (tile.ws ? 0.6 : tile.wgmma ? 0.97 : 1.0) *
      (fixed + per_key * C * bk + per_value * C * bv + (cuda::chunked_prefetch(variant, tile) ? 0.0 : unprefetched));
  const std::int64_t blocks = shape.N * shape.H * ((shape.V + tile.block_v - 1) / tile.block_v);
  const int sms = std::max(1, device.sm_count);
  const std::int64_t per_sm = std::max<std::int64_t>(1, (blocks + sms - 1) / sms);
  // 207 registers at 32 state values per thread (K=V=128, tile 128,64,64,8, sm_90a), 219 at 64
  // (128,32,128,8): a base plus one per state value. Past 255 the rest spills to local memory,
  // read and written every chunk.
  const int wanted = 175 + static_cast<int>(bk * bv / threads);
  const int registers = std::min(255, wanted);
  const double spills = wanted > 255 ? 2.0 : 1.0;
  const int shared = std::max(1, cuda::chunked_shared_bytes(variant, tile));
  const int by_shared = device.max_shared_per_sm > 0 ? device.max_shared_per_sm / shared : 1;
  const int by_registers = device.max_registers_per_sm / (registers * threads);
  const int by_threads = 2048 / threads;
  const std::int64_t fit = std::max(1, std::min({by_shared, by_registers, by_threads}));
  const std::int64_t together = std::min(fit, per_sm);
  const double rate = std::min(1.0, static_cast<double>(tile.warps * together) / 8);
  const double chunks = std::ceil(static_cast<double>(std::max<std::int64_t>(1, shape.tokens_per_sequence)) / C);
  const double rounds = std::ceil(static_cast<double>(per_sm) / together);
  return spills * rounds * chunks * together * chunk_cycles / rate;
}

}  // namespace

TuneShape TuneShape::of(const ops::BoundInputs& bound) {
  const auto& args = bound.args;
  TuneShape shape;
  shape.N = bound.dims.N;
  shape.T = args.tokens;
  shape.tokens_per_sequence =
      args.cu_seqlens.empty() ? args.tokens : args.cu_seqlens.back() / std::max<std::int64_t>(1, bound.dims.N);
  shape.H = args.heads;
  shape.K = args.key_dim;
  shape.V = args.value_dim;
  return shape;
}

Config to_config(const cuda::RecurrentTile& tile) {
  Config c;
  c.set("block_k", tile.block_k).set("block_v", tile.block_v).set("warps", tile.warps);
  return c;
}

Config to_config(const cuda::ChunkedTile& tile) {
  Config c;
  c.set("block_k", tile.block_k).set("chunk", tile.chunk).set("block_v", tile.block_v).set("warps", tile.warps);
  if (!tile.split()) c.set("wgmma", tile.wgmma ? 1 : 0);
  if (tile.ws) c.set("ws", 1);
  if (tile.split())
    c.set("state_block_k", tile.state_block_k)
        .set("state_block_v", tile.state_block_v)
        .set("state_warps", tile.state_warps)
        .set("state_f32", tile.state_f32 ? 1 : 0);
  return c;
}

cuda::RecurrentTile to_recurrent_tile(const Config& c) { return {c.at("block_k"), c.at("block_v"), c.at("warps")}; }

cuda::ChunkedTile to_chunked_tile(const Config& c) {
  cuda::ChunkedTile tile{c.at("block_k"), c.at("chunk"), c.at("block_v"), c.at("warps")};
  tile.wgmma = c.find("wgmma").value_or(0) != 0;
  tile.ws = c.find("ws").value_or(0) != 0;
  if (c.contains("state_block_k")) {
    tile.state_block_k = c.at("state_block_k");
    tile.state_block_v = c.at("state_block_v");
    tile.state_warps = c.at("state_warps");
    tile.state_f32 = c.find("state_f32").value_or(0) != 0;
  }
  return tile;
}

SearchSpace recurrent_search_space(const TuneShape& shape, const cuda::RecurrentTile& heuristic) {
  SearchSpace space;
  const std::int64_t K = shape.K, V = shape.V;
  space.param("block_k", {heuristic.block_k}).param("block_v", {16, 32, 64, 128}).param("warps", {4, 8, 16});
  space.rule([K, V](const Config& c, const DeviceLimits& d) -> Reason {
    if (auto problems = cuda::validate_tile(to_recurrent_tile(c), K, V); !problems.empty()) return problems.front();
    return rule::threads(32LL * c.at("warps"), d);
  });
  return space;
}

SearchSpace chunked_search_space(const ir::Variant& variant, const TuneShape& shape, const cuda::ChunkedTile& heuristic) {
  SearchSpace space;
  space.param("block_k", {heuristic.block_k})
      .param("chunk", {16, 32, 64})
      .param("block_v", {16, 32, 64, 128})
      .param("warps", heuristic.ws ? std::vector<int>{2, 4, 8, 12} : std::vector<int>{2, 4, 8});
  // sm_90a (the heuristic runs wgmma there): the state update on mma.sync or on wgmma.
  space.param("wgmma", heuristic.wgmma || heuristic.ws ? std::vector<int>{0, 1} : std::vector<int>{0});
  // The warp-specialised form where the heuristic takes it (sm_90a, a per-head decay, bf16 q, k, v).
  if (heuristic.ws) space.param("ws", {0, 1});
  // A copy: a space may outlive the call that built it (ladle-tune, tests).
  auto held = std::make_shared<const ir::Variant>(variant);
  space.rule([held, shape](const Config& c, const DeviceLimits& d) -> Reason {
    const auto problems =
        cuda::validate_chunked_tile(to_chunked_tile(c), *held, shape.K, shape.V, d.max_shared_per_block, d.arch);
    if (!problems.empty()) return joined(problems);  // every limit a tile breaks, shared memory included
    return rule::threads(32LL * c.at("warps"), d);
  });
  space.cost_model([held, shape](const Config& c, const DeviceLimits& d) {
    return chunked_cycles(*held, shape, to_chunked_tile(c), d);
  });
  return space;
}

TunedKey tune_key(std::string_view family, std::string what, const std::vector<DType>& input_types,
                  std::string bucket, DType output_type, const DeviceLimits& device) {
  for (DType t : input_types) what += std::string("-") + dtype_name(t);
  return TunedKey::make(std::string(family), std::move(what), std::move(bucket), dtype_name(output_type),
                        device);
}

TunedKey tune_key(std::string_view family, const ir::Variant& variant, const cuda::KernelTypes& types,
                  const TuneShape& shape, const DeviceLimits& device) {
  const std::string what = ir::hash_hex(variant) + fmt::format("-r{}v{}i{}f{}", types.reverse, types.varlen,
                                                               types.initial_state, types.final_state);
  std::string bucket = shape_bucket({{"N", bucket_pow2(shape.N)},
                                     {"T", bucket_pow2(shape.T)},
                                     {"H", shape.H},
                                     {"K", shape.K},
                                     {"V", shape.V}});
  return tune_key(family, what, types.input_types, std::move(bucket), types.output_type, device);
}

Config tuned_config(const TuneJob& job, Policy policy, const TuneOptions& tune_options) {
  struct Choice {
    Config config;
    bool tuned_here = false;
  };
  static std::mutex mutex;
  static std::map<std::string, Choice> chosen;  // by key hash: the family is in the key
  const std::string memo = job.key.hash();
  {
    std::lock_guard lock(mutex);
    if (auto it = chosen.find(memo); it != chosen.end() && (policy == Policy::cached || it->second.tuned_here))
      return it->second.config;
  }
  TuneOptions with_policy = tune_options;
  with_policy.policy = policy;
  const TuneResult result = job.tune(with_policy);
  const bool tuned_here = result.source == TuneSource::tuned;
  std::lock_guard lock(mutex);
  chosen.insert_or_assign(memo, Choice{result.best, tuned_here});
  return result.best;
}

TuneJob recurrent_tune_job(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                           const cuda::RecurrentTile& heuristic) {
  const DeviceLimits device = DeviceLimits::from(Device::get().properties());
  const TuneShape shape = TuneShape::of(bound);
  TunedKey key = tune_key(recurrent_family, variant, kernel_types(variant, bound, options), shape, device);
  return TuneJob{std::move(key), Tuner(recurrent_search_space(shape, heuristic), device, to_config(heuristic)),
                 candidate_factory<RecurrentFamily>(variant, bound, options)};
}

TuneJob chunked_tune_job(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                         const cuda::ChunkedTile& heuristic) {
  const DeviceLimits device = DeviceLimits::from(Device::get().properties());
  const TuneShape shape = TuneShape::of(bound);
  TuneShape model = shape;
  const std::int64_t segment_tokens = chunked_segment_tokens(bound, options);
  if (segment_tokens > 0) {
    model.N = cuda::chunked_segments(bound.dims.N, bound.args.tokens, bound.args.cu_seqlens, segment_tokens, bound.args.reverse).segments();
    model.tokens_per_sequence = std::min(shape.tokens_per_sequence, segment_tokens);
  }
  TunedKey key = tune_key(segment_tokens > 0 ? chunked_segmented_family : chunked_family, variant,
                          kernel_types(variant, bound, options), shape, device);
  return TuneJob{std::move(key), Tuner(chunked_search_space(variant, model, heuristic), device, to_config(heuristic)),
                 candidate_factory<ChunkedFamily>(variant, bound, options)};
}

cuda::RecurrentTile tuned_tile(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                               const cuda::RecurrentTile& heuristic, const TuneOptions& tune_options) {
  const Policy policy = tune_options.policy.value_or(policy_from_env());
  if (policy == Policy::heuristic) return heuristic;
  return to_recurrent_tile(tuned_config(recurrent_tune_job(variant, bound, options, heuristic), policy, tune_options));
}

cuda::ChunkedTile tuned_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                     const cuda::ChunkedTile& heuristic, const TuneOptions& tune_options) {
  const Policy policy = tune_options.policy.value_or(policy_from_env());
  if (policy == Policy::heuristic) return heuristic;
  return to_chunked_tile(tuned_config(chunked_tune_job(variant, bound, options, heuristic), policy, tune_options));
}

}  // namespace ladle::gpu
