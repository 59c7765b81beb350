#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/fp16.h"

using namespace spillway;

// Every half value converts to float and back to itself (NaNs stay NaN).
TEST(Fp16, AllHalvesRoundTrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        float f = fp16_to_fp32((uint16_t)h);
        uint16_t back = fp32_to_fp16(f);
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(fp16_to_fp32(back))) << h;
        } else {
            EXPECT_EQ(back, h) << "half 0x" << std::hex << h;
        }
    }
}

// Random floats round to the nearest half: the error is at most half a half-ulp.
TEST(Fp16, RandomFloatsRoundToNearest) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> mag(-20.0f, 15.0f);
    for (int i = 0; i < 200000; ++i) {
        float x = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, (int)mag(rng)) * ((rng() & 1) ? -1.f : 1.f);
        uint16_t h = fp32_to_fp16(x);
        float y = fp16_to_fp32(h);
        // Neighbouring halves must not be closer to x than y is.
        float up = fp16_to_fp32((uint16_t)(h + 1)), down = fp16_to_fp32((uint16_t)(h - 1));
        EXPECT_LE(std::fabs(y - x), std::fabs(up - x)) << x;
        EXPECT_LE(std::fabs(y - x), std::fabs(down - x)) << x;
    }
}

TEST(Fp16, OverflowAndSpecials) {
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(70000.0f), 0x7c00);
    EXPECT_EQ(fp32_to_fp16(-INFINITY), 0xfc00);
    EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
    EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
    // 1 + 2^-8 is exactly halfway between 1 and 1+2^-7: ties to even (1.0).
    EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
    EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}
