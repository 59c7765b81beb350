// Causal prefill attention on tensor cores, flash-attention style.
//
// Why: a prefill chunk of T tokens over n cells costs 4*T*n*D flops per query head (QK and
// PV); at 64k tokens of the Qwen2.5-14B shape that is ~2.1 PFLOP for the whole prompt, which
// CUDA cores (67 TFLOP/s) need over 30 s for. mma.sync f16 x f16 -> f32 runs it at a few
// hundred TFLOP/s. Memory is secondary: every K/V tile is reused by a block of 64 query rows.
//
// Rows: with GQA the G query heads of a KV head share its K/V, so a block's rows are the
// flattened (token, head-in-group) pairs r = t*G + g of one KV head, 16 per warp: 4 warps
// (64 rows, e.g. 12.8 tokens for G = 5; 3 blocks per SM) or 8 warps (128 rows, 1 block per
// SM: half the K/V tile traffic and tile dequantization per row; measured faster, the default).
// Each row keeps its own causal limit (cell <= pos0 + r/G).
// Per tile of 64 cells: cp.async the raw K/V slices (f16 straight into padded f16 rows;
// q8_0/q4_0 into a raw stage, then dequantized to f16 by integer tricks), S = Q Kᵀ with
// Q in registers (pre-scaled by scale*log2e, so scores are base-2), online softmax on the S
// accumulators in registers, P reused in registers as the A operand of O += P V (the
// accumulator layout of two 8-cell tiles is the A layout of one 16-cell slab).
// The next tile's copy is in flight while the current one is computed.
#include "engine/cuda/prefill_attention_mma.cuh"

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

template <int D, KvType KT, KvType VT>
struct Layout {
    static constexpr int kLd = D + 8;  // halves per f16 row: 8 ldmatrix rows hit 8 different bank groups
    static constexpr uint32_t kTileBytes = kCells * kLd * 2;
    static constexpr uint32_t kSliceK = slice_bytes(KT, D), kSliceV = slice_bytes(VT, D);
    static constexpr bool kDirectK = KT == KvType::f16, kDirectV = VT == KvType::f16;
    static constexpr uint32_t kRawK = align128(kCells * kSliceK), kRawV = align128(kCells * kSliceV);
    // K: [f16 stage 0][f16 stage 1] or [f16 tile][raw 0][raw 1]; V likewise after K.
    static constexpr uint32_t k_bytes = kDirectK ? 2 * kTileBytes : kTileBytes + 2 * kRawK;
    static constexpr uint32_t v_bytes = kDirectV ? 2 * kTileBytes : kTileBytes + 2 * kRawV;
    static constexpr uint32_t k_base = 0, v_base = k_bytes;
    static constexpr uint32_t total = k_bytes + v_bytes;
};

using MmaParams = prefill_mma::Params;

// 4 warps: 3 blocks per SM (12 warps; ~70 KB of shared memory each, registers capped at
// 168); 8 warps: one block (209 registers).
template <int D, KvType KT, KvType VT, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, kWarps == 4 ? 3 : 1) prefill_attention_mma_kernel(MmaParams p) {
    using L = Layout<D, KT, VT>;
    constexpr int kThreads = kWarps * 32;
    constexpr int kRows = kWarps * 16;  // query rows per block
    constexpr int kLd = L::kLd;
    constexpr int kSlabs = D / 16;  // k-steps of QK, and 16-dim column pairs of PV
    extern __shared__ __align__(128) uint8_t smem[];

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t gq = lane / 4, tq = lane % 4;  // mma fragment coordinates
    const uint32_t kv_head = blockIdx.y;
    const uint32_t row_block = p.n_row_blocks - 1 - blockIdx.x;  // the longest rows start first
    const uint32_t G = p.n_group;
    const RowBlockSpan span = row_block_span<kRows>(p, row_block);
    const uint32_t row0 = span.row0, cell_stop = span.cell_stop, full_end = span.full_end, n_tiles = span.n_tiles;

    // This thread's two rows (gq and gq + 8 of the warp's 16) and their causal limits.
    uint32_t row[2], limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        row[h] = row0 + warp * 16 + gq + 8 * h;
        limit[h] = min(p.cell_end, p.pos0 + row[h] / G + 1);  // cells < limit are visible
    }

    // Q fragments: a0 (row gq, dims 2tq..), a1 (row gq+8), a2 (row gq, dims 2tq+8..), a3.
    uint32_t qa[kSlabs][4];
    {
        const float* qrow[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t t = row[h] / G, g = row[h] % G;
            qrow[h] = row[h] < p.n_rows ? p.q + ((size_t)t * p.n_head + kv_head * G + g) * D : nullptr;
        }
#pragma unroll
        for (int s = 0; s < kSlabs; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float* r = qrow[i % 2];
                const uint32_t d = 16 * s + 2 * tq + 8 * (i / 2);
                float2 x = r ? *reinterpret_cast<const float2*>(r + d) : make_float2(0.0f, 0.0f);
                qa[s][i] = pack_half2(x.x * p.q_scale, x.y * p.q_scale);
            }
    }

    float o[2 * kSlabs][4];
#pragma unroll
    for (int j = 0; j < 2 * kSlabs; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[j][i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const uint8_t* k_src = p.k + (size_t)kv_head * L::kSliceK;
    const uint8_t* v_src = p.v + (size_t)kv_head * L::kSliceV;
    auto k_stage = [&](uint32_t tile) {
        return smem + L::k_base + (L::kDirectK ? (tile % 2) * L::kTileBytes : L::kTileBytes + (tile % 2) * L::kRawK);
    };
    auto v_stage = [&](uint32_t tile) {
        return smem + L::v_base + (L::kDirectV ? (tile % 2) * L::kTileBytes : L::kTileBytes + (tile % 2) * L::kRawV);
    };
    auto issue = [&](uint32_t tile) {
        const uint32_t first = tile * kCells;  // relative to cell_begin
        const uint32_t count = min((uint32_t)kCells, cell_stop - p.cell_begin - first);
        issue_operand<D, KT, kThreads>(k_stage(tile), k_src + first * p.k_row, p.k_row, count);
        issue_operand<D, VT, kThreads>(v_stage(tile), v_src + first * p.v_row, p.v_row, count);
        cp_async_commit();
    };

    if (n_tiles > 0) issue(0);
    for (uint32_t tile = 0; tile < n_tiles; ++tile) {
        cp_async_wait<0>();
        __syncthreads();  // tile landed for every thread; the previous tile is fully consumed
        if (tile + 1 < n_tiles) issue(tile + 1);
        const uint32_t c0 = p.cell_begin + tile * kCells;
        const uint32_t count = min((uint32_t)kCells, cell_stop - c0);
        const __half* kt = reinterpret_cast<const __half*>(L::kDirectK ? k_stage(tile) : smem + L::k_base);
        const __half* vt = reinterpret_cast<const __half*>(L::kDirectV ? v_stage(tile) : smem + L::v_base);
        if constexpr (!L::kDirectK || !L::kDirectV) {
            if constexpr (!L::kDirectK) dequant_operand<D, KT, kThreads>(k_stage(tile), const_cast<__half*>(kt), count);
            if constexpr (!L::kDirectV) dequant_operand<D, VT, kThreads>(v_stage(tile), const_cast<__half*>(vt), count);
            __syncthreads();
        }

        // S = Q Kᵀ: 8 accumulators of 8 cells. ldmatrix x4 gives the B fragments of two cell
        // groups: matrices (cells +0, dims +0), (+0, +8), (+8, +0), (+8, +8).
        float s[kCells / 8][4];
#pragma unroll
        for (int j = 0; j < kCells / 8; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[j][i] = 0.0f;
        {
            const uint32_t mi = lane / 8;
            const __half* base = kt + ((mi / 2) * 8 + lane % 8) * kLd + (mi % 2) * 8;
#pragma unroll
            for (int ks = 0; ks < kSlabs; ++ks)
#pragma unroll
                for (int np = 0; np < kCells / 16; ++np) {
                    uint32_t b[4];
                    ldmatrix_x4(b, base + np * 16 * kLd + ks * 16);
                    mma_16816(s[2 * np], qa[ks], b[0], b[1]);
                    mma_16816(s[2 * np + 1], qa[ks], b[2], b[3]);
                }
        }

        // Mask (range end and causality), only on tiles that reach past what all rows see.
        if (c0 + kCells > full_end) {
#pragma unroll
            for (int j = 0; j < kCells / 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t cell = c0 + 8 * j + 2 * tq + (i % 2);
                    if (cell >= limit[i / 2]) s[j][i] = -INFINITY;
                }
        }

        // Online softmax per row; a row's 64 scores are spread over the 4 threads of a quad.
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < kCells / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[h], mx);
            const float ref = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep 0s, no NaN
            alpha[h] = fast_exp2(m[h] - ref);
            m[h] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < kCells / 8; ++j) {
                s[j][2 * h] = fast_exp2(s[j][2 * h] - ref);
                s[j][2 * h + 1] = fast_exp2(s[j][2 * h + 1] - ref);
                sum += s[j][2 * h] + s[j][2 * h + 1];
            }
            l[h] = l[h] * alpha[h] + sum;  // this thread's part; the quad is summed at the end
        }
#pragma unroll
        for (int j = 0; j < 2 * kSlabs; ++j) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }

        // O += P V over 4 slabs of 16 cells. ldmatrix x4 trans gives the B fragments of two
        // 8-dim groups: matrices (cells +0, dims +0), (+8, +0), (+0, +8), (+8, +8).
        {
            const uint32_t mi = lane / 8;
            const __half* base = vt + ((mi % 2) * 8 + lane % 8) * kLd + (mi / 2) * 8;
#pragma unroll
            for (int cs = 0; cs < kCells / 16; ++cs) {
                const uint32_t pa[4] = {pack_half2(s[2 * cs][0], s[2 * cs][1]), pack_half2(s[2 * cs][2], s[2 * cs][3]),
                                        pack_half2(s[2 * cs + 1][0], s[2 * cs + 1][1]),
                                        pack_half2(s[2 * cs + 1][2], s[2 * cs + 1][3])};
#pragma unroll
                for (int dp = 0; dp < kSlabs; ++dp) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, base + cs * 16 * kLd + dp * 16);
                    mma_16816(o[2 * dp], pa, b[0], b[1]);
                    mma_16816(o[2 * dp + 1], pa, b[2], b[3]);
                }
            }
        }
    }

    // Normalise within the range and write the partial (natural-log lse).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = l[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (row[h] >= p.n_rows) continue;
        const uint32_t t = row[h] / G, g = row[h] % G;
        const size_t head = (size_t)t * p.n_head + kv_head * G + g;
        const bool seen = sum > 0.0f;
        const float inv = seen ? 1.0f / sum : 0.0f;
        float* dst = p.out + head * D;
#pragma unroll
        for (int j = 0; j < 2 * kSlabs; ++j)
            *reinterpret_cast<float2*>(dst + 8 * j + 2 * tq) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
        if (p.lse && tq == 0) p.lse[head] = seen ? (m[h] + log2f(sum)) * kLn2 : -INFINITY;
    }
}

template <int D, KvType KT, KvType VT, int kWarps>
void launch_warps(MmaParams p, uint32_t n_head_kv, cudaStream_t stream) {
    constexpr uint32_t smem = Layout<D, KT, VT>::total;
    static bool configured = false;  // once per instance: opt in to > 48 KB of shared memory
    if (!configured) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(prefill_attention_mma_kernel<D, KT, VT, kWarps>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    p.n_row_blocks = (p.n_rows + kWarps * 16 - 1) / (kWarps * 16);
    const dim3 grid(p.n_row_blocks, n_head_kv);
    prefill_attention_mma_kernel<D, KT, VT, kWarps><<<grid, kWarps * 32, smem, stream>>>(p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

template <int D, KvType KT, KvType VT>
void launch(const MmaParams& p, uint32_t n_head_kv, bool wide, cudaStream_t stream) {
    if (wide) launch_warps<D, KT, VT, 8>(p, n_head_kv, stream);
    else launch_warps<D, KT, VT, 4>(p, n_head_kv, stream);
}

template <int D, KvType KT>
void dispatch_v(KvType v_type, const MmaParams& p, uint32_t n_head_kv, bool wide, cudaStream_t stream) {
    switch (v_type) {
        case KvType::f16: return launch<D, KT, KvType::f16>(p, n_head_kv, wide, stream);
        case KvType::q8_0: return launch<D, KT, KvType::q8_0>(p, n_head_kv, wide, stream);
        case KvType::q4_0: return launch<D, KT, KvType::q4_0>(p, n_head_kv, wide, stream);
    }
    fail("prefill attention: unknown V type");
}

template <int D>
void dispatch_k(KvType k_type, KvType v_type, const MmaParams& p, uint32_t n_head_kv, bool wide,
                cudaStream_t stream) {
    switch (k_type) {
        case KvType::f16: return dispatch_v<D, KvType::f16>(v_type, p, n_head_kv, wide, stream);
        case KvType::q8_0: return dispatch_v<D, KvType::q8_0>(v_type, p, n_head_kv, wide, stream);
        case KvType::q4_0: return dispatch_v<D, KvType::q4_0>(v_type, p, n_head_kv, wide, stream);
    }
    fail("prefill attention: unknown K type");
}

}  // namespace

void prefill_attention_mma_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                uint32_t pos0, uint32_t n_tokens, float* out, float* lse, bool wide,
                                cudaStream_t stream) {
    if (n_tokens == 0) return;
    const uint32_t D = shape.head_dim_k;
    const MmaParams p = prefill_mma::make_params(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0,
                                                  n_tokens, out, lse);
    if (D == 64) dispatch_k<64>(k_type, v_type, p, shape.n_head_kv, wide, stream);
    else dispatch_k<128>(k_type, v_type, p, shape.n_head_kv, wide, stream);
}

}  // namespace spillway
