// What a CUDA architecture offers the generators, named once. A family asks its Target
// (`target.wgmma`, `target.max_shared_bytes`), never the arch string: adding an architecture
// is a row in target.cpp plus the device parts that use what it adds (docs/design.md,
// "Adding an architecture").
#pragma once

#include <string>

namespace ladle::cuda {

struct Target {
  std::string arch;             // as NVRTC takes it: "sm_90a", "compute_80", ...; "" when not known
  int version = 0;              // compute capability as major * 10 + minor: 80, 86, 90, 100; 0: not known
  bool arch_specific = false;   // an "a" target (sm_90a): its code runs on that major.minor only
  bool mma_sync = false;        // warp-level mma.sync m16n8k16 on bf16/f16, ldmatrix, cp.async (sm_80 on)
  bool wgmma = false;           // warpgroup wgmma.mma_async and setmaxnreg: sm_90a (the arch-specific Hopper target)
  bool tma = false;             // cp.async.bulk.tensor with mbarrier transaction counts. sm_90 has it;
                                //   ladle's TMA kernels also run wgmma, so they ask for `wgmma`
  int max_shared_bytes = 0;     // opt-in dynamic shared memory per block; 0: not known (not checked)
  int registers_per_thread = 255;
  int registers_per_sm = 64 * 1024;

  // The target of ladle's warp-specialised (TMA + wgmma) kernels: what a plan made without a
  // device assumes, and what the attention backward (wgmma only) is compiled for.
  static const char* const hopper;
};

// The target an arch names ("sm_90a", "compute_90a", "sm_80", ...). An empty or unknown arch
// gives a Target with only `arch` set (nothing offered beyond the scalar path, nothing checked);
// a string that is no CUDA target ("sm90", "ampere") is an InvalidArgument naming `arch`.
Target target(const std::string& arch);

// target(arch).wgmma: the one place that decides whether an arch runs wgmma (sm_90a, compute_90a).
bool has_wgmma(const std::string& arch);

}  // namespace ladle::cuda
