// Helper process for the runtime tests.
//   ladle-test-probe compile <cache-dir> : compiles the vector add into that cache
//   ladle-test-probe driver              : prints what the driver layer reports
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <ladle/runtime/cache.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

#include "kernels.h"

namespace {
bool nvrtc_is_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("libnvrtc") != std::string::npos;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "compile" && argc == 3) {
      ladle::DiskCache cache(ladle::DiskCache::Settings::at(argv[2]));
      ladle::CompileOptions options;
      options.arch = "sm_90a";
      auto program = ladle::compile(ladle::test::vector_add_source, options, cache);
      std::printf("%s %s nvrtc_loaded=%d\n", program.from_cache ? "hit" : "miss",
                  program.key.c_str(), nvrtc_is_mapped() ? 1 : 0);
      return program.ptx.empty() || program.cubin.empty() ? 3 : 0;
    }
    if (mode == "driver") {
      std::printf("available=%d\n", ladle::driver_available() ? 1 : 0);
      std::printf("reason=%s\n", ladle::driver_unavailable_reason().c_str());
      try {
        ladle::Device::count();
        std::printf("count=ok\n");
      } catch (const ladle::NoCudaDriver& e) {
        std::printf("NoCudaDriver: %s\n", e.what());
      }
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe failed: %s\n", e.what());
    return 2;
  }
  std::fprintf(stderr, "usage: ladle-test-probe compile <dir> | driver\n");
  return 1;
}
