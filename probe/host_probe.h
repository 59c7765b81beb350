#pragma once
// Host-side measurements (no GPU needed): the spec's host-RAM term is a single-thread
// memcpy bandwidth, a conservative proxy for how fast the host can feed the copy engine.
#include <cstddef>

namespace spillway {

struct HostRamBandwidth {
    double single_thread_gbps = 0;  // the spec's host_ram_gbps
    double multi_thread_gbps = 0;   // all hardware threads copying disjoint slices
    size_t bytes_per_copy = 0;
};

// Copies a buffer larger than any last-level cache a few times and keeps the best rate.
// The destination is checksummed after every copy so the compiler cannot drop the copies
// as dead stores (the defect the spec's bug-2151 describes: ~2e7 GB/s).
HostRamBandwidth measure_host_ram_bandwidth(size_t bytes = size_t(256) << 20, int repeats = 3);

}  // namespace spillway
