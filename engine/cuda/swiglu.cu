#include "engine/cuda/swiglu.cuh"

#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

}  // namespace

void swiglu_cuda(const float* gate, const float* up, float* out, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const size_t blocks = (n + 255) / 256;
    swiglu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(gate, up, out, n);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
