// Runs generated CUDA kernels on the host, so that CI without a GPU checks what they
// compute: each CUDA thread of a block is a std::thread, __syncthreads is a std::barrier,
// __shared__ arrays are static (blocks run one after another), and the 16-bit helpers are
// the host ones. Include it before the generated source.
#pragma once

#include <barrier>
#include <cmath>
#include <functional>
#include <math.h>
#include <thread>
#include <vector>

#include <ladle/codegen/float16.h>

namespace cuda_emulation {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local Index thread_index, block_index;
inline thread_local std::barrier<>* barrier = nullptr;

// Runs every block of a (grid_x, grid_y) grid of `threads`-thread blocks, block by block.
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads, const std::function<void()>& kernel) {
  for (unsigned by = 0; by < grid_y; ++by)
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      std::barrier<> block_barrier(static_cast<std::ptrdiff_t>(threads));
      std::vector<std::thread> block;
      for (unsigned tx = 0; tx < threads; ++tx)
        block.emplace_back([&, tx] {
          thread_index = {tx, 0, 0};
          block_index = {bx, by, 0};
          barrier = &block_barrier;
          kernel();
        });
      for (std::thread& t : block) t.join();
    }
}
}  // namespace cuda_emulation

#define __global__
#define __launch_bounds__(threads)
#define __shared__ static
#define __syncthreads() ::cuda_emulation::barrier->arrive_and_wait()
#define threadIdx ::cuda_emulation::thread_index
#define blockIdx ::cuda_emulation::block_index

#define LADLE_RECURRENT_HELPERS
struct ladle_f16 {
  unsigned short bits;
};
struct ladle_bf16 {
  unsigned short bits;
};
inline float ladle_load(const float* p) { return *p; }
inline float ladle_load(const ladle_f16* p) { return ladle::narrow_float::from_f16(p->bits); }
inline float ladle_load(const ladle_bf16* p) { return ladle::narrow_float::from_bf16(p->bits); }
inline void ladle_store(float* p, float value) { *p = value; }
inline void ladle_store(ladle_f16* p, float value) { p->bits = ladle::narrow_float::to_f16(value); }
inline void ladle_store(ladle_bf16* p, float value) { p->bits = ladle::narrow_float::to_bf16(value); }

struct EmulatedKernel {
  const char* name;
  void (*launch)(void** args);
};
