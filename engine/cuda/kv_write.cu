#include "engine/cuda/kv_write.cuh"

#include <cuda_fp16.h>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// One warp per 32-value block (lane = value), blockIdx.y = token. f16 uses the same grid.
template <KvType T>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(const float* __restrict__ src, uint8_t* __restrict__ cache,
                                                            uint32_t first_cell, uint32_t n_values) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t block = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (block >= n_values / 32) return;
    const uint32_t token = blockIdx.y;
    const float v = src[(size_t)token * n_values + block * 32 + lane];
    const uint64_t cell = first_cell + token;
    if constexpr (T == KvType::f16) {
        reinterpret_cast<__half*>(cache)[cell * n_values + block * 32 + lane] = __float2half_rn(v);
    } else if constexpr (T == KvType::q8_0) {
        uint8_t* blk = cache + cell * (n_values / 32 * 34) + block * 34;
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk[2 + lane] = (uint8_t)(int8_t)roundf(v * id);
        if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
    } else {
        uint8_t* blk = cache + cell * (n_values / 32 * 18) + block * 18;
        // The signed value of largest magnitude (first one on ties, as the CPU loop does).
        const float a = fabsf(v);
        const float amax = warp_max(a);
        const unsigned first = __ffs(__ballot_sync(0xffffffffu, a == amax)) - 1;
        const float signed_max = __shfl_sync(0xffffffffu, v, first);
        const float d = signed_max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        // __fmul_rn keeps nvcc from fusing into an FMA, which would round differently from the CPU.
        const int q = min(15, (int)(int8_t)(__fmul_rn(v, id) + 8.5f));
        const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
        if (lane < 16) blk[2 + lane] = (uint8_t)(q | (q_hi << 4));
        if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
    }
}

}  // namespace

void kv_write_cuda(KvType type, const float* src, uint8_t* cache, uint32_t first_cell,
                   uint32_t n_tokens, uint32_t n_values, cudaStream_t stream) {
    if (n_tokens == 0) return;
    if (n_values == 0 || n_values % 32 != 0) fail("kv_write_cuda: n_values must be a positive multiple of 32");
    const dim3 grid((n_values / 32 + kThreads / 32 - 1) / (kThreads / 32), n_tokens);
    switch (type) {
        case KvType::f16: kv_write_kernel<KvType::f16><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
        case KvType::q8_0: kv_write_kernel<KvType::q8_0><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
        case KvType::q4_0: kv_write_kernel<KvType::q4_0><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
