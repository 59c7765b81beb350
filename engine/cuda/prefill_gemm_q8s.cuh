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
// layout, n_in a multiple of 64, n_out of 4, codes 16-byte and scales 4-byte aligned.
bool prefill_gemm_q8s_takes(const CudaMatrix& w);

// How a matrix's rows are covered: the first rows_wide rows in tiles of 128 rows x 256
// tokens, the other rows_narrow in tiles of 128 x 128 (a second launch). A 128-token tile takes
// 2/3 of a 256-token one's time (measured). Where the launch is balanced (stream-K, see
// GemmWorkspace) and the 256-token tiles are under a wave, the waves do not matter: one width,
// the one with less work. Otherwise chosen from whole waves of tiles on n_sm SMs: one width for
// all rows, or whole waves of wide tiles and the rest narrow; ties take fewer launches and
// wider tiles.
struct Q8sGemmSplit {
    uint32_t rows_wide = 0, rows_narrow = 0;
};
Q8sGemmSplit prefill_gemm_q8s_split(uint32_t n_tokens, uint32_t n_out, uint32_t n_sm, bool balanced = false);

// Where a launch's tiles (128 rows x 128 or 256 tokens) shared between blocks keep their
// partial sums ("stream-K"). Blocks are persistent, one per SM. Where the tiles are fewer than
// a wave, every tile is cut along k into equal shares of stage steps, one share per block, so
// every SM has the same work (the 14B's down at 512 tokens: 80 tiles on 132 SMs). A block that
// holds the end or middle of a tile writes its partial to its slot of `partials` and raises its
// flag; the block holding the tile's first steps adds the later blocks' partials in block order
// (the same bits every run on a GPU of the same SM count) and writes the tile. A wave or more
// takes whole tiles (cutting the tail was measured slower: prefill_gemm_q8s_schedule).
// partials: 16-byte aligned, prefill_gemm_q8s_partial_floats(blocks) floats; flags: one per
// block, zeroed once by the caller, left zero by every launch. Without them (or with room for
// fewer blocks than the launch runs) the blocks take whole tiles only. max_blocks: 0 for one
// per SM; tests give fewer to reach the cut schedules on small shapes. A workspace is used by
// one launch at a time (one stream).
struct GemmWorkspace {
    float* partials = nullptr;
    size_t partial_floats = 0;
    uint32_t* flags = nullptr;
    uint32_t n_flags = 0;
    uint32_t max_blocks = 0;
};
size_t prefill_gemm_q8s_partial_floats(uint32_t blocks);

// The schedule of a launch of n_tiles tiles of n_k stage steps each on at most max_blocks
// blocks: grid blocks; the last sk_tiles tiles cut along k into shares over the first sk_blocks
// blocks, the tiles before them whole, grid apart (a multiple of grid where sk_tiles > 0).
// With stream_k, every tile is cut where there are fewer than max_blocks, each share at least
// 4 steps; otherwise, and without stream_k, whole tiles only.
struct Q8sGemmSchedule {
    uint32_t grid = 0, sk_tiles = 0, sk_blocks = 0;
};
Q8sGemmSchedule prefill_gemm_q8s_schedule(uint32_t n_tiles, uint32_t n_k, uint32_t max_blocks, bool stream_k);

// y[t][r] = sum_k x[t][k] * w[r][k] for t < n_tokens, r < w.n_out (add_to_y: y += that, the
// f32 sum rounded once); x: [n_tokens][w.n_in] f16, y: [n_tokens][w.n_out] f32. Each weight
// is d * q rounded once to f16 (as dequantize_rows_f16_cuda gives it), products summed in
// f32; y 16-byte aligned. split: {0, 0} for prefill_gemm_q8s_split's choice, else rows_wide
// + rows_narrow == w.n_out, rows_wide a multiple of 128 where rows_narrow > 0 (an error otherwise). Returns
// false (nothing launched) where it does not apply: !prefill_gemm_q8s_takes(w), or x not
// 16-byte aligned.
bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, float* y, bool add_to_y,
                           cudaStream_t stream, Q8sGemmSplit split = {}, const GemmWorkspace& ws = {});

// Rows per block of the kernel: where one launch's rows go to several outputs, each output but
// the last holds a multiple of this many.
constexpr uint32_t kQ8sGemmRowBlock = 128;

// One output of a GEMM whose rows go to several buffers (q | k | v, gate | up: matrices kept
// back to back whose results the forward keeps apart): the next `rows` rows of w into
// y [n_tokens][y_stride] (y 16-byte aligned, y_stride >= rows and a multiple of 4: y is written
// by TMA stores).
struct GemmOutput {
    float* y = nullptr;
    uint32_t rows = 0, y_stride = 0;
};
// The same product with w's rows split over 1 to 3 outputs in order, each but the last a
// multiple of 128 rows, together w.n_out (an error otherwise); one launch (or two, as above)
// for all of them.
bool prefill_gemm_q8s_cuda(const CudaMatrix& w, const __half* x, uint32_t n_tokens, std::span<const GemmOutput> outs,
                           bool add_to_y, cudaStream_t stream, Q8sGemmSplit split = {}, const GemmWorkspace& ws = {});

// The FFN's gate and up products and their SwiGLU in one pass: gate_up holds the gate matrix's
// n_ff rows and then the up matrix's (split layout, back to back), and act [n_tokens][n_ff]
// receives f16(silu(gate . x) * (up . x)) with the bits swiglu_f16_cuda gives from the f32
// products; the f32 gate and up are never written. act must not overlap x (16-byte aligned).
// split: as for prefill_gemm_q8s_cuda, over gate_up's 2 n_ff rows, rows_wide a multiple of 128.
// False (nothing launched) where prefill_gemm_q8s_cuda would decline, or n_ff % 64 != 0.
bool prefill_gemm_q8s_swiglu_cuda(const CudaMatrix& gate_up, const __half* x, uint32_t n_tokens, __half* act,
                                  cudaStream_t stream, Q8sGemmSplit split = {}, const GemmWorkspace& ws = {});
// Whether prefill_gemm_q8s_swiglu_cuda takes gate_up (given a 16-byte aligned x): pure, so that a
// caller can size its buffers for the path it will take.
bool prefill_gemm_q8s_swiglu_takes(const CudaMatrix& gate_up);

// The chunk's q|k|v product with the post-QKV work in its epilogue: bias, NeoX RoPE of the q and
// k heads, q out as f32, k and v straight into an f16 cache; the f32 k and v are never written.
// The bits of prefill_gemm_q8s_cuda into q | k | v followed by qkv_post_cuda with the rope table.
struct QkvRopeChunk {
    float* q = nullptr;                  // [n_tokens][n_head * 128], rotated
    __half* k = nullptr;                 // the chunk's first cell's K row of an f16 cache: [n_tokens][n_head_kv * 128]
    __half* v = nullptr;                 // and its V row
    const float* bias = nullptr;         // q|k|v biases back to back, or null
    const float2* rope_table = nullptr;  // [n_tokens][64] (cos, sin): rope_table_cuda's, RoPE over whole heads
    uint32_t n_head = 0, n_head_kv = 0;
};
// Whether prefill_gemm_q8s_qkv_rope_cuda takes wqkv (given a 16-byte aligned x): a tile is one
// head, so head_dim must be 128, and wqkv's rows are q | k | v of those heads.
bool prefill_gemm_q8s_qkv_rope_takes(const CudaMatrix& wqkv, uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim);
// False (nothing launched) where it does not take wqkv or x is not 16-byte aligned; an error for
// missing or unaligned outputs. split: as for prefill_gemm_q8s_cuda, rows_wide a multiple of 128.
bool prefill_gemm_q8s_qkv_rope_cuda(const CudaMatrix& wqkv, const __half* x, uint32_t n_tokens, const QkvRopeChunk& out,
                                    cudaStream_t stream, Q8sGemmSplit split = {}, const GemmWorkspace& ws = {});

}  // namespace spillway
