// Context parallelism: one long GLA sequence cut along its tokens across ranks, each rank holding its
// slice of q, k, v and the gate, forward and backward (ops/context_parallel.h). The ranks' outputs and
// gradients are checked against the whole call run on one rank.
//
//   example-context-parallel                       2 ranks as threads: on GPU 0 where there is a GPU,
//                                                  else on the CPU (what tools/run-main.sh runs)
//   example-context-parallel --ranks P --rank r --id-file PATH [--tokens T] [--time N] [--heads H] [--dim D]
//                                                  one process per GPU over NCCL: start P of them
//                                                  (r = 0 .. P-1); rank 0 writes NCCL's unique id to
//                                                  PATH, the others read it. Each process uses GPU r
//                                                  (CUDA_VISIBLE_DEVICES=r unless it is set already).
//                                                  --time N: time N calls instead (forward, and forward +
//                                                  backward; inputs of 4096 tokens repeated) and print
//                                                  tokens per second; with --ranks 1 this is the one-GPU
//                                                  baseline. --heads, --dim: H and K = V (4, 64).
//                                                  --attention: causal softmax attention instead, rank r
//                                                  holding chunks r and 2P-1-r of 2P (attention_slice).
//
//   for r in 0 1; do example-context-parallel --ranks 2 --rank $r --id-file /tmp/ladle-cp-id & done; wait
//
// The last line is the verdict: `context_parallel: ok`, or `context_parallel: FAILED (why)`.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ladle/dsl/dsl.h>
#include <ladle/ops/context_parallel.h>
#include <ladle/ops/recurrent.h>
#include <ladle/runtime/background.h>
#include <ladle/runtime/communicator.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/tensor.h>

#include "verdict.h"

namespace {

struct Args {
  int ranks = 2, rank = -1;  // rank -1: threads in this process
  std::string id_file;
  std::int64_t tokens = 8192;
  int time = 0;
  bool attention = false;  // --attention: causal softmax attention instead of GLA (over NCCL)
};

// The heads and dims (--heads, --dim: K = V).
std::int64_t H = 4, K = 64, V = 64;

// Token t's value of input `which` at feature i, the same on every rank whatever its slice: a hash,
// so that a rank makes its slice of a long sequence without making the rest.
float value_at(int which, std::int64_t index) {
  std::uint64_t x = static_cast<std::uint64_t>(index) * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(which) * 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 31, x *= 0x94d049bb133111ebULL, x ^= x >> 29;
  const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);  // [0, 1)
  if (which == 3) return std::log(0.9f + 0.1f * u);                         // the gate: log decay in (log 0.9, 0)
  return 2.0f * u - 1.0f;
}

// Tokens [lo, hi) of input `which` ([1, T, H, D]) on the host, in bf16 (f32 on the CPU).
ladle::Tensor slice(int which, std::int64_t lo, std::int64_t hi, std::int64_t D, ladle::DType type) {
  ladle::Tensor t(type, {1, hi - lo, H, D});
  const std::int64_t row = H * D;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, value_at(which, lo * row + i));
  return t;
}

struct Slice {
  ladle::Tensor q, k, v, g, d_o;
};
Slice make_slice(std::int64_t lo, std::int64_t hi, ladle::DType type, ladle::Location where) {
  const auto at = [&](ladle::Tensor t) { return where.is_device() ? t.to(where) : t; };
  return {at(slice(0, lo, hi, K, type)), at(slice(1, lo, hi, K, type)), at(slice(2, lo, hi, V, type)),
          at(slice(3, lo, hi, K, type)), at(slice(4, lo, hi, V, type))};
}

// For timing long sequences: the first 4096 tokens of the slice made as above, repeated on the device.
ladle::Tensor repeated(int which, std::int64_t lo, std::int64_t hi, std::int64_t D, ladle::Location where) {
  const std::int64_t block = std::min<std::int64_t>(hi - lo, 4096);
  const ladle::Tensor first = slice(which, lo, lo + block, D, ladle::DType::bf16).to(where);
  ladle::Tensor t(ladle::DType::bf16, {1, hi - lo, H, D}, where);
  const std::size_t token = static_cast<std::size_t>(H * D) * 2;
  for (std::int64_t at = 0; at < hi - lo; at += block) {
    const std::int64_t n = std::min(block, hi - lo - at);
    ladle::copy_device_to_device(reinterpret_cast<std::uintptr_t>(t.data()) + at * token, reinterpret_cast<std::uintptr_t>(first.data()),
                                 static_cast<std::size_t>(n) * token);
  }
  return t;
}

struct Result {
  ladle::Tensor o, dq, dk, dv, dg;
};

const ladle::ir::Variant& gla() { return ladle::recurrent_variant(true, false, false, false); }

ladle::RunOptions options_for(ladle::Location where) {
  ladle::RunOptions options;
  options.backend = where.is_device() ? ladle::Backend::gpu : ladle::Backend::cpu;
  return options;
}

// The forward and backward of this rank's slice through `group`, or of the whole call (no group).
Result run(const Slice& s, ladle::Communicator* group, ladle::Location where) {
  const ladle::VariantInputs inputs{{{"g", s.g.view()}}, {{"scale", 0.125f}}};
  const ladle::RunOptions options = options_for(where);
  Result r;
  r.o = group ? ladle::context_parallel::run_variant(gla(), s.q.view(), s.k.view(), s.v.view(), inputs, options, *group).o
              : ladle::run_variant(gla(), s.q.view(), s.k.view(), s.v.view(), inputs, options).o;
  const auto grad = [&](const ladle::Tensor& of) { return ladle::Tensor(ladle::DType::f32, of.shape(), where); };
  r.dq = grad(s.q), r.dk = grad(s.k), r.dv = grad(s.v), r.dg = grad(s.g);
  ladle::RecurrentGradientViews views{r.dq.view(), r.dk.view(), r.dv.view(), {{"g", r.dg.view()}}, std::nullopt};
  if (group)
    ladle::context_parallel::run_variant_backward_into(gla(), s.q.view(), s.k.view(), s.v.view(), inputs, options, s.d_o.view(),
                                                       std::nullopt, views, *group);
  else
    ladle::run_variant_backward_into(gla(), s.q.view(), s.k.view(), s.v.view(), inputs, options, s.d_o.view(), std::nullopt, views);
  return r;
}

ladle::Tensor host(const ladle::Tensor& t) { return t.location().is_device() ? t.to(ladle::Location::host()) : t; }

// || part - whole[lo, hi) || / || whole[lo, hi) || over the tokens of a [1, T, H, D] tensor.
double slice_error(const ladle::Tensor& part, const ladle::Tensor& whole, std::int64_t lo) {
  const ladle::Tensor a = host(part), b = host(whole);
  const std::int64_t row = a.shape()[2] * a.shape()[3];
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.get(i), y = b.get(lo * row + i);
    diff += (x - y) * (x - y), norm += y * y;
  }
  return std::isfinite(diff) ? std::sqrt(diff / std::max(norm, 1e-30)) : INFINITY;
}

// What one rank checks: its slice of o and of each gradient against the whole call's.
// Its report lines go to `lines` (the ranks print theirs in order once all are done).
std::string check_slice(const Result& part, const Result& whole, std::int64_t lo, int rank, bool gpu, std::string& lines) {
  const double tolerance = gpu ? 2e-2 : 1e-5;  // bf16 inputs and outputs on the GPU, f32 on the CPU
  const struct {
    const char* name;
    const ladle::Tensor &a, &b;
  } pairs[] = {{"o", part.o, whole.o}, {"dq", part.dq, whole.dq}, {"dk", part.dk, whole.dk}, {"dv", part.dv, whole.dv},
               {"dg", part.dg, whole.dg}};
  std::string failure;
  for (const auto& p : pairs) {
    const double e = slice_error(p.a, p.b, lo);
    char line[160];
    std::snprintf(line, sizeof line, "rank %d: %s of its slice against the whole call on one rank: relative error %.3g (< %g)\n", rank,
                  p.name, e, tolerance);
    lines += line;
    if (!(e < tolerance) && failure.empty())
      failure = "rank " + std::to_string(rank) + "'s " + p.name + ": relative error " + std::to_string(e);
  }
  return failure;
}

// Threads as ranks in this process: GPU 0 cut into slices, or the CPU.
std::string run_threads(const Args& args) {
  const bool gpu = ladle::driver_available();
  const ladle::Location where = gpu ? ladle::Location::device(0) : ladle::Location::host();
  const ladle::DType type = gpu ? ladle::DType::bf16 : ladle::DType::f32;
  const std::int64_t T = gpu ? args.tokens : 256;
  ladle::ThreadGroup group(args.ranks, where);
  const Result whole = run(make_slice(0, T, type, where), nullptr, where);
  std::vector<std::string> failures(static_cast<std::size_t>(args.ranks)), lines(failures.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < args.ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        const std::int64_t lo = T * r / args.ranks, hi = T * (r + 1) / args.ranks;
        const Result part = run(make_slice(lo, hi, type, where), &group.rank(r), where);
        if (gpu) ladle::Device::get().synchronize();
        failures[r] = check_slice(part, whole, lo, r, gpu, lines[r]);
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& l : lines) std::printf("%s", l.c_str());
  std::printf("GLA forward and backward, T = %lld tokens in %d slices (threads on %s)\n", static_cast<long long>(T), args.ranks,
              gpu ? "GPU 0" : "the CPU");
  for (const std::string& f : failures)
    if (!f.empty()) return f;
  return "";
}

// The NCCL id through a file: rank 0 writes it (whole, then renamed into place), the others wait for it.
ladle::nccl::UniqueId exchange_id(const Args& args) {
  ladle::nccl::UniqueId id;
  if (args.rank == 0) {
    id = ladle::nccl::unique_id();
    const std::string partial = args.id_file + ".partial";
    std::ofstream(partial, std::ios::binary).write(id.bytes.data(), static_cast<std::streamsize>(id.bytes.size()));
    std::filesystem::rename(partial, args.id_file);
    return id;
  }
  for (int waited = 0; !std::filesystem::exists(args.id_file); ++waited) {
    if (waited > 600) throw std::runtime_error("no NCCL id in " + args.id_file + " after 60 s: is rank 0 running?");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ifstream(args.id_file, std::ios::binary).read(id.bytes.data(), static_cast<std::streamsize>(id.bytes.size()));
  return id;
}

// Wall-clock milliseconds per call of `call` (2 untimed first), the slowest rank's: each call waits
// for the ranks' exchanges, so the ranks finish together or wait for the last.
double timed_call(const Args& args, ladle::Communicator& group, ladle::Location gpu, const std::function<void()>& call) {
  for (int i = 0; i < 2; ++i) call();
  ladle::finish_background_compiles();  // a cold call's interim kernel is not what is timed
  ladle::Device::get().synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < args.time; ++i) call();
  ladle::Device::get().synchronize();
  float ms = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - start).count() / static_cast<float>(args.time);
  const ladle::Tensor send = ladle::Tensor(ladle::DType::f32, {1}, ms).to(gpu);
  const ladle::Tensor receive = ladle::Tensor(ladle::DType::f32, {args.ranks}, 0.0f).to(gpu);
  group.all_gather(send.data(), const_cast<void*>(receive.data()), 4, nullptr);
  const ladle::Tensor back = receive.to(ladle::Location::host());
  for (int r = 0; r < args.ranks; ++r) ms = std::max(ms, back.get(r));
  return ms;
}

// Rows [lo, hi) of input `which` for this rank's two chunks of causal attention, concatenated ([1, 2c, H, D]).
ladle::Tensor two_chunks(int which, const ladle::context_parallel::AttentionSlice& s, std::int64_t D, bool timed, ladle::Location gpu) {
  const std::int64_t c = s.first_end - s.first_begin;
  ladle::Tensor out(ladle::DType::bf16, {1, 2 * c, H, D}, gpu);
  const std::size_t bytes = static_cast<std::size_t>(c * H * D) * 2;
  for (int h = 0; h < 2; ++h) {
    const std::int64_t lo = h == 0 ? s.first_begin : s.second_begin;
    const ladle::Tensor part = timed ? repeated(which, lo, lo + c, D, gpu) : slice(which, lo, lo + c, D, ladle::DType::bf16).to(gpu);
    ladle::copy_device_to_device(reinterpret_cast<std::uintptr_t>(out.data()) + h * bytes, reinterpret_cast<std::uintptr_t>(part.data()), bytes);
  }
  return out;
}

// Causal attention over NCCL: checked against the whole call (its o), or timed.
std::string run_attention_nccl(const Args& args, ladle::Communicator& group, ladle::Location gpu) {
  namespace cp = ladle::context_parallel;
  namespace dsl = ladle::dsl;
  static const ladle::ir::AttentionVariant causal = dsl::lower(dsl::softmax(dsl::score * dsl::scalar("scale")).causal(), "causal");
  const std::int64_t T = args.tokens;
  const cp::AttentionSlice s = cp::attention_slice(T, args.ranks, args.rank);
  const bool timed = args.time > 0;
  const ladle::Tensor q = two_chunks(0, s, K, timed, gpu), k = two_chunks(1, s, K, timed, gpu), v = two_chunks(2, s, V, timed, gpu);
  const ladle::VariantInputs inputs{{}, {{"scale", 1.0f / std::sqrt(static_cast<float>(K))}}};
  ladle::AttentionRunOptions options;
  options.backend = ladle::Backend::gpu, options.return_lse = true;
  if (!timed) {
    const ladle::AttentionResult mine = cp::run_attention(causal, q.view(), k.view(), v.view(), inputs, options, group);
    const ladle::Tensor wq = slice(0, 0, T, K, ladle::DType::bf16).to(gpu), wk = slice(1, 0, T, K, ladle::DType::bf16).to(gpu),
                        wv = slice(2, 0, T, V, ladle::DType::bf16).to(gpu);
    const ladle::AttentionResult whole = ladle::run_attention(causal, wq.view(), wk.view(), wv.view(), inputs, options);
    const ladle::Tensor a = host(mine.o), b = host(whole.o);
    const std::int64_t c = s.first_end - s.first_begin, row = H * V;
    double diff = 0, norm = 0;
    for (std::int64_t t = 0; t < 2 * c; ++t) {
      const std::int64_t g = t < c ? s.first_begin + t : s.second_begin + t - c;
      for (std::int64_t i = 0; i < row; ++i) {
        const double x = a.get(t * row + i), y = b.get(g * row + i);
        diff += (x - y) * (x - y), norm += y * y;
      }
    }
    const double e = std::sqrt(diff / norm);
    std::printf("rank %d: causal attention's o of its two chunks against the whole call on one GPU: relative error %.3g (< 2e-2)\n",
                args.rank, e);
    return e < 2e-2 ? "" : "rank " + std::to_string(args.rank) + "'s attention o: relative error " + std::to_string(e);
  }
  ladle::Tensor o(ladle::DType::bf16, q.shape(), gpu), lse(ladle::DType::f32, {1, H, q.shape()[1]}, gpu);
  ladle::Tensor dq(ladle::DType::f32, q.shape(), gpu), dk(ladle::DType::f32, k.shape(), gpu), dv(ladle::DType::f32, v.shape(), gpu);
  const auto forward = [&] { cp::run_attention_into(causal, q.view(), k.view(), v.view(), inputs, options, {o.view(), lse.view()}, group); };
  const auto timed_ms = [&](const std::function<void()>& call) { return timed_call(args, group, gpu, call); };
  const double f = timed_ms(forward);
  const double fb = timed_ms([&] {
    forward();
    cp::run_attention_backward_into(causal, q.view(), k.view(), v.view(), inputs, options, o.view(), lse.view(), o.view(),
                                    {dq.view(), dk.view(), dv.view()}, group);
  });
  if (args.rank == 0)
    std::printf("causal attention H%lld D=%lld bf16, T = %lld on %d GPU(s): forward %.3f ms (%.3g tokens/s), forward + backward %.3f ms "
                "(%.3g tokens/s)\n",
                static_cast<long long>(H), static_cast<long long>(K), static_cast<long long>(T), args.ranks, f, T / (f * 1e-3), fb,
                T / (fb * 1e-3));
  return "";
}

// One process per GPU over NCCL.
std::string run_nccl(const Args& args) {
  if (!ladle::driver_available()) throw std::runtime_error("--rank needs a GPU: " + ladle::driver_unavailable_summary());
  const ladle::nccl::UniqueId id = exchange_id(args);
  ladle::Device::get(0);
  ncclComm_t comm = ladle::nccl::init_rank(args.ranks, id, args.rank);
  ladle::NcclCommunicator group(comm);
  const ladle::Location gpu = ladle::Location::device(0);
  if (args.attention) {
    const std::string failure = run_attention_nccl(args, group, gpu);
    ladle::nccl::destroy(comm);
    return failure;
  }
  const std::int64_t T = args.tokens, lo = T * args.rank / args.ranks, hi = T * (args.rank + 1) / args.ranks;
  const Slice mine = args.time == 0 ? make_slice(lo, hi, ladle::DType::bf16, gpu)
                                    : Slice{repeated(0, lo, hi, K, gpu), repeated(1, lo, hi, K, gpu), repeated(2, lo, hi, V, gpu),
                                            repeated(3, lo, hi, K, gpu), ladle::Tensor()};
  std::string failure;
  if (args.time == 0) {
    const Result part = run(mine, &group, gpu);
    ladle::Device::get().synchronize();
    const Result whole = run(make_slice(0, T, ladle::DType::bf16, gpu), nullptr, gpu);
    std::string lines;
    failure = check_slice(part, whole, lo, args.rank, true, lines);
    std::printf("%s", lines.c_str());
  } else {
    // Wall-clock time per call (each call waits for the ranks' exchange), the slowest rank's.
    const ladle::VariantInputs inputs{{{"g", mine.g.view()}}, {{"scale", 0.125f}}};
    ladle::Tensor o(ladle::DType::bf16, mine.v.shape(), gpu);
    const ladle::RunOptions options = options_for(gpu);
    // One rank: the plain call, the baseline the ranks are measured against.
    const bool plain = args.ranks == 1;
    const auto forward_call = [&] {
      if (plain) ladle::run_variant_into(gla(), mine.q.view(), mine.k.view(), mine.v.view(), inputs, options, {o.view(), std::nullopt});
      else ladle::context_parallel::run_variant_into(gla(), mine.q.view(), mine.k.view(), mine.v.view(), inputs, options, {o.view(), std::nullopt},
                                                     group);
    };
    const auto timed = [&](const std::function<void()>& call) { return timed_call(args, group, gpu, call); };
    const double forward = timed(forward_call);
    if (args.rank == 0)
      std::printf("GLA H%lld K=V=%lld bf16, T = %lld on %d GPU(s): forward %.3f ms (%.3g tokens/s)\n", static_cast<long long>(H),
                  static_cast<long long>(K), static_cast<long long>(T), args.ranks, forward, T / (forward * 1e-3));
    std::fflush(stdout);
    ladle::Tensor dq(ladle::DType::f32, mine.q.shape(), gpu), dk(ladle::DType::f32, mine.k.shape(), gpu),
        dv(ladle::DType::f32, mine.v.shape(), gpu), dg(ladle::DType::f32, mine.g.shape(), gpu);
    const ladle::RecurrentGradientViews views{dq.view(), dk.view(), dv.view(), {{"g", dg.view()}}, std::nullopt};
    const double training = timed([&] {
      forward_call();
      if (plain)
        ladle::run_variant_backward_into(gla(), mine.q.view(), mine.k.view(), mine.v.view(), inputs, options, mine.v.view(), std::nullopt, views);
      else
        ladle::context_parallel::run_variant_backward_into(gla(), mine.q.view(), mine.k.view(), mine.v.view(), inputs, options,
                                                           mine.v.view(), std::nullopt, views, group);
    });
    if (args.rank == 0)
      std::printf("GLA H%lld K=V=%lld bf16, T = %lld on %d GPU(s): forward + backward %.3f ms (%.3g tokens/s)\n", static_cast<long long>(H),
                  static_cast<long long>(K), static_cast<long long>(T), args.ranks, training, T / (training * 1e-3));
  }
  ladle::nccl::destroy(comm);
  return failure;
}

std::optional<Args> parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--ranks" && has_value) args.ranks = std::atoi(argv[++i]);
    else if (a == "--rank" && has_value) args.rank = std::atoi(argv[++i]);
    else if (a == "--id-file" && has_value) args.id_file = argv[++i];
    else if (a == "--tokens" && has_value) args.tokens = std::atoll(argv[++i]);
    else if (a == "--time" && has_value) args.time = std::atoi(argv[++i]);
    else if (a == "--attention") args.attention = true;
    else if (a == "--heads" && has_value) H = std::atoll(argv[++i]);
    else if (a == "--dim" && has_value) K = V = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "example-context-parallel: unknown argument '%s' (expected --ranks P --rank r --id-file PATH [--tokens T] [--time N] [--heads H] [--dim D] [--attention])\n",
                   a.c_str());
      return std::nullopt;
    }
  }
  if (args.ranks < 1 || (args.rank >= 0 && (args.rank >= args.ranks || args.id_file.empty())) || args.tokens < args.ranks) {
    std::fprintf(stderr, "example-context-parallel: expected --ranks P >= 1, --rank r in [0, P) with --id-file, and --tokens >= P\n");
    return std::nullopt;
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Args> args = parse(argc, argv);
  if (!args) return 2;
  if (args->rank >= 0 && !std::getenv("CUDA_VISIBLE_DEVICES"))  // before the driver starts: this process sees GPU r as GPU 0
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(args->rank).c_str(), 1);
  return example::report("context_parallel", [&] { return args->rank >= 0 ? run_nccl(*args) : run_threads(*args); });
}
