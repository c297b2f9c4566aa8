// CPU backend: the same maths as the CUDA kernels, fp32 accumulation,
// multi-threaded over rows, deterministic (gw partials over a fixed row
// partition that does not depend on the number of threads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "args.hpp"

namespace rmsnorm::cpu {

// Rows per gw partial: the fixed partition of rows that makes gw independent
// of the thread count. Partials = min(ceil(rows / kGwRowsPerPartial), kMaxGwPartials)
// contiguous row ranges, summed in partial order.
inline constexpr int64_t kGwRowsPerPartial = 256;
inline constexpr int64_t kMaxGwPartials = 256;

int64_t gw_partials(int64_t rows);

// Bytes of fp32 workspace backward needs (0 for GwMode::kNone).
size_t backward_workspace_bytes(int64_t rows, int64_t cols, GwMode mode);

// Both return RMSNORM_STATUS_SUCCESS; args are already validated.
rmsnorm_status_t forward(const ForwardArgs& a, int num_threads);
rmsnorm_status_t backward(const BackwardArgs& a, int num_threads);
// y of a (a.y unused) quantized into qa.q.
rmsnorm_status_t forward_quant(const ForwardArgs& a, const QuantArgs& qa, int num_threads);

}  // namespace rmsnorm::cpu
