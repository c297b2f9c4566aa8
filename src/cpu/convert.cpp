// F16C's VCVTPH2PS is exact for every binary16 pattern (a NaN comes back
// quiet); VCVTPS2PH with _MM_FROUND_TO_NEAREST_INT in its immediate rounds to
// nearest even whatever MXCSR's rounding mode, and quiets NaNs keeping the
// payload's top bits, as float_to_half does. Neither depends on DAZ / FTZ.
// Unlike the scalar functions (integer arithmetic) they raise the inexact and
// overflow flags (_MM_FROUND_NO_EXC does nothing in the VEX form), which only
// matters to a caller that unmasks those exceptions. The bf16 functions are integer AVX2: the shift, and
// float_to_bf16's carry rounding and NaN rule (AVX512-BF16's VCVTNEPS2BF16 is
// not used: it flushes subnormals). tests/half_test.cpp checks every pattern
// against the scalar functions. Only these leaf functions are compiled for
// the newer instructions (a function attribute, not a file flag), so no inline
// function or template instantiation shared with the rest of the library is
// emitted with VEX encodings that an older CPU would fault on.
#include "cpu/convert.hpp"

#include "common/half.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define RMSNORM_HAVE_X86_BULK 1
#endif

namespace rmsnorm::cpu {
namespace {

#ifdef RMSNORM_HAVE_X86_BULK
__attribute__((target("avx,f16c"))) void f16_to_float_f16c(const uint16_t* src, int64_t n, float* dst) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
  for (; j < n; ++j) dst[j] = half_to_float(src[j]);
}

__attribute__((target("avx,f16c"))) void float_to_f16_f16c(const float* src, int64_t n, uint16_t* dst) {
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + j), _mm256_cvtps_ph(_mm256_loadu_ps(src + j), kRne));
  for (; j < n; ++j) dst[j] = float_to_half(src[j]);
}

__attribute__((target("avx2"))) void bf16_to_float_avx2(const uint16_t* src, int64_t n, float* dst) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), _mm256_slli_epi32(w, 16));
  }
  for (; j < n; ++j) dst[j] = bf16_to_float(src[j]);
}

__attribute__((target("avx2"))) void float_to_bf16_avx2(const float* src, int64_t n, uint16_t* dst) {
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff),
                abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                quiet = _mm256_set1_epi32(0x40);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256i h[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j + 8 * k));
      const __m256i hi = _mm256_srli_epi32(x, 16);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(x, round), _mm256_and_si256(hi, one)), 16);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      h[k] = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    }
    // packus works within 128-bit lanes: [a0 b0 a1 b1] -> a0 a1 b0 b1.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), packed);
  }
  for (; j < n; ++j) dst[j] = float_to_bf16(src[j]);
}

// AVX is checked for F16C too: VEX encodings need the OS to save the YMM
// state, which __builtin_cpu_supports("avx") tests. F16C itself is read from
// CPUID (leaf 1, ECX bit 29): __builtin_cpu_supports("f16c") needs clang 18.
bool detect_f16c() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#else
bool detect_f16c() { return false; }
bool detect_avx2() { return false; }
#endif

const bool kHaveF16c = detect_f16c();
const bool kHaveAvx2 = detect_avx2();

#ifdef RMSNORM_HAVE_X86_BULK
#define RMSNORM_X86_ONLY(f) f
#else
#define RMSNORM_X86_ONLY(f) nullptr
#endif

// The SIMD function where the CPU has its instructions, else the scalar one element by element.
// (bulk's type is not deduced, so that it may be nullptr.)
template <typename S, typename D>
struct BulkFn {
  using type = void (*)(const S*, int64_t, D*);
};
template <typename S, typename D>
void convert(bool simd, typename BulkFn<S, D>::type bulk, D (*one)(S), const S* src, int64_t n, D* dst) {
  if (simd && bulk != nullptr) {
    bulk(src, n, dst);
    return;
  }
  for (int64_t j = 0; j < n; ++j) dst[j] = one(src[j]);
}

}  // namespace

bool f16_bulk_uses_f16c() { return kHaveF16c; }
bool bf16_bulk_uses_avx2() { return kHaveAvx2; }

void f16_to_float_n(const uint16_t* src, int64_t n, float* dst) {
  convert(kHaveF16c, RMSNORM_X86_ONLY(f16_to_float_f16c), half_to_float, src, n, dst);
}
void float_to_f16_n(const float* src, int64_t n, uint16_t* dst) {
  convert(kHaveF16c, RMSNORM_X86_ONLY(float_to_f16_f16c), float_to_half, src, n, dst);
}
void bf16_to_float_n(const uint16_t* src, int64_t n, float* dst) {
  convert(kHaveAvx2, RMSNORM_X86_ONLY(bf16_to_float_avx2), bf16_to_float, src, n, dst);
}
void float_to_bf16_n(const float* src, int64_t n, uint16_t* dst) {
  convert(kHaveAvx2, RMSNORM_X86_ONLY(float_to_bf16_avx2), float_to_bf16, src, n, dst);
}

}  // namespace rmsnorm::cpu
