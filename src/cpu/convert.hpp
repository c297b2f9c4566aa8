// Bulk conversions between float and the 16-bit formats for the CPU backend,
// bit for bit those of common/half.hpp (round to nearest even, NaN kept quiet
// with its payload's top bits, infinities, signed zeros and subnormals exact).
// On x86 CPUs they use F16C (f16) or AVX2 (bf16) instructions, chosen at run
// time, so the library still runs on any x86-64; elsewhere, and on CPUs
// without them, the scalar functions.
#pragma once

#include <cstdint>

namespace rmsnorm::cpu {

void f16_to_float_n(const uint16_t* src, int64_t n, float* dst);
void float_to_f16_n(const float* src, int64_t n, uint16_t* dst);
void bf16_to_float_n(const uint16_t* src, int64_t n, float* dst);
void float_to_bf16_n(const float* src, int64_t n, uint16_t* dst);

// Which instructions the functions above use on this CPU (for the tests).
bool f16_bulk_uses_f16c();
bool bf16_bulk_uses_avx2();

}  // namespace rmsnorm::cpu
