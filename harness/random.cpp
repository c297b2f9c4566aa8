#include "harness/random.hpp"

#include <cmath>

#include "common/parallel.hpp"

namespace rmsnorm::harness {

double hetero_row_scale(int64_t row) { return std::ldexp(1.0, static_cast<int>((row * 5) % 9) - 4); }

namespace {

// Calls value(r, c) for every element, rows split over threads.
template <typename Value>
void fill(HostMatrix& m, Value value) {
  const int threads = threads_for(0, m.rows, m.rows * m.cols);
  parallel_for(m.rows, threads, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < m.cols; ++c) m.set(r, c, value(r, c));
  });
}

}  // namespace

void fill_normal(HostMatrix& m, uint64_t seed, const RowScale& scale, double mean) {
  fill(m, [&](int64_t r, int64_t c) {
    const double s = scale ? scale(r) : 1.0;
    const double v = mean + s * normal_at(seed, static_cast<uint64_t>(r * m.cols + c));
    return round_to(m.dtype, v) == 0.0 ? mean + 0.5 * s : v;
  });
}

void fill_uniform(HostMatrix& m, uint64_t seed) {
  fill(m, [&](int64_t r, int64_t c) {
    const double v = uniform_at(seed, static_cast<uint64_t>(r * m.cols + c)) * 4.0 - 2.0;
    return round_to(m.dtype, v) == 0.0 ? 0.5 : v;
  });
}

}  // namespace rmsnorm::harness
