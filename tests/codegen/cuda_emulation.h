// Runs generated CUDA kernels on the host, so that CI without a GPU checks what they
// compute: each CUDA thread of a block is a fiber on the launching thread (below: control passes
// only where a thread waits), __syncthreads is a barrier over the block's fibers, __shared__ arrays are static (blocks run one after another), dynamic shared memory is a
// buffer per block, and the 16-bit helpers are the host ones. The warp-wide tensor-core
// operations of the chunked and attention families (ldmatrix, mma.sync m16n8k16 with bf16 or
// f16 operands, __shfl_xor_sync, __shfl_up_sync) are emulated through a per-warp exchange: every lane posts
// its operands, a 32-thread barrier, every lane computes its own fragment of the result
// exactly as the PTX ISA defines the fragment layouts. cp.async copies at once (a valid
// schedule: the ISA only promises completion by the matching wait_group). Hopper's
// wgmma.mma_async m64nNk16 (f16/bf16, fp32 accumulators) is emulated the same way per
// warpgroup of 128 threads: operands from shared memory are read through the matrix descriptor
// as the ISA decodes it (the no-swizzle and the 128-byte-swizzle canonical layouts, K-major or
// MN-major), the register A operand and the accumulator D through their fragment layouts; the
// product completes at once (the ISA promises it by the matching wait_group), so fences,
// commit and wait are no-ops. The rest of a Hopper pipeline: TMA tensor copies
// (cp.async.bulk.tensor, 3-d and 4-d, 128-byte swizzle, zero fill outside the tensor) read the
// map the library describes (ladle::describe_tensor_map) and copy at once, then complete their
// bytes on an mbarrier; mbarriers (arrival counts, phases, transaction bytes) live in a side
// table keyed by their address; setmaxnreg is a no-op. Include it before the generated source.
#pragma once

#include <atomic>
#include <cstring>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstdint>
#include <limits>
#include <map>
#include <math.h>
#include <mutex>
#include <exception>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#include <vector>

#include <ladle/tensor/dtype.h>
#include <ladle/runtime/tensor_map.h>

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};

// ---- The CUDA threads of a block as fibers on the launching thread
// Each CUDA thread runs on a stack of its own, and control passes between them only where a
// thread waits (a barrier, an mbarrier, a warp-wide exchange): a switch costs nanoseconds, where
// one OS thread per CUDA thread cost a futex wake-up per waiter and left the emulation tests
// spending most of their time in the scheduler. A pass resumes every live fiber once, forward on
// even blocks and backward on odd ones, so that a missing barrier shows in either direction; a
// pass in which every fiber found its wait still unmet is a deadlock, reported at once.
struct TensorReduction {  // a TMA add reduction a thread has issued and not yet waited for (below)
  ladle::TensorMapDescription map;
  int c[5];
  std::size_t base;
};
struct WarpExchange;
struct WarpgroupExchange;

struct Fiber;
// The per-thread state every emulated instruction reads, constinit so that reading it is a plain TLS
// access (a thread_local with a dynamic initialiser is read through its init check on every access:
// 9 % of an emulation test's time went there).
inline constinit thread_local Index thread_index, block_index, grid_dim, block_dim;
inline constinit thread_local WarpExchange* warp_exchange = nullptr;
inline constinit thread_local WarpgroupExchange* warpgroup_exchange = nullptr;
inline constinit thread_local Fiber* current_fiber = nullptr;  // the CUDA thread running, null outside a kernel
inline constinit thread_local void* scheduler_sp = nullptr;     // x86-64: the scheduler's saved stack while a fiber runs

[[noreturn]] inline void scheduler_fault(const char* what) {
  std::fprintf(stderr, "emulated CUDA threads: %s\n", what);
  std::abort();
}

struct Fiber {
  void* sp = nullptr;            // the saved stack pointer (x86-64) while it is not running
#if !defined(__x86_64__)
  ucontext_t context;
#endif
  unsigned char* stack = nullptr;  // its stack (under a guard page), reused by later launches
  Index thread;
  WarpExchange* warp = nullptr;
  WarpgroupExchange* group = nullptr;
  std::vector<TensorReduction> reductions;  // its TMA add reductions not yet waited for
  const std::function<void()>* kernel = nullptr;
  bool done = false, stalled = false;
  std::exception_ptr error;
};

#if defined(__x86_64__)
// ladle_emulation_switch(&from->sp, to->sp): saves the callee-saved registers on the current stack
// (and an 8-byte pad that keeps the frame 16-byte aligned), stores its pointer, and resumes the
// other stack the same way. The SSE and x87 control words are not switched: every fiber runs with
// the launching thread's (no emulated kernel changes a rounding mode), and their loads serialise
// the core (the switch was a third of an emulation test's time with them). A new fiber's stack is laid out as if it had switched away at the top of
// ladle_emulation_start, which calls fiber_main(r12 = the fiber). Both are weak symbols: every
// translation unit that includes this header defines them (a test's kernels may be compiled in
// several), and the linker keeps one.
extern "C" void ladle_emulation_switch(void** save, void* load);
extern "C" void ladle_emulation_start();
asm(R"(
  .text
  .weak ladle_emulation_switch
  .type ladle_emulation_switch, @function
ladle_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ladle_emulation_switch, .-ladle_emulation_switch
  .weak ladle_emulation_start
  .type ladle_emulation_start, @function
ladle_emulation_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size ladle_emulation_start, .-ladle_emulation_start
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

struct Scheduler {
  static constexpr std::size_t stack_bytes = 512 * 1024, guard_bytes = 4096;
  std::vector<std::unique_ptr<Fiber>> fibers;  // grown as blocks need, stacks kept
#if !defined(__x86_64__)
  ucontext_t main_context;
#endif
  unsigned long long blocks = 0;

  ~Scheduler() {
    for (const auto& f : fibers) munmap(f->stack - guard_bytes, stack_bytes + guard_bytes);
  }
  static void fiber_main(Fiber* f);
  void prepare(Fiber& f) {
    if (!f.stack) {
      void* memory = mmap(nullptr, stack_bytes + guard_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (memory == MAP_FAILED) scheduler_fault("no memory for a thread's stack");
      if (mprotect(memory, guard_bytes, PROT_NONE) != 0) scheduler_fault("the stack's guard page could not be set");
      f.stack = static_cast<unsigned char*>(memory) + guard_bytes;
    }
    f.done = f.stalled = false;
    f.error = nullptr;
    f.reductions.clear();
#if defined(__x86_64__)
    // The frame ladle_emulation_switch pops: the pad, r15, r14, r13 (the entry), r12 (the fiber),
    // rbx, rbp, and the return address; 16-byte aligned once it has returned.
    auto* top = reinterpret_cast<std::uint64_t*>(f.stack + stack_bytes);
    std::uint64_t* sp = top - 8;
    sp[0] = 0;                                                         // the pad
    sp[1] = 0, sp[2] = 0;                                              // r15, r14
    sp[3] = reinterpret_cast<std::uint64_t>(&Scheduler::fiber_main);  // r13
    sp[4] = reinterpret_cast<std::uint64_t>(&f);                      // r12
    sp[5] = 0, sp[6] = 0;                                              // rbx, rbp
    sp[7] = reinterpret_cast<std::uint64_t>(&ladle_emulation_start);
    f.sp = sp;
#else
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = stack_bytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, reinterpret_cast<void (*)()>(&context_entry), 0);
#endif
  }
#if !defined(__x86_64__)
  static void context_entry();
#endif
  void resume(Fiber& f) {
    current_fiber = &f;
    thread_index = f.thread;
    warp_exchange = f.warp;
    warpgroup_exchange = f.group;
#if defined(__x86_64__)
    ladle_emulation_switch(&scheduler_sp, f.sp);
#else
    swapcontext(&main_context, &f.context);
#endif
    current_fiber = nullptr;
  }
  // Back to the scheduler from the running fiber.
  void suspend() {
    Fiber& f = *current_fiber;
#if defined(__x86_64__)
    ladle_emulation_switch(&f.sp, scheduler_sp);
#else
    swapcontext(&f.context, &main_context);
#endif
  }
  // Runs `threads` fibers of one block to completion; rethrows the first exception one threw.
  void run_block(unsigned threads, const std::function<void()>& kernel, const std::function<void(Fiber&, unsigned)>& place) {
    while (fibers.size() < threads) fibers.push_back(std::make_unique<Fiber>());
    for (unsigned t = 0; t < threads; ++t) {
      Fiber& f = *fibers[t];
      prepare(f);
      f.kernel = &kernel;
      place(f, t);
    }
    const bool backward = blocks++ % 2 == 1;
    for (unsigned live = threads; live > 0;) {
      bool progress = false;
      for (unsigned n = 0; n < threads; ++n) {
        Fiber& f = *fibers[backward ? threads - 1 - n : n];
        if (f.done) continue;
        resume(f);
        if (f.error) std::rethrow_exception(f.error);  // the others are abandoned mid-kernel
        if (f.done) --live;
        progress = progress || f.done || !f.stalled;
      }
      if (live > 0 && !progress) scheduler_fault("every thread waits and none can go on (a deadlock: arrivals that do not pair up)");
    }
  }
};
inline thread_local Scheduler scheduler;
// Back to the scheduler from the running fiber, without reaching `scheduler` (a dynamic thread_local)
// on x86-64.
inline void suspend_fiber() {
#if defined(__x86_64__)
  ladle_emulation_switch(&current_fiber->sp, scheduler_sp);
#else
  scheduler.suspend();
#endif
}
inline void Scheduler::fiber_main(Fiber* f) {
  try {
    (*f->kernel)();
  } catch (...) {
    f->error = std::current_exception();
  }
  f->done = true;
  suspend_fiber();
  scheduler_fault("a finished thread was resumed");
}
#if !defined(__x86_64__)
inline void Scheduler::context_entry() { fiber_main(current_fiber); }
#endif

// Gives the other threads a turn: where a thread waits, or dawdles.
inline void yield() {
  if (!current_fiber) scheduler_fault("a wait outside an emulated kernel");
  current_fiber->stalled = false;
  suspend_fiber();
}
// Returns once `ready()` holds, letting the other threads run meanwhile.
template <class Ready>
inline void wait_until(const Ready& ready) {
  if (ready()) return;
  if (!current_fiber) scheduler_fault("a wait outside an emulated kernel");
  current_fiber->stalled = false;  // it got here: progress
  for (;;) {
    suspend_fiber();
    if (ready()) return;
    current_fiber->stalled = true;  // resumed and still waiting
  }
}

// A barrier of `expected` threads: every arrival of one generation waits until the last one.
class Barrier {
 public:
  explicit Barrier(unsigned expected) : expected_(expected) {}
  void arrive_and_wait() {
    const unsigned long long mine = generation_;
    if (++arrived_ == expected_) {
      arrived_ = 0, ++generation_;
      return;
    }
    wait_until([&] { return generation_ != mine; });
  }

 private:
  unsigned expected_, arrived_ = 0;
  unsigned long long generation_ = 0;
};
inline constinit thread_local Barrier* barrier = nullptr;

// What the lanes of one warp post for a warp-wide operation.
struct WarpExchange {
  Barrier barrier{32};
  const unsigned short* address[32] = {};
  unsigned a[32][4] = {};
  unsigned b[32][2] = {};
  float value[32] = {};
  float fa[16][16] = {}, fb[8][16] = {};  // an mma's A [16][16] and B [8 columns][16], decoded once by lane 0
};
// What the threads of one warpgroup (4 warps) post for a wgmma.
struct WarpgroupExchange {
  Barrier barrier{128};
  unsigned a[128][4] = {};
  unsigned long long a_desc[128] = {}, b_desc[128] = {};
  // The wgmma's operands as floats, decoded once by the warpgroup's thread 0: A [64][16], B [N][16].
  float fa[64][16] = {};
  float fb[256][16] = {};
};
// The block's named barriers (bar.sync / bar.arrive id, count; 0 is __syncthreads'): barrier id
// completes a generation once `count` threads have arrived, releasing those that sync on it.
struct NamedBarriers {
  unsigned arrived[16] = {}, count[16] = {};
  unsigned long long generation[16] = {};
};
inline constinit thread_local NamedBarriers* named_barriers = nullptr;
[[noreturn]] inline void named_barrier_fault(const char* what) {
  std::fprintf(stderr, "emulated named barrier: %s\n", what);
  std::abort();
}
// One thread's arrival at barrier id of `count` threads; waits for the generation to complete
// when `wait` (bar.sync), else returns at once (bar.arrive).
inline void named_barrier(unsigned id, unsigned count, bool wait) {
  if (id == 0 || id >= 16) named_barrier_fault("barrier id outside 1..15");
  if (count == 0 || count % 32 != 0) named_barrier_fault("thread count not a positive multiple of 32");
  NamedBarriers& b = *named_barriers;
  if (b.arrived[id] == 0) b.count[id] = count;
  else if (b.count[id] != count) named_barrier_fault("threads arrived with different counts in one generation");
  const unsigned long long mine = b.generation[id];
  if (++b.arrived[id] == count) {
    b.arrived[id] = 0, ++b.generation[id];
    return;
  }
  if (wait) wait_until([&] { return b.generation[id] != mine; });
}
inline constinit thread_local unsigned char* shared_buffer = nullptr;
inline constexpr std::size_t dynamic_shared_bytes = 256 * 1024;

// Runs every block of a (grid_x, grid_y, grid_z) grid of `threads`-thread blocks, block by block,
// each block's threads as fibers on the calling thread.
inline void launch(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned threads, const std::function<void()>& kernel) {
  if (current_fiber) scheduler_fault("a launch from inside an emulated kernel");
  for (unsigned bz = 0; bz < grid_z; ++bz)
  for (unsigned by = 0; by < grid_y; ++by)
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      Barrier block_barrier(threads);
      std::vector<std::unique_ptr<WarpExchange>> warps;
      for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<WarpExchange>());
      NamedBarriers named;
      std::vector<std::unique_ptr<WarpgroupExchange>> groups;  // whole warpgroups only
      for (unsigned g = 0; g < threads / 128; ++g) groups.push_back(std::make_unique<WarpgroupExchange>());
      // Dynamic shared memory starts as garbage on a GPU: NaN bytes here.
      std::vector<unsigned char> shared(dynamic_shared_bytes, 0xff);
      block_index = {bx, by, bz};
      grid_dim = {grid_x, grid_y, grid_z};
      block_dim = {threads, 1, 1};
      barrier = &block_barrier;
      named_barriers = &named;
      shared_buffer = shared.data();
      scheduler.run_block(threads, kernel, [&](Fiber& f, unsigned tx) {
        f.thread = {tx, 0, 0};
        f.warp = warps[tx / 32].get();
        f.group = tx / 128 < groups.size() ? groups[tx / 128].get() : nullptr;
      });
    }
}
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads, const std::function<void()>& kernel) {
  launch(grid_x, grid_y, 1, threads, kernel);
}
}  // namespace cuda_emulation

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __syncthreads() ::cuda_emulation::barrier->arrive_and_wait()
#define threadIdx ::cuda_emulation::thread_index
#define blockIdx ::cuda_emulation::block_index
#define gridDim ::cuda_emulation::grid_dim
#define blockDim ::cuda_emulation::block_dim

#define LADLE_RECURRENT_HELPERS
struct ladle_f16 {
  unsigned short bits;
};
struct ladle_bf16 {
  unsigned short bits;
};
inline float ladle_load(const float* p) { return *p; }
inline float ladle_load(const ladle_f16* p) { return float(ladle::half::from_bits(p->bits)); }
inline float ladle_load(const ladle_bf16* p) { return float(ladle::bfloat16::from_bits(p->bits)); }
inline void ladle_store(float* p, float value) { *p = value; }
inline void ladle_store(ladle_f16* p, float value) { p->bits = ladle::half(value).bits(); }
inline void ladle_store(ladle_bf16* p, float value) { p->bits = ladle::bfloat16(value).bits(); }

// The chunked family's device helpers, on the host.
#define LADLE_CHUNKED_HELPERS
#define LADLE_DYNAMIC_SHARED(name) unsigned char* const name = ::cuda_emulation::shared_buffer
inline float ladle_exp2(float x) { return std::exp2(x); }
// rsqrt.approx on the device (2 ulp); exact here.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline unsigned ladle_float_bits(float x) {
  unsigned bits;
  std::memcpy(&bits, &x, 4);
  return bits;
}
inline float ladle_bits_float(unsigned x) {
  float value;
  std::memcpy(&value, &x, 4);
  return value;
}
inline float ladle_bf16_float(unsigned short bits) { return float(ladle::bfloat16::from_bits(bits)); }
inline unsigned short ladle_bf16_bits(float value) { return ladle::bfloat16(value).bits(); }
inline unsigned ladle_pack_bf16(float lo, float hi) {
  return static_cast<unsigned>(ladle_bf16_bits(lo)) | (static_cast<unsigned>(ladle_bf16_bits(hi)) << 16);
}
inline unsigned atomicMax(unsigned* address, unsigned value) {
  std::atomic_ref<unsigned> target(*address);
  unsigned seen = target.load();
  while (seen < value && !target.compare_exchange_weak(seen, value)) {
  }
  return seen;
}
inline unsigned atomicAdd(unsigned* address, unsigned value) { return std::atomic_ref<unsigned>(*address).fetch_add(value); }
inline unsigned atomicOr(unsigned* address, unsigned value) {
  return std::atomic_ref<unsigned>(*address).fetch_or(value);
}
namespace cuda_emulation {
inline unsigned lane() { return thread_index.x % 32; }
// ldmatrix .x4: lane l receives, of matrix i (rows posted by lanes 8i..8i+7), row l / 4,
// columns 2 (l % 4) and +1; with .trans, column l / 4 of rows 2 (l % 4) and +1.
inline void ldmatrix(unsigned (&r)[4], const unsigned short* p, bool trans) {
  WarpExchange& x = *warp_exchange;
  x.address[lane()] = p;
  x.barrier.arrive_and_wait();
  const unsigned l = lane();
  for (unsigned i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    if (trans) {
      lo = x.address[8 * i + 2 * (l % 4)][l / 4];
      hi = x.address[8 * i + 2 * (l % 4) + 1][l / 4];
    } else {
      lo = x.address[8 * i + l / 4][2 * (l % 4)];
      hi = x.address[8 * i + l / 4][2 * (l % 4) + 1];
    }
    r[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
  }
  x.barrier.arrive_and_wait();
}
inline float half_of(unsigned pair, unsigned k, bool f16 = false) {
  const unsigned short bits = static_cast<unsigned short>(k % 2 ? pair >> 16 : pair & 0xffffu);
  return f16 ? float(ladle::half::from_bits(bits)) : ladle_bf16_float(bits);
}
// mma.m16n8k16 row.col: A[r][k] is in lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8);
// B[k][n] in lane n * 4 + (k % 8) / 2, register k >= 8; D[r][c]: lane (r % 8) * 4 + c / 2,
// element (r >= 8) * 2 + c % 2.
inline void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool f16 = false) {
  WarpExchange& x = *warp_exchange;
  const unsigned l = lane();
  for (int i = 0; i < 4; ++i) x.a[l][i] = a[i];
  x.b[l][0] = b0, x.b[l][1] = b1;
  x.barrier.arrive_and_wait();
  // Every lane has posted: lane 0 decodes A and B once (each lane decoding what it reads took 128
  // conversions a lane, ten times the operands). The next warp operation's posts come after the
  // second barrier, and the next mma's decode after every lane has passed its first: two barriers
  // keep what is read whole.
  if (l == 0) {
    for (unsigned row = 0; row < 16; ++row)
      for (unsigned k = 0; k < 16; ++k)
        x.fa[row][k] = half_of(x.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k, f16);
    for (unsigned col = 0; col < 8; ++col)
      for (unsigned k = 0; k < 16; ++k) x.fb[col][k] = half_of(x.b[col * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k, f16);
  }
  x.barrier.arrive_and_wait();
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + e % 2;
    float sum = d[e];
    for (unsigned k = 0; k < 16; ++k) sum += x.fa[row][k] * x.fb[col][k];
    d[e] = sum;
  }
}
// __shfl_xor_sync over the full warp: lane l reads the value lane l ^ lane_mask posted.
inline float shfl_xor(float value, int lane_mask) {
  WarpExchange& x = *warp_exchange;
  const unsigned l = lane();
  x.value[l] = value;
  x.barrier.arrive_and_wait();
  const float other = x.value[(l ^ static_cast<unsigned>(lane_mask)) % 32];
  x.barrier.arrive_and_wait();
  return other;
}
// __shfl_up_sync over the full warp: lane l reads the value lane l - delta posted (its own below delta).
inline float shfl_up(float value, unsigned delta) {
  WarpExchange& x = *warp_exchange;
  const unsigned l = lane();
  x.value[l] = value;
  x.barrier.arrive_and_wait();
  const float other = x.value[l >= delta ? l - delta : l];
  x.barrier.arrive_and_wait();
  return other;
}
// __any_sync over the full warp: whether any lane posted true.
inline bool any(bool value) {
  WarpExchange& x = *warp_exchange;
  x.value[lane()] = value ? 1.0f : 0.0f;
  x.barrier.arrive_and_wait();
  bool result = false;
  for (unsigned l = 0; l < 32; ++l) result = result || x.value[l] != 0.0f;
  x.barrier.arrive_and_wait();
  return result;
}
}  // namespace cuda_emulation
inline bool ladle_warp_any(bool value) { return cuda_emulation::any(value); }
inline int ladle_warp_uniform(int x) { return x; }  // the kernels pass values every lane holds alike
// __syncwarp over the full warp: every lane arrives before any goes on.
inline void __syncwarp(unsigned /*full mask*/ = 0xffffffffu) { cuda_emulation::warp_exchange->barrier.arrive_and_wait(); }
inline float __shfl_up_sync(unsigned /*full mask*/, float value, unsigned delta) { return cuda_emulation::shfl_up(value, delta); }
inline float __shfl_xor_sync(unsigned /*full mask*/, float value, int lane_mask) {
  return cuda_emulation::shfl_xor(value, lane_mask);
}
inline void ladle_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) { cuda_emulation::ldmatrix(r, p, false); }
inline void ladle_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) { cuda_emulation::ldmatrix(r, p, true); }
inline void ladle_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { cuda_emulation::mma(d, a, b0, b1); }
inline void ladle_ldmatrix_x4_at(unsigned (&r)[4], unsigned address) {
  cuda_emulation::ldmatrix(r, reinterpret_cast<const unsigned short*>(::cuda_emulation::shared_buffer + address), false);
}
inline void ladle_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned address) {
  cuda_emulation::ldmatrix(r, reinterpret_cast<const unsigned short*>(::cuda_emulation::shared_buffer + address), true);
}

// The attention family's device helpers, on the host. A test may define LADLE_COUNT_STAGED()
// before including this file to count the 16-byte chunks staged into shared memory.
#ifndef LADLE_COUNT_STAGED
#define LADLE_COUNT_STAGED()
#endif
#define LADLE_ATTENTION_HELPERS
inline unsigned short ladle_f16_bits(float value) { return ladle::half(value).bits(); }
inline unsigned ladle_pack_f16(float lo, float hi) {
  return static_cast<unsigned>(ladle_f16_bits(lo)) | (static_cast<unsigned>(ladle_f16_bits(hi)) << 16);
}
inline void ladle_mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { cuda_emulation::mma(d, a, b0, b1, true); }
#define LADLE_CP_ASYNC_HELPERS
inline void ladle_cp_async_16(void* shared, const void* global) {
  LADLE_COUNT_STAGED();
  std::memcpy(shared, global, 16);
}
inline void ladle_cp_async_commit() {}
template <int Pending>
inline void ladle_cp_async_wait() {}
inline void ladle_zero_16(void* shared) {
  LADLE_COUNT_STAGED();
  std::memset(shared, 0, 16);
}
inline float ladle_neg_inf() { return -std::numeric_limits<float>::infinity(); }
inline float ladle_tanh(float x) { return 1.0f - 2.0f / (std::exp2(2.8853900817779268f * x) + 1.0f); }
inline float ladle_tanh_exp2(float y) { return 1.0f - 2.0f / (std::exp2(y) + 1.0f); }
inline float ladle_tanh_approx(float x) { return std::tanh(x); }  // the hardware form is within 2^-11

// ---- Hopper's wgmma (sm_90a), per warpgroup
namespace cuda_emulation {
[[noreturn]] inline void wgmma_fault(const char* what) {
  std::fprintf(stderr, "emulated wgmma: %s\n", what);
  std::abort();
}
// A matrix descriptor as the PTX ISA lays it out (9.7.15.5.1.2.2): bits 0-13 start address,
// 16-29 leading dimension byte offset, 32-45 stride dimension byte offset (each stored >> 4),
// 49-51 base offset, 62-63 swizzle mode.
struct MatrixDescriptor {
  unsigned start, leading, stride, base_offset, swizzle;
};
inline MatrixDescriptor decode_descriptor(unsigned long long d) {
  return {static_cast<unsigned>(d & 0x3fffu) << 4, static_cast<unsigned>((d >> 16) & 0x3fffu) << 4,
          static_cast<unsigned>((d >> 32) & 0x3fffu) << 4, static_cast<unsigned>((d >> 49) & 7u), static_cast<unsigned>(d >> 62)};
}
// Element (mn, k) of a 16-bit operand (mn: the row of A or the column of B) under the
// canonical layouts (PTX ISA 9.7.15.5.1.2.1.3; T = 8 elements = 16 bytes). No swizzle (mode 0):
//   K-major  ((8,m),(T,2k)):((1T,SBO),(1,LBO))    -> mn%8 * 16 + mn/8 * SBO + k%8 * 2 + k/8 * LBO bytes
//   MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) -> mn%8 * 2 + mn/8 * SBO + k%8 * 16 + k/8 * LBO bytes
// 128-byte swizzle (mode 1; rows of 128 bytes, 8 of them an atom of 1024 bytes):
//   K-major  ((8,m),(T,2k)):((8T,SBO),(1,T))      -> mn%8 * 128 + mn/8 * SBO + k%8 * 2 + k/8 * 16 bytes (LBO unused)
//   MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) -> mn%8 * 2 + mn/8%8 * 16 + mn/64 * LBO + k%8 * 128 + k/8 * SBO bytes
// and then the swizzle of the shared address: its bits 4-6 XOR its bits 7-9 (the 16-byte
// piece p of 128-byte row r lands at p ^ r % 8), as the TMA copies below write it. With base
// offset 0 the pattern starts at 1024-byte boundaries, so a start advanced within a row (the
// next k16 of a K-major operand) reads through the same pattern.
inline unsigned short descriptor_element(const MatrixDescriptor& d, unsigned mn, unsigned k, bool mn_major) {
  if (d.swizzle != 0 && d.swizzle != 1) wgmma_fault("only the no-swizzle and the 128-byte-swizzle layouts are emulated");
  if (d.base_offset != 0) wgmma_fault("a nonzero matrix base offset is not emulated");
  if (d.start % 16 != 0) wgmma_fault("matrix start address not 16-byte aligned");
  std::size_t byte;
  if (d.swizzle == 0) {
    byte = d.start + (mn_major ? mn % 8 * 2 + k % 8 * 16 : mn % 8 * 16 + k % 8 * 2) + std::size_t(mn / 8) * d.stride +
           std::size_t(k / 8) * d.leading;
  } else {
    byte = mn_major ? d.start + mn % 8 * 2 + mn / 8 % 8 * 16 + std::size_t(mn / 64) * d.leading + k % 8 * 128 + std::size_t(k / 8) * d.stride
                    : d.start + mn % 8 * 128 + std::size_t(mn / 8) * d.stride + k % 8 * 2 + k / 8 * 16;
    byte ^= (byte >> 7 & 7) << 4;
  }
  if (byte + 2 > dynamic_shared_bytes) wgmma_fault("operand past the end of shared memory");
  unsigned short bits;
  std::memcpy(&bits, shared_buffer + byte, 2);
  return bits;
}
inline float operand_value(unsigned short bits, bool f16) {
  return f16 ? float(ladle::half::from_bits(bits)) : float(ladle::bfloat16::from_bits(bits));
}
// wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: d = A B + (accumulate ? d : 0), accumulate
// being the instruction's scale-d (0: d's earlier contents, never read, may be anything).
//   A: 64 x 16, from a descriptor (a_regs null; K-major, or M-major when trans_a) or from registers: thread t of the
//      warpgroup holds, in a_regs[r], rows 16 (t / 32) + (t % 32) / 4 (+ 8 for r = 1, 3) at
//      columns 2 (t % 4) and + 1 (+ 8 for r = 2, 3), low half first.
//   B: 16 x N from a descriptor, K-major (trans_b false) or N-major (trans_b true).
//   D: thread t's d[i / 4][i % 4] is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
//      column 8 (i / 4) + 2 (t % 4) + i % 2.
template <int N>
inline void wgmma(float (&d)[N / 8][4], const unsigned* a_regs, unsigned long long a_desc, unsigned long long b_desc,
                  bool trans_b, bool f16, bool accumulate = true, bool trans_a = false) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N = 8, 16, ..., 256");
  if (!warpgroup_exchange) wgmma_fault("the block is not made of whole warpgroups");
  WarpgroupExchange& x = *warpgroup_exchange;
  const unsigned t = thread_index.x % 128;
  if (a_regs)
    for (int r = 0; r < 4; ++r) x.a[t][r] = a_regs[r];
  x.a_desc[t] = a_desc, x.b_desc[t] = b_desc;
  x.barrier.arrive_and_wait();
  // Every thread has posted: thread 0 checks the descriptors and decodes A and B once (each element
  // was decoded by every thread that reads it: 16 N decodes a thread, 64 times the operands' size).
  // The next wgmma's posts come after the second barrier, and its decode after every thread has
  // passed its first, so two barriers keep x's contents whole while they are read.
  if (t == 0) {
    for (unsigned u = 0; u < 128; ++u)
      if (x.b_desc[u] != b_desc || (!a_regs && x.a_desc[u] != a_desc)) wgmma_fault("the threads of a warpgroup gave different descriptors");
    const MatrixDescriptor da = decode_descriptor(a_desc), db = decode_descriptor(b_desc);
    for (unsigned row = 0; row < 64; ++row)
      for (unsigned k = 0; k < 16; ++k)
        x.fa[row][k] = a_regs ? half_of(x.a[32 * (row / 16) + 4 * (row % 8) + (k % 8) / 2][(row % 16 >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k, f16)
                              : operand_value(descriptor_element(da, row, k, trans_a), f16);
    for (unsigned col = 0; col < N; ++col)
      for (unsigned k = 0; k < 16; ++k) x.fb[col][k] = operand_value(descriptor_element(db, col, k, trans_b), f16);
  }
  x.barrier.arrive_and_wait();
  const unsigned warp = t / 32, l = t % 32;
  for (unsigned i = 0; i < N / 2; ++i) {
    const unsigned row = 16 * warp + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
    float sum = accumulate ? d[i / 4][i % 4] : 0.0f;
    const float* a = x.fa[row];
    const float* b = x.fb[col];
    for (unsigned k = 0; k < 16; ++k) sum += a[k] * b[k];
    d[i / 4][i % 4] = sum;
  }
}
}  // namespace cuda_emulation
inline unsigned ladle_shared_address(const void* p) {
  return static_cast<unsigned>(static_cast<const unsigned char*>(p) - ::cuda_emulation::shared_buffer);
}
#define LADLE_WGMMA_HELPERS
#define LADLE_WGMMA_EMULATED
inline void ladle_wgmma_fence() {}
inline void ladle_wgmma_commit() {}
template <int Pending>
inline void ladle_wgmma_wait() {}
inline void ladle_fence_proxy_async() {}
template <int N>
inline void ladle_wgmma_fence_operand(float (&)[N / 8][4]) {}
template <int N>
inline void ladle_wgmma_ss_bf16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, false, false, accumulate != 0);
}
template <int N>
inline void ladle_wgmma_ss_f16(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, false, true, accumulate != 0);
}
#define LADLE_WGMMA_TRANSPOSED
template <int N>
inline void ladle_wgmma_ss_bf16_tb(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, true, false, accumulate != 0);
}
template <int N>
inline void ladle_wgmma_ss_bf16_tab(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, true, false, accumulate != 0, true);
}
template <int N>
inline void ladle_wgmma_rs_bf16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, a, 0, b, true, false, accumulate != 0);
}
template <int N>
inline void ladle_wgmma_rs_f16(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, a, 0, b, true, true, accumulate != 0);
}
#define LADLE_WGMMA_TRANSPOSED_F16
template <int N>
inline void ladle_wgmma_ss_f16_tab(float (&d)[N / 8][4], unsigned long long a, unsigned long long b, int accumulate = 1) {
  cuda_emulation::wgmma<N>(d, nullptr, a, b, true, true, accumulate != 0, true);
}

// The attention backward's device helpers: CUDA's float2, and the reductions into global memory
// (red.global.add.f32 and its .v2 form) as atomic adds.
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
#define LADLE_ATTENTION_BACKWARD_HELPERS
inline void ladle_red_add_f32(float* p, float a) { std::atomic_ref<float>(*p).fetch_add(a); }
inline void ladle_red_add_f32x2(float* p, float a, float b) {
  if (reinterpret_cast<std::uintptr_t>(p) % 8 != 0) cuda_emulation::wgmma_fault("red.global.add.v2.f32 on an address that is not 8-byte aligned");
  std::atomic_ref<float>(p[0]).fetch_add(a);
  std::atomic_ref<float>(p[1]).fetch_add(b);
}


// ---- Hopper's TMA pipelines: tensor maps, mbarriers, cp.async.bulk.tensor, setmaxnreg
// A tensor map kernel parameter: `const __grid_constant__ ladle_tensor_map map`.
#define __grid_constant__
#define LADLE_TENSOR_MAP_DEFINED
struct ladle_tensor_map {
  unsigned char bytes[128];
};
namespace cuda_emulation {
[[noreturn]] inline void pipeline_fault(const char* what) {
  std::fprintf(stderr, "emulated TMA pipeline: %s\n", what);
  std::abort();
}
// An mbarrier (PTX ISA 9.7.13.15): the current phase completes once its pending arrivals
// and its transaction bytes both reach 0; the phase bit flips and the next phase expects
// `count` arrivals again. The 8 bytes in shared memory are only its key here.
struct Mbarrier {
  unsigned count = 0, pending = 0, phase = 0;
  long long tx = 0;
};
inline std::mutex mbarrier_mutex;
inline std::map<const void*, Mbarrier> mbarriers;
// The barrier at `bar`, under mbarrier_mutex.
inline Mbarrier& mbarrier_at(const unsigned long long* bar, const char* what) {
  const auto found = mbarriers.find(bar);
  if (found == mbarriers.end() || found->second.count == 0) pipeline_fault(what);
  return found->second;
}
inline void mbarrier_complete_if_done(Mbarrier& m) {
  if (m.pending == 0 && m.tx == 0) m.phase ^= 1, m.pending = m.count;
}
inline void mbarrier_arrive(unsigned long long* bar, unsigned tx_bytes) {
  const std::lock_guard<std::mutex> lock(mbarrier_mutex);
  Mbarrier& m = mbarrier_at(bar, "arrival on an uninitialised mbarrier");
  if (m.pending == 0) pipeline_fault("more arrivals on an mbarrier than its count in one phase");
  m.tx += tx_bytes;
  --m.pending;
  mbarrier_complete_if_done(m);
}
// complete_tx: a copy's bytes have landed.
inline void mbarrier_complete_tx(unsigned long long* bar, unsigned long long bytes) {
  const std::lock_guard<std::mutex> lock(mbarrier_mutex);
  Mbarrier& m = mbarrier_at(bar, "a copy completing on an uninitialised mbarrier");
  m.tx -= static_cast<long long>(bytes);
  if (m.tx < 0) pipeline_fault("a copy completed more bytes on an mbarrier than were announced (arrive_expect_tx)");
  mbarrier_complete_if_done(m);
}
// The current phase bit of the barrier at `bar` (for tests).
inline unsigned mbarrier_phase(const unsigned long long* bar) {
  const std::lock_guard<std::mutex> lock(mbarrier_mutex);
  return mbarrier_at(bar, "phase of an uninitialised mbarrier").phase;
}
// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes under
// CU_TENSOR_MAP_SWIZZLE_128B with zero fill: box element (i0, i1, ...) is tensor element
// (c0 + i0, c1 + i1, ...), or 0 where that lies outside the tensor; it goes to the shared
// address dst + 2 (i0 + box0 (i1 + box1 (i2 + box2 i3))) with bits 4-6 XOR bits 7-9. Copies at
// once, then completes the whole box's bytes (zeros included) on `bar`.
template <unsigned Rank>
inline void tma_load(void* dst, const ladle_tensor_map* map, const int (&c)[Rank], unsigned long long* bar) {
  ladle::TensorMapDescription t;
  std::memcpy(&t, map->bytes, sizeof t);
  if (t.rank != Rank) pipeline_fault("the tensor map's rank is not the copy's");
  if (t.strides[0] != 2) pipeline_fault("the tensor map's elements are not contiguous 16-bit ones");
  if (t.box[0] * 2 > 128 || t.box[0] * 2 % 16 != 0) pipeline_fault("the box's inner dimension is not a multiple of 16 bytes up to 128 (the swizzle span)");
  const std::size_t base = ladle_shared_address(dst);
  if (base >= dynamic_shared_bytes) pipeline_fault("a copy's destination is not in dynamic shared memory");
  if (base % 1024 != 0) pipeline_fault("a 128-byte-swizzled copy's destination is not 1024-byte aligned");
  std::size_t elements = 1;
  for (unsigned d = 0; d < Rank; ++d) elements *= t.box[d];
  if (2 * elements > dynamic_shared_bytes - base) pipeline_fault("a copy's box runs past the end of dynamic shared memory");
  unsigned i[Rank] = {};
  for (std::size_t e = 0; e < elements; ++e) {
    // i: the box index of element e, innermost first.
    std::size_t rest = e;
    bool inside = true;
    long long source = 0;
    for (unsigned d = 0; d < Rank; ++d) {
      i[d] = static_cast<unsigned>(rest % t.box[d]), rest /= t.box[d];
      const long long coordinate = static_cast<long long>(c[d]) + i[d];
      if (coordinate < 0 || coordinate >= static_cast<long long>(t.dims[d])) inside = false;
      source += coordinate * static_cast<long long>(t.strides[d]);
    }
    unsigned short bits = 0;
    if (inside) std::memcpy(&bits, static_cast<const unsigned char*>(t.address) + source, 2);
    std::size_t address = base + 2 * e;
    address ^= (address >> 7 & 7) << 4;
    std::memcpy(shared_buffer + address, &bits, 2);
  }
  for (unsigned long long chunk = 0; chunk < 2 * elements / 16; ++chunk) LADLE_COUNT_STAGED();  // 16 bytes each
  mbarrier_complete_tx(bar, 2 * elements);
}

// cp.reduce.async.bulk.tensor.Nd.global.shared::cta.add.tile.bulk_group with an fp32 map under
// CU_TENSOR_MAP_SWIZZLE_128B: box element (i0, i1, ...), read from the shared address
// src + 4 (i0 + box0 (i1 + ...)) with bits 4-6 XOR bits 7-9, is added to tensor element
// (c0 + i0, c1 + i1, ...) where that lies inside the tensor (elsewhere dropped). They run late, as
// the TMA unit may: a thread's are kept until it waits for them (ladle_bulk_wait_read /
// ladle_bulk_wait) and then read shared memory as it is at that moment, so a kernel that writes
// the source again before waiting, or ends without waiting (the thread's list dies with it),
// gets wrong sums.
inline void run_pending_reductions() {
  if (!current_fiber) pipeline_fault("a bulk wait outside an emulated kernel");
  for (const TensorReduction& r : current_fiber->reductions) {
    std::size_t elements = 1;
    for (unsigned d = 0; d < r.map.rank; ++d) elements *= r.map.box[d];
    for (std::size_t e = 0; e < elements; ++e) {
      std::size_t rest = e;
      bool inside = true;
      long long target = 0;
      for (unsigned d = 0; d < r.map.rank; ++d) {
        const long long coordinate = static_cast<long long>(r.c[d]) + static_cast<long long>(rest % r.map.box[d]);
        rest /= r.map.box[d];
        if (coordinate < 0 || coordinate >= static_cast<long long>(r.map.dims[d])) inside = false;
        target += coordinate * static_cast<long long>(r.map.strides[d]);
      }
      if (!inside) continue;
      std::size_t address = r.base + 4 * e;
      address ^= (address >> 7 & 7) << 4;
      float value;
      std::memcpy(&value, shared_buffer + address, 4);
      auto* dst = reinterpret_cast<float*>(static_cast<unsigned char*>(const_cast<void*>(r.map.address)) + target);
      std::atomic_ref<float>(*dst).fetch_add(value);
    }
  }
  current_fiber->reductions.clear();
}
template <unsigned Rank>
inline void tma_reduce_add(const ladle_tensor_map* map, const void* src, const int (&c)[Rank]) {
  TensorReduction r;
  std::memcpy(&r.map, map->bytes, sizeof r.map);
  if (r.map.rank != Rank) pipeline_fault("the tensor map's rank is not the reduction's");
  if (!r.map.float32 || r.map.strides[0] != 4) pipeline_fault("an add reduction's tensor map is not of contiguous fp32 elements");
  if (r.map.box[0] * 4 > 128 || r.map.box[0] * 4 % 16 != 0) pipeline_fault("the box's inner dimension is not a multiple of 16 bytes up to 128 (the swizzle span)");
  r.base = ladle_shared_address(src);
  if (r.base % 1024 != 0) pipeline_fault("a 128-byte-swizzled reduction's source is not 1024-byte aligned");
  std::size_t elements = 1;
  for (unsigned d = 0; d < Rank; ++d) elements *= r.map.box[d], r.c[d] = c[d];
  if (r.base >= dynamic_shared_bytes || 4 * elements > dynamic_shared_bytes - r.base) pipeline_fault("a reduction's box runs past the end of dynamic shared memory");
  if (!current_fiber) pipeline_fault("a reduction outside an emulated kernel");
  current_fiber->reductions.push_back(r);
}
}  // namespace cuda_emulation
inline void ladle_tma_reduce_add_4d(const ladle_tensor_map* map, const void* src, int c0, int c1, int c2, int c3) {
  cuda_emulation::tma_reduce_add<4>(map, src, {c0, c1, c2, c3});
}
inline void ladle_bulk_commit() {}
inline void ladle_bulk_wait_read() { cuda_emulation::run_pending_reductions(); }
inline void ladle_bulk_wait() { cuda_emulation::run_pending_reductions(); }
#define LADLE_PIPELINE_HELPERS
inline void ladle_mbarrier_init(unsigned long long* bar, unsigned count) {
  if (count == 0) cuda_emulation::pipeline_fault("an mbarrier initialised with count 0");
  const std::lock_guard<std::mutex> lock(cuda_emulation::mbarrier_mutex);
  cuda_emulation::mbarriers[bar] = {count, count, 0, 0};
}
inline void ladle_fence_barrier_init() {}
inline void ladle_named_barrier_sync(unsigned id, unsigned threads) { cuda_emulation::named_barrier(id, threads, true); }
inline void ladle_named_barrier_arrive(unsigned id, unsigned threads) { cuda_emulation::named_barrier(id, threads, false); }
inline void ladle_mbarrier_arrive(unsigned long long* bar) { cuda_emulation::mbarrier_arrive(bar, 0); }
inline void ladle_mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) { cuda_emulation::mbarrier_arrive(bar, bytes); }
// Returns once the phase of parity `parity` has completed: while the current phase has that
// parity, it has not.
inline void ladle_mbarrier_wait(unsigned long long* bar, unsigned parity) {
  cuda_emulation::wait_until([&] { return cuda_emulation::mbarrier_phase(bar) != (parity & 1); });
}
inline void ladle_tma_load_4d(void* dst, const ladle_tensor_map* map, int c0, int c1, int c2, int c3, unsigned long long* bar) {
  cuda_emulation::tma_load<4>(dst, map, {c0, c1, c2, c3}, bar);
}
inline void ladle_tma_load_3d(void* dst, const ladle_tensor_map* map, int c0, int c1, int c2, unsigned long long* bar) {
  cuda_emulation::tma_load<3>(dst, map, {c0, c1, c2}, bar);
}
template <int N>
inline void ladle_setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
}
template <int N>
inline void ladle_setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
}

struct EmulatedKernel {
  const char* name;
  void (*launch)(void** args);
};
