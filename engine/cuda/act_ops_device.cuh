#pragma once
// Device pieces of the activation ops that more than one kernel computes: the separate
// RMSNorm and SwiGLU kernels, the decode layer kernel and the sweep GEMV's fused prologue
// (matvec_q8s.cu). One definition, so the fused and the separate paths give the same bits.
#include <cuda_runtime.h>

namespace spillway {

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The same for an f16 result (the prefill's SwiGLU into the down GEMM's input, in its own launch
// or in the gate|up GEMM's epilogue, which must agree bit for bit): the SFU's exp2 and
// reciprocal, a few f32 ulps from silu_times, far below an f16 ulp, at ~6 instructions instead
// of ~25 (the precise expf and IEEE division were 11% of the SwiGLU GEMM's consumer time,
// session 45). -g is capped at 80 (silu is then 0 to f32 precision, and __fdividef needs a
// denominator under 2^126); a NaN gate stays NaN.
__device__ __forceinline__ float silu_times_f16_out(float g, float u) {
    const float t = -g > 80.0f ? 80.0f : -g;
    return __fdividef(g, 1.0f + __expf(t)) * u;
}

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
