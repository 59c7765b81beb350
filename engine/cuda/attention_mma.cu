// Decode attention on mma.sync m16n8k16 with K/V fragments built from raw cache bytes.
//
// Why: the int_dot kernel (quantized K) ran the G query heads' P V on CUDA cores (~8
// instructions per V value) with 8 warps per SM and sat at 20-31% of HBM, latency-bound;
// the tensor_core kernel round-trips dequantized f16 tiles through shared memory behind
// five block barriers per tile. Here each warp streams its own 16-cell steps through a
// private cp.async ring (no block barrier in the loop) and both products are MMAs whose
// operands come straight from the ring bytes (~2 instructions per value). Every row of
// every MMA is live (cells or dims as M = 16, the <= 8 query heads as N = 8):
//   S^T[cell][head] = K[cell][dim] Q^T[dim][head]   (A = K from the ring; B = Q^T, held in
//       registers for the whole split; k-pairs run along dims, i.e. along a cell's bytes);
//   O^T[dim][head] += V^T[dim][cell] P^T[cell][head] (A = V^T: its k-pairs run along cells,
//       so two cells' bytes are interleaved with byte permutes; B = P^T: the S^T
//       accumulators as f16, each 8x8 tile transposed with movmatrix).
// (A first version put the heads on M with rows 8..15 zero: twice the MMAs, and the
// compiler materialized the zero operands: ~1200 instructions per warp step, see
// docs/perf-notes.md.)
// The contraction index of each MMA is a free permutation as long as both operands use
// the same one, and so are the output rows if the final write undoes it:
//   QK: lane (g, t) holds dims 32t .. 32t+31 = exactly K block t (one scale per lane); q8_0 K
//       with f16 V instead runs each k-step within one block (per_block_k);
//   PV: lane (g, t) reads dims 16g .. 16g+15 of its four cells (half a V block, one scale)
//       and accumulates heads 2t, 2t+1 for those dims.
// Quantized bytes become f16 exactly with the 0x6400 | byte trick (1024 + u), minus the
// bias, times the block scale (one f16 rounding of d * q, as the tensor_core kernel).
//
// Copies: a cell's head slice is 136 (q8_0), 72 (q4_0) or 256 (f16) bytes at an 8-byte
// offset, so each cell is copied as a 16-byte-aligned window (144 / 80 / 256 bytes) with
// 16-byte cp.async; the window's last chunk is cut short (zero fill) where it would run
// past the slice, so nothing beyond the cache is read. Readers add the cell's lead (0 or 8).
#include "engine/cuda/attention_mma.cuh"
#include "engine/cuda/attention_finish_device.cuh"
#include "engine/cuda/bulk_copy_device.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"

namespace spillway::attention_mma {
namespace {

using kv_tile::slice_bytes;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStep = 16;  // cells per warp step: two n-tiles of QK, one k-tile of PV
constexpr int kD = (int)kHeadDim;
constexpr size_t kSmemPerSm = 228 * 1024, kSmemReservedPerBlock = 1024;
constexpr float kLog2e = 1.4426950408889634f;

// Per-pair choices (session 39 built them as lab variants; session 40 measured them in the
// engine on an H100, tools/engine-ab.sh, two interleaved rounds, docs/perf-notes.md):
//   mixed K/V pairs without register spills (per_block_k, q_in_smem): +0.7% (q8_0 / q4_0) to
//     +3.2% (f16 / q8_0) at 64k cells, neutral at 8k;
//   5 resident blocks (20 warps) per SM for q8_0 / q8_0 (max_blocks_per_sm): the launch bounds
//     ask for them (<= 102 registers; ptxas fits it in 96 without spills, on 2 stages), +0.4-0.5%
//     at 8k-64k. The same for q4_0 / q4_0 measured -1.1..-1.4% and for q8_0 / q4_0 -0.5..-0.8%
//     at 32k-64k (their extra splits cost more than the warps buy); f16 did not move.
// The other equal pairs run 4 blocks of <= 128 registers with Q's fragments in registers.
__host__ __device__ constexpr int max_blocks_per_sm(KvType kt, KvType vt) {
    return kt == KvType::q8_0 && vt == KvType::q8_0 ? 5 : 4;
}

__host__ __device__ constexpr uint32_t window_bytes(KvType t) {
    return slice_bytes(t, kD) % 16 == 0 ? slice_bytes(t, kD) : slice_bytes(t, kD) + 8;
}

__host__ __device__ constexpr size_t stage_bytes(KvType kt, KvType vt) {
    return (size_t)kStep * (window_bytes(kt) + window_bytes(vt));
}
__host__ __device__ constexpr int blocks_per_sm_for(size_t block_bytes, int max_blocks) {
    const size_t n = kSmemPerSm / (block_bytes + kSmemReservedPerBlock);
    return n < (size_t)max_blocks ? (int)n : max_blocks;
}

// Quantized K on per-block k-steps (k_block_fragments). It cuts a q8_0 step's K instructions
// by ~30% and q4_0's by ~40% (counted), but the loops are latency-bound and no faster for it
// (H100, engine A/B, session 39: q8_0 / q8_0 -0.1..-0.4%, q4_0 / q4_0 +0.15%); where ptxas's
// spills moved, the speed followed them: q8_0 / f16 84 -> 0 bytes, +3.0% at 16k and +4.4% at
// 64k. So it runs where it frees registers: in the mixed pairs of quantized K (with Q in shared
// memory, q_in_smem, except q8_0 / f16, which is spill-free with per-block K alone).
__host__ __device__ constexpr bool per_block_k(KvType kt, KvType vt) {
    return kt != KvType::f16 && kt != vt;
}

// Q's B fragments read from shared memory in every step (4 conflict-free 16-byte loads) instead
// of held in 16 registers across the loop, for the mixed pairs. With
// per-block K for the quantized-K mixed pairs as well, every uniform instance at 4 blocks is
// spill-free (ptxas, bytes stored, uniform / other rows, before -> after, session 39): f16 / q8_0 68 / 44
// -> 0 / 0, f16 / q4_0 52 / 8 -> 0 / 0, q8_0 / q4_0 8 / 0 -> 0 / 4, q4_0 / q8_0 48 / 0 -> 0 /
// 0, q4_0 / f16 84 / 16 -> 0 / 8. Equal pairs never spilled (and q8_0 / q8_0 has no 2 KiB to
// spare); q8_0 / f16 is spill-free with per-block K alone.
__host__ __device__ constexpr bool q_in_smem(KvType kt, KvType vt) {
    return kt != vt && !(kt == KvType::q8_0 && vt == KvType::f16);
}

template <KvType KT, KvType VT>
struct Layout {
    static constexpr int kMaxBlocks = max_blocks_per_sm(KT, VT);
    static constexpr bool kBlockK = per_block_k(KT, VT);
    static constexpr bool kQSmem = q_in_smem(KT, VT);
    static constexpr size_t kQBytes = kQSmem ? 32 * 16 * sizeof(uint32_t) : 0;
    static constexpr uint32_t kSliceK = slice_bytes(KT, kD), kSliceV = slice_bytes(VT, kD);
    static constexpr uint32_t kWinK = window_bytes(KT), kWinV = window_bytes(VT);
    static_assert(kWinK % 16 == 0 && kWinV % 16 == 0, "16-byte copy windows");
    static constexpr size_t stage = stage_bytes(KT, VT);
    // The word loads of the last cell may read up to 4 bytes past its window (ignored bytes):
    // a little slack at the end keeps them inside the allocation.
    static constexpr size_t kSlack = 16;
    // Per-block K: each warp's bias starts (k_bias_starts), 8 floats per lane column t, after
    // the rings; read in every step, so that they hold no registers across the loop.
    static constexpr size_t kBiasBytes = kBlockK ? kWarps * 4 * 8 * sizeof(float) : 0;
    // Three stages (two steps in flight per warp) when that still fits kMaxBlocks blocks per
    // SM, else two (f16 operands): more warps beat a deeper ring.
    static constexpr int kStages =
        blocks_per_sm_for(kWarps * 3 * stage + kBiasBytes + kSlack, kMaxBlocks) >= kMaxBlocks ? 3 : 2;
    static constexpr size_t warp_bytes = kStages * stage;
    static constexpr size_t bias_offset = kWarps * warp_bytes;
    static constexpr size_t q_offset = bias_offset + kBiasBytes;
    static constexpr size_t total = kWarps * warp_bytes + kBiasBytes + kQBytes + kSlack;
    static_assert(blocks_per_sm_for(total, kMaxBlocks) == blocks_per_sm_for(total - kQBytes - kBiasBytes, kMaxBlocks),
                  "the bias and Q areas cost no block");
    static constexpr int blocks_per_sm =
        blocks_per_sm_for(total, kMaxBlocks) < 1 ? 1 : blocks_per_sm_for(total, kMaxBlocks);
    // The launch bounds' blocks: 4 (<= 128 registers), or all of them where 5 may be resident.
    static constexpr int launch_blocks = kMaxBlocks > 4 ? blocks_per_sm : 4;
    // End-of-split merge area per warp (reuses the ring): m[8], l[8], acc[8][128].
    static constexpr size_t merge_bytes = (2 * kMaxGroup + kMaxGroup * kD) * 4;
    static_assert(warp_bytes >= merge_bytes, "merge area fits in the warp's ring");
};

__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, uint32_t src_bytes) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// count cells' head slices (cell c's at src0 + c * row_bytes) into windows of kWin bytes.
// kLanes (a power of two >= the window's 16-byte chunks) lanes per cell, lane k of a cell on
// chunk k: one warp instruction covers 32 / kLanes whole windows, so its addresses fall in
// few 128-byte lines. (Measured: two lanes per cell, each on every other chunk of its
// window, spread one instruction over 16 rows and made f16 and q8_0 ~25% slower; a
// lane-strided loop with a divide per chunk cost ~3x the instructions.)
// The base is 16-byte aligned, so an address's low bits are its lead. This is the general
// copy (per-cell lead, partial steps); full steps of rows that are whole 16-byte chunks take
// copy_windows_hoisted below.
template <uint32_t kSlice, uint32_t kWin>
__device__ __forceinline__ void copy_windows(uint8_t* dst, const uint8_t* src0, uint32_t row_bytes, uint32_t count,
                                             uint32_t lane) {
    constexpr uint32_t kPer = kWin / 16;
    constexpr uint32_t kLanes = kPer <= 4 ? 4 : kPer <= 8 ? 8 : kPer <= 16 ? 16 : 32;
    static_assert(kPer <= 32, "a window is at most 32 chunks");
    constexpr uint32_t kCellsPerPass = 32 / kLanes;
    const uint32_t k = lane % kLanes, c0 = lane / kLanes;
    if (k >= kPer) return;
#pragma unroll
    for (uint32_t r = 0; r < kStep / kCellsPerPass; ++r) {
        const uint32_t c = c0 + r * kCellsPerPass;
        if (c < count) {
            const uint8_t* src = src0 + c * row_bytes;
            const uint32_t lead = (uint32_t)reinterpret_cast<uintptr_t>(src) & 15;
            const uint32_t left = lead + kSlice - 16 * k;  // slice bytes from this chunk on (> 0)
            cp_async16_zfill(dst + c * kWin + 16 * k, src - lead + 16 * k, left < 16 ? left : 16);
        }
    }
}

// A full step of rows that are whole 16-byte chunks (every tier with 8 KV heads of dim 128):
// every cell has the first one's lead, so a lane's chunk offset is the same for all its cells
// and the pass is a strided copy without guards. src_lane is this lane's first chunk of the
// step's first cell (its lead already subtracted), dst_lane its place in the stage, pass the
// bytes between the cells one instruction covers. Whole 16-byte chunks: with such rows a
// window never passes its row's end (the bytes past the slice belong to the next head and
// are ignored).
template <uint32_t kWin, uint32_t kLanes>
__device__ __forceinline__ void copy_windows_hoisted(uint32_t dst_lane, const uint8_t* src_lane, uint32_t pass) {
    constexpr uint32_t kCellsPerPass = 32 / kLanes;
#pragma unroll
    for (uint32_t r = 0; r < kStep / kCellsPerPass; ++r)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst_lane + r * kCellsPerPass * kWin),
                     "l"(src_lane + (size_t)r * pass));
}
template <uint32_t kWin>
__host__ __device__ constexpr uint32_t copy_lanes() {
    constexpr uint32_t kPer = kWin / 16;
    return kPer <= 4 ? 4 : kPer <= 8 ? 8 : kPer <= 16 ? 16 : 32;
}

// exp2 on the special-function unit alone: exp2f adds a range fix-up for results below
// 2^-126, softmax weights that small are zero here anyway.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Lab timeline (Params::timeline): lane 0 of each warp stamps slot `slot` (or stores
// `value` there instead of the time). The address is recomputed per stamp so no register
// stays live across the loop for it.
__device__ __forceinline__ void timeline_stamp(const Params& p, uint32_t slot, uint64_t value = 0,
                                               bool time = true) {
    if (p.timeline == nullptr || threadIdx.x % 32 != 0) return;
    const size_t w = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * kWarps + threadIdx.x / 32;
    p.timeline[w * kTimelineSlots + slot] = time ? global_timer_ns() : value;
}

// N words from byte offset off (2-byte aligned) of a 16-byte-aligned shared-memory stage
// (funnel shifts realign them). The misalignment comes from off alone, so when off is the
// same in every step (rows of whole 16-byte chunks) the compiler computes it once.
template <int N>
__device__ __forceinline__ void lds_words(const uint8_t* base16, uint32_t off, uint32_t (&w)[N]) {
    const uint32_t mis = off & 3;
    const uint32_t* a = reinterpret_cast<const uint32_t*>(base16 + (off - mis));
    const uint32_t sh = mis * 8;
    uint32_t r[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) r[i] = a[i];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(r[i], r[i + 1], sh);
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) { return h2_bits(__floats2half2_rn(lo, hi)); }

// A volatile 16-byte global load: it stays where it is written relative to the cp.async
// copies (also volatile asm), so Q's loads can be put ahead of the step copies.
__device__ __forceinline__ float4 load_f4_in_order(const float* src) {
    float4 v;
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(src));
    return v;
}

// Q^T as QK's B operand (k = dims, n = heads): lane (g, t) holds head g, dims 32t ..
// 32t+31 as f16 pairs, pre-scaled to base-2 score units; heads past the group are zero.
// q_load 2: loads issued by load_q_coalesced (instruction j: head j, dims 4 lane ..
// 4 lane + 3; 512 contiguous bytes, 4 lines, per instruction instead of 32 lines per scalar
// load), written as f16 to scratch (a free ring stage of >= 2 KiB) in rows of 64 bytes, row
// 4g + t, 16-byte units swizzled by (row / 2) % 4 so both the 8-byte stores and the 16-byte
// reads are conflict-free.
__device__ __forceinline__ void load_q_coalesced(const float* q_group, uint32_t ng, uint32_t lane, float4 (&qv)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
        qv[j] = (uint32_t)j < ng ? load_f4_in_order(q_group + j * kD + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
}
// Row 4 head + dims / 32 of the scratch, 8-byte piece m (dims 4m .. 4m + 3 of those 32).
__device__ __forceinline__ uint32_t q_scratch_at(uint32_t row, uint32_t m) {
    return row * 64 + 16 * ((m / 2) ^ ((row / 2) % 4)) + 8 * (m % 2);
}
__device__ __forceinline__ void q_to_scratch(const float4 (&qv)[8], float scale, uint32_t lane, uint8_t* scratch) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
        *reinterpret_cast<uint2*>(scratch + q_scratch_at(4 * j + lane / 8, lane % 8)) =
            make_uint2(pack_h2(qv[j].x * scale, qv[j].y * scale), pack_h2(qv[j].z * scale, qv[j].w * scale));
    __syncwarp();
}
__device__ __forceinline__ void q_fragments_from_coalesced(const float4 (&qv)[8], float scale, uint32_t lane,
                                                           uint8_t* scratch, uint32_t (&qb)[8][2]) {
    q_to_scratch(qv, scale, lane, scratch);
    const uint32_t row = lane;  // 4g + t with g = lane / 4, t = lane % 4
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const uint4 w = *reinterpret_cast<const uint4*>(scratch + row * 64 + 16 * (u ^ ((row / 2) % 4)));
        qb[2 * u][0] = w.x, qb[2 * u][1] = w.y, qb[2 * u + 1][0] = w.z, qb[2 * u + 1][1] = w.w;
    }
    __syncwarp();  // the scratch stage is refilled by the loop's first issue
}

// Two bytes of x (kSel 0x4140: bytes 0, 1; 0x4342: 2, 3; 0x4240: 0, 2; 0x4341: 1, 3), each an
// unsigned u < 256, as half2 of u - bias: 0x64 above a byte is the half 1024 + u (exact), so
// is the subtraction.
template <uint32_t kSel>
__device__ __forceinline__ __half2 bytes_minus_bias(uint32_t x, __half2 bias) {
    return __hsub2(bits_h2(__byte_perm(x, 0x64646464u, kSel)), bias);
}
// The same times scale.
template <uint32_t kSel>
__device__ __forceinline__ uint32_t bytes_to_h2(uint32_t x, __half2 bias, __half2 scale) {
    return h2_bits(__hmul2(bytes_minus_bias<kSel>(x, bias), scale));
}

// D += A B, m16n8k16, f16 operands, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transpose of an 8x8 f16 tile held one register per lane (row lane/4, cols 2(lane%4)+0,1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// Block t of one cell's K slice (dims 32t .. 32t+31) as raw words: f16 16 words of 2
// values; q8_0 8 words of 4 codes (q + 128); q4_0 4 words of 8 nibbles (q + 8).
template <KvType KT>
struct KWords {
    static constexpr int kN = KT == KvType::f16 ? 16 : KT == KvType::q8_0 ? 8 : 4;
    uint32_t w[kN];
    __half2 scale;
};

// The slice starts at byte off of the 16-byte-aligned stage base16.
template <KvType KT>
__device__ __forceinline__ KWords<KT> k_words(const uint8_t* base16, uint32_t off, uint32_t t) {
    KWords<KT> r;
    if constexpr (KT == KvType::f16) {
        const uint4* p = reinterpret_cast<const uint4*>(base16 + off + 64 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 u = p[i];
            r.w[4 * i] = u.x, r.w[4 * i + 1] = u.y, r.w[4 * i + 2] = u.z, r.w[4 * i + 3] = u.w;
        }
    } else {
        constexpr int kBlock = KT == KvType::q8_0 ? 34 : 18;
        const uint32_t blk = off + kBlock * t;
        r.scale = __half2half2(*reinterpret_cast<const __half*>(base16 + blk));
        lds_words<KWords<KT>::kN>(base16, blk + 2, r.w);
    }
    return r;
}

// The MMA operand pair of contraction step kt: lo = dims 32t+4kt+0,1, hi = dims +2,3 (the
// permuted contraction index; Q uses the same).
template <KvType KT>
__device__ __forceinline__ void k_fragment(const KWords<KT>& k, int kt, uint32_t& lo, uint32_t& hi) {
    if constexpr (KT == KvType::f16) {
        lo = k.w[2 * kt], hi = k.w[2 * kt + 1];
    } else if constexpr (KT == KvType::q8_0) {
        const __half2 bias = __float2half2_rn(1024.0f + 128.0f);
        const uint32_t x = k.w[kt] ^ 0x80808080u;  // signed -> q + 128
        lo = bytes_to_h2<0x4140>(x, bias, k.scale);
        hi = bytes_to_h2<0x4342>(x, bias, k.scale);
    } else {
        // q4_0: dims 0..15 of a block are the low nibbles of qs[0..15], 16..31 the high ones.
        const __half2 bias = __float2half2_rn(1024.0f + 8.0f);
        const uint32_t x = (kt < 4 ? k.w[kt] : k.w[kt - 4] >> 4) & 0x0F0F0F0Fu;
        lo = bytes_to_h2<0x4140>(x, bias, k.scale);
        hi = bytes_to_h2<0x4342>(x, bias, k.scale);
    }
}

// Quantized K on per-block k-steps (per_block_k). Each QK MMA k-step covers 16 dims of one K block,
// so the block's scale multiplies the MMA's f32 result (one per cell row and block) instead of
// every value pair, and the codes enter the MMA as the exact halves 1024 + (q + 128) with their
// bias folded into the accumulator's start value:
//   acc_b = -1152 sum_d q_d + sum_d (1152 + code_d) q_d = sum_d code_d q_d   (f32; products exact)
//   S[cell] = sum_b d_b[cell] acc_b[cell]
// This drops the subtract and the scale multiply of every value pair (64 of them per lane and
// 16-cell step). k-step 2b + h, lane t: dims base .. base + 3 of block b, base = 32b + 16h + 4t,
// code word t + 4h of the block: lo = (base, base + 1) at k 2t, 2t + 1; hi = (base + 2,
// base + 3) at k 2t + 8, 2t + 9. Q's B fragments and the bias sums use the same order
// (q_block_fragments_from_coalesced, k_bias_starts). q4_0 K (below) measured +0.15% on q4_0 /
// q4_0 (docs/perf-notes.md session 39) and runs only in the mixed pairs (per_block_k).
template <KvType KT>
__host__ __device__ constexpr uint32_t k_block_bytes() {
    return KT == KvType::q8_0 ? 34 : 18;
}
// q8_0: 1024 + (q + 128) under 0x64. q4_0: the low nibble u under 0x64
// (1024 + u, bias 1032), the high nibble in bits 4..7 under 0x54 (64 + u, bias 72); k-step
// 2b + h takes qs word t of block b, low nibbles for h = 0, high ones for h = 1, lo = dims
// (base, base + 2), hi = (base + 1, base + 3).
template <KvType KT>
__host__ __device__ constexpr float k_code_bias(int h) {
    return KT == KvType::q8_0 ? 1152.0f : (h == 0 ? 1032.0f : 72.0f);
}

// A word of codes at byte off of a 16-byte-aligned stage, off = 2 (mod 4) when kMis2 and 0
// otherwise: with uniform rows a slice's lead is 0 or 8 (head slices are 136 bytes), and block
// b's codes start at 2 + 34b, so even blocks sit 2 bytes off a word and odd blocks on one.
template <bool kMis2>
__device__ __forceinline__ uint32_t lds_code_word(const uint8_t* base16, uint32_t off) {
    if constexpr (kMis2) {
        const uint32_t* a = reinterpret_cast<const uint32_t*>(base16 + off - 2);
        return __funnelshift_r(a[0], a[1], 16);
    } else {
        return *reinterpret_cast<const uint32_t*>(base16 + off);
    }
}

// The A operands of K block b's two k-steps (q8_0 or q4_0) for cells g (slice r0) and g + 8 (slice r1):
// a[h] = {lo(g), lo(g + 8), hi(g), hi(g + 8)}.
template <KvType KT, int b>
__device__ __forceinline__ void k_block_fragments(const uint8_t* sk, uint32_t r0, uint32_t r1, uint32_t t,
                                                  uint32_t (&a)[2][4]) {
    constexpr uint32_t codes = k_block_bytes<KT>() * b + 2;
    constexpr bool kMis2 = b % 2 == 0;
    if constexpr (KT == KvType::q8_0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t off = codes + 4 * (t + 4 * h);
            const uint32_t x0 = lds_code_word<kMis2>(sk, r0 + off) ^ 0x80808080u;  // signed -> q + 128
            const uint32_t x1 = lds_code_word<kMis2>(sk, r1 + off) ^ 0x80808080u;
            a[h][0] = __byte_perm(x0, 0x64646464u, 0x4140), a[h][2] = __byte_perm(x0, 0x64646464u, 0x4342);
            a[h][1] = __byte_perm(x1, 0x64646464u, 0x4140), a[h][3] = __byte_perm(x1, 0x64646464u, 0x4342);
        }
    } else {
        const uint32_t off = codes + 4 * t;
        const uint32_t w[2] = {lds_code_word<kMis2>(sk, r0 + off), lds_code_word<kMis2>(sk, r1 + off)};
        auto lop = [](uint32_t v, uint32_t mask, uint32_t magic) {  // (v & mask) | magic, LUT 0xEA
            uint32_t r;
            asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(v), "r"(mask), "r"(magic));
            return r;
        };
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // bytes 0 and 2 (lo), 1 and 3 (hi) of the word
            const uint32_t x = w[c], y = w[c] >> 8;
            a[0][c] = lop(x, 0x000F000Fu, 0x64006400u), a[0][2 + c] = lop(y, 0x000F000Fu, 0x64006400u);
            a[1][c] = lop(x, 0x00F000F0u, 0x54005400u), a[1][2 + c] = lop(y, 0x00F000F0u, 0x54005400u);
        }
    }
}

// Q's B fragment pair for k-step kt from head g's f16 values at base .. base + 3 (x = base,
// base + 1; y = base + 2, base + 3), in k_block_fragments' order.
template <KvType KT>
__device__ __forceinline__ void q_block_fragment(uint32_t x, uint32_t y, uint32_t (&qb)[2]) {
    if constexpr (KT == KvType::q8_0) {
        qb[0] = x, qb[1] = y;
    } else {
        qb[0] = __byte_perm(x, y, 0x5410), qb[1] = __byte_perm(x, y, 0x7632);
    }
}

// D = A B + C with C's columns (c0, c1) in both row halves (the bias start of a K block).
__device__ __forceinline__ void mma16816_from(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1, float c0, float c1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%10,%11};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1));
}

// The bias starts: kbias[b] = -1152 sum over block b of q_d for heads 2t and 2t + 1, from
// the f16 values in the B fragments (lane (g, t) holds head g): summed over the lane's dims,
// then over the group's 4 lanes, then fetched from the lanes of heads 2t and 2t + 1.
// They are written to the warp's bias area (8 floats per t: blocks 0..3 x heads 2t, 2t + 1), and
// each step reads them back (load_k_bias_starts): held in registers across the loop they made
// ptxas spill in the q8_0 / q8_0 kernel.
template <KvType KT>
__device__ __forceinline__ void k_bias_starts(const uint32_t (&qb)[8][2], uint32_t g, uint32_t t, float* area) {
    float kbias[4][2];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        float sum = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float2 lo = __half22float2(bits_h2(qb[2 * b + h][0])), hi = __half22float2(bits_h2(qb[2 * b + h][1]));
            sum += k_code_bias<KT>(h) * ((lo.x + lo.y) + (hi.x + hi.y));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        kbias[b][0] = -__shfl_sync(0xffffffffu, sum, 8 * t);
        kbias[b][1] = -__shfl_sync(0xffffffffu, sum, 8 * t + 4);
    }
    if (g == 0) {
        reinterpret_cast<float4*>(area)[2 * t] = make_float4(kbias[0][0], kbias[0][1], kbias[1][0], kbias[1][1]);
        reinterpret_cast<float4*>(area)[2 * t + 1] = make_float4(kbias[2][0], kbias[2][1], kbias[3][0], kbias[3][1]);
    }
    __syncwarp();
}
// Volatile: the compiler would otherwise hoist these loop-invariant loads out of the loop and
// keep the values in registers again.
__device__ __forceinline__ void load_k_bias_starts(const float* area, uint32_t t, float (&kbias)[4][2]) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(area) + 32 * t;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(kbias[0][0]), "=f"(kbias[0][1]), "=f"(kbias[1][0]), "=f"(kbias[1][1])
                 : "r"(a));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(kbias[2][0]), "=f"(kbias[2][1]), "=f"(kbias[3][0]), "=f"(kbias[3][1])
                 : "r"(a + 16));
}

// Per-block K (k_block_fragments): lane (g, t), k-step 2b + h holds head g's dims 32b + 16h +
// 4t .. + 3 (paired by q_block_fragment), the scratch row 4g + b's piece 4h + t.
template <KvType KT>
__device__ __forceinline__ void q_block_fragments_from_coalesced(const float4 (&qv)[8], float scale, uint32_t lane,
                                                                 uint8_t* scratch, uint32_t (&qb)[8][2]) {
    q_to_scratch(qv, scale, lane, scratch);
    const uint32_t g = lane / 4, t = lane % 4;
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint2 w = *reinterpret_cast<const uint2*>(scratch + q_scratch_at(4 * g + b, 4 * h + t));
            q_block_fragment<KT>(w.x, w.y, qb[2 * b + h]);
        }
    __syncwarp();  // the scratch stage is refilled by the loop's first issue
}
// f16 V: dims 16g .. 16g+15 of one cell's slice as 8 words of 2 values.
struct VWordsF16 {
    uint32_t w[8];
};

__device__ __forceinline__ VWordsF16 v_words_f16(const uint8_t* base16, uint32_t off, uint32_t g, bool valid) {
    VWordsF16 r;
    const uint4* p = reinterpret_cast<const uint4*>(base16 + off + 32 * g);
    const uint4 a = p[0], b = p[1];
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w, r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
    if (!valid)  // stale ring bytes may be NaN; 0 * NaN would poison the product
#pragma unroll
        for (int i = 0; i < 8; ++i) r.w[i] = 0;
    return r;
}

// Operands half2(V[a][dim], V[b][dim]) for a pair of cells (a, b) and dims 16g + 4part +
// 0..3, in dim order (f16 V).
__device__ __forceinline__ void v_pair_fragments_f16(const VWordsF16& a, const VWordsF16& b, int part,
                                                     uint32_t (&out)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        out[2 * h] = __byte_perm(a.w[2 * part + h], b.w[2 * part + h], 0x5410);
        out[2 * h + 1] = __byte_perm(a.w[2 * part + h], b.w[2 * part + h], 0x7632);
    }
}

// Quantized V: the block scale goes into P instead of into every value. PV's m-tiles 2b and
// 2b + 1 hold dims of V block b only (m-tile 2b + h, row g: q4_0 32b + 16h + 2g, q8_0 32b +
// 4g + 2h; row g + 8: the next dim), so one tile has one scale per cell and B = P^T *
// d[cell][b] (one f16 rounding of p * d, where the dequantizing path rounded d * q once).
// The codes become f16 exactly, minus the bias (HSUB2, exact): q8_0 byte x ^ 0x80 = q + 128
// under 0x64 (1024 + q + 128); q4_0 low nibble under 0x64 (1024 + u), high nibble in bits
// 4..7 under 0x54 (64 + u, the exponent's unit being 1/16).
// Per 16-cell warp step of q4_0 the PV part was ~190 instructions (funnel-shifted word
// loads, nibble shifts, interleaving permutes, a multiply per value pair) and is ~130 now
// (SASS, session 21); the engine's q4_0 loop at 64k cells went from 25.7 to 22.1 us.
template <KvType VT>
__host__ __device__ constexpr uint32_t v_tile_dim(int mt, uint32_t g) {
    if constexpr (VT == KvType::f16) return 16 * g + 2 * (uint32_t)mt;
    // q8_0: tiles 2b and 2b + 1 take bytes 0, 1 and 2, 3 of the word of codes 4g .. 4g + 3.
    else if constexpr (VT == KvType::q8_0) return 32 * ((uint32_t)mt / 2) + 4 * g + 2 * ((uint32_t)mt % 2);
    else return 32 * ((uint32_t)mt / 2) + 16 * ((uint32_t)mt % 2) + 2 * g;
}

// q4_0: the nibbles of bytes 0 and 2 under the exponent byte, (x & mask) | magic, as one
// LOP3 with the magic in a register (written in C, ptxas split it into two instructions).
template <bool kHigh>
__device__ __forceinline__ uint32_t q4_0_codes_to_h2(uint32_t x, uint32_t magic) {
    uint32_t y;
    // LUT for (a & b) | c with a = 0xF0, b = 0xCC, c = 0xAA: 0xEA.
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(y) : "r"(x), "n"(kHigh ? 0x00F000F0 : 0x000F000F), "r"(magic));
    return y;
}

// One PV tile (m-tile mt) of a q4_0 V block: the codes of rows g and g + 8 are adjacent bytes
// (code_off: 2g, 2g + 1 past the block's qs), so one 16-bit load per cell gives both; a
// permute puts cell a's and cell b's bytes of a row side by side in 16-bit lanes. kHigh: the
// high nibbles (the same bytes as the low tile).
template <bool kHigh>
__device__ __forceinline__ void pv_q4_0_tile(const uint8_t* sv, const uint32_t (&off)[4], uint32_t code_off,
                                             uint32_t magic, uint32_t b0, uint32_t b1, float (&acc)[4]) {
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = *reinterpret_cast<const uint16_t*>(sv + off[i] + code_off);
    const __half2 bias = __float2half2_rn(kHigh ? 64.0f + 8.0f : 1024.0f + 8.0f);
    auto h = [&](uint32_t x) { return h2_bits(__hsub2(bits_h2(q4_0_codes_to_h2<kHigh>(x, magic)), bias)); };
    const uint32_t xa = __byte_perm(c[0], c[1], 0x5410), ya = __byte_perm(c[0], c[1], 0x4501);  // rows g, g + 8
    const uint32_t xb = __byte_perm(c[2], c[3], 0x5410), yb = __byte_perm(c[2], c[3], 0x4501);
    mma16816(acc, h(xa), h(ya), h(xb), h(yb), b0, b1);
}

// Both PV tiles of a q8_0 V block: one word of codes 4g .. 4g + 3 per cell (one 32-bit load,
// or two and a funnel shift where the block's codes sit 2 bytes off a word) serves both
// (tile 2b: bytes 0, 1 as rows g, g + 8; tile 2b + 1: bytes 2, 3). Per cell and step that is
// 4 to 8 loads instead of 8 16-bit ones. Sign bits flipped (q + 128), each row's pair under
// 0x64: 3 instructions per value pair.
__device__ __forceinline__ void pv_q8_0_tiles(const uint8_t* sv, const uint32_t (&off)[4], uint32_t code_off,
                                              uint32_t b0, uint32_t b1, float (&acc0)[4], float (&acc1)[4]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t one[1];
        lds_words<1>(sv, off[i] + code_off, one);
        w[i] = one[0];
    }
    const __half2 bias = __float2half2_rn(1024.0f + 128.0f);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t sel = h ? 0x7632 : 0x5410;
        const uint32_t xa = __byte_perm(w[0], w[1], sel) ^ 0x80808080u;
        const uint32_t xb = __byte_perm(w[2], w[3], sel) ^ 0x80808080u;
        mma16816(h ? acc1 : acc0, h2_bits(bytes_minus_bias<0x4240>(xa, bias)),
                 h2_bits(bytes_minus_bias<0x4341>(xa, bias)), h2_bits(bytes_minus_bias<0x4240>(xb, bias)),
                 h2_bits(bytes_minus_bias<0x4341>(xb, bias)), b0, b1);
    }
}

// O^T += V^T (P^T d) for V block b: tiles 2b and 2b + 1. off[i] = slice offsets of cells 2t,
// 2t + 1, 2t + 8, 2t + 9 in the stage; pb = P^T for cells (2t, 2t+1) and (2t+8, 2t+9).
template <KvType VT>
__device__ __forceinline__ void pv_quantized_block(const uint8_t* sv, const uint32_t (&off)[4], int b, uint32_t g,
                                                   uint32_t valid, uint32_t t, uint32_t pb0, uint32_t pb1,
                                                   const uint32_t (&magic)[2], float (&acc)[8][4]) {
    constexpr uint32_t kBlock = VT == KvType::q8_0 ? 34 : 18;
    __half d[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = *reinterpret_cast<const __half*>(sv + off[i] + kBlock * b);
    if (valid < (uint32_t)kStep) {  // stale ring bytes may hold an infinite scale (0 * inf)
        const uint32_t c[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (c[i] >= valid) d[i] = __float2half(0.0f);
    }
    const uint32_t b0 = h2_bits(__hmul2(bits_h2(pb0), __halves2half2(d[0], d[1])));
    const uint32_t b1 = h2_bits(__hmul2(bits_h2(pb1), __halves2half2(d[2], d[3])));
    if constexpr (VT == KvType::q8_0) {
        pv_q8_0_tiles(sv, off, kBlock * b + 2 + 4 * g, b0, b1, acc[2 * b], acc[2 * b + 1]);
    } else {
        // q4_0: dims 0..15 of a block are the low nibbles of qs[0..15], 16..31 the high ones.
        const uint32_t codes = kBlock * b + 2 + 2 * g;
        pv_q4_0_tile<false>(sv, off, codes, magic[0], b0, b1, acc[2 * b]);
        pv_q4_0_tile<true>(sv, off, codes, magic[1], b0, b1, acc[2 * b + 1]);
    }
}

// Q's B fragments from the block's Q area (q_in_smem): 4 conflict-free 16-byte loads per lane.
__device__ __forceinline__ void load_q_fragments(uint32_t q_area, uint32_t lane, uint32_t (&qs)[8][2]) {
#pragma unroll
    for (int w = 0; w < 4; ++w)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(qs[2 * w][0]), "=r"(qs[2 * w][1]), "=r"(qs[2 * w + 1][0]), "=r"(qs[2 * w + 1][1])
                     : "r"(q_area + 16 * (w * 32 + lane)));
}

// Q's B fragments for one step: from the Q area (kQSmem) or the registers that hold them.
template <bool kQSmem>
__device__ __forceinline__ void step_q_fragments(const uint32_t (&qb)[8][2], uint32_t q_area, uint32_t lane,
                                                 uint32_t (&qs)[8][2]) {
    if constexpr (kQSmem) {
        load_q_fragments(q_area, lane, qs);
    } else {
#pragma unroll
        for (int kt = 0; kt < 8; ++kt) qs[kt][0] = qb[kt][0], qs[kt][1] = qb[kt][1];
    }
}

// One 16-cell step's pieces, shared by attention_mma_kernel and its warp-specialized variant
// (attention_ws_kernel), in the order the single-warp loop runs them.

// S^T[cell][head] = K Q^T for the step: A rows = cells g and g + 8 (their slices at stage offsets
// k_slice(g), k_slice(g + 8)), k = dims, B = qs (Q^T). s = (cell g: heads 2t, 2t + 1; cell g + 8: heads 2t,
// 2t + 1).
template <KvType KT, bool kBlockK, typename KSlice>
__device__ __forceinline__ void qk_step(const uint8_t* sk, const KSlice& k_slice, uint32_t g, uint32_t t,
                                        const uint32_t (&qs)[8][2], const float* k_bias_area, float (&s)[4]) {
    if constexpr (!kBlockK) {
        const KWords<KT> k0 = k_words<KT>(sk, k_slice(g), t), k1 = k_words<KT>(sk, k_slice(g + 8), t);
        // Two accumulator chains of 4 MMAs instead of one of 8: half the dependent latency.
        float s_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < 8; ++kt) {
            uint32_t a0, a1, a2, a3;
            k_fragment<KT>(k0, kt, a0, a2);
            k_fragment<KT>(k1, kt, a1, a3);
            mma16816(kt % 2 ? s_odd : s, a0, a1, a2, a3, qs[kt][0], qs[kt][1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) s[j] += s_odd[j];
    } else {
        // Four independent chains of 2 MMAs (one per K block), then the block scales.
        const uint32_t r0 = k_slice(g), r1 = k_slice(g + 8);
        float kbias[4][2];
        load_k_bias_starts(k_bias_area, t, kbias);
        float acc_b[4][4];
        auto block = [&]<int b>() {
            uint32_t a[2][4];
            k_block_fragments<KT, b>(sk, r0, r1, t, a);
            mma16816_from(acc_b[b], a[0][0], a[0][1], a[0][2], a[0][3], qs[2 * b][0], qs[2 * b][1], kbias[b][0],
                          kbias[b][1]);
            mma16816(acc_b[b], a[1][0], a[1][1], a[1][2], a[1][3], qs[2 * b + 1][0], qs[2 * b + 1][1]);
        };
        block.template operator()<0>();
        block.template operator()<1>();
        block.template operator()<2>();
        block.template operator()<3>();
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // rows g (s[0], s[1]) and g + 8 (s[2], s[3])
            const uint8_t* row = sk + (half ? r1 : r0);
            float d[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) d[b] = __half2float(*reinterpret_cast<const __half*>(row + k_block_bytes<KT>() * b));
#pragma unroll
            for (int j = 2 * half; j < 2 * half + 2; ++j)
                s[j] = fmaf(d[3], acc_b[3][j], fmaf(d[2], acc_b[2][j], fmaf(d[1], acc_b[1][j], d[0] * acc_b[0][j])));
        }
    }
}

// Online softmax of one step per head (base 2). s = (cell g, heads 2t, 2t+1), (cell g+8, ...);
// a head's 16 cells are spread over the 8 lane groups. Invalid cells: -inf -> p = 0. Returns
// whether this lane's running max grew; alpha is exactly 1 where it did not.
__device__ __forceinline__ bool online_softmax_step(float (&s)[4], uint32_t g, uint32_t valid, float (&m_run)[2],
                                                    float (&l_run)[2], float (&alpha)[2], float (&e)[4]) {
    if (g >= valid) s[0] = s[1] = -INFINITY;
    if (g + 8 >= valid) s[2] = s[3] = -INFINITY;
    bool grew = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(s[h], s[2 + h]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));  // finite: cell 0 is valid
        const float m_new = fmaxf(m_run[h], mx);
        grew |= m_new > m_run[h];
        // 0 on the first step; exactly 1 when the max did not grow (the skipped rescale
        // relies on it).
        alpha[h] = m_new > m_run[h] ? exp2_ftz(m_run[h] - m_new) : 1.0f;
        e[h] = exp2_ftz(s[h] - m_new);
        e[2 + h] = exp2_ftz(s[2 + h] - m_new);
        l_run[h] = l_run[h] * alpha[h] + (e[h] + e[2 + h]);
        m_run[h] = m_new;
    }
    return grew;
}

// O^T's columns (heads 2t, 2t + 1) times alpha.
__device__ __forceinline__ void rescale_acc(float (&acc)[8][4], const float (&alpha)[2]) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        acc[mt][0] *= alpha[0], acc[mt][1] *= alpha[1], acc[mt][2] *= alpha[0], acc[mt][3] *= alpha[1];
    }
}

// O^T[dim][head] += V^T P^T for the step: A rows = dims (v_tile_dim), k = cells; v_slice(c) is
// cell c's slice offset in the stage; pb0 / pb1 = P^T for cells (2t, 2t+1)
// and (2t+8, 2t+9), head g.
template <KvType VT, typename VSlice>
__device__ __forceinline__ void pv_step(const uint8_t* sv, const VSlice& v_slice, uint32_t g, uint32_t t,
                                        uint32_t valid, uint32_t pb0, uint32_t pb1, const uint32_t (&q4_magic)[2],
                                        float (&acc)[8][4]) {
    const uint32_t c0 = 2 * t;
    if constexpr (VT == KvType::f16) {
        const VWordsF16 w0 = v_words_f16(sv, v_slice(c0), g, c0 < valid);
        const VWordsF16 w1 = v_words_f16(sv, v_slice(c0 + 1), g, c0 + 1 < valid);
        const VWordsF16 w2 = v_words_f16(sv, v_slice(c0 + 8), g, c0 + 8 < valid);
        const VWordsF16 w3 = v_words_f16(sv, v_slice(c0 + 9), g, c0 + 9 < valid);
#pragma unroll
        for (int part = 0; part < 4; ++part) {
            uint32_t lo[4], hi[4];  // dims 16g + 4part + 0..3; cells (2t, 2t+1) and (2t+8, 2t+9)
            v_pair_fragments_f16(w0, w1, part, lo);
            v_pair_fragments_f16(w2, w3, part, hi);
            mma16816(acc[2 * part], lo[0], lo[1], hi[0], hi[1], pb0, pb1);
            mma16816(acc[2 * part + 1], lo[2], lo[3], hi[2], hi[3], pb0, pb1);
        }
    } else {
        const uint32_t off[4] = {v_slice(c0), v_slice(c0 + 1), v_slice(c0 + 8), v_slice(c0 + 9)};
#pragma unroll
        for (int b = 0; b < 4; ++b) pv_quantized_block<VT>(sv, off, b, g, valid, t, pb0, pb1, q4_magic, acc);
    }
}

// The block's cells [begin, end) of its KV head: split * cells_per_split on, or with Plan's
// whole waves this head's steps dealt to its splits. False for an empty split (a head with one
// split fewer), whose partial write_empty_partial writes.
__device__ __forceinline__ bool split_cells(const Params& p, uint32_t kv_head, uint32_t split, uint32_t& begin,
                                            uint32_t& end) {
    begin = split * p.cells_per_split;
    end = min(p.n_cells, begin + p.cells_per_split);
    if (p.splits_lo != 0) {
        const uint32_t splits = kv_head < p.hi_heads ? p.splits_hi : p.splits_lo;
        const uint32_t n_steps = (p.n_cells + kStep - 1) / kStep, q = n_steps / splits, r = n_steps % splits;
        begin = split < splits ? (split * q + min(split, r)) * kStep : p.n_cells;
        end = split < splits ? min(p.n_cells, begin + (q + (split < r ? 1u : 0u)) * kStep) : p.n_cells;
        return begin < end;
    }
    return true;
}
// An empty split's partial: the merge identity (out 0, lse -inf), by the block's kBlockThreads.
template <uint32_t kBlockThreads>
__device__ __forceinline__ void write_empty_partial(const Params& p, uint32_t kv_head, uint32_t split, uint32_t tid) {
    pdl_wait_for_producer();
    pdl_release_dependents();
    for (uint32_t idx = tid; idx < p.n_group * kD; idx += kBlockThreads) {
        const uint32_t head = kv_head * p.n_group + idx / kD;
        p.part_out[((size_t)split * p.n_head + head) * kD + idx % kD] = 0.0f;
        if (idx % kD == 0) p.part_lse[(size_t)split * p.n_head + head] = -INFINITY;
    }
}

// The end-of-split merge area of one warp (or stream) in its ring: m[8], l[8], acc[8][128].
// write_merge_ml stores a lane's running max and (group-summed) sum of heads 2t, 2t + 1,
// write_merge_acc its O^T accumulators.
__device__ __forceinline__ void write_merge_ml(uint8_t* ring, const float (&m_run)[2], const float (&l_run)[2],
                                               uint32_t g, uint32_t t) {
    float* mw = reinterpret_cast<float*>(ring);
    float* lw = mw + kMaxGroup;
    if (g == 0) {
        mw[2 * t] = m_run[0], mw[2 * t + 1] = m_run[1];
        lw[2 * t] = l_run[0], lw[2 * t + 1] = l_run[1];
    }
}
template <KvType VT>
__device__ __forceinline__ void write_merge_acc(uint8_t* ring, const float (&acc)[8][4], uint32_t g, uint32_t t) {
    float* aw = reinterpret_cast<float*>(ring) + 2 * kMaxGroup;
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        const uint32_t d = v_tile_dim<VT>(mt, g);
        aw[(2 * t) * kD + d] = acc[mt][0];
        aw[(2 * t + 1) * kD + d] = acc[mt][1];
        aw[(2 * t) * kD + d + 1] = acc[mt][2];
        aw[(2 * t + 1) * kD + d + 1] = acc[mt][3];
    }
}
// The block's partial from its kParts merge areas (part w's at smem + w * part_bytes), by the
// block's kBlockThreads.
template <int kParts, uint32_t kBlockThreads>
__device__ __forceinline__ void write_block_partial(const Params& p, const uint8_t* smem, size_t part_bytes,
                                                    uint32_t kv_head, uint32_t split, uint32_t tid) {
    const uint32_t ng = p.n_group;
    for (uint32_t idx = tid; idx < ng * kD; idx += kBlockThreads) {
        const uint32_t h = idx / kD, d = idx % kD;
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < kParts; ++w) m = fmaxf(m, reinterpret_cast<const float*>(smem + w * part_bytes)[h]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < kParts; ++w) {
            const float* mw = reinterpret_cast<const float*>(smem + w * part_bytes);
            const float mv = mw[h];
            if (mv != -INFINITY) {  // a part with no step contributes nothing
                const float sc = exp2f(mv - m);
                l += mw[kMaxGroup + h] * sc;
                o += mw[2 * kMaxGroup + h * kD + d] * sc;
            }
        }
        const uint32_t head = kv_head * ng + h;
        p.part_out[((size_t)split * p.n_head + head) * kD + d] = o / l;
        if (d == 0) p.part_lse[(size_t)split * p.n_head + head] = (m + log2f(l)) / kLog2e;
    }
}

// kUniform: K and V rows are whole 16-byte chunks (every tier with 8 KV heads of dim 128), so
// every cell of this head has the same lead: copy addresses and shared-memory offsets are the
// same in every step and are computed once (the launch picks it; SPILLWAY_ATTN_FAST_COPY=0
// never does).
template <KvType KT, KvType VT, bool kUniform>
__global__ void __launch_bounds__(kThreads, Layout<KT, VT>::launch_blocks) attention_mma_kernel(Params p) {
    using L = Layout<KT, VT>;
    // Only with uniform rows (whole 16-byte chunks), which lds_code_word's alignment needs; the
    // other instance kept its old registers that way (16 spilled bytes instead of 72).
    constexpr bool kBlockK = L::kBlockK && kUniform;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t g = lane / 4, t = lane % 4;  // MMA group (row / n column) and thread in group
    uint8_t* ring = smem + warp * L::warp_bytes;

    const uint32_t kv_head = blockIdx.x, split = blockIdx.y;
    uint32_t cell_begin, cell_end;
    if (!split_cells(p, kv_head, split, cell_begin, cell_end)) {
        write_empty_partial<kThreads>(p, kv_head, split, tid);
        return;
    }
    const uint32_t n_chunks = (cell_end - cell_begin + kStep - 1) / kStep;
    const uint32_t ng = p.n_group;
    const uint64_t k_head_off = (uint64_t)kv_head * L::kSliceK, v_head_off = (uint64_t)kv_head * L::kSliceV;
    // A cell's window lead is (cell * row_bytes + head_off) mod 16: only the low bits matter.
    const uint32_t k_row16 = (uint32_t)(p.k_row_bytes & 15), k_head16 = (uint32_t)(k_head_off & 15);
    const uint32_t v_row16 = (uint32_t)(p.v_row_bytes & 15), v_head16 = (uint32_t)(v_head_off & 15);

    // kUniform: each lane's copy addresses are one offset from the step's first row, computed
    // once here (the per-step arithmetic was ~130 instructions of a q8_0 step's ~700, Nsight,
    // session 14).
    constexpr uint32_t kLanesK = copy_lanes<L::kWinK>(), kLanesV = copy_lanes<L::kWinV>();
    const bool k_lane_on = lane % kLanesK < L::kWinK / 16, v_lane_on = lane % kLanesV < L::kWinV / 16;
    const uint64_t k_lane_src = (uint64_t)(lane / kLanesK) * p.k_row_bytes + k_head_off - k_head16 + 16 * (lane % kLanesK);
    const uint64_t v_lane_src = (uint64_t)(lane / kLanesV) * p.v_row_bytes + v_head_off - v_head16 + 16 * (lane % kLanesV);
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const uint32_t k_lane_dst = ring_s + (lane / kLanesK) * L::kWinK + 16 * (lane % kLanesK);
    const uint32_t v_lane_dst = ring_s + kStep * L::kWinK + (lane / kLanesV) * L::kWinV + 16 * (lane % kLanesV);
    const uint32_t k_pass = (32 / kLanesK) * (uint32_t)p.k_row_bytes, v_pass = (32 / kLanesV) * (uint32_t)p.v_row_bytes;

    // Local step i of this warp is chunk warp + kWarps * i of the split.
    auto issue = [&](uint32_t i) {
        const uint32_t chunk = warp + kWarps * i;
        if (chunk < n_chunks) {
            const uint32_t slot = i % L::kStages;
            uint8_t* sk = ring + slot * L::stage;
            const uint32_t first = cell_begin + chunk * kStep;
            const uint32_t count = min((uint32_t)kStep, cell_end - first);
            if (kUniform && count == kStep) {
                if (k_lane_on)
                    copy_windows_hoisted<L::kWinK, kLanesK>(k_lane_dst + slot * (uint32_t)L::stage,
                                                            p.k + (uint64_t)first * p.k_row_bytes + k_lane_src, k_pass);
                if (v_lane_on)
                    copy_windows_hoisted<L::kWinV, kLanesV>(v_lane_dst + slot * (uint32_t)L::stage,
                                                            p.v + (uint64_t)first * p.v_row_bytes + v_lane_src, v_pass);
                cp_async_commit();
                return;
            }
            copy_windows<L::kSliceK, L::kWinK>(sk, p.k + first * p.k_row_bytes + k_head_off, (uint32_t)p.k_row_bytes,
                                               count, lane);
            copy_windows<L::kSliceV, L::kWinV>(sk + kStep * L::kWinK, p.v + first * p.v_row_bytes + v_head_off,
                                               (uint32_t)p.v_row_bytes, count, lane);
        }
        cp_async_commit();  // empty groups keep the wait count uniform
    };
    // A programmatic launch (pdl_launch.cuh): q and the step's new cell come from qkv_post.
    // The first kStages - 1 steps of every warp are copied before waiting for it when they
    // hold only settled cells (earlier steps'). That is every split but the new cell's at
    // first, and since session 38 that one too once it has more cells than its prologue
    // copies: the new cell is its last, copied in the loop, after the wait. The grid is one
    // wave (plan_for), so the split merge released here only takes SMs this grid has left.
    timeline_stamp(p, 0);
    if (p.timeline != nullptr) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        timeline_stamp(p, 9, sm, false);
    }
    const bool settled = min(cell_end, cell_begin + (L::kStages - 1) * kWarps * kStep) <= p.settled_cells;
    if (settled) {
#pragma unroll
        for (int s = 0; s < L::kStages - 1; ++s) issue(s);
    }
    pdl_wait_for_producer();
    pdl_release_dependents();
    timeline_stamp(p, 1);
    // Q's loads go ahead of the copies (q_load 1, 2): behind a split's first stages they
    // waited ~8 us (lab timeline, session 19).
    const float* q_group = p.q + (size_t)kv_head * ng * kD;
    float4 qv[8];
    if (p.q_load == 2) {
        load_q_coalesced(q_group, ng, lane, qv);
    } else if (p.q_load == 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            qv[j] = g < ng ? load_f4_in_order(q_group + g * kD + 32 * t + 4 * j) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (!settled) {
#pragma unroll
        for (int s = 0; s < L::kStages - 1; ++s) issue(s);
    }

    // Q^T as QK's B operand (k = dims, n = heads): lane (g, t) holds head g, dims 32t ..
    // 32t+31 (per-block K: the dims of k_block_fragments), pre-scaled to base-2 score units.
    // Heads past the group are zero columns.
    uint32_t qb[8][2];
    static_assert(L::stage >= 32 * 64, "Q's f16 rows fit in a ring stage");
    if constexpr (kBlockK) {  // per-block k-steps (k_block_fragments)
        if (p.q_load == 2) {
            q_block_fragments_from_coalesced<KT>(qv, p.scale_log2, lane, ring + (L::kStages - 1) * L::stage, qb);
        } else {
            const float* qg = p.q + (size_t)(kv_head * ng + g) * kD + 4 * t;
#pragma unroll
            for (int kt = 0; kt < 8; ++kt) {
                float x[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) x[i] = g < ng ? qg[16 * kt + i] * p.scale_log2 : 0.0f;
                q_block_fragment<KT>(pack_h2(x[0], x[1]), pack_h2(x[2], x[3]), qb[kt]);
            }
        }
    } else if (p.q_load == 2) {
        q_fragments_from_coalesced(qv, p.scale_log2, lane, ring + (L::kStages - 1) * L::stage, qb);
    } else if (p.q_load == 1) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            qb[j][0] = pack_h2(qv[j].x * p.scale_log2, qv[j].y * p.scale_log2);
            qb[j][1] = pack_h2(qv[j].z * p.scale_log2, qv[j].w * p.scale_log2);
        }
    } else {
        float x[32];
        const float* qg = p.q + (size_t)(kv_head * ng + g) * kD + 32 * t;
#pragma unroll
        for (int i = 0; i < 32; ++i) x[i] = g < ng ? qg[i] * p.scale_log2 : 0.0f;
#pragma unroll
        for (int kt = 0; kt < 8; ++kt) {
            qb[kt][0] = pack_h2(x[4 * kt], x[4 * kt + 1]);
            qb[kt][1] = pack_h2(x[4 * kt + 2], x[4 * kt + 3]);
        }
    }

    float* const k_bias_area = reinterpret_cast<float*>(smem + L::bias_offset) + warp * 32;
    if constexpr (kBlockK) k_bias_starts<KT>(qb, g, t, k_bias_area);
    // Every warp built the same fragments; warp w stores group w (uint4 w of each lane's 16
    // words), group-major so that one ld.shared.v4 per group is conflict-free.
    const uint32_t q_area = (uint32_t)__cvta_generic_to_shared(smem + L::q_offset);
    if constexpr (L::kQSmem) {
        uint4* area = reinterpret_cast<uint4*>(smem + L::q_offset);
#pragma unroll
        for (uint32_t w = 0; w < 4; ++w)
            if (warp == w) area[w * 32 + lane] = make_uint4(qb[2 * w][0], qb[2 * w][1], qb[2 * w + 1][0], qb[2 * w + 1][1]);
        __syncthreads();
    }
    timeline_stamp(p, 2);

    // Per head 2t and 2t+1 (columns of S^T and O^T): running max and this lane's share of
    // the sum; acc[mt] = O^T rows (dims) 16g + 2mt (regs 0, 1) and 16g + 2mt + 1 (2, 3).
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float acc[8][4];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
    // q4_0 V's exponent bytes (low nibbles, high nibbles), kept in registers for one-LOP3 codes.
    uint32_t q4_magic[2];
    asm volatile("mov.b32 %0, 0x64006400;\n" : "=r"(q4_magic[0]));
    asm volatile("mov.b32 %0, 0x54005400;\n" : "=r"(q4_magic[1]));

    for (uint32_t i = 0; warp + kWarps * i < n_chunks; ++i) {
        issue(i + L::kStages - 1);
        cp_async_wait<L::kStages - 1>();
        __syncwarp();
        if (i == 0) timeline_stamp(p, 3);
        const uint8_t* sk = ring + (i % L::kStages) * L::stage;
        const uint8_t* sv = sk + kStep * L::kWinK;
        const uint32_t first = cell_begin + (warp + kWarps * i) * kStep;
        const uint32_t valid = min((uint32_t)kStep, cell_end - first);

        // A cell's slice: its window in the stage plus its lead (the same for every cell when
        // rows are whole 16-byte chunks).
        auto k_slice = [&](uint32_t c) {
            if constexpr (kUniform) return c * L::kWinK + k_head16;
            else return c * L::kWinK + (((first + c) * k_row16 + k_head16) & 15);
        };
        auto v_slice = [&](uint32_t c) {
            if constexpr (kUniform) return c * L::kWinV + v_head16;
            else return c * L::kWinV + (((first + c) * v_row16 + v_head16) & 15);
        };
        float s[4];
        {
            uint32_t qs[8][2];
            step_q_fragments<L::kQSmem>(qb, q_area, lane, qs);
            qk_step<KT, kBlockK>(sk, k_slice, g, t, qs, k_bias_area, s);
        }
        float alpha[2], e[4];
        const bool grew = online_softmax_step(s, g, valid, m_run, l_run, alpha, e);
        // Once the running maxima settle, most steps leave them unchanged: alpha = 1 exactly
        // for every head of the warp, and the 32 multiplies are skipped.
        if (__any_sync(0xffffffffu, grew)) rescale_acc(acc, alpha);
        // P^T tiles (cells x heads) transposed into PV's B operand (k = cells 2t, 2t+1 and
        // 2t+8, 2t+9; n = head g).
        const uint32_t pb0 = transpose8x8(pack_h2(e[0], e[1])), pb1 = transpose8x8(pack_h2(e[2], e[3]));
        pv_step<VT>(sv, v_slice, g, t, valid, pb0, pb1, q4_magic, acc);
        __syncwarp();  // this stage is refilled by the next step's issue
    }
    cp_async_wait<0>();
    timeline_stamp(p, 4);
    timeline_stamp(p, 7, warp < n_chunks ? (n_chunks - warp + kWarps - 1) / kWarps : 0, false);

    // Merge the block's warps (each writes m, l, acc of its heads into its own ring).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 4);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 8);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 16);
    }
    __syncthreads();  // every warp is done with its ring
    timeline_stamp(p, 5);
    write_merge_ml(ring, m_run, l_run, g, t);
    write_merge_acc<VT>(ring, acc, g, t);
    __syncthreads();
    timeline_stamp(p, 8);
    write_block_partial<kWarps, kThreads>(p, smem, L::warp_bytes, kv_head, split, tid);
    timeline_stamp(p, 6);
    attention_finish_single_split<kD>(p, kv_head);
}

// The warp-specialized variant (lab: SPILLWAY_ATTN_WS=1|2, or lab_warp_specialized(4|8)).
// Why: the quantized loops above are latency-bound (session 22, Nsight: q8_0 issues in 45% of
// the cycles at 3.8 warps per scheduler; every step is one dependent chain ring -> K -> QK MMAs
// -> max shuffles -> exp -> transposes -> V -> PV MMAs), and the registers of one warp holding
// Q, K words, S, P and all of O cap the warps per SM. Here a block runs kS streams of
// steps; stream s takes the chunks s + kS i of the split, as warp s does above, and is two
// warps: a QK warp (K ring, Q, S, the online max and sum) that hands each step's P^T and
// per-head alpha to a PV warp (V ring, O) through a small shared ring with two mbarriers per
// slot. Each warp holds about half the state, so the chain per warp is about half as long and
// (at <= 64 registers) more warps fit per SM. The values, their order and the merge are the
// single-warp kernel's, so its output is bit-equal to attention_mma_kernel's with the same plan.
// Quantized V with rows of whole 16-byte chunks (kUniform) on sm_90 only; elsewhere the launch
// falls back to the kernel above.
constexpr int kPSlots = 2;                    // steps the QK warp may run ahead of its PV warp
constexpr size_t kPSlotBytes = 32 * 16;       // per lane: pb0, pb1, alpha of heads 2t, 2t + 1
// Streams per block: 4 (as many as the single-warp kernel's warps: the same chunks per stream,
// so the same sums) or 8 (half the blocks, so half the splits and a shorter split merge; the
// chunks are dealt over 8 streams, so the partial sums group differently).
__host__ __device__ constexpr int ws_threads(int streams) { return 2 * streams * 32; }
// Launch bounds: at 4 streams 4 blocks (<= 64 registers) for quantized K and V; f16 K needs more
// registers for its words (at 64 ptxas spilled 4-56 bytes) and takes 3 (<= 85). At 8 streams
// half as many blocks. (f16 V is not launched: launch_for.)
__host__ __device__ constexpr int ws_min_blocks(KvType kt, KvType vt, int streams) {
    return (kt == KvType::f16 || vt == KvType::f16 ? 3 : 4) * 4 / streams;
}

// kBK: per-block K (k_block_fragments) for the QK warps. The single-warp kernel's choice
// (per_block_k: the mixed pairs of quantized K) by default; the lab may turn it on for equal
// quantized pairs too (SPILLWAY_ATTN_WS_BLOCK_K=1), where it cuts the QK warp's K instructions
// (~30% q8_0, ~40% q4_0, session 39) at no register cost here (64, no spills).
template <KvType KT, KvType VT, int kS, bool kBK = per_block_k(KT, VT)>
struct WsLayout {
    using L = Layout<KT, VT>;
    static constexpr int kMinBlocks = ws_min_blocks(KT, VT, kS) < 1 ? 1 : ws_min_blocks(KT, VT, kS);
    static constexpr size_t kPBytes = kS * kPSlots * kPSlotBytes;
    static constexpr size_t kBarBytes = kS * 2 * kPSlots * sizeof(uint64_t);
    // Per-block K's bias starts: 32 floats per QK warp (Layout's area holds 4 warps').
    static constexpr size_t kBiasBytes = kBK ? kS * 32 * sizeof(float) : 0;
    static constexpr size_t kFixed = kBiasBytes + L::kQBytes + kPBytes + kBarBytes + L::kSlack;
    // A stage: K windows, 16 bytes, V windows, 16 bytes. The word loads past a window's last
    // cell (ignored bytes, see Layout::kSlack) then read a pad, not the other warp's half of
    // the ring while its copies land there (compute-sanitizer racecheck saw those reads).
    static constexpr uint32_t kVPart = kStep * L::kWinK + 16;
    static constexpr size_t stage = kVPart + kStep * L::kWinV + 16;
    // Three stages where they still fit kMinBlocks blocks per SM, else two.
    static constexpr int kStages = blocks_per_sm_for(kS * 3 * stage + kFixed, kMinBlocks) >= kMinBlocks ? 3 : 2;
    static constexpr size_t stream_bytes = kStages * stage;
    static constexpr size_t bias_offset = kS * stream_bytes;
    static constexpr size_t q_offset = bias_offset + kBiasBytes;
    static constexpr size_t p_offset = q_offset + L::kQBytes;
    static constexpr size_t bar_offset = p_offset + kPBytes;
    static constexpr size_t total = bar_offset + kBarBytes + L::kSlack;
    static constexpr int blocks_per_sm =
        blocks_per_sm_for(total, kMinBlocks) < 1 ? 1 : blocks_per_sm_for(total, kMinBlocks);
    static_assert(stream_bytes >= L::merge_bytes, "merge area fits in the stream's ring");
    static_assert(stage >= 32 * 64 && stage % 16 == 0, "Q's f16 rows fit in a 16-byte-aligned ring stage");
    static_assert(p_offset % 16 == 0 && bar_offset % 8 == 0, "aligned P ring and barriers");
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The hand-over waits, bounded: a hand-over that never comes (a bug) traps instead of hanging
// the GPU (2^26 try_waits are many seconds).
// The loop is inside the asm: written in C++ around a one-shot try_wait it moved ptxas's
// register allocation (q8_0 / q8_0: 0 -> 112 spilled bytes).
__device__ __forceinline__ void ws_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        ".reg .u32 polls;\n"
        "mov.u32 polls, 0;\n"
        "WS_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@done bra WS_DONE_%=;\n"
        "add.u32 polls, polls, 1;\n"
        "setp.gt.u32 done, polls, %2;\n"
        "@done trap;\n"
        "bra WS_WAIT_%=;\n"
        "WS_DONE_%=:\n"
        "}\n" ::"r"(shared_addr(bar)),
        "r"(parity), "n"(1u << 26)
        : "memory");
}
#endif

template <KvType KT, KvType VT, int kS, bool kBK>
__global__ void __launch_bounds__(ws_threads(kS), WsLayout<KT, VT, kS, kBK>::kMinBlocks) attention_ws_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using L = Layout<KT, VT>;
    using W = WsLayout<KT, VT, kS, kBK>;
    constexpr int kStages = W::kStages;
    constexpr uint32_t kWsThreads = ws_threads(kS);
    constexpr bool kBlockK = kBK;
    static_assert(!kBK || KT != KvType::f16, "per-block K is for quantized K");
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t g = lane / 4, t = lane % 4;
    const bool qk_warp = warp < (uint32_t)kS;
    const uint32_t stream = qk_warp ? warp : warp - kS;
    uint8_t* ring = smem + stream * W::stream_bytes;
    uint4* p_ring = reinterpret_cast<uint4*>(smem + W::p_offset) + stream * kPSlots * 32;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + W::bar_offset) + stream * 2 * kPSlots;
    uint64_t* empty = full + kPSlots;

    const uint32_t kv_head = blockIdx.x, split = blockIdx.y;
    uint32_t cell_begin, cell_end;
    if (!split_cells(p, kv_head, split, cell_begin, cell_end)) {
        write_empty_partial<kWsThreads>(p, kv_head, split, tid);
        return;
    }
    const uint32_t n_chunks = (cell_end - cell_begin + kStep - 1) / kStep;
    const uint32_t ng = p.n_group;
    const uint64_t k_head_off = (uint64_t)kv_head * L::kSliceK, v_head_off = (uint64_t)kv_head * L::kSliceV;
    const uint32_t k_head16 = (uint32_t)(k_head_off & 15), v_head16 = (uint32_t)(v_head_off & 15);
    if (tid < (uint32_t)(kS * 2 * kPSlots)) mbarrier_init(reinterpret_cast<uint64_t*>(smem + W::bar_offset) + tid, 32);
    mbarrier_init_fence();

    // Each warp copies its own operand (QK warp: K, PV warp: V) into its half of the stream's
    // stages; the lane's addresses are computed once (rows of whole 16-byte chunks).
    constexpr uint32_t kLanesK = copy_lanes<L::kWinK>(), kLanesV = copy_lanes<L::kWinV>();
    const uint32_t lanes = qk_warp ? kLanesK : kLanesV, win = qk_warp ? L::kWinK : L::kWinV;
    const uint64_t row_bytes = qk_warp ? p.k_row_bytes : p.v_row_bytes;
    const uint64_t head_off = qk_warp ? k_head_off : v_head_off;
    const bool lane_on = lane % lanes < win / 16;
    const uint64_t lane_src = (uint64_t)(lane / lanes) * row_bytes + head_off - (head_off & 15) + 16 * (lane % lanes);
    const uint32_t part = qk_warp ? 0u : W::kVPart;  // the operand's place in a stage
    const uint32_t lane_dst = (uint32_t)__cvta_generic_to_shared(ring) + part + (lane / lanes) * win + 16 * (lane % lanes);
    const uint8_t* const src_base = qk_warp ? p.k : p.v;
    auto issue = [&](uint32_t i) {
        const uint32_t chunk = stream + kS * i;
        if (chunk < n_chunks) {
            const uint32_t slot = i % kStages;
            const uint32_t first = cell_begin + chunk * kStep;
            const uint32_t count = min((uint32_t)kStep, cell_end - first);
            if (qk_warp) {
                if (count == kStep) {
                    if (lane_on)
                        copy_windows_hoisted<L::kWinK, kLanesK>(lane_dst + slot * (uint32_t)W::stage,
                                                                src_base + (uint64_t)first * row_bytes + lane_src,
                                                                (32 / kLanesK) * (uint32_t)row_bytes);
                } else {
                    copy_windows<L::kSliceK, L::kWinK>(ring + slot * W::stage, p.k + first * p.k_row_bytes + k_head_off,
                                                       (uint32_t)p.k_row_bytes, count, lane);
                }
            } else {
                if (count == kStep) {
                    if (lane_on)
                        copy_windows_hoisted<L::kWinV, kLanesV>(lane_dst + slot * (uint32_t)W::stage,
                                                                src_base + (uint64_t)first * row_bytes + lane_src,
                                                                (32 / kLanesV) * (uint32_t)row_bytes);
                } else {
                    copy_windows<L::kSliceV, L::kWinV>(ring + slot * W::stage + W::kVPart,
                                                       p.v + first * p.v_row_bytes + v_head_off,
                                                       (uint32_t)p.v_row_bytes, count, lane);
                }
            }
        }
        cp_async_commit();  // empty groups keep the wait count uniform
    };
    // As attention_mma_kernel: settled splits copy their first stages before the dependency wait.
    const bool settled = min(cell_end, cell_begin + (kStages - 1) * kS * kStep) <= p.settled_cells;
    if (settled) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) issue(s);
    }
    pdl_wait_for_producer();
    pdl_release_dependents();

    // The QK warps build Q's B fragments (the last stage of their stream serves as scratch; the
    // PV warp copies into it only after the block barrier below).
    uint32_t qb[8][2];
    float* const k_bias_area = reinterpret_cast<float*>(smem + W::bias_offset) + stream * 32;
    const uint32_t q_area = (uint32_t)__cvta_generic_to_shared(smem + W::q_offset);
    if (qk_warp) {
        const float* q_group = p.q + (size_t)kv_head * ng * kD;
        float4 qv[8];
        if (p.q_load == 2) load_q_coalesced(q_group, ng, lane, qv);
        if (!settled) {
#pragma unroll
            for (int s = 0; s < kStages - 1; ++s) issue(s);
        }
        uint8_t* scratch = ring + (kStages - 1) * W::stage;
        if (p.q_load == 2) {
            if constexpr (kBlockK) q_block_fragments_from_coalesced<KT>(qv, p.scale_log2, lane, scratch, qb);
            else q_fragments_from_coalesced(qv, p.scale_log2, lane, scratch, qb);
        } else {  // q not 16-byte aligned: scalar loads in the fragments' order
            const float* qg = p.q + (size_t)(kv_head * ng + g) * kD;
#pragma unroll
            for (int kt = 0; kt < 8; ++kt) {
                float x[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    // per-block K: dims 16 kt + 4t + i; otherwise 32t + 4kt + i (k_fragment's order)
                    const uint32_t d = kBlockK ? 16 * kt + 4 * t + i : 32 * t + 4 * kt + i;
                    x[i] = g < ng ? qg[d] * p.scale_log2 : 0.0f;
                }
                if constexpr (kBlockK) {
                    q_block_fragment<KT>(pack_h2(x[0], x[1]), pack_h2(x[2], x[3]), qb[kt]);
                } else {
                    qb[kt][0] = pack_h2(x[0], x[1]);
                    qb[kt][1] = pack_h2(x[2], x[3]);
                }
            }
        }
        if constexpr (kBlockK) k_bias_starts<KT>(qb, g, t, k_bias_area);
        if constexpr (L::kQSmem) {
            uint4* area = reinterpret_cast<uint4*>(smem + W::q_offset);
#pragma unroll
            for (uint32_t w = 0; w < 4; ++w)
                if (warp == w) area[w * 32 + lane] = make_uint4(qb[2 * w][0], qb[2 * w][1], qb[2 * w + 1][0], qb[2 * w + 1][1]);
        }
    } else if (!settled) {
#pragma unroll
        for (int s = 0; s < kStages - 1; ++s) issue(s);
    }
    __syncthreads();  // barriers initialized, Q area written, scratch stages free

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float acc[8][4];
    if (qk_warp) {
        for (uint32_t i = 0; stream + kS * i < n_chunks; ++i) {
            issue(i + kStages - 1);
            cp_async_wait<kStages - 1>();
            __syncwarp();
            const uint8_t* sk = ring + (i % kStages) * W::stage;
            const uint32_t first = cell_begin + (stream + kS * i) * kStep;
            const uint32_t valid = min((uint32_t)kStep, cell_end - first);
            auto k_slice = [&](uint32_t c) { return c * L::kWinK + k_head16; };
            float s[4];
            {
                uint32_t qs[8][2];
                step_q_fragments<L::kQSmem>(qb, q_area, lane, qs);
                qk_step<KT, kBlockK>(sk, k_slice, g, t, qs, k_bias_area, s);
            }
            float alpha[2], e[4];
            online_softmax_step(s, g, valid, m_run, l_run, alpha, e);
            const uint32_t pb0 = transpose8x8(pack_h2(e[0], e[1])), pb1 = transpose8x8(pack_h2(e[2], e[3]));
            const uint32_t ps = i % kPSlots;
            if (i >= (uint32_t)kPSlots) ws_wait(empty + ps, (i / kPSlots - 1) & 1);
            p_ring[ps * 32 + lane] = make_uint4(pb0, pb1, __float_as_uint(alpha[0]), __float_as_uint(alpha[1]));
            mbarrier_arrive(full + ps);
            __syncwarp();  // this stage is refilled by the next step's issue
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 4);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 8);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 16);
        }
    } else {
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
        uint32_t q4_magic[2];
        asm volatile("mov.b32 %0, 0x64006400;\n" : "=r"(q4_magic[0]));
        asm volatile("mov.b32 %0, 0x54005400;\n" : "=r"(q4_magic[1]));
        for (uint32_t i = 0; stream + kS * i < n_chunks; ++i) {
            issue(i + kStages - 1);
            cp_async_wait<kStages - 1>();
            __syncwarp();
            const uint8_t* sv = ring + (i % kStages) * W::stage + W::kVPart;
            const uint32_t first = cell_begin + (stream + kS * i) * kStep;
            const uint32_t valid = min((uint32_t)kStep, cell_end - first);
            auto v_slice = [&](uint32_t c) { return c * L::kWinV + v_head16; };
            const uint32_t ps = i % kPSlots;
            ws_wait(full + ps, (i / kPSlots) & 1);
            const uint4 hand = p_ring[ps * 32 + lane];
            mbarrier_arrive(empty + ps);
            const float alpha[2] = {__uint_as_float(hand.z), __uint_as_float(hand.w)};
            // alpha is exactly 1 for a head whose max did not grow: the same skip as above.
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale_acc(acc, alpha);
            pv_step<VT>(sv, v_slice, g, t, valid, hand.x, hand.y, q4_magic, acc);
            __syncwarp();  // this stage is refilled by the next step's issue
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // both warps of every stream are done with its ring
    if (qk_warp) write_merge_ml(ring, m_run, l_run, g, t);
    else write_merge_acc<VT>(ring, acc, g, t);
    __syncthreads();
    write_block_partial<kS, kWsThreads>(p, smem, W::stream_bytes, kv_head, split, tid);
    attention_finish_single_split<kD>(p, kv_head);
#else
    __trap();  // launched only on sm_90 (ws_runs_here)
#endif
}

// SPILLWAY_ATTN_MMA_BLOCKS=N (lab): plan the splits for N blocks per SM instead of the
// resident count (more than resident: several waves). 0 or unset: the resident count.
uint32_t lab_blocks_per_sm() {
    static const uint32_t n = lab_knob_uint("SPILLWAY_ATTN_MMA_BLOCKS", 0, 64);
    return n;
}

// SPILLWAY_ATTN_WHOLE_WAVES=1 (lab): Plan's whole-wave split counts where the cells allow.
bool lab_whole_waves() {
    static const bool on = lab_knob("SPILLWAY_ATTN_WHOLE_WAVES", "1", "0");
    return on;
}

// The warp-specialized kernel's switch (lab_warp_specialized): -1 follows SPILLWAY_ATTN_WS.
std::atomic<int> g_ws_mode{-1};  // -1, or 0 (off), 4 or 8 (streams per block)
std::atomic<uint64_t> g_ws_launches{0};
// Streams per block forced for every quantized-V pair at any range (0: the single-warp kernel),
// or -1 for the default (ws_streams_for).
int ws_forced_streams() {
    const int mode = g_ws_mode.load(std::memory_order_relaxed);
    if (mode >= 0) return mode;
    static const int knob = [] {
        // unset: the default; 0: off; 1: 4 streams; 2: 8 streams (every quantized-V pair)
        const uint32_t v = lab_knob_uint("SPILLWAY_ATTN_WS", 3, 2);
        return v == 3 ? -1 : v == 0 ? 0 : v == 1 ? 4 : 8;
    }();
    return knob;
}
// By default the equal quantized pairs run the warp-specialized kernel at 8 streams from this
// many cells (session 56, H100, engine A/B against the single-warp kernel, docs/perf-notes.md:
// q8_0 / q8_0 +1.2% and q4_0 / q4_0 +1.4..1.6% at 65536 cells). SPILLWAY_ATTN_WS_MIN_CELLS
// (lab) moves the threshold for a sweep.
uint32_t ws_default_min_cells() {
    static const uint32_t n = lab_knob_uint("SPILLWAY_ATTN_WS_MIN_CELLS", kWarpSpecializedMinCells, 1u << 30);
    return n;
}
// Streams per block of the warp-specialized kernel for this pair over n_cells, 0 for the
// single-warp kernel. Eight streams by default: the same warps per SM as four, but half the
// blocks, so half the splits and a shorter merge (+1% against four at 64k). The mixed pairs were
// not measured in the engine and keep the single-warp kernel unless forced.
template <KvType KT, KvType VT>
int ws_streams_for(uint32_t n_cells) {
    const int forced = ws_forced_streams();
    if (forced >= 0) return forced;
    return KT != KvType::f16 && KT == VT && n_cells >= ws_default_min_cells() ? 8 : 0;
}
std::atomic<int> g_ws_block_k{-1};  // -1 (as SPILLWAY_ATTN_WS_BLOCK_K), 0 or 1
bool ws_block_k() {
    const int mode = g_ws_block_k.load(std::memory_order_relaxed);
    if (mode >= 0) return mode != 0;
    static const bool knob = lab_knob("SPILLWAY_ATTN_WS_BLOCK_K", "1", "0");
    return knob;
}
// Its code exists for sm_90 only (mbarrier waits; elsewhere the body is a trap): the variant
// runs where the kernel that would launch was compiled for sm_90 (a build without a 90 target,
// or a newer GPU running JIT-compiled older PTX, keeps the single-warp kernel). No CUDA error
// escapes: plan() asks this too, also where no GPU is usable.
bool ws_runs_here() {
    static const bool yes = [] {
        cudaFuncAttributes attr{};
        if (cudaFuncGetAttributes(&attr, attention_ws_kernel<KvType::q8_0, KvType::q8_0, 4, false>) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        return attr.binaryVersion == 90;
    }();
    return yes;
}
// SPILLWAY_ATTN_FAST_COPY=0 (lab): every step through the generic per-cell copy.
bool fast_copy_on() {
    static const bool on = !lab_knob("SPILLWAY_ATTN_FAST_COPY", "0", "1");
    return on;
}
// Whether a launch of this pair runs the warp-specialized kernel, for plan and launch alike:
// quantized V, the knob on, rows of whole 16-byte chunks (every cell of a head at the same
// lead) and sm_90 code. (The lab timeline keeps the single-warp kernel at launch only.)
template <KvType KT, KvType VT>
bool ws_launches(uint64_t k_row_bytes, uint64_t v_row_bytes, uint32_t n_cells) {
    return VT != KvType::f16 && ws_streams_for<KT, VT>(n_cells) != 0 && fast_copy_on() && k_row_bytes % 16 == 0 &&
           v_row_bytes % 16 == 0 && ws_runs_here();
}

// Blocks per SM the splits are planned for: as many as fit, except quantized K with q4_0 V up
// to 16384 cells, where half of them measured faster in the engine (fewer splits shorten the
// merge). Session 20 (before V's scale went into P) had q4_0 / q4_0 at 2 blocks up to 64k;
// re-measured in session 21 (tok/s, 2 -> 4 blocks): q4_0 / q4_0 8k 187.9 -> 185.9, 16k 180.3 ->
// 180.1, 32k 167.4 -> 170.0; q8_0 / q4_0 8k 185.3 -> 183.8, 16k 177.1 -> 177.3; q8_0 / q8_0 8k
// 178.4 -> 180.8, 16k 167.2 -> 172.5 (so q8_0 V keeps every block).
template <KvType KT, KvType VT>
uint32_t planned_blocks_per_sm(uint32_t n_head_kv, uint32_t n_cells) {
    if (KT != KvType::f16 && VT == KvType::q4_0 && n_cells <= 16384) return 2;
    // The warp-specialized kernel's where it will run (ws_launches). Per-block K's bias area does
    // not change its resident blocks (static_assert in configure_ws_once).
    if (ws_launches<KT, VT>((uint64_t)n_head_kv * slice_bytes(KT, kD), (uint64_t)n_head_kv * slice_bytes(VT, kD), n_cells))
        return (uint32_t)(ws_streams_for<KT, VT>(n_cells) == 4 ? WsLayout<KT, VT, 4>::blocks_per_sm
                                                              : WsLayout<KT, VT, 8>::blocks_per_sm);
    return (uint32_t)Layout<KT, VT>::blocks_per_sm;
}

template <KvType KT, KvType VT>
Plan plan_for(uint32_t n_head_kv, uint32_t n_cells, uint32_t sm_count) {
    if (n_cells == 0) return {0, 0};
    const uint32_t per_sm = lab_blocks_per_sm() > 0 ? lab_blocks_per_sm() : planned_blocks_per_sm<KT, VT>(n_head_kv, n_cells);
    if (lab_whole_waves()) {
        // The per-SM timeline (session 19) showed 392 or 512 blocks on 396 or 528 slots; filling
        // them exactly moved the engine by under 1% (SM speed, not placement, sets the tail).
        const uint32_t slots = per_sm * std::max(1u, sm_count), lo = slots / n_head_kv, hi_heads = slots % n_head_kv;
        const uint32_t n_steps = (n_cells + kStep - 1) / kStep, hi = lo + (hi_heads > 0 ? 1 : 0);
        if (lo >= 2 && n_steps / kWarps >= hi) {  // a step per warp in every split
            Plan pl{hi, ((n_steps + lo - 1) / lo) * kStep};
            pl.splits_lo = lo, pl.splits_hi = hi, pl.hi_heads = hi_heads;
            return pl;
        }
    }
    const uint32_t wanted = std::max(1u, per_sm * std::max(1u, sm_count) / n_head_kv);
    const uint32_t min_cells = kStep * kWarps;  // a step per warp
    const uint32_t splits = std::min(wanted, (n_cells + min_cells - 1) / min_cells);
    const uint32_t per = ((n_cells + splits - 1) / splits + kStep - 1) / kStep * kStep;
    return {(n_cells + per - 1) / per, per};
}

template <KvType KT, KvType VT, bool kUniform>
void configure_once() {
    static const bool configured = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<KT, VT, kUniform>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)Layout<KT, VT>::total));
        // All of the unified L1/shared memory as shared: the split count assumes
        // Layout::blocks_per_sm blocks fit at once (a smaller carveout makes a second wave).
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<KT, VT, kUniform>,
                                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 (int)cudaSharedmemCarveoutMaxShared));
        return true;
    }();
    (void)configured;
}

template <KvType KT, KvType VT, int kS, bool kBK>
void configure_ws_once() {
    static_assert(WsLayout<KT, VT, kS, kBK>::blocks_per_sm == WsLayout<KT, VT, kS>::blocks_per_sm,
                  "plan_for plans the default variant's resident blocks");
    static const bool configured = [] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_ws_kernel<KT, VT, kS, kBK>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)WsLayout<KT, VT, kS, kBK>::total));
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(attention_ws_kernel<KT, VT, kS, kBK>,
                                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 (int)cudaSharedmemCarveoutMaxShared));
        return true;
    }();
    (void)configured;
}

template <KvType KT, KvType VT, int kS, bool kBK>
void launch_ws(const Params& p, dim3 grid, cudaStream_t stream) {
    configure_ws_once<KT, VT, kS, kBK>();
    launch_with_pdl(pdl_site_on(PdlSite::attention), attention_ws_kernel<KT, VT, kS, kBK>, grid,
                    dim3(ws_threads(kS)), WsLayout<KT, VT, kS, kBK>::total, stream, p);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    g_ws_launches.fetch_add(1, std::memory_order_relaxed);
}

// SPILLWAY_ATTN_Q_LOAD (lab): scalar (per-lane loads after the copies, as before session
// 19), vec (per-lane 16-byte loads ahead of them) or coalesced (the default).
uint32_t lab_q_load() {
    // The index is Params::q_load's mode.
    static const int mode = lab_knob_choice("SPILLWAY_ATTN_Q_LOAD", {"scalar", "vec", "coalesced"});
    return mode < 0 ? 2u : (uint32_t)mode;
}

template <KvType KT, KvType VT>
void launch_for(const Params& params, uint32_t n_head_kv, uint32_t n_splits, cudaStream_t stream) {
    constexpr size_t smem = Layout<KT, VT>::total;
    Params p = params;
    p.q_load = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 ? lab_q_load() : 0;
    const dim3 grid(n_head_kv, n_splits);
    const bool uniform = fast_copy_on() && p.k_row_bytes % 16 == 0 && p.v_row_bytes % 16 == 0;
    // The lab timeline's stamps are the single-warp kernel's (it keeps running where they are asked for).
    // Not for f16 V: its 32 V words per lane make the PV warp spill at 4 streams (44-48 bytes),
    // and f16 K and V already read HBM at ~92% of its rate at 64k in the single-warp kernel.
    if constexpr (VT != KvType::f16) {
        if (ws_launches<KT, VT>(p.k_row_bytes, p.v_row_bytes, p.n_cells) && p.timeline == nullptr) {
            if (p.q_load == 1) p.q_load = 0;  // the variant loads Q coalesced or by scalars
            const bool four = ws_streams_for<KT, VT>(p.n_cells) == 4;
            constexpr bool kDefaultBK = per_block_k(KT, VT);
            if constexpr (KT != KvType::f16 && KT == VT) {  // equal quantized pairs: the lab may turn per-block K on
                if (ws_block_k()) {
                    if (four) launch_ws<KT, VT, 4, true>(p, grid, stream);
                    else launch_ws<KT, VT, 8, true>(p, grid, stream);
                    return;
                }
            }
            if (four) launch_ws<KT, VT, 4, kDefaultBK>(p, grid, stream);
            else launch_ws<KT, VT, 8, kDefaultBK>(p, grid, stream);
            return;
        }
    }
    if (uniform) {
        configure_once<KT, VT, true>();
        launch_with_pdl(pdl_site_on(PdlSite::attention), attention_mma_kernel<KT, VT, true>, grid, dim3(kThreads),
                        smem, stream, p);
    } else {
        configure_once<KT, VT, false>();
        launch_with_pdl(pdl_site_on(PdlSite::attention), attention_mma_kernel<KT, VT, false>, grid, dim3(kThreads),
                        smem, stream, p);
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

// Calls f.template operator()<KT, VT>() for the runtime pair (one instance per pair).
template <typename F>
auto with_types(KvType kt, KvType vt, F&& f) {
    auto v_of = [&]<KvType KT>() {
        switch (vt) {
            case KvType::f16: return f.template operator()<KT, KvType::f16>();
            case KvType::q8_0: return f.template operator()<KT, KvType::q8_0>();
            default: return f.template operator()<KT, KvType::q4_0>();
        }
    };
    switch (kt) {
        case KvType::f16: return v_of.template operator()<KvType::f16>();
        case KvType::q8_0: return v_of.template operator()<KvType::q8_0>();
        default: return v_of.template operator()<KvType::q4_0>();
    }
}

}  // namespace

uint32_t resident_blocks_per_sm(KvType k_type, KvType v_type) {
    return with_types(k_type, v_type, [&]<KvType KT, KvType VT>() { return (uint32_t)Layout<KT, VT>::blocks_per_sm; });
}

void lab_warp_specialized(int streams, int block_k) {
    g_ws_mode.store(streams < 0 ? -1 : streams == 4 || streams == 8 ? streams : 0, std::memory_order_relaxed);
    g_ws_block_k.store(block_k < 0 ? -1 : block_k != 0 ? 1 : 0, std::memory_order_relaxed);
}
uint64_t lab_warp_specialized_launches() { return g_ws_launches.load(std::memory_order_relaxed); }

int warp_specialized_streams(KvType k_type, KvType v_type, uint64_t k_row_bytes, uint64_t v_row_bytes,
                             uint32_t n_cells) {
    return with_types(k_type, v_type, [&]<KvType KT, KvType VT>() {
        return ws_launches<KT, VT>(k_row_bytes, v_row_bytes, n_cells) ? ws_streams_for<KT, VT>(n_cells) : 0;
    });
}

Plan plan(KvType k_type, KvType v_type, uint32_t n_head_kv, uint32_t n_cells, uint32_t sm_count) {
    return with_types(k_type, v_type, [&]<KvType KT, KvType VT>() { return plan_for<KT, VT>(n_head_kv, n_cells, sm_count); });
}

void launch(KvType k_type, KvType v_type, const Params& p, uint32_t n_head_kv, uint32_t n_splits,
            cudaStream_t stream) {
    with_types(k_type, v_type, [&]<KvType KT, KvType VT>() { launch_for<KT, VT>(p, n_head_kv, n_splits, stream); });
}

}  // namespace spillway::attention_mma
