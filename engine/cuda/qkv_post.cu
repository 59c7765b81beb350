#include "engine/cuda/qkv_post.cuh"

#include <algorithm>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/kv_write_device.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

constexpr uint32_t kMaxHeadDim = 256;

// cos / sin of rotated pair i of token t: from the forward's table, or computed (rope.cuh).
__device__ __forceinline__ void token_cos_sin(const RopeDeviceTables& rope, const float2* rope_table,
                                              const int32_t* positions, uint32_t t, uint32_t i, float* cv, float* sv) {
    if (rope_table != nullptr) {
        const float2 cs = rope_table[(size_t)t * (rope.n_dims / 2) + i];
        *cv = cs.x, *sv = cs.y;
    } else {
        rope_cos_sin(rope, positions[t], i, cv, sv);
    }
}

// Bytes of one cell's row of kd values in a tier (kv/kv_codec.h's kv_bytes, on the device).
__device__ __forceinline__ uint64_t cache_row_bytes(KvType type, uint32_t kd) {
    return type == KvType::f16 ? 2ull * kd : (uint64_t)kd / 32 * (type == KvType::q8_0 ? 34 : 18);
}

__device__ __forceinline__ void store_kv(KvType type, float v, uint8_t* row, uint32_t block, uint32_t lane) {
    switch (type) {  // uniform per block
        case KvType::f16: kv_store_block<KvType::f16>(v, row, block, lane); break;
        case KvType::q8_0: kv_store_block<KvType::q8_0>(v, row, block, lane); break;
        case KvType::q4_0: kv_store_block<KvType::q4_0>(v, row, block, lane); break;
    }
}

// One block per (head of q|k|v, token), one thread per value of the head; with gridDim.y <
// n_tokens a block loops over tokens blockIdx.y, + gridDim.y, ... (fewer, longer blocks for
// prefill chunks: 2048 tokens of the 14B shape are 115k blocks of 128 threads otherwise).
__global__ void __launch_bounds__(kMaxHeadDim) qkv_post_kernel(QkvPostShape s, RopeDeviceTables rope, float* q,
                                                               float* k, float* v, const float* __restrict__ bias,
                                                               const int32_t* __restrict__ positions, KvType k_type,
                                                               uint8_t* k_cache, KvType v_type, uint8_t* v_cache,
                                                               uint32_t first_cell, const float2* __restrict__ rope_table,
                                                               uint32_t n_tokens) {
    // A programmatic launch (pdl_launch.cuh) may start before q|k|v's GEMV is done; the
    // attention after this kernel may then be launched (it waits for this grid's writes).
    pdl_wait_for_producer();
    pdl_release_dependents();
    __shared__ float head_vals[kMaxHeadDim];
    const uint32_t e = threadIdx.x, hd = s.head_dim;
    const uint32_t qd = s.n_head * hd, kd = s.n_head_kv * hd;
    const uint32_t h = blockIdx.x;
    const bool is_q = h < s.n_head, is_k = !is_q && h < s.n_head + s.n_head_kv, is_v = !is_q && !is_k;
    const uint32_t kv_head = is_q ? 0 : is_k ? h - s.n_head : h - s.n_head - s.n_head_kv;
    const uint32_t bias_off = is_q ? h * hd : is_k ? qd + kv_head * hd : qd + kd + kv_head * hd;
    const float bias_val = bias != nullptr ? bias[bias_off + e] : 0.0f;
    for (uint32_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
        float* head = is_q ? q + (size_t)t * qd + h * hd : (is_k ? k : v) + (size_t)t * kd + kv_head * hd;
        float val = head[e];
        if (bias != nullptr) val += bias_val;
        if (!is_v) {
            __syncthreads();  // the previous token's readers of head_vals are done
            head_vals[e] = val;
            __syncthreads();
            const uint32_t half = rope.n_dims / 2;
            if (e < rope.n_dims) {
                // Pair (a, b): neox (i, i + half), normal (2i, 2i + 1); this thread is a or b.
                const uint32_t i = rope.neox ? e % half : e / 2;
                const uint32_t a = rope.neox ? i : 2 * i, b = rope.neox ? i + half : 2 * i + 1;
                float cv, sv;
                token_cos_sin(rope, rope_table, positions, t, i, &cv, &sv);
                val = rope_pair_value(head_vals[a], head_vals[b], cv, sv, e == a);
            }
        }
        head[e] = val;
        if (is_q || k_cache == nullptr) continue;
        const uint64_t row_bytes = cache_row_bytes(is_k ? k_type : v_type, kd);
        uint8_t* row = (is_k ? k_cache : v_cache) + (uint64_t)(first_cell + t) * row_bytes;
        store_kv(is_k ? k_type : v_type, val, row, (kv_head * hd + e) / 32, e % 32);
    }
}

// One warp per (head of q|k|v, token), consecutive warps the heads of one token: lane l holds
// dims l + 32j, so a NeoX pair (i, i + half) with half a multiple of 32 sits in one lane and a
// normal pair (2i, 2i + 1) in lanes l and l ^ 1. No shared memory, no barrier, no loop: the
// block kernel above waits on two barriers per token and measured ~3x its memory floor on an
// 8k prefill; this one takes ~25% less time there (perf-notes, session 41). The same
// arithmetic, so the same bits.
// Warps per block: 8 for a chunk; 1 for one token, so that its heads (56 for the 14B shape)
// spread over as many SMs as the block kernel's blocks do.
constexpr uint32_t kMaxWarpsPerBlock = 8;

template <uint32_t kJ>  // values per lane: head_dim / 32
__global__ void __launch_bounds__(kMaxWarpsPerBlock * 32) qkv_post_warp_kernel(
    QkvPostShape s, RopeDeviceTables rope, float* q, float* k, float* v, const float* __restrict__ bias,
    const int32_t* __restrict__ positions, KvType k_type, uint8_t* k_cache, KvType v_type, uint8_t* v_cache,
    uint32_t first_cell, const float2* __restrict__ rope_table, uint32_t n_tokens) {
    pdl_wait_for_producer();
    pdl_release_dependents();
    const uint32_t n_heads = s.n_head + 2 * s.n_head_kv;
    const uint64_t item = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (item >= (uint64_t)n_heads * n_tokens) return;  // whole warps
    const uint32_t t = (uint32_t)(item / n_heads), h = (uint32_t)(item % n_heads), lane = threadIdx.x % 32;
    constexpr uint32_t hd = 32 * kJ;
    const uint32_t qd = s.n_head * hd, kd = s.n_head_kv * hd;
    const bool is_q = h < s.n_head, is_k = !is_q && h < s.n_head + s.n_head_kv, is_v = !is_q && !is_k;
    const uint32_t kv_head = is_q ? 0 : is_k ? h - s.n_head : h - s.n_head - s.n_head_kv;
    const uint32_t bias_off = is_q ? h * hd : is_k ? qd + kv_head * hd : qd + kd + kv_head * hd;
    float* head = is_q ? q + (size_t)t * qd + h * hd : (is_k ? k : v) + (size_t)t * kd + kv_head * hd;
    float x[kJ];
#pragma unroll
    for (uint32_t j = 0; j < kJ; ++j) {
        x[j] = head[lane + 32 * j];
        if (bias != nullptr) x[j] += bias[bias_off + lane + 32 * j];
    }
    float out[kJ];
#pragma unroll
    for (uint32_t j = 0; j < kJ; ++j) out[j] = x[j];
    if (!is_v) {
        const uint32_t half = rope.n_dims / 2, half_j = half / 32;
#pragma unroll
        for (uint32_t j = 0; j < kJ; ++j) {
            const uint32_t e = lane + 32 * j;
            // The pair's other value: another register of this lane (NeoX) or lane ^ 1's.
            float other = __shfl_xor_sync(0xffffffffu, x[j], 1);
            if (rope.neox) {
                const uint32_t jp = e < half ? j + half_j : j - half_j;
#pragma unroll
                for (uint32_t jj = 0; jj < kJ; ++jj)
                    if (jj == jp) other = x[jj];
            }
            if (e >= rope.n_dims) continue;
            const uint32_t i = rope.neox ? e % half : e / 2;
            const bool first = rope.neox ? e < half : e % 2 == 0;
            float cv, sv;
            token_cos_sin(rope, rope_table, positions, t, i, &cv, &sv);
            out[j] = rope_pair_value(first ? x[j] : other, first ? other : x[j], cv, sv, first);
        }
    }
#pragma unroll
    for (uint32_t j = 0; j < kJ; ++j) head[lane + 32 * j] = out[j];
    if (is_q || k_cache == nullptr) return;
    const KvType type = is_k ? k_type : v_type;
    const uint64_t row_bytes = cache_row_bytes(type, kd);
    uint8_t* row = (is_k ? k_cache : v_cache) + (uint64_t)(first_cell + t) * row_bytes;
#pragma unroll
    for (uint32_t j = 0; j < kJ; ++j) store_kv(type, out[j], row, kv_head * kJ + j, lane);
}

template <uint32_t kJ>
void launch_qkv_post_warp(const QkvPostShape& shape, const RopeDeviceTables& rope, float* q, float* k, float* v,
                          const float* bias, uint32_t n_tokens, const int32_t* positions, KvType k_type,
                          uint8_t* k_cache, KvType v_type, uint8_t* v_cache, uint32_t first_cell, cudaStream_t stream,
                          const float2* rope_table) {
    const uint64_t warps = (uint64_t)(shape.n_head + 2 * shape.n_head_kv) * n_tokens;
    const uint32_t per_block = n_tokens == 1 ? 1 : kMaxWarpsPerBlock;
    const uint64_t blocks = (warps + per_block - 1) / per_block;
    if (blocks > 0x7fffffffu) fail("qkv_post_cuda: too many tokens in one launch");
    launch_with_pdl(pdl_site_on(PdlSite::qkv_post), qkv_post_warp_kernel<kJ>, dim3((unsigned)blocks),
                    dim3(per_block * 32), 0, stream, shape, rope, q, k, v, bias, positions, k_type, k_cache,
                    v_type, v_cache, first_cell, rope_table, n_tokens);
}

}  // namespace

bool qkv_post_warp_fits(const QkvPostShape& shape, const RopeDeviceTables& rope) {
    const uint32_t half = rope.n_dims / 2;
    return (shape.head_dim == 64 || shape.head_dim == 128 || shape.head_dim == 256) &&
           (!rope.neox || half % 32 == 0);
}

void qkv_post_cuda(const QkvPostShape& shape, const RopeDeviceTables& rope, float* q, float* k, float* v,
                   const float* bias, uint32_t n_tokens, const int32_t* positions, KvType k_type, uint8_t* k_cache,
                   KvType v_type, uint8_t* v_cache, uint32_t first_cell, cudaStream_t stream,
                   const float2* rope_table, uint32_t max_token_blocks, QkvPostKernel kernel) {
    if (n_tokens == 0) return;
    if (shape.head_dim == 0 || shape.head_dim % 32 != 0 || shape.head_dim > kMaxHeadDim || shape.n_head == 0 ||
        shape.n_head_kv == 0)
        fail("qkv_post_cuda: head_dim must be a positive multiple of 32, at most 256");
    if (rope.n_dims == 0 || rope.n_dims % 2 != 0 || rope.n_dims > shape.head_dim || rope.inv_freq == nullptr)
        fail("qkv_post_cuda: rope n_dims must be even, positive and <= head_dim, with an inv_freq table");
    if ((k_cache == nullptr) != (v_cache == nullptr)) fail("qkv_post_cuda: give both caches or neither");
    // SPILLWAY_QKV_POST=block|warp (lab) forces either kernel where the caller left the choice.
    static const int forced = lab_knob_choice("SPILLWAY_QKV_POST", {"block", "warp"});
    if (kernel == QkvPostKernel::automatic && forced >= 0) kernel = forced == 0 ? QkvPostKernel::block : QkvPostKernel::warp;
    // automatic: the warp kernel for a chunk's tokens only. One decode token measured 0.3-0.9%
    // slower per step with it, as 7 blocks of 8 warps and again as 56 blocks of one warp
    // (session 41, H100): not the spread over SMs, the kernel itself.
    const bool warp = kernel == QkvPostKernel::warp || (kernel == QkvPostKernel::automatic && n_tokens > 1);
    if (warp && qkv_post_warp_fits(shape, rope)) {
        const auto launch = shape.head_dim == 64 ? launch_qkv_post_warp<2>
                          : shape.head_dim == 128 ? launch_qkv_post_warp<4> : launch_qkv_post_warp<8>;
        launch(shape, rope, q, k, v, bias, n_tokens, positions, k_type, k_cache, v_type, v_cache, first_cell, stream,
               rope_table);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        return;
    }
    const uint32_t token_blocks = max_token_blocks == 0 ? n_tokens : std::min(n_tokens, max_token_blocks);
    if (token_blocks > 65535) fail("qkv_post_cuda: more than 65535 token blocks (cap them with max_token_blocks)");
    const dim3 grid(shape.n_head + 2 * shape.n_head_kv, token_blocks);
    launch_with_pdl(pdl_site_on(PdlSite::qkv_post), qkv_post_kernel, grid, dim3(shape.head_dim), 0, stream, shape, rope,
                    q, k, v, bias, positions, k_type, k_cache, v_type, v_cache, first_cell, rope_table, n_tokens);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
