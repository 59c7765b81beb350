#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "gguf/quants.h"

using namespace spillway;

namespace {

// Fresh inputs every run; the seed is printed on failure so a run can be replayed.
struct Rng {
    uint32_t seed = std::random_device{}();
    std::mt19937 gen{seed};
};

// Blocks with varied scales (tiny, ordinary, large) and signs, never all zero.
std::vector<float> random_values(std::mt19937& gen, size_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-12, 8);
    std::vector<float> x(n);
    for (size_t b = 0; b < n / 32; ++b) {
        const float scale = std::ldexp(1.0f, exponent(gen));
        for (size_t j = 0; j < 32; ++j) x[b * 32 + j] = normal(gen) * scale;
    }
    return x;
}

}  // namespace

TEST(QuantsLayout, BlockSizesMatchGgmlTable) {
    EXPECT_EQ(sizeof(BlockQ8_0), ggml_traits(GgmlType::Q8_0).type_size);
    EXPECT_EQ((uint32_t)kQK8_0, ggml_traits(GgmlType::Q8_0).block_size);
    EXPECT_EQ(sizeof(BlockQ4_0), ggml_traits(GgmlType::Q4_0).type_size);
    EXPECT_EQ((uint32_t)kQK4_0, ggml_traits(GgmlType::Q4_0).block_size);
}

// A hand-built q8_0 block: scale 0.5 as a little-endian half at bytes 0-1, then 32 int8s.
TEST(QuantsLayout, Q8_0HandBuiltBlockDequantizes) {
    uint8_t raw[34];
    raw[0] = 0x00;  // 0x3800 = 0.5
    raw[1] = 0x38;
    for (int j = 0; j < 32; ++j) raw[2 + j] = (uint8_t)(int8_t)(j - 16);
    float y[32];
    dequantize_row(GgmlType::Q8_0, raw, y, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j - 16)) << j;
}

// Quantizing values on the q8_0 grid reproduces the exact bytes: d = amax/127.
TEST(QuantsLayout, Q8_0QuantizeProducesExactBytes) {
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = (float)(j % 2 ? j * 4 - 127 : 127 - j * 4) * 0.25f;
    x[5] = 127 * 0.25f;  // amax = 31.75 -> d = 0.25 exactly
    uint8_t raw[34];
    quantize_row(GgmlType::Q8_0, x, raw, 32);
    EXPECT_EQ(raw[0], 0x00);  // 0.25 = 0x3400
    EXPECT_EQ(raw[1], 0x34);
    for (int j = 0; j < 32; ++j) EXPECT_EQ((int8_t)raw[2 + j], (int)std::lround(x[j] / 0.25f)) << j;
}

// A hand-built q4_0 block: byte j holds value j in its low nibble and value j+16 in its high nibble.
TEST(QuantsLayout, Q4_0HandBuiltBlockDequantizes) {
    uint8_t raw[18];
    raw[0] = 0x00;  // 0x4000 = 2.0
    raw[1] = 0x40;
    for (int j = 0; j < 16; ++j) raw[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(GgmlType::Q4_0, raw, y, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
        EXPECT_EQ(y[j + 16], 2.0f * (15 - j - 8)) << j + 16;
    }
}

// The signed maximum maps to nibble 0 (-8); d = max / -8, so with max = -16, d = 2.
TEST(QuantsLayout, Q4_0QuantizeProducesExactBytes) {
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = 2.0f * (float)((j * 7) % 16 - 8);  // grid values -16..14
    x[3] = -16.0f;
    uint8_t raw[18];
    quantize_row(GgmlType::Q4_0, x, raw, 32);
    EXPECT_EQ(raw[0], 0x00);
    EXPECT_EQ(raw[1], 0x40);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(raw[2 + j] & 0x0F, (int)(x[j] / 2.0f) + 8) << j;
        EXPECT_EQ(raw[2 + j] >> 4, (int)(x[j + 16] / 2.0f) + 8) << j + 16;
    }
}

// A positive maximum gives a negative scale; the opposite extreme (-max) clamps at +7 levels.
TEST(QuantsLayout, Q4_0PositiveMaxGivesNegativeScaleAndClamps) {
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = 0.0f;
    x[0] = 8.0f;   // -> d = -1, nibble 0
    x[1] = -8.0f;  // x/d = 8 -> 16.5 truncated 16, clamped to 15
    x[2] = 3.0f;   // x/d = -3 -> 5
    uint8_t raw[18];
    quantize_row(GgmlType::Q4_0, x, raw, 32);
    EXPECT_EQ(fp16_to_fp32((uint16_t)(raw[0] | raw[1] << 8)), -1.0f);
    EXPECT_EQ(raw[2] & 0x0F, 0);
    EXPECT_EQ(raw[3] & 0x0F, 15);
    EXPECT_EQ(raw[4] & 0x0F, 5);
    EXPECT_EQ(raw[5] & 0x0F, 8);  // zero
}

TEST(QuantsLayout, AllZeroBlockHasZeroScale) {
    std::vector<float> x(32, 0.0f);
    BlockQ8_0 q8;
    quantize_row_q8_0(x.data(), &q8, 32);
    EXPECT_EQ(q8.d, 0);
    for (int8_t v : q8.qs) EXPECT_EQ(v, 0);
    BlockQ4_0 q4;
    quantize_row_q4_0(x.data(), &q4, 32);
    EXPECT_EQ(fp16_to_fp32(q4.d), 0.0f);  // -0.0 as in ggml: 0 / -8
    for (uint8_t v : q4.qs) EXPECT_EQ(v, 0x88);
}

// Round trip: each value is within half a step of its block's grid. The step the values are
// quantized with is the f32 scale; the stored half differs from it by at most 2^-11
// relative, which multiplies up to 127 (q8_0) or 8 (q4_0) levels, so the bound includes it.
TEST(QuantsRoundTrip, Q8_0ErrorWithinHalfStep) {
    Rng rng;
    SCOPED_TRACE("seed " + std::to_string(rng.seed));
    const size_t n = 32 * 4096;
    std::vector<float> x = random_values(rng.gen, n);
    std::vector<BlockQ8_0> q(n / 32);
    quantize_row_q8_0(x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row_q8_0(q.data(), y.data(), n);
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        const float d = amax / 127.0f;
        const float d_stored = fp16_to_fp32(q[b].d);
        ASSERT_EQ(q[b].d, fp32_to_fp16(d)) << "block " << b;
        const float bound = d / 2 + 127 * std::fabs(d - d_stored) + 1e-6f * amax;
        for (int j = 0; j < 32; ++j) {
            const size_t i = b * 32 + j;
            ASSERT_LE(std::fabs(x[i] - y[i]), bound) << "block " << b << " value " << j << " x=" << x[i];
            ASSERT_LE(std::abs((int)q[b].qs[j]), 127);
        }
    }
}

TEST(QuantsRoundTrip, Q4_0ErrorWithinHalfStepExceptClampedExtremes) {
    Rng rng;
    SCOPED_TRACE("seed " + std::to_string(rng.seed));
    const size_t n = 32 * 4096;
    std::vector<float> x = random_values(rng.gen, n);
    std::vector<BlockQ4_0> q(n / 32);
    quantize_row_q4_0(x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row_q4_0(q.data(), y.data(), n);
    size_t clamped = 0;
    for (size_t b = 0; b < n / 32; ++b) {
        float amax = 0, signed_max = 0;
        for (int j = 0; j < 32; ++j) {
            const float v = x[b * 32 + j];
            if (std::fabs(v) > amax) amax = std::fabs(v), signed_max = v;
        }
        const float d = signed_max / -8.0f;  // negative when the maximum is positive
        const float step = std::fabs(d);
        const float d_stored = fp16_to_fp32(q[b].d);
        ASSERT_EQ(q[b].d, fp32_to_fp16(d)) << "block " << b;
        const float bound = step / 2 + 8 * std::fabs(d - d_stored) + 1e-6f * amax;
        for (int j = 0; j < 32; ++j) {
            const size_t i = b * 32 + j;
            const float level = x[i] / d;  // in [-8, 8]
            if (level > 7.5f) {
                // Beyond the top level: clamped to +7, error at most one step.
                ++clamped;
                ASSERT_LE(std::fabs(x[i] - y[i]), step + 8 * std::fabs(d - d_stored) + 1e-6f * amax)
                    << "block " << b << " value " << j;
                continue;
            }
            ASSERT_LE(std::fabs(x[i] - y[i]), bound) << "block " << b << " value " << j << " x=" << x[i];
        }
    }
    // Gaussian blocks have an opposite-signed peer near the max now and then, not always.
    EXPECT_LT(clamped, n / 32);
}

// Dispatch: every supported type round-trips through quantize_row/dequantize_row, with the
// float formats exact on values they can represent.
TEST(QuantsDispatch, FloatFormatsRoundTrip) {
    Rng rng;
    SCOPED_TRACE("seed " + std::to_string(rng.seed));
    const size_t n = 32 * 64;
    std::vector<float> x = random_values(rng.gen, n);
    std::vector<float> y(n);
    std::vector<uint8_t> buf(n * 4);

    quantize_row(GgmlType::F32, x.data(), buf.data(), n);
    dequantize_row(GgmlType::F32, buf.data(), y.data(), n);
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * 4));

    for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
        std::vector<float> representable(n);
        for (size_t i = 0; i < n; ++i)
            representable[i] = t == GgmlType::F16 ? fp16_to_fp32(fp32_to_fp16(x[i])) : bf16_to_fp32(fp32_to_bf16(x[i]));
        quantize_row(t, representable.data(), buf.data(), n);
        dequantize_row(t, buf.data(), y.data(), n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], representable[i]) << ggml_type_name(t) << " " << i;
        // Rounding error of arbitrary values: half an ulp of 11 (f16) or 8 (bf16) bits.
        quantize_row(t, x.data(), buf.data(), n);
        dequantize_row(t, buf.data(), y.data(), n);
        const float rel = t == GgmlType::F16 ? std::ldexp(1.0f, -11) : std::ldexp(1.0f, -8);
        for (size_t i = 0; i < n; ++i) {
            if (t == GgmlType::F16 && std::fabs(x[i]) < 6.2e-5f) continue;  // f16 subnormal range
            ASSERT_LE(std::fabs(y[i] - x[i]), rel * std::fabs(x[i])) << ggml_type_name(t) << " " << x[i];
        }
    }
}

TEST(QuantsDispatch, QuantizedTypesMatchDirectCalls) {
    Rng rng;
    SCOPED_TRACE("seed " + std::to_string(rng.seed));
    const size_t n = 32 * 64;
    std::vector<float> x = random_values(rng.gen, n);
    std::vector<BlockQ8_0> direct8(n / 32);
    std::vector<BlockQ4_0> direct4(n / 32);
    quantize_row_q8_0(x.data(), direct8.data(), n);
    quantize_row_q4_0(x.data(), direct4.data(), n);
    std::vector<uint8_t> buf8(n / 32 * 34), buf4(n / 32 * 18);
    quantize_row(GgmlType::Q8_0, x.data(), buf8.data(), n);
    quantize_row(GgmlType::Q4_0, x.data(), buf4.data(), n);
    EXPECT_EQ(0, std::memcmp(buf8.data(), direct8.data(), buf8.size()));
    EXPECT_EQ(0, std::memcmp(buf4.data(), direct4.data(), buf4.size()));
    // Quantizing the dequantized values again is a fixed point for q8_0.
    std::vector<float> y(n);
    dequantize_row(GgmlType::Q8_0, buf8.data(), y.data(), n);
    std::vector<uint8_t> again(buf8.size());
    quantize_row(GgmlType::Q8_0, y.data(), again.data(), n);
    EXPECT_EQ(0, std::memcmp(again.data(), buf8.data(), buf8.size()));
}

TEST(QuantsDispatch, UnsupportedTypesAndPartialBlocksThrow) {
    EXPECT_TRUE(is_dequantizable(GgmlType::F32));
    EXPECT_TRUE(is_dequantizable(GgmlType::Q4_0));
    EXPECT_TRUE(is_quantizable(GgmlType::BF16));
    EXPECT_FALSE(is_dequantizable(GgmlType::Q5_1));
    EXPECT_FALSE(is_quantizable(GgmlType::IQ2_XXS));
    float x[64] = {1.0f};
    uint8_t buf[256];
    EXPECT_THROW(quantize_row(GgmlType::Q5_1, x, buf, 32), Error);
    EXPECT_THROW(dequantize_row(GgmlType::Q6_K, buf, x, 256), Error);
    try {
        quantize_row(GgmlType::Q8_0, x, buf, 48);
        FAIL() << "partial block accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("48"), std::string::npos) << e.what();
    }
}
