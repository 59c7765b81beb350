// Causal prefill attention on Hopper's warpgroup MMA (wgmma.mma_async), head dim 128, any K/V
// tiers (q8_0 / q4_0 tiles are copied raw and dequantized to f16 in shared memory).
//
// Why: the mma.sync kernels (prefill_attention_m32.cu) reach ~300 TFLOP/s at 64k; mma.sync
// on sm_90 issues at about half of the tensor cores' dense rate, and every K/V fragment passes
// through registers via ldmatrix. wgmma reads B (K, then V) straight from shared memory and
// runs 64 x N x 16 per instruction for a whole warpgroup.
// Shape: a block holds 2 warpgroups of 64 query rows (rows = flattened (token, query head
// of the GQA group) pairs of one KV head, as in the mma.sync kernels); tiles of 128 cells (64
// in the lab schedules), K in two and V in three stages of cp.async copies into 128-byte-
// swizzled shared memory (wgmma_device.cuh), one block barrier per tile (two for quantized
// tiers: raw tiles are dequantized into f16 tiles in between). Per tile and
// warpgroup: S = Q Kᵀ as 8 m64n128k16 with Q in registers (loaded once per block), the
// online softmax on S in registers (scores in base 2, Q pre-scaled by scale * log2 e), then
// O += P V as 8 m64n128k16 with P (f16) in registers: the accumulator layout of S is the
// A-register layout of the next wgmma, as with mma.sync. The two warpgroups are skewed by half
// a tile (Schedule below) so that one's softmax runs beside the other's MMAs.
// Measured (bench_prefill, 64k prompt / 2048-token chunks): m32 310 TFLOP/s; first wgmma
// version 345; the skew, the copies' addresses computed once, four max / sum chains and the
// skipped O rescale 413; 128-cell tiles 473 (Nsight on the 64-cell version: tensor pipe 47%
// busy; stalls on fixed-latency dependencies and the per-tile barrier lead).
// Warp specialization with TMA and mbarriers instead of the block barrier is
// prefill_attention_ws.cu (609 TFLOP/s, session 42): the default for f16 K and V since then;
// this kernel runs quantized tiles read directly and the lab schedules. Not tried: the cluster
// split.
#include "engine/cuda/prefill_attention_wgmma.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/hopper_support.cuh"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/prefill_attention_ws.cuh"
#include "engine/cuda/prefill_mma_device.cuh"
#include "engine/cuda/wgmma_device.cuh"
#include "engine/cuda/wgmma_softmax.cuh"

namespace spillway {
namespace {

using kv_tile::cp_async_commit;
using namespace prefill_mma;

constexpr int kD = 128;
constexpr int kLdQ = row_halves<kD>();  // Q staging rows, padded for ldmatrix

// Set where the kernel below is compiled for sm_90a (read by the host once).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ const int kWgmmaCompiled = 1;
#else
__device__ const int kWgmmaCompiled = 0;
#endif

// Two warpgroups: 128 rows per block, 256 threads of <= 255 registers, one block per SM. (Three
// warpgroups leave 168 registers per thread: ptxas then serializes the wgmmas; measured slower.)
constexpr int kThreads = 256;
constexpr int kRows = 128;
// The tile copy: each thread moves one 16-byte chunk (of 16 per 256-byte row) of every 16th cell.
constexpr uint32_t kCellsPerPass = kThreads / 16;

constexpr uint32_t align1024(uint32_t n) { return (n + 1023) / 1024 * 1024; }

// One operand (K or V) of type T in tiles of kTile cells. f16 is copied straight into its
// swizzled tiles, in kStages stages; q8_0 / q4_0 are copied raw (two stages) and dequantized
// into kStages - 1 swizzled f16 tiles once landed. K needs 2 stages, V 3: a deferring warpgroup
// (below) still reads V of tile j - 1 while tile j + 1 lands.
template <KvType T, int kTile, int kStages>
struct OperandLayout {
    static constexpr bool kDirect = T == KvType::f16;
    static constexpr uint32_t kHalfBytes = kTile * 128;  // kTile cells x 64 dims of f16, one swizzled tile
    static constexpr uint32_t kTileBytes = 2 * kHalfBytes;
    static constexpr uint32_t kSlice = kv_tile::slice_bytes(T, kD);  // bytes of one cell's head
    static constexpr uint32_t kF16Tiles = kDirect ? kStages : kStages - 1;
    static constexpr uint32_t kRawBase = kF16Tiles * kTileBytes, kRawBytes = align1024(kTile * kSlice);
    static constexpr uint32_t kBytes = kRawBase + (kDirect ? 0 : 2 * kRawBytes);
    static constexpr __device__ uint32_t f16_tile(uint32_t tile) { return (tile % kF16Tiles) * kTileBytes; }
    static constexpr __device__ uint32_t raw(uint32_t tile) { return kRawBase + (tile % 2) * kRawBytes; }
};

// Shared memory: K, V, then Q's staging; every region 1024-byte aligned.
template <int kTile, KvType KT, KvType VT>
struct Tiling {
    using K = OperandLayout<KT, kTile, 2>;
    using V = OperandLayout<VT, kTile, 3>;
    static constexpr uint32_t kVBase = K::kBytes, kQBase = kVBase + V::kBytes;  // K at 0
    static constexpr uint32_t kSmemBytes = kQBase + kRows * kLdQ * 2 + 1024;  // + the base's alignment
    static_assert(kTile % kCellsPerPass == 0 && kSmemBytes <= 227 * 1024, "whole copy passes; one block per SM");
};

// The skew: the odd warpgroup runs O += P V of tile j at the start of tile j + 1, next to its
// S of tile j + 1, so that one warpgroup's softmax falls on the other's MMAs (with both in
// step, the per-tile barrier has both multiply, then both exponentiate while the tensor cores
// idle). Sessions 13-14 also measured 64-cell tiles with and without it and a schedule issuing
// S of tile j + 1 before the softmax of tile j (two score sets): 420-431 TFLOP/s against this
// one's 473 (those schedules were removed in session 42).
template <int kTile, KvType KT, KvType VT>
__global__ void __launch_bounds__(kThreads, 1) prefill_attention_wgmma_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = Tiling<kTile, KT, VT>;
    using LK = typename T::K;
    using LV = typename T::V;
    constexpr uint32_t kHalfBytes = LK::kHalfBytes;
    constexpr uint32_t kKBase = 0, kVBase = T::kVBase, kQBase = T::kQBase;
    extern __shared__ uint8_t smem_raw[];
    // The swizzle works on address bits: every tile starts 1024-byte aligned.
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    __half* sq = reinterpret_cast<__half*>(smem + kQBase);

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t gq = lane / 4, tq = lane % 4;
    const uint32_t kv_head = blockIdx.y;
    const uint32_t row_block = p.n_row_blocks - 1 - blockIdx.x;  // the longest rows start first
    const RowBlockSpan span = row_block_span<kRows>(p, row_block);
    const uint32_t row0 = span.row0, cell_stop = span.cell_stop, full_end = span.full_end;
    const uint32_t n_tiles = cell_stop > p.cell_begin ? (cell_stop - p.cell_begin + kTile - 1) / kTile : 0;

    // This thread's chunk: cells my_cell + 16 n of a tile, bytes 16 my_chunk.. of the head's row
    // (the same swizzled column for every n, since 16 n keeps the cell's row within its 8-row group).
    const uint32_t my_chunk = threadIdx.x % 16, my_cell = threadIdx.x / 16;
    const uint32_t my_dst = (my_chunk / 8) * kHalfBytes + wgmma::swizzled_offset(my_cell, my_chunk % 8);
    const uint8_t* k_src = p.k + (size_t)kv_head * kD * 2 + my_cell * p.k_row + my_chunk * 16;
    const uint8_t* v_src = p.v + (size_t)kv_head * kD * 2 + my_cell * p.v_row + my_chunk * 16;
    auto tile_count = [&](uint32_t tile) { return min((uint32_t)kTile, cell_stop - p.cell_begin - tile * kTile); };
    // Cells past the range are zeroed: a masked score (p = 0) never meets a NaN in V.
    auto issue_f16 = [&](uint8_t* stage, const uint8_t* src, uint64_t row_bytes, uint32_t tile) {
        const uint32_t count = tile_count(tile);
        src += (uint64_t)tile * kTile * row_bytes;
        uint8_t* dst = stage + my_dst;
        const uint64_t step = kCellsPerPass * row_bytes;
        if (count == kTile) {
#pragma unroll
            for (uint32_t n = 0; n < kTile / kCellsPerPass; ++n) kv_tile::cp_async<16>(dst + n * kCellsPerPass * 128, src + n * step);
        } else {
#pragma unroll
            for (uint32_t n = 0; n < kTile / kCellsPerPass; ++n) {
                if (my_cell + n * kCellsPerPass < count) kv_tile::cp_async<16>(dst + n * kCellsPerPass * 128, src + n * step);
                else *reinterpret_cast<uint4*>(dst + n * kCellsPerPass * 128) = make_uint4(0, 0, 0, 0);
            }
        }
    };
    // A quantized operand's cells of the tile, raw (issue_operand's quantized path).
    auto issue_raw = [&]<KvType Q>(uint8_t* stage, const uint8_t* head, uint64_t row_bytes, uint32_t tile) {
        issue_operand<kD, Q, kThreads>(stage, head + (uint64_t)tile * kTile * row_bytes, row_bytes, tile_count(tile));
    };
    auto issue_k = [&](uint32_t tile) {
        if constexpr (LK::kDirect) issue_f16(smem + kKBase + LK::f16_tile(tile), k_src, p.k_row, tile);
        else issue_raw.template operator()<KT>(smem + kKBase + LK::raw(tile), p.k + (size_t)kv_head * LK::kSlice, p.k_row, tile);
    };
    auto issue_v = [&](uint32_t tile) {
        if constexpr (LV::kDirect) issue_f16(smem + kVBase + LV::f16_tile(tile), v_src, p.v_row, tile);
        else issue_raw.template operator()<VT>(smem + kVBase + LV::raw(tile), p.v + (size_t)kv_head * LV::kSlice, p.v_row, tile);
    };
    // Landed raw cells -> the operand's f16 tile (cells past the range as zeros).
    auto dequantize = [&]<typename L, KvType Q>(uint8_t* base, uint32_t tile) {
        const uint32_t count = tile_count(tile);
        const uint8_t* raw = base + L::raw(tile);
        uint8_t* f16 = base + L::f16_tile(tile);
        for (uint32_t i = threadIdx.x; i < kTile * 16; i += kThreads) {
            const uint32_t c = i / 16, j = i % 16;
            const uint4 v = c < count ? kv_tile::dequant8_quantized<Q>(raw + c * L::kSlice, (int)j) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(f16 + (j / 8) * kHalfBytes + wgmma::swizzled_offset(c, j % 8)) = v;
        }
    };
    // Makes tile `tile` readable by the wgmmas: dequantizes what is quantized (its raw cells
    // landed and are visible to every thread: the caller's barrier), then fences and syncs.
    auto prepare = [&](uint32_t tile) {
        if constexpr (!LK::kDirect || !LV::kDirect) {
            if constexpr (!LK::kDirect) dequantize.template operator()<LK, KT>(smem + kKBase, tile);
            if constexpr (!LV::kDirect) dequantize.template operator()<LV, VT>(smem + kVBase, tile);
            wgmma::fence_proxy_async_smem();
            __syncthreads();
        }
    };
    if (n_tiles > 0) {
        issue_k(0);
        issue_v(0);
    }
    cp_async_commit();

    // Q of the block's rows as f16 (rows past the chunk are zeros), while tile 0 lands.
    stage_q_f16<kD, kRows, kThreads>(p, row0, kv_head, sq, kLdQ);
    __syncthreads();
    // This warp's 16 rows of Q as the A operand of the 8 k-steps of S (32 registers).
    uint32_t qa[kD / 16][4];
    {
        const __half* q_frag = sq + (warp * 16 + lane % 16) * kLdQ + (lane / 16) * 8;
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) ldmatrix_x4(qa[ks], q_frag + ks * 16);
    }
    const uint32_t my_row0 = row0 + warp * 16 + gq;  // and + 8

    float o[kD / 8][4] = {};
    wgmma_softmax::RowState rows;
    const bool defer = (warp / 4) % 2 == 1;  // uniform per warpgroup
    uint32_t pa[kTile / 16][4];                       // P of the tile (a deferring warpgroup: of the last one)
    // O += P V. V is stored cell-major with dims contiguous: the N-major B operand; its two
    // 64-dim halves are kHalfBytes apart (leading offset), 8-cell groups 1 KB (stride offset).
    // Descriptors are built once and moved by constant offsets (wgmma::desc_advance).
    const uint64_t k_desc = wgmma::smem_desc(smem + kKBase, 16, 1024);
    const uint64_t v_desc = wgmma::smem_desc(smem + kVBase, kHalfBytes, 1024);
    static_assert(LK::kHalfBytes == kHalfBytes && LV::kHalfBytes == kHalfBytes, "one tile geometry");
    auto multiply_pv = [&](uint32_t tile) {
        const uint64_t vd = wgmma::desc_advance(v_desc, LV::f16_tile(tile));
        wgmma::fence();
#pragma unroll
        for (int cs = 0; cs < kTile / 16; ++cs)
            wgmma::mma_m64n128k16<1>(o, pa[cs], wgmma::desc_advance(vd, cs * 16 * 128), true);
        wgmma::commit();
    };

    using Scores = float[kTile / 8][4];
    // S = Q Kᵀ (64 rows x kTile cells per warpgroup), issued and committed, not waited for. K is
    // stored cell-major with dims contiguous: the K-major B operand; a 16-dim step moves 32
    // bytes inside a 128-byte row.
    auto multiply_qk = [&](Scores& s, uint32_t tile) {
        const uint64_t kd = wgmma::desc_advance(k_desc, LK::f16_tile(tile));
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks)
            wgmma::mma_m64n128k16<0>(s, qa[ks], wgmma::desc_advance(kd, (ks / 4) * kHalfBytes + (ks % 4) * 32), ks > 0);
        wgmma::commit();
    };
    auto softmax = [&](Scores& s, uint32_t tile, float (&alpha)[2], bool& grew) {
        wgmma_softmax::softmax_tile<kTile>(s, rows, p, p.cell_begin + tile * kTile, full_end, my_row0, tq, alpha, grew);
    };
    auto rescale_o = [&](const float (&alpha)[2], bool grew) { wgmma_softmax::rescale_o<kD>(o, alpha, grew); };
    auto pack_p = [&](const Scores& s) { wgmma_softmax::pack_p<kTile>(s, pa); };

    for (uint32_t tile = 0; tile < n_tiles; ++tile) {
        cp_async_wait<0>();
        wgmma::fence_proxy_async_smem();  // this thread's copies and zero stores, for the wgmma reads
        __syncthreads();                  // ... of every thread; S of tile - 1 is done everywhere (P V of
                                          // tile - 1 may still run: V has a third stage)
        if (tile + 1 < n_tiles) {         // into stages whose last readers finished before the barrier
            issue_k(tile + 1);
            issue_v(tile + 1);
        }
        cp_async_commit();
        prepare(tile);
        if (defer && tile > 0) multiply_pv(tile - 1);  // completes with S below, before O is rescaled
        Scores s;
        multiply_qk(s, tile);
        wgmma::wait<0>();
        float alpha[2];
        bool grew;
        softmax(s, tile, alpha, grew);
        rescale_o(alpha, grew);
        pack_p(s);
        // In flight until the next tile's S completes (O is not touched before).
        if (!defer) multiply_pv(tile);
    }
    if (defer && n_tiles > 0) multiply_pv(n_tiles - 1);
    wgmma::wait<0>();

    wgmma_softmax::store_rows<kD>(o, rows, p, kv_head, my_row0, tq);
#else
    __trap();  // launched only where prefill_attention_wgmma_available() (sm_90a code present)
#endif
}

template <int kTile, KvType KT, KvType VT>
void launch(Params p, uint32_t n_head_kv, cudaStream_t stream) {
    constexpr uint32_t kSmemBytes = Tiling<kTile, KT, VT>::kSmemBytes;
    auto* kernel = prefill_attention_wgmma_kernel<kTile, KT, VT>;
    static bool configured = false;  // once per instance: opt in to > 48 KB of shared memory
    if (!configured) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
        configured = true;
    }
    p.n_row_blocks = (p.n_rows + kRows - 1) / kRows;
    kernel<<<dim3(p.n_row_blocks, n_head_kv), kThreads, kSmemBytes, stream>>>(p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool prefill_attention_wgmma_available() {
    static const bool available = sm90a_kernels_usable(
        &kWgmmaCompiled, std::max({Tiling<128, KvType::f16, KvType::f16>::kSmemBytes,
                                   Tiling<128, KvType::q8_0, KvType::q8_0>::kSmemBytes,
                                   Tiling<128, KvType::f16, KvType::q8_0>::kSmemBytes}));
    return available;
}

bool prefill_attention_wgmma_cuda(const AttentionShape& shape, const float* q, KvType k_type, const uint8_t* k_cells,
                                  KvType v_type, const uint8_t* v_cells, uint32_t cell_begin, uint32_t n_cells,
                                  uint32_t pos0, uint32_t n_tokens, float* out, float* lse, cudaStream_t stream,
                                  WgmmaSchedule schedule, __half* out_f16) {
    if (shape.head_dim_k != kD || shape.head_dim_v != kD || shape.n_head_kv == 0 || shape.n_head % shape.n_head_kv != 0 || shape.n_head / shape.n_head_kv > 16 ||
        !prefill_attention_wgmma_available())
        return false;
    if (n_tokens == 0) return true;
    // The kernel's cell and position arithmetic is 32-bit.
    if ((uint64_t)cell_begin + n_cells > UINT32_MAX || (uint64_t)pos0 + n_tokens > UINT32_MAX)
        fail("prefill_attention_wgmma_cuda: cell range overflows");
    Params p = make_params(shape, q, k_type, k_cells, v_type, v_cells, cell_begin, n_cells, pos0, n_tokens, out, lse);
    p.out_f16 = out_f16;
    // Default for f16 K and V: specialized (prefill_attention_ws.cu; session 42, H100,
    // bench_prefill 64k / 2048: 609 TFLOP/s against skew128's 495 in the same call).
    // SPILLWAY_WGMMA_SCHEDULE=skew128|specialized (lab): skew128 is this file's kernel, the
    // default until session 42.
    if (schedule == WgmmaSchedule::automatic) {
        static const WgmmaSchedule configured =
            lab_knob_choice("SPILLWAY_WGMMA_SCHEDULE", {"skew128", "specialized"}) == 0 ? WgmmaSchedule::skew128
                                                                                      : WgmmaSchedule::specialized;
        schedule = configured;
    }
    if (k_type == KvType::f16 && v_type == KvType::f16) {
        if (schedule == WgmmaSchedule::specialized && prefill_attention_ws_launch(p, shape.n_head_kv, stream)) return true;
        launch<128, KvType::f16, KvType::f16>(p, shape.n_head_kv, stream);
        return true;
    }
    // Quantized K or V: skew128 whatever the schedule asked for (specialized is f16 only).
    auto with_v = [&]<KvType KT>() {
        switch (v_type) {
            case KvType::f16: launch<128, KT, KvType::f16>(p, shape.n_head_kv, stream); return;
            case KvType::q8_0: launch<128, KT, KvType::q8_0>(p, shape.n_head_kv, stream); return;
            case KvType::q4_0: launch<128, KT, KvType::q4_0>(p, shape.n_head_kv, stream); return;
        }
        fail("prefill attention (wgmma): unknown V type");
    };
    switch (k_type) {
        case KvType::f16: with_v.template operator()<KvType::f16>(); break;
        case KvType::q8_0: with_v.template operator()<KvType::q8_0>(); break;
        case KvType::q4_0: with_v.template operator()<KvType::q4_0>(); break;
    }
    return true;
}

}  // namespace spillway
