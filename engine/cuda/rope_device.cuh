#pragma once
// Device side of rope.cuh: cos and sin of rotated pair i at position pos, as rope_angles
// computes them (double angle: at 64k+ positions a float angle is off by ~1e-2 rad), scaled by
// mscale. Shared by the RoPE kernel and the fused qkv_post kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/rope.cuh"

namespace spillway {

__device__ __forceinline__ void rope_cos_sin(const RopeDeviceTables& t, int32_t pos, uint32_t i, float* cv,
                                             float* sv) {
    const double extrap = (double)pos * t.inv_freq[i];
    const double interp = extrap * (double)t.freq_scale;
    const double mix = t.ramp_mix != nullptr ? (double)t.ramp_mix[i] : 0.0;
    const double theta = interp * (1.0 - mix) + extrap * mix;
    double s, c;
    sincos(theta, &s, &c);
    *cv = (float)c * t.mscale;
    *sv = (float)s * t.mscale;
}

// Value e of a q or k head after its bias and RoPE: head = the raw GEMV output of the head,
// bias = the head's bias slice (or nullptr), cs = the token's (cos, sin) per rotated pair.
// Rotated pairs (a, b): neox (i, i + n_dims / 2), else (2i, 2i + 1); dims past n_dims pass.
// The rounding is pinned (__fmul_rn, __fmaf_rn): the fused qkv_post kernel and the attention
// kernel that does the same work (attention.cuh, AttentionPostQkv) must agree bit for bit.
__device__ __forceinline__ float rope_pair_value(float x0, float x1, float cv, float sv, bool first) {
    return first ? __fmaf_rn(x0, cv, -__fmul_rn(x1, sv)) : __fmaf_rn(x0, sv, __fmul_rn(x1, cv));
}
__device__ __forceinline__ float post_qkv_value(const float* head, const float* bias, uint32_t e, const float2* cs,
                                                uint32_t n_dims, bool neox) {
    const float x = bias != nullptr ? head[e] + bias[e] : head[e];
    if (e >= n_dims) return x;
    const uint32_t half = n_dims / 2;
    const uint32_t i = neox ? e % half : e / 2;
    const uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = bias != nullptr ? head[a] + bias[a] : head[a];
    const float x1 = bias != nullptr ? head[b] + bias[b] : head[b];
    const float2 c = cs[i];
    return rope_pair_value(x0, x1, c.x, c.y, e == a);
}

}  // namespace spillway
