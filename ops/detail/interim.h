// A cold call's interim form (docs/caches.md, "A first call"): where the programs of the form ladle
// chose are in neither cache, a call starts their compile on a thread (runtime/background.h) and runs
// a form whose programs compile in a fraction of the time; later calls of the shape take the chosen
// form once its programs are compiled. The forward's interim form is the fused recurrent kernel
// (gpu_recurrent.cpp), the backward's the fused-recurrent backward (gpu_backward.cpp). Internal to
// ops (not installed).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../generated_kernels.h"
#include "../gpu_recurrent.h"

namespace ladle::gpu::detail {

// Whether this call runs its interim form while `programs` compile behind it. Only where the caller
// left the form to ladle (no algorithm, no chunked tile named), LADLE_BACKGROUND_COMPILE is on and the
// compile cache keeps what the job compiles, and never inside a CUDA graph's capture (the kernel
// captured is the one every replay runs: the chosen form's then, compiled in the foreground or by the
// job, waited for). `job` names the programs (their launchers' keys, or the call's signature);
// `programs` generates them, called only where the job is new (what it throws means no interim: the
// chosen form then runs and reports it). A job that has ended (compiled, or failed: the foreground
// compile then reports it) means the chosen form runs; one found compiled already is recorded as
// ended. `what` names the interim form in the debug log.
bool interim(const RunOptions& options, const std::string& job, const std::string& arch,
             const std::function<std::vector<GeneratedKernel>()>& programs, const LaunchOptions& launch,
             const char* what = "the fused recurrent kernel");

}  // namespace ladle::gpu::detail
