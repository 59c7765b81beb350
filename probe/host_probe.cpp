#include "probe/host_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"

namespace spillway {
namespace {

// Reads one word per page so the result depends on every page the copy wrote.
uint64_t sample_checksum(const uint8_t* data, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i + 8 <= n; i += 4096) {
        uint64_t w;
        std::memcpy(&w, data + i, 8);
        sum = sum * 31 + w;
    }
    return sum;
}

double copy_seconds(uint8_t* dst, const uint8_t* src, size_t n, unsigned threads) {
    auto start = std::chrono::steady_clock::now();
    if (threads <= 1) {
        std::memcpy(dst, src, n);
    } else {
        std::vector<std::thread> pool;
        size_t slice = (n / threads) & ~size_t(4095);
        for (unsigned t = 0; t < threads; ++t) {
            size_t begin = t * slice, len = (t + 1 == threads) ? n - begin : slice;
            pool.emplace_back([=] { std::memcpy(dst + begin, src + begin, len); });
        }
        for (auto& th : pool) th.join();
    }
    auto stop = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(stop - start).count();
}

}  // namespace

HostRamBandwidth measure_host_ram_bandwidth(size_t bytes, int repeats) {
    if (bytes < (size_t(1) << 20) || repeats < 1) fail("host RAM probe: needs at least 1 MiB and one repeat");
    std::unique_ptr<uint8_t[]> src(new (std::nothrow) uint8_t[bytes]);
    std::unique_ptr<uint8_t[]> dst(new (std::nothrow) uint8_t[bytes]);
    if (!src || !dst) fail("host RAM probe: cannot allocate 2 x " + std::to_string(bytes >> 20) + " MiB");
    // Touch every page first so the timing measures copying, not page faults.
    for (size_t i = 0; i < bytes; i += 64) src[i] = (uint8_t)(i * 2654435761u >> 13);
    std::memset(dst.get(), 0, bytes);

    volatile uint64_t sink = 0;
    auto best_rate = [&](unsigned threads) {
        double best = 0;
        for (int r = 0; r < repeats; ++r) {
            src[(size_t)r * 4096 % bytes] ^= 1;  // a different source each time
            double s = copy_seconds(dst.get(), src.get(), bytes, threads);
            sink = sink + sample_checksum(dst.get(), bytes);
            if (s > 0) best = std::max(best, (double)bytes / s / 1e9);
        }
        return best;
    };
    HostRamBandwidth result;
    result.bytes_per_copy = bytes;
    result.single_thread_gbps = best_rate(1);
    result.multi_thread_gbps = best_rate(std::max(1u, std::thread::hardware_concurrency()));
    (void)sink;
    return result;
}

}  // namespace spillway
