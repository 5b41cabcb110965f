// What a kernel family may tune: a Config names one point (BK=64 BV=32 warps=4), a
// SearchSpace lists the values each parameter may take, the rules that say which points a
// device can run, and optionally a cheap cost model that ranks a large space so that only
// its most promising points are compiled and timed. Plain data and arithmetic: no GPU, no
// compiler, so enumeration and validity are tested on machines without either.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ladle {

struct DeviceProperties;

// Named integer parameters in a fixed order (the order they were set; a SearchSpace sets
// them in its own parameter order). Two configs are equal when they hold the same names
// and values, whatever the order.
class Config {
 public:
  Config() = default;
  Config(std::initializer_list<std::pair<std::string, int>> values);  // a repeated name throws

  Config& set(std::string_view name, int value);  // replaces, or appends a new name
  int at(std::string_view name) const;            // throws InvalidArgument naming the config
  int operator[](std::string_view name) const { return at(name); }
  std::optional<int> find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name).has_value(); }
  const std::vector<std::pair<std::string, int>>& values() const { return values_; }
  std::size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }

  std::string to_string() const;  // "BK=64 BV=32 warps=4"
  // Reads to_string()'s form (spaces or commas between pairs); throws InvalidArgument.
  static Config parse(std::string_view text);
  std::string to_json() const;  // {"BK":64,"BV":32,"warps":4}, in this config's order
  static Config from_json(std::string_view json);  // a flat object of integers, else throws

  friend bool operator==(const Config& a, const Config& b);
  friend bool operator<(const Config& a, const Config& b);  // a total order, for maps

 private:
  std::vector<std::pair<std::string, int>> values_;
};

// The limits a validity rule checks a config against. Built from the running device, or by
// hand (tests, and enumerating a space for another GPU).
struct DeviceLimits {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  std::string arch;  // "sm_90a"
  int sm_count = 0;
  int max_shared_per_block = 0;  // bytes a kernel may ask for (the opt-in maximum)
  int max_shared_per_sm = 0;
  int max_registers_per_block = 0;   // 32-bit registers
  int max_registers_per_sm = 65536;  // the same on every architecture since sm_50
  int max_threads_per_block = 0;

  static DeviceLimits from(const DeviceProperties& properties);
};

// Why a config cannot run (a sentence that names the limit), or nullopt when it can.
using Reason = std::optional<std::string>;

// The checks most families need; a family's rule combines them:
//   return rule::first({rule::shared_memory(smem_bytes(c), d), rule::threads(32 * c["warps"], d),
//                       rule::divides("BK", c["BK"], "K", K)});
namespace rule {
Reason shared_memory(long long bytes, const DeviceLimits& device);
Reason threads(long long threads_per_block, const DeviceLimits& device);
Reason registers(long long per_thread, long long threads_per_block, const DeviceLimits& device);
// "BK=48 does not divide K=128"
Reason divides(std::string_view divisor_name, long long divisor, std::string_view value_name,
               long long value);
Reason first(std::initializer_list<Reason> reasons);  // the first failure, if any
}  // namespace rule

// The configs a tuning will measure: the heuristic first, then the others, most promising
// first when the space has a cost model (else in enumeration order).
struct TunePlan {
  std::vector<Config> configs;
  std::size_t space_size = 0;  // every combination of the parameters' values
  std::size_t valid = 0;       // combinations that passed the rules
  std::size_t pruned = 0;      // valid ones the cost model left out
};

class SearchSpace {
 public:
  using Rule = std::function<Reason(const Config&, const DeviceLimits&)>;
  // Lower is more promising (e.g. a predicted time); it only ranks, so it may be rough.
  using CostModel = std::function<double(const Config&, const DeviceLimits&)>;
  struct Parameter {
    std::string name;
    std::vector<int> values;
  };

  // A parameter with its candidate values; a repeated name, no values or a repeated value
  // throws InvalidArgument.
  SearchSpace& param(std::string name, std::vector<int> values);
  SearchSpace& rule(Rule rule);  // every config must pass every rule, in the order added
  SearchSpace& cost_model(CostModel model);

  const std::vector<Parameter>& params() const { return params_; }
  bool has_cost_model() const { return static_cast<bool>(cost_model_); }
  std::size_t size() const;  // every combination, valid or not
  // Every combination, the first parameter varying slowest (BK=16 BV=16, BK=16 BV=32, ...).
  std::vector<Config> all() const;
  // A config must name exactly the space's parameters (values off the grid are allowed: a
  // heuristic may pick one), then pass the rules.
  Reason why_invalid(const Config& config, const DeviceLimits& device) const;
  std::vector<Config> enumerate(const DeviceLimits& device) const;  // the valid ones, all()'s order
  // Every combination with the reason it is invalid (nullopt when valid), all()'s order.
  std::vector<std::pair<Config, Reason>> explain(const DeviceLimits& device) const;
  // The heuristic (first; it must be valid, else InvalidArgument) and the valid others: with a
  // cost model, the max_candidates best by the model (ties in enumeration order); without
  // one, all of them (the time budget bounds the work).
  TunePlan plan(const DeviceLimits& device, const Config& heuristic,
                std::size_t max_candidates) const;
  // The same config with its parameters in the space's order (unknown names last).
  Config normalize(const Config& config) const;

 private:
  std::vector<Parameter> params_;
  std::vector<Rule> rules_;
  CostModel cost_model_;
};

}  // namespace ladle
