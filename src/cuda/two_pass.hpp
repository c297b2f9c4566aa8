// Two-pass backward, kept for the benchmark and the CLI only (never in the
// library): each row's gy * x_hat is written to a {rows, cols} temporary in
// the weight dtype, then a second kernel sums the columns (fp32 accumulation).
// It exists so that the fused backward can be measured against the design it
// replaces, in the same run.
#pragma once

#include <cstddef>

#include "args.hpp"

namespace rmsnorm::cuda {

// Bytes of the {rows, cols} temporary (the extra device memory of this variant).
size_t two_pass_temp_bytes(int64_t rows, int64_t cols, DType dtype);

// a.gw_mode must be kStore or kStoreF32; a.workspace is ignored; temp holds
// two_pass_temp_bytes(). stream is a cudaStream_t.
rmsnorm_status_t backward_two_pass(const BackwardArgs& a, void* temp, void* stream);

}  // namespace rmsnorm::cuda
