#pragma once
// Decode attention (one query token) with both products on mma.sync m16n8k16, the K and V
// fragments built in registers straight from the cache's raw f16 / q8_0 / q4_0 bytes: no
// dequantized tile in shared memory and no block barrier in the main loop. Head dim 128,
// <= 8 query heads per KV head, any K/V type pair. Internal to engine/cuda (attention.cu
// chooses and launches it; docs/perf-notes.md, "Decode attention, session 10 — D1").
#include <cuda_runtime.h>

#include <cstdint>

#include "model/model_spec.h"

namespace spillway::attention_mma {

constexpr uint32_t kHeadDim = 128;
constexpr uint32_t kMaxGroup = 8;  // query heads per KV head: the 8 live rows of an m16 tile

// The parameters of every decode attention kernel (attention.cu's split kernels too).
struct Params {
    const float* q;          // [n_head][head_dim] f32
    const uint8_t* k;        // cells, rows of k_row_bytes (16-byte aligned base)
    const uint8_t* v;
    uint64_t k_row_bytes;
    uint64_t v_row_bytes;
    uint32_t n_cells;
    uint32_t cells_per_split;
    uint32_t n_group;        // query heads per KV head
    float scale_log2;        // softmax scale * log2(e): scores are kept in base-2 units
    float* part_out;         // [split][n_head][head_dim]
    float* part_lse;         // [split][n_head], natural log
    uint32_t n_head;
    // Cells below this were written before the kernel's producer ran (earlier decode steps):
    // a programmatic launch may copy them before waiting for the producer (the step's new
    // cell, written by it, only after). 0: nothing is read before the wait.
    uint32_t settled_cells;
    // One split (attention_finish_device.cuh): the kernel also writes part_out (= the
    // output) as int16 blocks into out_q / out_d, unless out_q is nullptr.
    uint32_t n_splits;
    int16_t* out_q;
    float* out_d;
    // Post-QKV inside the kernel (attention.cuh, AttentionPostQkv; the tensor_core kernel
    // only): set rope_table, and q is raw; the block holding new_cell writes it first.
    const float2* rope_table;
    uint32_t rope_dims;
    uint32_t rope_neox;
    const float* qkv_bias;
    const float* new_k;
    const float* new_v;
    uint8_t* k_store;
    uint8_t* v_store;
    uint32_t new_cell;
    // Lab timeline (attention_lab_timeline; the mma kernel only): nullptr in the engine.
    uint64_t* timeline;
    // How the kernel loads Q (set by launch; the zero default is always valid):
    // 0 per-lane scalar loads after the copies are issued, 1 per-lane 16-byte loads before
    // them, 2 coalesced 16-byte loads before them, redistributed through shared memory (1
    // and 2 need q 16-byte aligned).
    uint32_t q_load;
    // Plan's whole-wave split counts (splits_lo == 0: cells_per_split per split).
    uint32_t splits_lo;
    uint32_t splits_hi;
    uint32_t hi_heads;
};

// Stamps per warp of the lab timeline: [0] entry, [1] after the dependency wait, [2] Q in
// registers, [3] the first step's cells landed, [4] loop done, [5] the block's warps done
// (epilogue barrier), [6] partial written, [7] steps this warp ran (a count, not a time),
// [8] the block's (m, l, acc) in shared memory (before the partial's global stores), [9]
// the SM the warp ran on (%smid, not a time).
constexpr uint32_t kTimelineSlots = 10;

struct Plan {
    uint32_t n_splits;
    uint32_t cells_per_split;
    // Whole waves (lab, SPILLWAY_ATTN_WHOLE_WAVES=1): KV heads below hi_heads run splits_hi
    // splits, the others splits_lo (one fewer), so heads x splits fills every SM's slots
    // exactly; a head's steps are dealt to its splits within one step of each other.
    // splits_lo == 0: every split holds cells_per_split cells (the default).
    uint32_t splits_lo = 0;
    uint32_t splits_hi = 0;
    uint32_t hi_heads = 0;
};

// Blocks of this pair's kernel resident on one SM (shared memory and launch bounds: 4, or 5
// for q8_0 / q8_0).
uint32_t resident_blocks_per_sm(KvType k_type, KvType v_type);

// Splits for n_cells: one wave of blocks (at most resident_blocks_per_sm per SM).
Plan plan(KvType k_type, KvType v_type, uint32_t n_head_kv, uint32_t n_cells, uint32_t sm_count);

// The warp-specialized variant of the kernel (a QK warp and a PV warp per stream of steps,
// bit-equal to the single-warp kernel with the same plan and 4 streams per block) runs for rows
// of whole 16-byte chunks on sm_90: by default for the equal quantized pairs at 8 streams from
// 16384 cells (SPILLWAY_ATTN_WS_MIN_CELLS moves it); plan() then plans for its resident blocks.
// Lab (tests, benchmarks; not thread-safe): streams 4 or 8 per block for every quantized-V pair
// at any range, 0 off (the single-warp kernel everywhere), -1 as SPILLWAY_ATTN_WS (unset: the
// default; 0 off; 1 four streams, 2 eight, for every quantized-V pair). block_k 1: per-block K steps for equal quantized
// pairs too (the mixed pairs of quantized K always use them), 0 not, -1 as
// SPILLWAY_ATTN_WS_BLOCK_K (off unless =1); values then differ from the single-warp kernel's.
void lab_warp_specialized(int streams, int block_k = -1);
// The default's threshold (SPILLWAY_ATTN_WS_MIN_CELLS moves it).
constexpr uint32_t kWarpSpecializedMinCells = 16384;
// Streams per block of the warp-specialized kernel that launch() runs for this pair, these row
// strides and this range (0: the single-warp kernel), whatever sets it (the default, the lab
// setting, the knobs, where the variant's code runs); the lab timeline aside.
int warp_specialized_streams(KvType k_type, KvType v_type, uint64_t k_row_bytes, uint64_t v_row_bytes,
                             uint32_t n_cells);
// Launches of the warp-specialized variant so far (tests check that it ran).
uint64_t lab_warp_specialized_launches();

// Grid (n_head_kv, n_splits); every CUDA return code checked.
void launch(KvType k_type, KvType v_type, const Params& p, uint32_t n_head_kv, uint32_t n_splits,
            cudaStream_t stream);

}  // namespace spillway::attention_mma
