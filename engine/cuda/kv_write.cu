#include "engine/cuda/kv_write.cuh"

#include <cuda_fp16.h>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kv_write_device.cuh"

namespace spillway {
namespace {

constexpr int kThreads = 256;

// One warp per 32-value block (lane = value), blockIdx.y = token. f16 uses the same grid.
template <KvType T>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(const float* __restrict__ src, uint8_t* __restrict__ cache,
                                                            uint32_t first_cell, uint32_t n_values) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t block = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
    if (block >= n_values / 32) return;
    const uint32_t token = blockIdx.y;
    const float v = src[(size_t)token * n_values + block * 32 + lane];
    kv_store_block<T>(v, cache + (uint64_t)(first_cell + token) * kv_row_bytes_device<T>(n_values), block, lane);
}

}  // namespace

void kv_write_cuda(KvType type, const float* src, uint8_t* cache, uint32_t first_cell,
                   uint32_t n_tokens, uint32_t n_values, cudaStream_t stream) {
    if (n_tokens == 0) return;
    if (n_values == 0 || n_values % 32 != 0) fail("kv_write_cuda: n_values must be a positive multiple of 32");
    const dim3 grid((n_values / 32 + kThreads / 32 - 1) / (kThreads / 32), n_tokens);
    switch (type) {
        case KvType::f16: kv_write_kernel<KvType::f16><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
        case KvType::q8_0: kv_write_kernel<KvType::q8_0><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
        case KvType::q4_0: kv_write_kernel<KvType::q4_0><<<grid, kThreads, 0, stream>>>(src, cache, first_cell, n_values); break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
