// The CPU paths' one way of spreading work over threads: items 0..count-1 handed out by an
// atomic counter, each thread with its own worker state (scratch rows, loaders), the first
// exception stopping the others and rethrown on the caller's thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ladle::cpu::detail {

// make_worker() builds one thread's state; worker(item) runs one item. threads <= 0: one
// per hardware thread; never more threads than items.
template <class MakeWorker>
void parallel_items(std::int64_t count, int threads, const MakeWorker& make_worker) {
  if (count <= 0) return;
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t wanted = threads > 0 ? threads : static_cast<std::int64_t>(hardware);
  const int used = static_cast<int>(std::min(wanted, count));
  std::atomic<std::int64_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto work = [&] {
    try {
      auto worker = make_worker();
      for (std::int64_t item = next++; item < count; item = next++) worker(item);
    } catch (...) {
      next = count;  // the others stop at their next item
      const std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(used - 1));
  for (int i = 0; i < used - 1; ++i) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ladle::cpu::detail
