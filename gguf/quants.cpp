#include "gguf/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"

namespace spillway {

// Rounding follows ggml's scalar reference quantizers exactly (the scale is computed and
// applied in f32, only stored as a half), so our files and KV blocks are bit-identical to
// what llama.cpp writes for the same input.

void quantize_row_q8_0(const float* x, BlockQ8_0* y, size_t n) {
    const size_t n_blocks = n / kQK8_0;
    for (size_t b = 0; b < n_blocks; ++b) {
        const float* xb = x + b * kQK8_0;
        float amax = 0.0f;
        for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = (int8_t)std::roundf(xb[j] * id);
    }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, size_t n) {
    const size_t n_blocks = n / kQK8_0;
    for (size_t b = 0; b < n_blocks; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        for (int j = 0; j < kQK8_0; ++j) y[b * kQK8_0 + j] = d * (float)x[b].qs[j];
    }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, size_t n) {
    const size_t n_blocks = n / kQK4_0;
    for (size_t b = 0; b < n_blocks; ++b) {
        const float* xb = x + b * kQK4_0;
        // The value of largest magnitude, with its sign, maps exactly to -8, which uses the
        // otherwise wasted 16th level; its opposite-signed peers may clamp at +7.
        float amax = 0.0f, signed_max = 0.0f;
        for (int j = 0; j < kQK4_0; ++j) {
            if (amax < std::fabs(xb[j])) {
                amax = std::fabs(xb[j]);
                signed_max = xb[j];
            }
        }
        const float d = signed_max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            // Truncation of a value >= 0 (x*id >= -8 up to rounding), i.e. floor(x/d + 8.5).
            const int lo = std::min(15, (int)(int8_t)(xb[j] * id + 8.5f));
            const int hi = std::min(15, (int)(int8_t)(xb[j + kQK4_0 / 2] * id + 8.5f));
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, size_t n) {
    const size_t n_blocks = n / kQK4_0;
    for (size_t b = 0; b < n_blocks; ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float* yb = y + b * kQK4_0;
        for (int j = 0; j < kQK4_0 / 2; ++j) {
            yb[j] = d * (float)((x[b].qs[j] & 0x0F) - 8);
            yb[j + kQK4_0 / 2] = d * (float)((x[b].qs[j] >> 4) - 8);
        }
    }
}

namespace {

void dequantize_f32(const void* x, float* y, size_t n) { std::memcpy(y, x, n * sizeof(float)); }
void quantize_f32(const float* x, void* y, size_t n) { std::memcpy(y, x, n * sizeof(float)); }

// Halves are read with memcpy: tensor data in a mapping need not be 2-byte aligned.
void dequantize_f16(const void* x, float* y, size_t n) {
    const auto* bytes = static_cast<const uint8_t*>(x);
    for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        y[i] = fp16_to_fp32(h);
    }
}
void quantize_f16(const float* x, void* y, size_t n) {
    auto* bytes = static_cast<uint8_t*>(y);
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
    }
}
void dequantize_bf16(const void* x, float* y, size_t n) {
    const auto* bytes = static_cast<const uint8_t*>(x);
    for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        y[i] = bf16_to_fp32(h);
    }
}
void quantize_bf16(const float* x, void* y, size_t n) {
    auto* bytes = static_cast<uint8_t*>(y);
    for (size_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
    }
}

void dequantize_q8_0(const void* x, float* y, size_t n) {
    dequantize_row_q8_0(static_cast<const BlockQ8_0*>(x), y, n);
}
void quantize_q8_0(const float* x, void* y, size_t n) { quantize_row_q8_0(x, static_cast<BlockQ8_0*>(y), n); }
void dequantize_q4_0(const void* x, float* y, size_t n) {
    dequantize_row_q4_0(static_cast<const BlockQ4_0*>(x), y, n);
}
void quantize_q4_0(const float* x, void* y, size_t n) { quantize_row_q4_0(x, static_cast<BlockQ4_0*>(y), n); }

// One row per supported type; a new type (Q4_K, Q6_K) is its block functions in their
// own file plus one row here. `quantize` may be null for dequantize-only types.
struct TypeCodec {
    GgmlType type;
    void (*dequantize)(const void*, float*, size_t);
    void (*quantize)(const float*, void*, size_t);
};

constexpr TypeCodec kCodecs[] = {
    {GgmlType::F32, dequantize_f32, quantize_f32},
    {GgmlType::F16, dequantize_f16, quantize_f16},
    {GgmlType::BF16, dequantize_bf16, quantize_bf16},
    {GgmlType::Q8_0, dequantize_q8_0, quantize_q8_0},
    {GgmlType::Q4_0, dequantize_q4_0, quantize_q4_0},
};

const TypeCodec* find_codec(GgmlType type) {
    for (const TypeCodec& c : kCodecs)
        if (c.type == type) return &c;
    return nullptr;
}

std::string type_label(GgmlType type) {
    auto traits = ggml_type_traits(static_cast<uint32_t>(type));
    return traits ? std::string(traits->name) : "type " + std::to_string(static_cast<uint32_t>(type));
}

void check_whole_blocks(GgmlType type, size_t n) {
    const uint32_t block = ggml_traits(type).block_size;
    if (n % block != 0)
        fail(type_label(type) + " row of " + std::to_string(n) + " values is not a multiple of its block size " +
             std::to_string(block));
}

}  // namespace

bool is_dequantizable(GgmlType type) { return find_codec(type) != nullptr; }

bool is_quantizable(GgmlType type) {
    const TypeCodec* c = find_codec(type);
    return c && c->quantize;
}

void dequantize_row(GgmlType type, const void* x, float* y, size_t n) {
    const TypeCodec* c = find_codec(type);
    if (!c) fail("cannot convert " + type_label(type) + " tensors to f32 (not supported yet)");
    check_whole_blocks(type, n);
    c->dequantize(x, y, n);
}

void quantize_row(GgmlType type, const float* x, void* y, size_t n) {
    const TypeCodec* c = find_codec(type);
    if (!c || !c->quantize) fail("cannot convert f32 to " + type_label(type) + " (not supported yet)");
    check_whole_blocks(type, n);
    c->quantize(x, y, n);
}

}  // namespace spillway
