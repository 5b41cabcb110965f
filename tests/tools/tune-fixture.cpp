// Fills the tuned-config cache ($LADLE_CACHE_DIR/tuned) the way tunings would, with the
// pretend tile family of the runtime tests (no GPU), plus one damaged file, so that the
// ladle-cache tests have entries to show and to clear.
#include <ladle/runtime/autotune.h>

#include <fstream>
#include <iostream>

#include "runtime/tune_fixtures.h"

int main() {
  using namespace ladle;
  using namespace ladle::test;
  TunedCache& cache = TunedCache::global();
  if (!cache.disk_enabled()) {
    std::cerr << "tune-fixture: set LADLE_CACHE_DIR to a writable directory\n";
    return 1;
  }
  cache.clear();
  const Tuner tuner(tile_space(128, 96), small_device(), tile(32, 32, 2, 1));
  TuneOptions options;
  options.policy = Policy::force;
  options.progress_interval_ms = 0;  // a progress line per candidate, for the log tests
  FakeCandidate bf16;
  bf16.fail_prepare = {tile(128, 32, 2, 2)};  // the fastest: the next one wins
  tuner.tune(TunedKey::make("tiles", "variant-1", "B1-T1024", "bf16", small_device()), bf16,
             options);
  FakeCandidate fp16;
  tuner.tune(TunedKey::make("tiles", "variant-1", "B2-T2048", "fp16", small_device()), fp16,
             options);
  std::ofstream(cache.dir() / (std::string(32, '0') + ".json")) << "{\"format\": 1, \"key\"";
  return 0;
}
