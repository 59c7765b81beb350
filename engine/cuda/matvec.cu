// Decode GEMV kernels. One warp computes kRowsPerWarp rows so that each x value it loads
// serves two rows (x is re-read from L1/L2 once per row pair, W exactly once from HBM).
//
// F16/BF16: each lane streams 16-byte vectors (8 values) of its rows, kUnroll vectors per
// row in flight, coalesced across the warp.
//
// Q8_0: a 34-byte block cannot be read with aligned vectors, so the warp copies a slab of
// 64 blocks per row with coalesced 16-byte loads (8-byte-aligned fallback: 2-byte loads)
// into its own shared-memory buffer and decodes from there; the loads of the next slab are
// issued before the current one is decoded, so HBM traffic overlaps the arithmetic.
// Bytes become floats by the 2^23 magic-number trick (integer op + FADD) because the
// int-to-float converter runs at a quarter of the FMA rate and would be the bottleneck.
//
// Q8_0, one token, cols % 256 == 0: streaming kernels (stream2/stream3/stream2_i8, below);
// which one runs is the pure function matvec_q8_0_kernel_for (measured in docs/perf-notes.md).
#include "engine/cuda/matvec.cuh"

#include <cuda_bf16.h>
#include <cuda/atomic>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cp_async_device.cuh"
#include "engine/cuda/gemv_shared.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/q8_0_q16_device.cuh"

namespace spillway {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;            // 16-byte vectors per row in flight per lane (F16/BF16)
constexpr int kSlabBlocks = 64;       // Q8_0 blocks per row staged at a time
constexpr int kSlabBytes = kSlabBlocks * 34;

// Signed byte k of `biased` (bytes already xor 0x80) as a float: 0x4B0000xx is 2^23 + xx.
template <int k>
__device__ __forceinline__ float biased_byte_to_float(uint32_t biased) {
    return __int_as_float(__byte_perm(biased, 0x4B000000u, 0x7440 | k)) - 8388736.0f;
}

struct HalfF16 {
    __device__ static float2 pair(uint32_t bits) {
        return __half22float2(*reinterpret_cast<const __half2*>(&bits));
    }
};
struct HalfBF16 {
    __device__ static float2 pair(uint32_t bits) {
        return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
    }
};

template <typename Half>
__device__ __forceinline__ float dot8(const uint4& w, const float4& xa, const float4& xb) {
    const float2 p0 = Half::pair(w.x), p1 = Half::pair(w.y), p2 = Half::pair(w.z), p3 = Half::pair(w.w);
    float s = p0.x * xa.x;
    s = fmaf(p0.y, xa.y, s);
    s = fmaf(p1.x, xa.z, s);
    s = fmaf(p1.y, xa.w, s);
    s = fmaf(p2.x, xb.x, s);
    s = fmaf(p2.y, xb.y, s);
    s = fmaf(p3.x, xb.z, s);
    s = fmaf(p3.y, xb.w, s);
    return s;
}

template <int kTokens>
__device__ __forceinline__ void store_rows(float (&acc)[kRowsPerWarp][kTokens], float* y, uint32_t row0,
                                           uint32_t rows, uint32_t n_tokens, uint32_t lane) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
            const float sum = warp_sum(acc[r][t]);
            if (lane == 0 && row0 + r < rows && t < (int)n_tokens) y[(size_t)t * rows + row0 + r] = sum;
        }
    }
}

template <typename Half, int kTokens>
__global__ void __launch_bounds__(kThreads) matvec_half_kernel(const uint4* __restrict__ w,
                                                               const float* __restrict__ x,
                                                               float* __restrict__ y, uint32_t rows,
                                                               uint32_t cols, uint32_t n_tokens) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t vecs_per_row = cols / 8;
    for (uint32_t row0 = (blockIdx.x * kWarps + threadIdx.x / 32) * kRowsPerWarp; row0 < rows;
         row0 += gridDim.x * kWarps * kRowsPerWarp) {
        const uint4* w_row[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) w_row[r] = w + (size_t)min(row0 + r, rows - 1) * vecs_per_row;

        float acc[kRowsPerWarp][kTokens] = {};
        for (uint32_t base = 0; base < vecs_per_row; base += 32 * kUnroll) {
            uint4 v[kUnroll][kRowsPerWarp];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const uint32_t i = base + u * 32 + lane;
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r)
                v[u][r] = i < vecs_per_row ? __ldcs(w_row[r] + i) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const uint32_t i = base + u * 32 + lane;
                if (i >= vecs_per_row) break;
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    if (t >= (int)n_tokens) break;
                    const float4* xv = reinterpret_cast<const float4*>(x + (size_t)t * cols) + 2 * i;
                    const float4 xa = __ldg(xv), xb = __ldg(xv + 1);
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) acc[r][t] += dot8<Half>(v[u][r], xa, xb);
                }
            }
        }
        store_rows<kTokens>(acc, y, row0, rows, n_tokens, lane);
    }
}

template <int kVecBytes> struct VecOf;
template <> struct VecOf<16> { using type = uint4; };
template <> struct VecOf<2> { using type = unsigned short; };

template <int kTokens, int kVecBytes>
__global__ void __launch_bounds__(kThreads) matvec_q8_0_kernel(const uint8_t* __restrict__ w,
                                                               const float* __restrict__ x,
                                                               float* __restrict__ y, uint32_t rows,
                                                               uint32_t cols, uint32_t n_tokens) {
    using Vec = typename VecOf<kVecBytes>::type;
    constexpr int kSlabVecs = kSlabBytes / kVecBytes;
    constexpr int kLoadsPerLane = (kSlabVecs + 31) / 32;
    __shared__ alignas(16) uint8_t slab[kWarps][kRowsPerWarp][kSlabBytes];

    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warp = threadIdx.x / 32;
    const uint32_t n_blocks = cols / 32;
    const size_t row_bytes = (size_t)n_blocks * 34;
    const uint32_t n_slabs = (n_blocks + kSlabBlocks - 1) / kSlabBlocks;
    for (uint32_t row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp; row0 < rows;
         row0 += gridDim.x * kWarps * kRowsPerWarp) {
        const uint8_t* w_row[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) w_row[r] = w + (size_t)min(row0 + r, rows - 1) * row_bytes;

        Vec staged[kRowsPerWarp][kLoadsPerLane];
        auto load_slab = [&](uint32_t s) {
            const uint32_t slab_vecs = min(kSlabBlocks, (int)(n_blocks - s * kSlabBlocks)) * 34 / kVecBytes;
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const Vec* src = reinterpret_cast<const Vec*>(w_row[r] + (size_t)s * kSlabBytes);
#pragma unroll
                for (int k = 0; k < kLoadsPerLane; ++k) {
                    const uint32_t i = lane + 32 * k;
                    if (i < slab_vecs) staged[r][k] = __ldcs(src + i);
                }
            }
        };

        float acc[kRowsPerWarp][kTokens] = {};
        const uint32_t quarter = lane % 4;  // 8 of the block's 32 values
        load_slab(0);
        for (uint32_t s = 0; s < n_slabs; ++s) {
            const uint32_t slab_blocks = min(kSlabBlocks, (int)(n_blocks - s * kSlabBlocks));
            const uint32_t slab_vecs = slab_blocks * 34 / kVecBytes;
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
                for (int k = 0; k < kLoadsPerLane; ++k) {
                    const uint32_t i = lane + 32 * k;
                    if (i < slab_vecs) reinterpret_cast<Vec*>(slab[warp][r])[i] = staged[r][k];
                }
            }
            __syncwarp();
            if (s + 1 < n_slabs) load_slab(s + 1);

#pragma unroll 2
            for (uint32_t g = 0; g < kSlabBlocks / 8; ++g) {
                const uint32_t b = g * 8 + lane / 4;
                if (b >= slab_blocks) break;
                // Block scale d applied once per 8 products (sum(q*x)*d), not per weight.
                float wv[kRowsPerWarp][8];
                float scale[kRowsPerWarp];
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r) {
                    const uint8_t* blk = slab[warp][r] + b * 34;
                    scale[r] = __half2float(*reinterpret_cast<const __half*>(blk));
                    const unsigned short* q16 = reinterpret_cast<const unsigned short*>(blk + 2 + 8 * quarter);
                    const uint32_t lo = __byte_perm(q16[0], q16[1], 0x5410) ^ 0x80808080u;
                    const uint32_t hi = __byte_perm(q16[2], q16[3], 0x5410) ^ 0x80808080u;
                    wv[r][0] = biased_byte_to_float<0>(lo);
                    wv[r][1] = biased_byte_to_float<1>(lo);
                    wv[r][2] = biased_byte_to_float<2>(lo);
                    wv[r][3] = biased_byte_to_float<3>(lo);
                    wv[r][4] = biased_byte_to_float<0>(hi);
                    wv[r][5] = biased_byte_to_float<1>(hi);
                    wv[r][6] = biased_byte_to_float<2>(hi);
                    wv[r][7] = biased_byte_to_float<3>(hi);
                }
                const uint32_t col = (s * kSlabBlocks + b) * 32 + 8 * quarter;
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    if (t >= (int)n_tokens) break;
                    const float4* xv = reinterpret_cast<const float4*>(x + (size_t)t * cols + col);
                    const float4 xa = __ldg(xv), xb = __ldg(xv + 1);
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) {
                        float sum = wv[r][0] * xa.x;
                        sum = fmaf(wv[r][1], xa.y, sum);
                        sum = fmaf(wv[r][2], xa.z, sum);
                        sum = fmaf(wv[r][3], xa.w, sum);
                        sum = fmaf(wv[r][4], xb.x, sum);
                        sum = fmaf(wv[r][5], xb.y, sum);
                        sum = fmaf(wv[r][6], xb.z, sum);
                        sum = fmaf(wv[r][7], xb.w, sum);
                        acc[r][t] = fmaf(scale[r], sum, acc[r][t]);
                    }
                }
            }
            __syncwarp();
        }
        store_rows<kTokens>(acc, y, row0, rows, n_tokens, lane);
    }
}

// ---- Q8_0, one token: streaming kernel ----
// Why: the staged kernel spends its time on 2-byte shared-memory loads and per-quarter-block
// bookkeeping (Nsight: 60% of stalls on LDS, DRAM 38%). Here a block pair (68 bytes) is the
// unit: with the row 4-byte aligned, block B's 32 quants are 8 aligned words and block A's are
// 8 words realigned with one byte permute each, so every shared-memory load is a full 32-bit
// word. Eight lanes share a pair (8 weights each); four pairs per warp step are 256
// consecutive columns, so the x loads of a step are 1 KB contiguous (L1 hits after the first
// row) and serve both rows of the warp. Raw bytes go HBM -> shared memory by cp.async (no
// register staging), kStages - 1 chunks ahead. Each warp owns a contiguous range of row pairs,
// sized so that the whole grid is resident at once with equal work per warp (no tail wave).
constexpr int kStreamWarps = 4;
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kChunkPairs = 32;                // block pairs per row per chunk
constexpr int kChunkBytes = kChunkPairs * 68;  // 2176 = 136 x 16 bytes
// q16x ring stages: 2 with two rows per warp, 3 with one (the same bytes in flight); + deep.
__host__ __device__ constexpr int q16x_stages(int rows_per_warp, int deep) {
    return (rows_per_warp == 1 ? 3 : 2) + deep;
}

template <int kStages, bool kInt8>
__global__ void __launch_bounds__(kStreamThreads) matvec_q8_0_stream_kernel(const uint8_t* __restrict__ w,
                                                                            const float* __restrict__ x,
                                                                            float* __restrict__ y, uint32_t rows,
                                                                            uint32_t cols, uint32_t pairs_per_warp) {
    extern __shared__ uint4 stream_smem[];  // [warp][stage][2 rows][kChunkBytes]
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warp = threadIdx.x / 32;
    uint8_t* ring = reinterpret_cast<uint8_t*>(stream_smem) + (size_t)warp * kStages * 2 * kChunkBytes;

    const uint32_t ppr = cols / 64;                           // block pairs per row (multiple of 4)
    const uint32_t cpr = (ppr + kChunkPairs - 1) / kChunkPairs;  // chunks per row
    const size_t row_bytes = (size_t)ppr * 68;
    const uint32_t n_row_pairs = (rows + 1) / 2;
    const uint32_t rp0 = (blockIdx.x * kStreamWarps + warp) * pairs_per_warp;
    // Warps past the last row pair get no chunks (no early return: the int8 variant has a
    // block-wide barrier after quantizing x).
    const uint32_t n_chunks = rp0 < n_row_pairs ? (min(rp0 + pairs_per_warp, n_row_pairs) - rp0) * cpr : 0;

    auto issue = [&](uint32_t k) {
        if (k < n_chunks) {
            const uint32_t rp = rp0 + k / cpr, ci = k % cpr;
            const uint32_t vecs = min(kChunkPairs, (int)(ppr - ci * kChunkPairs)) * 68 / 16;
            uint8_t* dst = ring + (k % kStages) * 2 * kChunkBytes;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint8_t* src = w + (size_t)min(2 * rp + r, rows - 1) * row_bytes + (size_t)ci * kChunkBytes;
                for (uint32_t i = lane; i < vecs; i += 32) cp_async16(dst + r * kChunkBytes + 16 * i, src + 16 * i);
            }
        }
        cp_async_commit();  // empty groups keep the wait count uniform at the end
    };

    const uint32_t sub = lane / 8;   // which of the step's 4 pairs
    const uint32_t t = lane % 8;     // lanes 0-3: block A of the pair, 4-7: block B
    const bool in_a = t < 4;
    const uint32_t col_in_pair = (in_a ? 0 : 32) + (t % 4) * 8;
    // A lanes realign bytes 2..5 of (lo, hi); B lanes take hi as is (selector 0x7654).
    const uint32_t realign = in_a ? 0x5432u : 0x7654u;
    const uint32_t scale_shift = in_a ? 0 : 16;  // dA is the low half of word 0, dB the high half of word 8
    float acc[2] = {0.0f, 0.0f};

#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) issue(k);

    // Int8 variant: x quantized per 32 values like a Q8_0 block (d = amax / 127, q = rint(x / d)),
    // once per block into shared memory while the first chunks of W are in flight; then each
    // 4 weights are one dp4a. Changes results by x's rounding (~4e-3 relative, see the test).
    const int8_t* xq = nullptr;
    const float* xd = nullptr;
    if constexpr (kInt8) {
        uint8_t* x_smem = reinterpret_cast<uint8_t*>(stream_smem) + (size_t)kStreamWarps * kStages * 2 * kChunkBytes;
        int8_t* xq_w = reinterpret_cast<int8_t*>(x_smem);
        float* xd_w = reinterpret_cast<float*>(x_smem + cols);
        xq = xq_w;
        xd = xd_w;
        for (uint32_t b = threadIdx.x; b < cols / 32; b += kStreamThreads) {
            float4 v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = __ldg(reinterpret_cast<const float4*>(x + 32 * b) + i);
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i)
                amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
            const float d = amax / 127.0f;
            uint32_t packed[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int q0 = d > 0.0f ? __float2int_rn(v[i].x / d) : 0, q1 = d > 0.0f ? __float2int_rn(v[i].y / d) : 0;
                const int q2 = d > 0.0f ? __float2int_rn(v[i].z / d) : 0, q3 = d > 0.0f ? __float2int_rn(v[i].w / d) : 0;
                packed[i] = __byte_perm(__byte_perm(q0, q1, 0x0040), __byte_perm(q2, q3, 0x0040), 0x5410);
            }
            uint4* dst = reinterpret_cast<uint4*>(xq_w + 32 * b);
            dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
            xd_w[b] = d;
        }
        __syncthreads();
    }
    for (uint32_t k = 0; k < n_chunks; ++k) {
        issue(k + kStages - 1);
        cp_async_wait<kStages - 1>();
        __syncwarp();  // other lanes' copies of chunk k are visible after this
        const uint32_t rp = rp0 + k / cpr, ci = k % cpr;
        const uint32_t pairs = min(kChunkPairs, (int)(ppr - ci * kChunkPairs));
        const uint32_t* buf = reinterpret_cast<const uint32_t*>(ring + (k % kStages) * 2 * kChunkBytes);
#pragma unroll
        for (uint32_t j = 0; j < kChunkPairs / 4; ++j) {  // unrolled: all x loads of the chunk issue early
            const uint32_t p = 4 * j + sub;
            if (4 * j >= pairs) break;  // pairs % 4 == 0: all lanes take the same trips
            const uint32_t col = (ci * kChunkPairs + p) * 64 + col_in_pair;
            float4 xa, xb;
            uint2 xw;
            float xs = 0.0f;
            if constexpr (kInt8) {
                xw = *reinterpret_cast<const uint2*>(xq + col);
                xs = xd[col / 32];
            } else {
                xa = __ldg(reinterpret_cast<const float4*>(x + col));
                xb = __ldg(reinterpret_cast<const float4*>(x + col + 4));
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint32_t* pw = buf + r * (kChunkBytes / 4) + p * 17;
                // Pair layout in words: w0 = dA | qA0 qA1, w1..w8 = qA.., w8 = qA30 qA31 | dB,
                // w9..w16 = qB. Lane t reads words 2t..2t+2 (A) or 2t+1..2t+2 (B).
                const uint32_t w0 = pw[2 * t], w1 = pw[2 * t + 1], w2 = pw[2 * t + 2];
                const uint32_t dw = pw[in_a ? 0 : 8];
                const uint32_t q0 = __byte_perm(w0, w1, realign);
                const uint32_t q1 = __byte_perm(w1, w2, realign);
                const float d = __half2float(__ushort_as_half((unsigned short)(dw >> scale_shift)));
                if constexpr (kInt8) {
                    const int isum = __dp4a((int)q1, (int)xw.y, __dp4a((int)q0, (int)xw.x, 0));
                    acc[r] = fmaf(d * xs, (float)isum, acc[r]);
                } else {
                    const uint32_t b0 = q0 ^ 0x80808080u, b1 = q1 ^ 0x80808080u;
                    float sum = biased_byte_to_float<0>(b0) * xa.x;
                    sum = fmaf(biased_byte_to_float<1>(b0), xa.y, sum);
                    sum = fmaf(biased_byte_to_float<2>(b0), xa.z, sum);
                    sum = fmaf(biased_byte_to_float<3>(b0), xa.w, sum);
                    sum = fmaf(biased_byte_to_float<0>(b1), xb.x, sum);
                    sum = fmaf(biased_byte_to_float<1>(b1), xb.y, sum);
                    sum = fmaf(biased_byte_to_float<2>(b1), xb.z, sum);
                    sum = fmaf(biased_byte_to_float<3>(b1), xb.w, sum);
                    acc[r] = fmaf(d, sum, acc[r]);
                }
            }
        }
        __syncwarp();  // chunk k's buffer is refilled by the next iteration's issue
        if (ci == cpr - 1) {  // last chunk of this row pair: reduce and store
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float total = warp_sum(acc[r]);
                if (lane == 0 && 2 * rp + r < rows) y[2 * rp + r] = total;
                acc[r] = 0.0f;
            }
        }
    }
    cp_async_wait<0>();  // leave no copy in flight into shared memory of an exiting warp
}

// ---- Q8_0, one token, x pre-quantized to int16 blocks (act_quant.cuh): stream_q16x ----
// Why: stream2_i8 reached 92% of HBM on the lm head but only 52-63% on the 75 MB matrices,
// where every block quantizing all of x itself (55 KB of f32 from L2 per block, then a
// barrier) is not amortized. Here the producer of x wrote it once as int16 + scales, so a
// block only copies 2.1 bytes per column (cp.async, in flight together with its first W
// chunk), and each 4 weights are two __dp2a (16x8-bit) products: exact in W, x rounded to
// 16 bits (~2e-5 relative, act_quant.cuh). Same W streaming as stream2: 68-byte block pairs,
// 8 lanes per pair, a 2-stage cp.async ring per warp, contiguous row-pair ranges per warp.
// kXInSmem = false reads x through L1 (__ldg) instead of copying it (no prologue, no barrier).
// kRows rows per warp (1 or 2): two share each x load; one halves the unit of work, so that
// matrices with few rows per warp (5120 rows over ~2000 resident warps) end less unevenly
// (a warp streams at a rate set by its ring depth, so a warp with 2 units where others have
// 1 doubles the kernel's tail). One row gets a 3-stage ring: the same bytes in flight per
// warp as two rows with 2 stages, in less shared memory.
//
// carry != nullptr: the work is split by chunks, not by row pairs. A 5120-row matrix has 2560
// row pairs for ~2100 resident warps, so a fifth of the warps got two pairs and the kernel
// ended with a tail in which only they streamed (Nsight, docs/perf-notes.md); by chunks every
// warp gets floor or ceil of the average. A pair cut between warps w and w + 1: warp w + 1
// computes the pair's last chunks first thing and publishes its partial sums in carry[w + 1]
// (value and a "set" tag in one 64-bit word: no fence needed); warp w, whose range ends with
// the pair's first chunks, adds them to its own at its end (waiting if they are not there
// yet, which is rare: they were due chunks earlier) and clears the slot for the next launch.
// The sum is always first part + second part, so results do not depend on timing. The host
// picks this only when every warp gets at least a pair's worth of chunks (no pair spans
// three warps).
// kDeep: more ring stages (1: two chunks in flight per warp instead of one, variant smem4_s3;
// 2: three, smem4_s4), at the cost of fewer resident blocks.
template <int kWarpsPB, bool kXInSmem, int kRows, int kDeep = 0>
__global__ void __launch_bounds__(kWarpsPB * 32) matvec_q8_0_q16x_kernel(const uint8_t* __restrict__ w,
                                                                         const int16_t* __restrict__ xq,
                                                                         const float* __restrict__ xd,
                                                                         float* __restrict__ y, uint32_t rows,
                                                                         uint32_t cols, uint32_t n_warps,
                                                                         unsigned long long* __restrict__ carry,
                                                                         uint32_t release_at_entry) {
    constexpr int kStages = q16x_stages(kRows, kDeep);
    // The kernel after us (a small kernel waiting for our y) may be scheduled now and sit in
    // its own dependency wait, instead of being launched only once our last block exits.
    if (release_at_entry) pdl_release_dependents();
    extern __shared__ uint4 q16x_smem[];  // [warp][stage][kRows][kChunkBytes], then x (q, d)
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warp = threadIdx.x / 32;
    uint8_t* ring = reinterpret_cast<uint8_t*>(q16x_smem) + (size_t)warp * kStages * kRows * kChunkBytes;
    const uint32_t ppr = cols / 64;
    const uint32_t cpr = (ppr + kChunkPairs - 1) / kChunkPairs;
    const size_t row_bytes = (size_t)ppr * 68;
    const uint32_t n_row_pairs = (rows + kRows - 1) / kRows;  // row groups of kRows
    // Warp w owns row groups [w * P / W, (w + 1) * P / W): every warp of the (fully resident)
    // grid gets floor or ceil of the average, so no SM holds more than its share.
    const uint32_t gw = blockIdx.x * kWarpsPB + warp;
    const uint32_t total_chunks = n_row_pairs * cpr;
    uint32_t c0 = total_chunks, c1 = total_chunks;  // this warp's chunks [c0, c1)
    if (gw < n_warps) {
        if (carry != nullptr) {
            c0 = (uint32_t)((uint64_t)gw * total_chunks / n_warps);
            c1 = (uint32_t)((uint64_t)(gw + 1) * total_chunks / n_warps);
        } else {
            c0 = (uint32_t)((uint64_t)gw * n_row_pairs / n_warps) * cpr;
            c1 = (uint32_t)((uint64_t)(gw + 1) * n_row_pairs / n_warps) * cpr;
        }
    }
    // No early return for warps without rows: the shared-x variant has a block barrier.
    const uint32_t n_chunks = c1 - c0;
    const bool starts_cut = c0 % cpr != 0 && n_chunks > 0, ends_cut = c1 % cpr != 0 && n_chunks > 0;

    auto issue = [&](uint32_t k) {
        if (k < n_chunks) {
            const uint32_t rp = (c0 + k) / cpr, ci = (c0 + k) % cpr;
            const uint32_t vecs = min(kChunkPairs, (int)(ppr - ci * kChunkPairs)) * 68 / 16;
            uint8_t* dst = ring + (k % kStages) * kRows * kChunkBytes;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const uint8_t* src = w + (size_t)min(kRows * rp + r, rows - 1) * row_bytes + (size_t)ci * kChunkBytes;
                for (uint32_t i = lane; i < vecs; i += 32) cp_async16(dst + r * kChunkBytes + 16 * i, src + 16 * i);
            }
        }
        cp_async_commit();  // empty groups keep the wait count uniform
    };

    const uint32_t sub = lane / 8;
    const Q8PairLane pl = q8_pair_lane(lane);
    float acc[kRows] = {};

    // W does not depend on the kernel before us (the producer of x): with programmatic
    // dependent launch this block may start while that kernel still runs, so the first W
    // chunk is requested before waiting for it (hides the launch gap and the first DRAM trip).
#pragma unroll
    for (int k = 0; k < kStages - 1; ++k) issue(k);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();  // x's producer has completed and its writes are visible
#endif
    const int16_t* x_q = xq;
    const float* x_d = xd;
    uint8_t* x_smem = nullptr;
    if constexpr (kXInSmem) {
        x_smem = reinterpret_cast<uint8_t*>(q16x_smem) + (size_t)kWarpsPB * kStages * kRows * kChunkBytes;
        const uint32_t q_vecs = cols * 2 / 16, d_vecs = cols / 8 / 16;  // cols % 256 == 0: whole vectors
        for (uint32_t i = threadIdx.x; i < q_vecs; i += kWarpsPB * 32)
            cp_async16(x_smem + 16 * i, reinterpret_cast<const uint8_t*>(xq) + 16 * i);
        for (uint32_t i = threadIdx.x; i < d_vecs; i += kWarpsPB * 32)
            cp_async16(x_smem + cols * 2 + 16 * i, reinterpret_cast<const uint8_t*>(xd) + 16 * i);
        cp_async_commit();
    }
    // The ring's last slot goes out now, behind x's copies rather than after they land (the
    // loop's first issue, moved here): a DRAM trip no longer waits for x's L2 trip.
    issue(kStages - 1);
    if constexpr (kXInSmem) {
        cp_async_wait<1>();  // this thread's x copies (and the chunks before the last) have landed
        __syncthreads();     // ... and everyone else's
        x_q = reinterpret_cast<const int16_t*>(x_smem);
        x_d = reinterpret_cast<const float*>(x_smem + cols * 2);
    }

    for (uint32_t k = 0; k < n_chunks; ++k) {
        if (k > 0) issue(k + kStages - 1);
        cp_async_wait<kStages - 1>();
        __syncwarp();
        const uint32_t ci = (c0 + k) % cpr;
        const uint32_t pairs = min(kChunkPairs, (int)(ppr - ci * kChunkPairs));
        const uint32_t* buf = reinterpret_cast<const uint32_t*>(ring + (k % kStages) * kRows * kChunkBytes);
#pragma unroll
        for (uint32_t j = 0; j < kChunkPairs / 4; ++j) {
            const uint32_t p = 4 * j + sub;
            if (4 * j >= pairs) break;
            const uint32_t col = (ci * kChunkPairs + p) * 64 + pl.col_in_pair;
            uint4 xv;
            float xs;
            if constexpr (kXInSmem) {
                xv = *reinterpret_cast<const uint4*>(x_q + col);
                xs = x_d[col / 32];
            } else {
                xv = __ldg(reinterpret_cast<const uint4*>(x_q + col));
                xs = __ldg(x_d + col / 32);
            }
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] = q8_pair_dot(buf + r * (kChunkBytes / 4) + p * 17, pl, xv, xs, acc[r]);
        }
        __syncwarp();
        if (ci == cpr - 1) {
            const uint32_t rp = (c0 + k) / cpr;
            const bool publish = starts_cut && rp == c0 / cpr;  // the second part of a cut pair
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const float total = warp_sum(acc[r]);
                if (lane == 0 && publish) {
                    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(carry[(size_t)gw * kRows + r]);
                    slot.store((1ull << 32) | __float_as_uint(total), cuda::memory_order_relaxed);
                } else if (lane == 0 && kRows * rp + r < rows) {
                    y[kRows * rp + r] = total;
                }
                acc[r] = 0.0f;
            }
        }
    }
    cp_async_wait<0>();
    if (ends_cut) {  // the first part of pair c1 / cpr: add the next warp's second part
        const uint32_t rp = c1 / cpr;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float total = warp_sum(acc[r]);
            if (lane == 0) {
                cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(carry[(size_t)(gw + 1) * kRows + r]);
                unsigned long long v;
                while (((v = slot.load(cuda::memory_order_relaxed)) >> 32) == 0) __nanosleep(64);
                slot.store(0ull, cuda::memory_order_relaxed);
                if (kRows * rp + r < rows) y[kRows * rp + r] = total + __uint_as_float((uint32_t)v);
            }
        }
    }
}

constexpr uint32_t kQ16MaxCols = 32768;  // x in shared memory: 2.125 B per column, <= 68 KB

}  // namespace

// The cut pairs' partial sums (the kernel above): one 64-bit slot per row of each warp,
// zero between launches. One buffer per (device, stream), allocated on the stream's first
// chunk-split launch (never inside a graph capture: the engine warms up directly, as for
// the attribute set-up below) and kept for the process. GEMVs on one stream never touch
// their buffer at once (a programmatically launched one reaches it only after its
// predecessor completed); GEMVs on two streams may run together and must not share slots: a
// reader could take the other launch's partial sum, or wait forever for one it consumed.
unsigned long long* gemv_carry_slots(cudaStream_t stream, uint32_t needed) {
    static std::mutex mutex;
    static std::map<std::pair<int, cudaStream_t>, unsigned long long*> buffers;
    int device = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(mutex);
    unsigned long long*& slots = buffers[{device, stream}];
    if (slots == nullptr) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        SPILLWAY_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
        if (capture != cudaStreamCaptureStatusNone)
            fail("decode GEMV: first row-splitting GEMV on a stream inside a graph capture; launch once outside it");
        int sms = 0, threads = 0;
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
        const size_t most = (size_t)sms * (size_t)threads / 32 * 2;  // every resident warp, two rows
        if (needed > most) fail("decode GEMV: more carry slots than resident warps");
        unsigned long long* fresh = nullptr;
        SPILLWAY_CUDA_CHECK(cudaMalloc(&fresh, most * sizeof(unsigned long long)));
        // On the launch's own stream: a plain cudaMemset runs on the legacy stream, which a
        // non-blocking stream does not wait for, so the first GEMV could race the zeroing
        // (seen on the H200: the kernel bench, one fresh non-blocking stream per row, hung
        // on a reader whose slot was wiped after its partner had set it).
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(fresh, 0, most * sizeof(unsigned long long), stream));
        slots = fresh;
    }
    return slots;
}

namespace {

// SPILLWAY_Q16X_SPLIT=pairs keeps the row-pair split (A/B in one run; docs/perf-notes.md).
bool q16x_chunk_split_enabled() {
    static const bool enabled = !lab_knob("SPILLWAY_Q16X_SPLIT", "pairs", "chunks");
    return enabled;
}

// Split by chunks when that shortens the busiest warp's work (measured, docs/perf-notes.md:
// 5120x5120 12.7 -> 11.2 us; where both splits give the busiest warp the same chunk count,
// e.g. 7168x5120 (6 either way), the cut pairs' hand-over only costs, +2%) and every warp
// still gets a whole pair's worth of chunks (see the kernel).
bool q16x_splits_by_chunks(uint32_t rows, uint32_t cols, int rows_per_warp, uint32_t slot_warps) {
    const uint64_t n_row_pairs = (rows + rows_per_warp - 1) / rows_per_warp;
    const uint64_t cpr = (cols / 64 + kChunkPairs - 1) / kChunkPairs;
    const uint64_t busiest_by_pairs = (n_row_pairs + slot_warps - 1) / slot_warps * cpr;
    const uint64_t busiest_by_chunks = (n_row_pairs * cpr + slot_warps - 1) / slot_warps;
    return q16x_chunk_split_enabled() && busiest_by_chunks < busiest_by_pairs && n_row_pairs * cpr / slot_warps >= cpr;
}

struct Q16xGrid {
    size_t smem;
    uint32_t slot_warps;  // warps resident at once on the whole device
};

template <int kWarpsPB, bool kXInSmem, int kRows, int kDeep = 0>
Q16xGrid q16x_grid(uint32_t cols) {
    constexpr size_t kRingSmem = (size_t)kWarpsPB * q16x_stages(kRows, kDeep) * kRows * kChunkBytes;
    constexpr size_t kMaxSmem = kRingSmem + (kXInSmem ? kQ16MaxCols * 2 + kQ16MaxCols / 8 : 0);
    const size_t smem = kRingSmem + (kXInSmem ? cols * 2 + cols / 8 : 0);
    constexpr auto kKernel = matvec_q8_0_q16x_kernel<kWarpsPB, kXInSmem, kRows, kDeep>;
    return {smem, gemv_resident_warps<kKernel>(kWarpsPB, smem, kMaxSmem)};
}

template <int kWarpsPB, bool kXInSmem, int kRows, int kDeep = 0>
void launch_q8_0_q16x(const uint8_t* w, const int16_t* xq, const float* xd, float* y, uint32_t rows, uint32_t cols,
                      cudaStream_t stream, bool release_at_entry) {
    constexpr auto kKernel = matvec_q8_0_q16x_kernel<kWarpsPB, kXInSmem, kRows, kDeep>;
    const auto [smem, slot_warps] = q16x_grid<kWarpsPB, kXInSmem, kRows, kDeep>(cols);
    const uint32_t n_row_pairs = (rows + kRows - 1) / kRows;
    const bool by_chunks = q16x_splits_by_chunks(rows, cols, kRows, slot_warps);
    const uint32_t warps = std::min(slot_warps, n_row_pairs);
    const uint32_t blocks = (warps + kWarpsPB - 1) / kWarpsPB;
    unsigned long long* carry = by_chunks ? gemv_carry_slots(stream, slot_warps * kRows) : nullptr;
    // Programmatic dependent launch (sm_90+): see the kernel's prologue.
    launch_with_pdl(pdl_supported(), kKernel, dim3(blocks), dim3(kWarpsPB * 32), smem, stream, w, xq, xd, y, rows, cols,
                    warps, carry, release_at_entry ? 1u : 0u);
}

constexpr uint32_t kInt8MaxCols = 32768;  // x as int8 + scales in shared memory: <= 36 KB

template <int kStages, bool kInt8>
void launch_q8_0_stream(const uint8_t* w, const float* x, float* y, uint32_t rows, uint32_t cols,
                        cudaStream_t stream) {
    constexpr size_t kRingSmem = (size_t)kStreamWarps * kStages * 2 * kChunkBytes;
    constexpr size_t kMaxSmem = kRingSmem + (kInt8 ? kInt8MaxCols + kInt8MaxCols / 32 * 4 : 0);
    const size_t smem = kRingSmem + (kInt8 ? cols + cols / 32 * 4 : 0);
    constexpr auto kKernel = matvec_q8_0_stream_kernel<kStages, kInt8>;
    // Resident warps on the whole device, for the largest shared-memory size this instance uses.
    static const uint32_t slot_warps = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem));
        int device = 0, sms = 0, per_sm = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kStreamThreads, kMaxSmem));
        return (uint32_t)std::max(1, sms * per_sm) * kStreamWarps;
    }();
    const uint32_t n_row_pairs = (rows + 1) / 2;
    const uint32_t pairs_per_warp = (n_row_pairs + slot_warps - 1) / slot_warps;
    const uint32_t warps = (n_row_pairs + pairs_per_warp - 1) / pairs_per_warp;
    const uint32_t blocks = (warps + kStreamWarps - 1) / kStreamWarps;
    kKernel<<<blocks, kStreamThreads, smem, stream>>>(w, x, y, rows, cols, pairs_per_warp);
}

// Grid for one token: as many blocks as fit at once (each loops over row pairs), or fewer
// when the matrix is small. Measured (docs/perf-notes.md, runs 2-3): 13824-row matrices 5-7%
// faster than one block per 8 rows, the 152064-row head 7% slower. Small batches were 14-28%
// slower with it, so they keep one block per 8 rows.
template <auto kKernel>  // one cached occupancy per kernel instance
dim3 matvec_grid(uint32_t rows, uint32_t n_tokens) {
    const uint32_t needed = (rows + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp);
    if (n_tokens > 1) return dim3(needed);
    static const uint32_t slots = [] {
        int device = 0, sms = 0, per_sm = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0));
        return (uint32_t)std::max(1, sms * per_sm);
    }();
    return dim3(std::min(needed, slots));
}

template <auto kKernel, typename W>
void launch(const W* w, const float* x, float* y, uint32_t rows, uint32_t cols, uint32_t n_tokens,
            cudaStream_t stream) {
    kKernel<<<matvec_grid<kKernel>(rows, n_tokens), kThreads, 0, stream>>>(w, x, y, rows, cols, n_tokens);
}

template <int kTokens>
void launch_q8_0_staged(const uint8_t* w_bytes, const float* x, float* y, uint32_t rows, uint32_t cols,
                        uint32_t n_tokens, cudaStream_t stream) {
    // 16-byte loads need every row to start 16-byte aligned: cols % 256 == 0.
    if ((cols / 32 * 34) % 16 == 0)
        return launch<matvec_q8_0_kernel<kTokens, 16>>(w_bytes, x, y, rows, cols, n_tokens, stream);
    return launch<matvec_q8_0_kernel<kTokens, 2>>(w_bytes, x, y, rows, cols, n_tokens, stream);
}

void check_args(GgmlType w_type, const void* w, const float* x, uint32_t cols, uint32_t n_tokens) {
    if (n_tokens > kMatvecMaxTokens) fail("matvec_cuda: more than 8 tokens; use the prefill matmul");
    const uint32_t col_multiple = w_type == GgmlType::Q8_0 ? 32 : 8;
    if (cols == 0 || cols % col_multiple != 0)
        fail("matvec_cuda: cols must be a positive multiple of " + std::to_string(col_multiple));
    if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
        fail("matvec_cuda: w and x must be 16-byte aligned");
}

void run_q8_0(MatvecQ8Kernel kernel, const void* w, const float* x, float* y, uint32_t rows, uint32_t cols,
              uint32_t n_tokens, cudaStream_t stream) {
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    switch (kernel) {
        case MatvecQ8Kernel::stream2: return launch_q8_0_stream<2, false>(w_bytes, x, y, rows, cols, stream);
        case MatvecQ8Kernel::stream3: return launch_q8_0_stream<3, false>(w_bytes, x, y, rows, cols, stream);
        case MatvecQ8Kernel::stream2_i8: return launch_q8_0_stream<2, true>(w_bytes, x, y, rows, cols, stream);
        case MatvecQ8Kernel::staged: break;
    }
    if (n_tokens == 1) launch_q8_0_staged<1>(w_bytes, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens == 2) launch_q8_0_staged<2>(w_bytes, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens <= 4) launch_q8_0_staged<4>(w_bytes, x, y, rows, cols, n_tokens, stream);
    else launch_q8_0_staged<8>(w_bytes, x, y, rows, cols, n_tokens, stream);
}

template <int kTokens>
void launch_for_tokens(GgmlType w_type, const void* w, const float* x, float* y, uint32_t rows,
                       uint32_t cols, uint32_t n_tokens, cudaStream_t stream) {
    const auto* w_vec = static_cast<const uint4*>(w);
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    switch (w_type) {
        case GgmlType::F16:
            return launch<matvec_half_kernel<HalfF16, kTokens>>(w_vec, x, y, rows, cols, n_tokens, stream);
        case GgmlType::BF16:
            return launch<matvec_half_kernel<HalfBF16, kTokens>>(w_vec, x, y, rows, cols, n_tokens, stream);
        case GgmlType::Q8_0:
            return launch_q8_0_staged<kTokens>(w_bytes, x, y, rows, cols, n_tokens, stream);
        default: fail(std::string("matvec_cuda: unsupported weight type ") + ggml_type_name(w_type));
    }
}

}  // namespace

bool matvec_supports(GgmlType w_type) {
    return w_type == GgmlType::F16 || w_type == GgmlType::BF16 || w_type == GgmlType::Q8_0;
}

void matvec_cuda(GgmlType w_type, const void* w, const float* x, float* y, uint32_t rows,
                 uint32_t cols, uint32_t n_tokens, cudaStream_t stream) {
    if (!matvec_supports(w_type)) fail(std::string("matvec_cuda: unsupported weight type ") + ggml_type_name(w_type));
    if (rows == 0 || n_tokens == 0) return;
    check_args(w_type, w, x, cols, n_tokens);
    if (w_type == GgmlType::Q8_0) {
        run_q8_0(matvec_q8_0_kernel_for(cols, n_tokens), w, x, y, rows, cols, n_tokens, stream);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (n_tokens == 1) launch_for_tokens<1>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens == 2) launch_for_tokens<2>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens <= 4) launch_for_tokens<4>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else launch_for_tokens<8>(w_type, w, x, y, rows, cols, n_tokens, stream);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

// Measured on the H200 (docs/perf-notes.md, "Q8_0 GEMV streaming kernel"): stream2 beats the
// staged kernel on 5120-column matrices (13824x5120 37.5 -> 34.0 us, 27648x5120 65.6 -> 60.8,
// 152064x5120 317.6 -> 295.9) but loses on 13824 columns (5120x13824 34.7 -> 40.4 us: x, 55 KB,
// no longer stays in L1 next to the cp.async ring), so it is picked up to 8192 columns only.
// stream2_i8 (fastest, 92% of HBM on the lm head) changes numerics and is never picked here.
MatvecQ8Kernel matvec_q8_0_kernel_for(uint32_t cols, uint32_t n_tokens) {
    return matvec_q8_0_kernel_fits(MatvecQ8Kernel::stream2, cols, n_tokens) && cols <= 8192 ? MatvecQ8Kernel::stream2
                                                                                          : MatvecQ8Kernel::staged;
}

bool matvec_q8_0_kernel_fits(MatvecQ8Kernel kernel, uint32_t cols, uint32_t n_tokens) {
    if (kernel == MatvecQ8Kernel::staged) return true;
    if (kernel == MatvecQ8Kernel::stream2_i8 && cols > kInt8MaxCols) return false;
    return n_tokens == 1 && cols > 0 && cols % 256 == 0;
}

void matvec_q8_0_cuda(MatvecQ8Kernel kernel, const void* w, const float* x, float* y, uint32_t rows,
                      uint32_t cols, uint32_t n_tokens, cudaStream_t stream) {
    if (rows == 0 || n_tokens == 0) return;
    check_args(GgmlType::Q8_0, w, x, cols, n_tokens);
    if (!matvec_q8_0_kernel_fits(kernel, cols, n_tokens)) fail("matvec_q8_0_cuda: kernel does not fit this shape");
    run_q8_0(kernel, w, x, y, rows, cols, n_tokens, stream);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

bool matvec_q8_0_q16x_fits(uint32_t cols) { return cols > 0 && cols % 256 == 0 && cols <= kQ16MaxCols; }

// Measured on the H200 (docs/perf-notes.md, "Q8_0 GEMV on pre-quantized x"): smem4 is the
// fastest or within 2% of it on every 14B layer shape; global4 (x through L1) is 5-80% slower,
// the one-row variants 2-25% slower (finer work split, but twice the x loads and chunk overhead).
// The output head (the only matrix of 64k rows or more in these models) streams ~830 MB in one
// launch: there the third ring stage's deeper queue wins (session 17, 152064x5120: smem4_s3
// 194.7 us vs smem4 203.3; gate|up 27648x5120: 44.3 vs 39.8, so only the head).
MatvecQ16xKernel matvec_q8_0_q16x_kernel_for(uint32_t rows, uint32_t cols) {
    (void)cols;
    return rows >= 65536 ? MatvecQ16xKernel::smem4_s3 : MatvecQ16xKernel::smem4;
}

void matvec_q8_0_q16x_cuda_with(MatvecQ16xKernel kernel, const void* w, ActQ16 x, float* y, uint32_t rows,
                                uint32_t cols, cudaStream_t stream, bool release_at_entry) {
    if (rows == 0) return;
    if (!matvec_q8_0_q16x_fits(cols)) fail("matvec_q8_0_q16x_cuda: cols must be a multiple of 256, at most 32768");
    if (!x.q || !x.d) fail("matvec_q8_0_q16x_cuda: no quantized x");
    if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x.q) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(x.d) % 16 != 0)
        fail("matvec_q8_0_q16x_cuda: w, x.q and x.d must be 16-byte aligned");
    const auto* w_bytes = static_cast<const uint8_t*>(w);
    switch (kernel) {
        case MatvecQ16xKernel::smem4: launch_q8_0_q16x<4, true, 2>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::smem8: launch_q8_0_q16x<8, true, 2>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::global4: launch_q8_0_q16x<4, false, 2>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::smem4_r1: launch_q8_0_q16x<4, true, 1>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::smem8_r1: launch_q8_0_q16x<8, true, 1>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::smem4_s3: launch_q8_0_q16x<4, true, 2, 1>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
        case MatvecQ16xKernel::smem4_s4: launch_q8_0_q16x<4, true, 2, 2>(w_bytes, x.q, x.d, y, rows, cols, stream, release_at_entry); break;
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

bool matvec_q8_0_q16x_splits_by_chunks(MatvecQ16xKernel kernel, uint32_t rows, uint32_t cols) {
    if (!matvec_q8_0_q16x_fits(cols)) return false;
    switch (kernel) {
        case MatvecQ16xKernel::smem4: return q16x_splits_by_chunks(rows, cols, 2, q16x_grid<4, true, 2>(cols).slot_warps);
        case MatvecQ16xKernel::smem8: return q16x_splits_by_chunks(rows, cols, 2, q16x_grid<8, true, 2>(cols).slot_warps);
        case MatvecQ16xKernel::global4: return q16x_splits_by_chunks(rows, cols, 2, q16x_grid<4, false, 2>(cols).slot_warps);
        case MatvecQ16xKernel::smem4_r1: return q16x_splits_by_chunks(rows, cols, 1, q16x_grid<4, true, 1>(cols).slot_warps);
        case MatvecQ16xKernel::smem8_r1: return q16x_splits_by_chunks(rows, cols, 1, q16x_grid<8, true, 1>(cols).slot_warps);
        case MatvecQ16xKernel::smem4_s3:
            return q16x_splits_by_chunks(rows, cols, 2, q16x_grid<4, true, 2, 1>(cols).slot_warps);
        case MatvecQ16xKernel::smem4_s4:
            return q16x_splits_by_chunks(rows, cols, 2, q16x_grid<4, true, 2, 2>(cols).slot_warps);
    }
    return false;
}

// SPILLWAY_Q16X_KERNEL=<variant name> (lab): every q16x GEMV of the process uses that variant
// (A/B of the variants inside the engine's chain; docs/perf-notes.md, session 17).
std::optional<MatvecQ16xKernel> q16x_kernel_override() {
    static const std::optional<MatvecQ16xKernel> kernel = []() -> std::optional<MatvecQ16xKernel> {
        // In MatvecQ16xKernel's order.
        static_assert((int)MatvecQ16xKernel::smem4_s4 == 6, "the names below follow the enum");
        const int i = lab_knob_choice("SPILLWAY_Q16X_KERNEL",
                                      {"smem4", "smem8", "global4", "smem4_r1", "smem8_r1", "smem4_s3", "smem4_s4"});
        if (i < 0) return std::nullopt;
        return (MatvecQ16xKernel)i;
    }();
    return kernel;
}

void matvec_q8_0_q16x_cuda(const void* w, ActQ16 x, float* y, uint32_t rows, uint32_t cols, cudaStream_t stream,
                           bool release_at_entry) {
    const std::optional<MatvecQ16xKernel> forced = q16x_kernel_override();
    matvec_q8_0_q16x_cuda_with(forced ? *forced : matvec_q8_0_q16x_kernel_for(rows, cols), w, x, y, rows, cols, stream,
                               release_at_entry);
}

}  // namespace spillway
