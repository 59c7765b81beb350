// Causal prefill attention for f16 K and V, head dim 128, on Hopper with warp specialization:
// one producer thread copies K and V tiles with TMA (cp.async.bulk.tensor, one instruction per
// 16 KB half-tile, completed on mbarriers), two consumer warpgroups of 64 query rows each run
// S = Q Kᵀ and O += P V on wgmma with Q read from shared memory, and the online softmax.
//
// Why: the skew128 kernel (prefill_attention_wgmma.cu) reaches ~470 TFLOP/s at 64k. Its 256
// threads issue every 16-byte cp.async of every tile and meet at a block barrier per tile, so
// a warpgroup's softmax waits for the other's copies and MMAs. Here the consumers never copy:
// each waits only for its own tiles (mbarrier phases) and hands a stage back when its wgmmas
// that read it have completed. Two named barriers take turns (ping-pong): one warpgroup issues
// its MMAs while the other runs its softmax, as FlashAttention-3 does. Q as the wgmma's A
// operand from shared memory keeps 32 registers per thread free across the loop.
//
// Round t of a consumer issues P V of tile t - 1 and S of tile t as one wgmma group, waits for
// both, hands back both stages, and turns S of tile t into P (rounds 0..n_tiles).
//
// Floors, one 14B layer over a 64k prompt (bench_prefill): 4 x 128 x 40 heads x 65536^2 / 2 =
// 44 TFLOP, 44.5 ms at the H100's ~990 TFLOP/s dense f16 rate; the bytes (each row block
// re-reads its head's K and V, mostly from L2) are far below. Measured (session 42, H100):
// 72.2 ms = 609 TFLOP/s, 62% of that rate (skew128: 88.8 ms).
#include "engine/cuda/prefill_attention_ws.cuh"

#include <cuda.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "engine/cuda/bulk_copy_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/tensor_map.cuh"
#include "engine/cuda/wgmma_device.cuh"
#include "engine/cuda/warp_specialized_device.cuh"
#include "engine/cuda/wgmma_softmax.cuh"

namespace spillway {
namespace {

using namespace prefill_mma;

constexpr int kD = 128;
constexpr int kTile = 128;                // cells per K / V tile
constexpr int kRows = 128;                // query rows per block: 64 per consumer warpgroup
constexpr uint32_t kConsumerWarps = 8;    // warps 0..7; warpgroup 2 (warps 8..11) is the producer's
constexpr int kThreads = (kConsumerWarps + 4) * 32;
constexpr uint32_t kHalfBytes = kTile * 128;  // kTile cells x 64 dims of f16: one swizzled half-tile (one TMA box)
constexpr uint32_t kTileBytes = 2 * kHalfBytes;
constexpr uint32_t kQHalfBytes = kRows * 128;
// Named barriers (0 is __syncthreads): Q staged, and one turn per consumer warpgroup.
constexpr uint32_t kQReady = 1, kTurn0 = 2;

template <int kStages>
struct Layout {
    static constexpr uint32_t kKBase = 0, kVBase = kStages * kTileBytes, kQBase = 2 * kStages * kTileBytes;
    static constexpr uint32_t kBarBase = kQBase + 2 * kQHalfBytes;
    static constexpr uint32_t kSmemBytes = kBarBase + 4 * kStages * 8 + 1024;  // + the base's alignment
    static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
};

// 384 threads: a whole producer warpgroup beside the two consumer ones, for the register
// hand-over (warp_specialized_device.cuh). A lone producer warp beside 8 consumer warps puts 3
// warps on one SM sub-partition: 224 registers each did not launch.
template <int kStages, bool kPingPong, bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_ws_kernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                                Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using L = Layout<kStages>;
    extern __shared__ uint8_t smem_raw[];
    // TMA's 128-byte swizzle and wgmma's work on address bits: every tile starts 1024-byte aligned.
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
    uint64_t* full_k = reinterpret_cast<uint64_t*>(smem + L::kBarBase);
    uint64_t* full_v = full_k + kStages;
    uint64_t* empty_k = full_v + kStages;
    uint64_t* empty_v = empty_k + kStages;

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // The longest rows start first. Blocks are dealt in x-fastest order, so with x over row
    // blocks every KV head's longest rows wait for all row blocks of the heads before it (a
    // causal chunk's last head starts its longest blocks near the end); with x over the heads
    // (heads_fastest) the whole grid goes longest first.
    const uint32_t kv_head = p.heads_fastest ? blockIdx.x : blockIdx.y;
    const uint32_t row_block = p.n_row_blocks - 1 - (p.heads_fastest ? blockIdx.y : blockIdx.x);
    const RowBlockSpan span = row_block_span<kRows>(p, row_block);
    const uint32_t n_tiles = span.cell_stop > p.cell_begin ? (span.cell_stop - p.cell_begin + kTile - 1) / kTile : 0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&full_k[s], 1);  // the producer's arrival + the tile's bytes
            mbarrier_init(&full_v[s], 1);
            mbarrier_init(&empty_k[s], kConsumerWarps);  // one arrival per consumer warp
            mbarrier_init(&empty_v[s], kConsumerWarps);
        }
        mbarrier_init_fence();
    }
    __syncthreads();

    if (warp >= kConsumerWarps) {
        ws::producer_registers();
        // The producer: K of tile t, then V of tile t, each into its stage once every consumer
        // warp has handed that stage's previous tile back. Cells past the range arrive as zeros
        // (the maps end there), so a masked score (p = 0) never meets a NaN in V.
        if (warp == kConsumerWarps && lane == 0) {
            for (uint32_t t = 0; t < n_tiles; ++t) {
                const uint32_t s = t % kStages, use = t / kStages;
                const int32_t cell = (int32_t)(t * kTile), dim = (int32_t)(kv_head * kD);
                if (use > 0) mbarrier_wait_parity(&empty_k[s], (use - 1) & 1);
                mbarrier_arrive_expect_tx(&full_k[s], kTileBytes);
                tma_load_2d(smem + L::kKBase + s * kTileBytes, &k_map, dim, cell, &full_k[s]);
                tma_load_2d(smem + L::kKBase + s * kTileBytes + kHalfBytes, &k_map, dim + 64, cell, &full_k[s]);
                if (use > 0) mbarrier_wait_parity(&empty_v[s], (use - 1) & 1);
                mbarrier_arrive_expect_tx(&full_v[s], kTileBytes);
                tma_load_2d(smem + L::kVBase + s * kTileBytes, &v_map, dim, cell, &full_v[s]);
                tma_load_2d(smem + L::kVBase + s * kTileBytes + kHalfBytes, &v_map, dim + 64, cell, &full_v[s]);
            }
        }
        return;
    }

    ws::consumer_registers();

    // Q of the block's rows as f16 in two swizzled 64-dim halves: the K-major A operand of S.
    uint8_t* sq = smem + L::kQBase;
    for (uint32_t i = threadIdx.x; i < kRows * (kD / 8); i += kConsumerWarps * 32) {
        const uint32_t r = i / (kD / 8), j = i % (kD / 8);
        *reinterpret_cast<uint4*>(sq + (j / 8) * kQHalfBytes + wgmma::swizzled_offset(r, j % 8)) =
            q_chunk_f16<kD>(p, span.row0 + r, kv_head, j);
    }
    wgmma::fence_proxy_async_smem();  // generic stores, read by the wgmmas' async proxy
    ws::named_sync(kQReady, kConsumerWarps * 32);

    const uint32_t wg = warp / 4, tq = lane % 4;
    const uint32_t my_row0 = span.row0 + warp * 16 + lane / 4;  // and + 8
    // Descriptors built once and moved by constant offsets: Q (this warpgroup's 64 rows) and K
    // are K-major (a 16-dim step moves 32 bytes inside a 128-byte row); V is the N-major B of
    // O += P V (its two 64-dim halves kHalfBytes apart, 8-cell groups 1 KB).
    const uint64_t q_desc = wgmma::smem_desc(sq + wg * 64 * 128, 16, 1024);
    const uint64_t k_desc = wgmma::smem_desc(smem + L::kKBase, 16, 1024);
    const uint64_t v_desc = wgmma::smem_desc(smem + L::kVBase, kHalfBytes, 1024);

    float o[kD / 8][4] = {};
    wgmma_softmax::RowState rows;
    uint32_t pa[kTile / 16][4];  // P of the last tile
    float s[kTile / 8][4];

    // One round; which MMAs it issues is a compile-time choice, since a wgmma under a runtime
    // branch makes ptxas serialize every wgmma of the kernel.
    auto round = [&]<bool kQk, bool kPv>(uint32_t t) {
        const uint32_t ks_stage = t % kStages, vs_stage = (t + kStages - 1) % kStages;
        if constexpr (kQk) mbarrier_wait_parity(&full_k[ks_stage], (t / kStages) & 1);
        if constexpr (kPv) mbarrier_wait_parity(&full_v[vs_stage], ((t - 1) / kStages) & 1);
        if constexpr (kPingPong) ws::named_sync(kTurn0 + wg, kConsumerWarps * 32);
        wgmma::fence();
        auto issue_pv = [&] {
            const uint64_t vd = wgmma::desc_advance(v_desc, vs_stage * kTileBytes);
#pragma unroll
            for (int cs = 0; cs < kTile / 16; ++cs)
                wgmma::mma_m64n128k16<1>(o, pa[cs], wgmma::desc_advance(vd, cs * 16 * 128), true);
        };
        auto issue_qk = [&] {
            const uint64_t kd = wgmma::desc_advance(k_desc, ks_stage * kTileBytes);
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks) {
                const uint32_t step = (ks / 4) * kHalfBytes + (ks % 4) * 32;  // kHalfBytes == kQHalfBytes
                wgmma::mma_m64n128k16_ss(s, wgmma::desc_advance(q_desc, step), wgmma::desc_advance(kd, step), ks > 0);
            }
        };
        // Overlapped: S first, as a group of its own, so that its softmax can run while P V of
        // the last tile is still on the tensor cores (groups complete in order).
        constexpr bool kSplit = kOverlap && kQk && kPv;
        if constexpr (kSplit) {
            issue_qk();
            wgmma::commit();
            issue_pv();
        } else {
            if constexpr (kPv) issue_pv();
            if constexpr (kQk) issue_qk();
        }
        wgmma::commit();
        // The other warpgroup's turn (warpgroup 1's last round has no one left to hand to).
        if constexpr (kPingPong) {
            if (kQk || wg == 0) ws::named_arrive(kTurn0 + (1 - wg), kConsumerWarps * 32);
        }
        float alpha[2];
        bool grew = false;
        if constexpr (kSplit) {
            wgmma::wait<1>();  // S done; P V may still run (it reads pa and accumulates into o only)
            if (lane == 0) mbarrier_arrive(&empty_k[ks_stage]);
            wgmma_softmax::softmax_tile<kTile>(s, rows, p, p.cell_begin + t * kTile, span.full_end, my_row0, tq, alpha,
                                               grew);
            wgmma::wait<0>();
            if (lane == 0) mbarrier_arrive(&empty_v[vs_stage]);
        } else {
            wgmma::wait<0>();
            if (lane == 0) {
                if constexpr (kQk) mbarrier_arrive(&empty_k[ks_stage]);
                if constexpr (kPv) mbarrier_arrive(&empty_v[vs_stage]);
            }
            if constexpr (kQk)
                wgmma_softmax::softmax_tile<kTile>(s, rows, p, p.cell_begin + t * kTile, span.full_end, my_row0, tq,
                                                   alpha, grew);
        }
        if constexpr (kQk) {
            wgmma_softmax::rescale_o<kD>(o, alpha, grew);
            wgmma_softmax::pack_p<kTile>(s, pa);
        }
    };
    if (n_tiles > 0) {
        if (kPingPong && wg == 1) ws::named_arrive(kTurn0, kConsumerWarps * 32);  // warpgroup 0 goes first
        round.template operator()<true, false>(0);
        for (uint32_t t = 1; t < n_tiles; ++t) round.template operator()<true, true>(t);
        round.template operator()<false, true>(n_tiles);
    }
    wgmma_softmax::store_rows<kD>(o, rows, p, kv_head, my_row0, tq);
#else
    __trap();  // launched only where prefill_attention_wgmma_available() (sm_90a code present)
#endif
}

// One operand's cells [cell_begin, cell_end) of every KV head as a 2-D f16 tensor (dims of all
// heads x cells, `row_bytes` apart), read in boxes of 64 dims x kTile cells, 128-byte swizzled:
// the layout wgmma_device.cuh describes.
CUtensorMap operand_map(const uint8_t* cells, uint32_t n_head_kv, uint32_t n_cells, uint64_t row_bytes) {
    return tensor_map_2d(cells, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, (uint64_t)n_head_kv * kD, n_cells, row_bytes, 64,
                         kTile, CU_TENSOR_MAP_SWIZZLE_128B, "prefill attention (ws)");
}

template <int kStages, bool kPingPong, bool kOverlap = false>
void launch(const CUtensorMap& k_map, const CUtensorMap& v_map, const Params& p, uint32_t n_head_kv,
            cudaStream_t stream) {
    constexpr uint32_t kSmemBytes = Layout<kStages>::kSmemBytes;
    auto* kernel = prefill_attention_ws_kernel<kStages, kPingPong, kOverlap>;
    static bool configured = false;  // once per instance: opt in to > 48 KB of shared memory
    if (!configured) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
        configured = true;
    }
    const dim3 grid = p.heads_fastest ? dim3(n_head_kv, p.n_row_blocks) : dim3(p.n_row_blocks, n_head_kv);
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(k_map, v_map, p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool prefill_attention_ws_available() { return tensor_map_encoder_available(); }

bool prefill_attention_ws_launch(const Params& p_in, uint32_t n_head_kv, cudaStream_t stream) {
    if (!prefill_attention_ws_available()) return false;
    const uint32_t n_cells = p_in.cell_end - p_in.cell_begin;
    // What a tensor map takes: 16-byte aligned bases and rows, and tile coordinates (int32)
    // that hold the last cell. Anything else runs on skew128 instead.
    const auto aligned = [](const void* a, uint64_t row) { return reinterpret_cast<uintptr_t>(a) % 16 == 0 && row % 16 == 0; };
    if (!aligned(p_in.k, p_in.k_row) || !aligned(p_in.v, p_in.v_row) || n_cells > (uint32_t)INT32_MAX - kTile)
        return false;
    Params p = p_in;
    p.n_row_blocks = (p.n_rows + kRows - 1) / kRows;
    // Lab: SPILLWAY_WS_ORDER=heads deals the blocks longest rows first across all KV heads
    // (default: head by head, each longest first).
    static const bool heads_first = lab_knob("SPILLWAY_WS_ORDER", "heads", "rows");
    p.heads_fastest = heads_first ? 1 : 0;
    if (p.n_row_blocks > 65535 && heads_first) return false;  // gridDim.y's limit
    const CUtensorMap k_map = operand_map(p.k, n_head_kv, n_cells, p.k_row);
    const CUtensorMap v_map = operand_map(p.v, n_head_kv, n_cells, p.v_row);
    // Lab: SPILLWAY_WS_STAGES=3 (a third K and V stage), SPILLWAY_WS_PINGPONG=0 (the two
    // warpgroups issue their MMAs whenever their tiles are in).
    static const bool three = lab_knob("SPILLWAY_WS_STAGES", "3", "2");
    static const bool free_running = lab_knob("SPILLWAY_WS_PINGPONG", "0", "1");
    // Lab: SPILLWAY_WS_OVERLAP=1, each warpgroup's softmax of tile t beside its own P V of
    // tile t - 1 (2 stages, ping-pong).
    static const bool overlap = lab_knob("SPILLWAY_WS_OVERLAP", "1", "0");
    if (overlap) launch<2, true, true>(k_map, v_map, p, n_head_kv, stream);
    else if (three) {
        if (free_running) launch<3, false>(k_map, v_map, p, n_head_kv, stream);
        else launch<3, true>(k_map, v_map, p, n_head_kv, stream);
    } else {
        if (free_running) launch<2, false>(k_map, v_map, p, n_head_kv, stream);
        else launch<2, true>(k_map, v_map, p, n_head_kv, stream);
    }
    return true;
}

}  // namespace spillway
