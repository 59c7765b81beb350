#pragma once
// Lab (attention_lab_l2_prefetch, attention_mma::Params::l2_prefetch): a decode attention
// kernel asks the next kernel's weights into L2 while its own loop leaves HBM partly idle.
#include <cstdint>

#include "engine/cuda/attention_mma.cuh"

namespace spillway {

// This warp's share of Params' two ranges, evict_last (or normal priority: l2_prefetch_normal): warp w of the grid (warps_per_block
// per block) takes 32 consecutive 128-byte lines per instruction, every warps * 32 lines.
__device__ __forceinline__ void l2_prefetch_share(const attention_mma::Params& p, uint32_t warps_per_block) {
    const uint64_t warps = (uint64_t)gridDim.x * gridDim.y * warps_per_block;
    const uint64_t w = ((uint64_t)blockIdx.y * gridDim.x + blockIdx.x) * warps_per_block + threadIdx.x / 32;
#pragma unroll
    for (int r = 0; r < 2; ++r)
        for (uint64_t line = w * 32 + threadIdx.x % 32; line < p.l2_prefetch_lines[r]; line += warps * 32) {
            if (p.l2_prefetch_normal) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p.l2_prefetch[r] + line * 128));
            else asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p.l2_prefetch[r] + line * 128));
        }
}

// Whether step `step` (of n_steps, dealt to a split's units stride apart: unit u takes steps u,
// u + stride, ...) is the one where its unit prefetches: each unit's first step at or past
// permille / 1000 of n_steps, and at most at its last step (so every unit with a step fires once).
// Recomputed from the parameters at each step: a value kept across the mma kernel's loop made
// ptxas spill.
__device__ __forceinline__ bool l2_prefetch_now(uint32_t step, uint32_t n_steps, uint32_t permille, uint32_t stride) {
    const uint32_t at = min((uint32_t)((uint64_t)n_steps * permille / 1000), n_steps > stride ? n_steps - stride : 0u);
    return step - at < stride;
}

}  // namespace spillway
