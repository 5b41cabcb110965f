// ladle-dump: shows everything ladle generates for a kernel: the CUDA source, the PTX,
// the resource usage ptxas reported, the cache entry, and the SASS when cuobjdump exists.
//   ladle-dump kernel.cu [--arch sm_90a] [--sass] [--only source|ptx|resources|path]
//   ladle-dump --op gla|recurrent|delta_rule|gated_delta_rule|rwkv6 [--gates g,gk,gv,g_gamma|l2norm] [--dtype bf16] [-K 128 -V 128]
//              [--algo recurrent|chunked] [--tile 128,64,8 | 128,64,64,8 for chunked]
//              [--reverse] [--varlen] [--states]   (the generated kernel; the delta rules' chunked form: its three)
//              [--backward]   (the backward's generated kernels: slots, totals, chain, and its helpers;
//                              with --op attention: prep and main, sm_90a)
//   ladle-dump --op attention [--mask causal,window,segments,mask,sinks,dropout] [--mods bias,softcap]
//              [-D 128 --dv 128] [--dtype bf16] [--tile 128,64,8,2[,wgmma]] [--varlen] [--lse]
//              (with --op attention, -D is the head dim; otherwise a preprocessor definition)
// Nothing here runs a kernel, so nothing needs a CUDA driver: with --arch the driver is not
// opened (tests/tools pins it); without it the target is this GPU when the driver reports one, else sm_80 (the
// attention backward: sm_90a). The PTX and resource-usage headings name the target; a machine
// without a GPU gets no warning about its missing driver.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ladle/codegen/cuda_chunked_delta.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/error.h>

namespace fs = std::filesystem;

namespace {

std::string find_cuobjdump() {
  if (const char* home = std::getenv("CUDA_HOME")) {
    fs::path p = fs::path(home) / "bin" / "cuobjdump";
    if (fs::exists(p)) return p.string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && fs::exists(fs::path(dir) / "cuobjdump")) return (fs::path(dir) / "cuobjdump").string();
  }
  if (fs::exists("/usr/local/cuda/bin/cuobjdump")) return "/usr/local/cuda/bin/cuobjdump";
  return "";
}

std::string run_capture(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    ::pclose(pipe);
  }
  return out;
}

void section(const std::string& title) { std::cout << fmt::format("\n===== {} =====\n", title); }

void print_resources(const ladle::CompiledProgram& program) {
  std::cout << fmt::format("{:<40} {:>5} {:>7} {:>7} {:>7} {:>8} {:>6}\n", "kernel", "regs",
                           "stack", "spill-st", "spill-ld", "smem", "cmem");
  for (const auto& k : program.kernels) {
    if (k.registers < 0) {
      std::cout << fmt::format("{:<40} (PTX only: compile for a real arch, e.g. --arch sm_90a, "
                               "for resource usage)\n", k.name);
      continue;
    }
    std::cout << fmt::format("{:<40} {:>5} {:>7} {:>7} {:>7} {:>8} {:>6}\n", k.name, k.registers,
                             k.stack_frame_bytes, k.spill_store_bytes, k.spill_load_bytes,
                             k.shared_bytes, k.constant_bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-dump: the CUDA source, PTX, resource usage and SASS of a kernel"};
  std::string file, arch, only;
  std::vector<std::string> defines;
  bool sass = false;
  std::string op, gates, dtype = "bf16", tile_text;
  int key_dim = 128, value_dim = 128;
  bool reverse = false, varlen = false, states = false, segmented = false, backward = false;
  auto* file_option = app.add_option("file", file, "a CUDA C++ source file (.cu)")->check(CLI::ExistingFile);
  auto* op_option = app.add_option("--op", op, "show the kernel ladle generates for an op")
                        ->check(CLI::IsMember({"gla", "recurrent", "delta_rule", "gated_delta_rule", "rwkv6", "attention"}));
  file_option->excludes(op_option);
  app.add_option("--gates", gates, "recurrent: comma-separated gates among g,gk,gv,g_gamma; gla: g_gamma adds it; "
                                  "delta_rule, gated_delta_rule: l2norm (q and k L2-normalised in the kernel)");
  app.add_option("--dtype", dtype, "input and output dtype")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("-K", key_dim, "key head dim");
  app.add_option("-V", value_dim, "value head dim");
  std::string algo = "recurrent";
  app.add_option("--algo", algo, "the kernel family: recurrent (token by token) or chunked (tensor cores)")
      ->check(CLI::IsMember({"recurrent", "chunked"}));
  app.add_option("--tile", tile_text,
                 "recurrent: block_k,block_v,warps; chunked: block_k,chunk,block_v,warps[,wgmma|,ws] (default with --arch sm_90a: ws for a per-head decay, a key-side gate alone or a value-side gate alone in bf16, else wgmma) or a split tile; attention: block_m,block_n,warps,stages[,sync|wgmma|ws] (wgmma, ws: --arch sm_90a; default: the heuristic)");
  app.add_flag("--reverse", reverse, "t = T..1");
  app.add_flag("--varlen", varlen, "packed sequences (cu_seqlens)");
  app.add_flag("--backward", backward,
               "recurrent ops: the backward's generated kernels (slots, totals, chain; 16-bit slots with --algo chunked) "
               "and its helpers, as a call of these types runs them; attention: the backward's prep and main kernels (sm_90a)");
  app.add_flag("--states", states, "initial and final states");
  app.add_flag("--segmented", segmented,
               "chunked: the segmented form's two kernels (each segment's own state, then the serial form over segments)");
  std::string masks, mods;
  int value_head_dim = 0;
  bool lse = false;
  app.add_option("--mask", masks, "attention: comma-separated among causal,window,segments,mask,sinks,dropout");
  app.add_option("--mods", mods, "attention: comma-separated score modifiers among bias,softcap");
  app.add_option("--dv", value_head_dim, "attention: the value head dim (default: D)");
  app.add_flag("--lse", lse, "attention: also write the log-sum-exp");
  app.add_option("--arch", arch,
                 "target, e.g. sm_90a or compute_80 (default: this GPU, else sm_80)");
  app.add_option("-D,--define", defines, "preprocessor definitions passed to NVRTC (NAME=VALUE); with --op attention: the head dim");
  app.add_flag("--sass", sass, "also disassemble the cubin with cuobjdump");
  app.add_option("--only", only, "print one part only")
      ->check(CLI::IsMember({"source", "ptx", "resources", "path"}));
  CLI11_PARSE(app, argc, argv);
  if (file.empty() && op.empty()) {
    std::cerr << "ladle-dump: give a .cu file or --op\n" << app.help();
    return 2;
  }

  try {
    ladle::CompiledProgram program;
    std::vector<ladle::CompiledProgram> programs;  // the kernels before `program` (a family of several)
    if (op == "attention") {
      // -D is the head dim here (as the op's docs write it), a definition for .cu files.
      int head_dim = 128;
      if (defines.size() > 1 || (defines.size() == 1 && defines[0].find_first_not_of("0123456789") != std::string::npos))
        throw ladle::InvalidArgument("ladle-dump: with --op attention, -D takes the head dim (e.g. -D 128)");
      if (!defines.empty()) head_dim = std::stoi(defines[0]);
      const int dv = value_head_dim > 0 ? value_head_dim : head_dim;
      const std::string list = masks + (!masks.empty() && !mods.empty() ? "," : "") + mods;
      const ladle::ir::AttentionVariant& variant = ladle::attention_variant(ladle::parse_attention_features(list));
      const auto type = dtype == "f32" ? ladle::DType::f32 : dtype == "f16" ? ladle::DType::f16 : ladle::DType::bf16;
      ladle::cuda::AttentionKernelSpec spec;
      for (const auto& input : variant.inputs)
        spec.input_types.push_back(input.role != ladle::ir::Role::other ? type
                                   : input.name == "attention_mask"     ? ladle::DType::u8
                                                                        : ladle::DType::f32);
      spec.output_type = type;
      spec.D = head_dim, spec.Dv = dv;
      spec.varlen = varlen;
      spec.lse = lse;
      spec.tile = ladle::cuda::default_attention_tile(head_dim, dv);
      if (!tile_text.empty()) {
        spec.tile = ladle::cuda::parse_attention_tile(tile_text);
      }
      spec.arch = arch;
      // As a call with a positive scale (and soft cap) compiles it: the factor folded into p's FFMA.
      const auto factor = ladle::cuda::attention_logit_factor(variant, std::vector<float>(variant.inputs.size(), 1.0f));
      spec.positive_logit_factor = factor && *factor > 0.0;
      if (auto problems = ladle::cuda::validate_attention_tile(spec.tile, head_dim, dv, 0, ladle::cuda::attention_split_f32(variant, spec), arch);
          !problems.empty())
        throw ladle::InvalidArgument("ladle-dump: tile " + ladle::cuda::to_string(spec.tile) + ": " + problems.front());
      if (backward) {  // the backward's two kernels (prep, main: sm_90a), every gradient wanted, d_output of q's type
        ladle::cuda::AttentionBackwardSpec bspec;
        bspec.input_types = spec.input_types;
        bspec.D = head_dim, bspec.Dv = dv, bspec.varlen = varlen;
        bspec.output_type = bspec.d_output_type = type;
        bspec.sinks_gradient = variant.sinks;
        for (std::size_t k = 0; k < variant.inputs.size(); ++k)
          bspec.input_gradients.push_back(spec.input_types[k] == ladle::DType::f32 && variant.inputs[k].kind != ladle::ir::InputKind::scalar);
        bspec.arch = arch.empty() ? "sm_90a" : arch;
        bspec.dq_tma = true;  // an aligned dq, as the launcher's default tile takes it (dQ by TMA reductions)
        program = ladle::gpu::compile_attention_backward(variant, bspec, bspec.arch).program;
        std::cout << fmt::format("op attention backward (variant {}), D={} Dv={} {}, {}\n", ladle::ir::hash_hex(variant), head_dim, dv,
                                 dtype, bspec.arch);
      } else {
        program = ladle::gpu::compile_attention(variant, spec, arch).program;
        std::cout << fmt::format("op attention (variant {}), tile {}, D={} Dv={} {}\n", ladle::ir::hash_hex(variant),
                                 ladle::cuda::to_string(spec.tile), head_dim, dv, dtype);
      }
    } else if (!op.empty()) {
      const ladle::ir::Variant& variant = ladle::named_variant(op, gates);
      const auto type = dtype == "f32" ? ladle::DType::f32 : dtype == "f16" ? ladle::DType::f16 : ladle::DType::bf16;
      ladle::cuda::KernelTypes types;
      for (const auto& input : variant.inputs)
        types.input_types.push_back(input.kind == ladle::ir::InputKind::scalar ? ladle::DType::f32 : type);
      types.output_type = type;
      types.reverse = reverse;
      types.varlen = varlen;
      types.initial_state = types.final_state = states;
      std::string tile_name;
      if (backward) {
        // A call of these types with every query head (small host tensors, never read): the plan the
        // library makes for it, then each generated kernel and the helpers.
        const std::int64_t T = 64;
        std::vector<ladle::Tensor> keep;
        const auto tensor = [&](ladle::DType t, std::vector<std::int64_t> shape) {
          keep.emplace_back(t, std::move(shape), 0.0f);
          return keep.back().view();
        };
        keep.reserve(16);
        ladle::VariantInputs inputs;
        for (const auto& input : variant.inputs) {
          if (input.kind == ladle::ir::InputKind::scalar) inputs.scalars.emplace(input.name, 1.0f);
          else if (input.role == ladle::ir::Role::other)
            inputs.tensors.emplace(input.name, input.kind == ladle::ir::InputKind::head ? tensor(type, {1})
                                               : input.kind == ladle::ir::InputKind::token_head ? tensor(type, {1, T, 1})
                                               : tensor(type, {1, T, 1, input.kind == ladle::ir::InputKind::token_value ? value_dim : key_dim}));
        }
        ladle::RunOptions options;
        options.algorithm = algo == "chunked" ? ladle::Algorithm::chunked : ladle::Algorithm::recurrent;
        options.reverse = reverse;
        ladle::Tensor offsets(ladle::DType::i64, {2});
        static_cast<std::int64_t*>(offsets.data())[0] = 0, static_cast<std::int64_t*>(offsets.data())[1] = T;
        if (varlen) options.cu_seqlens = offsets.view();
        if (states) options.initial_state = tensor(ladle::DType::f32, {1, 1, key_dim, value_dim});
        const auto q = tensor(type, {1, T, 1, key_dim}), k = tensor(type, {1, T, 1, key_dim}), v = tensor(type, {1, T, 1, value_dim});
        const ladle::ops::BoundInputs bound = ladle::ops::bind_inputs(op, variant, q, k, v, inputs, options);
        for (auto phase : {ladle::cuda::BackwardPhase::slots, ladle::cuda::BackwardPhase::totals, ladle::cuda::BackwardPhase::chain})
          programs.push_back(ladle::gpu::compile_backward(variant, ladle::gpu::backward_kernel_spec(variant, bound, options, phase, type), arch).program);
        program = ladle::gpu::compile_backward_helpers(arch);
        tile_name = "(backward: one thread per feature, blocks of " + std::to_string(ladle::cuda::backward_chunk) + " steps)";
      } else if (algo == "chunked" && variant.update == ladle::ir::Update::delta) {
        // The delta rule's chunked form: its three kernels (codegen/cuda_chunked_delta.h), as the library
        // runs them for contiguous 16-bit q, k and v (16-byte loads).
        if (const std::string why = ladle::cuda::chunked_delta_unsupported(variant, key_dim, value_dim); !why.empty())
          throw ladle::InvalidArgument("ladle-dump: --algo chunked: " + why);
        ladle::cuda::ChunkedDeltaSpec spec = ladle::cuda::chunked_delta_spec(types, key_dim, value_dim, ladle::cuda::ChunkedDeltaPhase::prepare);
        spec.vector_loads = type != ladle::DType::f32 && key_dim % 8 == 0 && value_dim % 8 == 0;
        for (auto phase : {ladle::cuda::ChunkedDeltaPhase::prepare, ladle::cuda::ChunkedDeltaPhase::states, ladle::cuda::ChunkedDeltaPhase::outputs}) {
          spec.phase = phase;
          const ladle::cuda::ChunkedDeltaKernel kernel = ladle::cuda::generate_chunked_delta(variant, spec);
          ladle::CompileOptions options;
          options.arch = arch;
          options.program_name = kernel.name + ".cu";
          (phase == ladle::cuda::ChunkedDeltaPhase::outputs ? program : programs.emplace_back()) = ladle::compile(kernel.source, options);
        }
        tile_name = "(chunk 64, block_k " + std::to_string(spec.block_k) + ", 64 value columns a block)";
      } else if (algo == "chunked") {
        ladle::cuda::ChunkedKernelSpec spec;
        static_cast<ladle::cuda::KernelTypes&>(spec) = types;
        spec.tile = ladle::cuda::default_chunked_tile(key_dim, value_dim);
        if (ladle::cuda::chunked_wgmma_arch(arch)) {  // sm_90a: the state update on wgmma where the tile allows
          ladle::cuda::ChunkedTile w = spec.tile;
          w.wgmma = true;
          if (ladle::cuda::validate_chunked_tile(w, variant, key_dim, value_dim, 0, arch).empty()) spec.tile = w;
          // A per-head decay, or a key- or value-side gate alone, with bf16 q, k, v: the warp-specialised form, as the library's heuristic takes it.
          ladle::cuda::ChunkedTile ws{key_dim <= 64 ? 64 : 128, 64, value_dim <= 64 ? 64 : 128, value_dim <= 64 ? 8 : 12};
          ws.ws = true;
          ladle::cuda::ChunkedKernelSpec ws_spec = spec;
          ws_spec.tile = ws;
          if (key_dim <= 128 && ladle::cuda::validate_chunked_tile(ws, variant, key_dim, value_dim, 0, arch).empty() &&
              ladle::cuda::chunked_ws_unsupported(variant, ws_spec).empty())
            spec.tile = ws;
        }
        if (!tile_text.empty()) spec.tile = ladle::cuda::parse_chunked_tile(tile_text);
        if (auto problems = ladle::cuda::validate_chunked_tile(spec.tile, variant, key_dim, value_dim, 0, arch); !problems.empty())
          throw ladle::InvalidArgument("ladle-dump: tile " + ladle::cuda::to_string(spec.tile) + ": " + problems.front());
        if (segmented) {  // the segmented form: each segment's own state (the split tile's state pass), then the serial form
          if (spec.tile.split()) throw ladle::InvalidArgument("ladle-dump: --segmented takes a serial tile, got " + tile_text);
          const auto segmented_specs = ladle::gpu::segmented_chunked_specs(variant, spec, key_dim, value_dim);
          programs.push_back(ladle::gpu::compile_chunked(variant, segmented_specs.first, arch).program);
          programs.push_back(ladle::gpu::compile_chunked(variant, segmented_specs.fold, arch).program);
          spec = segmented_specs.serial;
        } else if (spec.tile.split()) {  // the family's two kernels: the state pass, then the output pass
          spec.phase = ladle::cuda::ChunkedPhase::states;
          programs.push_back(ladle::gpu::compile_chunked(variant, spec, arch).program);
          spec.phase = ladle::cuda::ChunkedPhase::outputs;
        }
        program = ladle::gpu::compile_chunked(variant, spec, arch).program;
        tile_name = ladle::cuda::to_string(spec.tile);
      } else {
        ladle::cuda::RecurrentKernelSpec spec;
        static_cast<ladle::cuda::KernelTypes&>(spec) = types;
        spec.tile = ladle::cuda::default_tile(key_dim, value_dim);
        if (!tile_text.empty() && std::sscanf(tile_text.c_str(), "%d,%d,%d", &spec.tile.block_k, &spec.tile.block_v, &spec.tile.warps) != 3)
          throw ladle::InvalidArgument("ladle-dump: --tile '" + tile_text + "', expected block_k,block_v,warps");
        if (auto problems = ladle::cuda::validate_tile(spec.tile, key_dim, value_dim, variant); !problems.empty())
          throw ladle::InvalidArgument("ladle-dump: tile " + ladle::cuda::to_string(spec.tile) + ": " + problems.front());
        program = ladle::gpu::compile_recurrent(variant, spec, arch).program;
        tile_name = ladle::cuda::to_string(spec.tile);
      }
      std::cout << fmt::format("op {} ({} variant {}), {} tile {}, K={} V={} {}\n", op, variant.name,
                               ladle::ir::hash_hex(variant), algo, tile_name, key_dim, value_dim, dtype);
    } else {
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      ladle::CompileOptions options;
      options.arch = arch;
      options.program_name = fs::path(file).filename().string();
      for (const auto& d : defines) options.flags.push_back("-D" + d);
      program = ladle::compile(text.str(), options);
    }

    auto want = [&](const char* part) { return only.empty() || only == part; };
    programs.push_back(std::move(program));
    for (const ladle::CompiledProgram& shown : programs) {
      if (programs.size() > 1) std::cout << fmt::format("\n##### kernel {}\n", shown.kernels.empty() ? shown.key : shown.kernels.front().name);
      if (want("source")) {
        section("source");
        std::cout << shown.source;
      }
      if (want("ptx")) {
        section(fmt::format("PTX ({})", shown.arch));
        std::cout << shown.ptx;
      }
      if (want("resources")) {
        section(fmt::format("resource usage ({})", shown.arch));
        print_resources(shown);
      }
      if (want("path")) {
        section("cache");
        std::cout << fmt::format("key:   {}\nentry: {}\nhit:   {}\noptions:", shown.key,
                                 shown.entry_path.empty() ? "(memory only)" : shown.entry_path,
                                 shown.from_cache ? "yes" : "no (compiled now)");
        for (const auto& o : shown.options) std::cout << ' ' << o;
        std::cout << '\n';
      }
      if (sass) {
        section("SASS");
        const std::string tool = find_cuobjdump();
        if (shown.cubin.empty()) {
          std::cout << "(no cubin: compile for a real arch, e.g. --arch sm_90a)\n";
        } else if (tool.empty()) {
          std::cout << "(cuobjdump not found on PATH or in $CUDA_HOME/bin)\n";
        } else {
          fs::path cubin = fs::temp_directory_path() / ("ladle-dump-" + shown.key + ".cubin");
          std::ofstream(cubin, std::ios::binary) << shown.cubin;
          std::cout << run_capture(fmt::format("'{}' -sass '{}' 2>&1", tool, cubin.string()));
          fs::remove(cubin);
        }
      }
    }
  } catch (const ladle::CompileError& e) {
    std::cerr << e.what() << "\n--- full NVRTC log ---\n" << e.log() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ladle-dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
