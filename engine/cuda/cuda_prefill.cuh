#pragma once
// Prefill building blocks: weight matrix products for a chunk of tokens on tensor cores
// (cuBLAS, f16 operands, f32 accumulation and output), and causal attention of a chunk of
// query tokens over the KV cache (any tier; CUDA cores in this first version).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/cpu/attention.h"
#include "engine/cuda/cuda_model.h"

namespace spillway {

// y[t][r] = dot(row r of w, x[t]) for t < n_tokens. x: [n_tokens][w.n_in] f32; y:
// [n_tokens][w.n_out] f32. act_f16 holds n_tokens * n_in halves; w_tile holds w_tile_elems
// halves: Q8_0 / BF16 weights are dequantized to f16 a tile of rows at a time (F16 weights
// are used in place), so the scratch stays bounded for any matrix (the 152k-row head too).
void matmul_prefill_cuda(cublasHandle_t cublas, const CudaMatrix& w, const float* x, uint32_t n_tokens, float* y,
                         __half* act_f16, __half* w_tile, size_t w_tile_elems, cudaStream_t stream);

// Rows [r0, r0 + n_rows) of w as f16, row-major [n_rows][w.n_in].
void dequantize_rows_f16_cuda(const CudaMatrix& w, uint32_t r0, uint32_t n_rows, __half* out, cudaStream_t stream);

// Causal attention for query tokens at positions pos0 .. pos0 + n_tokens - 1, whose K/V
// are already in the cache: token t attends to cells [0, pos0 + t]. q: [n_tokens][n_head][dk]
// f32; out: [n_tokens][n_head][dv] f32; k_cells / v_cells: the layer's cells from cell 0.
// Head dims 64 or 128, dk == dv, n_head / n_head_kv <= 16.
void prefill_attention_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                            KvType v_type, const uint8_t* v_cells, uint32_t pos0, uint32_t n_tokens, float* out,
                            cudaStream_t stream);

}  // namespace spillway
