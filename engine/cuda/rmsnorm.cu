#include "engine/cuda/rmsnorm.cuh"

#include "common/error.h"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kThreads = 256;

// One block per row; the row is read once into registers-by-stride, summed, then scaled.
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ add,
                                                           const float* __restrict__ weight, float* __restrict__ out,
                                                           uint32_t dim, float eps) {
    __shared__ float warp_sums[kThreads / 32];
    float* xr = x + (size_t)blockIdx.x * dim;
    const float* ar = add != nullptr ? add + (size_t)blockIdx.x * dim : nullptr;
    float* outr = out + (size_t)blockIdx.x * dim;

    float sum = 0.0f;
    for (uint32_t i = threadIdx.x; i < dim; i += kThreads) {
        float v = xr[i];
        if (ar != nullptr) {
            v += ar[i];
            xr[i] = v;
        }
        sum = fmaf(v, v, sum);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    const float inv_rms = rsqrtf(total / (float)dim + eps);
    // Each thread re-reads only the elements it wrote itself, so no barrier is needed here.
    for (uint32_t i = threadIdx.x; i < dim; i += kThreads) outr[i] = xr[i] * inv_rms * weight[i];
}

}  // namespace

void rmsnorm_cuda(float* x, const float* residual_add, const float* weight, float* out,
                  uint32_t n_rows, uint32_t dim, float eps, cudaStream_t stream) {
    if (n_rows == 0) return;
    if (dim == 0) fail("rmsnorm_cuda: dim must be positive");
    if (out == x || out == residual_add) fail("rmsnorm_cuda: out must not alias x or residual_add");
    rmsnorm_kernel<<<n_rows, kThreads, 0, stream>>>(x, residual_add, weight, out, dim, eps);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
