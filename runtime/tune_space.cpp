#include "tune_space.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "driver.h"
#include "error.h"

namespace ladle {
namespace {

std::vector<std::pair<std::string, int>> sorted(const std::vector<std::pair<std::string, int>>& v) {
  auto copy = v;
  std::sort(copy.begin(), copy.end());
  return copy;
}

std::string kib(long long bytes) {
  return bytes % 1024 == 0 ? fmt::format("{} KiB", bytes / 1024) : fmt::format("{} B", bytes);
}

}  // namespace

// ---- Config ----

Config::Config(std::initializer_list<std::pair<std::string, int>> values) {
  for (const auto& [name, value] : values) {
    if (contains(name)) {
      throw InvalidArgument(fmt::format("config: parameter '{}' is given twice", name));
    }
    values_.emplace_back(name, value);
  }
}

Config& Config::set(std::string_view name, int value) {
  for (auto& [n, v] : values_) {
    if (n == name) {
      v = value;
      return *this;
    }
  }
  values_.emplace_back(std::string(name), value);
  return *this;
}

std::optional<int> Config::find(std::string_view name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return v;
  return std::nullopt;
}

int Config::at(std::string_view name) const {
  if (auto v = find(name)) return *v;
  throw InvalidArgument(
      fmt::format("config '{}' has no parameter '{}'", to_string(), std::string(name)));
}

std::string Config::to_string() const {
  std::string out;
  for (const auto& [name, value] : values_) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={}", name, value);
  }
  return out;
}

Config Config::parse(std::string_view text) {
  Config config;
  std::size_t i = 0;
  auto fail = [&](const std::string& why) {
    return InvalidArgument(
        fmt::format("config '{}': {}; expected NAME=INT pairs such as "
                    "'BK=64 BV=32 warps=4'",
                    std::string(text), why));
  };
  while (i < text.size()) {
    while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ','))
      ++i;
    if (i == text.size()) break;
    const std::size_t eq = text.find('=', i);
    if (eq == std::string_view::npos) throw fail(fmt::format("'{}' has no '='", text.substr(i)));
    const std::string name(text.substr(i, eq - i));
    if (name.empty() || std::any_of(name.begin(), name.end(), [](char c) {
          return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_');
        })) {
      throw fail(fmt::format("'{}' is not a parameter name", name));
    }
    std::size_t end = eq + 1;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end])) &&
           text[end] != ',')
      ++end;
    const std::string_view number = text.substr(eq + 1, end - eq - 1);
    int value = 0;
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || ptr != number.data() + number.size() || number.empty()) {
      throw fail(fmt::format("the value of '{}' ('{}') is not an integer", name, number));
    }
    if (config.contains(name)) throw fail(fmt::format("'{}' is given twice", name));
    config.set(name, value);
    i = end;
  }
  return config;
}

std::string Config::to_json() const {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (const auto& [name, value] : values_) object[name] = value;
  return object.dump();
}

Config Config::from_json(std::string_view text) {
  nlohmann::ordered_json object;
  try {
    object = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("config JSON '{}' does not parse: {}", text, e.what()));
  }
  if (!object.is_object()) {
    throw InvalidArgument(fmt::format("config JSON '{}' is not an object", text));
  }
  Config config;
  for (const auto& [name, value] : object.items()) {
    if (!value.is_number_integer() || value.get<long long>() > std::numeric_limits<int>::max() ||
        value.get<long long>() < std::numeric_limits<int>::min()) {
      throw InvalidArgument(fmt::format("config JSON '{}': '{}' is not an int", text, name));
    }
    config.set(name, value.get<int>());
  }
  return config;
}

bool operator==(const Config& a, const Config& b) {
  return a.size() == b.size() && sorted(a.values_) == sorted(b.values_);
}

bool operator<(const Config& a, const Config& b) {
  return sorted(a.values_) < sorted(b.values_);
}

// ---- DeviceLimits and rules ----

DeviceLimits DeviceLimits::from(const DeviceProperties& properties) {
  DeviceLimits limits;
  limits.name = properties.name;
  limits.arch = properties.arch();
  limits.sm_count = properties.sm_count;
  limits.max_shared_per_block = properties.max_shared_per_block_optin;
  limits.max_shared_per_sm = properties.max_shared_per_sm;
  limits.max_registers_per_block = properties.max_registers_per_block;
  limits.max_threads_per_block = properties.max_threads_per_block;
  return limits;
}

namespace rule {

Reason shared_memory(long long bytes, const DeviceLimits& device) {
  if (bytes <= device.max_shared_per_block) return std::nullopt;
  return fmt::format("shared memory {} > {} per block on {}", kib(bytes),
                     kib(device.max_shared_per_block), device.name);
}

Reason threads(long long threads_per_block, const DeviceLimits& device) {
  if (threads_per_block <= 0) {
    return fmt::format("{} threads per block (expected at least 1)", threads_per_block);
  }
  if (threads_per_block <= device.max_threads_per_block) return std::nullopt;
  return fmt::format("{} threads > {} per block on {}", threads_per_block,
                     device.max_threads_per_block, device.name);
}

Reason registers(long long per_thread, long long threads_per_block, const DeviceLimits& device) {
  if (per_thread > 255) return fmt::format("{} registers per thread > 255", per_thread);
  const long long total = per_thread * threads_per_block;
  if (total <= device.max_registers_per_block) return std::nullopt;
  return fmt::format("{} registers x {} threads = {} > {} per block on {}", per_thread,
                     threads_per_block, total, device.max_registers_per_block, device.name);
}

Reason divides(std::string_view divisor_name, long long divisor, std::string_view value_name,
               long long value) {
  if (divisor > 0 && value % divisor == 0) return std::nullopt;
  return fmt::format("{}={} does not divide {}={}", divisor_name, divisor, value_name, value);
}

Reason first(std::initializer_list<Reason> reasons) {
  for (const auto& reason : reasons)
    if (reason) return reason;
  return std::nullopt;
}

}  // namespace rule

// ---- SearchSpace ----

SearchSpace& SearchSpace::param(std::string name, std::vector<int> values) {
  for (const auto& p : params_) {
    if (p.name == name) {
      throw InvalidArgument(fmt::format("search space: parameter '{}' is declared twice", name));
    }
  }
  if (values.empty()) {
    throw InvalidArgument(fmt::format("search space: parameter '{}' has no values", name));
  }
  auto copy = values;
  std::sort(copy.begin(), copy.end());
  if (std::adjacent_find(copy.begin(), copy.end()) != copy.end()) {
    throw InvalidArgument(fmt::format("search space: parameter '{}' lists the value {} twice", name,
                                      *std::adjacent_find(copy.begin(), copy.end())));
  }
  params_.push_back({std::move(name), std::move(values)});
  return *this;
}

SearchSpace& SearchSpace::rule(Rule r) {
  rules_.push_back(std::move(r));
  return *this;
}

SearchSpace& SearchSpace::cost_model(CostModel model) {
  cost_model_ = std::move(model);
  return *this;
}

std::size_t SearchSpace::size() const {
  if (params_.empty()) return 0;
  std::size_t n = 1;
  for (const auto& p : params_) n *= p.values.size();
  return n;
}

std::vector<Config> SearchSpace::all() const {
  std::vector<Config> out;
  const std::size_t n = size();
  out.reserve(n);
  std::vector<std::size_t> index(params_.size(), 0);
  for (std::size_t k = 0; k < n; ++k) {
    Config config;
    for (std::size_t p = 0; p < params_.size(); ++p)
      config.set(params_[p].name, params_[p].values[index[p]]);
    out.push_back(std::move(config));
    // Odometer: the last parameter turns fastest.
    for (std::size_t p = params_.size(); p-- > 0;) {
      if (++index[p] < params_[p].values.size()) break;
      index[p] = 0;
    }
  }
  return out;
}

Reason SearchSpace::why_invalid(const Config& config, const DeviceLimits& device) const {
  for (const auto& p : params_) {
    if (!config.contains(p.name)) return fmt::format("parameter '{}' is missing", p.name);
  }
  for (const auto& [name, value] : config.values()) {
    if (std::none_of(params_.begin(), params_.end(), [&](const auto& p) { return p.name == name; }))
      return fmt::format("'{}' is not a parameter of this space", name);
  }
  for (const auto& r : rules_) {
    if (auto reason = r(config, device)) return reason;
  }
  return std::nullopt;
}

std::vector<Config> SearchSpace::enumerate(const DeviceLimits& device) const {
  std::vector<Config> out;
  for (auto& config : all())
    if (!why_invalid(config, device)) out.push_back(std::move(config));
  return out;
}

std::vector<std::pair<Config, Reason>> SearchSpace::explain(const DeviceLimits& device) const {
  std::vector<std::pair<Config, Reason>> out;
  for (auto& config : all()) {
    Reason reason = why_invalid(config, device);
    out.emplace_back(std::move(config), std::move(reason));
  }
  return out;
}

TunePlan SearchSpace::plan(const DeviceLimits& device, const Config& heuristic,
                           std::size_t max_candidates) const {
  if (auto reason = why_invalid(heuristic, device)) {
    throw InvalidArgument(fmt::format("the heuristic config '{}' is invalid on {}: {}",
                                      heuristic.to_string(), device.name, *reason));
  }
  TunePlan plan;
  plan.space_size = size();
  std::vector<Config> valid = enumerate(device);
  plan.valid = valid.size();
  std::erase(valid, heuristic);
  if (cost_model_) {
    auto cost_of = [&](const Config& c) {
      const double cost = cost_model_(c, device);
      return std::isnan(cost) ? std::numeric_limits<double>::infinity() : cost;
    };
    std::vector<double> cost(valid.size());
    for (std::size_t i = 0; i < valid.size(); ++i) cost[i] = cost_of(valid[i]);
    std::vector<std::size_t> order(valid.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return cost[a] < cost[b]; });
    // The N best of the valid configs, the heuristic among them when the model ranks it
    // there (then it takes one of the N places); it is measured in any case.
    std::size_t keep = std::min(max_candidates, valid.size());
    const double heuristic_cost = cost_of(heuristic);
    const auto better_than_heuristic = static_cast<std::size_t>(
        std::count_if(cost.begin(), cost.end(), [&](double c) { return c < heuristic_cost; }));
    if (keep > 0 && better_than_heuristic < max_candidates)
      keep = std::min(keep, max_candidates - 1);
    std::vector<Config> ranked;
    for (std::size_t i = 0; i < keep; ++i) ranked.push_back(std::move(valid[order[i]]));
    plan.pruned = valid.size() - ranked.size();
    valid = std::move(ranked);
  }
  plan.configs.push_back(normalize(heuristic));
  for (auto& config : valid) plan.configs.push_back(std::move(config));
  return plan;
}

Config SearchSpace::normalize(const Config& config) const {
  Config out;
  for (const auto& p : params_)
    if (auto v = config.find(p.name)) out.set(p.name, *v);
  for (const auto& [name, value] : config.values())
    if (!out.contains(name)) out.set(name, value);
  return out;
}

}  // namespace ladle
