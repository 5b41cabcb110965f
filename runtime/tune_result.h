// What a tuning found: the best config, the heuristic's time for comparison, and one row per
// candidate (measured, rejected with its reason, or not reached before the time budget ran
// out). The same record is returned by the tuner, stored by the tuned-config cache and
// printed by ladle-tune and ladle-cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tune_space.h"

namespace ladle {

struct CandidateRecord {
  Config config;
  std::optional<double> ms;          // the median time, when it was measured
  bool valid = false;                // measured, and its output matched the heuristic's
  std::string reason;                // why not valid: the exception, the mismatch, the budget
  std::optional<double> prepare_ms;  // time spent in Candidate::prepare (compiling, mostly)
  bool heuristic = false;            // this row is the heuristic config
};

// Where the config in a TuneResult came from.
enum class TuneSource {
  heuristic,  // policy heuristic: nothing was measured
  cache,      // a stored result (policy cached)
  tuned,      // measured just now
};
const char* to_string(TuneSource source);

struct TuneResult {
  Config best;
  std::optional<double> best_ms;  // absent under policy heuristic
  Config heuristic;
  std::optional<double> heuristic_ms;
  std::vector<CandidateRecord> candidates;  // the heuristic first, then in measuring order
  double wall_ms = 0;                       // the whole tuning, compiles included
  bool budget_exhausted = false;            // stopped early; best is the best so far
  std::size_t space_size = 0;               // combinations in the space
  std::size_t space_valid = 0;              // of which passed the validity rules
  std::size_t pruned = 0;                   // valid ones the cost model left out
  std::int64_t created_unix = 0;            // when it was tuned
  TuneSource source = TuneSource::tuned;

  // How much faster best is than the heuristic (1 when either time is unknown).
  double speedup() const;
  std::size_t measured() const;  // rows with a time and a matching output
};

// The candidate table, fastest first, then rejected rows, then rows the budget never reached:
//   config                    ms        valid  note
//   BK=64 BV=32 warps=4       0.412     yes    best
//   BK=64 BV=64 warps=8       -         no     compile: shared memory ...
std::string format_table(const TuneResult& result);
// One line: "best BK=64 BV=32 warps=4 0.412 ms, heuristic BK=32 ... 0.520 ms (1.26x); 40
// candidates (38 valid) in 8.1 s".
std::string format_summary(const TuneResult& result);

}  // namespace ladle
