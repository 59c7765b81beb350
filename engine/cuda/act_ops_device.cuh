#pragma once
// Device pieces of the activation ops that more than one kernel computes: the separate
// RMSNorm and SwiGLU kernels, the decode layer kernel and the sweep GEMV's fused prologue
// (matvec_q8s.cu). One definition, so the fused and the separate paths give the same bits.
#include <cuda_runtime.h>

namespace spillway {

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Sum of `sum` over the block's n_warps warps, returned to every thread: xor shuffles inside
// each warp, then the warps' sums added in warp order (every thread the same order, so every
// block with the same inputs gets the same total). warp_sums: n_warps floats of shared memory.
__device__ __forceinline__ float block_sum(float sum, float* warp_sums, int n_warps) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < n_warps; ++w) total += warp_sums[w];
    return total;
}

}  // namespace spillway
