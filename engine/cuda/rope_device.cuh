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

}  // namespace spillway
