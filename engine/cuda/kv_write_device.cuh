#pragma once
// Device side of kv_write.cuh: one warp stores one 32-value block of a K or V row (lane =
// value) in the cache tier's format. Shared by kv_write_kernel and the fused qkv_post kernel,
// so both write the very bytes the CPU codec (gguf/quants.h rounding) writes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "model/model_spec.h"

namespace spillway {

__device__ __forceinline__ float kv_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Bytes of one cell's row of n_values values (n_values % 32 == 0).
template <KvType T>
__host__ __device__ constexpr uint64_t kv_row_bytes_device(uint32_t n_values) {
    return T == KvType::f16 ? 2ull * n_values : (uint64_t)n_values / 32 * (T == KvType::q8_0 ? 34 : 18);
}

// All 32 lanes call this with value v of block `block` of the row stored at `row`
// (row = cache + cell * row_bytes; f16 rows are 2 bytes per value).
template <KvType T>
__device__ __forceinline__ void kv_store_block(float v, uint8_t* row, uint32_t block, uint32_t lane) {
    if constexpr (T == KvType::f16) {
        reinterpret_cast<__half*>(row)[block * 32 + lane] = __float2half_rn(v);
    } else if constexpr (T == KvType::q8_0) {
        uint8_t* blk = row + block * 34;
        const float amax = kv_warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        blk[2 + lane] = (uint8_t)(int8_t)roundf(v * id);
        if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
    } else {
        uint8_t* blk = row + block * 18;
        // The signed value of largest magnitude (first one on ties, as the CPU loop does).
        const float a = fabsf(v);
        const float amax = kv_warp_max(a);
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

}  // namespace spillway
