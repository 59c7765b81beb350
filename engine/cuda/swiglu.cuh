#pragma once
// SwiGLU gate of the Llama/Qwen2 FFN: out = silu(gate) * up, silu(x) = x / (1 + e^-x).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cuda/act_quant.cuh"

namespace spillway {

// n values; device pointers; out may alias gate or up.
void swiglu_cuda(const float* gate, const float* up, float* out, size_t n, cudaStream_t stream);

// The same values written only quantized for the Q8_0 decode matvec of the down projection
// (act_quant.cuh): the f32 result never goes to memory. n % 32 == 0; gate and up 16-byte aligned.
void swiglu_q16_cuda(const float* gate, const float* up, uint32_t n, ActQ16 out, cudaStream_t stream);
// Lab (bench "q8s hop timeline"): the same launch with global-timer stamps, 4 per block at
// stamps[block * 4 + k]: entry, producer wait returned, the block's thread 0 has formed its
// values, and has stored them (nanoseconds). Returns the number of blocks.
uint32_t swiglu_q16_stamped_cuda(const float* gate, const float* up, uint32_t n, ActQ16 out, cudaStream_t stream,
                                 uint64_t* stamps);
// The SwiGLU rounded to f16 (round to nearest): a prefill chunk's input of the down projection
// GEMM. Computed with the SFU's exp2 and reciprocal (silu_times_f16_out): within a few f32 ulps
// of swiglu_cuda's value before the rounding, so at most one f16 ulp from that value rounded.
void swiglu_f16_cuda(const float* gate, const float* up, __half* out, size_t n, cudaStream_t stream);

}  // namespace spillway
