#pragma once
// Shared helpers of the GPU tests: skip without a GPU, fresh seeds (printed on failure),
// poisoned outputs, and the relative error ||out - ref|| / ||ref|| every kernel is judged by.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/cuda_check.h"

namespace spillway::cuda_test {

inline bool have_gpu() {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SPILLWAY_SKIP_WITHOUT_GPU() \
    if (!::spillway::cuda_test::have_gpu()) GTEST_SKIP() << "no CUDA device"

inline size_t free_vram_bytes() {
    size_t free_b = 0, total_b = 0;
    SPILLWAY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

// For tests on a large model shape: skips unless gib GiB of VRAM are free.
#define SPILLWAY_SKIP_WITHOUT_FREE_VRAM_GIB(gib)                                   \
    if (::spillway::cuda_test::free_vram_bytes() < ((size_t)(gib) << 30))          \
    GTEST_SKIP() << "needs ~" << (gib) << " GB of free VRAM"

// SPILLWAY_TEST_SEED=N replays a failure's seed (tests print theirs).
inline uint32_t fresh_seed() {
    if (const char* e = std::getenv("SPILLWAY_TEST_SEED"); e != nullptr && *e != '\0')
        return (uint32_t)std::strtoul(e, nullptr, 10);
    return std::random_device{}();
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
    DeviceBuffer<T> d(host.size());
    SPILLWAY_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer<T>& d) {
    std::vector<T> host(d.size());
    SPILLWAY_CUDA_CHECK(cudaMemcpy(host.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
    return host;
}

// 0xFF bytes: a NaN pattern for f32, so an element the kernel forgot to write fails the check.
template <typename T>
void poison(DeviceBuffer<T>& d) {
    SPILLWAY_CUDA_CHECK(cudaMemset(d.data(), 0xFF, d.bytes()));
}

inline double sum_squares(const std::vector<float>& v) {
    double s = 0.0;
    for (float x : v) s += (double)x * x;
    return s;
}

// ||out - ref|| / ||ref|| in double; NaN anywhere gives NaN (which fails every comparison).
inline double rel_error(const float* out, const float* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return std::sqrt(num) / std::sqrt(den > 0 ? den : 1.0);
}
inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
    return rel_error(out.data(), ref.data(), ref.size());
}

// ||out - ref|| / ||mag||, where mag[i] is the sum of |terms| of output i. A sum's f32 rounding
// error scales with its terms, not with its result: a single row of random terms can cancel to
// near zero, and its error relative to itself has a heavy tail (a 1 x 256 q8_0 row measured
// 1.1e-5 against rel_error's 1e-5 on a correct kernel, session 38). Expect ~u = 6e-8 for
// accumulation in f32 whatever the length; a wrong or missing term gives ~1 / cols or more.
inline double sum_error(const std::vector<float>& out, const std::vector<float>& ref, const std::vector<float>& mag) {
    double num = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    const double den = sum_squares(mag);
    return std::sqrt(num) / std::sqrt(den > 0 ? den : 1.0);
}

inline size_t count_nan(const std::vector<float>& v) {
    size_t n = 0;
    for (float x : v) n += std::isnan(x);
    return n;
}

}  // namespace spillway::cuda_test
