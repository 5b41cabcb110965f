// The device headers (codegen/device/*.cuh) as the library carries them: compiled in as text at
// build time (embed.cmake), handed to NVRTC as in-memory headers by whoever compiles generated
// source (ops/detail/loaded_kernel.h), and found by the host emulation on the include path under
// the same names. A generated kernel includes them by name, so ladle-dump's source shows
// `#include <ladle/codegen/device/pipeline.cuh>` where the pipeline comes in.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ladle::device {

// (name, text) for every device header: name as a kernel includes it,
// "ladle/codegen/device/<file>.cuh".
const std::vector<std::pair<std::string, std::string>>& headers();

// The device headers `source` includes (NVRTC's in-memory headers for it; the compile cache's key
// covers exactly these).
std::vector<std::pair<std::string, std::string>> headers_for(const std::string& source);

}  // namespace ladle::device
