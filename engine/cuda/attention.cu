// Flash-decoding on tensor cores.
//
// Why tensor cores for a single query token: with GQA the KV head's cells serve G query
// heads (5 for Qwen2.5-14B), so each cell costs 2*G*D flops for QK and as many for PV.
// For q4_0 KV that is ~18 flops per byte read, above the H200's fp32 CUDA-core ratio
// (67 TFLOP/s / 4.3 TB/s = 15.6): the plain-FMA version cannot keep up with memory
// (docs/perf-notes.md). So scores = K·Qᵀ and out = P·V run as 16x16x16 f16 MMAs with f32
// accumulation, and the CUDA cores only dequantize and do the online softmax.
//
// One block = one KV head x one range of cells (a split), 8 warps. Per tile of kTile cells:
//   cp.async raw K/V slices (ring of stages) -> dequantize to padded f16 tiles ->
//   S = K Qᵀ (warp w: cells 16(w%4).., half w/4 of the dims; the halves are summed next) ->
//   online softmax (16 threads per query head, 4 cells each) ->
//   O_tile = P V (warp w: dims 16w..16w+15) -> acc = acc*alpha + O_tile.
// Every phase is a short dependent chain, so the block is latency-bound unless many warps
// run: 8 warps per block and 2 blocks per SM (measured: 4 warps and 1 block per SM for f16
// left HBM at 39%; docs/perf-notes.md).
// Query heads are padded to 16 rows with zeros; padded/invalid cells get p = 0 and V = 0.
#include "engine/cuda/attention.cuh"

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"

namespace spillway {
namespace {

constexpr int kTile = 64;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 16;  // query heads per KV head, padded to one MMA dimension
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr uint32_t slice_bytes(KvType type, int d) {
    return type == KvType::f16 ? d * 2 : type == KvType::q8_0 ? d / 32 * 34 : d / 32 * 18;
}
__host__ __device__ constexpr uint32_t copy_chunk(uint32_t slice) { return slice % 16 == 0 ? 16 : slice % 8 == 0 ? 8 : 4; }
__host__ __device__ constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

// Shared-memory carve-up, in bytes, for one kernel instance. An f16 operand is copied by
// cp.async straight into padded f16 rows of its ring stage and read from there by the MMAs
// ("direct"); a quantized operand lands as raw blocks and is dequantized into its f16 tile.
template <int D, KvType KT, KvType VT>
struct SmemLayout {
    // Two stages when both operands are f16 (32 KB each) keep two blocks per SM; quantized
    // stages are small, so three.
    static constexpr int kStages = KT == KvType::f16 && VT == KvType::f16 ? 2 : 3;
    static constexpr bool kDirectK = KT == KvType::f16;
    static constexpr bool kDirectV = VT == KvType::f16;
    static constexpr int kLd = D + 8;       // padded f16 row: rows land on different banks
    static constexpr int kLdP = kTile + 8;
    static constexpr uint32_t kSliceK = slice_bytes(KT, D);
    static constexpr uint32_t kSliceV = slice_bytes(VT, D);
    static constexpr uint32_t kStrideK = kDirectK ? kLd * 2 : kSliceK;  // bytes per cell in a stage
    static constexpr uint32_t kStrideV = kDirectV ? kLd * 2 : kSliceV;
    static constexpr size_t raw_stage = align128((size_t)kTile * (kStrideK + kStrideV));
    static constexpr size_t raw = 0;
    static constexpr size_t k_tile = raw + kStages * raw_stage;
    static constexpr size_t v_tile = k_tile + (kDirectK ? 0 : align128((size_t)kTile * kLd * 2));
    static constexpr size_t q_tile = v_tile + (kDirectV ? 0 : align128((size_t)kTile * kLd * 2));
    // scores: two partial S tiles (one per half of the dims); o_tile reuses that space,
    // since scores are consumed (softmax) before O_tile is written (after a barrier).
    static constexpr size_t scores = q_tile + align128((size_t)kMaxGroup * kLd * 2);
    static constexpr size_t scores_bytes = std::max((size_t)2 * kTile * kMaxGroup * 4, (size_t)kMaxGroup * D * 4);
    static constexpr size_t o_tile = scores;
    static constexpr size_t p_tile = scores + align128(scores_bytes);
    static constexpr size_t stats = p_tile + align128((size_t)kMaxGroup * kLdP * 2);
    static constexpr size_t total = stats + align128(3 * kMaxGroup * 4);
};
static_assert(kTile == 64 && kWarps == 8, "the phases below divide 64 cells among 8 warps");

struct SplitParams {
    const float* q;
    const uint8_t* k;
    const uint8_t* v;
    uint64_t k_row_bytes;
    uint64_t v_row_bytes;
    uint32_t n_cells;
    uint32_t cells_per_split;
    uint32_t n_group;  // query heads per KV head
    float scale_log2;  // scale * log2(e): scores are kept in base-2 units
    float* part_out;   // [split][n_head][D]
    float* part_lse;   // [split][n_head]
    uint32_t n_head;
};

template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    if constexpr (kBytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(kBytes));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

__device__ __forceinline__ uint32_t load_u32_from_u16(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return __byte_perm(h[0], h[1], 0x5410);
}

// Four bytes, each an unsigned integer u < 256 (8-bit biased or 4-bit), as two half2 of
// (u - bias): 0x64 above a byte is the half 1024 + u, exact, so the subtraction is exact too.
__device__ __forceinline__ void bytes_to_half2x2(uint32_t bytes, __half2 bias, __half2& lo, __half2& hi) {
    const uint32_t a = __byte_perm(bytes, 0x64646464u, 0x4140), b = __byte_perm(bytes, 0x64646464u, 0x4342);
    lo = __hsub2(*reinterpret_cast<const __half2*>(&a), bias);
    hi = __hsub2(*reinterpret_cast<const __half2*>(&b), bias);
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// Eight consecutive values (chunk j of D/8) of one cell's head slice, as f16. Quantized
// values become f16 by integer tricks and half2 math (d * q rounded once, as f32 would be
// then rounded to f16): the int-to-float converter runs at 16/clk/SM and was the bottleneck.
template <KvType T>
__device__ __forceinline__ uint4 dequant8(const uint8_t* slice, int j) {
    if constexpr (T == KvType::f16) {
        return *reinterpret_cast<const uint4*>(slice + 16 * j);
    } else {
        const int part = j % 4;
        const uint8_t* blk = slice + (j / 4) * (T == KvType::q8_0 ? 34 : 18);
        const __half2 d2 = __half2half2(*reinterpret_cast<const __half*>(blk));
        uint32_t lo, hi;
        __half2 bias;
        if constexpr (T == KvType::q8_0) {
            lo = load_u32_from_u16(blk + 2 + 8 * part) ^ 0x80808080u;  // signed -> biased by 128
            hi = load_u32_from_u16(blk + 6 + 8 * part) ^ 0x80808080u;
            bias = __float2half2_rn(1024.0f + 128.0f);
        } else {
            // values 0..15 are the low nibbles of qs[0..15], 16..31 the high nibbles.
            const int shift = part < 2 ? 0 : 4;
            lo = (load_u32_from_u16(blk + 2 + 8 * (part % 2)) >> shift) & 0x0F0F0F0Fu;
            hi = (load_u32_from_u16(blk + 6 + 8 * (part % 2)) >> shift) & 0x0F0F0F0Fu;
            bias = __float2half2_rn(1024.0f + 8.0f);
        }
        __half2 v0, v1, v2, v3;
        bytes_to_half2x2(lo, bias, v0, v1);
        bytes_to_half2x2(hi, bias, v2, v3);
        return make_uint4(half2_bits(__hmul2(v0, d2)), half2_bits(__hmul2(v1, d2)), half2_bits(__hmul2(v2, d2)),
                          half2_bits(__hmul2(v3, d2)));
    }
}

template <int D, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(SplitParams p) {
    using namespace nvcuda;
    using L = SmemLayout<D, KT, VT>;
    extern __shared__ __align__(128) uint8_t smem[];
    __half* k_tile = reinterpret_cast<__half*>(smem + L::k_tile);
    __half* v_tile = reinterpret_cast<__half*>(smem + L::v_tile);
    __half* q_tile = reinterpret_cast<__half*>(smem + L::q_tile);
    float* scores = reinterpret_cast<float*>(smem + L::scores);
    __half* p_tile = reinterpret_cast<__half*>(smem + L::p_tile);
    float* o_tile = reinterpret_cast<float*>(smem + L::o_tile);
    float* run_max = reinterpret_cast<float*>(smem + L::stats);
    float* run_sum = run_max + kMaxGroup;
    float* alpha = run_sum + kMaxGroup;

    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t kv_head = blockIdx.x, split = blockIdx.y;
    const uint32_t cell_begin = split * p.cells_per_split;
    const uint32_t cell_end = min(p.n_cells, cell_begin + p.cells_per_split);
    const uint32_t n_tiles = (cell_end - cell_begin + kTile - 1) / kTile;
    const uint32_t n_group = p.n_group;

    const uint8_t* k_src = p.k + (size_t)kv_head * L::kSliceK;
    const uint8_t* v_src = p.v + (size_t)kv_head * L::kSliceV;
    auto issue_tile = [&](uint32_t tile) {
        if (tile < n_tiles) {
            uint8_t* raw_k = smem + L::raw + (tile % L::kStages) * L::raw_stage;
            uint8_t* raw_v = raw_k + kTile * L::kStrideK;
            const uint32_t first = cell_begin + tile * kTile;
            const uint32_t count = min((uint32_t)kTile, cell_end - first);
            constexpr uint32_t ck = copy_chunk(L::kSliceK), cv = copy_chunk(L::kSliceV);
            for (uint32_t i = tid; i < count * (L::kSliceK / ck); i += kThreads) {
                const uint32_t c = i / (L::kSliceK / ck), o = i % (L::kSliceK / ck) * ck;
                cp_async<ck>(raw_k + c * L::kStrideK + o, k_src + (size_t)(first + c) * p.k_row_bytes + o);
            }
            for (uint32_t i = tid; i < count * (L::kSliceV / cv); i += kThreads) {
                const uint32_t c = i / (L::kSliceV / cv), o = i % (L::kSliceV / cv) * cv;
                cp_async<cv>(raw_v + c * L::kStrideV + o, v_src + (size_t)(first + c) * p.v_row_bytes + o);
            }
        }
        cp_async_commit();  // empty groups keep the wait count uniform
    };

    for (int s = 0; s < L::kStages - 1; ++s) issue_tile(s);

    // Query heads of this KV head as f16 rows, zero-padded to kMaxGroup; P rows likewise.
    for (uint32_t i = tid; i < kMaxGroup * D; i += kThreads) {
        const uint32_t g = i / D, d = i % D;
        const float qv = g < n_group ? p.q[(size_t)(kv_head * n_group + g) * D + d] : 0.0f;
        q_tile[g * L::kLd + d] = __float2half_rn(qv);
    }
    for (uint32_t i = tid; i < kMaxGroup * L::kLdP; i += kThreads) p_tile[i] = __float2half_rn(0.0f);
    if (tid < kMaxGroup) {
        run_max[tid] = -INFINITY;
        run_sum[tid] = 0.0f;
    }
    constexpr int kAccPerThread = kMaxGroup * D / kThreads;
    float acc[kAccPerThread];
#pragma unroll
    for (int j = 0; j < kAccPerThread; ++j) acc[j] = 0.0f;

    for (uint32_t tile = 0; tile < n_tiles; ++tile) {
        issue_tile(tile + L::kStages - 1);
        cp_async_wait<L::kStages - 1>();
        __syncthreads();

        // Dequantize raw slices into the padded f16 tiles. Invalid cells (past the split's
        // end) must hold V = 0: their p is 0, but 0 * stale NaN bits would poison P V.
        const uint8_t* raw_k = smem + L::raw + (tile % L::kStages) * L::raw_stage;
        const uint8_t* raw_v = raw_k + kTile * L::kStrideK;
        const __half* k_mma = L::kDirectK ? reinterpret_cast<const __half*>(raw_k) : k_tile;
        const __half* v_mma = L::kDirectV ? reinterpret_cast<const __half*>(raw_v) : v_tile;
        {
            const uint32_t valid = min((uint32_t)kTile, cell_end - (cell_begin + tile * kTile));
            if (!L::kDirectK || !L::kDirectV || valid < kTile) {
                for (uint32_t i = tid; i < kTile * (D / 8); i += kThreads) {
                    const uint32_t c = i / (D / 8), j = i % (D / 8);
                    if constexpr (!L::kDirectK) {
                        const uint4 k8 = c < valid ? dequant8<KT>(raw_k + c * L::kSliceK, j) : make_uint4(0, 0, 0, 0);
                        *reinterpret_cast<uint4*>(k_tile + c * L::kLd + 8 * j) = k8;
                    }
                    if constexpr (!L::kDirectV) {
                        const uint4 v8 = c < valid ? dequant8<VT>(raw_v + c * L::kSliceV, j) : make_uint4(0, 0, 0, 0);
                        *reinterpret_cast<uint4*>(v_tile + c * L::kLd + 8 * j) = v8;
                    } else {
                        if (c >= valid)
                            *reinterpret_cast<uint4*>(const_cast<__half*>(v_mma) + c * L::kLd + 8 * j) = make_uint4(0, 0, 0, 0);
                    }
                }
            }
        }
        __syncthreads();

        // S[cell][head] = K Qᵀ: warp w owns cells 16(w%4).. over dims [w/4 * D/2, +D/2).
        {
            const uint32_t cell0 = (warp % 4) * 16, dim0 = (warp / 4) * (D / 2);
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
            wmma::fill_fragment(s, 0.0f);
#pragma unroll
            for (int kk = 0; kk < D / 2; kk += 16) {
                wmma::load_matrix_sync(a, k_mma + cell0 * L::kLd + dim0 + kk, L::kLd);
                wmma::load_matrix_sync(b, q_tile + dim0 + kk, L::kLd);
                wmma::mma_sync(s, a, b, s);
            }
            wmma::store_matrix_sync(scores + (warp / 4) * kTile * kMaxGroup + cell0 * kMaxGroup, s, kMaxGroup,
                                    wmma::mem_row_major);
        }
        __syncthreads();

        // Online softmax: 16 threads per query head (a half warp), each owning 4 cells.
        {
            const uint32_t valid = min((uint32_t)kTile, cell_end - (cell_begin + tile * kTile));
            const uint32_t g = tid / 16, part = tid % 16;
            const unsigned half_mask = 0xffffu << (lane / 16 * 16);  // n_group may end mid-warp
            if (g < n_group) {
                float sc[4];
                float m = -INFINITY;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t c = part + 16 * i;
                    sc[i] = c < valid ? (scores[c * kMaxGroup + g] + scores[(kTile + c) * kMaxGroup + g]) * p.scale_log2
                                      : -INFINITY;
                    m = fmaxf(m, sc[i]);
                }
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(half_mask, m, o));
                const float m_old = run_max[g];
                const float m_new = fmaxf(m_old, m);
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float e = exp2f(sc[i] - m_new);
                    p_tile[g * L::kLdP + part + 16 * i] = __float2half_rn(e);
                    sum += e;
                }
#pragma unroll
                for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(half_mask, sum, o);
                if (part == 0) {
                    const float a = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
                    alpha[g] = a;
                    run_sum[g] = run_sum[g] * a + sum;
                    run_max[g] = m_new;
                }
            }
        }
        __syncthreads();

        // O_tile[head][dim] = P V: warp w owns dims 16w..16w+15 (D/16 warps busy).
        if (warp < D / 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
            const int dim0 = warp * 16;
            wmma::fill_fragment(o, 0.0f);
#pragma unroll
            for (int kk = 0; kk < kTile; kk += 16) {
                wmma::load_matrix_sync(a, p_tile + kk, L::kLdP);
                wmma::load_matrix_sync(b, v_mma + kk * L::kLd + dim0, L::kLd);
                wmma::mma_sync(o, a, b, o);
            }
            wmma::store_matrix_sync(o_tile + dim0, o, D, wmma::mem_row_major);
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < kAccPerThread; ++j) {
            const uint32_t idx = tid + kThreads * j, g = idx / D;
            if (g < n_group) acc[j] = acc[j] * alpha[g] + o_tile[idx];
        }
    }

    // Normalise within the split and write the partial (out, natural-log lse).
#pragma unroll
    for (int j = 0; j < kAccPerThread; ++j) {
        const uint32_t idx = tid + kThreads * j, g = idx / D, d = idx % D;
        if (g < n_group) {
            const uint32_t head = kv_head * n_group + g;
            p.part_out[((size_t)split * p.n_head + head) * D + d] = acc[j] / run_sum[g];
            if (d == 0) p.part_lse[(size_t)split * p.n_head + head] = (run_max[g] + log2f(run_sum[g])) / kLog2e;
        }
    }
}

// out[head] = softmax-weighted sum of the split partials; block = one head, thread = one dim.
__global__ void merge_splits_kernel(const float* part_out, const float* part_lse, uint32_t n_splits,
                                    uint32_t n_head, uint32_t head_dim, float* out, float* lse) {
    const uint32_t head = blockIdx.x;
    float m = -INFINITY;
    for (uint32_t s = 0; s < n_splits; ++s) m = fmaxf(m, part_lse[(size_t)s * n_head + head]);
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum_w = 0.0f, sum = 0.0f;
        if (m != -INFINITY) {
            for (uint32_t s = 0; s < n_splits; ++s) {
                const float w = __expf(part_lse[(size_t)s * n_head + head] - m);
                sum_w += w;
                sum += w * part_out[((size_t)s * n_head + head) * head_dim + d];
            }
        }
        out[(size_t)head * head_dim + d] = m == -INFINITY ? 0.0f : sum / sum_w;
        if (d == 0) lse[head] = m == -INFINITY ? -INFINITY : m + logf(sum_w);
    }
}

__global__ void merge_pair_kernel(uint32_t head_dim, float* out_a, float* lse_a, const float* out_b,
                                  const float* lse_b) {
    const uint32_t head = blockIdx.x;
    const float la = lse_a[head], lb = lse_b[head];
    __syncthreads();  // every thread has read lse_a before thread 0 overwrites it
    if (lb == -INFINITY) return;
    float* a = out_a + (size_t)head * head_dim;
    const float* b = out_b + (size_t)head * head_dim;
    if (la == -INFINITY) {
        for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) a[d] = b[d];
        if (threadIdx.x == 0) lse_a[head] = lb;
        return;
    }
    const float m = fmaxf(la, lb);
    const float wa = expf(la - m), wb = expf(lb - m);
    const float inv = 1.0f / (wa + wb);
    for (uint32_t d = threadIdx.x; d < head_dim; d += blockDim.x) a[d] = (wa * a[d] + wb * b[d]) * inv;
    if (threadIdx.x == 0) lse_a[head] = m + logf(wa + wb);
}

__global__ void empty_partial_kernel(uint32_t n_values, uint32_t n_head, float* out, float* lse) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_values) out[i] = 0.0f;
    if (i < n_head) lse[i] = -INFINITY;
}

struct SplitPlan {
    uint32_t n_splits;
    uint32_t cells_per_split;
};

SplitPlan plan_splits(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    if (n_cells == 0) return {0, 0};
    const uint32_t n_tiles = (n_cells + kTile - 1) / kTile;
    // About two blocks per multiprocessor in total: one or two waves of long-running blocks.
    const uint32_t wanted = std::max(1u, (2 * std::max(1u, sm_count) + shape.n_head_kv - 1) / shape.n_head_kv);
    const uint32_t splits = std::min(wanted, n_tiles);
    const uint32_t cells_per_split = (n_tiles + splits - 1) / splits * kTile;
    return {(n_cells + cells_per_split - 1) / cells_per_split, cells_per_split};
}

template <int D, KvType KT, KvType VT>
void launch_split(const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits, cudaStream_t stream) {
    constexpr size_t smem = SmemLayout<D, KT, VT>::total;
    static const bool configured = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<D, KT, VT>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return true;
    }();
    (void)configured;
    attention_split_kernel<D, KT, VT><<<dim3(n_head_kv, n_splits), kThreads, smem, stream>>>(p);
}

template <int D, KvType KT>
void dispatch_v(KvType v_type, const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits, cudaStream_t stream) {
    switch (v_type) {
        case KvType::f16: return launch_split<D, KT, KvType::f16>(p, n_head_kv, n_splits, stream);
        case KvType::q8_0: return launch_split<D, KT, KvType::q8_0>(p, n_head_kv, n_splits, stream);
        case KvType::q4_0: return launch_split<D, KT, KvType::q4_0>(p, n_head_kv, n_splits, stream);
    }
}

template <int D>
void dispatch_k(KvType k_type, KvType v_type, const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits,
                cudaStream_t stream) {
    switch (k_type) {
        case KvType::f16: return dispatch_v<D, KvType::f16>(v_type, p, n_head_kv, n_splits, stream);
        case KvType::q8_0: return dispatch_v<D, KvType::q8_0>(v_type, p, n_head_kv, n_splits, stream);
        case KvType::q4_0: return dispatch_v<D, KvType::q4_0>(v_type, p, n_head_kv, n_splits, stream);
    }
}

}  // namespace

bool attention_supports(const AttentionShape& shape) {
    return shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0 &&
           shape.n_head / shape.n_head_kv <= (uint32_t)kMaxGroup && shape.head_dim_k == shape.head_dim_v &&
           (shape.head_dim_k == 64 || shape.head_dim_k == 128);
}

uint32_t attention_split_count(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    return plan_splits(shape, n_cells, sm_count).n_splits;
}

size_t attention_workspace_bytes(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    const uint32_t splits = attention_split_count(shape, n_cells, sm_count);
    if (splits <= 1) return 0;
    return (size_t)splits * shape.n_head * (shape.head_dim_v + 1) * sizeof(float);
}

void attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type,
                            const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                            uint32_t n_cells, float* out, float* lse, void* workspace,
                            size_t workspace_bytes, uint32_t sm_count, cudaStream_t stream) {
    if (!attention_supports(shape)) fail("attention_partial_cuda: unsupported shape (head dim 64/128, K and V dims equal, <= 16 query heads per KV head)");
    const uint32_t n_values = shape.n_head * shape.head_dim_v;
    if (n_cells == 0) {
        empty_partial_kernel<<<(n_values + 255) / 256, 256, 0, stream>>>(n_values, shape.n_head, out, lse);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (reinterpret_cast<uintptr_t>(k_cells) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cells) % 16 != 0)
        fail("attention_partial_cuda: K and V cells must be 16-byte aligned");
    const SplitPlan plan = plan_splits(shape, n_cells, sm_count);
    const size_t needed = attention_workspace_bytes(shape, n_cells, sm_count);
    if (workspace_bytes < needed || (needed > 0 && workspace == nullptr))
        fail("attention_partial_cuda: workspace of " + std::to_string(workspace_bytes) + " bytes, need " + std::to_string(needed));

    SplitParams p{};
    p.q = q;
    p.k = k_cells;
    p.v = v_cells;
    p.k_row_bytes = kv_row_bytes(k_type, (uint64_t)shape.n_head_kv * shape.head_dim_k);
    p.v_row_bytes = kv_row_bytes(v_type, (uint64_t)shape.n_head_kv * shape.head_dim_v);
    p.n_cells = n_cells;
    p.cells_per_split = plan.cells_per_split;
    p.n_group = shape.n_head / shape.n_head_kv;
    p.scale_log2 = shape.scale * kLog2e;
    p.n_head = shape.n_head;
    if (plan.n_splits == 1) {
        p.part_out = out;
        p.part_lse = lse;
    } else {
        p.part_out = static_cast<float*>(workspace);
        p.part_lse = p.part_out + (size_t)plan.n_splits * n_values;
    }
    if (shape.head_dim_k == 64) dispatch_k<64>(k_type, v_type, p, shape.n_head_kv, plan.n_splits, stream);
    else dispatch_k<128>(k_type, v_type, p, shape.n_head_kv, plan.n_splits, stream);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    if (plan.n_splits > 1) {
        merge_splits_kernel<<<shape.n_head, std::min(128u, shape.head_dim_v), 0, stream>>>(
            p.part_out, p.part_lse, plan.n_splits, shape.n_head, shape.head_dim_v, out, lse);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    }
}

void attention_merge_cuda(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                          const float* out_b, const float* lse_b, cudaStream_t stream) {
    if (n_head == 0) return;
    merge_pair_kernel<<<n_head, std::min(128u, head_dim_v), 0, stream>>>(head_dim_v, out_a, lse_a, out_b, lse_b);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
