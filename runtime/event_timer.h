// Timing one kernel launch on the GPU the way the autotuner needs it: warm-up launches
// first (module load, clocks, instruction cache), then each repeat timed by its own pair of
// CUDA events on one stream, and the median taken so that one preempted run does not decide.
// The launch is told which of several input sets to use and is rotated through them, so a
// repeat does not find the previous repeat's data in the L2 cache.
#pragma once

#include <functional>
#include <vector>

namespace ladle {

class Stream;

struct TimingOptions {
  int warmup = 3;      // untimed launches first
  int repeats = 20;    // timed launches; the median is reported
  int input_sets = 1;  // launch(i) for i = 0, 1, ..., input_sets - 1, 0, 1, ...
};

// The median of the values (the mean of the middle two for an even count); throws
// InvalidArgument for an empty list.
double median(std::vector<double> values);

// Launches `launch(input_set)` on `stream` (the callback enqueues on it), timed by CUDA
// events; returns the median in milliseconds. Needs a CUDA device (throws NoCudaDriver).
double time_launches(const Stream& stream, const std::function<void(int input_set)>& launch,
                     const TimingOptions& options = {});

}  // namespace ladle
