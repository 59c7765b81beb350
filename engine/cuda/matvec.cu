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
#include "engine/cuda/matvec.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;            // 16-byte vectors per row in flight per lane (F16/BF16)
constexpr int kSlabBlocks = 64;       // Q8_0 blocks per row staged at a time
constexpr int kSlabBytes = kSlabBlocks * 34;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

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
            // 16-byte loads need every row to start 16-byte aligned: cols % 256 == 0.
            if ((cols / 32 * 34) % 16 == 0)
                return launch<matvec_q8_0_kernel<kTokens, 16>>(w_bytes, x, y, rows, cols, n_tokens, stream);
            return launch<matvec_q8_0_kernel<kTokens, 2>>(w_bytes, x, y, rows, cols, n_tokens, stream);
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
    if (n_tokens > kMatvecMaxTokens) fail("matvec_cuda: more than 8 tokens; use the prefill matmul");
    const uint32_t col_multiple = w_type == GgmlType::Q8_0 ? 32 : 8;
    if (cols == 0 || cols % col_multiple != 0)
        fail("matvec_cuda: cols must be a positive multiple of " + std::to_string(col_multiple));
    if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
        fail("matvec_cuda: w and x must be 16-byte aligned");
    if (n_tokens == 1) launch_for_tokens<1>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens == 2) launch_for_tokens<2>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else if (n_tokens <= 4) launch_for_tokens<4>(w_type, w, x, y, rows, cols, n_tokens, stream);
    else launch_for_tokens<8>(w_type, w, x, y, rows, cols, n_tokens, stream);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
