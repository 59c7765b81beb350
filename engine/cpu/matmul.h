#pragma once
// y = x W^T for a GGUF weight matrix of any supported type (see weight_kernels.h), split
// by output rows across the thread pool.
#include <cstddef>
#include <cstdint>

#include "engine/cpu/thread_pool.h"
#include "engine/cpu/weight_kernels.h"

namespace spillway {

// A weight matrix as GGUF stores it: n_out rows of n_in values (ne[0] = n_in).
struct WeightMatrix {
    GgmlType type = GgmlType::F32;
    const uint8_t* data = nullptr;
    uint32_t n_in = 0;
    uint32_t n_out = 0;
    uint64_t row_bytes = 0;
    const WeightKernels* kernels = nullptr;

    const uint8_t* row(uint32_t r) const { return data + (uint64_t)r * row_bytes; }
    uint64_t bytes() const { return row_bytes * n_out; }
};

// Throws spillway::Error when the type is unsupported or n_in is not a whole number of blocks.
WeightMatrix make_weight_matrix(GgmlType type, const uint8_t* data, uint32_t n_in, uint32_t n_out);

// y[t * n_out + r] = dot(row r, x + t * n_in) (+ bias[r]) for t < n_tokens.
// scratch: pool.size() * n_in floats, used when n_tokens > 1 (one dequantised row per thread).
void matmul_cpu(ThreadPool& pool, const WeightMatrix& w, const float* x, uint32_t n_tokens,
                const float* bias, float* y, float* scratch);

// out = row r of w as f32 (embedding lookup).
void weight_row_f32(const WeightMatrix& w, uint32_t r, float* out);

}  // namespace spillway
