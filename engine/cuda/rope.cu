#include "engine/cuda/rope.cuh"

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

constexpr int kThreads = 256;

// One thread per (head, rotated pair), blockIdx.y = token. cos/sin in double (at 64k+
// positions a float angle would be off by ~1e-2 rad), recomputed per head: the first version
// had one block per token loop over the heads, a chain of 48 dependent load/store round
// trips per thread (~9.5 us for one token of the 14B shape); the extra sincos are cheap.
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeDeviceTables t, float* x, uint32_t n_heads,
                                                        uint32_t head_dim, const int32_t* positions) {
    const uint32_t half = t.n_dims / 2;
    const uint32_t item = blockIdx.x * kThreads + threadIdx.x;
    if (item >= n_heads * half) return;
    const uint32_t h = item / half, i = item % half;
    float cv, sv;
    rope_cos_sin(t, positions[blockIdx.y], i, &cv, &sv);
    const uint32_t a = t.neox ? i : 2 * i;
    const uint32_t b = t.neox ? i + half : 2 * i + 1;
    float* head = x + ((size_t)blockIdx.y * n_heads + h) * head_dim;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * cv - x1 * sv;
    head[b] = x0 * sv + x1 * cv;
}

__global__ void __launch_bounds__(kThreads) rope_table_kernel(RopeDeviceTables t, const int32_t* positions,
                                                              uint32_t n_tokens, float2* table) {
    const uint32_t half = t.n_dims / 2;
    const uint64_t item = (uint64_t)blockIdx.x * kThreads + threadIdx.x;
    if (item >= (uint64_t)n_tokens * half) return;
    const uint32_t token = (uint32_t)(item / half), i = (uint32_t)(item % half);
    float cv, sv;
    rope_cos_sin(t, positions[token], i, &cv, &sv);
    table[item] = make_float2(cv, sv);
}

}  // namespace

void rope_table_cuda(const RopeDeviceTables& tables, const int32_t* positions, uint32_t n_tokens, float2* table,
                     cudaStream_t stream) {
    if (n_tokens == 0) return;
    if (tables.n_dims == 0 || tables.n_dims % 2 != 0 || tables.inv_freq == nullptr || table == nullptr)
        fail("rope_table_cuda: n_dims must be even and positive, with an inv_freq table and an output");
    const uint64_t items = (uint64_t)n_tokens * (tables.n_dims / 2);
    rope_table_kernel<<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(tables, positions,
                                                                                            n_tokens, table);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

void rope_cuda(const RopeDeviceTables& tables, float* x, uint32_t n_tokens, uint32_t n_heads,
               uint32_t head_dim, const int32_t* positions, cudaStream_t stream) {
    if (n_tokens == 0 || n_heads == 0) return;
    if (tables.n_dims == 0 || tables.n_dims % 2 != 0 || tables.n_dims > head_dim || tables.inv_freq == nullptr)
        fail("rope_cuda: n_dims must be even, positive and <= head_dim, with an inv_freq table");
    rope_kernel<<<dim3((n_heads * (tables.n_dims / 2) + kThreads - 1) / kThreads, n_tokens), kThreads, 0, stream>>>(tables, x, n_heads, head_dim, positions);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
