// Host allocation failures inside the library (CPU backend): every entry point still returns a status (no C++
// exception crosses the C ABI), a call that fails writes none of its outputs, and a call that succeeds gives the
// bits of a call without failures.
//
// This binary replaces the global operator new with one that, once armed, fails the k-th allocation. Each case
// runs the call for k = 0, 1, 2, ... until a call finishes without reaching the k-th allocation: so every
// allocation the call makes (its scratch, its threads, an error message) fails once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "rmsnorm/rmsnorm.h"

namespace {
// < 0: disarmed. Otherwise the allocation that takes it from 0 to -1 fails.
std::atomic<long> g_countdown{-1};
}  // namespace

// Out of line, so that the compiler does not see malloc's pointers reach delete's free() (-Wmismatched-new-delete).
#if defined(__GNUC__)
#define RMSNORM_TEST_NOINLINE __attribute__((noinline))
#else
#define RMSNORM_TEST_NOINLINE
#endif
RMSNORM_TEST_NOINLINE void* operator new(std::size_t n) {
  if (g_countdown.load(std::memory_order_relaxed) >= 0 && g_countdown.fetch_sub(1) == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
RMSNORM_TEST_NOINLINE void operator delete(void* p) noexcept { std::free(p); }
RMSNORM_TEST_NOINLINE void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// A call's outputs, as byte buffers compared whole.
using Outputs = std::vector<std::vector<unsigned char>*>;

// Runs call() with the k-th allocation failing, for every k until one run does not reach it. Before each run the
// outputs are poisoned; a failing run must return INTERNAL_ERROR (or `validation`, the status the call returns
// when nothing fails) with a message and every output still poisoned; a succeeding run must give want's bytes.
// Returns how many allocation failures were injected (so a case that allocates nothing is seen).
int run_with_failures(const std::function<rmsnorm_status_t()>& call, const Outputs& outs,
                      rmsnorm_status_t expected) {
  // The bytes of a run with no failure.
  for (auto* o : outs) std::fill(o->begin(), o->end(), static_cast<unsigned char>(0xA5));
  EXPECT_EQ(call(), expected) << rmsnorm_last_error();
  std::vector<std::vector<unsigned char>> want;
  for (auto* o : outs) want.push_back(*o);

  int injected = 0;
  for (long k = 0; k < 100000; ++k) {
    for (auto* o : outs) std::fill(o->begin(), o->end(), static_cast<unsigned char>(0xA5));
    g_countdown.store(k);
    rmsnorm_status_t st = RMSNORM_STATUS_SUCCESS;
    bool threw = false;
    try {
      st = call();
    } catch (...) {
      threw = true;
    }
    const bool reached = g_countdown.exchange(-1) < 0;
    EXPECT_FALSE(threw) << "an exception crossed the C ABI (allocation " << k << " failing)";
    if (!reached) {  // nothing failed: the run is the plain one
      EXPECT_EQ(st, expected);
      break;
    }
    ++injected;
    if (st == expected) {
      for (size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(*outs[i], want[i]) << "output " << i << ", allocation " << k;
      continue;
    }
    EXPECT_EQ(st, RMSNORM_STATUS_INTERNAL_ERROR) << "allocation " << k;
    EXPECT_STRNE(rmsnorm_last_error(), "") << "allocation " << k;
    for (size_t i = 0; i < outs.size(); ++i) {
      for (unsigned char b : *outs[i]) {
        if (b != 0xA5) {
          ADD_FAILURE() << "output " << i << " written by a call that returned "
                        << rmsnorm_status_string(st) << " (allocation " << k << " failing)";
          break;
        }
      }
    }
  }
  return injected;
}

std::vector<unsigned char> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  std::vector<unsigned char> b(n * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Large enough for 4 threads (the CPU backend gives a thread at least 2^15 elements).
constexpr int64_t kRows = 64, kCols = 4096;
constexpr int kThreads = 4;

rmsnorm_problem_t f32_problem(float eps = 1e-5f, int64_t rows = kRows, int64_t cols = kCols) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.dtype = RMSNORM_DTYPE_F32;
  p.rows = rows;
  p.cols = cols;
  p.eps = eps;
  return p;
}

const size_t kMat = static_cast<size_t>(kRows * kCols) * sizeof(float);

TEST(OutOfMemory, Forward) {
  const auto x = random_floats(kRows * kCols, 1), w = random_floats(kCols, 2);
  std::vector<unsigned char> y(kMat), rstd(kRows * sizeof(float));
  const rmsnorm_problem_t p = f32_problem();
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(kThreads);
  const int n = run_with_failures(
      [&] {
        return rmsnorm_forward(&p, x.data(), kCols, w.data(), y.data(), kCols, reinterpret_cast<float*>(rstd.data()),
                               &be);
      },
      {&y, &rstd}, RMSNORM_STATUS_SUCCESS);
  EXPECT_GT(n, 0) << "the forward allocated nothing: the test tests nothing";
}

// gx is written before gw's last pass (the sum of the row partials), which starts threads of its own: at 16 rows
// (one partial) of 65536 columns, gx comes from the rows' pass and gw's sum takes 2 threads.
TEST(OutOfMemory, BackwardWithGw) {
  constexpr int64_t kRows = 16, kCols = 65536;
  const size_t kMat = static_cast<size_t>(kRows * kCols) * sizeof(float);
  const auto x = random_floats(kRows * kCols, 3), w = random_floats(kCols, 4), gy = random_floats(kRows * kCols, 5);
  std::vector<unsigned char> gx(kMat), gw(kCols * sizeof(float));
  const rmsnorm_problem_t p = f32_problem(1e-5f, kRows, kCols);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(kThreads);
  size_t ws_bytes = 0;
  ASSERT_EQ(rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &be, &ws_bytes), RMSNORM_STATUS_SUCCESS);
  std::vector<unsigned char> ws(ws_bytes);
  const int n = run_with_failures(
      [&] {
        return rmsnorm_backward(&p, x.data(), kCols, w.data(), gy.data(), kCols, nullptr, gx.data(), kCols, gw.data(),
                                RMSNORM_GW_STORE, ws.data(), ws.size(), &be);
      },
      {&gx, &gw}, RMSNORM_STATUS_SUCCESS);
  EXPECT_GT(n, 0);
}

TEST(OutOfMemory, AddForwardAndQuant) {
  const auto x = random_floats(kRows * kCols, 6), r = random_floats(kRows * kCols, 7), w = random_floats(kCols, 8);
  std::vector<unsigned char> h(kMat), y(kMat), q(static_cast<size_t>(kRows * kCols)), s(kRows * sizeof(float));
  const rmsnorm_problem_t p = f32_problem();
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(kThreads);
  EXPECT_GT(run_with_failures(
                [&] {
                  return rmsnorm_add_forward(&p, x.data(), kCols, r.data(), kCols, w.data(), h.data(), kCols,
                                             y.data(), kCols, nullptr, &be);
                },
                {&h, &y}, RMSNORM_STATUS_SUCCESS),
            0);
  rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, nullptr, reinterpret_cast<float*>(s.data()),
                     nullptr};
  EXPECT_GT(run_with_failures(
                [&] { return rmsnorm_forward_quant(&p, x.data(), kCols, w.data(), &qt, q.data(), kCols, nullptr, &be); },
                {&q, &s}, RMSNORM_STATUS_SUCCESS),
            0);
}

// A rejected call builds its message on the heap: without memory it still returns a status, with a message.
TEST(OutOfMemory, RejectedCall) {
  const auto x = random_floats(kRows * kCols, 9);
  std::vector<unsigned char> y(kMat);
  const rmsnorm_problem_t p = f32_problem(-1.0f);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(kThreads);
  EXPECT_GT(run_with_failures([&] { return rmsnorm_forward(&p, x.data(), kCols, nullptr, y.data(), kCols, nullptr, &be); },
                              {&y}, RMSNORM_STATUS_INVALID_EPS),
            0);
}

}  // namespace
