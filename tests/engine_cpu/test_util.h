#pragma once
// Shared helpers for the CPU engine tests: fresh seeds (printed through SCOPED_TRACE so a
// failure can be replayed with SPILLWAY_TEST_SEED), random KV rows written directly in the
// GGUF block layouts, a naive decoder of those layouts, and the relative error metric.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "model/model_spec.h"

namespace spillway::test {

inline uint64_t fresh_seed() {
    if (const char* s = std::getenv("SPILLWAY_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    std::random_device rd;
    return ((uint64_t)rd() << 32) ^ rd();
}

#define SPILLWAY_SEED_TRACE(seed) \
    SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with SPILLWAY_TEST_SEED)")

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

inline uint64_t naive_kv_bytes(KvType t, uint64_t n) {
    return t == KvType::f16 ? 2 * n : t == KvType::q8_0 ? n / 32 * 34 : n / 32 * 18;
}

// Random bytes that are valid rows of `type` (scales are finite halves of moderate size).
inline std::vector<uint8_t> random_kv_rows(std::mt19937_64& rng, KvType type, uint64_t n_values) {
    std::vector<uint8_t> bytes(naive_kv_bytes(type, n_values));
    std::uniform_real_distribution<float> val(-2.0f, 2.0f);
    std::uniform_real_distribution<float> scale(0.002f, 0.03f);
    std::uniform_int_distribution<int> byte(0, 255);
    if (type == KvType::f16) {
        for (uint64_t i = 0; i < n_values; ++i) {
            uint16_t h = fp32_to_fp16(val(rng));
            std::memcpy(&bytes[2 * i], &h, 2);
        }
        return bytes;
    }
    const uint64_t block = type == KvType::q8_0 ? 34 : 18;
    for (uint64_t b = 0; b < n_values / 32; ++b) {
        uint16_t d = fp32_to_fp16(type == KvType::q8_0 ? scale(rng) : 8 * scale(rng));
        std::memcpy(&bytes[b * block], &d, 2);
        for (uint64_t i = 2; i < block; ++i) {
            int x = byte(rng);
            if (type == KvType::q8_0 && x == 128) x = 129;  // keep int8 in [-127, 127]
            bytes[b * block + i] = (uint8_t)x;
        }
    }
    return bytes;
}

// Straight from the layout description in gguf/quants.h, one value at a time.
inline float naive_kv_value(KvType type, const uint8_t* row, uint64_t i) {
    if (type == KvType::f16) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        return fp16_to_fp32(h);
    }
    const uint64_t block = type == KvType::q8_0 ? 34 : 18;
    const uint8_t* b = row + (i / 32) * block;
    uint16_t dbits;
    std::memcpy(&dbits, b, 2);
    const float d = fp16_to_fp32(dbits);
    const uint64_t j = i % 32;
    if (type == KvType::q8_0) return d * (float)(int8_t)b[2 + j];
    const uint8_t q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
    return d * (float)((int)q - 8);
}

// ||a - b|| / ||b||, computed in double.
inline double rel_error(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    return rel_error(a.data(), b.data(), std::min(a.size(), b.size()));
}

inline const KvType kAllKvTypes[] = {KvType::f16, KvType::q8_0, KvType::q4_0};
inline const char* kv_name(KvType t) { return t == KvType::f16 ? "f16" : t == KvType::q8_0 ? "q8_0" : "q4_0"; }

}  // namespace spillway::test
