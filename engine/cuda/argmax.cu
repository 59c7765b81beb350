#include "engine/cuda/argmax.cuh"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace spillway {
namespace {

// Why many blocks: one block of 1024 threads took 23.8 us for the 14B head's 152,064 logits
// (Nsight, session 51, H100): each thread's loop waited on one L2 load per element, ~149 in a
// row, at the end of every decode step. Here a block's threads keep kPerThread independent
// loads in flight; 38 blocks cover that vocabulary in one wave.
constexpr uint32_t kThreads = 256;
constexpr uint32_t kPerThread = 16;
constexpr uint32_t kSpan = kThreads * kPerThread;  // values per block and pass
constexpr uint32_t kMaxBlocks = 512;               // larger vocabularies loop over spans

// (value, index) candidates: index < 0 is none; a larger value wins, then the smaller index.
struct Best {
    float v;
    int32_t i;
};
__device__ __forceinline__ bool beats(Best o, Best m) {
    return o.i >= 0 && (m.i < 0 || o.v > m.v || (o.v == m.v && o.i < m.i));
}
__device__ __forceinline__ Best block_best(Best b, Best* shared_warp) {
    for (int off = 16; off > 0; off >>= 1) {
        const Best o{__shfl_down_sync(0xffffffffu, b.v, off), __shfl_down_sync(0xffffffffu, b.i, off)};
        if (beats(o, b)) b = o;
    }
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared_warp[warp] = b;
    __syncthreads();
    if (warp == 0) {
        b = lane < kThreads / 32 ? shared_warp[lane] : Best{0.0f, -1};
        for (int off = 16; off > 0; off >>= 1) {
            const Best o{__shfl_down_sync(0xffffffffu, b.v, off), __shfl_down_sync(0xffffffffu, b.i, off)};
            if (beats(o, b)) b = o;
        }
    }
    return b;  // valid in thread 0
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* logits, uint32_t n, float* block_v,
                                                          int32_t* block_i, uint32_t* arrivals, int32_t* out) {
    __shared__ Best warp_best[kThreads / 32];
    __shared__ bool last;
    Best b{0.0f, -1};
    for (uint64_t base = (uint64_t)blockIdx.x * kSpan; base < n; base += (uint64_t)gridDim.x * kSpan) {
        float v[kPerThread];
#pragma unroll
        for (uint32_t k = 0; k < kPerThread; ++k) {
            const uint64_t i = base + k * kThreads + threadIdx.x;
            v[k] = i < n ? logits[i] : -INFINITY;
        }
#pragma unroll
        for (uint32_t k = 0; k < kPerThread; ++k) {  // this thread's indices ascend: ties keep the first
            const uint64_t i = base + k * kThreads + threadIdx.x;
            const float x = v[k] != v[k] ? -INFINITY : v[k];
            if (i < n && (b.i < 0 || x > b.v)) b = Best{x, (int32_t)i};
        }
    }
    b = block_best(b, warp_best);
    if (threadIdx.x == 0) {
        block_v[blockIdx.x] = b.v;
        block_i[blockIdx.x] = b.i;
        __threadfence();  // the candidate before the arrival
        last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    Best c{0.0f, -1};
    for (uint32_t j = threadIdx.x; j < gridDim.x; j += kThreads) {  // ascending blocks per thread
        const Best o{__ldcg(block_v + j), __ldcg(block_i + j)};
        if (beats(o, c)) c = o;
    }
    __syncthreads();  // warp_best is reused
    c = block_best(c, warp_best);
    if (threadIdx.x == 0) {
        *out = c.i < 0 ? 0 : c.i;
        *arrivals = 0;  // rearmed: every block of this launch has arrived
    }
}

}  // namespace

ArgmaxScratch make_argmax_scratch() {
    ArgmaxScratch s{DeviceBuffer<float>(kMaxBlocks), DeviceBuffer<int32_t>(kMaxBlocks), DeviceBuffer<uint32_t>(1)};
    SPILLWAY_CUDA_CHECK(cudaMemset(s.arrivals.data(), 0, s.arrivals.bytes()));
    return s;
}

void argmax_cuda(const float* logits, uint32_t n, int32_t* out, const ArgmaxScratch& scratch, cudaStream_t stream) {
    if (n == 0) fail("argmax_cuda: no logits");
    if (scratch.arrivals.size() == 0) fail("argmax_cuda: scratch not made (make_argmax_scratch)");
    const uint32_t blocks = std::min<uint32_t>(kMaxBlocks, (n + kSpan - 1) / kSpan);
    argmax_kernel<<<blocks, kThreads, 0, stream>>>(logits, n, scratch.values.data(), scratch.indices.data(),
                                                  scratch.arrivals.data(), out);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
