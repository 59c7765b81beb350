#pragma once
// Decode matrix-vector product y = W x for weights in GGUF layout (row-major, each row
// `cols` values in the type's block layout), x and y in f32. A small batch of up to
// kMatvecMaxTokens vectors shares one pass over W (x: [n_tokens][cols], y: [n_tokens][rows]).
// Memory-bound: the kernels aim to read W once at HBM speed (see docs/perf-notes.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "gguf/ggml_types.h"

namespace spillway {

constexpr uint32_t kMatvecMaxTokens = 8;

// F16, BF16 and Q8_0 weights. cols must be a multiple of 32 (Q8_0) or 8 (F16/BF16);
// w must be 16-byte aligned (cudaMalloc gives 256).
bool matvec_supports(GgmlType w_type);
void matvec_cuda(GgmlType w_type, const void* w, const float* x, float* y, uint32_t rows,
                 uint32_t cols, uint32_t n_tokens, cudaStream_t stream);

}  // namespace spillway
