// Causal prefill attention on mma.sync with 32 query rows per warp (FlashAttention-2's tiling:
// 128 rows x 64 cells per block on 4 warps; or 256 rows on 8 warps, `wide`).
//
// Why: the 16-row kernels of prefill_attention_mma.cu feed every 2 MMAs (m16n8k16) with one
// 512-byte ldmatrix.x4 from shared memory, in QK (K fragments) and in PV (V fragments); at
// the tensor rate of a Hopper SM that is about what shared memory delivers, so they stall on
// it (measured 204-264 TFLOP/s). With two 16-row MMA tiles per warp every K/V fragment feeds
// 4 MMAs: QK needs 6 ldmatrix.x4 per 16 MMAs (2 for Q, 4 for K) instead of 4 per 8, PV 8 per
// 32 instead of 4 per 8. The price is registers: 128 f32 O accumulators and 64 scores per
// thread, so Q no longer fits in registers and is staged once per block in shared memory
// (f16, pre-scaled by scale * log2 e so that scores come out in base 2).
// 4 warps: 2 blocks per SM (104 KB of shared memory each at D = 128, <= 255 registers per
// thread); 8 warps: 1 block of 139 KB.
// K and V are waited for separately (two cp.async stages each): S = Q Kᵀ starts while V is
// still landing; the next K tile is issued once every warp is past S of the previous one,
// the next V tile once the current one has landed. Quantized tiles are dequantized to f16 in
// shared memory as in the 16-row kernels.
// Rows are the flattened (token, head of the GQA group) pairs of one KV head, as in
// prefill_attention_mma.cu (the G heads share every K/V tile); only tiles that reach past the
// first row's causal limit are masked; blocks with the longest rows start first.
// Split (sm_90+): a chunk deep in the cache has row blocks of nearly equal length, so a grid of
// e.g. 640 of them on 264 slots runs 2.42 waves with the last one 42% full (64k prompt,
// 2048-token chunks). Then 2, 4 or 8 CTAs of a thread-block cluster take consecutive slices of
// each row block's tiles and merge their (O, max, sum) through distributed shared memory at
// the end; the launcher picks the split (prefill_attention_split_for).
#include "engine/cuda/prefill_attention_m32.cuh"

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/prefill_mma_device.cuh"

namespace spillway {
namespace {

using kv_tile::align128;
using kv_tile::cp_async_commit;
using kv_tile::slice_bytes;
using namespace prefill_mma;

// Shared memory of one block, in bytes: [Q f16][K][V]; K (and V) is two f16 stages, or for a
// quantized operand one f16 tile and two raw stages it is dequantized from.
template <int D, KvType KT, KvType VT, int kWarps>
struct M32Layout {
    static constexpr int kRows = kWarps * 32;  // query rows per block
    static constexpr int kLd = row_halves<D>();
    static constexpr uint32_t kTileBytes = kCells * kLd * 2;
    static constexpr uint32_t kQBytes = kRows * kLd * 2;
    static constexpr uint32_t kSliceK = slice_bytes(KT, D), kSliceV = slice_bytes(VT, D);
    static constexpr bool kDirectK = KT == KvType::f16, kDirectV = VT == KvType::f16;
    static constexpr uint32_t kRawK = align128(kCells * kSliceK), kRawV = align128(kCells * kSliceV);
    static constexpr uint32_t k_bytes = kDirectK ? 2 * kTileBytes : kTileBytes + 2 * kRawK;
    static constexpr uint32_t v_bytes = kDirectV ? 2 * kTileBytes : kTileBytes + 2 * kRawV;
    static constexpr uint32_t q_base = 0, k_base = kQBytes, v_base = k_base + k_bytes;
    static constexpr uint32_t total = v_base + v_bytes;
};

// 4 warps: 2 blocks per SM; 8 warps (256 rows): 1 block per SM, half the K/V tile reads and
// dequantizations per row. Either way 8 warps and <= 255 registers per thread.
template <int D, KvType KT, KvType VT, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, 8 / kWarps) prefill_attention_m32_kernel(Params p) {
    using L = M32Layout<D, KT, VT, kWarps>;
    constexpr int kThreads = kWarps * 32;
    constexpr int kRows = L::kRows;
    constexpr int kLd = L::kLd;
    constexpr int kSlabs = D / 16;  // k-steps of QK, and 16-dim column pairs of PV
    extern __shared__ __align__(128) uint8_t smem[];
    __half* sq = reinterpret_cast<__half*>(smem + L::q_base);

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t gq = lane / 4, tq = lane % 4;  // mma fragment coordinates
    const uint32_t kv_head = blockIdx.y;
    // With a split, the n_split CTAs of a cluster (consecutive x) share one row block and take
    // consecutive slices of its tiles; rank 0 merges the partials through distributed shared memory.
    const uint32_t n_split = p.n_split, rank = blockIdx.x % n_split;
    const uint32_t row_block = p.n_row_blocks - 1 - blockIdx.x / n_split;  // the longest rows start first
    const uint32_t G = p.n_group;
    const RowBlockSpan span = row_block_span<kRows>(p, row_block);
    const uint32_t row0 = span.row0, cell_stop = span.cell_stop, full_end = span.full_end, n_tiles = span.n_tiles;
    const uint32_t tile_begin = rank * n_tiles / n_split, tile_end = (rank + 1) * n_tiles / n_split;

    const uint8_t* k_src = p.k + (size_t)kv_head * L::kSliceK;
    const uint8_t* v_src = p.v + (size_t)kv_head * L::kSliceV;
    auto k_stage = [&](uint32_t tile) {
        return smem + L::k_base + (L::kDirectK ? (tile % 2) * L::kTileBytes : L::kTileBytes + (tile % 2) * L::kRawK);
    };
    auto v_stage = [&](uint32_t tile) {
        return smem + L::v_base + (L::kDirectV ? (tile % 2) * L::kTileBytes : L::kTileBytes + (tile % 2) * L::kRawV);
    };
    auto tile_count = [&](uint32_t tile) { return min((uint32_t)kCells, cell_stop - p.cell_begin - tile * kCells); };
    auto issue_k = [&](uint32_t tile) {
        issue_operand<D, KT, kThreads>(k_stage(tile), k_src + (uint64_t)tile * kCells * p.k_row, p.k_row,
                                       tile_count(tile));
    };
    auto issue_v = [&](uint32_t tile) {
        issue_operand<D, VT, kThreads>(v_stage(tile), v_src + (uint64_t)tile * kCells * p.v_row, p.v_row,
                                       tile_count(tile));
    };
    // Two groups per tile, K then V, committed even when empty so that "all but the newest
    // group" is always the operand waited for.
    if (tile_begin < tile_end) issue_k(tile_begin);
    cp_async_commit();
    if (tile_begin < tile_end) issue_v(tile_begin);
    cp_async_commit();

    // Q of the block's rows as f16 (rows past the chunk are zeros), while K/V tile 0 lands.
    stage_q_f16<D, kRows, kThreads>(p, row0, kv_head, sq, kLd);

    // This thread's four rows: gq and gq + 8 of each of the warp's two 16-row MMA tiles.
    const uint32_t my_row0 = row0 + warp * 32 + gq;  // + 16 mt + 8 h

    float o[2][2 * kSlabs][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 2 * kSlabs; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[mt][j][i] = 0.0f;
    float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

    // ldmatrix addresses of this lane. Q (A operand, x4): matrices (rows +0, dims +0), (+8, +0),
    // (+0, +8), (+8, +8). K (B of QK, x4): (cells +0, dims +0), (+0, +8), (+8, +0), (+8, +8).
    // V (B of PV, x4 trans): (cells +0, dims +0), (+8, +0), (+0, +8), (+8, +8).
    const uint32_t mi = lane / 8;
    const __half* q_frag = sq + (warp * 32 + lane % 16) * kLd + (lane / 16) * 8;
    const uint32_t k_frag = ((mi / 2) * 8 + lane % 8) * kLd + (mi % 2) * 8;
    const uint32_t v_frag = ((mi % 2) * 8 + lane % 8) * kLd + (mi / 2) * 8;

    for (uint32_t tile = tile_begin; tile < tile_end; ++tile) {
        const uint32_t c0 = p.cell_begin + tile * kCells;
        cp_async_wait<1>();  // K(tile) is in; V(tile) may still be in flight
        __syncthreads();     // ... for every thread; every warp is past S of tile - 1 (and Q is stored)
        const __half* kt;
        if constexpr (L::kDirectK) {
            kt = reinterpret_cast<const __half*>(k_stage(tile));
        } else {
            __half* tile_f16 = reinterpret_cast<__half*>(smem + L::k_base);
            dequant_operand<D, KT, kThreads>(k_stage(tile), tile_f16, tile_count(tile));
            __syncthreads();
            kt = tile_f16;
        }
        if (tile + 1 < tile_end) issue_k(tile + 1);
        cp_async_commit();

        // S = Q Kᵀ: per MMA tile 8 accumulators of 8 cells; each K fragment feeds both tiles.
        float s[2][kCells / 8][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int j = 0; j < kCells / 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) s[mt][j][i] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kSlabs; ++ks) {
            uint32_t qa[2][4];
            ldmatrix_x4(qa[0], q_frag + ks * 16);
            ldmatrix_x4(qa[1], q_frag + 16 * kLd + ks * 16);
#pragma unroll
            for (int np = 0; np < kCells / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, kt + k_frag + np * 16 * kLd + ks * 16);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_16816(s[mt][2 * np], qa[mt], b[0], b[1]);
                    mma_16816(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                }
            }
        }

        // Mask (range end and causality), only on tiles that reach past what all rows see.
        // The limits are recomputed here (1-2 tiles per block) rather than kept in registers.
        if (c0 + kCells > full_end) {
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t limit = min(p.cell_end, p.pos0 + (my_row0 + 16 * mt + 8 * h) / G + 1);
#pragma unroll
                    for (int j = 0; j < kCells / 8; ++j)
#pragma unroll
                        for (int i = 0; i < 2; ++i)
                            if (c0 + 8 * j + 2 * tq + i >= limit) s[mt][j][2 * h + i] = -INFINITY;
                }
        }

        // Online softmax per row; a row's 64 scores are spread over the 4 threads of a quad.
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            float alpha[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < kCells / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[mt][h], mx);
                const float ref = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep 0s, no NaN
                alpha[h] = fast_exp2(m[mt][h] - ref);
                m[mt][h] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < kCells / 8; ++j) {
                    s[mt][j][2 * h] = fast_exp2(s[mt][j][2 * h] - ref);
                    s[mt][j][2 * h + 1] = fast_exp2(s[mt][j][2 * h + 1] - ref);
                    sum += s[mt][j][2 * h] + s[mt][j][2 * h + 1];
                }
                l[mt][h] = l[mt][h] * alpha[h] + sum;  // this thread's part; the quad is summed at the end
            }
#pragma unroll
            for (int j = 0; j < 2 * kSlabs; ++j) {
                o[mt][j][0] *= alpha[0];
                o[mt][j][1] *= alpha[0];
                o[mt][j][2] *= alpha[1];
                o[mt][j][3] *= alpha[1];
            }
        }

        cp_async_wait<1>();  // V(tile) is in; K(tile + 1) may still be in flight
        __syncthreads();     // ... for every thread; every warp is past PV of tile - 1
        const __half* vt;
        if constexpr (L::kDirectV) {
            vt = reinterpret_cast<const __half*>(v_stage(tile));
        } else {
            __half* tile_f16 = reinterpret_cast<__half*>(smem + L::v_base);
            dequant_operand<D, VT, kThreads>(v_stage(tile), tile_f16, tile_count(tile));
            __syncthreads();
            vt = tile_f16;
        }
        if (tile + 1 < tile_end) issue_v(tile + 1);
        cp_async_commit();

        // O += P V over 4 slabs of 16 cells; P stays in registers (the accumulator layout of
        // two 8-cell tiles is the A layout of one 16-cell slab); each V fragment feeds both tiles.
#pragma unroll
        for (int cs = 0; cs < kCells / 16; ++cs) {
            uint32_t pa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                pa[mt][0] = pack_half2(s[mt][2 * cs][0], s[mt][2 * cs][1]);
                pa[mt][1] = pack_half2(s[mt][2 * cs][2], s[mt][2 * cs][3]);
                pa[mt][2] = pack_half2(s[mt][2 * cs + 1][0], s[mt][2 * cs + 1][1]);
                pa[mt][3] = pack_half2(s[mt][2 * cs + 1][2], s[mt][2 * cs + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < kSlabs; ++dp) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vt + v_frag + cs * 16 * kLd + dp * 16);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_16816(o[mt][2 * dp], pa[mt], b[0], b[1]);
                    mma_16816(o[mt][2 * dp + 1], pa[mt], b[2], b[3]);
                }
            }
        }
    }

    float sum[2][2];  // the row sums of the quad
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sum[mt][h] = l[mt][h];
            sum[mt][h] += __shfl_xor_sync(0xffffffffu, sum[mt][h], 1);
            sum[mt][h] += __shfl_xor_sync(0xffffffffu, sum[mt][h], 2);
        }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n_split > 1) {
        // Every CTA of the cluster leaves (O, m, l) of each row in its own shared memory (the
        // tiles are no longer needed), then each merges a slice of the rows from all of them
        // through distributed shared memory, as attention_merge does, and writes the result.
        // (Merging into rank 0's registers instead kept 128 accumulators live next to the
        // remote loads and made ptxas spill in the whole kernel.)
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        constexpr int kStride = D + 2;  // O, then m and l
        float* buf = reinterpret_cast<float*>(smem);
        __syncthreads();  // every warp is past its last K/V tile
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float* dst = buf + (warp * 32 + mt * 16 + gq + 8 * h) * kStride;
#pragma unroll
                for (int j = 0; j < 2 * kSlabs; ++j)
                    *reinterpret_cast<float2*>(dst + 8 * j + 2 * tq) = make_float2(o[mt][j][2 * h], o[mt][j][2 * h + 1]);
                if (tq == 0) {
                    dst[D] = m[mt][h];
                    dst[D + 1] = sum[mt][h];
                }
            }
        cluster.sync();  // every partial is visible to the whole cluster
        const uint32_t r_begin = rank * kRows / n_split, r_end = (rank + 1) * kRows / n_split;
        for (uint32_t i = threadIdx.x; i < (r_end - r_begin) * (D / 2); i += kThreads) {
            const uint32_t rr = r_begin + i / (D / 2), c = i % (D / 2) * 2, r = row0 + rr;
            if (r >= p.n_rows) continue;
            float m_all = -INFINITY;
            for (uint32_t q = 0; q < n_split; ++q) m_all = fmaxf(m_all, cluster.map_shared_rank(buf, (int)q)[rr * kStride + D]);
            float l_all = 0.0f;
            float2 acc = make_float2(0.0f, 0.0f);
            for (uint32_t q = 0; q < n_split; ++q) {
                const float* src = cluster.map_shared_rank(buf, (int)q) + rr * kStride;
                const float m_q = src[D];
                const float w = m_q == -INFINITY ? 0.0f : fast_exp2(m_q - m_all);  // saw nothing: weighs 0
                l_all += src[D + 1] * w;
                const float2 v = *reinterpret_cast<const float2*>(src + c);
                acc.x += v.x * w;
                acc.y += v.y * w;
            }
            const uint32_t t = r / G, g = r % G;
            const size_t head = (size_t)t * p.n_head + kv_head * G + g;
            const bool seen = l_all > 0.0f;
            const float inv = seen ? 1.0f / l_all : 0.0f;
            *reinterpret_cast<float2*>(p.out + head * D + c) = make_float2(acc.x * inv, acc.y * inv);
            if (p.lse && c == 0) p.lse[head] = seen ? (m_all + log2f(l_all)) * kLn2 : -INFINITY;
        }
        cluster.sync();  // nobody exits while another CTA may still read its shared memory
        return;
    }
#endif

    // Normalise within the range and write the partial (natural-log lse).
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t r = my_row0 + 16 * mt + 8 * h;
            if (r >= p.n_rows) continue;
            const uint32_t t = r / G, g = r % G;
            const size_t head = (size_t)t * p.n_head + kv_head * G + g;
            const bool seen = sum[mt][h] > 0.0f;
            const float inv = seen ? 1.0f / sum[mt][h] : 0.0f;
            float* dst = p.out + head * D;
#pragma unroll
            for (int j = 0; j < 2 * kSlabs; ++j)
                *reinterpret_cast<float2*>(dst + 8 * j + 2 * tq) =
                    make_float2(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
            if (p.lse && tq == 0) p.lse[head] = seen ? (m[mt][h] + log2f(sum[mt][h])) * kLn2 : -INFINITY;
        }
}

// What the launcher needs to know of the current device.
struct DeviceLimits {
    int cc_major = 0, sm_count = 0, smem_optin = 0;  // smem_optin: bytes one block may opt in to
};
DeviceLimits current_device_limits() {
    DeviceLimits d;
    int dev = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return d;
}

template <int D, KvType KT, KvType VT, int kWarps>
bool launch_warps(Params p, uint32_t n_head_kv, uint32_t split, cudaStream_t stream) {
    using L = M32Layout<D, KT, VT, kWarps>;
    // The merge of a split reuses the tiles' shared memory for (O, m, l) of every row.
    constexpr uint32_t smem = std::max<uint32_t>(L::total, L::kRows * (D + 2) * 4);
    const DeviceLimits device = current_device_limits();
    if ((int)smem > device.smem_optin) return false;  // e.g. 99 KB on sm_86 / sm_89
    auto* kernel = prefill_attention_m32_kernel<D, KT, VT, kWarps>;
    static int blocks_per_sm = 0;  // once per instance: opt in to > 48 KB of shared memory
    if (blocks_per_sm == 0) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kWarps * 32, smem));
        blocks_per_sm = std::max(1, blocks_per_sm);
    }
    p.n_row_blocks = (p.n_rows + L::kRows - 1) / L::kRows;
    if (device.cc_major >= 9 && split != 1) {  // thread-block clusters
        if (split > 1) {
            p.n_split = std::min(split, 8u);  // the portable cluster size limit
        } else {
            // Tiles of the first and of the last row block (the shortest and the longest).
            auto tiles_below = [&](uint32_t stop) -> uint64_t {
                const uint32_t end = std::min(p.cell_end, stop);
                return end > p.cell_begin ? (end - p.cell_begin + kCells - 1) / kCells : 0;
            };
            p.n_split = prefill_attention_split_for((uint64_t)p.n_row_blocks * n_head_kv,
                                                    (uint64_t)device.sm_count * blocks_per_sm, tiles_below(p.pos0 + 1),
                                                    tiles_below(p.pos0 + p.n_tokens));
        }
    }
    const dim3 grid(p.n_row_blocks * p.n_split, n_head_kv);
    if (p.n_split == 1) {
        kernel<<<grid, kWarps * 32, smem, stream>>>(p);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        return true;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(kWarps * 32);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = p.n_split;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    SPILLWAY_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
    return true;
}

template <int D, KvType KT, KvType VT>
bool launch(const Params& p, uint32_t n_head_kv, bool wide, uint32_t split, cudaStream_t stream) {
    return wide ? launch_warps<D, KT, VT, 8>(p, n_head_kv, split, stream)
                : launch_warps<D, KT, VT, 4>(p, n_head_kv, split, stream);
}

template <int D, KvType KT>
bool dispatch_v(KvType v_type, const Params& p, uint32_t n_head_kv, bool wide, uint32_t split, cudaStream_t stream) {
    switch (v_type) {
        case KvType::f16: return launch<D, KT, KvType::f16>(p, n_head_kv, wide, split, stream);
        case KvType::q8_0: return launch<D, KT, KvType::q8_0>(p, n_head_kv, wide, split, stream);
        case KvType::q4_0: return launch<D, KT, KvType::q4_0>(p, n_head_kv, wide, split, stream);
    }
    fail("prefill attention: unknown V type");
}

template <int D>
bool dispatch_k(KvType k_type, KvType v_type, const Params& p, uint32_t n_head_kv, bool wide, uint32_t split,
                cudaStream_t stream) {
    switch (k_type) {
        case KvType::f16: return dispatch_v<D, KvType::f16>(v_type, p, n_head_kv, wide, split, stream);
        case KvType::q8_0: return dispatch_v<D, KvType::q8_0>(v_type, p, n_head_kv, wide, split, stream);
        case KvType::q4_0: return dispatch_v<D, KvType::q4_0>(v_type, p, n_head_kv, wide, split, stream);
    }
    fail("prefill attention: unknown K type");
}

}  // namespace

uint32_t prefill_attention_split_for(uint64_t blocks, uint64_t slots, uint64_t min_tiles, uint64_t max_tiles) {
    if (blocks == 0 || slots == 0) return 1;
    // Row blocks of very different lengths (a shallow chunk) already fill the last wave with
    // the short ones, which start last.
    if (4 * min_tiles < 3 * max_tiles) return 1;
    // Fraction of the launched waves' slots that hold work (the blocks are about equally long).
    auto filled = [&](uint64_t n) {
        const uint64_t items = blocks * n, waves = (items + slots - 1) / slots;
        return (double)items / (double)(waves * slots);
    };
    // A larger split must fill the waves 5% better and keep >= 32 tiles per CTA: each CTA
    // stages Q and fills its pipeline once, and the merge reads every rank's rows (run P-2:
    // 8-16 tiles per CTA lost 16% at 8k / 512, ~260 per CTA gained 8% at 64k / 2048).
    uint32_t best = 1;
    for (uint32_t n : {2u, 4u, 8u})
        if (min_tiles >= 32ull * n && filled(n) > 1.05 * filled(best)) best = n;
    return best;
}

bool prefill_attention_m32_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                uint32_t pos0, uint32_t n_tokens, float* out, float* lse, bool wide, uint32_t split,
                                cudaStream_t stream) {
    if (n_tokens == 0) return true;
    const Params p =
        make_params(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0, n_tokens, out, lse);
    if (shape.head_dim_k == 64) return dispatch_k<64>(k_type, v_type, p, shape.n_head_kv, wide, split, stream);
    return dispatch_k<128>(k_type, v_type, p, shape.n_head_kv, wide, split, stream);
}

}  // namespace spillway
