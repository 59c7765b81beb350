#pragma once
// SwiGLU gate of the Llama/Qwen2 FFN: out = silu(gate) * up, silu(x) = x / (1 + e^-x).
#include <cstddef>

namespace spillway {

void swiglu_cpu(const float* gate, const float* up, float* out, size_t n);

}  // namespace spillway
