#pragma once
// GGUF's own block layouts for the types spillway reads and writes, with scalar reference
// quantize/dequantize. Used by make-model, the CPU engine, the KV tiers, and as the
// reference for the CUDA kernels.
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

namespace spillway {

constexpr int kQK8_0 = 32;
constexpr int kQK4_0 = 32;

// d is an IEEE half stored as raw bits.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK8_0];  // value = d * qs[i]
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQK4_0 / 2];  // value i (< 16): (qs[i] & 0xF) - 8; value i + 16: (qs[i] >> 4) - 8; times d
};
static_assert(sizeof(BlockQ4_0) == 18);

// n must be a multiple of the block size. Rounding follows ggml's reference quantizers
// (q8_0: d = amax/127, round to nearest; q4_0: d = max/-8 with the signed max, floor(x/d + 8.5) clamped to 15).
void quantize_row_q8_0(const float* x, BlockQ8_0* y, size_t n);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, size_t n);
void quantize_row_q4_0(const float* x, BlockQ4_0* y, size_t n);
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, size_t n);

// Any supported type (F32, F16, BF16, Q8_0, Q4_0; more as they are added) to f32 / from f32.
// Throws spillway::Error for an unsupported type.
bool is_dequantizable(GgmlType type);
void dequantize_row(GgmlType type, const void* x, float* y, size_t n);
bool is_quantizable(GgmlType type);
void quantize_row(GgmlType type, const float* x, void* y, size_t n);

}  // namespace spillway
