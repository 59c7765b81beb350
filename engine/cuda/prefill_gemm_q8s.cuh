#pragma once
// The chunk GEMM for Q8_0 weights in the split layout on Hopper (sm_90a): y = x Wᵀ with x the
// chunk's f16 activations and W read as its int8 codes and f16 scales, converted to f16 in
// registers (no dequantized weight tile in memory). See prefill_gemm_q8s.cu.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "engine/cuda/cuda_model.h"

namespace spillway {

// Whether the kernel can run here: sm_90a code in this build, an sm_90 GPU with the shared
// memory it needs, and the driver's tensor-map encoder.
bool prefill_gemm_q8s_available();

// Whether prefill_gemm_q8s_cuda takes w (given a 16-byte aligned x): available here, the split
// layout, n_in a multiple of 64, codes 16-byte and scales 4-byte aligned.
bool prefill_gemm_q8s_takes(const CudaMatrix& w);

// How a matrix's rows are covered: the first rows_wide rows in blocks of 128 rows x 256
// tokens, the other rows_narrow in blocks of 128 x 128 (a second launch). Chosen from whole
// waves of blocks on n_sm SMs, a wave of 128-token blocks 2/3 as long as one of 256 (measured):
// one width for all rows, or whole waves of wide blocks and the rest narrow; ties take fewer
// launches and wider blocks.
struct Q8sGemmSplit {
    uint32_t rows_wide = 0, rows_narrow = 0;
};
Q8sGemmSplit prefill_gemm_q8s_split(uint32_t n_tokens, uint32_t n_out, uint32_t n_sm);

// A split over k for GEMMs too small to fill the GPU (at 512 tokens the 14B's wo and down are 80
// blocks of 256 tokens, 0.6 of a wave): `splits` blocks per output tile, each over a part of
// n_in, the first writing (or adding to) y, the others their partial sums to `workspace`
// ((splits - 1) x n_tokens x n_out floats, 16-byte aligned), then one pass adds those to y in
// order (the same bits every run; not the bits of no split). Only for one output whose rows
// all run in 256-token blocks; splits 0: prefill_gemm_q8s_k_splits' choice, 1: none; a
// workspace too small or missing means none.
struct GemmSplitK {
    float* workspace = nullptr;
    size_t workspace_floats = 0;
    uint32_t splits = 1;
};
// Splits (1-4) with the shortest estimated time: whole waves of the split blocks, each a
// 1 / splits share of the stages, plus the partials' pass over memory.
uint32_t prefill_gemm_q8s_k_splits(uint32_t n_tokens, uint32_t n_out, uint32_t n_in, uint32_t n_sm);

// y[t][r] = sum_k x[t][k] * w[r][k] for t < n_tokens, r < w.n_out (add_to_y: y += that, the
// f32 sum rounded once); x: [n_tokens][w.n_in] f16, y: [n_tokens][w.n_out] f32. Each weight
// is d * q rounded once to f16 (as dequantize_rows_f16_cuda gives it), products summed in
// f32; y 16-byte aligned. split: {0, 0} for prefill_gemm_q8s_split's choice, else rows_wide
// + rows_narrow == w.n_out, rows_wide a multiple of 128 where rows_narrow > 0 (an error otherwise). Returns
// false (nothing launched) where it does not apply: !prefill_gemm_q8s_takes(w), or x not
// 16-byte aligned.
bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, float* y, bool add_to_y,
                           cudaStream_t stream, Q8sGemmSplit split = {}, GemmSplitK split_k = {});

// Rows per block of the kernel: where one launch's rows go to several outputs, each output but
// the last holds a multiple of this many.
constexpr uint32_t kQ8sGemmRowBlock = 128;

// One output of a GEMM whose rows go to several buffers (q | k | v, gate | up: matrices kept
// back to back whose results the forward keeps apart): the next `rows` rows of w into
// y [n_tokens][y_stride] (y 16-byte aligned, y_stride >= rows).
struct GemmOutput {
    float* y = nullptr;
    uint32_t rows = 0, y_stride = 0;
};
// The same product with w's rows split over 1 to 3 outputs in order, each but the last a
// multiple of 128 rows, together w.n_out (an error otherwise); one launch (or two, as above)
// for all of them.
bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, std::span<const GemmOutput> outs,
                           bool add_to_y, cudaStream_t stream, Q8sGemmSplit split = {}, GemmSplitK split_k = {});

// The FFN's gate and up products and their SwiGLU in one pass: gate_up holds the gate matrix's
// n_ff rows and then the up matrix's (split layout, back to back), and act [n_tokens][n_ff]
// receives f16(silu(gate . x) * (up . x)) with the bits swiglu_f16_cuda gives from the f32
// products; the f32 gate and up are never written. act must not overlap x (16-byte aligned).
// split: as for prefill_gemm_q8s_cuda, over gate_up's 2 n_ff rows, rows_wide a multiple of 128.
// False (nothing launched) where prefill_gemm_q8s_cuda would decline, or n_ff % 64 != 0.
bool prefill_gemm_q8s_swiglu_cuda(const CudaMatrix& gate_up, const __half* x, uint32_t n_tokens, __half* act,
                                  cudaStream_t stream, Q8sGemmSplit split = {});

}  // namespace spillway
