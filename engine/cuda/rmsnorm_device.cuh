#pragma once
// Device side of rmsnorm.cuh's row kernel: one row of RMSNorm (with the residual add before
// it, optional f32 / f16 / int16-block outputs) by one block, so that a kernel other than
// rmsnorm_cuda's (the decode GEMV's last block, matvec_q8s.cu) gives the same bits.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"

namespace spillway {

// dim % 4 == 0, dim <= 4 * kBlockThreads * kPerThread (dim % 32 == 0 with q); every thread of
// the block calls it. If add: x += add (x updated in place). Then o = x / sqrt(mean(x^2) + eps)
// * weight into out / out16 / (q, qd) where given. The row is held in registers as float4, so
// it is read once and all of a thread's loads are in flight together. Loads go through L2
// (.cg): the caller may read values that other SMs wrote during its own launch.
template <int kBlockThreads, int kPerThread>
__device__ __forceinline__ void rmsnorm_row(float* __restrict__ x, const float* __restrict__ add,
                                            const float* __restrict__ weight, float* __restrict__ out,
                                            __half* __restrict__ out16, uint32_t dim, float eps,
                                            int16_t* __restrict__ q, float* __restrict__ qd, float* warp_sums) {
    const uint32_t n4 = dim / 4;
    float4* xr = reinterpret_cast<float4*>(x);
    const float4* ar = reinterpret_cast<const float4*>(add);
    const float4* wr = reinterpret_cast<const float4*>(weight);
    // The weights are loaded with x, before the block reduction: loaded after it, each step's
    // load would wait a full L2 trip behind the previous step's quantizing shuffles.
    float4 v[kPerThread], g[kPerThread];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
        const uint32_t i = threadIdx.x + k * kBlockThreads;
        if (i < n4) {
            v[k] = __ldcg(xr + i);
            g[k] = wr[i];
            if (ar != nullptr) {
                const float4 a = __ldcg(ar + i);
                v[k].x += a.x;
                v[k].y += a.y;
                v[k].z += a.z;
                v[k].w += a.w;
                xr[i] = v[k];
            }
            sum = fmaf(v[k].x, v[k].x, sum);
            sum = fmaf(v[k].y, v[k].y, sum);
            sum = fmaf(v[k].z, v[k].z, sum);
            sum = fmaf(v[k].w, v[k].w, sum);
        }
    }
    const float inv_rms = rsqrtf(block_sum(sum, warp_sums, kBlockThreads / 32) / (float)dim + eps);
    float4* outr = reinterpret_cast<float4*>(out);
    uint2* out16r = reinterpret_cast<uint2*>(out16);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
        const uint32_t i = threadIdx.x + k * kBlockThreads;
        if (i < n4) {  // q: dim % 32 == 0, so 8-lane groups are all in or all out
            // Same operation order as the scalar kernel and rmsnorm_cpu: (x * inv_rms) * w.
            const float4 o = make_float4(v[k].x * inv_rms * g[k].x, v[k].y * inv_rms * g[k].y,
                                         v[k].z * inv_rms * g[k].z, v[k].w * inv_rms * g[k].w);
            if (outr != nullptr) outr[i] = o;
            if (out16r != nullptr) {
                const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
                out16r[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
            }
            if (q != nullptr) quantize_act_q16_group(o, threadIdx.x % 32, q + 4 * i, qd + i / 8);
        }
    }
}

}  // namespace spillway
