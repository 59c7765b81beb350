#pragma once
// SwiGLU gate of the Llama/Qwen2 FFN: out = silu(gate) * up, silu(x) = x / (1 + e^-x).
#include <cuda_runtime.h>

#include <cstddef>

namespace spillway {

// n values; device pointers; out may alias gate or up.
void swiglu_cuda(const float* gate, const float* up, float* out, size_t n, cudaStream_t stream);

}  // namespace spillway
