#pragma once
// IEEE half and bfloat16 conversions used by GGUF data, the KV tiers and the CPU engine.
#include <cstdint>
#include <cstring>

namespace spillway {

inline float fp32_from_bits(uint32_t w) { float f; std::memcpy(&f, &w, 4); return f; }
inline uint32_t fp32_to_bits(float f) { uint32_t w; std::memcpy(&w, &f, 4); return w; }

// Exact for all halves including subnormals, inf and NaN.
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return fp32_from_bits(sign);
        // Subnormal: renormalise.
        int shift = 0;
        while ((mant & 0x400u) == 0) { mant <<= 1; ++shift; }
        mant &= 0x3ffu;
        return fp32_from_bits(sign | ((uint32_t)(113 - shift) << 23) | (mant << 13));
    }
    if (exp == 31) return fp32_from_bits(sign | 0x7f800000u | (mant << 13));
    return fp32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

// Round to nearest even, overflow to inf, NaN preserved.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520 -> inf
    if (abs < 0x38800000u) {
        // Result is subnormal or zero: scale into the subnormal grid with RNE via float add.
        float magnitude = fp32_from_bits(abs) + 0.5f;  // 0.5 = 2^-1 shifts mantissa so ulp = 2^-24
        return (uint16_t)(sign | (uint16_t)(fp32_to_bits(magnitude) - fp32_to_bits(0.5f)));
    }
    uint32_t mant_odd = (abs >> 13) & 1u;
    uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112<<23) and round
    return (uint16_t)(sign | (uint16_t)(rounded >> 13));
}

inline float bf16_to_fp32(uint16_t b) { return fp32_from_bits((uint32_t)b << 16); }

inline uint16_t fp32_to_bf16(float f) {
    uint32_t x = fp32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

}  // namespace spillway
