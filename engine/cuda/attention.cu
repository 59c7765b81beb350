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
#include "engine/cuda/attention_mma.cuh"

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/attention_finish_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/kv_write_device.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/rope_device.cuh"

namespace spillway {
namespace {

// attention_lab_timeline's buffer (benchmarks only).
uint64_t* lab_timeline = nullptr;

using kv_tile::align128;
using kv_tile::cp_async;
using kv_tile::cp_async_commit;
using kv_tile::copy_chunk;
using kv_tile::slice_bytes;

constexpr int kTile = 64;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 16;  // query heads per KV head, padded to one MMA dimension
constexpr float kLog2e = 1.4426950408889634f;


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

// Every decode attention kernel takes the same parameters and plans its splits the same way.
using SplitParams = attention_mma::Params;
using SplitPlan = attention_mma::Plan;

template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// Eight consecutive values (chunk j of D/8) of one cell's head slice, as f16.
template <KvType T>
__device__ __forceinline__ uint4 dequant8(const uint8_t* slice, int j) {
    if constexpr (T == KvType::f16) return *reinterpret_cast<const uint4*>(slice + 16 * j);
    else return kv_tile::dequant8_quantized<T>(slice, j);
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

    // A programmatic launch (pdl_launch.cuh): a split made only of settled cells (written by
    // earlier decode steps) starts its copies before waiting for q's producer; the split
    // holding the new cell copies after. Then the split merge may be launched.
    const bool settled = cell_end <= p.settled_cells;
    if (settled)
        for (int s = 0; s < L::kStages - 1; ++s) issue_tile(s);
    pdl_wait_for_producer();
    pdl_release_dependents();
    const bool post_qkv = p.rope_table != nullptr;  // q is raw; see Params
    const uint32_t qd = p.n_head * D, kd = gridDim.x * D;
    if (post_qkv && cell_begin <= p.new_cell && p.new_cell < cell_end) {
        // This block reads the new cell: it computes the cell's K and V of its KV head (as
        // qkv_post_kernel does) and stores them before any copy of the cell. Warps 0..D/32-1
        // take K, the next D/32 warps V: each warp one 32-value block.
        static_assert(2 * D <= kThreads, "a thread per K and V value of the head");
        if (tid < 2 * D) {
            const bool is_k = tid < D;
            const uint32_t e = tid % D;
            const float* raw = (is_k ? p.new_k : p.new_v) + (size_t)kv_head * D;
            const float* bias = p.qkv_bias != nullptr ? p.qkv_bias + (is_k ? qd : qd + kd) + kv_head * D : nullptr;
            const float val = is_k ? post_qkv_value(raw, bias, e, p.rope_table, p.rope_dims, p.rope_neox != 0)
                                   : (bias != nullptr ? raw[e] + bias[e] : raw[e]);
            const uint32_t block = (kv_head * D + e) / 32;
            if (is_k) kv_store_block<KT>(val, p.k_store + (size_t)p.new_cell * p.k_row_bytes, block, lane);
            else kv_store_block<VT>(val, p.v_store + (size_t)p.new_cell * p.v_row_bytes, block, lane);
        }
        __threadfence();  // the stores reach L2 before the block's cp.async (L2-only) reads them
        __syncthreads();
    }
    if (!settled)
        for (int s = 0; s < L::kStages - 1; ++s) issue_tile(s);

    // Query heads of this KV head as f16 rows, zero-padded to kMaxGroup; P rows likewise.
    for (uint32_t i = tid; i < kMaxGroup * D; i += kThreads) {
        const uint32_t g = i / D, d = i % D;
        const uint32_t head = kv_head * n_group + g;
        float qv = 0.0f;
        if (g < n_group)
            qv = post_qkv ? post_qkv_value(p.q + (size_t)head * D, p.qkv_bias != nullptr ? p.qkv_bias + head * D : nullptr,
                                           d, p.rope_table, p.rope_dims, p.rope_neox != 0)
                          : p.q[(size_t)head * D + d];
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
    attention_finish_single_split<D>(p, kv_head);
}

// out[head] = softmax-weighted sum of the split partials; block = one head. The split
// weights exp(lse_s - max) are computed once per head into shared memory (a per-thread
// serial pass over 33-66 splits' lse was a chain of dependent L2 round trips). The sum over
// splits is cut into 512 / head_dim interleaved groups of threads (thread = one dim of one
// group), so each thread sums ~n_splits / 4 partials instead of all of them in one
// dependent chain, and the group sums are added in a fixed order (deterministic).
// Measured (bench_kernels, one layer of the 14B shape): 8k cells f16 19.0 -> 18.3 us, q4_0
// 22.6 -> 21.4; 64k q8_0 69.6 -> 67.2, q4_0 60.0 -> 57.8 (two runs of one session).
constexpr uint32_t kMergeMaxSplits = 1024;
constexpr uint32_t kMergeThreads = 512;
constexpr uint32_t kMergeEarly = 24;  // partials per thread loaded with the lse values (66 splits at 4 groups: 17)
__global__ void __launch_bounds__(kMergeThreads) merge_splits_kernel(const float* part_out, const float* part_lse,
                                                                     uint32_t n_splits, uint32_t n_head,
                                                                     uint32_t head_dim, float* out, float* lse,
                                                                     int16_t* out_q, float* out_d,
                                                                     uint64_t* timeline) {
    // timeline (lab, attention_lab_timeline): this block's 3 stamps, or nullptr.
    if (timeline != nullptr && threadIdx.x == 0) timeline[(size_t)blockIdx.x * kAttentionTimelineSlots] = global_timer_ns();
    // Programmatic launch (pdl_launch.cuh): the partials are visible after the wait; then
    // the output projection's matvec may launch and fetch its first weights. (Releasing it only
    // before the outputs, so that the GEMV's warps would not share the SMs with this kernel's
    // chains, lost 1.2-1.9% on every tier at 8k-64k: session 52, H100.)
    pdl_wait_for_producer();
    pdl_release_dependents();
    if (timeline != nullptr && threadIdx.x == 0) timeline[(size_t)blockIdx.x * kAttentionTimelineSlots + 1] = global_timer_ns();
    __shared__ float weight[kMergeMaxSplits];
    __shared__ float reduce[kMergeThreads / 32];
    __shared__ float group_sum[kMergeThreads];
    const uint32_t head = blockIdx.x, tid = threadIdx.x, lane = tid % 32, n_warps = blockDim.x / 32;
    // blockDim.x = groups * head_dim (head_dim divides kMergeThreads).
    const uint32_t groups = blockDim.x / head_dim, g = tid / head_dim, d = tid % head_dim;
    // This thread's first partials (splits g, g + groups, ...) are loaded together with the lse
    // values, in the same round trip: they do not depend on the weights (one L2 trip fewer on
    // the decode step's path than loading them after the weights).
    float early[kMergeEarly];
#pragma unroll
    for (uint32_t k = 0; k < kMergeEarly; ++k) {
        const uint32_t s = g + k * groups;
        early[k] = s < n_splits ? part_out[((size_t)s * n_head + head) * head_dim + d] : 0.0f;
    }
    // Each thread keeps the lse values it loads: they are read once.
    constexpr uint32_t kLsePerThread = kMergeMaxSplits / kMergeThreads;
    float my_lse[kLsePerThread];
    float m = -INFINITY;
#pragma unroll
    for (uint32_t k = 0; k < kLsePerThread; ++k) {
        const uint32_t s = tid + k * blockDim.x;
        my_lse[k] = s < n_splits ? part_lse[(size_t)s * n_head + head] : -INFINITY;
        m = fmaxf(m, my_lse[k]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) reduce[tid / 32] = m;
    __syncthreads();
    if (timeline != nullptr && threadIdx.x == 0) timeline[(size_t)blockIdx.x * kAttentionTimelineSlots + 3] = global_timer_ns();
    m = -INFINITY;
    for (uint32_t w = 0; w < n_warps; ++w) m = fmaxf(m, reduce[w]);
    float sum_w = 0.0f;
#pragma unroll
    for (uint32_t k = 0; k < kLsePerThread; ++k) {
        const uint32_t s = tid + k * blockDim.x;
        if (s < n_splits) {
            const float w = m == -INFINITY ? 0.0f : __expf(my_lse[k] - m);
            weight[s] = w;
            sum_w += w;
        }
    }
    for (int o = 16; o > 0; o >>= 1) sum_w += __shfl_xor_sync(0xffffffffu, sum_w, o);
    __syncthreads();  // every warp has read reduce[] (the max) before it holds sums
    if (lane == 0) reduce[tid / 32] = sum_w;
    __syncthreads();
    sum_w = 0.0f;
    for (uint32_t w = 0; w < n_warps; ++w) sum_w += reduce[w];
    float sum = 0.0f;
    if (m != -INFINITY) {  // splits in increasing order, as before: the same rounding
#pragma unroll
        for (uint32_t k = 0; k < kMergeEarly; ++k) {
            const uint32_t s = g + k * groups;
            if (s < n_splits) sum += weight[s] * early[k];
        }
#pragma unroll 8
        for (uint32_t s = g + kMergeEarly * groups; s < n_splits; s += groups)
            sum += weight[s] * part_out[((size_t)s * n_head + head) * head_dim + d];
    }
    group_sum[tid] = sum;
    __syncthreads();
    if (timeline != nullptr && threadIdx.x == 0) timeline[(size_t)blockIdx.x * kAttentionTimelineSlots + 4] = global_timer_ns();
    if (g == 0) {  // whole warps: head_dim is 64 or 128
        float total = 0.0f;
        for (uint32_t k = 0; k < groups; ++k) total += group_sum[k * head_dim + d];
        const float o = m == -INFINITY ? 0.0f : total / sum_w;
        out[(size_t)head * head_dim + d] = o;
        if (d == 0) lse[head] = m == -INFINITY ? -INFINITY : m + logf(sum_w);
        // Warp w of the group holds dims 32w..32w+31: one int16 block of the quantized out.
        const size_t first = (size_t)head * head_dim + (d & ~31u);
        if (out_q != nullptr) quantize_act_q16_warp(o, lane, out_q + first, out_d + first / 32);
    }
    if (timeline != nullptr) {
        __syncthreads();
        if (threadIdx.x == 0) timeline[(size_t)blockIdx.x * kAttentionTimelineSlots + 2] = global_timer_ns();
    }
}

// The same merge with one warp per 32 dims of a head (grid head_dim / 32 x n_head) and no
// block barrier: lane l reduces the lse of splits l, l + 32, ... (max and weight sum by
// shuffles) while the first 64 splits' partials of its dim are already in flight, then sums
// the partials in split order with each split's weight broadcast from the lane holding it.
// Lab (SPILLWAY_ATTN_MERGE=warp): it was the default after mma / int_dot in sessions 19-36.
constexpr uint32_t kWarpMergeEarly = 64;
constexpr uint32_t kWarpMergeLse = kMergeMaxSplits / 32;
__global__ void __launch_bounds__(32) merge_splits_warp_kernel(const float* part_out, const float* part_lse,
                                                               uint32_t n_splits, uint32_t n_head, uint32_t head_dim,
                                                               float* out, float* lse, int16_t* out_q, float* out_d,
                                                               uint64_t* timeline) {
    const uint32_t chunk = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    // timeline (lab): the head's first warp stamps the block merge's slots.
    uint64_t* tl = timeline != nullptr && chunk == 0 && lane == 0 ? timeline + (size_t)head * kAttentionTimelineSlots
                                                                  : nullptr;
    if (tl != nullptr) tl[0] = global_timer_ns();
    pdl_wait_for_producer();
    pdl_release_dependents();
    if (tl != nullptr) tl[1] = global_timer_ns();
    const uint32_t d = chunk * 32 + lane;
    const size_t stride = (size_t)n_head * head_dim;  // between one split's partials and the next's
    const float* col = part_out + (size_t)head * head_dim + d;
    float early[kWarpMergeEarly];
#pragma unroll
    for (uint32_t s = 0; s < kWarpMergeEarly; ++s) early[s] = s < n_splits ? col[s * stride] : 0.0f;
    float w[kWarpMergeLse];
    float m = -INFINITY;
#pragma unroll
    for (uint32_t k = 0; k < kWarpMergeLse; ++k) {
        const uint32_t s = lane + 32 * k;
        w[k] = s < n_splits ? part_lse[(size_t)s * n_head + head] : -INFINITY;
        m = fmaxf(m, w[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (tl != nullptr) tl[3] = global_timer_ns();
    float sum_w = 0.0f;
#pragma unroll
    for (uint32_t k = 0; k < kWarpMergeLse; ++k) {
        w[k] = m == -INFINITY || lane + 32 * k >= n_splits ? 0.0f : __expf(w[k] - m);
        sum_w += w[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum_w += __shfl_xor_sync(0xffffffffu, sum_w, o);
    float sum = 0.0f;
#pragma unroll
    for (uint32_t s = 0; s < kWarpMergeEarly; ++s) sum += __shfl_sync(0xffffffffu, w[s / 32], s % 32) * early[s];
#pragma unroll
    for (uint32_t k = kWarpMergeEarly / 32; k < kWarpMergeLse; ++k) {
        if (32 * k >= n_splits) break;
        float part[32];
#pragma unroll
        for (uint32_t j = 0; j < 32; ++j) part[j] = 32 * k + j < n_splits ? col[(32 * k + j) * stride] : 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < 32; ++j) sum += __shfl_sync(0xffffffffu, w[k], j) * part[j];
    }
    if (tl != nullptr) tl[4] = global_timer_ns();
    const float o = m == -INFINITY ? 0.0f : sum / sum_w;
    out[(size_t)head * head_dim + d] = o;
    if (chunk == 0 && lane == 0) lse[head] = m == -INFINITY ? -INFINITY : m + logf(sum_w);
    const size_t first = (size_t)head * head_dim + chunk * 32;
    if (out_q != nullptr) quantize_act_q16_warp(o, lane, out_q + first, out_d + first / 32);
    if (tl != nullptr) tl[2] = global_timer_ns();
}

// SPILLWAY_ATTN_MERGE=warp (lab): the warp merge after the mma and int_dot kernels, the
// default from session 19 to 37. Since then the engine's splits went up to 49-66 per head at
// 64k, and the block merge (one 512-thread block per head, after every split kernel) measured
// faster in session 37 (H100, tg32, two rounds equal to 0.2): +1.0-1.9% on every tier from
// 16k cells, and for q8_0 / q4_0 KV from 4k (f16 K uses the split kernel below 16k).
bool merge_by_blocks() {
    static const bool warp = lab_knob("SPILLWAY_ATTN_MERGE", "warp", "block");
    return !warp;
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

SplitPlan plan_splits(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    if (n_cells == 0) return {0, 0};
    const uint32_t n_tiles = (n_cells + kTile - 1) / kTile;
    // About two blocks per multiprocessor in total: one or two waves of long-running blocks.
    // (Session 17, 14B shape, engine at 8k: 1 / 2 / 3 / 4 / 6 blocks per SM gave 179.4 / 183.6 /
    // 173.5 / 177.3 / 177.1 tok/s. Session 52, H100, tg48, against 2: 1 and 3 equal at 2048
    // cells, -5.2% and -4.9% at 8192.)
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
    launch_with_pdl(pdl_site_on(PdlSite::attention), attention_split_kernel<D, KT, VT>, dim3(n_head_kv, n_splits),
                    dim3(kThreads), smem, stream, p);
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


// ---- int_dot kernel -------------------------------------------------------------------
// Why: the tensor_core kernel spends most of a tile dequantizing K and V to f16 behind five
// block barriers (Nsight: instruction-latency bound, DRAM 17-38% for q8_0/q4_0). Here
//  - q is quantized once per block to int16 per 32-value block (error ~1.5e-5 relative, far
//    inside the tests' tolerance; int8 would add ~0.4% per score), and QK is an integer dot
//    product of the raw K bytes (dp2a: two 16x8-bit products per instruction), scaled once
//    per block by d_k * d_q: no per-element conversion of K at all;
//  - P V runs on CUDA cores: each lane owns 4 output dims for all query heads of the group,
//    the V block scale is folded into the softmax weight (w = p * d_v, computed once per
//    cell and block by the lane that owns the cell), so a V value costs one byte-permute and
//    one add to become a float, then kG FMAs;
//  - every warp streams its own chunks of 32 cells through a private cp.async ring, so the
//    main loop has no block barrier (only __syncwarp), and the block's warps merge at the end.
constexpr int kIdWarps = 4;
constexpr int kIdThreads = kIdWarps * 32;
constexpr int kIdChunk = 32;   // cells per warp step: one cell per lane in QK
constexpr int kIdStages = 2;   // one chunk in flight while one is computed (8 warps/SM or more)
constexpr int kIdD = 128;      // 32 lanes x 4 dims
constexpr int kIdMaxG = 8;
constexpr int kIdBlocks = kIdD / 32;

__host__ __device__ constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

template <KvType KT, KvType VT>
struct IdLayout {
    static constexpr uint32_t kSliceK = slice_bytes(KT, kIdD);
    static constexpr uint32_t kSliceV = slice_bytes(VT, kIdD);
    static constexpr int kWRows = VT == KvType::f16 ? 1 : kIdBlocks;  // weight rows per cell
    static constexpr size_t stage = align16((size_t)kIdChunk * (kSliceK + kSliceV));
    static constexpr size_t wbuf = (size_t)kIdChunk * kWRows * kIdMaxG * 4;
    static constexpr size_t warp_bytes = kIdStages * stage + wbuf;
    static constexpr size_t qw = 0;                                     // int32 [8][64]: int16 pairs
    static constexpr size_t qd = qw + kIdMaxG * (kIdD / 2) * 4;         // float [8][4]: d_q * scale_log2
    static constexpr size_t qsum = qd + kIdMaxG * kIdBlocks * 4;        // int [8][4]: sum of q16 per block
    static constexpr size_t warps = align128(qsum + kIdMaxG * kIdBlocks * 4);
    static constexpr size_t total = warps + kIdWarps * warp_bytes;
    // The end-of-split merge reuses the rings: per warp m[8], l[8], acc[8][128].
    static_assert(kIdWarps * warp_bytes >= kIdWarps * (size_t)(2 * kIdMaxG + kIdMaxG * kIdD) * 4, "merge area");
};

// Blocks per SM the shared memory allows (228 KB per SM, 1 KB reserved per block), at most
// 3 (the register cap of __launch_bounds__(kIdThreads, 3)).
template <KvType KT, KvType VT>
constexpr uint32_t id_blocks_per_sm() {
    const size_t per_block = IdLayout<KT, VT>::total + 1024;
    const size_t n = (size_t)228 * 1024 / per_block;
    return (uint32_t)std::min<size_t>(3, std::max<size_t>(1, n));
}

// Four bytes of smem at an even offset as one word.
__device__ __forceinline__ uint32_t lds_u32_at_u16(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
__device__ __forceinline__ float half_bits_to_float(uint32_t bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}
// Byte j of u (0..255) as the float 2^23 + u: exact, two full-rate instructions with the
// subtraction, where int-to-float conversion runs at a quarter rate.
template <int J>
__device__ __forceinline__ float byte_as_float_biased(uint32_t u) {
    return __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7540 + J));
}

// Word at byte offset off (compile-time after unrolling) of registers w[] holding a slice.
template <int N>
__device__ __forceinline__ uint32_t word_at(const uint32_t (&w)[N], int off) {
    return off % 4 == 0 ? w[off / 4] : __funnelshift_r(w[off / 4], w[off / 4 + 1], 8 * (off % 4));
}

template <KvType KT, KvType VT, int kG>
__global__ void __launch_bounds__(kIdThreads, 3) attention_int_dot_kernel(SplitParams p) {
    using L = IdLayout<KT, VT>;
    extern __shared__ __align__(128) uint8_t smem[];
    int* qw = reinterpret_cast<int*>(smem + L::qw);
    float* qd = reinterpret_cast<float*>(smem + L::qd);
    int* qsum = reinterpret_cast<int*>(smem + L::qsum);
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    uint8_t* ring = smem + L::warps + warp * L::warp_bytes;
    float* wbuf = reinterpret_cast<float*>(ring + kIdStages * L::stage);

    const uint32_t kv_head = blockIdx.x, split = blockIdx.y;
    const uint32_t cell_begin = split * p.cells_per_split;
    const uint32_t cell_end = min(p.n_cells, cell_begin + p.cells_per_split);
    const uint32_t n_chunks = (cell_end - cell_begin + kIdChunk - 1) / kIdChunk;
    const uint32_t ng = p.n_group;

    const uint8_t* k_src = p.k + (size_t)kv_head * L::kSliceK;
    const uint8_t* v_src = p.v + (size_t)kv_head * L::kSliceV;
    // Local step i of this warp is chunk warp + kIdWarps * i of the split.
    auto issue = [&](uint32_t i) {
        const uint32_t chunk = warp + kIdWarps * i;
        if (chunk < n_chunks) {
            uint8_t* sk = ring + (i % kIdStages) * L::stage;
            uint8_t* sv = sk + kIdChunk * L::kSliceK;
            const uint32_t first = cell_begin + chunk * kIdChunk;
            const uint32_t count = min((uint32_t)kIdChunk, cell_end - first);
            constexpr uint32_t ck = copy_chunk(L::kSliceK), cv = copy_chunk(L::kSliceV);
            for (uint32_t j = lane; j < count * (L::kSliceK / ck); j += 32) {
                const uint32_t c = j / (L::kSliceK / ck), o = j % (L::kSliceK / ck) * ck;
                cp_async<ck>(sk + c * L::kSliceK + o, k_src + (size_t)(first + c) * p.k_row_bytes + o);
            }
            for (uint32_t j = lane; j < count * (L::kSliceV / cv); j += 32) {
                const uint32_t c = j / (L::kSliceV / cv), o = j % (L::kSliceV / cv) * cv;
                cp_async<cv>(sv + c * L::kSliceV + o, v_src + (size_t)(first + c) * p.v_row_bytes + o);
            }
        }
        cp_async_commit();
    };
    // A programmatic launch (pdl_launch.cuh): a split of settled cells copies before waiting
    // for q's producer, the split with the step's new cell after (the split kernel's rule).
    const bool settled = cell_end <= p.settled_cells;
    if (settled) issue(0);
    pdl_wait_for_producer();
    pdl_release_dependents();
    if (!settled) issue(0);

    // q of this group to int16 per 32-block: warp w quantizes heads w, w+4; lane = 4 dims.
    for (uint32_t g = warp; g < kIdMaxG; g += kIdWarps) {
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (g < ng) {
            const float* qg = p.q + (size_t)(kv_head * ng + g) * kIdD + 4 * lane;
            x[0] = qg[0], x[1] = qg[1], x[2] = qg[2], x[3] = qg[3];
        }
        float amax = fmaxf(fmaxf(fabsf(x[0]), fabsf(x[1])), fmaxf(fabsf(x[2]), fabsf(x[3])));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = amax / 32767.0f, inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int qi[4], s = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            qi[j] = __float2int_rn(x[j] * inv);
            s += qi[j];
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        qw[g * (kIdD / 2) + 2 * lane] = (int)((uint32_t)(qi[0] & 0xffff) | ((uint32_t)qi[1] << 16));
        qw[g * (kIdD / 2) + 2 * lane + 1] = (int)((uint32_t)(qi[2] & 0xffff) | ((uint32_t)qi[3] << 16));
        if (lane % 8 == 0) {
            qd[g * kIdBlocks + lane / 8] = d * p.scale_log2;
            qsum[g * kIdBlocks + lane / 8] = s;
        }
    }
    __syncthreads();

    float m_run[kG], l_run[kG], acc[kG][4];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
        m_run[g] = -INFINITY;
        l_run[g] = 0.0f;
        acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;
    }
    const uint32_t vb = lane / 8, vsub = lane % 8;  // P V: this lane's V block and 4-dim slot

    for (uint32_t i = 0; warp + kIdWarps * i < n_chunks; ++i) {
        issue(i + 1);
        cp_async_wait<1>();
        __syncwarp();
        const uint8_t* sk = ring + (i % kIdStages) * L::stage;
        const uint8_t* sv = sk + kIdChunk * L::kSliceK;
        const uint32_t first = cell_begin + (warp + kIdWarps * i) * kIdChunk;
        const uint32_t valid = min((uint32_t)kIdChunk, cell_end - first);

        // QK: lane = cell. The K slice comes to registers with 8-byte loads (the slice
        // stride is a multiple of 8; blocks start at 2-byte offsets, realigned by funnel shifts).
        float sc[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) sc[g] = 0.0f;
        if (lane < valid) {
            uint32_t kwv[L::kSliceK / 4 + 1];
#pragma unroll
            for (int j = 0; j < (int)L::kSliceK / 8; ++j) {
                const uint2 t = *reinterpret_cast<const uint2*>(sk + lane * L::kSliceK + 8 * j);
                kwv[2 * j] = t.x;
                kwv[2 * j + 1] = t.y;
            }
            kwv[L::kSliceK / 4] = 0;
#pragma unroll
            for (int b = 0; b < kIdBlocks; ++b) {
                constexpr int bb = KT == KvType::q8_0 ? 34 : 18;
                const float dk = half_bits_to_float(word_at(kwv, bb * b));
                uint32_t kq[8];
                if constexpr (KT == KvType::q8_0) {
#pragma unroll
                    for (int k = 0; k < 8; ++k) kq[k] = word_at(kwv, bb * b + 2 + 4 * k);
                } else {
                    // q4_0: values 0..15 are the low nibbles of qs[0..15], 16..31 the high
                    // ones; kept unsigned (0..15), the -8 comes back through qsum below.
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const uint32_t w = word_at(kwv, bb * b + 2 + 4 * k);
                        kq[k] = w & 0x0F0F0F0Fu;
                        kq[4 + k] = (w >> 4) & 0x0F0F0F0Fu;
                    }
                }
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    const int4* qp = reinterpret_cast<const int4*>(qw + g * (kIdD / 2) + b * 16);
                    int isum = 0;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int4 q4 = qp[j];
                        isum = __dp2a_lo(q4.x, (int)kq[2 * j], isum);
                        isum = __dp2a_hi(q4.y, (int)kq[2 * j], isum);
                        isum = __dp2a_lo(q4.z, (int)kq[2 * j + 1], isum);
                        isum = __dp2a_hi(q4.w, (int)kq[2 * j + 1], isum);
                    }
                    if constexpr (KT == KvType::q4_0) isum -= 8 * qsum[g * kIdBlocks + b];
                    sc[g] = fmaf((float)isum, dk * qd[g * kIdBlocks + b], sc[g]);
                }
            }
        }

        // Online softmax over the chunk (base 2; the max is warp-uniform, sums stay per lane).
        float pw[kIdMaxG];
#pragma unroll
        for (int g = 0; g < kIdMaxG; ++g) pw[g] = 0.0f;
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            const float s = lane < valid && (uint32_t)g < ng ? sc[g] : -INFINITY;
            float m = s;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if ((uint32_t)g < ng) {  // m is finite: the chunk has >= 1 valid cell
                const float m_new = fmaxf(m_run[g], m);
                const float alpha = exp2f(m_run[g] - m_new);  // 0 on the first chunk
                const float e = exp2f(s - m_new);              // 0 for invalid cells
                l_run[g] = l_run[g] * alpha + e;
                m_run[g] = m_new;
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[g][j] *= alpha;
                pw[g] = e;
            }
        }
        // Weights w[cell][block][head] = p * d_v (f16 V: p alone), written by the cell's lane.
        if (lane < valid) {
#pragma unroll
            for (int r = 0; r < L::kWRows; ++r) {
                float dv = 1.0f;
                if constexpr (VT != KvType::f16) {
                    constexpr int vbb = VT == KvType::q8_0 ? 34 : 18;
                    dv = __half2float(*reinterpret_cast<const __half*>(sv + lane * L::kSliceV + vbb * r));
                }
                float4* dst = reinterpret_cast<float4*>(wbuf + (lane * L::kWRows + r) * kIdMaxG);
                dst[0] = make_float4(pw[0] * dv, pw[1] * dv, pw[2] * dv, pw[3] * dv);
                if (kG > 4) dst[1] = make_float4(pw[4] * dv, pw[5] * dv, pw[6] * dv, pw[7] * dv);
            }
        }
        __syncwarp();

        // P V: lane owns dims 4*lane..4*lane+3 of every head; cells past `valid` are skipped
        // (their ring bytes are stale).
        const int wrow = VT == KvType::f16 ? 0 : (int)vb;
#pragma unroll 4
        for (uint32_t c = 0; c < valid; ++c) {
            const float* wp = wbuf + (c * L::kWRows + wrow) * kIdMaxG;
            const float4 w0 = *reinterpret_cast<const float4*>(wp);
            float4 w1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kG > 4) w1 = *reinterpret_cast<const float4*>(wp + 4);
            const float wg[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            float v[4];
            const uint8_t* row = sv + c * L::kSliceV;
            if constexpr (VT == KvType::f16) {
                const uint2 t = *reinterpret_cast<const uint2*>(row + 8 * lane);
                const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&t.x));
                const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&t.y));
                v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
            } else if constexpr (VT == KvType::q8_0) {
                const uint32_t u = lds_u32_at_u16(row + 34 * vb + 2 + 4 * vsub) ^ 0x80808080u;  // q + 128
                v[0] = byte_as_float_biased<0>(u) - 8388736.0f;
                v[1] = byte_as_float_biased<1>(u) - 8388736.0f;
                v[2] = byte_as_float_biased<2>(u) - 8388736.0f;
                v[3] = byte_as_float_biased<3>(u) - 8388736.0f;
            } else {
                const uint32_t w = lds_u32_at_u16(row + 18 * vb + 2 + 4 * (vsub % 4));
                const uint32_t u = (vsub < 4 ? w : w >> 4) & 0x0F0F0F0Fu;  // q + 8
                v[0] = byte_as_float_biased<0>(u) - 8388616.0f;
                v[1] = byte_as_float_biased<1>(u) - 8388616.0f;
                v[2] = byte_as_float_biased<2>(u) - 8388616.0f;
                v[3] = byte_as_float_biased<3>(u) - 8388616.0f;
            }
#pragma unroll
            for (int g = 0; g < kG; ++g)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[g][j] = fmaf(wg[g], v[j], acc[g][j]);
        }
        __syncwarp();  // the ring stage and wbuf are rewritten next step
    }
    cp_async_wait<0>();

    // Merge the block's warps: per warp m[g], l[g] (lane sums reduced), acc[g][128].
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l_run[g] += __shfl_xor_sync(0xffffffffu, l_run[g], o);
    __syncthreads();  // every warp is done with its ring
    float* mw = reinterpret_cast<float*>(smem + L::warps);
    float* lw = mw + kIdWarps * kIdMaxG;
    float* aw = lw + kIdWarps * kIdMaxG;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
        if (lane == 0) {
            mw[warp * kIdMaxG + g] = m_run[g];
            lw[warp * kIdMaxG + g] = l_run[g];
        }
        *reinterpret_cast<float4*>(aw + (warp * kIdMaxG + g) * kIdD + 4 * lane) =
            make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    }
    __syncthreads();
    for (uint32_t idx = tid; idx < ng * kIdD; idx += kIdThreads) {
        const uint32_t g = idx / kIdD, d = idx % kIdD;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kIdWarps; ++w) m = fmaxf(m, mw[w * kIdMaxG + g]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < kIdWarps; ++w) {
            const float mv = mw[w * kIdMaxG + g];
            if (mv != -INFINITY) {  // a warp with no chunk contributes nothing
                const float s = exp2f(mv - m);
                l += lw[w * kIdMaxG + g] * s;
                o += aw[(w * kIdMaxG + g) * kIdD + d] * s;
            }
        }
        const uint32_t head = kv_head * ng + g;
        p.part_out[((size_t)split * p.n_head + head) * kIdD + d] = o / l;
        if (d == 0) p.part_lse[(size_t)split * p.n_head + head] = (m + log2f(l)) / kLog2e;
    }
    attention_finish_single_split<kIdD>(p, kv_head);
}

template <KvType KT, KvType VT>
SplitPlan plan_int_dot(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    if (n_cells == 0) return {0, 0};
    // One wave of blocks, as many as fit per SM (rounded down: a few blocks of a second
    // wave would double the time); at least a chunk per warp per split.
    const uint32_t wanted = std::max(1u, id_blocks_per_sm<KT, VT>() * std::max(1u, sm_count) / shape.n_head_kv);
    const uint32_t min_cells = kIdChunk * kIdWarps;
    const uint32_t splits = std::min(wanted, (n_cells + min_cells - 1) / min_cells);
    const uint32_t per = ((n_cells + splits - 1) / splits + kIdChunk - 1) / kIdChunk * kIdChunk;
    return {(n_cells + per - 1) / per, per};
}

template <KvType KT>
SplitPlan plan_int_dot_v(KvType v_type, const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    switch (v_type) {
        case KvType::f16: return plan_int_dot<KT, KvType::f16>(shape, n_cells, sm_count);
        case KvType::q8_0: return plan_int_dot<KT, KvType::q8_0>(shape, n_cells, sm_count);
        case KvType::q4_0: return plan_int_dot<KT, KvType::q4_0>(shape, n_cells, sm_count);
    }
    return {0, 0};
}

SplitPlan plan_int_dot_any(KvType k_type, KvType v_type, const AttentionShape& shape, uint32_t n_cells,
                           uint32_t sm_count) {
    return k_type == KvType::q8_0 ? plan_int_dot_v<KvType::q8_0>(v_type, shape, n_cells, sm_count)
                                  : plan_int_dot_v<KvType::q4_0>(v_type, shape, n_cells, sm_count);
}

template <KvType KT, KvType VT, int kG>
void launch_int_dot_g(const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits, cudaStream_t stream) {
    constexpr size_t smem = IdLayout<KT, VT>::total;
    static const bool configured = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_int_dot_kernel<KT, VT, kG>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return true;
    }();
    (void)configured;
    launch_with_pdl(pdl_site_on(PdlSite::attention), attention_int_dot_kernel<KT, VT, kG>, dim3(n_head_kv, n_splits),
                    dim3(kIdThreads), smem, stream, p);
}

template <KvType KT, KvType VT>
void launch_int_dot(const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits, cudaStream_t stream) {
    // Exact group sizes avoid wasted FMAs (5: Qwen2.5-14B, 4: Llama-style); others pad to 8.
    if (p.n_group == 5) launch_int_dot_g<KT, VT, 5>(p, n_head_kv, n_splits, stream);
    else if (p.n_group <= 4) launch_int_dot_g<KT, VT, 4>(p, n_head_kv, n_splits, stream);
    else launch_int_dot_g<KT, VT, 8>(p, n_head_kv, n_splits, stream);
}

template <KvType KT>
void dispatch_int_dot_v(KvType v_type, const SplitParams& p, uint32_t n_head_kv, uint32_t n_splits,
                        cudaStream_t stream) {
    switch (v_type) {
        case KvType::f16: return launch_int_dot<KT, KvType::f16>(p, n_head_kv, n_splits, stream);
        case KvType::q8_0: return launch_int_dot<KT, KvType::q8_0>(p, n_head_kv, n_splits, stream);
        case KvType::q4_0: return launch_int_dot<KT, KvType::q4_0>(p, n_head_kv, n_splits, stream);
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

bool attention_kernel_supports(AttentionKernel kernel, const AttentionShape& shape, KvType k_type, KvType v_type) {
    if (!attention_supports(shape)) return false;
    if (kernel == AttentionKernel::tensor_core) return true;
    if (kernel == AttentionKernel::mma)
        return shape.head_dim_k == attention_mma::kHeadDim && shape.n_head / shape.n_head_kv <= attention_mma::kMaxGroup;
    (void)v_type;
    return (k_type == KvType::q8_0 || k_type == KvType::q4_0) && shape.head_dim_k == (uint32_t)kIdD &&
           shape.n_head / shape.n_head_kv <= (uint32_t)kIdMaxG;
}

// SPILLWAY_ATTN_MMA_MIN_CELLS=N (lab): the range length from which the mma kernel is picked,
// for every K type (A/B of the thresholds in the engine; docs/perf-notes.md, session 20).
uint32_t attention_mma_min_cells(KvType k_type, KvType v_type) {
    static const uint32_t forced = lab_knob_uint("SPILLWAY_ATTN_MMA_MIN_CELLS", 0, 1u << 30);
    if (forced != 0) return forced;
    if (k_type == KvType::f16) return v_type == KvType::f16 ? kAttentionMmaMinCells : kAttentionMmaMinCellsF16KQuantizedV;
    if (v_type == k_type) return kAttentionMmaMinCellsEqualQuantized;
    if (v_type == KvType::q4_0) return kAttentionMmaMinCellsQ4V;
    return v_type == KvType::q8_0 ? kAttentionMmaMinCellsQ8V : kAttentionMmaMinCellsQuantizedKF16V;
}

AttentionKernel attention_default_kernel(const AttentionShape& shape, KvType k_type, KvType v_type,
                                         uint32_t n_cells) {
    // mma for long ranges wherever it applies (docs/perf-notes.md, "Decode attention,
    // session 10 — D1"), else int_dot for quantized K, else tensor_core.
    if (n_cells >= attention_mma_min_cells(k_type, v_type) && attention_kernel_supports(AttentionKernel::mma, shape, k_type, v_type))
        return AttentionKernel::mma;
    return attention_kernel_supports(AttentionKernel::int_dot, shape, k_type, v_type) ? AttentionKernel::int_dot
                                                                                      : AttentionKernel::tensor_core;
}

uint32_t attention_split_count(AttentionKernel kernel, const AttentionShape& shape, KvType k_type, KvType v_type,
                               uint32_t n_cells, uint32_t sm_count) {
    if (kernel == AttentionKernel::int_dot) return plan_int_dot_any(k_type, v_type, shape, n_cells, sm_count).n_splits;
    if (kernel == AttentionKernel::mma)
        return attention_mma::plan(k_type, v_type, shape.n_head_kv, n_cells, sm_count).n_splits;
    return plan_splits(shape, n_cells, sm_count).n_splits;
}

size_t attention_workspace_bytes(const AttentionShape& shape, uint32_t n_cells, uint32_t sm_count) {
    // Enough for every kernel and KV type pair, so one workspace serves any choice.
    uint32_t splits = attention_split_count(shape, n_cells, sm_count);
    if (attention_supports(shape) && shape.head_dim_k == (uint32_t)kIdD)
        for (KvType kt : {KvType::q8_0, KvType::q4_0})
            for (KvType vt : {KvType::f16, KvType::q8_0, KvType::q4_0})
                splits = std::max(splits, plan_int_dot_any(kt, vt, shape, n_cells, sm_count).n_splits);
    if (attention_supports(shape) && shape.head_dim_k == attention_mma::kHeadDim)
        for (KvType kt : {KvType::f16, KvType::q8_0, KvType::q4_0})
            for (KvType vt : {KvType::f16, KvType::q8_0, KvType::q4_0})
                splits = std::max(splits, attention_mma::plan(kt, vt, shape.n_head_kv, n_cells, sm_count).n_splits);
    if (splits <= 1) return 0;
    return (size_t)splits * shape.n_head * (shape.head_dim_v + 1) * sizeof(float);
}

// SPILLWAY_LAB_SKIP_MERGE=1 (lab, wrong output: a timing bound): no split merge launch; the
// output projection reads whatever its input buffer holds. What folding the merge into the
// attention kernels could buy at most: session 52 (H100, tg48): f16 +2.8% at 8192 cells and
// +0.7% at 32768, q8_0 +1.3% / +1.4%. (A fold that lost: the split kernel's splits of a KV head
// as one thread-block cluster merging in distributed shared memory (described in perf-notes, session 52):
// 16 splits instead of 33 packed two blocks per SM on half the SMs, -6.7% at 8192.)
bool lab_skip_merge() {
    static const bool skip = lab_knob("SPILLWAY_LAB_SKIP_MERGE", "1", "0");
    return skip;
}

// SPILLWAY_ATTN_FINISH=kernels (lab): a single split's int16 output written by a quantize
// launch of its own, as before session 17 (A/B in one binary).
bool attention_finish_fused() {
    static const bool fused = !lab_knob("SPILLWAY_ATTN_FINISH", "kernels", "fused");
    return fused;
}

// Several splits only: with one (up to 64 cells) the n_head_kv blocks of the launch would do
// serially what qkv_post_kernel's n_head + 2 n_head_kv blocks do in parallel, and the launch
// saved does not pay for it (session 17, 14B shape, tok/s with / without: d = 0 201.3 / 206.2,
// 2048 196.4 / 194.6, 8192 184.4 / 182.0).
bool attention_takes_post_qkv(const AttentionShape& shape, KvType k_type, KvType v_type, uint32_t n_cells,
                              uint32_t sm_count) {
    return n_cells > 0 && attention_supports(shape) &&
           attention_default_kernel(shape, k_type, v_type, n_cells) == AttentionKernel::tensor_core &&
           plan_splits(shape, n_cells, sm_count).n_splits > 1;
}

void attention_partial_cuda(const AttentionShape& shape, const float* q, KvType k_type,
                            const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                            uint32_t n_cells, float* out, float* lse, void* workspace,
                            size_t workspace_bytes, uint32_t sm_count, cudaStream_t stream, ActQ16 out_q16,
                            uint32_t settled_cells, const AttentionPostQkv* post, bool merge_programmatic) {
    attention_partial_cuda_with(attention_default_kernel(shape, k_type, v_type, n_cells), shape, q, k_type, k_cells, v_type,
                                v_cells, n_cells, out, lse, workspace, workspace_bytes, sm_count, stream, out_q16,
                                settled_cells, post, merge_programmatic);
}

void attention_partial_cuda_with(AttentionKernel kernel, const AttentionShape& shape, const float* q,
                                 KvType k_type, const uint8_t* k_cells, KvType v_type, const uint8_t* v_cells,
                                 uint32_t n_cells, float* out, float* lse, void* workspace, size_t workspace_bytes,
                                 uint32_t sm_count, cudaStream_t stream, ActQ16 out_q16, uint32_t settled_cells,
                                 const AttentionPostQkv* post, bool merge_programmatic) {
    if (out_q16 && (!out_q16.d || reinterpret_cast<uintptr_t>(out_q16.q) % 16 != 0))
        fail("attention_partial_cuda: the quantized output needs q (16-byte aligned) and d");
    if (!attention_kernel_supports(kernel, shape, k_type, v_type))
        fail("attention_partial_cuda: kernel does not support this shape / KV types");
    if (!attention_supports(shape)) fail("attention_partial_cuda: unsupported shape (head dim 64/128, K and V dims equal, <= 16 query heads per KV head)");
    const uint32_t n_values = shape.n_head * shape.head_dim_v;
    if (post != nullptr && n_cells == 0) fail("attention_partial_cuda: post-QKV work needs the new cell");
    if (n_cells == 0) {
        empty_partial_kernel<<<(n_values + 255) / 256, 256, 0, stream>>>(n_values, shape.n_head, out, lse);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        if (out_q16) quantize_act_q16_cuda(out, n_values, 1, out_q16, stream);
        return;
    }
    if (reinterpret_cast<uintptr_t>(k_cells) % 16 != 0 || reinterpret_cast<uintptr_t>(v_cells) % 16 != 0)
        fail("attention_partial_cuda: K and V cells must be 16-byte aligned");
    const size_t needed = attention_workspace_bytes(shape, n_cells, sm_count);
    const bool int_dot = kernel == AttentionKernel::int_dot, mma = kernel == AttentionKernel::mma;
    SplitPlan plan = int_dot ? plan_int_dot_any(k_type, v_type, shape, n_cells, sm_count)
                             : plan_splits(shape, n_cells, sm_count);
    if (mma) plan = attention_mma::plan(k_type, v_type, shape.n_head_kv, n_cells, sm_count);
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
    p.splits_lo = plan.splits_lo;
    p.splits_hi = plan.splits_hi;
    p.hi_heads = plan.hi_heads;
    p.n_group = shape.n_head / shape.n_head_kv;
    p.scale_log2 = shape.scale * kLog2e;
    p.n_head = shape.n_head;
    p.settled_cells = settled_cells;
    if (plan.n_splits == 1) {
        p.part_out = out;
        p.part_lse = lse;
    } else {
        p.part_out = static_cast<float*>(workspace);
        p.part_lse = p.part_out + (size_t)plan.n_splits * n_values;
    }
    if (post != nullptr) {
        if (kernel != AttentionKernel::tensor_core)
            fail("attention_partial_cuda: only the tensor_core kernel does the post-QKV work");
        if (post->rope_table == nullptr || post->rope_dims == 0 || post->rope_dims % 2 != 0 ||
            post->rope_dims > shape.head_dim_k || !post->new_k || !post->new_v || !post->k_cache || !post->v_cache)
            fail("attention_partial_cuda: incomplete post-QKV arguments");
        if (settled_cells >= n_cells) fail("attention_partial_cuda: the new cell written here cannot be settled");
        p.rope_table = post->rope_table;
        p.rope_dims = post->rope_dims;
        p.rope_neox = post->rope_neox ? 1 : 0;
        p.qkv_bias = post->bias;
        p.new_k = post->new_k;
        p.new_v = post->new_v;
        p.k_store = post->k_cache;
        p.v_store = post->v_cache;
        p.new_cell = n_cells - 1;
    }
    p.n_splits = plan.n_splits;
    uint64_t* const merge_timeline =
        mma && lab_timeline != nullptr
            ? lab_timeline + (size_t)shape.n_head_kv * plan.n_splits * kAttentionTimelineWarpsPerBlock * kAttentionTimelineSlots
            : nullptr;
    if (mma) p.timeline = lab_timeline;
    if (plan.n_splits == 1 && out_q16 && attention_finish_fused() && shape.head_dim_v % 32 == 0) {
        p.out_q = out_q16.q;
        p.out_d = out_q16.d;
    }
    if (mma) {
        attention_mma::launch(k_type, v_type, p, shape.n_head_kv, plan.n_splits, stream);
    } else if (int_dot) {
        if (k_type == KvType::q8_0) dispatch_int_dot_v<KvType::q8_0>(v_type, p, shape.n_head_kv, plan.n_splits, stream);
        else dispatch_int_dot_v<KvType::q4_0>(v_type, p, shape.n_head_kv, plan.n_splits, stream);
    } else if (shape.head_dim_k == 64) dispatch_k<64>(k_type, v_type, p, shape.n_head_kv, plan.n_splits, stream);
    else dispatch_k<128>(k_type, v_type, p, shape.n_head_kv, plan.n_splits, stream);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    if (plan.n_splits > 1 && lab_skip_merge()) return;
    if (plan.n_splits > 1) {
        if (plan.n_splits > kMergeMaxSplits) fail("attention_partial_cuda: more splits than the merge kernel holds");
        if (kMergeThreads % shape.head_dim_v != 0) fail("attention_partial_cuda: head dim must divide 512");
        // The block merge after every kernel (merge_by_blocks); the warp merge is a lab variant
        // after mma / int_dot (it never served the split kernel: 1% slower there, session 19).
        const bool merge_pdl = merge_programmatic && pdl_site_on(PdlSite::merge);
        if (shape.head_dim_v % 32 == 0 && !merge_by_blocks() && kernel != AttentionKernel::tensor_core)
            launch_with_pdl(merge_pdl, merge_splits_warp_kernel,
                            dim3(shape.head_dim_v / 32, shape.n_head), dim3(32), 0, stream, (const float*)p.part_out,
                            (const float*)p.part_lse, plan.n_splits, shape.n_head, shape.head_dim_v, out, lse,
                            out_q16.q, out_q16.d, merge_timeline);
        else
            launch_with_pdl(merge_pdl, merge_splits_kernel, dim3(shape.n_head),
                            dim3(kMergeThreads / shape.head_dim_v * shape.head_dim_v), 0, stream,
                            (const float*)p.part_out, (const float*)p.part_lse, plan.n_splits, shape.n_head,
                            shape.head_dim_v, out, lse, out_q16.q, out_q16.d, merge_timeline);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    } else if (out_q16 && p.out_q == nullptr) {
        quantize_act_q16_cuda(out, n_values, 1, out_q16, stream);
    }
}

static_assert(kAttentionTimelineSlots == attention_mma::kTimelineSlots, "one timeline layout");
void attention_lab_timeline(uint64_t* stamps) { lab_timeline = stamps; }

void attention_merge_cuda(uint32_t n_head, uint32_t head_dim_v, float* out_a, float* lse_a,
                          const float* out_b, const float* lse_b, cudaStream_t stream) {
    if (n_head == 0) return;
    merge_pair_kernel<<<n_head, std::min(128u, head_dim_v), 0, stream>>>(head_dim_v, out_a, lse_a, out_b, lse_b);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
