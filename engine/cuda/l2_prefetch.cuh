#pragma once
// Weights of the next decode GEMV asked into L2 by the GEMV before it, as each of its blocks
// finishes (lab, session 30: SPILLWAY_HOP_PREFETCH_KB). Why: between two GEMVs a small kernel
// (RMSNorm, SwiGLU, bias + RoPE + KV write) runs while HBM idles (~2-3 us per hop, bench rows
// "q8s layer hops"), and the next GEMV's blocks only arrive after it. Measured dead ends
// (perf-notes, session 30): the next GEMV's own blocks prefetching before their wait (too
// late, slower), and the small kernel prefetching from its one block (one SM's bulk prefetches
// drain at ~170 GB/s: 2.5x slower decode); the previous GEMV's blocks are on every SM.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

// Per block b of the next sweep GEMV (rows [b rpb, (b + 1) rpb) of codes and scales, codes
// cols bytes per row, scales cols / 16): rows skip_rows .. skip_rows + prefetch_rows of the
// block's range. Empty (codes == nullptr) = nothing to do.
struct L2Prefetch {
    const uint8_t* codes = nullptr;
    const uint8_t* scales = nullptr;
    uint32_t rows = 0, cols = 0, rows_per_block = 0, skip_rows = 0, prefetch_rows = 0;
};

#if defined(__CUDACC__)
// The prefetches for the next GEMV's blocks b, b + stride, ... (fire and forget), from one
// thread.
__device__ __forceinline__ void issue_l2_prefetch_blocks(const L2Prefetch& p, uint32_t b, uint32_t stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.codes == nullptr || p.rows_per_block == 0) return;
    constexpr uint32_t kPiece = 32 * 1024;
    const uint32_t n_blocks = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
    for (; b < n_blocks; b += stride) {
        const uint32_t block_end = min(p.rows, (b + 1) * p.rows_per_block);
        const uint32_t r0 = b * p.rows_per_block + p.skip_rows;
        const uint32_t r1 = min(block_end, r0 + p.prefetch_rows);
        if (r0 >= r1) continue;
        const uint8_t* srcs[2] = {p.codes + (size_t)r0 * p.cols, p.scales + (size_t)r0 * (p.cols / 16)};
        const uint32_t sizes[2] = {(r1 - r0) * p.cols, (r1 - r0) * (p.cols / 16)};
        for (int k = 0; k < 2; ++k)
            for (uint32_t off = 0; off < sizes[k]; off += kPiece)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(srcs[k] + off),
                             "r"(min(kPiece, sizes[k] - off))
                             : "memory");
    }
#else
    (void)p;
    (void)b;
    (void)stride;
#endif
}
#endif

}  // namespace spillway
