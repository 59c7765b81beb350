#include "engine/cuda/rope.cuh"

#include "common/error.h"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kThreads = 128;

// One block per token: each thread computes cos/sin of a pair once (double precision: at
// 64k+ positions a float angle would be off by ~1e-2 rad) and rotates that pair in every head.
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeDeviceTables t, float* x, uint32_t n_heads,
                                                        uint32_t head_dim, const int32_t* positions) {
    const uint32_t half = t.n_dims / 2;
    const double pos = (double)positions[blockIdx.x];
    float* row = x + (size_t)blockIdx.x * n_heads * head_dim;
    for (uint32_t i = threadIdx.x; i < half; i += kThreads) {
        const double extrap = pos * t.inv_freq[i];
        const double interp = extrap * (double)t.freq_scale;
        const double mix = t.ramp_mix != nullptr ? (double)t.ramp_mix[i] : 0.0;
        const double theta = interp * (1.0 - mix) + extrap * mix;
        double s, c;
        sincos(theta, &s, &c);
        const float cv = (float)c * t.mscale, sv = (float)s * t.mscale;
        const uint32_t a = t.neox ? i : 2 * i;
        const uint32_t b = t.neox ? i + half : 2 * i + 1;
        for (uint32_t h = 0; h < n_heads; ++h) {
            float* head = row + (size_t)h * head_dim;
            const float x0 = head[a], x1 = head[b];
            head[a] = x0 * cv - x1 * sv;
            head[b] = x0 * sv + x1 * cv;
        }
    }
}

}  // namespace

void rope_cuda(const RopeDeviceTables& tables, float* x, uint32_t n_tokens, uint32_t n_heads,
               uint32_t head_dim, const int32_t* positions, cudaStream_t stream) {
    if (n_tokens == 0 || n_heads == 0) return;
    if (tables.n_dims == 0 || tables.n_dims % 2 != 0 || tables.n_dims > head_dim || tables.inv_freq == nullptr)
        fail("rope_cuda: n_dims must be even, positive and <= head_dim, with an inv_freq table");
    rope_kernel<<<n_tokens, kThreads, 0, stream>>>(tables, x, n_heads, head_dim, positions);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
