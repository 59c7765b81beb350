#pragma once
// Row codecs for the KV tiers (f16, q8_0, q4_0 in GGUF's block layouts, see kv_layout.h):
// store an f32 row, load it back, and the two fused reads attention needs (dot with a
// query, accumulate a scaled row) that work on the blocks directly, so a quantized
// cache is never dequantized into a temporary.
#include <cstddef>
#include <cstdint>

#include "model/model_spec.h"

namespace spillway {

// Storage formats the CPU cache can hold: the three tiers, plus f32, which exists only as
// the exact reference (checks against HF transformers in float64 need it: f16 rounding
// of K/V alone moves logits by ~1e-3 relative). f32 is never a plan or CUDA tier.
enum class KvFormat { f16, q8_0, q4_0, f32 };
constexpr KvFormat kv_format(KvType type) {
    return type == KvType::f16 ? KvFormat::f16 : type == KvType::q8_0 ? KvFormat::q8_0 : KvFormat::q4_0;
}
const char* kv_format_name(KvFormat format);

// Bytes of `n_values` values (n_values a multiple of 32 for q8_0 / q4_0). Same value as
// kv_row_bytes() for the tiers; header-only so the codecs depend on nothing else.
constexpr uint64_t kv_bytes(KvFormat format, uint64_t n_values) {
    switch (format) {
        case KvFormat::f16: return n_values * 2;
        case KvFormat::q8_0: return n_values / 32 * 34;
        case KvFormat::q4_0: return n_values / 32 * 18;
        case KvFormat::f32: return n_values * 4;
    }
    return 0;
}
constexpr uint64_t kv_bytes(KvType type, uint64_t n_values) { return kv_bytes(kv_format(type), n_values); }

// Quantize on write / dequantize on read. `n` values; row holds kv_bytes(format, n) bytes.
void kv_store_row(KvFormat format, const float* x, uint8_t* row, size_t n);
void kv_load_row(KvFormat format, const uint8_t* row, float* y, size_t n);

// sum_i q[i] * value_i
float kv_dot(KvFormat format, const uint8_t* row, const float* q, size_t n);
// y[i] += a * value_i
void kv_axpy(KvFormat format, const uint8_t* row, float a, float* y, size_t n);

inline void kv_store_row(KvType t, const float* x, uint8_t* row, size_t n) { kv_store_row(kv_format(t), x, row, n); }
inline void kv_load_row(KvType t, const uint8_t* row, float* y, size_t n) { kv_load_row(kv_format(t), row, y, n); }
inline float kv_dot(KvType t, const uint8_t* row, const float* q, size_t n) { return kv_dot(kv_format(t), row, q, n); }
inline void kv_axpy(KvType t, const uint8_t* row, float a, float* y, size_t n) { kv_axpy(kv_format(t), row, a, y, n); }

}  // namespace spillway
