// Random inputs for the tests, the CLI and the benchmark: fresh per seed,
// never zero (a zero input can hide an unwritten or mis-indexed output), rows
// optionally scaled very differently (a row normalized with a neighbour's
// statistics then fails at once).
//
// Element i of a fill with seed s is a function of (s, i) alone: a counter
// hash (the splitmix64 sequence) rather than a sequential generator, so the
// data do not depend on the number of threads that generate them, and the
// device fill (random.cuh) draws from the same function.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>

#include "harness/host_matrix.hpp"

#if defined(__CUDACC__)
#define RMSNORM_HARNESS_HD __host__ __device__
#else
#define RMSNORM_HARNESS_HD
#endif

namespace rmsnorm::harness {

// splitmix64's output function.
RMSNORM_HARNESS_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Draw n (from 1) of the splitmix64 sequence started at mix64(seed).
RMSNORM_HARNESS_HD inline uint64_t draw(uint64_t seed, uint64_t n) {
  return mix64(mix64(seed) + n * 0x9E3779B97F4A7C15ull);
}

// Uniform in [0, 1), element i of the stream `seed`.
RMSNORM_HARNESS_HD inline double uniform_at(uint64_t seed, uint64_t i) {
  return static_cast<double>(draw(seed, i + 1) >> 11) * 0x1p-53;
}

// N(0, 1), element i of the stream `seed`: Box-Muller over draws 2i+1, 2i+2.
// u1 is in (0, 1], so log never sees 0.
RMSNORM_HARNESS_HD inline double normal_at(uint64_t seed, uint64_t i) {
  const double u1 = (static_cast<double>(draw(seed, 2 * i + 1) >> 11) + 1.0) * 0x1p-53;
  const double u2 = static_cast<double>(draw(seed, 2 * i + 2) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Per-row factor of a fill; empty means 1 for every row.
using RowScale = std::function<double(int64_t row)>;

// Neighbouring rows 2^-4 .. 2^4 apart in a cycle of 9 (row r: 2^((5r mod 9) - 4)).
double hetero_row_scale(int64_t row);

// m(r, c) = mean + scale(r) * N(0, 1), rounded to m's dtype; a value that
// rounds to zero becomes mean + 0.5 * scale(r). Element (r, c) is draw
// r * cols + c of `seed`, whatever the stride and offset. Multi-threaded.
void fill_normal(HostMatrix& m, uint64_t seed, const RowScale& scale = {}, double mean = 0.0);

// Uniform in [-2, 2), rounded to m's dtype, zeros replaced by 0.5: cheaper
// than fill_normal (no log, no cos), for matrices of up to a billion elements.
void fill_uniform(HostMatrix& m, uint64_t seed);

}  // namespace rmsnorm::harness
