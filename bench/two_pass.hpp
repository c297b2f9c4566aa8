// The two-pass backward, for the benchmark and the CLI only (never in the
// library): each row's gx is written as the fused backward writes it, and its
// gy * x_hat to a {rows, cols} temporary in the weight dtype; a second kernel
// sums the temporary's columns (fp32 accumulation) into gw. It is the design
// the fused backward replaces, measured beside it in the same run.
#pragma once

#include <cstddef>

#include "args.hpp"

namespace rmsnorm::bench {

// Bytes of the {rows, cols} temporary (the extra device memory of this variant).
size_t two_pass_temp_bytes(int64_t rows, int64_t cols, DType dtype);

// a.gw_mode must be kStore or kStoreF32; a.workspace is ignored; temp holds
// two_pass_temp_bytes() and every operand's rows start on 16 bytes. stream is
// a cudaStream_t.
rmsnorm_status_t backward_two_pass(const BackwardArgs& a, void* temp, void* stream);

}  // namespace rmsnorm::bench
