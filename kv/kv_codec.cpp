#include "kv/kv_codec.h"

#include <cstring>

#include "common/error.h"
#include "common/fp16.h"
#include "gguf/quants.h"

namespace spillway {
namespace {

// Blocks are read byte-wise (memcpy of the scale) because rows are only 2-byte aligned:
// a q8_0 block is 34 bytes.
inline float block_scale(const uint8_t* block) {
    uint16_t d;
    std::memcpy(&d, block, 2);
    return fp16_to_fp32(d);
}

}  // namespace

const char* kv_format_name(KvFormat format) {
    switch (format) {
        case KvFormat::f16: return "f16";
        case KvFormat::q8_0: return "q8_0";
        case KvFormat::q4_0: return "q4_0";
        case KvFormat::f32: return "f32";
    }
    return "?";
}

void kv_store_row(KvFormat type, const float* x, uint8_t* row, size_t n) {
    switch (type) {
        case KvFormat::f16: {
            for (size_t i = 0; i < n; ++i) {
                uint16_t h = fp32_to_fp16(x[i]);
                std::memcpy(row + 2 * i, &h, 2);
            }
            return;
        }
        case KvFormat::q8_0: quantize_row_q8_0(x, reinterpret_cast<BlockQ8_0*>(row), n); return;
        case KvFormat::q4_0: quantize_row_q4_0(x, reinterpret_cast<BlockQ4_0*>(row), n); return;
        case KvFormat::f32: std::memcpy(row, x, n * sizeof(float)); return;
    }
    fail("kv_store_row: unknown KV type");
}

void kv_load_row(KvFormat type, const uint8_t* row, float* y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = 0.0f;
    kv_axpy(type, row, 1.0f, y, n);
}

float kv_dot(KvFormat type, const uint8_t* row, const float* q, size_t n) {
    switch (type) {
        case KvFormat::f32: {
            float sum = 0.0f;
            for (size_t i = 0; i < n; ++i) {
                float v;
                std::memcpy(&v, row + 4 * i, 4);
                sum += q[i] * v;
            }
            return sum;
        }
        case KvFormat::f16: {
            float sum = 0.0f;
            for (size_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, row + 2 * i, 2);
                sum += q[i] * fp16_to_fp32(h);
            }
            return sum;
        }
        case KvFormat::q8_0: {
            float sum = 0.0f;
            for (size_t b = 0; b < n / 32; ++b) {
                const uint8_t* block = row + b * 34;
                const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
                const float* x = q + b * 32;
                float partial = 0.0f;
                for (int i = 0; i < 32; ++i) partial += x[i] * (float)qs[i];
                sum += partial * block_scale(block);
            }
            return sum;
        }
        case KvFormat::q4_0: {
            float sum = 0.0f;
            for (size_t b = 0; b < n / 32; ++b) {
                const uint8_t* block = row + b * 18;
                const uint8_t* qs = block + 2;
                const float* x = q + b * 32;
                float partial = 0.0f;
                for (int i = 0; i < 16; ++i) {
                    partial += x[i] * (float)((qs[i] & 0x0F) - 8);
                    partial += x[i + 16] * (float)((qs[i] >> 4) - 8);
                }
                sum += partial * block_scale(block);
            }
            return sum;
        }
    }
    fail("kv_dot: unknown KV type");
}

void kv_axpy(KvFormat type, const uint8_t* row, float a, float* y, size_t n) {
    switch (type) {
        case KvFormat::f32: {
            for (size_t i = 0; i < n; ++i) {
                float v;
                std::memcpy(&v, row + 4 * i, 4);
                y[i] += a * v;
            }
            return;
        }
        case KvFormat::f16: {
            for (size_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, row + 2 * i, 2);
                y[i] += a * fp16_to_fp32(h);
            }
            return;
        }
        case KvFormat::q8_0: {
            for (size_t b = 0; b < n / 32; ++b) {
                const uint8_t* block = row + b * 34;
                const int8_t* qs = reinterpret_cast<const int8_t*>(block + 2);
                const float ad = a * block_scale(block);
                float* out = y + b * 32;
                for (int i = 0; i < 32; ++i) out[i] += ad * (float)qs[i];
            }
            return;
        }
        case KvFormat::q4_0: {
            for (size_t b = 0; b < n / 32; ++b) {
                const uint8_t* block = row + b * 18;
                const uint8_t* qs = block + 2;
                const float ad = a * block_scale(block);
                float* out = y + b * 32;
                for (int i = 0; i < 16; ++i) {
                    out[i] += ad * (float)((qs[i] & 0x0F) - 8);
                    out[i + 16] += ad * (float)((qs[i] >> 4) - 8);
                }
            }
            return;
        }
    }
    fail("kv_axpy: unknown KV type");
}

}  // namespace spillway
