#pragma once
// Weights of the next decode GEMV asked into L2 by the small kernel before it (lab, session
// 30: SPILLWAY_HOP_PREFETCH_KB). Why: between two GEMVs the small kernel (RMSNorm, SwiGLU,
// bias + RoPE + KV write) runs while HBM idles (~2-3 us per hop, bench rows "q8s layer
// hops"), and the next GEMV's blocks only arrive after it; a prefetch issued by the GEMV's own
// blocks (before their wait) came too late and was slower (perf-notes, session 30). The small
// kernel is resident before the hop starts, so it can fill the hop with the next GEMV's bytes.
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
// Issues the prefetches (fire and forget: no completion is waited for) with `n_threads`
// threads of one block; thread `t` takes blocks t, t + n_threads, ...
__device__ __forceinline__ void issue_l2_prefetch(const L2Prefetch& p, uint32_t t, uint32_t n_threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (p.codes == nullptr || p.rows_per_block == 0) return;
    constexpr uint32_t kPiece = 32 * 1024;
    const uint32_t n_blocks = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
    for (uint32_t b = t; b < n_blocks; b += n_threads) {
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
    (void)t;
    (void)n_threads;
#endif
}
#endif

}  // namespace spillway
