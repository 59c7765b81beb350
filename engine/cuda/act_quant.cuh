#pragma once
// Activations quantized for the Q8_0 decode matvec: x split into blocks of 32 values, each
// stored as int16 q with one f32 scale d (x ~= d * q, d = amax / 32767, q = round-half-even
// (x / d)). Why int16 and not int8 like llama.cpp: int8 moves every Q8_0 product by ~5e-3
// relative (measured, docs/perf-notes.md), which the CPU reference, the f16 prefill GEMM and
// the tests' tolerances would all have to follow; int16 moves it by ~2e-5 (below the f32
// summation error of a 5120-long dot product) while keeping the matvec on integer dot
// products (__dp2a: two 16x8-bit products per instruction) and x small enough for shared
// memory (2 bytes per value instead of 4). The producer of an activation (rmsnorm, swiglu)
// writes it quantized so the matvec blocks need not each re-quantize all of x.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

constexpr uint32_t kActBlock = 32;       // values per scale
constexpr float kActQ16Max = 32767.0f;

// Device pointers of one quantized activation vector of n values (n % 32 == 0):
// q [n] int16, d [n / 32] f32.
struct ActQ16 {
    int16_t* q = nullptr;
    float* d = nullptr;
    explicit operator bool() const { return q != nullptr; }
};

// q, d := x quantized (n_tokens rows of n values each, n % 32 == 0; row t at q + t * n, d + t * n / 32).
void quantize_act_q16_cuda(const float* x, uint32_t n, uint32_t n_tokens, ActQ16 out, cudaStream_t stream);

}  // namespace spillway
