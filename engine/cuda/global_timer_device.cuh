#pragma once
// The GPU's global nanosecond clock, for the lab timelines of the benchmarks (decode layer
// kernel, decode attention): comparable across SMs, unlike clock64.
#include <cstdint>

namespace spillway {

__device__ __forceinline__ uint64_t global_timer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

}  // namespace spillway
