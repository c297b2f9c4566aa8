// Order statistics of timing samples, for the CLI and the benchmark.
#pragma once

#include <vector>

namespace rmsnorm::harness {

// Linear interpolation between the order statistics of `sorted` (ascending);
// NaN when empty. quantile(s, 0.5) is the median.
double quantile(const std::vector<double>& sorted, double q);

// The median of unsorted samples; NaN when empty.
double median(std::vector<double> samples);

}  // namespace rmsnorm::harness
