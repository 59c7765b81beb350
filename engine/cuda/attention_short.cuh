#pragma once
// Decode attention over a short context (the first kShortAttentionMaxCells cells), fused with
// the step's post-QKV work: q|k|v bias, RoPE of q and the new K, the new cell's K / V write.
// Why: at depth ~0 the two launches it replaces (qkv_post, then the split attention's
// single-tile path: eight barriers, a tile through shared memory, a quantize pass) cost ~6.5 us
// per layer of the f16 decode step and ~9.4 us with q8_0 KV (H100, session 51: tg64 from depth
// 0 ran 5.9% / 8.5% faster with neither launch at all), on bytes that take well under a
// microsecond. Here one block of 512 threads per query head copies the settled cells before the
// dependency wait (f16 V into registers), builds its q and the new cell, and does both products
// on CUDA cores. Measured in the engine (H100, tg128 from depth 0, the old launches -> this):
// f16 176.9 -> 182.5 tok/s (+3.2%), q8_0 174.8 -> 179.2 (+2.5%), q4_0 176.3 -> 176.8 (+0.3%).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant.cuh"
#include "engine/cuda/attention.cuh"
#include "model/model_spec.h"

namespace spillway {

constexpr uint32_t kShortAttentionMaxCells = 128;

struct ShortAttentionArgs {
    const float* q = nullptr;  // raw q|k|v projections of the token (read only): q [n_head][d],
    const float* k = nullptr;  // k and v [n_head_kv][d]
    const float* v = nullptr;
    const float* bias = nullptr;         // q|k|v biases back to back, or null
    const float2* rope_table = nullptr;  // the token's (cos, sin) per rotated pair (rope_table_cuda)
    uint32_t rope_dims = 0;              // even, <= d; dims past it are not rotated
    bool rope_neox = true;
    uint8_t* k_cache = nullptr;  // the layer's cells (16-byte aligned); the new cell is n_cells - 1
    uint8_t* v_cache = nullptr;
    uint32_t n_cells = 0;
    float* out = nullptr;  // [n_head][d]
    float* lse = nullptr;  // [n_head], natural log; may be null
    ActQ16 out_q16;        // optional: out quantized for the Q8_0 output projection
};

// Shapes and lengths the kernel takes: head dim 128 for K and V, whole GQA groups, 1 ..
// kShortAttentionMaxCells cells.
bool attention_short_fits(const AttentionShape& shape, uint32_t n_cells);

// The new cell's K / V go to the cache with the bytes qkv_post_cuda writes; out and lse are the
// attention of the post-QKV q over all n_cells cells. programmatic: launched behind its producer
// (pdl_launch.cuh; the settled cells are copied before the wait). Every CUDA return code checked.
void attention_short_cuda(const AttentionShape& shape, KvType k_type, KvType v_type, const ShortAttentionArgs& args,
                          cudaStream_t stream, bool programmatic = false);

}  // namespace spillway
