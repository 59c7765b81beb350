// The persistent per-layer decode kernel (decode_layer.cuh).
//
// Floors, written before the kernel (Qwen2.5-14B layer, HBM read ~4.5 TB/s measured):
// bytes wo 27.9 MB + gate|up 150.4 + down 75.2 + qkv 39.0 = 292.5 MB -> 65 us; flops ~0.6 G
// integer MACs (dp2a) -> far below any compute rate. The separate launches take ~88 us of
// GEMVs + ~12 us of small kernels per layer (perf-notes, session 11).
//
// Block: 16 warps, one block per SM. Each warp streams its share of every phase's chunks
// (row pairs x kChunkPairs block pairs of 68 bytes) through its own ring in shared memory,
// and the stream does not stop at a phase's end: while a warp waits at the grid barrier and
// builds the next x, its ring fills with its first chunks of the next phase. The x prologues
// load their f32 inputs straight into registers (one L2 round trip), so no weight copy waits
// behind them and they never wait behind weight copies in a cp.async group.
//
// Measured (docs/perf-notes.md, session 25; 14B layer, us): the ring does fill across the
// barrier (all 5 TMA chunks per warp have landed when x is ready), yet a phase's weight loop
// is no shorter than without it (gate|up ~35 us either way, ~3.5 TB/s for what is left after
// the prefetch): the layer takes 98-105 us with every ring below, against ~88 for the four
// separate GEMVs. 20 warps per block, 4-row units (r4) and chunks claimed at run time inside
// a block (branch decode-layer-claim) each traded faster loops for more skew or the reverse.
// The default ring is bulk copies (TMA, one lane issues, an mbarrier per slot) of 16 block
// pairs x 5 slots with x quantized by a reciprocal multiply (98.5 us).
// Bulk copies cost a fixed ~15 ns each at the SM's TMA unit: 544-byte copies streamed 22 KB
// per us per SM, 2176-byte ones 34 (8 x 11 and 12 x 7 rings: 111-129 us per layer).
//
// History: session 15 measured one TMA producer per block feeding 16 consumer warps through
// shared stages (119-152 us per layer: per-stage block / group barriers and cross-warp
// partial sums doubled the instructions per byte), then per-warp cp.async rings within a
// phase (100 us). An L2 look-ahead (bulk prefetches 2-8 chunks ahead of the ring) made the
// loops 10-40% slower (session 25).
#include "engine/cuda/decode_layer.cuh"

#include <cuda/atomic>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/bulk_copy_device.cuh"
#include "engine/cuda/cp_async_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/lab_knob.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/q8_0_q16_device.cuh"

namespace spillway {
namespace {

constexpr int kWarps = kDecodeLayerWarps;
constexpr int kThreads = kWarps * 32;
// Rows per warp unit (one x load serves them all; swiglu_pairs: half gate rows, half up rows):
// 2, or 4 (lab); the hand-over slots hold up to kMaxUnitRows partial sums per warp.
constexpr int kMaxUnitRows = 4;
constexpr uint32_t kMaxCols = 14336;
constexpr uint32_t kUnitCols = 256;  // columns of one warp step (4 block pairs)
// The x prologue: each warp quantizes 4 blocks of 32 at a time (8 lanes per block), so a
// thread holds at most kXSteps float4 of each input.
constexpr uint32_t kXSteps = kMaxCols / 32 / (kWarps * 4);
static_assert(kMaxCols / 32 % (kWarps * 4) == 0, "whole x steps");
static_assert(2 + 3 * kDecodeMaxPhases + 2 * kDecodeMaxPhases * kWarps <= kDecodeTimelineSlots,
              "a block's timeline holds its stamps and its ring records");

// Set where the kernel below is compiled for sm_90 (read by the host once): a build without
// sm_90 code runs PTX JIT-compiled from an older architecture, where the kernel is a stub.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ const int kDecodeLayerCompiled = 1;
constexpr uint64_t kSpinLimit = 1ull << 28;  // polls (seconds) before a spin gives up
#else
__device__ const int kDecodeLayerCompiled = 0;
#endif

// Shared memory: rings [warp][slot][row][chunk] | mbarriers [warp][slot] | x q (int16) |
// x d (f32) | reduce | shares.
template <uint32_t kChunkPairs, uint32_t kSlots, int kUnitRows>
struct RingLayout {
    static constexpr uint32_t chunk_bytes = kChunkPairs * 68;  // one row's part of a chunk
    static constexpr uint32_t slot_bytes = kUnitRows * chunk_bytes;
    static constexpr size_t ring_bytes = (size_t)kWarps * kSlots * slot_bytes;
    static constexpr size_t bar_offset = ring_bytes;
    static constexpr size_t xq_offset = bar_offset + (size_t)kWarps * kSlots * sizeof(uint64_t);
    static constexpr size_t xd_offset = xq_offset + (size_t)kMaxCols * 2;
    static constexpr size_t red_offset = xd_offset + (size_t)kMaxCols / 32 * 4;
    static constexpr size_t share_offset = red_offset + 32 * 4;  // [warp][phase] WarpShare, computed once
    static constexpr size_t smem_bytes = share_offset + (size_t)kWarps * kDecodeMaxPhases * 32;
    // Bulk copies move multiples of 16 bytes between 16-byte aligned addresses: a chunk is
    // whole 4-pair steps (272 bytes), and rows of cols % 256 == 0 are multiples of 272 bytes.
    static_assert(kChunkPairs % 4 == 0 && chunk_bytes % 16 == 0, "chunks of whole 4-pair steps");
    static_assert(smem_bytes <= 227 * 1024, "one block per SM within sm_90's 227 KB");
};

// One warp's share of a phase: chunks [c0, c1) of the phase's row groups (kUnitRows rows) x
// chunks (cpr per group), split by chunks when that shortens the busiest warp, else by whole
// groups. A group cut between warps is summed by the warp holding its first chunk, which adds
// the later warps' parts in warp order (results do not depend on timing).
struct WarpShare {
    uint32_t ppr, cpr, row_bytes, c0, c1, total;  // total: the phase's chunks (by chunks) or 0
    bool starts_cut;
};
static_assert(sizeof(WarpShare) <= 32, "the layout reserves 32 bytes per share");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <uint32_t kChunkPairs, int kUnitRows>
__device__ __forceinline__ WarpShare warp_share(const DecodeGemvPhase& ph, uint32_t gw, uint32_t n_warps) {
    WarpShare s;
    s.ppr = ph.cols / 64;
    s.cpr = (s.ppr + kChunkPairs - 1) / kChunkPairs;
    s.row_bytes = s.ppr * 68;
    // swiglu_pairs: rows = 2n, groups of kUnitRows / 2 gate rows with their up rows: the same count.
    const uint32_t n_groups = (ph.rows + kUnitRows - 1) / kUnitRows, total = n_groups * s.cpr;
    const uint64_t busiest_by_groups = (uint64_t)(n_groups + n_warps - 1) / n_warps * s.cpr;
    const uint64_t busiest_by_chunks = ((uint64_t)total + n_warps - 1) / n_warps;
    if (busiest_by_chunks < busiest_by_groups) {
        s.total = total;
        s.c0 = (uint32_t)((uint64_t)gw * total / n_warps);
        s.c1 = (uint32_t)((uint64_t)(gw + 1) * total / n_warps);
    } else {
        s.total = 0;
        s.c0 = (uint32_t)((uint64_t)gw * n_groups / n_warps) * s.cpr;
        s.c1 = (uint32_t)((uint64_t)(gw + 1) * n_groups / n_warps) * s.cpr;
    }
    s.starts_cut = s.c0 % s.cpr != 0 && s.c1 > s.c0;
    return s;
}

// All blocks of the grid (all resident: one per SM). words[0] counts arrivals, words[1] is
// the generation; the last arrival resets the count and bumps the generation, so the words
// are ready for the next barrier and the next launch. The fences publish every consumer's
// global writes before the arrival (the pattern of cooperative groups' grid sync).
__device__ void grid_barrier(uint32_t* words, uint32_t n_blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device> count(words[0]), gen(words[1]);
        const uint32_t g = gen.load(cuda::memory_order_relaxed);  // can only move after our arrival
        __threadfence();
        if (count.fetch_add(1, cuda::memory_order_acq_rel) == n_blocks - 1) {
            count.store(0, cuda::memory_order_relaxed);
            gen.store(g + 1, cuda::memory_order_release);
        } else {
            // Every block of the grid must be resident: one that never arrives would leave
            // the others spinning forever, so a barrier that takes seconds stops the kernel
            // with an error instead (e.g. another process holding SMs, two decodes at once).
            uint64_t polls = 0;
            while (gen.load(cuda::memory_order_acquire) == g) {
                if (++polls > kSpinLimit) __trap();
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// x of phase p into shared memory (q int16, d f32 per 32 values), by the whole block. The
// f32 inputs (at most kXSteps float4 of each per thread) are all loaded into registers
// before any is used: one L2 round trip (__ldcg: coherent with the other SMs' writes before
// the grid barrier). Each warp quantizes 4 blocks at a time, 8 lanes per block with 4 values
// each (the rounding of act_quant.cuh).
template <bool kFastQuant>
__device__ void load_x(const DecodeLayerArgs& a, const DecodeGemvPhase& ph, int16_t* xq, float* xd, float* red) {
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const uint32_t cols = ph.cols, n_blocks = cols / 32;
    if (ph.x == DecodeX::act_q16) {
        const uint32_t q_vecs = cols * 2 / 16, d_vecs = n_blocks * 4 / 16;  // cols % 256 == 0
        for (uint32_t i = tid; i < q_vecs; i += kThreads)
            reinterpret_cast<uint4*>(xq)[i] = __ldcg(reinterpret_cast<const uint4*>(a.x_q16.q) + i);
        for (uint32_t i = tid; i < d_vecs; i += kThreads)
            reinterpret_cast<uint4*>(xd)[i] = __ldcg(reinterpret_cast<const uint4*>(a.x_q16.d) + i);
        return;
    }
    const bool one_input = ph.x == DecodeX::f32;
    const float* first = ph.x == DecodeX::swiglu ? ph.gate_up : one_input ? ph.x_f32 : a.stream;
    const float* second = ph.x == DecodeX::swiglu ? ph.gate_up + cols : ph.norm_weight;
    const uint32_t group_block = lane / 8, in_block = 4 * (lane % 8);
    const auto block_of = [&](uint32_t step) { return warp * 4 + group_block + step * kWarps * 4; };
    float4 v[kXSteps], u[kXSteps];
#pragma unroll
    for (uint32_t step = 0; step < kXSteps; ++step) {
        const uint32_t b = block_of(step);
        v[step] = u[step] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (b < n_blocks) {
            v[step] = __ldcg(reinterpret_cast<const float4*>(first + b * 32 + in_block));
            if (!one_input) u[step] = __ldcg(reinterpret_cast<const float4*>(second + b * 32 + in_block));
        }
    }
    float inv_rms = 1.0f;
    if (ph.x == DecodeX::stream_rmsnorm) {
        // out = (x * inv_rms) * w, inv_rms = 1 / sqrt(mean(x^2) + eps), as rmsnorm.cu.
        float sum = 0.0f;
#pragma unroll
        for (uint32_t step = 0; step < kXSteps; ++step) {
            sum = fmaf(v[step].x, v[step].x, sum);
            sum = fmaf(v[step].y, v[step].y, sum);
            sum = fmaf(v[step].z, v[step].z, sum);
            sum = fmaf(v[step].w, v[step].w, sum);
        }
        sum = warp_sum(sum);
        if (lane == 0) red[warp] = sum;
        __syncthreads();
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total += red[w];  // the same order in every thread
        inv_rms = rsqrtf(total / (float)cols + a.eps);
    }
#pragma unroll
    for (uint32_t step = 0; step < kXSteps; ++step) {
        const uint32_t b = block_of(step);
        if (b >= n_blocks) continue;  // whole 8-lane groups in or out
        float4 x = v[step];
        const float4 w = u[step];
        if (ph.x == DecodeX::stream_rmsnorm)
            x = make_float4(x.x * inv_rms * w.x, x.y * inv_rms * w.y, x.z * inv_rms * w.z, x.w * inv_rms * w.w);
        else if (ph.x == DecodeX::swiglu)
            x = make_float4(silu_times(x.x, w.x), silu_times(x.y, w.y), silu_times(x.z, w.z), silu_times(x.w, w.w));
        if constexpr (kFastQuant) quantize_act_q16_group_rcp(x, lane, xq + b * 32 + in_block, xd + b);
        else quantize_act_q16_group(x, lane, xq + b * 32 + in_block, xd + b);
    }
}

// Row r of the phase's row group g: consecutive rows (the last repeated past the end), or
// swiglu_pairs' gate rows g * h .. g * h + h - 1 then their up rows (n + the same), h = kUnitRows / 2.
template <int kUnitRows>
__device__ __forceinline__ uint32_t unit_row(const DecodeGemvPhase& ph, uint32_t g, int r) {
    if (ph.y == DecodeY::swiglu_pairs) {
        constexpr int h = kUnitRows / 2;
        const uint32_t n = ph.rows / 2, j = min(g * h + r % h, n - 1);
        return r < h ? j : n + j;
    }
    return min(kUnitRows * g + r, ph.rows - 1);
}

// A row group's totals: stored, added to the stream, or combined by SwiGLU.
template <int kUnitRows>
__device__ __forceinline__ void group_out(const DecodeLayerArgs& a, const DecodeGemvPhase& ph, uint32_t g,
                                          const float (&total)[kUnitRows]) {
    if (ph.y == DecodeY::swiglu_pairs) {
        constexpr int h = kUnitRows / 2;
#pragma unroll
        for (int i = 0; i < h; ++i) {
            const uint32_t j = g * h + i;
            if (j < ph.rows / 2) ph.out[j] = silu_times(total[i], total[h + i]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < kUnitRows; ++r) {
        const uint32_t row = kUnitRows * g + r;
        if (row >= ph.rows) continue;
        if (ph.y == DecodeY::add_to_stream) a.stream[row] = __ldcg(a.stream + row) + total[r];
        else ph.out[row] = total[r];
    }
}

// One warp's weight stream over all phases: the next chunk to copy (phase p, chunk k of its
// share), the ring slot it goes to, that slot's fill parity, and the chunks passed so far.
struct ChunkCursor {
    uint32_t p, k, slot, parity, n;
};

template <uint32_t kSlots>
__device__ __forceinline__ void advance_slot(ChunkCursor& c) {
    ++c.n;
    if (++c.slot == kSlots) {
        c.slot = 0;
        c.parity ^= 1u;
    }
}

// Moves c past finished phases to the warp's next chunk; false when there is none up to
// last_phase.
__device__ __forceinline__ bool next_chunk(const DecodeLayerArgs& a, const WarpShare* shares, ChunkCursor& c,
                                           uint32_t last_phase) {
    while (c.p < a.n_phases && c.k >= shares[c.p].c1) {
        if (++c.p < a.n_phases) c.k = shares[c.p].c0;
    }
    return c.p < a.n_phases && c.p <= last_phase;
}

// Copies the warp's next chunk into its ring slot; nothing when the warp's chunks of every
// phase up to last_phase have been issued. kBulk: a bulk copy (TMA) per row issued by lane 0,
// completed on the slot's mbarrier; else 16-byte cp.async by every lane, one commit group per
// call (an empty one past the end, so that "all but the newest kSlots - 1 groups" is always
// the next chunk).
template <uint32_t kChunkPairs, uint32_t kSlots, bool kBulk, int kUnitRows>
__device__ __forceinline__ void issue_next_chunk(const DecodeLayerArgs& a, const WarpShare* shares, ChunkCursor& c,
                                                 uint8_t* ring, uint64_t* full, uint32_t lane, uint64_t l2_policy,
                                                 uint32_t last_phase) {
    using L = RingLayout<kChunkPairs, kSlots, kUnitRows>;
    if (next_chunk(a, shares, c, last_phase)) {
        const DecodeGemvPhase& ph = a.phases[c.p];
        const WarpShare& s = shares[c.p];
        const uint32_t rp = c.k / s.cpr, ci = c.k % s.cpr;
        const uint32_t bytes = min(kChunkPairs, s.ppr - ci * kChunkPairs) * 68;
        uint8_t* dst = ring + (size_t)c.slot * L::slot_bytes;
        const uint8_t* w = static_cast<const uint8_t*>(ph.w) + (size_t)ci * L::chunk_bytes;
        if constexpr (kBulk) {
            if (lane == 0) {
                fence_proxy_async_shared();  // the warp's reads of this slot (ordered by __syncwarp) come first
                mbarrier_arrive_expect_tx(&full[c.slot], kUnitRows * bytes);
#pragma unroll
                for (int r = 0; r < kUnitRows; ++r)
                    bulk_copy_global_to_shared(dst + r * L::chunk_bytes, w + (size_t)unit_row<kUnitRows>(ph, rp, r) * s.row_bytes,
                                               bytes, &full[c.slot], l2_policy);
            }
        } else {
#pragma unroll
            for (int r = 0; r < kUnitRows; ++r) {
                const uint8_t* src = w + (size_t)unit_row<kUnitRows>(ph, rp, r) * s.row_bytes;
                for (uint32_t v = lane; v < bytes / 16; v += 32) cp_async16(dst + r * L::chunk_bytes + 16 * v, src + 16 * v);
            }
        }
        ++c.k;
        advance_slot<kSlots>(c);
    }
    if constexpr (!kBulk) cp_async_commit();
}

// A warp's part of a group cut between warps, in its hand-over slots (tagged: the high word
// marks a value present), and the adding of another warp's part (the slots left zero).
template <int kUnitRows>
__device__ __forceinline__ void publish_part(unsigned long long* carry, uint32_t gw, const float (&total)[kUnitRows]) {
#pragma unroll
    for (int r = 0; r < kUnitRows; ++r) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(carry[(size_t)gw * kMaxUnitRows + r]);
        slot.store((1ull << 32) | __float_as_uint(total[r]), cuda::memory_order_relaxed);
    }
}
template <int kUnitRows>
__device__ __forceinline__ void add_part(unsigned long long* carry, uint32_t w, float (&total)[kUnitRows]) {
#pragma unroll
    for (int r = 0; r < kUnitRows; ++r) {
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> slot(carry[(size_t)w * kMaxUnitRows + r]);
        unsigned long long v;
        uint64_t polls = 0;
        while (((v = slot.load(cuda::memory_order_relaxed)) >> 32) == 0) {
            __nanosleep(32);
            if (++polls > kSpinLimit) __trap();  // the partner warp never ran: see grid_barrier
        }
        slot.store(0ull, cuda::memory_order_relaxed);
        total[r] += __uint_as_float((uint32_t)v);
    }
}

// kAcross: the ring runs on into the next phase's chunks while the warp waits at the barrier;
// else (lab) a phase's chunks are issued only once its x is built. kFastQuant (lab): x
// quantized with a reciprocal multiply instead of act_quant's division (see load_x).
// kBound (bench only, results wrong): 1 = no grid barrier (a block syncs only its own warps
// before each x prologue), 2 = no barrier, no sync and no x prologue after the first phase.
template <uint32_t kChunkPairs, uint32_t kSlots, bool kBulk, bool kAcross, bool kFastQuant, int kUnitRows,
          int kBound = 0>
__global__ void __launch_bounds__(kThreads, 1) decode_layer_kernel(const DecodeLayerArgs a, uint32_t* barrier,
                                                                  unsigned long long* carry, uint64_t* timeline) {
    using L = RingLayout<kChunkPairs, kSlots, kUnitRows>;
    static_assert(kUnitRows % 2 == 0 && kUnitRows <= kMaxUnitRows, "swiglu_pairs splits a group into gate and up halves");
    // timeline (lab): per block, kDecodeTimelineSlots timestamps (decode_layer.cuh).
    uint64_t* tl = timeline != nullptr ? timeline + (size_t)blockIdx.x * kDecodeTimelineSlots : nullptr;
    if (tl != nullptr && threadIdx.x == 0) tl[0] = global_timer_ns();
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t gw = blockIdx.x * kWarps + warp, n_warps = gridDim.x * kWarps;
    uint8_t* ring = smem + (size_t)warp * kSlots * L::slot_bytes;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::bar_offset) + (size_t)warp * kSlots;
    int16_t* xq = reinterpret_cast<int16_t*>(smem + L::xq_offset);
    float* xd = reinterpret_cast<float*>(smem + L::xd_offset);
    float* red = reinterpret_cast<float*>(smem + L::red_offset);
    WarpShare* shares = reinterpret_cast<WarpShare*>(smem + L::share_offset) + (size_t)warp * kDecodeMaxPhases;
    if (lane < a.n_phases) shares[lane] = warp_share<kChunkPairs, kUnitRows>(a.phases[lane], gw, n_warps);
    if (kBulk && lane == 0) {
        for (uint32_t s = 0; s < kSlots; ++s) mbarrier_init(&full[s], 1);  // lane 0's arrival + the bytes
        mbarrier_init_fence();
    }
    __syncwarp();

    // Lane roles, as in the q16x matvec: 8 lanes per 68-byte block pair (4 pairs = 256 columns
    // per step), lanes 0-3 on block A's 32 weights, 4-7 on block B's.
    const uint32_t sub = lane / 8;
    const Q8PairLane pl = q8_pair_lane(lane);
    const uint64_t l2_policy = l2_evict_first_policy();

    // Weights never depend on earlier kernels: the whole ring goes out before the wait.
    ChunkCursor issue{0, shares[0].c0, 0, 0, 0}, use{0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < kSlots; ++i)
        issue_next_chunk<kChunkPairs, kSlots, kBulk, kUnitRows>(a, shares, issue, ring, full, lane, l2_policy, kAcross ? a.n_phases : 0);
    cudaGridDependencySynchronize();  // x_q16 and the stream come from earlier kernels
    if (tl != nullptr && threadIdx.x == 0) tl[1] = global_timer_ns();

    for (uint32_t p = 0; p < a.n_phases; ++p) {
        const DecodeGemvPhase& ph = a.phases[p];
        if (p > 0) {
            if (tl != nullptr) {
                __syncthreads();
                if (threadIdx.x == 0) tl[2 + 3 * (p - 1) + 1] = global_timer_ns();  // the block's warps are done
            }
            if constexpr (kBound == 0) grid_barrier(barrier, gridDim.x);  // the previous phase's outputs, from every block
            if constexpr (kBound == 1) __syncthreads();
            if (tl != nullptr && threadIdx.x == 0) tl[2 + 3 * (p - 1) + 2] = global_timer_ns();  // barrier passed
        }
        if (kBound < 2 || p == 0) {
            load_x<kFastQuant>(a, ph, xq, xd, red);
            __syncthreads();
        }
        if (tl != nullptr && threadIdx.x == 0) tl[2 + 3 * p] = global_timer_ns();  // x ready
        if (!kAcross && p > 0) {
            for (uint32_t i = 0; i < kSlots; ++i)
                issue_next_chunk<kChunkPairs, kSlots, kBulk, kUnitRows>(a, shares, issue, ring, full, lane, l2_policy, p);
        }
        if (tl != nullptr && lane == 0) {  // the ring at x ready: chunks in flight, and how many have landed (TMA only)
            const uint32_t in_flight = issue.n - use.n;
            uint32_t landed = 0;
            if constexpr (kBulk) {
                ChunkCursor c = use;
                for (uint32_t i = 0; i < in_flight; ++i, advance_slot<kSlots>(c))
                    landed += mbarrier_test_parity(&full[c.slot], c.parity) ? 1u : 0u;
            }
            tl[2 + 3 * kDecodeMaxPhases + (kDecodeMaxPhases + p) * kWarps + warp] = (uint64_t)landed << 32 | in_flight;
        }
        const WarpShare s = shares[p];
        float acc[kUnitRows] = {};
        for (uint32_t k = s.c0; k < s.c1; ++k) {
            if constexpr (kBulk) {
                mbarrier_wait_parity(&full[use.slot], use.parity);  // chunk k has landed
            } else {
                cp_async_wait<kSlots - 1>();  // chunk k has landed (the newer ones may still be in flight)
                __syncwarp();
            }
            const uint32_t ci = k % s.cpr;
            const uint32_t pairs = min(kChunkPairs, s.ppr - ci * kChunkPairs);
            const uint32_t* buf = reinterpret_cast<const uint32_t*>(ring + (size_t)use.slot * L::slot_bytes);
#pragma unroll
            for (uint32_t j = 0; j < kChunkPairs / 4; ++j) {
                const uint32_t pp = 4 * j + sub;
                if (4 * j >= pairs) break;
                const uint32_t col = (ci * kChunkPairs + pp) * 64 + pl.col_in_pair;
                const uint4 xv = *reinterpret_cast<const uint4*>(xq + col);
                const float xs = xd[col / 32];
#pragma unroll
                for (int r = 0; r < kUnitRows; ++r)
                    acc[r] = q8_pair_dot(buf + r * (L::chunk_bytes / 4) + pp * 17, pl, xv, xs, acc[r]);
            }
            __syncwarp();  // the slot is free: refill it kSlots chunks ahead (maybe of a later phase)
            advance_slot<kSlots>(use);
            issue_next_chunk<kChunkPairs, kSlots, kBulk, kUnitRows>(a, shares, issue, ring, full, lane, l2_policy,
                                                                    kAcross ? a.n_phases : p);
            if (ci == s.cpr - 1) {  // the end of group g inside this share
                const uint32_t g = k / s.cpr;
                const bool publish = s.starts_cut && g == s.c0 / s.cpr;  // g began in an earlier warp's share
                float total[kUnitRows];
#pragma unroll
                for (int r = 0; r < kUnitRows; ++r) {
                    total[r] = warp_sum(acc[r]);
                    acc[r] = 0.0f;
                }
                if (kBound == 0 && lane == 0 && publish) publish_part<kUnitRows>(carry, gw, total);
                if (lane == 0 && !publish) group_out<kUnitRows>(a, ph, g, total);
            }
        }
        if (s.c1 % s.cpr != 0 && s.c1 > s.c0) {  // the share ends inside group g
            const uint32_t g = s.c1 / s.cpr;
            float total[kUnitRows];
#pragma unroll
            for (int r = 0; r < kUnitRows; ++r) total[r] = warp_sum(acc[r]);
            if (lane == 0) {
                if (g * s.cpr >= s.c0) {  // g's first chunk is ours: add the later warps' parts in warp order
                    const uint32_t group_end = (g + 1) * s.cpr;
                    for (uint32_t w = gw + 1; w < n_warps; ++w) {
                        const uint32_t w0 = (uint32_t)((uint64_t)w * s.total / n_warps);
                        const uint32_t w1 = (uint32_t)((uint64_t)(w + 1) * s.total / n_warps);
                        if (w0 >= group_end) break;
                        // (the timing bounds skip the hand-over: without barriers a slot could be reused
                        // before it is read)
                        if (kBound == 0 && w1 > w0) add_part<kUnitRows>(carry, w, total);
                    }
                    group_out<kUnitRows>(a, ph, g, total);
                } else if (kBound == 0) {  // g began before this share and goes on after it
                    publish_part<kUnitRows>(carry, gw, total);
                }
            }
        }
        if (tl != nullptr && lane == 0) tl[2 + 3 * kDecodeMaxPhases + p * kWarps + warp] = global_timer_ns();  // this warp done
    }
    // Every copy issued was waited for above (the cursor issues exactly the chunks consumed);
    // the cp.async ring may still count empty groups.
    if constexpr (!kBulk) cp_async_wait<0>();
    if (tl != nullptr) {
        __syncthreads();
        if (threadIdx.x == 0) tl[2 + 3 * (a.n_phases - 1) + 1] = global_timer_ns();
    }
}

#else
template <uint32_t kChunkPairs, uint32_t kSlots, bool kBulk, bool kAcross, bool kFastQuant, int kUnitRows, int kBound = 0>
__global__ void decode_layer_kernel(const DecodeLayerArgs, uint32_t*, unsigned long long*, uint64_t*) {
    __trap();  // never launched: decode_layer_supported() reads kDecodeLayerCompiled
}
#endif

// The ring shapes (DecodeRing order): block pairs per chunk x slots per warp, bulk copies or
// cp.async.
struct RingKernel {
    void (*kernel)(const DecodeLayerArgs, uint32_t*, unsigned long long*, uint64_t*);
    size_t smem_bytes;
};
template <uint32_t kChunkPairs, uint32_t kSlots, bool kBulk, bool kAcross = true, bool kFastQuant = false,
          int kUnitRows = 2, int kBound = 0>
constexpr RingKernel ring_kernel() {
    return {decode_layer_kernel<kChunkPairs, kSlots, kBulk, kAcross, kFastQuant, kUnitRows, kBound>,
            RingLayout<kChunkPairs, kSlots, kUnitRows>::smem_bytes};
}
const RingKernel kRingKernels[kDecodeRingShapes] = {
    ring_kernel<16, 5, true>(),  ring_kernel<16, 5, true, true, true>(), ring_kernel<32, 2, true>(),
    ring_kernel<32, 2, false>(), ring_kernel<32, 2, false, false>(),     ring_kernel<16, 2, true, true, true, 4>()};
// The timing bounds (bench only): the default ring without the grid barriers, then without
// the x prologues too.
const RingKernel kBoundKernels[2] = {ring_kernel<16, 5, true, true, true, 2, 1>(), ring_kernel<16, 5, true, true, true, 2, 2>()};
const char* const kRingNames[kDecodeRingShapes] = {"tma16x5", "tma16x5-rcp",  "tma32x2",
                                                   "cp32x2",  "cp32x2-phase", "tma16x2r4-rcp"};

// What the host needs per device, checked once (a process may drive GPUs of different kinds;
// the launch path then costs a map lookup, no driver query).
struct DeviceFit {
    bool supported = false;
    uint32_t sms = 0;  // grid blocks: one per SM
};

const DeviceFit& device_fit() {
    static std::mutex mutex;
    static std::map<int, DeviceFit> by_device;
    int device = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = by_device.find(device); it != by_device.end()) return it->second;
    DeviceFit fit;
    int major = 0, smem_optin = 0, sms = 0, compiled = 0;
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    fit.sms = (uint32_t)sms;
    size_t widest = 0;
    for (const RingKernel& k : kRingKernels) widest = std::max(widest, k.smem_bytes);
    if (major >= 9 && (size_t)smem_optin >= widest) {
        if (cudaMemcpyFromSymbol(&compiled, kDecodeLayerCompiled, sizeof compiled) != cudaSuccess) {
            (void)cudaGetLastError();
            compiled = 0;
        }
    }
    if (compiled == 1) {
        fit.supported = true;
        for (const RingKernel& k : kBoundKernels)
            SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem_bytes));
        for (const RingKernel& k : kRingKernels) {
            SPILLWAY_CUDA_CHECK(
                cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem_bytes));
            int per_sm = 0;
            SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.kernel, kThreads, k.smem_bytes));
            fit.supported = fit.supported && per_sm >= 1;
        }
    }
    return by_device.emplace(device, fit).first->second;
}

}  // namespace

bool decode_layer_supported() { return device_fit().supported; }

const char* decode_ring_name(DecodeRing ring) {
    return (uint32_t)ring < kDecodeRingShapes ? kRingNames[(uint32_t)ring] : "?";
}

DecodeRing decode_ring_default() {
    static const DecodeRing ring = [] {
        const int i = lab_knob_choice("SPILLWAY_DECODE_RING",
                                      {"tma16x5", "tma16x5-rcp", "tma32x2", "cp32x2", "cp32x2-phase", "tma16x2r4-rcp"});
        return i < 0 ? DecodeRing::tma16x5_rcp : (DecodeRing)i;
    }();
    return ring;
}

bool decode_layer_phase_fits(uint32_t rows, uint32_t cols) {
    return rows >= 1 && cols >= kUnitCols && cols % kUnitCols == 0 && cols <= kMaxCols;
}

uint32_t decode_layer_grid_blocks() { return device_fit().sms; }

size_t decode_layer_scratch_bytes() {
    const uint32_t sms = device_fit().sms;
    return 16 + (size_t)sms * kWarps * kMaxUnitRows * sizeof(unsigned long long);  // barrier words, then the slots
}

namespace {

struct ByteRange {
    const void* p;
    size_t bytes;
};

bool overlaps(ByteRange a, ByteRange b) {
    const auto a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
    return a.p != nullptr && b.p != nullptr && a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

bool phase_writes_what_it_reads(const DecodeLayerArgs& a, const DecodeGemvPhase& ph) {
    const size_t cols = ph.cols;
    const ByteRange written = ph.y == DecodeY::add_to_stream ? ByteRange{a.stream, ph.rows * sizeof(float)}
                              : ph.y == DecodeY::swiglu_pairs ? ByteRange{ph.out, ph.rows / 2 * sizeof(float)}
                                                              : ByteRange{ph.out, ph.rows * sizeof(float)};
    ByteRange read[2] = {};
    switch (ph.x) {
        case DecodeX::act_q16:
            read[0] = {a.x_q16.q, cols * sizeof(int16_t)};
            read[1] = {a.x_q16.d, cols / 32 * sizeof(float)};
            break;
        case DecodeX::stream_rmsnorm:
            read[0] = {a.stream, cols * sizeof(float)};
            read[1] = {ph.norm_weight, cols * sizeof(float)};
            break;
        case DecodeX::swiglu: read[0] = {ph.gate_up, 2 * cols * sizeof(float)}; break;
        case DecodeX::f32: read[0] = {ph.x_f32, cols * sizeof(float)}; break;
    }
    return overlaps(written, read[0]) || overlaps(written, read[1]);
}

void launch_decode_layer(const RingKernel& k, const DecodeLayerArgs& args, void* scratch, cudaStream_t stream,
                         uint64_t* timeline) {
    const uint32_t sms = device_fit().sms;  // the current device's: one block per SM
    uint32_t* barrier = static_cast<uint32_t*>(scratch);
    unsigned long long* carry = reinterpret_cast<unsigned long long*>(static_cast<uint8_t*>(scratch) + 16);
    launch_with_pdl(true, k.kernel, dim3((unsigned)sms), dim3(kThreads), k.smem_bytes, stream, args, barrier, carry,
                    timeline);
}

// Fails unless the device runs the kernel and the phases are ones it takes.
void check_decode_layer_args(const DecodeLayerArgs& args, const void* scratch, const std::string& where) {
    if (!decode_layer_supported()) fail(where + "needs an sm_90+ GPU with 227 KB of shared memory per block");
    if (args.n_phases < 1 || args.n_phases > kDecodeMaxPhases) fail(where + "1 to 4 phases");
    if (scratch == nullptr) fail(where + "no scratch");
    for (uint32_t p = 0; p < args.n_phases; ++p) {
        const DecodeGemvPhase& ph = args.phases[p];
        const std::string at = where + "phase " + std::to_string(p) + ": ";
        if (ph.w == nullptr || reinterpret_cast<uintptr_t>(ph.w) % 16 != 0) fail(at + "weights missing or not 16-byte aligned");
        if (!decode_layer_phase_fits(ph.rows, ph.cols))
            fail(at + "shape " + std::to_string(ph.rows) + "x" + std::to_string(ph.cols) +
                 " unsupported (cols a multiple of 256, at most 14336)");
        switch (ph.x) {
            case DecodeX::act_q16:
                if (!args.x_q16 || args.x_q16.d == nullptr || reinterpret_cast<uintptr_t>(args.x_q16.q) % 16 != 0 ||
                    reinterpret_cast<uintptr_t>(args.x_q16.d) % 16 != 0)
                    fail(at + "x_q16 missing or not 16-byte aligned");
                break;
            case DecodeX::stream_rmsnorm:
                if (args.stream == nullptr || ph.norm_weight == nullptr) fail(at + "RMSNorm needs the stream and a norm weight");
                if (reinterpret_cast<uintptr_t>(args.stream) % 16 != 0 || reinterpret_cast<uintptr_t>(ph.norm_weight) % 16 != 0)
                    fail(at + "the stream and the norm weight must be 16-byte aligned");
                break;
            case DecodeX::swiglu:
                if (ph.gate_up == nullptr || reinterpret_cast<uintptr_t>(ph.gate_up) % 16 != 0)
                    fail(at + "SwiGLU needs gate_up, 16-byte aligned");
                break;
            case DecodeX::f32:
                if (ph.x_f32 == nullptr || reinterpret_cast<uintptr_t>(ph.x_f32) % 16 != 0)
                    fail(at + "x_f32 missing or not 16-byte aligned");
                break;
            default: fail(at + "unknown x source");
        }
        if (ph.y != DecodeY::store && ph.y != DecodeY::add_to_stream && ph.y != DecodeY::swiglu_pairs)
            fail(at + "unknown output kind");
        if ((ph.y == DecodeY::store || ph.y == DecodeY::swiglu_pairs) && ph.out == nullptr) fail(at + "no output");
        if (ph.y == DecodeY::swiglu_pairs && ph.rows % 2 != 0) fail(at + "swiglu_pairs needs gate and up rows, an even count");
        if (ph.y == DecodeY::add_to_stream && args.stream == nullptr) fail(at + "no stream to add to");
        // Within a phase nothing orders one block's outputs after another block's x prologue,
        // so what a phase writes must not overlap anything it reads.
        if (phase_writes_what_it_reads(args, ph)) fail(at + "its output overlaps its own input");
    }
}

}  // namespace

void decode_layer_cuda(const DecodeLayerArgs& args, void* scratch, cudaStream_t stream, uint64_t* timeline,
                       DecodeRing ring) {
    const std::string where = "decode_layer_cuda: ";
    if ((uint32_t)ring >= kDecodeRingShapes) fail(where + "unknown ring shape");
    check_decode_layer_args(args, scratch, where);
    launch_decode_layer(kRingKernels[(uint32_t)ring], args, scratch, stream, timeline);
}

void decode_layer_timing_bound_cuda(const DecodeLayerArgs& args, void* scratch, cudaStream_t stream, int bound) {
    const std::string where = "decode_layer_timing_bound_cuda: ";
    if (bound < 1 || bound > 2) fail(where + "bound 1 or 2");
    check_decode_layer_args(args, scratch, where);
    launch_decode_layer(kBoundKernels[bound - 1], args, scratch, stream, nullptr);
}

}  // namespace spillway
