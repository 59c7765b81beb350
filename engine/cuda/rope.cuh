#pragma once
// Rotary position embedding, in place, for n_tokens rows of n_heads heads of head_dim values.
// The frequency tables are built by the host (engine/cpu/rope.h's RopeTables: inv_freq,
// YaRN ramp_mix, freq_scale, mscale), so linear/YaRN scaling stays the host's concern and the
// angle is computed exactly as rope_angles does: in double, theta = pos*inv*(fs*(1-mix)+mix)
// spelled as interp*(1-mix) + extrap*mix.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

struct RopeDeviceTables {
    bool neox = false;               // false: adjacent pairs (2i, 2i+1); true: (i, i + n_dims/2)
    uint32_t n_dims = 0;             // rotated dims per head (even, <= head_dim); the rest pass through
    const double* inv_freq = nullptr; // device, n_dims/2 (double, as RopeTables: pos*freq at 1M positions)
    const float* ramp_mix = nullptr; // device, n_dims/2, or null for all zeros (no YaRN)
    float freq_scale = 1.0f;
    float mscale = 1.0f;
};

// x: [n_tokens][n_heads][head_dim] f32, device; positions: [n_tokens] device int32.
void rope_cuda(const RopeDeviceTables& tables, float* x, uint32_t n_tokens, uint32_t n_heads,
               uint32_t head_dim, const int32_t* positions, cudaStream_t stream);

// table[t * n_dims/2 + i] = (cos, sin) of pair i at positions[t], times mscale: the values the
// kernels compute per head (rope_device.cuh), once per token for every head and layer of a
// forward. (The double-precision sincos per head and layer was a quarter of the fused
// post-QKV kernel's time on a 2048-token chunk.) table: n_tokens * n_dims / 2 float2, device.
void rope_table_cuda(const RopeDeviceTables& tables, const int32_t* positions, uint32_t n_tokens, float2* table,
                     cudaStream_t stream);

}  // namespace spillway
