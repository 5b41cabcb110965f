// The fused recurrent CUDA generator. Its kernels are checked three ways without a GPU:
// the text (header, names), a host emulation of the CUDA execution model that runs every
// kernel of cuda_cases.h against the CPU path (itself checked against the fp64 reference),
// and nvcc, which must compile every kernel to PTX for sm_90a.
#include <catch2/catch.hpp>

#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/ops/bind.h>
#include <ladle/runtime/error.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <unistd.h>

#include "case_binding.h"
using namespace case_binding;
#include "cuda_cases.h"
#include "cuda_emulation.h"
#include "emulated_kernels.inc"
#include "support/tensors.h"

using namespace ladle;

namespace {

std::string find_case_source(const std::string& name) {
  for (const cuda_cases::Case& c : cuda_cases::all())
    if (c.name == name) return cuda::generate_recurrent(c.variant, c.spec).source;
  FAIL("no case " << name);
  return {};
}

}  // namespace

TEST_CASE("the source opens with the printed variant and the config, and uses the expression's names", "[codegen][cuda]") {
  const cuda_cases::Case c = cuda_cases::all()[17];  // bf16, packed, reverse, states
  const cuda::RecurrentKernel kernel = cuda::generate_recurrent(c.variant, c.spec);
  INFO(kernel.source);
  std::istringstream printed(ir::to_string(c.variant));
  for (std::string line; std::getline(printed, line);) CHECK_THAT(kernel.source, Catch::Contains("// " + line + "\n"));
  CHECK_THAT(kernel.source, Catch::StartsWith("// ladle: fused recurrent kernel " + kernel.name + "\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// config: block_k=16 block_v=16 warps=4 (128 threads); requires K <= 16\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// reverse=1 varlen=1 initial_state=1 final_state=1\n"));
  CHECK_THAT(kernel.source, Catch::Contains("// types: q bf16, k bf16, v bf16, g f32, gk f32, gv f32, g_gamma f32, o bf16, state f32 (initial_state bf16)\n"));
  CHECK_THAT(kernel.source, Catch::Contains("extern \"C\" __global__ void __launch_bounds__(128) " + kernel.name + "("));
  CHECK_THAT(kernel.source, Catch::Contains("decay_k[cpos][i] = use ? expf((g_i + gk_i) + head_log_decay) : 1.0f;"));
  CHECK_THAT(kernel.source, Catch::Contains("decay_v[cpos][jv_local] = use ? expf(gv_j) : 1.0f;"));
  CHECK_THAT(kernel.source, Catch::Contains("state[r] = state[r] * decay_k[cpos][i] * decay_j + k_feature[cpos][i] * v_col;"));
  CHECK_THAT(kernel.source, Catch::Contains("const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];"));
  CHECK_THAT(kernel.source, Catch::Contains("const ladle_bf16* __restrict__ initial_state,"));
  CHECK(kernel.threads == 128);
  CHECK(kernel.block_v == 16);

  // The parameters are declared in the order params lists them.
  std::size_t at = kernel.source.find(kernel.name + "(");
  for (const cuda::KernelParam& p : kernel.params) {
    const std::size_t next = kernel.source.find(" " + p.name + (&p == &kernel.params.back() ? ")" : ","), at);
    INFO(p.name);
    REQUIRE(next != std::string::npos);
    at = next;
  }
}

TEST_CASE("the same variant and spec give the same source; each spec change renames the kernel", "[codegen][cuda]") {
  const cuda_cases::Case c = cuda_cases::all()[5];
  const cuda::RecurrentKernel a = cuda::generate_recurrent(c.variant, c.spec);
  CHECK(cuda::generate_recurrent(c.variant, c.spec).source == a.source);
  std::vector<cuda::RecurrentKernelSpec> specs(6, c.spec);
  specs[0].reverse = !specs[0].reverse;
  specs[1].tile.warps = 2;
  specs[2].output_type = DType::bf16;
  specs[3].input_types[0] = DType::f16;
  specs[4].final_state = !specs[4].final_state;
  specs[5].varlen = !specs[5].varlen;
  std::set<std::string> names = {a.name};
  for (const auto& spec : specs) CHECK(names.insert(cuda::generate_recurrent(c.variant, spec).name).second);
}

TEST_CASE("inputs named like the template's locals or C++ words are renamed, the others keep their names", "[codegen][cuda]") {
  const std::string source = find_case_source("input names that clash with the template or C++");
  CHECK_THAT(source, Catch::Contains("const float* __restrict__ in3_state,"));
  CHECK_THAT(source, Catch::Contains("const float* __restrict__ in4_int,"));
  CHECK_THAT(source, Catch::Contains("const float* __restrict__ x_y,"));
  CHECK_THAT(source, Catch::Contains("float in6_read_scale,"));
  CHECK_THAT(source, Catch::Contains("const float* __restrict__ q,"));
}

TEST_CASE("tiles are validated", "[codegen][cuda]") {
  CHECK(cuda::validate_tile({64, 32, 4}, 64, 64).empty());
  CHECK(cuda::validate_tile(cuda::default_tile(256, 256), 256, 256).empty());
  CHECK(cuda::validate_tile(cuda::default_tile(5, 3), 5, 3).empty());
  CHECK(cuda::validate_tile({64, 32, 4}, 65, 8) == std::vector<std::string>{"K = 65 exceeds block_k = 64"});
  CHECK(cuda::validate_tile({64, 32, 3}, 8, 8).front() == "warps = 3, expected 1, 2, 4, 8 or 16");
  CHECK(cuda::validate_tile({48, 32, 4}, 8, 8).front() == "block_k = 48, expected a power of two up to 256");
  CHECK(cuda::validate_tile({64, 64, 1}, 8, 8).front() == "block_v = 64, expected a power of two up to the 32 threads");
  CHECK_THAT(cuda::validate_tile({256, 32, 1}, 8, 8).front(), Catch::Contains("each thread would keep 256 state rows"));

  const cuda_cases::Case c = cuda_cases::all()[0];
  cuda::RecurrentKernelSpec bad = c.spec;
  bad.tile.warps = 3;
  REQUIRE_THROWS_AS(cuda::generate_recurrent(c.variant, bad), InvalidArgument);
  bad = c.spec;
  bad.input_types.pop_back();
  REQUIRE_THROWS_WITH(cuda::generate_recurrent(c.variant, bad), Catch::Contains("input_types has 3 entries, expected one per input (4)"));
  bad = c.spec;
  bad.output_type = DType::f64;
  REQUIRE_THROWS_WITH(cuda::generate_recurrent(c.variant, bad), Catch::Contains("output_type f64"));
}

TEST_CASE("every generated kernel, run on a host emulation of CUDA, computes what the CPU path computes", "[codegen][cuda][emulation]") {
  const auto cases = cuda_cases::all();
  REQUIRE(std::size(emulated_kernels) == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const cuda_cases::Case& c = cases[i];
    const cuda::RecurrentKernel kernel = cuda::generate_recurrent(c.variant, c.spec);
    INFO(c.name << " (" << kernel.name << ")");
    REQUIRE(kernel.name == emulated_kernels[i].name);  // the build-time sources are this generator's
    REQUIRE(cuda::validate_tile(c.spec.tile, c.K, c.V).empty());

    const Errors errors = emulated_against_cpu(c, 1000 + i, [&](const ops::BoundInputs& gpu_run, const Bound& bound) {
      Arguments arguments(kernel.params, c, gpu_run.args);
      const unsigned grid_x = static_cast<unsigned>((c.V + kernel.block_v - 1) / kernel.block_v);
      cuda_emulation::launch(grid_x, static_cast<unsigned>(bound.sequences * c.H), kernel.threads,
                             [&] { emulated_kernels[i].launch(arguments.data()); });
    });
    const double tolerance = c.spec.output_type == DType::f32 ? 1e-5 : 1e-2;
    CHECK(errors.o < tolerance);
    if (c.spec.final_state) CHECK(errors.final_state < 1e-5);
  }
}

namespace {

// Runs nvcc on `source`; returns its log, empty when it succeeded.
std::string nvcc_ptx(const std::string& source, const std::string& arch, const std::filesystem::path& dir, const std::string& stem) {
  const std::filesystem::path cu = dir / (stem + ".cu"), ptx = dir / (stem + ".ptx"), log = dir / (stem + ".log");
  std::ofstream(cu) << source;
  const std::string command = std::string("\"") + LADLE_TEST_NVCC + "\" --ptx -arch=" + arch + " -std=c++17 -I\"" + LADLE_TEST_INCLUDE + "\" \"" + cu.string() +
                              "\" -o \"" + ptx.string() + "\" > \"" + log.string() + "\" 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return status == 0 ? std::string() : "nvcc failed (" + std::to_string(status) + "):\n" + text;
}

}  // namespace

TEST_CASE("nvcc compiles every generated kernel to PTX for sm_90a", "[codegen][cuda][nvcc]") {
  if (std::string(LADLE_TEST_NVCC).empty()) {
    WARN("nvcc not found at configure time: the generated kernels were not compiled");
    return;
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("ladle-cuda-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto cases = cuda_cases::all();

  // All kernels in one translation unit (the helpers are guarded), so one nvcc run checks them.
  std::string all;
  std::vector<std::string> names;
  for (const cuda_cases::Case& c : cases) {
    const cuda::RecurrentKernel kernel = cuda::generate_recurrent(c.variant, c.spec);
    if (std::find(names.begin(), names.end(), kernel.name) != names.end()) continue;  // cases that differ only in their inputs
    all += kernel.source + "\n";
    names.push_back(kernel.name);
  }
  const std::string log = nvcc_ptx(all, "sm_90a", dir, "all");
  INFO(log);
  REQUIRE(log.empty());
  std::ifstream ptx(dir / "all.ptx");
  const std::string text((std::istreambuf_iterator<char>(ptx)), std::istreambuf_iterator<char>());
  for (const std::string& name : names) CHECK_THAT(text, Catch::Contains(".entry " + name));

  // Each source stands alone too, and does not need Hopper.
  for (const std::size_t i : {std::size_t{16}, cases.size() - 1}) {
    INFO(cases[i].name);
    CHECK(nvcc_ptx(cuda::generate_recurrent(cases[i].variant, cases[i].spec).source, "sm_90a", dir, "alone" + std::to_string(i)).empty());
  }
  CHECK(nvcc_ptx(cuda::generate_recurrent(cases[17].variant, cases[17].spec).source, "sm_80", dir, "sm80").empty());
  std::filesystem::remove_all(dir);
}
