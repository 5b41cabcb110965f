#include "event_timer.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "driver.h"
#include "error.h"

namespace ladle {

double median(std::vector<double> values) {
  if (values.empty()) throw InvalidArgument("median: no values (expected at least one)");
  const std::size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

double time_launches(const Stream& stream, const std::function<void(int input_set)>& launch,
                     const TimingOptions& options) {
  if (options.repeats < 1 || options.warmup < 0 || options.input_sets < 1) {
    throw InvalidArgument(fmt::format(
        "time_launches: warmup={} repeats={} input_sets={}; expected warmup >= 0, repeats >= 1, "
        "input_sets >= 1",
        options.warmup, options.repeats, options.input_sets));
  }
  int next = 0;
  auto launch_next = [&] {
    launch(next);
    next = (next + 1) % options.input_sets;
  };
  for (int i = 0; i < options.warmup; ++i) launch_next();
  // One pair of events per repeat, recorded back to back and read after one synchronize:
  // the host never waits between repeats, so the GPU does not idle (and clock down).
  std::vector<std::unique_ptr<Event>> starts, stops;
  for (int i = 0; i < options.repeats; ++i) {
    starts.push_back(std::make_unique<Event>());
    stops.push_back(std::make_unique<Event>());
  }
  for (int i = 0; i < options.repeats; ++i) {
    starts[i]->record(&stream);
    launch_next();
    stops[i]->record(&stream);
  }
  stream.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < options.repeats; ++i) ms.push_back(starts[i]->elapsed_ms_to(*stops[i]));
  return median(std::move(ms));
}

}  // namespace ladle
