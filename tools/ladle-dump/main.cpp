// ladle-dump: shows everything ladle generates for a kernel: the CUDA source, the PTX,
// the resource usage ptxas reported (static shared memory, and the dynamic shared memory the launcher
// passes), the cache entry, and the SASS when cuobjdump exists.
//   ladle-dump kernel.cu [--arch sm_90a] [--sass] [--only source|ptx|resources|path] [-D NAME=VALUE]
//   ladle-dump --op gla|recurrent|delta_rule|gated_delta_rule|rwkv6|kda [--gates g,gk,gv,g_gamma|l2norm|gate,dt_bias,sigmoid]
//              [--dtype bf16] [-K 128 -V 128]
//              [--algo recurrent|chunked] [--tile 128,64,8 | 128,64,64,8 for chunked]
//              [--reverse] [--varlen] [--states] [--segmented] [-B 8 -T 1024 -H 16]
//              [--backward]   (the backward's generated kernels: slots, totals, chain (the update forms: slots,
//                              ladle_bwd_update or the chunked WY form's three, chain), and its helpers;
//                              with --op attention: prep and main, sm_90a)
//   ladle-dump --op attention [--mask causal,window,segments,mask,sinks,dropout] [--mods bias,softcap]
//              [-D 128 --dv 128] [--dtype bf16] [--tile 128,64,8,2[,wgmma|ws|decode]] [--varlen] [--lse] [-B -T -H]
//              [--tk 8192 --hkv 8] (keys and key/value heads: a few queries against many keys take the decode form)
//              (with --op attention, -D is the head dim; with a .cu file a preprocessor definition)
// An op's kernels are the ones its launcher launches for a call of that shape on --arch: chosen by
// ladle::generated_kernels (ops/generated_kernels.h), through the launcher's own heuristics, never a
// copy of them here. A flag that does not apply to the op (or to a .cu file) is refused by name.
// Nothing here runs a kernel, so nothing needs a CUDA driver: with --arch the driver is not
// opened (tests/tools pins it); without it the target is this GPU when the driver reports one, else sm_80 (the
// attention backward: sm_90a). The PTX and resource-usage headings name the target; a machine
// without a GPU gets no warning about its missing driver.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ladle/codegen/cuda/chunked_delta.h>
#include <ladle/codegen/device/headers.h>
#include <ladle/ops/attention.h>
#include <ladle/ops/gla.h>
#include <ladle/ops/gpu_attention.h>
#include <ladle/ops/gpu_attention_backward.h>
#include <ladle/ops/gpu_backward.h>
#include <ladle/ops/generated_kernels.h>
#include <ladle/ops/chunked_plan.h>
#include <ladle/ops/gpu_recurrent.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
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

// Static shared memory as ptxas reports it, dynamic as the launcher passes it ("-": not known, a .cu file).
void print_resources(const ladle::CompiledProgram& program, int dynamic_shared_bytes) {
  std::cout << fmt::format("{:<40} {:>5} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6}\n", "kernel", "regs", "stack", "spill-st",
                           "spill-ld", "smem", "dyn-smem", "cmem");
  const std::string dynamic = dynamic_shared_bytes >= 0 ? std::to_string(dynamic_shared_bytes) : "-";
  for (const auto& k : program.kernels) {
    if (k.registers < 0) {
      std::cout << fmt::format("{:<40} (PTX only: compile for a real arch, e.g. --arch sm_90a, "
                               "for resource usage)\n", k.name);
      continue;
    }
    // An attention decode program's merge kernel (<name>_merge) and the attention backward's prep kernel launch with none.
    const bool merge = (k.name.size() > 6 && k.name.compare(k.name.size() - 6, 6, "_merge") == 0) ||
                       k.name.rfind("ladle_attention_bwd_prep_", 0) == 0;
    std::cout << fmt::format("{:<40} {:>5} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6}\n", k.name, k.registers, k.stack_frame_bytes,
                             k.spill_store_bytes, k.spill_load_bytes, k.shared_bytes, merge ? std::string("0") : dynamic, k.constant_bytes);
  }
}

// The flags that apply to one kind of dump only: refused elsewhere, naming the flag and what was chosen.
const std::vector<std::string> attention_flags = {"--mask", "--mods", "--dv", "--lse", "--tk", "--hkv"};
const std::vector<std::string> recurrent_flags = {"--gates", "-K", "-V", "--algo", "--reverse", "--states", "--segmented"};
const std::vector<std::string> op_flags = {"--dtype", "--tile", "--varlen", "--backward", "-B", "-T", "-H"};

ladle::DType dtype_of(const std::string& name) {
  return name == "f32" ? ladle::DType::f32 : name == "f16" ? ladle::DType::f16 : ladle::DType::bf16;
}

// A call's kernels, compiled as the launcher compiles them, beside what the launcher passes at launch.
struct Shown {
  ladle::CompiledProgram program;
  int dynamic_shared_bytes = -1;  // -1: not known
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ladle-dump: the CUDA source, PTX, resource usage and SASS of a kernel"};
  std::string file, arch, only;
  std::vector<std::string> defines;
  bool sass = false;
  std::string op, gates, dtype = "bf16", tile_text;
  int key_dim = 128, value_dim = 128;
  std::int64_t batch = 8, tokens = 1024, heads = 16;
  bool reverse = false, varlen = false, states = false, segmented = false, backward = false;
  auto* file_option = app.add_option("file", file, "a CUDA C++ source file (.cu)")->check(CLI::ExistingFile);
  auto* op_option = app.add_option("--op", op, "show the kernels ladle generates and launches for an op")
                        ->check(CLI::IsMember({"gla", "recurrent", "delta_rule", "gated_delta_rule", "rwkv6", "kda", "attention"}));
  file_option->excludes(op_option);
  app.add_option("--gates", gates, "recurrent: comma-separated gates among g,gk,gv,g_gamma; gla: g_gamma adds it; "
                                  "delta_rule, gated_delta_rule: l2norm (q and k L2-normalised in the kernel); kda: l2norm, gate (the "
                                  "decay -exp(A_log) softplus(g) formed in the kernel), dt_bias (with gate), sigmoid (beta's in the kernel)");
  app.add_option("--dtype", dtype, "input and output dtype")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  app.add_option("-K", key_dim, "key head dim")->check(CLI::PositiveNumber);
  app.add_option("-V", value_dim, "value head dim")->check(CLI::PositiveNumber);
  app.add_option("-B", batch, "the call's batch (the launcher's tile depends on the shape)")->check(CLI::PositiveNumber);
  app.add_option("-T", tokens, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("-H", heads, "heads")->check(CLI::PositiveNumber);
  std::string algo = "recurrent";
  app.add_option("--algo", algo, "the kernel family: recurrent (token by token) or chunked (tensor cores)")
      ->check(CLI::IsMember({"recurrent", "chunked"}));
  app.add_option("--tile", tile_text,
                 "recurrent: block_k,block_v,warps; chunked: block_k,chunk,block_v,warps[,wgmma|,ws] or a split tile; "
                 "attention: block_m,block_n,warps,stages[,sync|wgmma|ws] (wgmma, ws: --arch sm_90a); default: the tile the "
                 "launcher's heuristic takes for the shape (-B, -T, -H) on --arch");
  app.add_flag("--reverse", reverse, "t = T..1");
  app.add_flag("--varlen", varlen, "packed sequences (cu_seqlens): B sequences of T tokens");
  app.add_flag("--backward", backward,
               "recurrent ops: the backward's generated kernels (slots, totals, chain; the update forms: slots, ladle_bwd_update "
               "or the chunked WY form's three, "
               "chain; 16-bit slots with --algo chunked) "
               "and its helpers, as a call of these types runs them; attention: the backward's prep and main kernels (ws on sm_90a "
               "for 16-bit inputs, else the mma.sync form)");
  app.add_flag("--states", states, "initial and final states");
  app.add_flag("--segmented", segmented,
               "chunked: the segmented form's kernels as the launcher runs them (each segment's own state, the fold where "
               "it runs, then the serial form over segments of T/4 tokens)");
  std::string masks, mods;
  int value_head_dim = 0;
  std::int64_t key_tokens = 0, kv_heads = 0;
  bool lse = false;
  app.add_option("--mask", masks, "attention: comma-separated among causal,window,segments,mask,sinks,dropout");
  app.add_option("--mods", mods, "attention: comma-separated score modifiers among bias,softcap");
  app.add_option("--dv", value_head_dim, "attention: the value head dim (default: D)")->check(CLI::PositiveNumber);
  app.add_option("--tk", key_tokens, "attention: keys per sequence (default: -T, the queries); a few queries against many keys "
                 "take the decode form")->check(CLI::PositiveNumber);
  app.add_option("--hkv", kv_heads, "attention: key/value heads (GQA; default: -H, which it must divide)")->check(CLI::PositiveNumber);
  app.add_flag("--lse", lse, "attention: also write the log-sum-exp");
  app.add_option("--arch", arch,
                 "target, e.g. sm_90a or compute_80 (default: this GPU, else sm_80)");
  app.add_option("-D,--define", defines, "preprocessor definitions passed to NVRTC (NAME=VALUE); with --op attention: the head dim");
  app.add_flag("--sass", sass, "also disassemble the cubin with cuobjdump");
  app.add_option("--only", only, "print one part only")
      ->check(CLI::IsMember({"source", "ptx", "resources", "path"}));
  // An option given without its value is named here: CLI11 would hand the next flag's value to another
  // option or take it as the file (-K --arch sm_90a: "File does not exist: sm_90a").
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const CLI::Option* option = flag.size() > 1 && flag[0] == '-' && flag.find('=') == std::string::npos ? app.get_option_no_throw(flag) : nullptr;
    if (!option || option->get_items_expected_min() == 0) continue;  // not an option, or a flag
    const std::string next = i + 1 < argc ? argv[i + 1] : "";
    if (next.empty() || (next[0] == '-' && next.find_first_not_of("0123456789.", 1) != std::string::npos)) {
      std::cerr << fmt::format("ladle-dump: {} needs a value{}\n", flag, next.empty() ? "" : fmt::format(" (got the flag {})", next));
      return 2;
    }
    ++i;
  }
  CLI11_PARSE(app, argc, argv);
  if (file.empty() && op.empty()) {
    std::cerr << "ladle-dump: give a .cu file or --op\n" << app.help();
    return 2;
  }
  // A flag that does not apply to what was chosen is refused by name, not ignored.
  const auto refuse = [&](const std::vector<std::string>& flags, const std::string& why) {
    for (const std::string& flag : flags)
      if (app.count(flag) > 0) {
        std::cerr << fmt::format("ladle-dump: {} {}\n", flag, why);
        return true;
      }
    return false;
  };
  if (op.empty()) {
    if (refuse(attention_flags, "applies to --op attention, not to a .cu file") ||
        refuse(recurrent_flags, "applies to the recurrent ops (--op gla, recurrent, ...), not to a .cu file") ||
        refuse(op_flags, "applies to --op, not to a .cu file"))
      return 2;
  } else if (op == "attention") {
    if (refuse(recurrent_flags, "applies to the recurrent ops (gla, recurrent, delta_rule, gated_delta_rule, rwkv6, kda), not to --op attention"))
      return 2;
  } else {
    if (refuse(attention_flags, "applies to --op attention, not to --op " + op)) return 2;
    if (app.count("-D") > 0) {
      std::cerr << fmt::format("ladle-dump: -D applies to a .cu file (a definition) or --op attention (the head dim), not to --op {}; "
                               "the key and value head dims are -K and -V\n", op);
      return 2;
    }
    if (segmented && algo != "chunked") {
      std::cerr << "ladle-dump: --segmented applies to --algo chunked (the segmented form is the chunked family's), got --algo " << algo << "\n";
      return 2;
    }
    if (backward && (segmented || !tile_text.empty())) {
      std::cerr << fmt::format("ladle-dump: {} applies to the forward's kernels, not to --backward (the backward plans its own)\n",
                               segmented ? "--segmented" : "--tile");
      return 2;
    }
  }
  if (varlen && batch < 1) batch = 1;

  try {
    std::vector<Shown> programs;
    const std::string target = arch.empty() ? (ladle::driver_available() ? "" : ladle::default_ptx_arch()) : arch;
    ladle::CallShape shape;
    shape.batch = batch, shape.tokens = tokens, shape.heads = heads, shape.type = dtype_of(dtype);
    if (varlen) {  // B sequences of T tokens, packed
      shape.sequence_lengths.assign(static_cast<std::size_t>(batch), tokens);
      shape.batch = 1, shape.tokens = batch * tokens;
    }
    // Prints the plan's kernels, compiled; an error from a head dim the user gave names that flag.
    const auto show = [&](const std::vector<ladle::GeneratedKernel>& kernels) {
      for (const ladle::GeneratedKernel& kernel : kernels) {
        std::cout << fmt::format("  {}: {} (tile {}, {} threads, {} bytes of dynamic shared memory)\n", kernel.role, kernel.name,
                                 kernel.tile, kernel.threads, kernel.dynamic_shared_bytes);
        programs.push_back({ladle::compile_generated(kernel, target), kernel.dynamic_shared_bytes});
      }
    };
    const auto dims_flags = [&]() {
      std::string given;
      for (const char* flag : {"-K", "-V", "-D", "--dv"})
        if (app.count(flag) > 0) given += fmt::format("{}{} {}", given.empty() ? "" : ", ", flag, app[flag]->as<std::string>());
      return given;
    };
    const auto planned = [&](auto plan) {
      try {
        return plan();
      } catch (const ladle::InvalidArgument& e) {
        if (!tile_text.empty() || dims_flags().empty()) throw;
        throw ladle::InvalidArgument(fmt::format("{}: no kernel takes these head dims: {}", dims_flags(), e.what()));
      }
    };
    if (op == "attention") {
      // -D is the head dim here (as the op's docs write it), a definition for .cu files.
      int head_dim = 128;
      if (defines.size() > 1 || (defines.size() == 1 && (defines[0].empty() || defines[0].find_first_not_of("0123456789") != std::string::npos)))
        throw ladle::InvalidArgument(fmt::format("-D '{}': with --op attention, -D takes the head dim (e.g. -D 128)", fmt::join(defines, " ")));
      if (!defines.empty()) head_dim = std::stoi(defines[0]);
      if (head_dim <= 0) throw ladle::InvalidArgument(fmt::format("-D {}: expected a head dim > 0", head_dim));
      const int dv = value_head_dim > 0 ? value_head_dim : head_dim;
      const std::string list = masks + (!masks.empty() && !mods.empty() ? "," : "") + mods;
      const ladle::ir::AttentionVariant& variant = ladle::attention_variant(ladle::parse_attention_features(list));
      if (backward) {
        // The launcher's plan (gpu::plan_attention_backward): a call that trains, every gradient wanted, d_output of q's
        // type; the ws form (dQ by TMA reductions for an aligned dq, by red.global past D = 128) or the mma.sync form (f32
        // or mixed inputs, targets without wgmma). Its program holds the prep and main kernels.
        shape.key_dim = head_dim, shape.value_dim = dv, shape.key_tokens = key_tokens, shape.kv_heads = kv_heads;
        const auto kernels = planned([&] { return ladle::generated_backward_kernels(variant, shape, {}, target); });
        std::cout << fmt::format("op attention backward (variant {}), D={} Dv={} {}, {}, {}\n", ladle::ir::hash_hex(variant), head_dim, dv,
                                 dtype, target.empty() ? ladle::Device::get().properties().arch() : target, kernels.front().tile);
        show(kernels);
      } else {
        shape.key_dim = head_dim, shape.value_dim = dv, shape.key_tokens = key_tokens, shape.kv_heads = kv_heads;
        ladle::AttentionRunOptions options;
        options.return_lse = lse;
        if (variant.dropout) options.dropout_p = 0.1f;  // as a call with dropout: the launcher plans by it
        std::optional<ladle::cuda::AttentionTile> tile;
        if (!tile_text.empty()) tile = ladle::cuda::parse_attention_tile(tile_text);
        const auto kernels = planned([&] { return ladle::generated_kernels(variant, shape, options, target, tile); });
        std::cout << fmt::format("op attention (variant {}), tile {}, D={} Dv={} {}, B={} T={}{} H={}{}, {}\n", ladle::ir::hash_hex(variant),
                                 kernels.front().tile, head_dim, dv, dtype, batch, tokens, key_tokens ? fmt::format(" Tk={}", key_tokens) : "",
                                 heads, kv_heads ? fmt::format(" H_kv={}", kv_heads) : "",
                                 target.empty() ? ladle::Device::get().properties().arch() : target);
        show(kernels);
      }
    } else if (!op.empty()) {
      // The widest key head dim any recurrent or chunked kernel takes (cuda::validate_tile: block_k up to 256).
      if (key_dim > 256) throw ladle::InvalidArgument(fmt::format("-K {} exceeds 256, the widest key head dim the kernels take", key_dim));
      const ladle::ir::Variant& variant = ladle::named_variant(op, gates);
      const auto type = dtype_of(dtype);
      ladle::RunOptions options;
      options.algorithm = algo == "chunked" ? ladle::Algorithm::chunked : ladle::Algorithm::recurrent;
      options.reverse = reverse;
      options.return_state = states;
      shape.key_dim = key_dim, shape.value_dim = value_dim, shape.initial_state = states;
      if (!tile_text.empty()) {
        if (algo == "chunked") {
          options.chunked_tile = ladle::cuda::parse_chunked_tile(tile_text);
        } else {
          ladle::cuda::RecurrentTile tile;
          if (std::sscanf(tile_text.c_str(), "%d,%d,%d", &tile.block_k, &tile.block_v, &tile.warps) != 3)
            throw ladle::InvalidArgument("--tile '" + tile_text + "', expected block_k,block_v,warps");
          options.tile = tile;
        }
      }
      if (segmented) {
        if (options.chunked_tile && options.chunked_tile->split())
          throw ladle::InvalidArgument("--segmented takes a serial tile, got --tile " + tile_text);
        options.chunked_segment_tokens = std::max<std::int64_t>(64, (tokens / 4 + 63) / 64 * 64);
      }
      if (backward) {
        // A call of these types with every query head (small host tensors, never read): the plan the
        // library makes for it, then each generated kernel and the helpers.
        const std::int64_t T = 64;
        std::vector<ladle::Tensor> keep;
        const auto tensor = [&](ladle::DType t, std::vector<std::int64_t> dims) {
          keep.emplace_back(t, std::move(dims), 0.0f);
          return keep.back().view();
        };
        keep.reserve(16);
        ladle::VariantInputs inputs;
        for (const auto& input : variant.inputs) {
          using Kind = ladle::ir::InputKind;
          if (input.role != ladle::ir::Role::other) continue;
          switch (input.kind) {
            case Kind::scalar: inputs.scalars.emplace(input.name, 1.0f); break;
            case Kind::head: inputs.tensors.emplace(input.name, tensor(type, {1})); break;
            case Kind::head_key: inputs.tensors.emplace(input.name, tensor(type, {1, key_dim})); break;  // RWKV6's u [H,K]
            case Kind::token_head: inputs.tensors.emplace(input.name, tensor(type, {1, T, 1})); break;
            case Kind::token_value: inputs.tensors.emplace(input.name, tensor(type, {1, T, 1, value_dim})); break;
            default: inputs.tensors.emplace(input.name, tensor(type, {1, T, 1, key_dim})); break;
          }
        }
        ladle::Tensor offsets(ladle::DType::i64, {2});
        static_cast<std::int64_t*>(offsets.data())[0] = 0, static_cast<std::int64_t*>(offsets.data())[1] = T;
        if (varlen) options.cu_seqlens = offsets.view();
        if (states) options.initial_state = tensor(ladle::DType::f32, {1, 1, key_dim, value_dim});
        const auto q = tensor(type, {1, T, 1, key_dim}), k = tensor(type, {1, T, 1, key_dim}), v = tensor(type, {1, T, 1, value_dim});
        const ladle::ops::BoundInputs bound =
            planned([&] { return ladle::ops::bind_inputs(op, variant, q, k, v, inputs, options); });
        // The programs the launcher compiles for this call, in its order (gpu::backward_planned_kernels: the
        // recurrences' chunked kernels and state passes on the tensor cores, the slots, totals (fp32 slots
        // alone) and chain kernels, an update form's program, the helpers' and the block kernel's).
        std::vector<ladle::GeneratedKernel> kernels;
        try {
          const auto d_output = tensor(type, {1, T, 1, value_dim});
          const std::optional<ladle::TensorView> d_final =
              states ? std::optional<ladle::TensorView>(tensor(ladle::DType::f32, {1, 1, key_dim, value_dim})) : std::nullopt;
          ladle::RunOptions call = options;
          call.return_state = false;  // the backward takes d_final_state instead
          const std::string planned_arch = target.empty() ? ladle::Device::get().properties().arch() : target;
          kernels = ladle::gpu::backward_planned_kernels(variant, q, k, v, inputs, call, d_output, d_final, planned_arch);
        } catch (const ladle::InvalidArgument& e) {
          throw ladle::InvalidArgument(fmt::format("--backward: --op {} has no generated backward: {}", op, e.what()));
        }
        std::cout << fmt::format("op {} ({} variant {}), {} tile (backward: one thread per feature, blocks of {} steps), K={} V={} {}\n",
                                 op, variant.name, ladle::ir::hash_hex(variant), algo, ladle::cuda::backward_chunk, key_dim, value_dim, dtype);
        show(kernels);
      } else {
        const auto kernels = planned([&] { return ladle::generated_kernels(variant, shape, options, target); });
        std::cout << fmt::format("op {} ({} variant {}), {} tile {}, K={} V={} {}, B={} T={} H={}, {}\n", op, variant.name,
                                 ladle::ir::hash_hex(variant), algo, kernels.back().tile, key_dim, value_dim, dtype, batch, tokens,
                                 heads, target.empty() ? ladle::Device::get().properties().arch() : target);
        show(kernels);
      }
    } else {
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      ladle::CompileOptions options;
      options.arch = arch;
      options.program_name = fs::path(file).filename().string();
      for (const auto& d : defines) options.flags.push_back("-D" + d);
      options.headers = ladle::device::headers_for(text.str());  // a .cu file may include ladle's device headers
      programs.push_back({ladle::compile(text.str(), options), -1});
    }

    auto want = [&](const char* part) { return only.empty() || only == part; };
    for (const auto& [shown, dynamic_shared_bytes] : programs) {
      if (programs.size() > 1) {
        // A heading a kernel of the program, in the source's order (the chunked WY backward's
        // source holds three).
        std::vector<std::string> names;
        for (const auto& kernel : shown.kernels) names.push_back(kernel.name);
        std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) { return shown.source.find(a) < shown.source.find(b); });
        if (names.empty()) names.push_back(shown.key);
        std::cout << "\n";
        for (const std::string& name : names) std::cout << fmt::format("##### kernel {}\n", name);
      }
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
        print_resources(shown, dynamic_shared_bytes);
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
