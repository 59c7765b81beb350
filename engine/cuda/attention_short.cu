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
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

using kv_tile::copy_chunk;
using kv_tile::slice_bytes;

constexpr uint32_t kD = 128;  // head dim
constexpr uint32_t kMax = kShortAttentionMaxCells;
// 512 threads: the kernel's chains of dependent steps must be short, because it runs beside
// the GEMV launched behind it. With 128 threads (one per dim) it took ~20 us per layer inside
// the decode step against ~6 us alone (H100, session 51): the next GEMV's warps, launched at
// its release, took most of the SM's issue slots.
constexpr uint32_t kThreads = 512;
constexpr uint32_t kWarps = kThreads / 32;
constexpr uint32_t kSlices = kThreads / kD;  // P V: each dim's cells in this many interleaved slices

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

struct Params {
    ShortAttentionArgs a;
    uint32_t n_head, n_head_kv;
    uint64_t k_row_bytes, v_row_bytes;
    float scale;
    uint32_t lab;  // timing bounds (wrong output): 1 returns after the wait; 2 one block per KV head;
                   // 3 (right output): dependents released at the end, not after the wait
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

// The block's maximum, to every thread (block_sum's shape; kv_warp_max inside each warp).
__device__ __forceinline__ float block_max(float m, float* warp_vals) {
    m = kv_warp_max(m);
    __syncthreads();  // warp_vals' previous readers are done
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = m;
    __syncthreads();
    m = warp_vals[0];
#pragma unroll
    for (uint32_t w = 1; w < kWarps; ++w) m = fmaxf(m, warp_vals[w]);
    return m;
}

// Rows of V staged in shared memory: f16 V is read into registers instead (only the new cell's
// row is staged), which keeps the block at ~35 KB like the quantized tiers. At 66 KB (f16 K and
// V staged) the GEMV launched behind it could not share its SMs: with the dependents released
// right after the wait, tg128 from depth 0 ran 11% slower than the old launches (session 51).
template <KvType VT>
constexpr uint32_t kVRows = VT == KvType::f16 ? 1 : kMax;

template <KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads) attention_short_kernel(Params p) {
    constexpr uint32_t kSK = slice_bytes(KT, kD), kSV = slice_bytes(VT, kD);
    constexpr uint32_t kCK = copy_chunk(kSK), kCV = copy_chunk(kSV);
    constexpr bool kVInRegs = VT == KvType::f16;  // see kVRows
    constexpr uint32_t kPerSlice = kMax / kSlices;
    extern __shared__ __align__(16) uint8_t smem[];
    uint8_t* ks = smem;                                       // [kMax][kSK]: cells' K slices
    uint8_t* vs = ks + kMax * kSK;                            // [kVRows][kSV]
    float* qs = reinterpret_cast<float*>(vs + kVRows<VT> * kSV);  // [kD]: q * scale
    float* ps = qs + kD;                                      // [kMax]: scores, then weights
    float* os = ps + kMax;                                    // [kSlices][kD]: P V by slice
    float* warp_vals = os + kSlices * kD;                     // [2][kWarps]: the max's, the sum's
    const ShortAttentionArgs& a = p.a;
    const uint32_t group = p.n_head / p.n_head_kv;
    const uint32_t h = p.lab == 2 ? blockIdx.x * group : blockIdx.x, t = threadIdx.x, warp = t / 32, lane = t % 32;
    const uint32_t kv_head = h / group;
    const uint32_t n = a.n_cells, settled = n - 1;

    // The cells of earlier steps: copied before the wait for q|k|v (pdl_launch.cuh).
    const uint8_t* k_src = a.k_cache + (size_t)kv_head * kSK;
    const uint8_t* v_src = a.v_cache + (size_t)kv_head * kSV;
    for (uint32_t i = t; i < settled * (kSK / kCK); i += kThreads) {
        const uint32_t c = i / (kSK / kCK), o = i % (kSK / kCK) * kCK;
        kv_tile::cp_async<kCK>(ks + c * kSK + o, k_src + c * p.k_row_bytes + o);
    }
    const uint32_t e = t % kD, slice = t / kD;  // P V's roles: dim e over cells slice, + kSlices, ...
    __half v_regs[kVInRegs ? kPerSlice : 1];
    if constexpr (kVInRegs) {
#pragma unroll
        for (uint32_t i = 0; i < kPerSlice; ++i) {
            const uint32_t c = slice + i * kSlices;
            v_regs[i] = c < settled ? reinterpret_cast<const __half*>(v_src + c * p.v_row_bytes)[e] : __half();
        }
    } else {
        for (uint32_t i = t; i < settled * (kSV / kCV); i += kThreads) {
            const uint32_t c = i / (kSV / kCV), o = i % (kSV / kCV) * kCV;
            kv_tile::cp_async<kCV>(vs + c * kSV + o, v_src + c * p.v_row_bytes + o);
        }
    }
    kv_tile::cp_async_commit();
    pdl_wait_for_producer();
    if (p.lab != 3) pdl_release_dependents();
    if (p.lab == 1) {
        cp_async_wait_all();
        return;
    }

    // Post-QKV (qkv_post's arithmetic, rope_device.cuh) by the first kD threads: value e of q,
    // of the new K and V. The new cell, in the tier's bytes: this block's own rows (read below
    // like any cell) and, by the group's first block, the cache. Warp w holds 32-value block w.
    if (t < kD) {
        const uint32_t qd = p.n_head * kD, kd = p.n_head_kv * kD;  // (e = t here)
        const float qv = post_qkv_value(a.q + (size_t)h * kD, a.bias != nullptr ? a.bias + (size_t)h * kD : nullptr, e,
                                        a.rope_table, a.rope_dims, a.rope_neox);
        const float kv = post_qkv_value(a.k + (size_t)kv_head * kD,
                                        a.bias != nullptr ? a.bias + qd + (size_t)kv_head * kD : nullptr, e,
                                        a.rope_table, a.rope_dims, a.rope_neox);
        const float vv = a.bias != nullptr ? a.v[kv_head * kD + e] + a.bias[qd + kd + kv_head * kD + e]
                                           : a.v[kv_head * kD + e];
        kv_store_block<KT>(kv, ks + settled * kSK, warp, lane);
        kv_store_block<VT>(vv, vs + (kVInRegs ? 0 : settled) * kSV, warp, lane);
        if (h % group == 0) {
            kv_store_block<KT>(kv, a.k_cache + settled * p.k_row_bytes, (kv_head * kD + e) / 32, lane);
            kv_store_block<VT>(vv, a.v_cache + settled * p.v_row_bytes, (kv_head * kD + e) / 32, lane);
        }
        qs[e] = qv * p.scale;
    }
    cp_async_wait_all();
    __syncthreads();

    // Scores: warp w takes cells w, w + kWarps, ... (<= 8 of them), two at a time so that their
    // shuffle chains overlap; lane l dims 4l .. 4l + 3.
    float q4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) q4[i] = qs[4 * lane + i];
    for (uint32_t c = warp; c < n; c += 2 * kWarps) {
        const uint32_t c2 = c + kWarps;
        float x[4], y[4];
        four_values<KT>(ks + c * kSK, lane, x);
        four_values<KT>(ks + (c2 < n ? c2 : c) * kSK, lane, y);
        float s = q4[0] * x[0], s2 = q4[0] * y[0];
#pragma unroll
        for (int i = 1; i < 4; ++i) s = fmaf(q4[i], x[i], s), s2 = fmaf(q4[i], y[i], s2);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        }
        if (lane == 0) {
            ps[c] = s;
            if (c2 < n) ps[c2] = s2;
        }
    }
    __syncthreads();

    // Softmax over the n scores (n <= kMax <= kThreads: thread t holds cell t).
    const float s_t = t < n ? ps[t] : -INFINITY;
    const float m = block_max(s_t, warp_vals);
    const float w_t = t < n ? __expf(s_t - m) : 0.0f;
    if (t < n) ps[t] = w_t;
    const float sum = block_sum(w_t, warp_vals + kWarps, kWarps);  // (its barrier also publishes ps)

    // P V: thread t = dim t % kD over cells t / kD, + kSlices, ...; the slices' sums then added
    // in slice order.
    {
        float acc0 = 0.0f, acc1 = 0.0f;  // two chains: even and odd steps of the slice
        if constexpr (kVInRegs) {
#pragma unroll
            for (uint32_t i = 0; i < kPerSlice; ++i) {
                const uint32_t c = slice + i * kSlices;
                if (c < n) {
                    const float v = c == settled ? one_value<VT>(vs, e) : __half2float(v_regs[i]);
                    if (i % 2 == 0) acc0 = fmaf(ps[c], v, acc0);
                    else acc1 = fmaf(ps[c], v, acc1);
                }
            }
        } else {
            uint32_t c = slice;
            for (; c + kSlices < n; c += 2 * kSlices) {
                acc0 = fmaf(ps[c], one_value<VT>(vs + c * kSV, e), acc0);
                acc1 = fmaf(ps[c + kSlices], one_value<VT>(vs + (c + kSlices) * kSV, e), acc1);
            }
            if (c < n) acc0 = fmaf(ps[c], one_value<VT>(vs + c * kSV, e), acc0);
        }
        os[slice * kD + e] = acc0 + acc1;
    }
    __syncthreads();
    if (p.lab == 3) pdl_release_dependents();  // (lab: released late, the GEMV behind kept out)
    if (t < kD) {
        float o = os[t];
#pragma unroll
        for (uint32_t j = 1; j < kSlices; ++j) o += os[j * kD + t];
        o /= sum;
        a.out[(size_t)h * kD + t] = o;
        if (a.lse != nullptr && t == 0) a.lse[h] = m + logf(sum);
        if (a.out_q16.q != nullptr)
            quantize_act_q16_warp(o, lane, a.out_q16.q + (size_t)h * kD + 32 * warp, a.out_q16.d + (h * kD) / 32 + warp);
    }
}

template <KvType KT, KvType VT>
constexpr size_t smem_bytes() {
    return (size_t)kMax * slice_bytes(KT, kD) + (size_t)kVRows<VT> * slice_bytes(VT, kD) +
           (kD + kMax + kSlices * kD + 2 * kWarps) * sizeof(float);
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
    launch_with_pdl(programmatic && pdl_site_on(PdlSite::attention), attention_short_kernel<KT, VT>,
                    dim3(p.lab == 2 ? p.n_head_kv : p.n_head), dim3(kThreads), smem, stream, p);
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
             kv_row_bytes(v_type, (uint64_t)shape.n_head_kv * kD), shape.scale, 0};
    // SPILLWAY_SHORT_ATTENTION_LAB=empty|kvheads (timing bounds, wrong output) | late (the GEMV
    // behind released at the end).
    static const int lab = lab_knob_choice("SPILLWAY_SHORT_ATTENTION_LAB", {"empty", "kvheads", "late"});
    p.lab = lab < 0 ? 0u : (uint32_t)lab + 1;
    switch (k_type) {
        case KvType::f16: launch_short_v<KvType::f16>(v_type, p, stream, programmatic); break;
        case KvType::q8_0: launch_short_v<KvType::q8_0>(v_type, p, stream, programmatic); break;
        default: launch_short_v<KvType::q4_0>(v_type, p, stream, programmatic); break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
