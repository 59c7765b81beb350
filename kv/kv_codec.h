#pragma once
// Row codecs for the KV tiers (f16, q8_0, q4_0 in GGUF's block layouts, see kv_layout.h):
// store an f32 row, load it back, and the two fused reads attention needs (dot with a
// query, accumulate a scaled row) that work on the blocks directly, so a quantized
// cache is never dequantized into a temporary.
#include <cstddef>
#include <cstdint>

#include "model/model_spec.h"

namespace spillway {

// Bytes of `n_values` values of `type` (n_values a multiple of 32 for q8_0 / q4_0).
// Same value as kv_row_bytes(); header-only so the codecs depend on nothing else.
constexpr uint64_t kv_bytes(KvType type, uint64_t n_values) {
    switch (type) {
        case KvType::f16: return n_values * 2;
        case KvType::q8_0: return n_values / 32 * 34;
        case KvType::q4_0: return n_values / 32 * 18;
    }
    return 0;
}

// Quantize on write / dequantize on read. `n` values; row holds kv_bytes(type, n) bytes.
void kv_store_row(KvType type, const float* x, uint8_t* row, size_t n);
void kv_load_row(KvType type, const uint8_t* row, float* y, size_t n);

// sum_i q[i] * value_i
float kv_dot(KvType type, const uint8_t* row, const float* q, size_t n);
// y[i] += a * value_i
void kv_axpy(KvType type, const uint8_t* row, float a, float* y, size_t n);

}  // namespace spillway
