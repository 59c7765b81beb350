#pragma once
// The step between the QKV projection and attention, fused: bias add, RoPE of the q and k
// heads, and the K/V write into the cache, in one launch instead of four (add_bias, rope,
// kv_write K, kv_write V; each ~2 us of mostly launch latency for one token). Same arithmetic
// as those kernels: the cache bytes equal kv_write_cuda's (and so the CPU codec's).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/rope.cuh"
#include "model/model_spec.h"

namespace spillway {

struct QkvPostShape {
    uint32_t n_head = 0, n_head_kv = 0, head_dim = 0;  // head_dim % 32 == 0, <= 256; K and V dims equal
};

// q [n_tokens][n_head*head_dim], k and v [n_tokens][n_head_kv*head_dim], f32, updated in place:
// += bias (bias = q|k|v biases back to back, or null), then RoPE on q and k. When k_cache is
// not null, token t's K and V rows then go to cell first_cell + t of k_cache / v_cache in the
// tiers' formats. Device pointers. rope_table (optional): the forward's cos/sin table of
// rope_table_cuda for these tokens (bit-identical to computing them here).
// kernel: `warp` (one warp per head and token) where qkv_post_warp_fits, else `block` (one
// block per head, one thread per value, looping over tokens; the first version, and the only
// one for NeoX RoPE over a part of the head that is not whole 32-value groups); `automatic`:
// warp for chunks, block for one token (measured, qkv_post.cu), or what SPILLWAY_QKV_POST=
// block|warp (lab) says. Both kernels give the same bits. max_token_blocks (block kernel; 0 =
// one per token): at most that many blocks per head along the tokens, each looping.
enum class QkvPostKernel { automatic, block, warp };
bool qkv_post_warp_fits(const QkvPostShape& shape, const RopeDeviceTables& rope);
void qkv_post_cuda(const QkvPostShape& shape, const RopeDeviceTables& rope, float* q, float* k, float* v,
                   const float* bias, uint32_t n_tokens, const int32_t* positions, KvType k_type, uint8_t* k_cache,
                   KvType v_type, uint8_t* v_cache, uint32_t first_cell, cudaStream_t stream,
                   const float2* rope_table = nullptr, uint32_t max_token_blocks = 0,
                   QkvPostKernel kernel = QkvPostKernel::automatic);

}  // namespace spillway
