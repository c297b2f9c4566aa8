// Ordering between kernels (programmatic dependent launch) and within a
// thread (the cp.async pipeline that stages row groups ahead).
#pragma once

#include <cuda_runtime.h>

#include "plan.hpp"

namespace rmsnorm::cuda {

// Programmatic dependent launch (rmsnorm.h, RMSNORM_FLAG_NO_PDL); the first
// statement of every kernel, before any operand or workspace is touched.
// Waits until the previous kernel in the stream has completed and its writes
// are visible (returns at once when this grid was launched plainly), then
// lets the next kernel be scheduled: a next kernel launched as a programmatic
// dependent waits in turn, so this grid's writes are complete before it reads.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// ---- cp.async pipeline (16-byte I/O) ---------------------------------------------------------
// Each thread copies its own chunks into its own shared-memory slots and
// later reads exactly those slots back, so completion (wait_group) is the
// only synchronization a stage needs. cp.async.cg caches in L2 only; a
// partial last chunk copies the row's remaining bytes and zero-fills the rest
// (elements past cols read as 0, as with load_chunk).
__device__ __forceinline__ void cp_async_chunk(uint4* smem, const void* gmem, int src_bytes) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
#else
  // Before sm_80 (no cp.async): a synchronous copy with the same zero fill.
  uint4 v = make_uint4(0, 0, 0, 0);
  if (src_bytes == 16) {
    v = *static_cast<const uint4*>(gmem);
  } else {
    unsigned char* b = reinterpret_cast<unsigned char*>(&v);
    for (int i = 0; i < src_bytes; ++i) b[i] = static_cast<const unsigned char*>(gmem)[i];
  }
  *smem = v;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` of this thread's groups are in flight (0..2).
static_assert(plan::kMaxStages <= 3, "cp_async_wait covers at most stages - 1 = 2 pending groups");
__device__ __forceinline__ void cp_async_wait(int pending) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if (pending <= 0)
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;" ::: "memory");
  else
    asm volatile("cp.async.wait_group 2;" ::: "memory");
#else
  (void)pending;
#endif
}

}  // namespace rmsnorm::cuda
