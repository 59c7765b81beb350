#pragma once
// Device side of act_quant.cuh: quantizing one 32-value block held by 8 consecutive lanes
// (4 values each, in order), so any kernel that produces an activation as float4 per thread
// can write it quantized without another pass over memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"

namespace spillway {

// Lanes 8k..8k+7 of the warp call this together (all 8 or none: the shuffle mask names
// exactly that group) with values 4*(lane%8) .. +3 of one block. q4 points at those 4 int16
// slots, d at the block's scale. Rounding as the CPU reference in the tests: d = amax / 32767
// (IEEE division), q = round-half-even(x / d), 0 for an all-zero block.
// The scale of the block held by lanes 8k..8k+7 (4 values each, all 8 lanes call it): amax / 32767.
__device__ __forceinline__ float act_q16_group_scale(float4 v, uint32_t lane) {
    const unsigned mask = 0xffu << (lane & 24u);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = fmaxf(amax, __shfl_xor_sync(mask, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(mask, amax, 2));
    amax = fmaxf(amax, __shfl_xor_sync(mask, amax, 4));
    return amax / kActQ16Max;
}

__device__ __forceinline__ void quantize_act_q16_group(float4 v, uint32_t lane, int16_t* q4, float* d) {
    const float scale = act_q16_group_scale(v, lane);
    auto q = [scale](float x) -> uint32_t {
        if (!(scale > 0.0f)) return 0u;
        return (uint32_t)min(32767, max(-32767, __float2int_rn(__fdiv_rn(x, scale)))) & 0xffffu;
    };
    *reinterpret_cast<uint2*>(q4) = make_uint2(q(v.x) | (q(v.y) << 16), q(v.z) | (q(v.w) << 16));
    if ((lane & 7u) == 0) *d = scale;
}

// quantize_act_q16_group with q = round(x * (1 / d)) instead of round(x / d): for the lab
// decode layer kernel, where every block quantizes the whole x redundantly (27 divisions per
// thread for a 13824-value x) between two phases. The product may round one code differently
// from the division where x / d sits within an ulp of a half-integer.
__device__ __forceinline__ void quantize_act_q16_group_rcp(float4 v, uint32_t lane, int16_t* q4, float* d) {
    const float scale = act_q16_group_scale(v, lane);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    auto q = [inv](float x) -> uint32_t { return (uint32_t)min(32767, max(-32767, __float2int_rn(x * inv))) & 0xffffu; };
    *reinterpret_cast<uint2*>(q4) = make_uint2(q(v.x) | (q(v.y) << 16), q(v.z) | (q(v.w) << 16));
    if ((lane & 7u) == 0) *d = scale;
}

// The whole warp quantizes one 32-value block, one value per lane (lane i holds value i):
// the same operations as quantize_act_q16_group, so the same q and d.
__device__ __forceinline__ void quantize_act_q16_warp(float v, uint32_t lane, int16_t* q32, float* d) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax / kActQ16Max;
    q32[lane] = scale > 0.0f ? (int16_t)min(32767, max(-32767, __float2int_rn(__fdiv_rn(v, scale)))) : (int16_t)0;
    if (lane == 0) *d = scale;
}

}  // namespace spillway
