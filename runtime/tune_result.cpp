#include "tune_result.h"

#include <fmt/format.h>

#include <algorithm>

namespace ladle {

const char* to_string(TuneSource source) {
  switch (source) {
    case TuneSource::heuristic:
      return "heuristic";
    case TuneSource::cache:
      return "cache";
    case TuneSource::tuned:
      return "tuned";
  }
  return "?";
}

double TuneResult::speedup() const {
  if (!best_ms || !heuristic_ms || *best_ms <= 0) return 1.0;
  return *heuristic_ms / *best_ms;
}

std::size_t TuneResult::measured() const {
  return static_cast<std::size_t>(
      std::count_if(candidates.begin(), candidates.end(), [](const auto& c) { return c.valid; }));
}

std::string format_table(const TuneResult& result) {
  std::vector<const CandidateRecord*> rows;
  for (const auto& c : result.candidates) rows.push_back(&c);
  auto rank = [](const CandidateRecord* r) {
    return r->valid ? 0 : r->ms || r->prepare_ms ? 1 : 2;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const auto* a, const auto* b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return a->valid && *a->ms < *b->ms;
  });
  std::size_t width = 6;
  for (const auto* r : rows) width = std::max(width, r->config.to_string().size());
  std::string out =
      fmt::format("{:<{}}  {:>9}  {:<5}  {}\n", "config", width, "ms", "valid", "note");
  for (const auto* r : rows) {
    std::string note = r->reason;
    if (r->valid && r->config == result.best) note = "best";
    if (r->heuristic) note = note.empty() ? "heuristic" : "heuristic; " + note;
    if (const auto eol = note.find('\n'); eol != std::string::npos)
      note = note.substr(0, eol) + " ...";
    out += fmt::format("{:<{}}  {:>9}  {:<5}  {}\n", r->config.to_string(), width,
                       r->ms ? fmt::format("{:.4f}", *r->ms) : "-", r->valid ? "yes" : "no", note);
  }
  return out;
}

std::string format_summary(const TuneResult& result) {
  auto ms = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.4f} ms", *v) : std::string("unmeasured");
  };
  std::string out = fmt::format("best {} {}", result.best.to_string(), ms(result.best_ms));
  if (!(result.best == result.heuristic) || result.heuristic_ms) {
    out += fmt::format(", heuristic {} {} ({:.2f}x)", result.heuristic.to_string(),
                       ms(result.heuristic_ms), result.speedup());
  }
  if (!result.candidates.empty()) {
    out += fmt::format("; {} candidates ({} valid) in {:.1f} s", result.candidates.size(),
                       result.measured(), result.wall_ms / 1000);
  }
  if (result.budget_exhausted) out += ", stopped by the time budget";
  return out;
}

}  // namespace ladle
