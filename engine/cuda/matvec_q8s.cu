// Q8_0 decode GEMV on the split layout (matvec_q8s.cuh).
//
// Floors (H200 HBM read ~4.5 TB/s): bytes = 1.0625 per weight (27.9 MB for 5120x5120: 6.2 us;
// 150.4 MB for 27648x5120: 33.4 us; the 827 MB head: 184 us). Per 16 codes of a row a lane
// issues a 16-byte and a 2-byte load, 8 __dp2a, an I2F, a scale conversion, an FMUL and an
// FFMA (x's two 16-byte shared loads and its scale serve both rows): ~14 warp instructions
// per 512 bytes of W, ~12% of an SM's issue slots at its share of full HBM speed. So
// bandwidth, latency and the launch's ramp and tail are the limits, not arithmetic.
#include "engine/cuda/matvec_q8s.cuh"

#include <cuda/atomic>
#include <cuda_fp16.h>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cp_async_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/gemv_shared.cuh"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/q8_0_q16_device.cuh"
#include "engine/cuda/kv_write_device.cuh"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

constexpr uint32_t kMaxCols = 32768;  // x in shared memory: 2.125 B per column, <= 68 KB
constexpr uint32_t kUnitCols = 512;   // a unit: 16 codes per lane of one row pair

// x (int16 codes, then the f32 block scales) into the block's shared memory, by all of its
// threads; returns when every thread's copies have landed. while_copying runs after the
// copies went out, before the wait.
template <typename WhileCopying>
__device__ __forceinline__ void copy_x_to_shared(const int16_t* xq, const float* xd, uint32_t cols, uint4* smem,
                                                 uint32_t n_threads, WhileCopying while_copying) {
    uint8_t* dst = reinterpret_cast<uint8_t*>(smem);
    const uint32_t q_vecs = cols * 2 / 16, d_vecs = cols / 8 / 16;
    for (uint32_t i = threadIdx.x; i < q_vecs; i += n_threads)
        cp_async16(dst + 16 * i, reinterpret_cast<const uint8_t*>(xq) + 16 * i);
    for (uint32_t i = threadIdx.x; i < d_vecs; i += n_threads)
        cp_async16(dst + cols * 2 + 16 * i, reinterpret_cast<const uint8_t*>(xd) + 16 * i);
    cp_async_commit();
    while_copying();
    cp_async_wait<0>();
    __syncthreads();
}
__device__ __forceinline__ void copy_x_to_shared(const int16_t* xq, const float* xd, uint32_t cols, uint4* smem,
                                                 uint32_t n_threads) {
    copy_x_to_shared(xq, xd, cols, smem, n_threads, [] {});
}

// Why this shape: the q16x kernel (matvec.cu) stages W through a shared-memory ring because
// GGUF's 68-byte block pairs cannot be read with aligned vectors; the f16 GEMV, which loads
// 16-byte vectors straight into registers, reads the head at 97% of HBM where q16x reaches
// 89-92%. Here a lane's 16 codes are one aligned load and its block's scale one 2-byte load,
// kUnroll units ahead per row: no ring, no cp.async bookkeeping, more warps per SM.
// Warp w owns units [w * U / W, (w + 1) * U / W) of the row-pair-major order (a unit = 512
// columns of a row pair), so every resident warp gets floor or ceil of the average. A row
// pair cut between warps: each warp whose range starts inside a pair publishes its partial
// sums of that pair in carry[w] (value and a "set" tag in one 64-bit word, no fence); the
// warp holding the pair's first unit adds the later warps' parts in warp order after its
// loop, clears their slots and writes y: the sum order is fixed, results do not depend on
// timing.
// kPipe: two register groups; the next group's loads go out before the current group is summed.
// kStreaming: W loads marked evict-first (ld.global.cs), else read-only-path loads (ld.global.nc).
template <int kWarpsPB, int kUnroll, int kMinBlocks, bool kPipe, bool kStreaming = true>
__global__ void __launch_bounds__(kWarpsPB * 32, kMinBlocks) matvec_q8s_kernel(
    const uint4* __restrict__ codes, const unsigned short* __restrict__ scales, const int16_t* __restrict__ xq,
    const float* __restrict__ xd, float* __restrict__ y, uint32_t rows, uint32_t cols, uint32_t n_warps,
    unsigned long long* __restrict__ carry, uint32_t release_at_entry) {
    if (release_at_entry) pdl_release_dependents();
    extern __shared__ uint4 q8s_smem[];  // x: q [cols] int16, then d [cols / 32] f32
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t gw = blockIdx.x * kWarpsPB + threadIdx.x / 32;
    const uint32_t segs = cols / kUnitCols;
    const uint32_t total = (rows + 1) / 2 * segs;
    const uint32_t u0 = gw < n_warps ? (uint32_t)((uint64_t)gw * total / n_warps) : total;
    const uint32_t u1 = gw < n_warps ? (uint32_t)((uint64_t)(gw + 1) * total / n_warps) : total;
    const uint32_t row_vecs = cols / 16, row_blocks = cols / 32;

    struct Group {  // one group's registers: kUnroll units x 2 rows
        uint4 w[kUnroll][2];
        unsigned short d[kUnroll][2];
    };
    Group s0, s1;
    // The load cursor (unit = pair * segs + seg); groups are loaded in unit order.
    uint32_t load_pair = u0 / segs, load_seg = u0 % segs;
    auto load_group = [&](Group& s, uint32_t first) {
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
            if (first + i < u1) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t row = min(2 * load_pair + r, rows - 1);
                    const uint4* wp = codes + (size_t)row * row_vecs + load_seg * 32 + lane;
                    const unsigned short* dp = scales + (size_t)row * row_blocks + load_seg * 16 + lane / 2;
                    if constexpr (kStreaming) {
                        s.w[i][r] = __ldcs(wp);
                        s.d[i][r] = __ldcs(dp);
                    } else {
                        s.w[i][r] = __ldg(wp);
                        s.d[i][r] = __ldg(dp);
                    }
                }
                if (++load_seg == segs) load_seg = 0, ++load_pair;
            }
        }
    };
    // W does not depend on the kernel before us (x's producer): with programmatic dependent
    // launch this block may run while that kernel still does, so W goes out before the wait.
    load_group(s0, u0);
    if constexpr (kPipe) {
        if (u0 + kUnroll < u1) load_group(s1, u0 + kUnroll);
    }
    pdl_wait_for_producer();
    copy_x_to_shared(xq, xd, cols, q8s_smem, kWarpsPB * 32);
    const uint4* x_q = q8s_smem;
    const float* x_d = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(q8s_smem) + cols * 2);

    float acc[2] = {0.0f, 0.0f};
    uint32_t pair = u0 / segs, seg = u0 % segs;
    const uint32_t first_pair = pair;
    auto sum_group = [&](const Group& s, uint32_t g) {
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
            if (g + i >= u1) break;
            // This lane's 16 codes: columns seg * 512 + 16 * lane .. + 15, block seg * 16 + lane / 2.
            const uint4 xa = x_q[seg * 64 + 2 * lane], xb = x_q[seg * 64 + 2 * lane + 1];
            const float xs = x_d[seg * 16 + lane / 2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // x values 0-7 are xa's int16 pairs, codes 0-7 the bytes of w.x, w.y; 8-15 xb, w.z, w.w.
                const uint4 w = s.w[i][r];
                const int isum = dot8_q16_q8(xb, (int)w.z, (int)w.w, dot8_q16_q8(xa, (int)w.x, (int)w.y, 0));
                acc[r] = fmaf(__half2float(__ushort_as_half(s.d[i][r])) * xs, (float)isum, acc[r]);
            }
            if (seg + 1 == segs || g + i + 1 == u1) {  // this warp's part of the pair ends here
                const bool starts_inside = pair == first_pair && u0 % segs != 0;
                const bool ends_inside = seg + 1 != segs;
                if (!ends_inside || starts_inside) {  // else: this warp adds the rest after its loop
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const float part = warp_sum(acc[r]);
                        if (lane == 0 && starts_inside) {
                            cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(
                                carry[(size_t)gw * 2 + r]);
                            slot.store((1ull << 32) | __float_as_uint(part), cuda::memory_order_relaxed);
                        } else if (lane == 0 && 2 * pair + r < rows) {
                            y[2 * pair + r] = part;
                        }
                        acc[r] = 0.0f;
                    }
                }
            }
            if (++seg == segs) seg = 0, ++pair;
        }
    };
    if constexpr (kPipe) {
        for (uint32_t g = u0; g < u1; g += 2 * kUnroll) {
            sum_group(s0, g);
            if (g + 2 * kUnroll < u1) load_group(s0, g + 2 * kUnroll);
            if (g + kUnroll >= u1) break;
            sum_group(s1, g + kUnroll);
            if (g + 3 * kUnroll < u1) load_group(s1, g + 3 * kUnroll);
        }
    } else {
        for (uint32_t g = u0; g < u1; g += kUnroll) {
            sum_group(s0, g);
            if (g + kUnroll < u1) load_group(s0, g + kUnroll);
        }
    }
    // A pair this warp starts and later warps end: add their parts in warp order.
    if (u1 > u0 && u1 % segs != 0 && (u1 - 1) / segs * segs >= u0) {
        const uint32_t p = (u1 - 1) / segs, pair_end = (p + 1) * segs;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = warp_sum(acc[r]);
            if (lane == 0) {
                for (uint32_t v = gw + 1; v < n_warps; ++v) {
                    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(carry[(size_t)v * 2 + r]);
                    unsigned long long bits;
                    while (((bits = slot.load(cuda::memory_order_relaxed)) >> 32) == 0) __nanosleep(64);
                    slot.store(0ull, cuda::memory_order_relaxed);
                    sum += __uint_as_float((uint32_t)bits);
                    if ((uint64_t)(v + 1) * total / n_warps >= pair_end) break;  // v's range ends the pair
                }
                if (2 * p + r < rows) y[2 * p + r] = sum;
            }
        }
    }
}

// What a sweep writes after its sums (kOut): y (plain); SwiGLU of gate / up row pairs,
// quantized (glu, matvec_q8s_swiglu_cuda); the residual add and the first half of the next
// RMSNorm, quantized (norm, matvec_q8s_norm_out_cuda).
// rope (lab): decode's q|k|v with bias, RoPE and the new cell's f16 K / V in its epilogue
// (matvec_q8s_qkv_rope_cuda).
enum class SweepOut : uint8_t { plain, glu, norm, rope };

// A quantized epilogue's output and its hand-over scratch (glu, norm).
struct QuantOut {
    ActQ16 out;
    GluScratch scratch;
};

// x's source and y's use for one sweep launch (GemvX in matvec_q8s.cuh, flattened).
struct SweepIo {
    const int16_t* xq;  // GemvXFrom::q16: x as int16 blocks
    const float* xd;
    const float* a;  // rmsnorm: the stream; swiglu: gate
    const float* b;  // rmsnorm: the norm's weight; swiglu: up
    float eps;
    uint32_t from;  // GemvXFrom
    float* y;
    uint32_t accumulate;  // y += W x instead of y = W x
    uint64_t* stamps;     // kStamps only (lab): kSweepStamps global-timer stamps per block
};
// The chained instances' parameters (a type of their own: the plain instance's parameter
// block, and with it its code, stays as measured).
struct ChainedSweepIo : SweepIo {
    QuantOut quant;    // kOut glu / norm: the quantized output and the hand-over scratch
    NormedX norm_in;   // kNormIn: the producer's sums of squares; y scaled by their inv_rms
    NormOut norm_out;  // kOut norm: stream, weight and this launch's sums of squares
    QkvRope rope;      // kOut rope
};

// x formed from f32 vectors by the block itself, into shared memory as int16 blocks (q then
// d, where copy_x_to_shared leaves them), with the same operations in the same order as
// rmsnorm_cuda's one-row kernel (512 threads) and swiglu_q16_cuda: the same bits. stage: 8 *
// cols bytes of shared memory; for RMSNorm the weight's copies were committed before the
// producer wait (the weight does not depend on the producer). Not inlined: inlined, the
// fused instance needed 128 registers and ran ~2.5% slower per GEMV than the plain one (125);
// as a call it takes 124 and a 56-byte frame, and the fused engine is still 1-2.3% slower than
// the separate launches (session 29).
__device__ __noinline__ void form_x_in_shared(const SweepIo& io, uint32_t cols, uint4* smem, float4* stage,
                                                 uint32_t n_threads) {
    __shared__ float warp_sums[32];
    const uint32_t n4 = cols / 4, lane = threadIdx.x % 32;
    float4* s_a = stage;
    float4* s_b = stage + n4;
    for (uint32_t i = threadIdx.x; i < n4; i += n_threads) cp_async16(s_a + i, io.a + 4 * i);
    if (io.from == (uint32_t)GemvXFrom::swiglu)
        for (uint32_t i = threadIdx.x; i < n4; i += n_threads) cp_async16(s_b + i, io.b + 4 * i);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    int16_t* q = reinterpret_cast<int16_t*>(smem);
    float* d = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem) + cols * 2);
    // n4 % 128 == 0, so the 8 lanes of a 32-value block are in or out of the loops together.
    if (io.from == (uint32_t)GemvXFrom::rmsnorm) {
        float sum = 0.0f;
        for (uint32_t i = threadIdx.x; i < n4; i += n_threads) {
            const float4 v = s_a[i];
            sum = fmaf(v.x, v.x, sum);
            sum = fmaf(v.y, v.y, sum);
            sum = fmaf(v.z, v.z, sum);
            sum = fmaf(v.w, v.w, sum);
        }
        const float inv_rms = rsqrtf(block_sum(sum, warp_sums, n_threads / 32) / (float)cols + io.eps);
        for (uint32_t i = threadIdx.x; i < n4; i += n_threads) {
            const float4 v = s_a[i], g = s_b[i];
            const float4 o = make_float4(v.x * inv_rms * g.x, v.y * inv_rms * g.y, v.z * inv_rms * g.z,
                                         v.w * inv_rms * g.w);
            quantize_act_q16_group(o, lane, q + 4 * i, d + i / 8);
        }
    } else {
        for (uint32_t i = threadIdx.x; i < n4; i += n_threads) {
            const float4 g = s_a[i], u = s_b[i];
            const float4 h = make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z),
                                         silu_times(g.w, u.w));
            quantize_act_q16_group(h, lane, q + 4 * i, d + i / 8);
        }
    }
    __syncthreads();
}

// The sweep variants: a block owns a contiguous range of whole rows, and its warps take that
// range's 512-code segments in address order, interleaved (warp w: segments w, w + 16, ...),
// so each SM reads one contiguous region front to back, as the plain streaming kernel that
// reaches ~97% of the HBM read ceiling chained in four launches (bench "stream chain",
// session 27), instead of one region per warp. A segment's 32 lane sums are reduced at once
// and kept in shared memory; after the sweep each row adds its segments in column order (no
// hand-over between warps or blocks: blocks need not be resident together). kUnroll segments
// per warp in flight; a slot is reloaded as soon as it is summed.
constexpr int kSweepWarps = 16;
constexpr size_t kSweepPartialBytes = 48 * 1024;
// A fused x stages two f32 vectors of cols values beside x itself: 10.125 bytes per column,
// 207 KB at 20480 columns (the 7B shape's down has 18944).
constexpr uint32_t kFusedMaxCols = 20480;
constexpr size_t kFusedStagePerCol = 8;

// Quantizes values [r0, r1) of an n-value vector, held by this block in shared memory (v),
// per 32 values as act_q16 (all threads). A 32-value block inside [r0, r1) is quantized from
// shared memory; one cut between grid blocks is handed over through global memory: each
// holder has stored its values there (before the __syncthreads that precedes this call) and
// counts its arrival; the last to arrive reads the others' values and quantizes (and zeroes
// the count for the next launch). The fences are those of a grid barrier (one thread's fence
// after the block barrier, before the arrival; the last arrival's fence before its reads).
__device__ __forceinline__ bool block_is_cut(uint32_t b, uint32_t n, uint32_t per_block) {
    return b * kActBlock / per_block != min(b * kActBlock + kActBlock - 1, n - 1) / per_block;
}
// How many grid blocks of per_block values hold a part of 32-value block b.
__device__ __forceinline__ uint32_t cut_holders(uint32_t b, uint32_t n, uint32_t per_block) {
    return min(b * kActBlock + kActBlock - 1, n - 1) / per_block - b * kActBlock / per_block + 1;
}
// A warp holding part of a cut block counts its arrival (after the block barrier that ordered
// its block's stores of the values): true in every lane for the last of `holders`, which may
// then read the others' values; the count is left zero for the next launch. lean (default): one
// acq_rel atomic (its release is cumulative over the block barrier's stores), the count zeroed
// after it with nothing waiting for that store: the next use of the count is a later launch
// behind a dependency wait. fence (lab): the fences of a grid barrier (one before the arrival,
// the last arrival's before its reads).
template <HandOver kHandOver>
__device__ __forceinline__ bool arrive_last(uint32_t* count, uint32_t holders, uint32_t lane) {
    uint32_t last = 0;
    if (lane == 0) {
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrivals(*count);
        if constexpr (kHandOver == HandOver::lean) {
            last = arrivals.fetch_add(1u, cuda::memory_order_acq_rel) == holders - 1;
            if (last) arrivals.store(0u, cuda::memory_order_relaxed);
        } else {
            __threadfence();
            last = arrivals.fetch_add(1u, cuda::memory_order_relaxed) == holders - 1;
            if (last) {
                arrivals.store(0u, cuda::memory_order_relaxed);
                __threadfence();
            }
        }
    }
    __syncwarp();
    return __shfl_sync(0xffffffffu, last, 0) != 0;
}
// Value i of a cut block, stored for its other holders.
__device__ __forceinline__ void stage_cut_value(const GluScratch& scratch, uint32_t i, float value) {
    scratch.stage[i] = value;
}
// kHandOver: GluScratch::hand_over (lean is the default; the others are lab variants).
template <HandOver kHandOver>
__device__ __forceinline__ void quantize_block_values(const QuantOut& quant, const float* v, uint32_t r0, uint32_t r1,
                                                      uint32_t n, uint32_t per_block) {
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (uint32_t b = r0 / kActBlock + warp; b * kActBlock < r1; b += kSweepWarps) {
        if (block_is_cut(b, n, per_block)) {
            if constexpr (kHandOver == HandOver::skip) {
                // Lab timing floor: this holder's values only, the others taken as zero.
                const uint32_t i = b * kActBlock + lane;
                const float h = i >= r0 && i < r1 ? v[i - r0] : 0.0f;
                quantize_act_q16_warp(h, lane, quant.out.q + (size_t)b * kActBlock, quant.out.d + b);
                continue;
            }
            if (!arrive_last<kHandOver>(quant.scratch.arrivals + b, cut_holders(b, n, per_block), lane)) continue;
        }
        const uint32_t i = b * kActBlock + lane;
        const float h = i >= r0 && i < r1 ? v[i - r0] : __ldcg(quant.scratch.stage + i);
        quantize_act_q16_warp(h, lane, quant.out.q + (size_t)b * kActBlock, quant.out.d + b);
    }
}

// The SwiGLU epilogue of a glu block owning pairs [r0, r1) of ff: h = silu(gate) * up per pair
// from the segment sums (rows 2p and 2p + 1 of `part`, added in column order as the plain
// epilogue adds a row; times inv_rms when x came normed, kNormIn), then act_q16 of h: the
// operations of swiglu_q16_cuda, so the bits of the separate launches.
template <bool kNormIn, HandOver kHandOver>
__device__ __forceinline__ void glu_epilogue(const QuantOut& quant, const float* part, float* h_shared, uint32_t r0,
                                             uint32_t r1, uint32_t ff, uint32_t pairs_per_block, uint32_t segs,
                                             float inv_rms) {
    for (uint32_t p = threadIdx.x; p < r1 - r0; p += kSweepWarps * 32) {
        float gate = 0.0f, up = 0.0f;
        for (uint32_t seg = 0; seg < segs; ++seg) gate += part[2 * p * segs + seg];
        for (uint32_t seg = 0; seg < segs; ++seg) up += part[(2 * p + 1) * segs + seg];
        if constexpr (kNormIn) gate *= inv_rms, up *= inv_rms;
        const float h = silu_times(gate, up);
        h_shared[p] = h;
        if (block_is_cut((r0 + p) / kActBlock, ff, pairs_per_block)) stage_cut_value(quant.scratch, r0 + p, h);
    }
    __syncthreads();
    quantize_block_values<kHandOver>(quant, h_shared, r0, r1, ff, pairs_per_block);
}

// The norm epilogue of a block owning rows [r0, r1) of n (the residual stream's width): s =
// stream + W x per row, written back (the residual add); this block's sum of s^2 (row order,
// then block_sum: fixed) into partials[block]; s * weight quantized per 32 values (act_q16,
// its scales without inv_rms, which the consumer applies to its sums: NormedX). The block's
// rows of the stream and the weight were copied into shared memory with x (stream_in, weight_in).
template <HandOver kHandOver>
__device__ __forceinline__ void norm_epilogue(const QuantOut& quant, const NormOut& norm, const float* part,
                                              const float* stream_in, const float* weight_in, float* v_shared,
                                              float* warp_sums, uint32_t r0, uint32_t r1, uint32_t n,
                                              uint32_t rows_per_block, uint32_t segs) {
    float sum_sq = 0.0f;
    for (uint32_t r = threadIdx.x; r < r1 - r0; r += kSweepWarps * 32) {
        float total = 0.0f;
        for (uint32_t seg = 0; seg < segs; ++seg) total += part[r * segs + seg];  // column order
        const float s = stream_in[r] + total;
        norm.stream[r0 + r] = s;
        sum_sq = fmaf(s, s, sum_sq);
        const float t = s * weight_in[r];
        v_shared[r] = t;
        if (block_is_cut((r0 + r) / kActBlock, n, rows_per_block)) stage_cut_value(quant.scratch, r0 + r, t);
    }
    const float block_sq = block_sum(sum_sq, warp_sums, kSweepWarps);  // its barrier publishes v_shared
    if (threadIdx.x == 0 && blockIdx.x < kNormOutMaxBlocks) norm.partials[blockIdx.x] = block_sq;
    quantize_block_values<kHandOver>(quant, v_shared, r0, r1, n, rows_per_block);
}

// One warp's 32 values into a cache block of the tier (qkv_post's stores; warp-uniform type).
__device__ __forceinline__ void store_cache_block(KvType type, float v, uint8_t* row, uint32_t block, uint32_t lane) {
    switch (type) {
        case KvType::f16: kv_store_block<KvType::f16>(v, row, block, lane); break;
        case KvType::q8_0: kv_store_block<KvType::q8_0>(v, row, block, lane); break;
        case KvType::q4_0: kv_store_block<KvType::q4_0>(v, row, block, lane); break;
    }
}

// The rope epilogue of a block owning rotation pairs [r0, r1) (kRope above): per pair the two
// rows' sums in column order (times inv_rms when x came normed), plus the bias, rotated (q and
// k heads; NeoX over the whole head, the table's cos / sin), then q to rope.q and K / V to the
// new cell's rows: the arithmetic of the plain epilogue followed by qkv_post_kernel. f16 K / V
// go out value by value; a quantized tier's values wait in shared memory (vals: 2 per pair) for
// their 32-unit group, cut groups through the hand-over (their values staged by unit).
__device__ __forceinline__ void rope_epilogue(const QkvRope& e, const float* part, float* vals, uint32_t r0,
                                              uint32_t r1, uint32_t n_units, uint32_t per_block, uint32_t segs,
                                              float inv_rms) {
    const uint32_t half = e.head_dim / 2, qd = e.n_head * e.head_dim, kd = e.n_head_kv * e.head_dim;
    const uint32_t q_units = qd / 2, k_units = kd / 2;  // units of the q heads, of the k heads
    const bool quantized = e.k_type != KvType::f16 || e.v_type != KvType::f16;
    for (uint32_t p = threadIdx.x; p < r1 - r0; p += kSweepWarps * 32) {
        float x0 = 0.0f, x1 = 0.0f;
        for (uint32_t seg = 0; seg < segs; ++seg) x0 += part[2 * p * segs + seg];  // column order
        for (uint32_t seg = 0; seg < segs; ++seg) x1 += part[(2 * p + 1) * segs + seg];
        x0 *= inv_rms, x1 *= inv_rms;
        const uint32_t u = r0 + p, i = u % half, a = u / half * e.head_dim + i, b = a + half;
        if (e.bias != nullptr) x0 += e.bias[a], x1 += e.bias[b];
        if (a < qd + kd) {
            const float2 cs = e.rope_table[i];
            const float y0 = rope_pair_value(x0, x1, cs.x, cs.y, true), y1 = rope_pair_value(x0, x1, cs.x, cs.y, false);
            x0 = y0, x1 = y1;
        }
        if (a < qd) {
            e.q[a] = x0, e.q[b] = x1;
        } else if (!quantized) {
            __half* row = reinterpret_cast<__half*>(a < qd + kd ? e.k_row : e.v_row);
            const uint32_t at = a < qd + kd ? a - qd : a - qd - kd;
            row[at] = __float2half_rn(x0), row[at + half] = __float2half_rn(x1);
        } else {
            vals[2 * p] = x0, vals[2 * p + 1] = x1;
            if (block_is_cut(u / kActBlock, n_units, per_block)) {
                e.kv_scratch.stage[2 * (u - q_units)] = x0;
                e.kv_scratch.stage[2 * (u - q_units) + 1] = x1;
            }
        }
    }
    if (!quantized) return;
    __syncthreads();
    // A warp per 32-unit group of the K / V heads (head_dim % 64 == 0: groups never straddle
    // q and k, or k and v, or two halves of a head).
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (uint32_t g = max(r0, q_units) / kActBlock + warp; g * kActBlock < r1; g += kSweepWarps) {
        if (block_is_cut(g, n_units, per_block) &&
            !arrive_last<HandOver::fence>(e.kv_scratch.arrivals + (g - q_units / kActBlock),
                                          cut_holders(g, n_units, per_block), lane))
            continue;
        const uint32_t u = g * kActBlock + lane;
        const bool mine = u >= r0 && u < r1;
        const float x0 = mine ? vals[2 * (u - r0)] : __ldcg(e.kv_scratch.stage + 2 * (u - q_units));
        const float x1 = mine ? vals[2 * (u - r0) + 1] : __ldcg(e.kv_scratch.stage + 2 * (u - q_units) + 1);
        const bool is_k = u < q_units + k_units;
        const uint32_t at = (u / half) * e.head_dim + u % half - qd - (is_k ? 0 : kd);  // dim i's place in the row
        const KvType type = is_k ? e.k_type : e.v_type;
        uint8_t* row = is_k ? e.k_row : e.v_row;
        store_cache_block(type, x0, row, at / kActBlock, lane);
        store_cache_block(type, x1, row, (at + half) / kActBlock, lane);
    }
}

// kRows = 2 (lab): a unit is a row pair's segment (the two rows' 512 codes at the same
// columns share x's loads), units in pair-major order; kUnroll units x kRows rows = 8 sums.
// kFused: x may be formed here (GemvX) and y accumulated; its own instance, so the plain
// GEMV's code stays what was measured (with the fused code in one instance, the q16 path ran
// 2.5% slower in the engine: 128 registers instead of 125; session 28).
// kStamps (lab, bench "q8s hop timeline"): thread 0 stamps the global timer at the block's
// entry, the producer wait's return, x in shared memory, the end of the sweep (all warps) and
// the end, into io.stamps[block * kSweepStamps + k]; its own instance, so the plain one's code
// is unchanged.
constexpr uint32_t kSweepStamps = 5;
// kOut glu (kRows = 2): the gate|up GEMV with SwiGLU in its epilogue (matvec_q8s_swiglu_cuda).
// `rows` counts gate / up row pairs: pair p is gate row p and up row rows + p, read as one
// unit (the matrix's rows as uploaded, no interleaving), so a block owns pairs [r0, r1) and
// its partial sums are laid out as a plain block's rows 2p and 2p + 1. kOut norm: the
// residual add and the next RMSNorm's first half (norm_epilogue). kNormIn: x came from a norm
// epilogue; the sums are scaled by inv_rms from its sums of squares. Each its own instance.
template <int kUnroll, int kMinBlocks, int kRows = 1, bool kFused = false, bool kStamps = false,
          SweepOut kOut = SweepOut::plain, bool kNormIn = false, HandOver kHandOver = HandOver::fence,
          bool kReleaseAfterWait = false, typename Io = std::conditional_t<kOut == SweepOut::plain && !kNormIn, SweepIo, ChainedSweepIo>>
__global__ void __launch_bounds__(kSweepWarps * 32, kMinBlocks) matvec_q8s_sweep_kernel(
    const uint4* __restrict__ codes, const unsigned short* __restrict__ scales, const Io io, uint32_t rows,
    uint32_t cols, uint32_t rows_per_block, uint32_t release_at_entry) {
    static_assert(kUnroll * kRows == 8, "the reduction below is written for 8 sums");
    constexpr bool kGlu = kOut == SweepOut::glu, kRope = kOut == SweepOut::rope, kPairs = kGlu || kRope;
    static_assert(!kPairs || kRows == 2, "SwiGLU and rotation pairs are row pairs");
    static_assert((kOut == SweepOut::plain && !kNormIn) || !kFused, "the chained epilogues take a q16 x");
    const auto stamp = [&](uint32_t k) {
        if constexpr (kStamps) {
            if (threadIdx.x == 0) io.stamps[blockIdx.x * kSweepStamps + k] = global_timer_ns();
        }
    };
    stamp(0);
    if (release_at_entry) pdl_release_dependents();
    extern __shared__ uint4 q8s_smem[];  // x: q [cols] int16, d [cols / 32] f32; then the segment sums
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t segs = cols / kUnitCols, row_vecs = cols / 16, row_blocks = cols / 32;
    const uint32_t r0 = min(rows, blockIdx.x * rows_per_block), r1 = min(rows, r0 + rows_per_block);
    const uint32_t block_rows = kPairs ? 2 * (r1 - r0) : r1 - r0;   // kGlu: a pair's gate and up rows
    const uint32_t n_parts = block_rows * segs;                      // (row, segment) sums of the block
    const uint32_t n = (block_rows + kRows - 1) / kRows * segs;      // units
    // Rows are contiguous, so (row r, segment s) of the block, part index r * segs + s, starts
    // at codes + (r0 * row_vecs + 32 (r * segs + s)) and its scales at + 16 (r * segs + s).
    // Unit j (segment s = j % segs) holds parts kRows j - (kRows - 1) s + k segs, k < kRows.
    // kRope: unit u is rows a = (u / half) head_dim + u % half and a + half (half = head_dim /
    // 2), a rotation pair; a block's units lie in at most two heads (rows_per_block <= half),
    // so from its first row they run on contiguously, skip half rows at the head boundary
    // (from unit j_cross), and each pair's second row lies half rows further on.
    uint32_t row0 = r0, half = 0, j_cross = 0;
    if constexpr (kRope) {
        half = io.rope.head_dim / 2;
        row0 = r0 + r0 / half * half;
        j_cross = (half - r0 % half) * segs;
    }
    const uint4* w_base = codes + (size_t)row0 * row_vecs + lane;
    const unsigned short* d_base = scales + (size_t)row0 * row_blocks + lane / 2;
    const auto part_of = [&](uint32_t j, uint32_t seg, int k) { return kRows * j - (kRows - 1) * seg + k * segs; };
    uint4 w[kUnroll][kRows];
    unsigned short d[kUnroll][kRows];
    const auto load = [&](int i, uint32_t j, uint32_t seg) {
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
            // kGlu: unit j is pair r0 + j / segs at segment j % segs; its up row lies rows
            // rows further on.
            const uint32_t q = kGlu    ? j + (uint32_t)k * rows * segs
                               : kRope ? j + (j >= j_cross ? half * segs : 0u) + (uint32_t)k * half * segs
                                       : part_of(j, seg, k);
            if (j < n && (kPairs || q < n_parts)) {
                w[i][k] = __ldcs(w_base + (size_t)q * 32);
                d[i][k] = __ldcs(d_base + (size_t)q * 16);
            }
        }
    };
    // Slot i's column segment, advanced without a division (segments move by 16 kUnroll per round).
    uint32_t seg_of[kUnroll];
    const uint32_t advance = (kSweepWarps * kUnroll) % segs;
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
        seg_of[i] = (warp + kSweepWarps * i) % segs;
        load(i, warp + kSweepWarps * i, seg_of[i]);
    }
    const size_t x_bytes = ((size_t)cols * 2 + cols / 8 + 15) / 16 * 16;
    // The segment sums' region stages the f32 inputs of a fused x first.
    float* part = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(q8s_smem) + x_bytes);
    float4* stage = reinterpret_cast<float4*>(part);
    if constexpr (kFused) {
        if (io.from == (uint32_t)GemvXFrom::rmsnorm) {
            for (uint32_t i = threadIdx.x; i < cols / 4; i += kSweepWarps * 32)
                cp_async16(stage + cols / 4 + i, io.b + 4 * i);
            cp_async_commit();
        }
    }
    // After the partial sums (kGlu: 2 rows per pair): the chained epilogues' values (one per
    // row or pair), inv_rms, 16 warp sums, the norm epilogue's rows of the stream and weight.
    float* chain_values = part + (kPairs ? 2 : 1) * rows_per_block * segs;
    float* inv_rms_slot = chain_values + rows_per_block;
    float* warp_sums = inv_rms_slot + 1;
    float* stream_in = warp_sums + kSweepWarps;
    float* weight_in = stream_in + rows_per_block;
    if constexpr (kOut == SweepOut::norm) {
        // The weight does not depend on the producer; the stream is read after the wait. Both
        // land with x (copy_x_to_shared waits for every group), so the epilogue reads no L2.
        for (uint32_t r = threadIdx.x; r < r1 - r0; r += kSweepWarps * 32)
            cp_async4(weight_in + r, io.norm_out.weight + r0 + r);
        cp_async_commit();
    }
    pdl_wait_for_producer();  // W went out first: it does not depend on x's producer
    if constexpr (kReleaseAfterWait) pdl_release_dependents();  // lab: NormOut::release_after_wait
    stamp(1);
    if constexpr (kOut == SweepOut::norm) {
        for (uint32_t r = threadIdx.x; r < r1 - r0; r += kSweepWarps * 32)
            cp_async4(stream_in + r, io.norm_out.stream + r0 + r);
    }
    if constexpr (kNormIn) {
        // inv_rms from the producer's per-block sums of squares, in a fixed order, while x lands.
        copy_x_to_shared(io.xq, io.xd, cols, q8s_smem, kSweepWarps * 32, [&] {
            if (warp != 0) return;
            // 8 loads per lane in flight at once (a load-add loop would wait one L2 round
            // trip per step), added in a fixed order.
            constexpr uint32_t kPerLane = 8;
            float sum = 0.0f;
            for (uint32_t base = 0; base < io.norm_in.n_partials; base += 32 * kPerLane) {
                float v[kPerLane];
#pragma unroll
                for (uint32_t k = 0; k < kPerLane; ++k) {
                    const uint32_t i = base + 32 * k + lane;
                    v[k] = i < io.norm_in.n_partials ? __ldcg(io.norm_in.partials + i) : 0.0f;
                }
#pragma unroll
                for (uint32_t k = 0; k < kPerLane; ++k) sum += v[k];
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) *inv_rms_slot = rsqrtf(sum / (float)cols + io.norm_in.eps);
        });
    } else if (!kFused || io.from == (uint32_t)GemvXFrom::q16) {
        copy_x_to_shared(io.xq, io.xd, cols, q8s_smem, kSweepWarps * 32);
    } else {
        form_x_in_shared(io, cols, q8s_smem, stage, kSweepWarps * 32);
    }
    stamp(2);
    const uint4* x_q = q8s_smem;
    const float* x_d = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(q8s_smem) + cols * 2);
    for (uint32_t j0 = warp; j0 < n; j0 += kSweepWarps * kUnroll) {
        // Every slot is summed (a slot past the end holds zeros' worth: its sum is not stored),
        // so the dot products and reductions interleave without branches.
        float v[kUnroll * kRows];
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
            const uint32_t j = j0 + kSweepWarps * i, seg = seg_of[i];
            const uint4 xa = x_q[seg * 64 + 2 * lane], xb = x_q[seg * 64 + 2 * lane + 1];
            const float xs = x_d[seg * 16 + lane / 2];
            uint4 wv[kRows];
            float scale[kRows];
#pragma unroll
            for (int k = 0; k < kRows; ++k) {
                wv[k] = w[i][k];
                scale[k] = __half2float(__ushort_as_half(d[i][k])) * xs;
            }
            const uint32_t next_seg = seg + advance >= segs ? seg + advance - segs : seg + advance;
            load(i, j + kSweepWarps * kUnroll, next_seg);
            seg_of[i] = next_seg;
#pragma unroll
            for (int k = 0; k < kRows; ++k) {
                const int isum = dot8_q16_q8(xb, (int)wv[k].z, (int)wv[k].w, dot8_q16_q8(xa, (int)wv[k].x, (int)wv[k].y, 0));
                v[i * kRows + k] = j < n && part_of(j, seg, k) < n_parts ? scale[k] * (float)isum : 0.0f;
            }
        }
        // The 8 sums over the warp at once: halve the values held per lane at each of the
        // first three exchanges (4 + 2 + 1 shuffles), then two plain steps: lane l (l % 4 ==
        // 0) ends with value (l / 4) % 8's total. Fixed order: deterministic.
        const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
        float h4[4], h2[2];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float send = b4 ? v[k] : v[k + 4], keep = b4 ? v[k + 4] : v[k];
            h4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float send = b3 ? h4[k] : h4[k + 2], keep = b3 ? h4[k + 2] : h4[k];
            h2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
        }
        float total = (b2 ? h2[1] : h2[0]) + __shfl_xor_sync(0xffffffffu, b2 ? h2[0] : h2[1], 4);
        total += __shfl_xor_sync(0xffffffffu, total, 2);
        total += __shfl_xor_sync(0xffffffffu, total, 1);
        const uint32_t value = (lane / 4) % 8, j = j0 + kSweepWarps * (value / kRows);
        if (lane % 4 == 0 && j < n) {
            const uint32_t q = kRows == 1 ? j : part_of(j, j % segs, (int)(value % kRows));
            if (q < n_parts) part[q] = total;
        }
    }
    __syncthreads();
    stamp(3);
    if constexpr (kGlu) {
        glu_epilogue<kNormIn, kHandOver>(io.quant, part, chain_values, r0, r1, rows, rows_per_block, segs,
                                         kNormIn ? *inv_rms_slot : 1.0f);
    } else if constexpr (kOut == SweepOut::norm) {
        norm_epilogue<kHandOver>(io.quant, io.norm_out, part, stream_in, weight_in, chain_values, warp_sums, r0, r1,
                                 rows, rows_per_block, segs);
    } else if constexpr (kRope) {
        // vals: the stream / weight rows' place (2 per pair), apart from inv_rms.
        rope_epilogue(io.rope, part, stream_in, r0, r1, rows, rows_per_block, segs, kNormIn ? *inv_rms_slot : 1.0f);
    } else {
        for (uint32_t r = threadIdx.x; r < r1 - r0; r += kSweepWarps * 32) {
            float total = 0.0f;
            for (uint32_t seg = 0; seg < segs; ++seg) total += part[r * segs + seg];  // column order
            if constexpr (kNormIn) total *= *inv_rms_slot;
            if constexpr (kFused) io.y[r0 + r] = io.accumulate ? io.y[r0 + r] + total : total;
            else io.y[r0 + r] = total;
        }
    }
    stamp(4);
}

// Returns the grid's block count. kOut glu: rows counts gate / up pairs.
template <int kUnroll, int kBlocksPerSm, int kRows, bool kFused, bool kStamps = false,
          SweepOut kOut = SweepOut::plain, bool kNormIn = false, HandOver kHandOver = HandOver::fence,
          bool kReleaseAfterWait = false, typename Io = SweepIo>
uint32_t launch_q8s_sweep_as(Q8SplitConst w, const Io& io, uint32_t rows, uint32_t cols, cudaStream_t stream,
                             bool release_at_entry) {
    constexpr auto kKernel = matvec_q8s_sweep_kernel<kUnroll, kBlocksPerSm, kRows, kFused, kStamps, kOut, kNormIn,
                                                     kHandOver, kReleaseAfterWait>;
    constexpr bool kGlu = kOut == SweepOut::glu || kOut == SweepOut::rope, kChained = kOut != SweepOut::plain || kNormIn;
    static_assert(std::is_same_v<Io, std::conditional_t<kChained, ChainedSweepIo, SweepIo>>, "the kernel's parameters");
    // After the partial sums: the chained epilogues' values, inv_rms, 16 warp sums, and the
    // norm epilogue's rows of the stream and the weight.
    const auto chain_bytes = [](uint32_t per_block) {
        return kChained ? (3 * (size_t)per_block + 1 + kSweepWarps) * sizeof(float) : 0;
    };
    const size_t x_bytes = ((size_t)cols * 2 + cols / 8 + 15) / 16 * 16;
    static const int sms = [] {
        const auto x_bytes_of = [](size_t n) { return (n * 2 + n / 8 + 15) / 16 * 16; };
        // Chained: three values per row (or pair) of a block, whose sums fit the partials'
        // bytes: the most over the row lengths (widest at 1 segment: 193 KB).
        const auto chained_max = [&] {
            size_t most = 0;
            for (uint32_t segs = 1; segs <= kMaxCols / kUnitCols; ++segs)
                most = std::max(most, x_bytes_of((size_t)segs * kUnitCols) + kSweepPartialBytes +
                                          (3 * (kSweepPartialBytes / (segs * sizeof(float))) + 1 + kSweepWarps) *
                                              sizeof(float));
            return most;
        };
        const size_t max_smem =
            kFused   ? std::max(x_bytes_of(kMaxCols) + kSweepPartialBytes,
                                x_bytes_of(kFusedMaxCols) + kFusedStagePerCol * kFusedMaxCols)
            : kChained ? chained_max()
                       : x_bytes_of(kMaxCols) + kSweepPartialBytes;
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem));
        int device = 0, count = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
        return count;
    }();
    const uint32_t segs = cols / kUnitCols;
    const uint32_t slots = (uint32_t)sms * kBlocksPerSm;
    uint32_t rows_per_block = 0;
    size_t smem = 0;
    if constexpr (kGlu) {
        // Pairs: their 2 rows of sums within the partials' bytes (>= 96 pairs), then h.
        const uint32_t max_pairs = (uint32_t)(kSweepPartialBytes / (2 * segs * sizeof(float)));
        rows_per_block = std::min((rows + slots - 1) / slots, max_pairs);
        smem = x_bytes + (size_t)rows_per_block * 2 * segs * sizeof(float) + chain_bytes(rows_per_block);
    } else {
        // Whole row groups of kRows per block; >= 192 rows of partial sums (cols <= 32768).
        const uint32_t max_rows = (uint32_t)(kSweepPartialBytes / (segs * sizeof(float))) / kRows * kRows;
        rows_per_block = std::min(((rows + slots - 1) / slots + kRows - 1) / kRows * kRows, max_rows);
        const size_t stage = io.from == (uint32_t)GemvXFrom::q16 ? 0 : kFusedStagePerCol * cols;
        smem = x_bytes + std::max((size_t)rows_per_block * segs * sizeof(float), stage) + chain_bytes(rows_per_block);
    }
    const uint32_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    launch_with_pdl(pdl_supported(), kKernel, dim3(blocks), dim3(kSweepWarps * 32), smem, stream,
                    reinterpret_cast<const uint4*>(w.codes), reinterpret_cast<const unsigned short*>(w.scales), io,
                    rows, cols, rows_per_block, release_at_entry ? 1u : 0u);
    return blocks;
}

// The fused instance when x is formed here or y accumulated, else the plain one.
template <int kUnroll, int kBlocksPerSm, int kRows = 1>
void launch_q8s_sweep(Q8SplitConst w, const SweepIo& io, uint32_t rows, uint32_t cols, cudaStream_t stream,
                      bool release_at_entry) {
    if (io.from != (uint32_t)GemvXFrom::q16 || io.accumulate)
        launch_q8s_sweep_as<kUnroll, kBlocksPerSm, kRows, true>(w, io, rows, cols, stream, release_at_entry);
    else launch_q8s_sweep_as<kUnroll, kBlocksPerSm, kRows, false>(w, io, rows, cols, stream, release_at_entry);
}

SweepIo q16_io(ActQ16 x, float* y) {
    return SweepIo{x.q, x.d, nullptr, nullptr, 0.0f, (uint32_t)GemvXFrom::q16, y, 0u, nullptr};
}

void launch_sweep(MatvecQ8sKernel kernel, Q8SplitConst w, const SweepIo& io, uint32_t rows, uint32_t cols,
                  cudaStream_t stream, bool release_at_entry) {
    switch (kernel) {
        case MatvecQ8sKernel::sweep1: launch_q8s_sweep<8, 1>(w, io, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::sweep2: launch_q8s_sweep<8, 2>(w, io, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::sweep1r2: launch_q8s_sweep<4, 1, 2>(w, io, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::sweep1r4: launch_q8s_sweep<2, 1, 4>(w, io, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::sweep1r8: launch_q8s_sweep<1, 1, 8>(w, io, rows, cols, stream, release_at_entry); break;
        default: fail("matvec_q8s: not a sweep variant");
    }
}

// One thread per Q8_0 block: 34 bytes (f16 scale, 32 codes) -> 32 codes + the scale apart.
__global__ void q8_0_to_split_kernel(const uint8_t* __restrict__ src, size_t n_blocks, int8_t* __restrict__ codes,
                                     uint16_t* __restrict__ scales) {
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks; b += (size_t)gridDim.x * blockDim.x) {
        const uint8_t* blk = src + b * 34;  // 2-byte aligned: read as halfwords
        const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
        scales[b] = h[0];
        uint32_t words[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) words[k] = (uint32_t)h[1 + 2 * k] | ((uint32_t)h[2 + 2 * k] << 16);
        uint4* dst = reinterpret_cast<uint4*>(codes + b * 32);
        dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
        dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
    }
}

template <int kWarpsPB, int kUnroll, int kMinBlocks, bool kPipe, bool kStreaming = true>
void launch_q8s(Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols, cudaStream_t stream,
                bool release_at_entry) {
    constexpr auto kKernel = matvec_q8s_kernel<kWarpsPB, kUnroll, kMinBlocks, kPipe, kStreaming>;
    const size_t smem = (size_t)cols * 2 + cols / 8;
    const uint32_t slot_warps = gemv_resident_warps<kKernel>(kWarpsPB, smem, (size_t)kMaxCols * 2 + kMaxCols / 8);
    const uint32_t units = (rows + 1) / 2 * (cols / kUnitCols);
    // Every warp resident at once (owners wait for later warps' parts) and owning >= 1 unit.
    const uint32_t warps = std::min(slot_warps, units);
    const uint32_t blocks = (warps + kWarpsPB - 1) / kWarpsPB;
    unsigned long long* carry = gemv_carry_slots(stream, slot_warps * 2);
    launch_with_pdl(pdl_supported(), kKernel, dim3(blocks), dim3(kWarpsPB * 32), smem, stream,
                    reinterpret_cast<const uint4*>(w.codes), reinterpret_cast<const unsigned short*>(w.scales),
                    static_cast<const int16_t*>(x.q), static_cast<const float*>(x.d), y, rows, cols, warps, carry,
                    release_at_entry ? 1u : 0u);
}

// SPILLWAY_Q8S_KERNEL=<variant name> (lab): every split-layout GEMV of the process uses it.
std::optional<MatvecQ8sKernel> q8s_kernel_override() {
    static const std::optional<MatvecQ8sKernel> kernel = []() -> std::optional<MatvecQ8sKernel> {
        static_assert((int)MatvecQ8sKernel::sweep1r8 == 9, "the names below follow the enum");
        const int i = lab_knob_choice("SPILLWAY_Q8S_KERNEL",
                                      {"w8u4", "w8u8", "w4u4", "w8u4p", "w8u4nc", "sweep1", "sweep2", "sweep1r2",
                                       "sweep1r4", "sweep1r8"});
        if (i < 0) return std::nullopt;
        return (MatvecQ8sKernel)i;
    }();
    return kernel;
}

}  // namespace

void q8_0_to_split_cuda(const void* gguf_rows, uint32_t rows, uint32_t cols, Q8Split out, cudaStream_t stream) {
    if (cols == 0 || cols % 32 != 0) fail("q8_0_to_split_cuda: cols must be a positive multiple of 32");
    if (!gguf_rows || !out.codes || !out.scales || reinterpret_cast<uintptr_t>(out.codes) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(gguf_rows) % 2 != 0 || reinterpret_cast<uintptr_t>(out.scales) % 2 != 0)
        fail("q8_0_to_split_cuda: codes must be 16-byte aligned, the rows and scales 2-byte aligned");
    const size_t n_blocks = (size_t)rows * (cols / 32);
    if (n_blocks == 0) return;
    const uint32_t grid = (uint32_t)std::min<size_t>((n_blocks + 255) / 256, 65535);
    q8_0_to_split_kernel<<<grid, 256, 0, stream>>>(static_cast<const uint8_t*>(gguf_rows), n_blocks, out.codes,
                                                   out.scales);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

bool matvec_q8s_fits(uint32_t cols) { return cols > 0 && cols % kUnitCols == 0 && cols <= kMaxCols; }

// Measured (docs/perf-notes.md, session 27, H200, 14B shapes, us, one call): sweep1r2 /
// sweep1: head 183.6 / 185.0 (4.5 TB/s: about the HBM read ceiling), gate|up 36.9 / 38.9, down 20.3 /
// 22.5, qkv 12.5 / 14.6, wo 10.3 / 11.4; a layer's four GEMVs chained with release 72.4 /
// 79.8 (w8u4, session 23's pick: 82); engine f16 tok/s at 0 / 8k / 64k 226.6 / 200.5 / 129.7
// vs 208.7 / 187.4 / 124.1. sweep2 spills at 64 registers and is slow.
MatvecQ8sKernel matvec_q8s_kernel_for(uint32_t rows, uint32_t cols) {
    (void)rows;
    (void)cols;
    return MatvecQ8sKernel::sweep1r2;
}

void matvec_q8s_cuda_with(MatvecQ8sKernel kernel, Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols,
                          cudaStream_t stream, bool release_at_entry) {
    if (rows == 0) return;
    if (!matvec_q8s_fits(cols)) fail("matvec_q8s_cuda: cols must be a multiple of 512, at most 32768");
    if (!x.q || !x.d) fail("matvec_q8s_cuda: no quantized x");
    if (!w.codes || !w.scales || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(w.scales) % 2 != 0 || reinterpret_cast<uintptr_t>(x.q) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(x.d) % 16 != 0)
        fail("matvec_q8s_cuda: codes, x.q and x.d must be 16-byte aligned, scales 2-byte aligned");
    switch (kernel) {
        case MatvecQ8sKernel::w8u4: launch_q8s<8, 4, 3, false>(w, x, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::w8u8: launch_q8s<8, 8, 1, false>(w, x, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::w4u4: launch_q8s<4, 4, 6, false>(w, x, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::w8u4p: launch_q8s<8, 4, 2, true>(w, x, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ8sKernel::w8u4nc:
            launch_q8s<8, 4, 3, false, false>(w, x, y, rows, cols, stream, release_at_entry);
            break;
        case MatvecQ8sKernel::sweep1:
        case MatvecQ8sKernel::sweep2:
        case MatvecQ8sKernel::sweep1r2:
        case MatvecQ8sKernel::sweep1r4:
        case MatvecQ8sKernel::sweep1r8:
            launch_sweep(kernel, w, q16_io(x, y), rows, cols, stream, release_at_entry);
            break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

bool matvec_q8s_fused_fits(uint32_t cols) {
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    const bool sweep = !forced || *forced >= MatvecQ8sKernel::sweep1;  // the sweep variants close the enum
    return sweep && matvec_q8s_fits(cols) && cols <= kFusedMaxCols;
}

void matvec_q8s_fused_cuda(Q8SplitConst w, const GemvX& x, float* y, bool accumulate, uint32_t rows, uint32_t cols,
                           cudaStream_t stream, bool release_at_entry) {
    if (rows == 0) return;
    if (!matvec_q8s_fused_fits(cols))
        fail("matvec_q8s_fused_cuda: cols must be a multiple of 512, at most 20480 (and a sweep variant chosen)");
    const auto aligned = [](const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (!aligned(w.codes) || w.scales == nullptr || reinterpret_cast<uintptr_t>(w.scales) % 2 != 0 || y == nullptr)
        fail("matvec_q8s_fused_cuda: codes must be 16-byte aligned, scales 2-byte aligned, y given");
    if (x.from == GemvXFrom::q16 ? !aligned(x.q16.q) || !aligned(x.q16.d) : !aligned(x.a) || !aligned(x.b))
        fail("matvec_q8s_fused_cuda: x's inputs must be given and 16-byte aligned");
    const SweepIo io{x.q16.q, x.q16.d, x.a, x.b, x.eps, (uint32_t)x.from, y, accumulate ? 1u : 0u, nullptr};
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    launch_sweep(forced ? *forced : MatvecQ8sKernel::sweep1r2, w, io, rows, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

uint32_t matvec_q8s_stamped_cuda(Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols,
                                 cudaStream_t stream, bool release_at_entry, uint64_t* stamps) {
    if (rows == 0) return 0;
    if (!matvec_q8s_fits(cols) || !x.q || !x.d || !w.codes || !w.scales || !stamps)
        fail("matvec_q8s_stamped_cuda: cols must be a multiple of 512 (<= 32768), with x, weights and stamps");
    SweepIo io = q16_io(x, y);
    io.stamps = stamps;
    const uint32_t blocks = launch_q8s_sweep_as<4, 1, 2, false, true>(w, io, rows, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return blocks;
}

bool matvec_q8s_swiglu_fits(uint32_t ff, uint32_t cols) {
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    return (!forced || *forced == MatvecQ8sKernel::sweep1r2) && ff > 0 && ff % kActBlock == 0 && matvec_q8s_fits(cols);
}

namespace {

const auto aligned16 = [](const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; };

// The checks every chained sweep makes: weights, x, and (quant) a quantized output apart from x.
void check_chained_sweep(const char* what, Q8SplitConst w, ActQ16 x, const ActQ16* out, const GluScratch* scratch) {
    if (!aligned16(w.codes) || w.scales == nullptr || reinterpret_cast<uintptr_t>(w.scales) % 2 != 0 ||
        !aligned16(x.q) || !aligned16(x.d))
        fail(std::string(what) + ": codes, x.q and x.d must be 16-byte aligned, scales 2-byte aligned");
    if (out != nullptr) {
        if (!aligned16(out->q) || out->d == nullptr || scratch == nullptr || scratch->stage == nullptr ||
            scratch->arrivals == nullptr)
            fail(std::string(what) + ": out.q must be 16-byte aligned, with out.d and the scratch given");
        // Blocks still read x while others write the output.
        if (out->q == x.q || out->d == x.d) fail(std::string(what) + ": the output must not be x");
    }
}

// A chained instance, or its stamped twin (lab) when io.stamps is set, with the hand-over the
// scratch asks for (lab variants: HandOver); returns the block count.
template <SweepOut kOut, bool kNormIn, HandOver kHandOver = HandOver::fence, bool kReleaseAfterWait = false>
uint32_t launch_chained(Q8SplitConst w, const ChainedSweepIo& io, uint32_t rows, uint32_t cols, cudaStream_t stream,
                        bool release_at_entry) {
    if constexpr (kOut == SweepOut::norm && !kReleaseAfterWait) {
        if (io.norm_out.release_after_wait) {
            if (release_at_entry) fail("matvec_q8s_norm_out_cuda: release at entry or after the wait, not both");
            // One instance for this lab variant: it hands over with fence, whatever the scratch
            // asks (lean gives the same bits).
            return launch_chained<kOut, kNormIn, HandOver::fence, true>(w, io, rows, cols, stream, false);
        }
    }
    if constexpr (kOut != SweepOut::plain && kHandOver == HandOver::fence && !kReleaseAfterWait) {
        switch (io.quant.scratch.hand_over) {
            case HandOver::lean:
                return launch_chained<kOut, kNormIn, HandOver::lean>(w, io, rows, cols, stream, release_at_entry);
            case HandOver::skip:
                return launch_chained<kOut, kNormIn, HandOver::skip>(w, io, rows, cols, stream, release_at_entry);
            default: break;
        }
    }
    if (io.stamps != nullptr)
        return launch_q8s_sweep_as<4, 1, 2, false, true, kOut, kNormIn, kHandOver, kReleaseAfterWait>(
            w, io, rows, cols, stream, release_at_entry);
    return launch_q8s_sweep_as<4, 1, 2, false, false, kOut, kNormIn, kHandOver, kReleaseAfterWait>(
        w, io, rows, cols, stream, release_at_entry);
}

void check_normed_x(const char* what, const NormedX& norm) {
    if (norm.partials != nullptr && (norm.n_partials == 0 || !(norm.eps >= 0.0f)))
        fail(std::string(what) + ": normed x needs its producer's sums of squares (at least one) and eps >= 0");
}

}  // namespace

uint32_t matvec_q8s_swiglu_cuda(Q8SplitConst w, ActQ16 x, uint32_t ff, uint32_t cols, ActQ16 out, GluScratch scratch,
                                cudaStream_t stream, bool release_at_entry, const NormedX& norm, uint64_t* stamps) {
    if (!matvec_q8s_swiglu_fits(ff, cols))
        fail("matvec_q8s_swiglu_cuda: ff must be a positive multiple of 32 and cols a multiple of 512 (<= 32768), "
             "with the sweep1r2 kernel");
    check_chained_sweep("matvec_q8s_swiglu_cuda", w, x, &out, &scratch);
    check_normed_x("matvec_q8s_swiglu_cuda", norm);
    ChainedSweepIo io{q16_io(x, nullptr)};
    io.quant = QuantOut{out, scratch};
    io.norm_in = norm;
    io.stamps = stamps;
    const uint32_t blocks = norm.partials != nullptr
                                ? launch_chained<SweepOut::glu, true>(w, io, ff, cols, stream, release_at_entry)
                                : launch_chained<SweepOut::glu, false>(w, io, ff, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return blocks;
}

bool matvec_q8s_norm_out_fits(uint32_t rows, uint32_t cols) {
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    return (!forced || *forced == MatvecQ8sKernel::sweep1r2) && rows > 0 && rows % kActBlock == 0 &&
           rows <= kMaxCols && matvec_q8s_fits(cols);
}

uint32_t matvec_q8s_norm_out_cuda(Q8SplitConst w, ActQ16 x, uint32_t rows, uint32_t cols, const NormOut& norm,
                                  cudaStream_t stream, bool release_at_entry, uint64_t* stamps) {
    if (!matvec_q8s_norm_out_fits(rows, cols))
        fail("matvec_q8s_norm_out_cuda: rows must be a positive multiple of 32 (<= 32768) and cols a multiple of 512 "
             "(<= 32768), with the sweep1r2 kernel");
    check_chained_sweep("matvec_q8s_norm_out_cuda", w, x, &norm.out, &norm.scratch);
    if (norm.stream == nullptr || norm.weight == nullptr || norm.partials == nullptr)
        fail("matvec_q8s_norm_out_cuda: the stream, the norm's weight and the partial sums must be given");
    ChainedSweepIo io{q16_io(x, nullptr)};
    io.quant = QuantOut{norm.out, norm.scratch};
    io.norm_out = norm;
    io.stamps = stamps;
    const uint32_t blocks = launch_chained<SweepOut::norm, false>(w, io, rows, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    // <= max(SMs, 171) blocks (rows <= 32768, >= 192 rows each when not one block per SM);
    // the kernel writes no partial past the limit, and the consumer would be wrong.
    if (blocks > kNormOutMaxBlocks) fail("matvec_q8s_norm_out_cuda: more blocks than partial sums");
    return blocks;
}

uint32_t matvec_q8s_normed_cuda(Q8SplitConst w, ActQ16 x, const NormedX& norm, float* y, uint32_t rows,
                                uint32_t cols, cudaStream_t stream, bool release_at_entry, uint64_t* stamps) {
    if (rows == 0) return 0;
    if (!matvec_q8s_fits(cols) || norm.partials == nullptr || y == nullptr)
        fail("matvec_q8s_normed_cuda: cols must be a multiple of 512 (<= 32768), with the sums of squares and y");
    check_chained_sweep("matvec_q8s_normed_cuda", w, x, nullptr, nullptr);
    check_normed_x("matvec_q8s_normed_cuda", norm);
    ChainedSweepIo io{q16_io(x, y)};
    io.norm_in = norm;
    io.stamps = stamps;
    const uint32_t blocks = launch_chained<SweepOut::plain, true>(w, io, rows, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return blocks;
}

bool matvec_q8s_qkv_rope_fits(uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t cols) {
    // Asked per layer and step while a decode graph is captured: the SM count once.
    static const int sms = [] {
        int device = 0, count = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            return 0;
        return count;
    }();
    if (sms <= 0) return false;
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    const uint64_t pairs = (uint64_t)(n_head + 2 * n_head_kv) * head_dim / 2;
    return (!forced || *forced == MatvecQ8sKernel::sweep1r2) && n_head > 0 && n_head_kv > 0 && head_dim >= 64 &&
           head_dim % 64 == 0 && pairs > 0 && (pairs + sms - 1) / sms <= head_dim / 2 && matvec_q8s_fits(cols);
}

uint32_t matvec_q8s_qkv_rope_cuda(Q8SplitConst w, ActQ16 x, const NormedX& norm, uint32_t cols, const QkvRope& rope,
                                  cudaStream_t stream, bool release_at_entry) {
    if (!matvec_q8s_qkv_rope_fits(rope.n_head, rope.n_head_kv, rope.head_dim, cols))
        fail("matvec_q8s_qkv_rope_cuda: heads, head_dim (even, at most head_dim / 2 pairs per SM) or cols not taken");
    if (rope.q == nullptr || rope.k_row == nullptr || rope.v_row == nullptr || rope.rope_table == nullptr ||
        norm.partials == nullptr)
        fail("matvec_q8s_qkv_rope_cuda: q, the K and V rows, the rope table and the sums of squares must be given");
    if ((rope.k_type != KvType::f16 || rope.v_type != KvType::f16) &&
        (rope.kv_scratch.stage == nullptr || rope.kv_scratch.arrivals == nullptr))
        fail("matvec_q8s_qkv_rope_cuda: a quantized K or V needs the hand-over scratch");
    check_chained_sweep("matvec_q8s_qkv_rope_cuda", w, x, nullptr, nullptr);
    check_normed_x("matvec_q8s_qkv_rope_cuda", norm);
    ChainedSweepIo io{q16_io(x, nullptr)};
    io.norm_in = norm;
    io.rope = rope;
    const uint32_t pairs = (rope.n_head + 2 * rope.n_head_kv) * rope.head_dim / 2;
    const uint32_t blocks =
        launch_q8s_sweep_as<4, 1, 2, false, false, SweepOut::rope, true, HandOver::fence, false, ChainedSweepIo>(
            w, io, pairs, cols, stream, release_at_entry);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return blocks;
}

void matvec_q8s_cuda(Q8SplitConst w, ActQ16 x, float* y, uint32_t rows, uint32_t cols, cudaStream_t stream,
                     bool release_at_entry) {
    const std::optional<MatvecQ8sKernel> forced = q8s_kernel_override();
    matvec_q8s_cuda_with(forced ? *forced : matvec_q8s_kernel_for(rows, cols), w, x, y, rows, cols, stream,
                         release_at_entry);
}

}  // namespace spillway
