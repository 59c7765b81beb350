#pragma once
// A test producer for programmatic dependent launch: a kernel that releases its dependents
// at entry, waits `delay_us` (GPU time), then copies each region src -> dst. A dependent
// launched programmatically after it may run its pre-wait part during that delay, so any
// read of dst before its wait sees the old (poisoned) bytes.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace spillway::cuda_test {

struct CopyRegion {
    const void* src;
    void* dst;
    size_t bytes;
};

// Up to 4 regions; an ordinary launch on `stream`.
void launch_late_producer(const CopyRegion* regions, int n_regions, uint32_t delay_us, cudaStream_t stream);

}  // namespace spillway::cuda_test
