#pragma once
// Device helpers shared by the tensor-core prefill attention kernels (prefill_attention_mma.cu,
// prefill_attention_m32.cu; prefill_attention_wgmma.cu uses Params, the span and the small
// helpers with tiles of its own size): the mma.sync / ldmatrix wrappers, base-2 exponentials, and the
// staging of one 64-cell tile of K or V in shared memory (f16 rows padded to D + 8 halves;
// q8_0 / q4_0 copied raw, then dequantized to f16 by integer tricks). Internal to engine/cuda.
#include <cuda_fp16.h>

#include <cstdint>

#include "engine/cpu/attention.h"
#include "engine/cuda/kv_tile.cuh"

namespace spillway::prefill_mma {

constexpr int kCells = 64;  // cells per K/V tile
constexpr float kLn2 = 0.6931471805599453f;

// One launch's arguments (the contract of prefill_attention_partial_cuda, shapes checked there).
struct Params {
    const float* q;
    const uint8_t* k;  // cell cell_begin, all KV heads
    const uint8_t* v;
    uint64_t k_row, v_row;  // bytes per cell (all KV heads)
    uint32_t n_head, n_group, n_tokens, n_rows, n_row_blocks;  // n_row_blocks: set by the launcher
    uint32_t pos0, cell_begin, cell_end;
    uint32_t n_split;  // CTAs (one thread-block cluster) sharing a row block's cells; set by the launcher
    uint32_t heads_fastest;  // (ws kernel) blockIdx.x is the KV head, blockIdx.y the row block; set by the launcher
    float q_scale;     // scale * log2(e): scores come out in base 2
    float* out;
    float* lse;
    __half* out_f16;  // where set (the wgmma kernels only): the output as f16 instead of `out`
};

inline Params make_params(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                          KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells, uint32_t pos0,
                          uint32_t n_tokens, float* out, float* lse) {
    Params p{};
    p.q = q;
    p.k = k_cells;
    p.v = v_cells;
    p.k_row = kv_row_bytes(k_type, (uint64_t)shape.n_head_kv * shape.head_dim_k);
    p.v_row = kv_row_bytes(v_type, (uint64_t)shape.n_head_kv * shape.head_dim_k);
    p.n_head = shape.n_head;
    p.n_group = shape.n_head / shape.n_head_kv;
    p.n_tokens = n_tokens;
    p.n_rows = n_tokens * p.n_group;
    p.pos0 = pos0;
    p.cell_begin = cell_begin;
    p.cell_end = cell_begin + n_cells;
    p.n_split = 1;
    p.q_scale = shape.scale * 1.4426950408889634f;
    p.out = out;
    p.lse = lse;
    return p;
}

// Halves per f16 row in shared memory: 8 ldmatrix rows hit 8 different bank groups.
template <int D>
__host__ __device__ constexpr int row_halves() {
    return D + 8;
}

// `n` = how many cp.async groups may still be in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// c += a (16x16, row) * b (16x8, col), f16 in, f32 accumulate.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the MUFU unit without the range fix-ups of exp2f (2^-inf = +0, which the masking uses).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// What one block of kRows query rows (row = token * G + query head of the group) reads: its
// first row, and the cells up to its last token's position; cells below `full_end` are seen
// by every row, so tiles before it need no mask.
struct RowBlockSpan {
    uint32_t row0, cell_stop, full_end, n_tiles;  // n_tiles: of kCells (64) cells
};
template <int kRows>
__device__ __forceinline__ RowBlockSpan row_block_span(const Params& p, uint32_t row_block) {
    RowBlockSpan r;
    r.row0 = row_block * kRows;
    const uint32_t t_min = r.row0 / p.n_group;
    const uint32_t t_max = min(p.n_tokens - 1, (r.row0 + kRows - 1) / p.n_group);
    r.cell_stop = min(p.cell_end, p.pos0 + t_max + 1);
    r.full_end = min(p.cell_end, p.pos0 + t_min + 1);
    r.n_tiles = r.cell_stop > p.cell_begin ? (r.cell_stop - p.cell_begin + kCells - 1) / kCells : 0;
    return r;
}

// Dims 8 j .. 8 j + 7 of Q's row `row` (row = token * G + query head of the group, one KV head)
// as f16 scaled by q_scale; zeros for rows past the chunk.
template <int D>
__device__ __forceinline__ uint4 q_chunk_f16(const Params& p, uint32_t row, uint32_t kv_head, uint32_t j) {
    if (row >= p.n_rows) return make_uint4(0, 0, 0, 0);
    const uint32_t G = p.n_group;
    const uint32_t t = row / G, g = row % G;
    const float2* src = reinterpret_cast<const float2*>(p.q + ((size_t)t * p.n_head + kv_head * G + g) * D + 8 * j);
    const float2 a = src[0], b = src[1], c = src[2], d = src[3];
    const float s = p.q_scale;
    return make_uint4(pack_half2(a.x * s, a.y * s), pack_half2(b.x * s, b.y * s), pack_half2(c.x * s, c.y * s),
                      pack_half2(d.x * s, d.y * s));
}

// Q of a block's kRows rows (from row0, one KV head) as f16 scaled by q_scale, rows `ld`
// halves apart; rows past the chunk are zeros.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void stage_q_f16(const Params& p, uint32_t row0, uint32_t kv_head, __half* sq, int ld) {
    for (uint32_t i = threadIdx.x; i < kRows * (D / 8); i += kThreads) {
        const uint32_t r = i / (D / 8), j = i % (D / 8);
        *reinterpret_cast<uint4*>(sq + r * ld + 8 * j) = q_chunk_f16<D>(p, row0 + r, kv_head, j);
    }
}

// Issues the copies of cells [c0, c0 + count) of one operand into its stage; cells of the
// tile past `count` are zeroed (f16 directly; quantized ones when dequantized), so that a
// masked score (p = 0) never meets a NaN in V.
template <int D, KvType T, int kThreads>
__device__ __forceinline__ void issue_operand(uint8_t* stage, const uint8_t* src, uint64_t row_bytes, uint32_t count) {
    constexpr uint32_t slice = kv_tile::slice_bytes(T, D);
    if constexpr (T == KvType::f16) {
        constexpr int kLd = row_halves<D>();
        constexpr uint32_t chunks = D / 8;  // 16 bytes each
        for (uint32_t i = threadIdx.x; i < kCells * chunks; i += kThreads) {
            const uint32_t c = i / chunks, o = i % chunks;
            uint8_t* dst = stage + (c * kLd + o * 8) * 2;
            if (c < count) kv_tile::cp_async<16>(dst, src + c * row_bytes + o * 16);
            else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
        }
    } else {
        constexpr uint32_t ck = kv_tile::copy_chunk(slice), chunks = slice / ck;
        for (uint32_t i = threadIdx.x; i < count * chunks; i += kThreads) {
            const uint32_t c = i / chunks, o = i % chunks * ck;
            kv_tile::cp_async<ck>(stage + c * slice + o, src + c * row_bytes + o);
        }
    }
}

template <int D, KvType T, int kThreads>
__device__ __forceinline__ void dequant_operand(const uint8_t* raw, __half* tile, uint32_t count) {
    constexpr int kLd = row_halves<D>();
    constexpr uint32_t slice = kv_tile::slice_bytes(T, D);
    for (uint32_t i = threadIdx.x; i < kCells * (D / 8); i += kThreads) {
        const uint32_t c = i / (D / 8), j = i % (D / 8);
        const uint4 v = c < count ? kv_tile::dequant8_quantized<T>(raw + c * slice, (int)j) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(tile + c * kLd + 8 * j) = v;
    }
}

}  // namespace spillway::prefill_mma
