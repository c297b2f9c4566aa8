// Host threads: the CPU backend's work split, also used by the harness
// (harness/) for fills and reference checks, so both start threads by the
// same rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace rmsnorm {

// Below this many elements per thread, starting a thread costs more than the
// work it takes over (thread start-up is tens of microseconds, an element a
// nanosecond or two).
constexpr int64_t kMinElemsPerThread = int64_t{1} << 15;

// Threads worth using for `items` independent items totalling `elems` elements.
inline int threads_for(int requested, int64_t items, int64_t elems) {
  int64_t t = requested;
  if (t <= 0) {
    const unsigned hw = std::thread::hardware_concurrency();
    t = hw == 0 ? 1 : hw;
  }
  t = std::min({t, items, elems / kMinElemsPerThread});
  return static_cast<int>(std::max<int64_t>(1, t));
}

// Calls fn(t, begin, end) for t in [0, threads) on static contiguous chunks of
// [0, n); the caller runs chunk 0. A thread that cannot be started has its
// chunk run here instead: the chunks, and so the results, stay the same. It
// throws nothing of its own, so a pass that runs after outputs were written
// (the CPU backward's gw pass after gx) cannot fail halfway.
template <typename Fn>
void parallel_for(int64_t n, int threads, Fn fn) {
  if (n <= 0) return;
  if (threads <= 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  try {
    pool.reserve(static_cast<size_t>(threads - 1));
  } catch (...) {  // no memory for the pool: every chunk here, in order
    for (int t = 0; t < threads; ++t) fn(t, n * t / threads, n * (t + 1) / threads);
    return;
  }
  for (int t = 1; t < threads; ++t) {
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    try {
      pool.emplace_back([=] { fn(t, b, e); });
    } catch (...) {
      fn(t, b, e);
    }
  }
  fn(0, int64_t{0}, n / threads);
  for (auto& th : pool) th.join();
}

}  // namespace rmsnorm
