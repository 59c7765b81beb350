#pragma once
// Prefill building blocks: weight matrix products for a chunk of tokens on tensor cores
// (cuBLAS, f16 operands, f32 accumulation and output), and causal attention of a chunk of
// query tokens over the KV cache or a range of it (any tier pair; tensor cores by default).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/cpu/attention.h"
#include "engine/cuda/cuda_model.h"
#include "engine/cuda/prefill_gemm_q8s.cuh"

namespace spillway {

// y[t][r] = dot(row r of w, x[t]) for t < n_tokens. x: [n_tokens][w.n_in] f32; y:
// [n_tokens][w.n_out] f32. act_f16 holds n_tokens * n_in halves; w_tile holds w_tile_elems
// halves: Q8_0 / BF16 weights are dequantized to f16 a tile of rows at a time (F16 weights
// are used in place), so the scratch stays bounded for any matrix (the 152k-row head too).
void matmul_prefill_cuda(cublasHandle_t cublas, const CudaMatrix& w, const float* x, uint32_t n_tokens, float* y,
                         __half* act_f16, __half* w_tile, size_t w_tile_elems, cudaStream_t stream,
                         const char* op_label = "gemm");

// The engine's chunk GEMMs: x converted to f16 once per distinct input (q, k and v share
// it), and with two weight tiles a side stream dequantizes tile j + 1 while cuBLAS
// multiplies tile j (events order the tiles' reuse; the main stream waits for every tile it
// reads, so the side stream's work is joined by the end of each GEMM).
struct PrefillGemmScratch {
    __half* act_f16 = nullptr;               // [n_tokens][n_in] of the current x
    __half* tiles[2] = {nullptr, nullptr};   // tiles[1] == nullptr: one tile, no side stream
    size_t tile_elems = 0;                   // halves per tile
    cudaStream_t side = nullptr;             // dequantizes (with two tiles)
    cudaEvent_t dequant_done[2] = {nullptr, nullptr};
    cudaEvent_t gemm_done[2] = {nullptr, nullptr};
    uint32_t next_tile = 0;                  // alternates across calls
    bool greedy_tiles = false;               // lab: fill the tile, remainder last (was the default)
    // Where the codes GEMM's tiles cut along k keep their partial sums (prefill_gemm_q8s.cuh's
    // GemmWorkspace): memory dead while the chunk GEMMs run, or none (whole tiles only).
    GemmWorkspace gemm_workspace;
};
// x [n_tokens][n_in] f32 -> scratch.act_f16.
void prefill_act_to_f16_cuda(const float* x, size_t n, __half* act_f16, cudaStream_t stream);
// Whether the chunk GEMMs read w's int8 codes directly (split-layout Q8_0 on Hopper:
// prefill_gemm_q8s.cuh) instead of dequantizing it tile by tile into the scratch's f16 tiles;
// such a matrix needs no tile. SPILLWAY_PREFILL_GEMM=cublas (lab) says no for every matrix.
bool prefill_gemm_reads_codes(const CudaMatrix& w);
// y = W x through the codes GEMM alone, with W's rows split over outs (prefill_gemm_q8s.cuh's
// GemmOutput: q | k | v or gate | up in one launch); x already in scratch.act_f16. False, with
// nothing launched, where prefill_gemm_reads_codes(w) is false or the GEMM does not take it.
bool matmul_prefill_codes_cuda(const CudaMatrix& w, uint32_t n_tokens, std::span<const GemmOutput> outs,
                               PrefillGemmScratch& sc, cudaStream_t stream, bool add_to_y = false);
// y = W x with x already in scratch.act_f16; add_to_y: y += W x (cuBLAS's beta = 1: the f32
// sum rounds once, as a separate residual add of W x would).
void matmul_prefill_f16act_cuda(cublasHandle_t cublas, const CudaMatrix& w, uint32_t n_tokens, float* y,
                                PrefillGemmScratch& scratch, cudaStream_t stream, const char* op_label = "gemm",
                                bool add_to_y = false);
// Rows per weight tile for an n_out x n_in matrix and a tile of tile_elems halves: the fewest
// tiles that fit, their rows balanced and rounded up to 128 (tensor-core friendly) where that
// still fits; 0 when not even one row fits. greedy: as many rows as fit (multiples of 128),
// the remainder in a last, smaller tile (a 13824-row matrix in 64 MiB: 6528, 6528, 768).
uint32_t prefill_tile_rows(uint32_t n_out, uint32_t n_in, size_t tile_elems, bool greedy = false);
// Halves of the weight tile that chunks over these matrices ({n_out, n_in} each) need with a
// cap of cap_elems: the largest tile prefill_tile_rows gives any of them, so every matrix keeps
// the tiling the cap gives it and no tile holds unused space (the 14B shape: 25.0M halves, its
// 5120 x 5120 projections, against a 32M cap). 0 for no matrices.
size_t prefill_tile_elems(const std::vector<std::pair<uint32_t, uint32_t>>& shapes, size_t cap_elems,
                          bool greedy = false);
// Whether a chunk of max_tokens dequantizes the next weight tile on a side stream while cuBLAS
// multiplies the current one (a second tile of scratch): only above 1024 tokens. Measured on
// H100s (perf-notes, session 41): 512-token chunks 0-1.2% faster with one tile, 1024 the same
// either way, 2048 0.9% faster with two. SPILLWAY_PREFILL_OVERLAP=0|1 (lab) forces it.
bool prefill_overlaps_dequant(uint32_t max_tokens);

// Rows [r0, r0 + n_rows) of w as f16, row-major [n_rows][w.n_in].
void dequantize_rows_f16_cuda(const CudaMatrix& w, uint32_t r0, uint32_t n_rows, __half* out, cudaStream_t stream);

// Causal attention of a chunk over one range of cells, as a partial (engine/cpu/attention.h's
// contract): query token t (position pos0 + t) attends cells [cell_begin, cell_begin + n_cells)
// whose index is <= pos0 + t. k_cells / v_cells point at cell cell_begin (rows in the layer's
// layout). q: [n_tokens][n_head][dk] f32; out: [n_tokens][n_head][dv] f32, normalised within
// the range; lse: [n_tokens][n_head], natural-log log-sum-exp of the scaled scores, or nullptr.
// A token that sees no cell of the range gets out = 0 and lse = -inf (the merge identity).
// Two ranges merged with attention_merge give the attention over their union. k_cells /
// v_cells must be 16-byte aligned for f16 (cp.async of 16 bytes), 8 for q8_0/q4_0 at head
// dim 128 and 4 at 64 (cudaMalloc'd layers and rows of whole cells always are).
// out_f16 (optional, 4-byte aligned): the output may go there as f16 instead of `out` (the wgmma
// kernels can: the wo GEMM's input without a conversion pass); true when it did.
bool prefill_attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                    KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                    uint32_t pos0, uint32_t n_tokens, float* out, float* lse, cudaStream_t stream,
                                    __half* out_f16 = nullptr);

// The kernels behind prefill_attention_partial_cuda: `simt` (CUDA cores, one block per KV
// head and token; the first version, kept as a second implementation), `tensor_core`
// (flash-attention style on mma.sync, 64 query rows per block, 3 blocks per SM) and
// `tensor_core_wide` (128 rows per block: half the K/V reads and tile dequantizations per
// row), `tensor_core_m32` (FlashAttention-2's tiling: 128 rows per block on 4 warps, 32 per
// warp, so every K/V fragment read from shared memory feeds twice the MMAs; Q staged in shared
// memory; 2 blocks per SM; on sm_90+ a deep chunk's row blocks are split over a cluster of
// 2, 4 or 8 CTAs when that fills the last wave better, merged in distributed shared memory),
// `tensor_core_m32_wide` (the same with 8 warps, 256 rows per block) and
// `tensor_core_m32_unsplit` (the 4-warp one never split). All take every K/V tier pair;
// results differ by f16 rounding only. The m32 kernels need 104 / 139 KB of shared memory
// per block at D = 128: on GPUs that grant less (sm_86 / sm_89: 99 KB) they run as
// `tensor_core_wide`. `tensor_core_wgmma` (prefill_attention_wgmma.cuh): Hopper's warpgroup
// MMA, 128 rows per block on two warpgroups, 128-cell tiles; head dim 128 only, and only in an
// sm_90a build on an sm_90 GPU (else it runs as `tensor_core_m32`).
enum class PrefillAttentionKernel {
    simt,
    tensor_core,
    tensor_core_wide,
    tensor_core_m32,
    tensor_core_m32_wide,
    tensor_core_m32_unsplit,
    tensor_core_wgmma  // Hopper wgmma (head dim 128, sm_90a build on an sm_90 GPU; else as tensor_core_m32)
};
const char* prefill_attention_kernel_name(PrefillAttentionKernel kernel);
// The default choice, a pure function of the shape, the tiers, the chunk and n_cells (the cells
// of the range its last token sees). f16/f16: the 4-warp 16-row `tensor_core` for chunks of at
// most 2560 query rows per KV head (512 tokens of the 14B shape) over fewer than 8192 cells
// (8k prompt in 512-token chunks: 205 vs 180 TFLOP/s unsplit m32, run P-2), `tensor_core_m32`
// otherwise (64k / 2048: 301 vs 264 for the wide 16-row kernel; 64k / 512: 253); quantized K
// or V: `tensor_core_m32_wide` (64k / 2048, q8_0 / q4_0: 230 / 237 vs 185 / 197). With `wgmma`
// (the kernel is available: prefill_attention_wgmma_available) and head dim 128, every tier
// pair takes `tensor_core_wgmma`, faster at every chunk, depth and tier measured (f16 64k /
// 2048: 480 vs 304 TFLOP/s; 8k / 512: 279 vs 204; q4_0 262 vs 238; q8_0 230 vs 230).
PrefillAttentionKernel prefill_attention_kernel_for(const AttentionShape& shape, KvType k_type, KvType v_type,
                                                    uint32_t n_tokens, uint32_t n_cells, bool wgmma = false);
// out_f16: as for prefill_attention_partial_cuda (the wgmma kernel takes it, the others write
// `out`); true when the output went there.
bool prefill_attention_partial_cuda_with(PrefillAttentionKernel kernel, const AttentionShape& shape, const float* q,
                                         KvType k_type, const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                                         uint32_t cell_begin, uint32_t n_cells, uint32_t pos0, uint32_t n_tokens,
                                         float* out, float* lse, cudaStream_t stream, __half* out_f16 = nullptr);

// Rows [0, n_rows) of a quantized (q8_0 / q4_0) cache layer as f16 rows of row_values
// halves: each value d * q rounded once to f16, as the attention kernels dequantize their
// tiles. row_values % 32 == 0; out 16-byte aligned.
void kv_rows_to_f16_cuda(KvType type, const uint8_t* rows, uint64_t row_bytes, uint32_t n_rows, uint32_t row_values,
                         __half* out, cudaStream_t stream);

// Scratch of prefill_attention_cuda's path for quantized K or V: the layer's cells are
// dequantized piece by piece into f16 rows and each piece is attended by the f16 kernel, its
// partial merged into the output. Every prefill attention kernel is faster on f16 tiles than
// on quantized ones, which each of a KV head's ~80 row blocks dequantizes again (64k / 2048:
// wgmma f16 480 TFLOP/s, q8_0 230); one pass per piece costs a few percent of that.
struct PrefillKvF16Scratch {
    __half* k = nullptr;  // piece_cells rows of n_head_kv * head_dim_k halves (K quantized)
    __half* v = nullptr;  // the same for V (V quantized)
    uint32_t piece_cells = 0;
    // Only needed when the cells span more than one piece:
    float* piece_out = nullptr;  // [n_tokens][n_head][dv]: a later piece's partial
    float* piece_lse = nullptr;  // [n_tokens][n_head]
    float* lse = nullptr;        // [n_tokens][n_head]: the running partial's
};
// Cells per piece for rows of row_values halves: 32 MiB of f16 per operand, a multiple of
// 128 in [1024, 65536].
uint32_t prefill_kv_f16_piece_cells(uint32_t row_values);

// Causal attention for query tokens at positions pos0 .. pos0 + n_tokens - 1, whose K/V
// are already in the cache: token t attends to cells [0, pos0 + t]. q: [n_tokens][n_head][dk]
// f32; out: [n_tokens][n_head][dv] f32; k_cells / v_cells: the layer's cells from cell 0.
// Head dims 64 or 128, dk == dv, n_head / n_head_kv <= 16. = the partial over [0, pos0 + T).
// f16: with quantized K or V, dequantized pieces (above); its buffers must hold the pieces
// and n_tokens' partials. nullptr: the kernels read the quantized cells themselves.
// out_f16: as for prefill_attention_partial_cuda, when the cells are one partial (f16 K and V,
// or one dequantized piece); true when the output went there.
bool prefill_attention_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                            KvType v_type, const uint8_t* v_cells, uint32_t pos0, uint32_t n_tokens, float* out,
                            cudaStream_t stream, const PrefillKvF16Scratch* f16 = nullptr, __half* out_f16 = nullptr);

}  // namespace spillway
