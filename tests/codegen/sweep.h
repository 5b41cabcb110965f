// How far the emulation tests sweep. By default each case of a case list runs once, at its own
// length: the default set reaches every form and edge (the case lists are built for that) and keeps
// the suite fast. Under LADLE_TEST_SWEEP=full (the ctest label `full`: `ctest -L full`, on demand
// and on the GPU machine) each case also runs at more lengths, with fresh inputs each: a single
// token, exactly one 64-token chunk, one token past it, and a long sequence; packed sequences get
// a single-token one, an empty one, one of exactly a chunk and a long one. The generated kernels
// take lengths at run time, so the sweep costs no build time.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda_cases.h"
#include "support/full_sweep.h"

namespace sweep {

inline bool full() { return test::full_sweep(); }

// The runs of `c` (a case whose recurrence case is `inner(c)`): {c, seed} alone, and under the full
// sweep also c at the lengths above, each with its own seed.
template <class C, class Inner>
std::vector<std::pair<C, std::uint64_t>> runs(const C& c, std::uint64_t seed, Inner inner) {
  std::vector<std::pair<C, std::uint64_t>> out{{c, seed}};
  if (!full()) return out;
  const cuda_cases::Case& base = inner(c);
  std::uint64_t next = seed + 1000003;
  if (base.cu_seqlens.empty()) {
    for (const int T : {1, 64, 65, 2 * base.T + 17}) {
      if (T == base.T) continue;
      C v = c;
      inner(v).T = T;
      inner(v).name += " [full sweep: T = " + std::to_string(T) + "]";
      out.emplace_back(v, next++);
    }
  } else {
    C v = c;
    const int long_one = 2 * base.T + 17;
    inner(v).cu_seqlens = {0, 1, 1, 65, 65 + long_one};
    inner(v).T = 65 + long_one;
    inner(v).name += " [full sweep: packed lengths 1, 0, 64, " + std::to_string(long_one) + "]";
    out.emplace_back(v, next++);
  }
  return out;
}

}  // namespace sweep
