#pragma once
// Weight-type dispatch for the CPU matmul. Each GGUF weight type supplies two row
// kernels in its own file (weights_<type>.cpp): a fused dot product of one stored row with
// an f32 vector (decode: the row is read once, never materialised) and a row dequantizer
// (prefill: a row is expanded once into scratch and reused for every token of the chunk).
// Adding a type (Q4_K, Q6_K) = one new file + one line in weight_kernels.cpp.
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

namespace spillway {

struct WeightKernels {
    GgmlType type;
    float (*dot)(const uint8_t* row, const float* x, size_t n);       // sum_i w_i * x_i
    void (*dequantize)(const uint8_t* row, float* y, size_t n);       // y_i = w_i
};

// nullptr when the CPU engine has no kernels for `type`.
const WeightKernels* find_weight_kernels(GgmlType type);
// Throws spillway::Error naming the type when unsupported.
const WeightKernels& weight_kernels(GgmlType type);

// The per-type tables (defined one per file).
const WeightKernels& weight_kernels_f32();
const WeightKernels& weight_kernels_f16();
const WeightKernels& weight_kernels_bf16();
const WeightKernels& weight_kernels_q8_0();
const WeightKernels& weight_kernels_q4_0();

// f32 dot product with independent partial sums (vectorisable without -ffast-math).
float dot_f32(const float* a, const float* b, size_t n);
// Table lookup half -> float (the branchy exact conversion is too slow for weights).
float fp16_table_to_fp32(uint16_t h);

}  // namespace spillway
