#pragma once
// The chunk GEMM for Q8_0 weights in the split layout on Hopper (sm_90a): y = x Wᵀ with x the
// chunk's f16 activations and W read as its int8 codes and f16 scales, converted to f16 in
// registers (no dequantized weight tile in memory). See prefill_gemm_q8s.cu.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/cuda_model.h"

namespace spillway {

// Whether the kernel can run here: sm_90a code in this build, an sm_90 GPU with the shared
// memory it needs, and the driver's tensor-map encoder.
bool prefill_gemm_q8s_available();

// Whether prefill_gemm_q8s_cuda takes w (given a 16-byte aligned x): available here, the split
// layout, n_in a multiple of 64, codes 16-byte and scales 4-byte aligned.
bool prefill_gemm_q8s_takes(const CudaMatrix& w);

// Tokens per block (the N of the block's 128 x N output tile): 128 or 256, the one with the
// shorter estimated run for this many tokens and rows on n_sm SMs (whole waves of blocks, a
// wave of 128-token blocks 2/3 as long as one of 256, as measured); ties take 256.
uint32_t prefill_gemm_q8s_block_tokens(uint32_t n_tokens, uint32_t n_out, uint32_t n_sm);

// y[t][r] = sum_k x[t][k] * w[r][k] for t < n_tokens, r < w.n_out (add_to_y: y += that, the
// f32 sum rounded once); x: [n_tokens][w.n_in] f16, y: [n_tokens][w.n_out] f32. Each weight
// is d * q rounded once to f16 (as dequantize_rows_f16_cuda gives it), products summed in
// f32. block_tokens: 0 for prefill_gemm_q8s_block_tokens' choice, else 128 or 256. Returns
// false (nothing launched) where it does not apply: !prefill_gemm_q8s_takes(w), or x not
// 16-byte aligned.
bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, float* y, bool add_to_y,
                           cudaStream_t stream, uint32_t block_tokens = 0);

}  // namespace spillway
