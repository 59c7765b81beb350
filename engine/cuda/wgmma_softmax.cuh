#pragma once
// The online softmax of the wgmma prefill attention kernels (prefill_attention_wgmma.cu,
// prefill_attention_ws.cu), per thread of a warpgroup that holds 64 query rows: a thread owns
// two rows (its quad's row and the row 8 below) and a quarter of each row's scores, in the
// accumulator layout of wgmma (score j of a tile: s[j / 8][2 h + i] for row h, cell 8 (j / 8)
// + 2 tq + i). Scores are in base 2 (Q was scaled by scale * log2 e). Internal to engine/cuda.
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/cuda/prefill_mma_device.cuh"

namespace spillway::wgmma_softmax {

using prefill_mma::fast_exp2;
using prefill_mma::pack_half2;

// One thread's two rows: running maximum (base 2) and this thread's part of the running sum.
struct RowState {
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
};

// Scores of a finished S (kTile cells from c0) -> probabilities in place; the running max and
// sum move on. alpha: the factor O must take; grew: whether any row of this thread got a new
// maximum. row0: this thread's first row (the second is row0 + 8); limit of a row: the first
// cell it does not see (range end, causality); tiles wholly below full_end skip the mask.
template <int kTile>
__device__ __forceinline__ void softmax_tile(float (&s)[kTile / 8][4], RowState& st, const prefill_mma::Params& p,
                                             uint32_t c0, uint32_t full_end, uint32_t row0, uint32_t tq,
                                             float (&alpha)[2], bool& grew) {
    if (c0 + kTile > full_end) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t limit = min(p.cell_end, p.pos0 + (row0 + 8 * h) / p.n_group + 1);
#pragma unroll
            for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    if (c0 + 8 * j + 2 * tq + i >= limit) s[j][2 * h + i] = -INFINITY;
        }
    }
    // A row's kTile scores are spread over the 4 threads of a quad. Max and sum run as 4
    // independent chains: with 2 warps per scheduler, one dependent chain of 16 steps is
    // latency the other warp cannot cover.
    grew = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx4[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) mx4[j] = fmaxf(s[j][2 * h], s[j][2 * h + 1]);
#pragma unroll
        for (int j = 4; j < kTile / 8; ++j) mx4[j % 4] = fmaxf(mx4[j % 4], fmaxf(s[j][2 * h], s[j][2 * h + 1]));
        float mx = fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(st.m[h], mx);
        grew |= m_new > st.m[h];
        const float ref = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep 0s, no NaN
        alpha[h] = fast_exp2(st.m[h] - ref);
        st.m[h] = m_new;
        float sum4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < kTile / 8; ++j) {
            s[j][2 * h] = fast_exp2(s[j][2 * h] - ref);
            s[j][2 * h + 1] = fast_exp2(s[j][2 * h + 1] - ref);
            sum4[j % 4] += s[j][2 * h] + s[j][2 * h + 1];
        }
        st.l[h] = st.l[h] * alpha[h] + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));
    }
}

// alpha is exactly 1 for a row whose maximum did not grow: skip the pass over O when that
// holds for every row of the warp (most tiles, deep in a long prompt).
template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 8][4], const float (&alpha)[2], bool grew) {
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }
    }
}

// Probabilities -> the f16 A fragments of O += P V (the accumulator layout of S is the
// A-register layout of the next wgmma).
template <int kTile>
__device__ __forceinline__ void pack_p(const float (&s)[kTile / 8][4], uint32_t (&pa)[kTile / 16][4]) {
#pragma unroll
    for (int cs = 0; cs < kTile / 16; ++cs) {
        pa[cs][0] = pack_half2(s[2 * cs][0], s[2 * cs][1]);
        pa[cs][1] = pack_half2(s[2 * cs][2], s[2 * cs][3]);
        pa[cs][2] = pack_half2(s[2 * cs + 1][0], s[2 * cs + 1][1]);
        pa[cs][3] = pack_half2(s[2 * cs + 1][2], s[2 * cs + 1][3]);
    }
}

// Normalises the thread's two rows within the range and writes the partial (natural-log lse;
// rows that saw nothing: out 0, lse -inf): to p.out_f16 as f16 where that is set (the next
// GEMM's input, rounded as the f32 -> f16 conversion would round it), else to p.out.
template <int kD>
__device__ __forceinline__ void store_rows(const float (&o)[kD / 8][4], const RowState& st, const prefill_mma::Params& p,
                                           uint32_t kv_head, uint32_t row0, uint32_t tq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = st.l[h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const uint32_t r = row0 + 8 * h;
        if (r >= p.n_rows) continue;
        const uint32_t t = r / p.n_group, g = r % p.n_group;
        const size_t head = (size_t)t * p.n_head + kv_head * p.n_group + g;
        const bool seen = sum > 0.0f;
        const float inv = seen ? 1.0f / sum : 0.0f;
        if (p.out_f16 != nullptr) {
            __half* dst = p.out_f16 + head * kD;
#pragma unroll
            for (int j = 0; j < kD / 8; ++j)
                *reinterpret_cast<__half2*>(dst + 8 * j + 2 * tq) = __floats2half2_rn(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
        } else {
            float* dst = p.out + head * kD;
#pragma unroll
            for (int j = 0; j < kD / 8; ++j)
                *reinterpret_cast<float2*>(dst + 8 * j + 2 * tq) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
        }
        if (p.lse && tq == 0) p.lse[head] = seen ? (st.m[h] + log2f(sum)) * prefill_mma::kLn2 : -INFINITY;
    }
}

}  // namespace spillway::wgmma_softmax
