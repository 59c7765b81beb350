#include "late_producer.cuh"

#include "engine/cuda/cuda_check.h"

namespace spillway::cuda_test {
namespace {

struct Regions {
    CopyRegion r[4];
    int n;
};

__global__ void late_producer_kernel(Regions regions, uint64_t delay_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
    uint64_t t0 = 0, t = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < delay_ns);
    for (int k = 0; k < regions.n; ++k) {
        const auto* src = static_cast<const uint8_t*>(regions.r[k].src);
        auto* dst = static_cast<uint8_t*>(regions.r[k].dst);
        for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < regions.r[k].bytes; i += (size_t)gridDim.x * blockDim.x)
            dst[i] = src[i];
    }
}

}  // namespace

void launch_late_producer(const CopyRegion* regions, int n_regions, uint32_t delay_us, cudaStream_t stream) {
    Regions r{};
    r.n = n_regions < 4 ? n_regions : 4;
    for (int k = 0; k < r.n; ++k) r.r[k] = regions[k];
    late_producer_kernel<<<8, 256, 0, stream>>>(r, (uint64_t)delay_us * 1000);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway::cuda_test
