#pragma once
// RMSNorm over rows, optionally fused with the residual add that precedes it in a
// Llama/Qwen2 block (one pass over the residual stream instead of two), and optionally
// writing its output also quantized for the Q8_0 decode matvec (act_quant.cuh), so that
// the next matvec needs no quantizing pass of its own.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"

namespace spillway {

// For each of n_rows rows of dim values: if residual_add is not null, x += residual_add
// (x is the residual stream, updated in place); then out = x / sqrt(mean(x^2) + eps) * weight.
// out may alias neither x nor residual_add. Device pointers; weight: [dim] f32.
// q_out (optional; dim % 32 == 0): out quantized to int16 blocks as well, row r at
// q_out.q + r * dim, q_out.d + r * dim / 32.
// out_f16 (optional): out rounded to f16 (round to nearest, as a separate conversion would),
// row r at out_f16 + r * dim: a prefill chunk's GEMM input. out may then be null (no f32 out).
void rmsnorm_cuda(float* x, const float* residual_add, const float* weight, float* out,
                  uint32_t n_rows, uint32_t dim, float eps, cudaStream_t stream, ActQ16 q_out = {},
                  __half* out_f16 = nullptr);

}  // namespace spillway
