#include "engine/cuda/attention_short.cuh"

#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/kv_write_device.cuh"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

using kv_tile::copy_chunk;
using kv_tile::slice_bytes;

constexpr uint32_t kD = 128;               // head dim: one thread per dim
constexpr uint32_t kWarps = kD / 32;
constexpr uint32_t kMax = kShortAttentionMaxCells;

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

struct Params {
    ShortAttentionArgs a;
    uint32_t n_head, n_head_kv;
    uint64_t k_row_bytes, v_row_bytes;
    float scale;
};

// Dims 4l .. 4l + 3 of a cell's head slice (l = lane), as f32: f16 as stored, q8_0 / q4_0 as
// d * q with d the block's f16 scale (the CPU codec's dequantization).
template <KvType T>
__device__ __forceinline__ void four_values(const uint8_t* slice, uint32_t l, float (&x)[4]) {
    if constexpr (T == KvType::f16) {
        const uint2 u = *reinterpret_cast<const uint2*>(slice + 8 * l);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
    } else {
        const uint8_t* blk = slice + (l / 8) * (T == KvType::q8_0 ? 34 : 18);
        const float d = __half2float(*reinterpret_cast<const __half*>(blk));
        const uint32_t p = 4 * (l % 8);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (T == KvType::q8_0) {
                x[i] = d * (float)(int8_t)blk[2 + p + i];
            } else {  // q4_0: values 0..15 in the low nibbles of qs[0..15], 16..31 in the high ones
                const uint32_t pos = p + i;
                const int q = pos < 16 ? (blk[2 + pos] & 15) : (blk[2 + pos - 16] >> 4);
                x[i] = d * (float)(q - 8);
            }
        }
    }
}
// Dim e of a cell's head slice, as f32 (the same values as four_values).
template <KvType T>
__device__ __forceinline__ float one_value(const uint8_t* slice, uint32_t e) {
    if constexpr (T == KvType::f16) {
        return __half2float(reinterpret_cast<const __half*>(slice)[e]);
    } else {
        const uint8_t* blk = slice + (e / 32) * (T == KvType::q8_0 ? 34 : 18);
        const float d = __half2float(*reinterpret_cast<const __half*>(blk));
        const uint32_t pos = e % 32;
        if constexpr (T == KvType::q8_0) return d * (float)(int8_t)blk[2 + pos];
        const int q = pos < 16 ? (blk[2 + pos] & 15) : (blk[2 + pos - 16] >> 4);
        return d * (float)(q - 8);
    }
}

__device__ __forceinline__ float block_max(float m, float* warp_vals) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();  // warp_vals' previous readers are done
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = m;
    __syncthreads();
    m = warp_vals[0];
#pragma unroll
    for (uint32_t w = 1; w < kWarps; ++w) m = fmaxf(m, warp_vals[w]);
    return m;
}

template <KvType KT, KvType VT>
__global__ void __launch_bounds__(kD) attention_short_kernel(Params p) {
    constexpr uint32_t kSK = slice_bytes(KT, kD), kSV = slice_bytes(VT, kD);
    constexpr uint32_t kCK = copy_chunk(kSK), kCV = copy_chunk(kSV);
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* ks = smem;                                       // [kMax][kSK]: cells' K slices
    uint8_t* vs = ks + kMax * kSK;                            // [kMax][kSV]
    float* qs = reinterpret_cast<float*>(vs + kMax * kSV);    // [kD]: q * scale
    float* ps = qs + kD;                                      // [kMax]: scores, then weights
    float* warp_vals = ps + kMax;                             // [kWarps]
    const ShortAttentionArgs& a = p.a;
    const uint32_t h = blockIdx.x, e = threadIdx.x, warp = e / 32, lane = e % 32;
    const uint32_t group = p.n_head / p.n_head_kv, kv_head = h / group;
    const uint32_t n = a.n_cells, settled = n - 1;

    // The cells of earlier steps: copied before the wait for q|k|v (pdl_launch.cuh).
    const uint8_t* k_src = a.k_cache + (size_t)kv_head * kSK;
    const uint8_t* v_src = a.v_cache + (size_t)kv_head * kSV;
    for (uint32_t i = e; i < settled * (kSK / kCK); i += kD) {
        const uint32_t c = i / (kSK / kCK), o = i % (kSK / kCK) * kCK;
        kv_tile::cp_async<kCK>(ks + c * kSK + o, k_src + c * p.k_row_bytes + o);
    }
    for (uint32_t i = e; i < settled * (kSV / kCV); i += kD) {
        const uint32_t c = i / (kSV / kCV), o = i % (kSV / kCV) * kCV;
        kv_tile::cp_async<kCV>(vs + c * kSV + o, v_src + c * p.v_row_bytes + o);
    }
    kv_tile::cp_async_commit();
    pdl_wait_for_producer();
    pdl_release_dependents();

    // Post-QKV (qkv_post's arithmetic, rope_device.cuh): value e of q, of the new K and V.
    const uint32_t qd = p.n_head * kD, kd = p.n_head_kv * kD;
    const float qv = post_qkv_value(a.q + (size_t)h * kD, a.bias != nullptr ? a.bias + (size_t)h * kD : nullptr, e,
                                    a.rope_table, a.rope_dims, a.rope_neox);
    const float kv = post_qkv_value(a.k + (size_t)kv_head * kD,
                                    a.bias != nullptr ? a.bias + qd + (size_t)kv_head * kD : nullptr, e, a.rope_table,
                                    a.rope_dims, a.rope_neox);
    const float vv = a.bias != nullptr ? a.v[kv_head * kD + e] + a.bias[qd + kd + kv_head * kD + e]
                                       : a.v[kv_head * kD + e];
    // The new cell, in the tier's bytes: this block's own rows (read below like any cell) and,
    // by the group's first block, the cache. Warp w holds the slice's 32-value block w.
    kv_store_block<KT>(kv, ks + settled * kSK, warp, lane);
    kv_store_block<VT>(vv, vs + settled * kSV, warp, lane);
    if (h % group == 0) {
        kv_store_block<KT>(kv, a.k_cache + settled * p.k_row_bytes, (kv_head * kD + e) / 32, lane);
        kv_store_block<VT>(vv, a.v_cache + settled * p.v_row_bytes, (kv_head * kD + e) / 32, lane);
    }
    qs[e] = qv * p.scale;
    cp_async_wait_all();
    __syncthreads();

    // Scores: warp w takes cells w, w + kWarps, ...; lane l dims 4l .. 4l + 3.
    float q4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q4[i] = qs[4 * lane + i];
    for (uint32_t c = warp; c < n; c += kWarps) {
        float x[4];
        four_values<KT>(ks + c * kSK, lane, x);
        float s = q4[0] * x[0];
        s = fmaf(q4[1], x[1], s);
        s = fmaf(q4[2], x[2], s);
        s = fmaf(q4[3], x[3], s);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) ps[c] = s;
    }
    __syncthreads();

    // Softmax over the n scores (n <= kMax = kD: thread e holds cell e).
    const float s_e = e < n ? ps[e] : -INFINITY;
    const float m = block_max(s_e, warp_vals);
    const float w_e = e < n ? __expf(s_e - m) : 0.0f;
    if (e < n) ps[e] = w_e;
    const float sum = block_sum(w_e, warp_vals, kWarps);  // (its barriers also publish ps)
    __syncthreads();

    // O = sum over cells of w * V: thread e = dim e.
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t c = 0;
    for (; c + 4 <= n; c += 4) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = fmaf(ps[c + i], one_value<VT>(vs + (c + i) * kSV, e), acc[i]);
    }
    for (; c < n; ++c) acc[0] = fmaf(ps[c], one_value<VT>(vs + c * kSV, e), acc[0]);
    const float o = ((acc[0] + acc[1]) + (acc[2] + acc[3])) / sum;
    a.out[(size_t)h * kD + e] = o;
    if (a.lse != nullptr && e == 0) a.lse[h] = m + logf(sum);
    if (a.out_q16.q != nullptr) quantize_act_q16_warp(o, lane, a.out_q16.q + (size_t)h * kD + 32 * warp, a.out_q16.d + (h * kD) / 32 + warp);
}

template <KvType KT, KvType VT>
constexpr size_t smem_bytes() {
    return (size_t)kMax * (slice_bytes(KT, kD) + slice_bytes(VT, kD)) + (kD + kMax + kWarps) * sizeof(float);
}

template <KvType KT, KvType VT>
void launch_short(const Params& p, cudaStream_t stream, bool programmatic) {
    constexpr size_t smem = smem_bytes<KT, VT>();
    static const bool configured = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_short_kernel<KT, VT>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return true;
    }();
    (void)configured;
    launch_with_pdl(programmatic && pdl_site_on(PdlSite::attention), attention_short_kernel<KT, VT>, dim3(p.n_head),
                    dim3(kD), smem, stream, p);
}

template <KvType KT>
void launch_short_v(KvType vt, const Params& p, cudaStream_t stream, bool programmatic) {
    switch (vt) {
        case KvType::f16: return launch_short<KT, KvType::f16>(p, stream, programmatic);
        case KvType::q8_0: return launch_short<KT, KvType::q8_0>(p, stream, programmatic);
        default: return launch_short<KT, KvType::q4_0>(p, stream, programmatic);
    }
}

}  // namespace

bool attention_short_fits(const AttentionShape& s, uint32_t n_cells) {
    return n_cells >= 1 && n_cells <= kShortAttentionMaxCells && s.head_dim_k == kD && s.head_dim_v == kD &&
           s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0;
}

void attention_short_cuda(const AttentionShape& shape, KvType k_type, KvType v_type, const ShortAttentionArgs& a,
                          cudaStream_t stream, bool programmatic) {
    if (!attention_short_fits(shape, a.n_cells))
        fail("attention_short_cuda: takes head dim 128, whole GQA groups and 1.." +
             std::to_string(kShortAttentionMaxCells) + " cells, got dim " + std::to_string(shape.head_dim_k) + " and " +
             std::to_string(a.n_cells) + " cells");
    if (!a.q || !a.k || !a.v || !a.rope_table || !a.k_cache || !a.v_cache || !a.out)
        fail("attention_short_cuda: missing q / k / v, the RoPE table, the cache or the output");
    if (a.rope_dims == 0 || a.rope_dims % 2 != 0 || a.rope_dims > kD)
        fail("attention_short_cuda: rotated dims must be even and at most the head dim");
    if (reinterpret_cast<uintptr_t>(a.k_cache) % 16 != 0 || reinterpret_cast<uintptr_t>(a.v_cache) % 16 != 0)
        fail("attention_short_cuda: K and V cells must be 16-byte aligned");
    if (a.out_q16 && !a.out_q16.d) fail("attention_short_cuda: the quantized output needs its scales");
    Params p{a, shape.n_head, shape.n_head_kv, kv_row_bytes(k_type, (uint64_t)shape.n_head_kv * kD),
             kv_row_bytes(v_type, (uint64_t)shape.n_head_kv * kD), shape.scale};
    switch (k_type) {
        case KvType::f16: launch_short_v<KvType::f16>(v_type, p, stream, programmatic); break;
        case KvType::q8_0: launch_short_v<KvType::q8_0>(v_type, p, stream, programmatic); break;
        default: launch_short_v<KvType::q4_0>(v_type, p, stream, programmatic); break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
