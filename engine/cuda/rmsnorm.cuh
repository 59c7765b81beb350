#pragma once
// RMSNorm over rows, optionally fused with the residual add that precedes it in a
// Llama/Qwen2 block (one pass over the residual stream instead of two).
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

// For each of n_rows rows of dim values: if residual_add is not null, x += residual_add
// (x is the residual stream, updated in place); then out = x / sqrt(mean(x^2) + eps) * weight.
// out may alias neither x nor residual_add. Device pointers; weight: [dim] f32.
void rmsnorm_cuda(float* x, const float* residual_add, const float* weight, float* out,
                  uint32_t n_rows, uint32_t dim, float eps, cudaStream_t stream);

}  // namespace spillway
