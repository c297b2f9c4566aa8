"""The peer benchmarks' L2 flush: no line of an earlier call is left in L2, whatever priority it was cached with.

Zeroing a buffer several times the L2's size evicts the lines cached at normal priority, but not those a kernel
loaded or stored with the L2 evict_last policy: the hardware evicts them only after every line of a higher
priority, and zeroing writes at normal priority. Inductor's generated RMSNorm puts `eviction_policy='evict_last'`
on x's first read and on w (Triton: `createpolicy.fractional.L2::evict_last` with the loads' `.L2::cache_hint`), so
under a zeroing flush a timed call of it found its inputs in L2, left there by the previous call on the same
tensors, where every other implementation read them from DRAM. On an H100 (2026-12-06, CUPTI kernel time, median
of 30) torch.compile's forward at 128 x 4096 bf16 took 2.14-2.15 us under the zeroing flush and 2.94-3.02 us with
every call on its own tensors; ours (2.66-2.69) and Liger's (2.56-2.59) did not move.

So the flush
1. writes a buffer of its size with evict_last (distinct nonzero words): its lines outrank and replace every line
   cached before, whatever its priority;
2. sets each of the buffer's lines back to normal priority (`applypriority.global.L2::evict_normal`);
3. zeroes a second buffer of the same size, as the zeroing flush did.
Steps 1 and 2 alone left the L2 in a state that cost every implementation more (128 x 4096: 4.3-4.4 us for all
three; 8192 x 4096: +5 us); with step 3 the times are those of calls on their own tensors (128 x 4096: ours 2.62,
torch.compile 2.91, Liger 2.56; 8192 x 4096: 46.25, 47.10, 47.15 us against 46.21, 47.42, 46.88), so the state a
timed call starts from is the zeroing flush's, without the cached inputs. The first two steps are Triton kernels
(Triton ships with torch's CUDA wheels); without Triton the flush is the zeroing one and says so (`method`).
"""

from __future__ import annotations

LINE_BYTES = 128
_FILL_BLOCK = 4096  # int32 elements per program
_LINES_PER_PROGRAM = 1024


def make_flush(torch, nbytes):
    """(flush, method): flush() runs the three steps above on buffers of nbytes each, rounded up to a whole number of
    demote programs (128 KiB, 8 fill programs). method: "evict_last fill + demote + zero", or "zero (no Triton:
    ...)" for the zeroing flush alone."""
    per = _LINES_PER_PROGRAM * LINE_BYTES
    nbytes = -(-nbytes // per) * per
    buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty(nbytes // per, dtype=torch.int32, device="cuda")
    zeros = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    try:
        fill, demote = _kernels()

        def flush():
            fill[(buf.numel() // _FILL_BLOCK,)](buf, BLOCK=_FILL_BLOCK)
            demote[(sink.numel(),)](buf, sink, BLOCK=_LINES_PER_PROGRAM)
            zeros.zero_()

        flush()  # Triton compiles the kernels at their first launch: here, outside any timed region
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (no Triton, or one that cannot build or launch them: the zeroing flush)
        return buf.zero_, f"zero (no Triton: {type(e).__name__}: {e})"
    return flush, "evict_last fill + demote + zero"


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def fill_evict_last(p, BLOCK: tl.constexpr):
        off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        # Distinct nonzero words, though a fill of zeros measured the same: nothing here for an L2 to compress.
        tl.store(p + off, (off * 0x9E3779B1 + 1).to(tl.int32), eviction_policy="evict_last")

    @triton.jit
    def demote(p, sink, BLOCK: tl.constexpr):
        line = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        # One applypriority per 128-byte line (32 int32); the asm's result only keeps the call from being dropped.
        r = tl.inline_asm_elementwise("applypriority.global.L2::evict_normal [$1], 128;\n\tmov.u32 $0, 0;", "=r,l",
                                      [p + line * 32], dtype=tl.int32, is_pure=False, pack=1)
        tl.store(sink + tl.program_id(0), tl.sum(r, 0))

    return fill_evict_last, demote
