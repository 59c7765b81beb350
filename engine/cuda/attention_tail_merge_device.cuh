#pragma once
// The split merge done by the last block of each KV head at the end of the split attention
// kernel (lab, SPILLWAY_SPLIT_TAIL_MERGE=1), instead of a merge launch after it.
//
// Why: at 8192 cells (f16 KV, 14B shape) the merge launch's hop costs 2.8% of the decode step
// (session 52's bound, SPILLWAY_LAB_SKIP_MERGE=1): the attention grid drains, the merge's
// dependency wait returns, it loads the partials, and its own grid must drain before wo's wait
// returns. Here the hop is one ticket per block and the last block's merge.
// Why it lost before (session 19): that last block read 5 heads x 66 splits of partials with
// 128 threads in ~40 dependent rounds of L2 loads. Here it copies every partial of its KV head
// into shared memory with cp.async in one batch (80 KB at 8192 cells: a bandwidth cost of
// ~0.5 us on one SM, not round trips) while one warp per query head turns the lse values into
// weights, then sums from shared memory. Only where the split kernel runs (f16 K below 16384
// cells, where the bound is largest); the mma kernel's 64k ranges have twice the splits.
//
// The arithmetic is merge_splits_kernel's operation for operation: the same weights, the sum of
// weights over warps of 32 consecutive splits (butterfly, then the warp sums in order), the
// weighted sum in kMergeThreads / head_dim interleaved groups of splits, each group in split
// order by fused multiply-adds, the groups added in order. Both paths give the same bits
// (CudaAttention.SplitTailMergeEqualsMergeLaunch).
#include <cuda_runtime.h>

#include <cuda/atomic>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/attention_mma.cuh"
#include "engine/cuda/kv_tile.cuh"
#include "engine/cuda/pdl_launch.cuh"

namespace spillway {

// The merge kernel's block: its group count and its warps' split ranges define the rounding.
constexpr uint32_t kMergeThreads = 512;
constexpr uint32_t kMergeMaxSplits = 1024;
constexpr uint32_t kTailMergeMaxGroup = 16;

// Shared memory the last block needs: every split's partials of its KV head's query heads
// ([split][n_group * head_dim], as in global memory) and the weights ([n_group][split]).
__host__ __device__ constexpr size_t tail_merge_smem_bytes(uint32_t n_splits, uint32_t n_group, uint32_t head_dim) {
    return (size_t)n_splits * n_group * head_dim * sizeof(float) + (size_t)n_group * n_splits * sizeof(float);
}

// Called by every thread of the block after its stores of the partial (p.part_out, p.part_lse)
// with the kernel's dynamic shared memory, free for reuse; returns after the merge (the last
// block of the KV head) or at once (every other block). p.tail_counters[kv_head] is zero
// before the launch and zero again after it (the last block resets it), so graph replays
// need no reset. The block's thread count is a multiple of 32.
template <uint32_t D>
__device__ void attention_tail_merge(const attention_mma::Params& p, uint32_t kv_head, uint8_t* smem) {
    static_assert(D % 32 == 0 && kMergeThreads % D == 0, "whole warps per head; the merge kernel's groups");
    constexpr uint32_t kGroups = kMergeThreads / D;
    __shared__ uint32_t last_block;
    __shared__ float head_max[kTailMergeMaxGroup];
    __shared__ float head_weight_sum[kTailMergeMaxGroup];
    const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;
    const uint32_t n = p.n_splits, n_group = p.n_group, chunk = n_group * D;

    __syncthreads();  // every store of this block's partial has been issued
    if (tid == 0) {
        // One acq_rel ticket (the engine's lean hand-over, matvec_q8s.cu: 0.2-0.8% faster than
        // a grid barrier's two fences): its release is cumulative over the block barrier's
        // stores, its acquire orders the last block's reads below (after the next barrier)
        // after every other block's stores. The reset has nothing waiting for it: the next use
        // of the counter is a later launch.
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrivals(p.tail_counters[kv_head]);
        last_block = arrivals.fetch_add(1u, cuda::memory_order_acq_rel) == n - 1;
        if (last_block) arrivals.store(0u, cuda::memory_order_relaxed);
    }
    __syncthreads();
    if (!last_block) return;  // its exit counts as its release of the kernel behind (wo)
    // The merge kernel's release point: wo may launch and fetch its first weights now.
    pdl_release_dependents();

    // Every partial of this KV head's query heads, in one batch of 16-byte copies through L2
    // (cp.async.cg: coherent with the other SMs' stores; L1 may hold stale lines of these
    // addresses from an earlier layer).
    float* staged = reinterpret_cast<float*>(smem);  // [n][chunk]
    float* weight = staged + (size_t)n * chunk;       // [n_group][n]
    const float* src = p.part_out + (size_t)kv_head * chunk;
    const uint32_t vectors = chunk / 4;
    for (uint32_t i = tid; i < n * vectors; i += blockDim.x) {
        const uint32_t s = i / vectors, v = i % vectors;
        kv_tile::cp_async<16>(staged + (size_t)s * chunk + 4 * v, src + (size_t)s * p.n_head * D + 4 * v);
    }
    kv_tile::cp_async_commit();

    // Meanwhile one warp per query head: the max lse, the weights and their sum, as the merge
    // kernel forms them (its thread t holds splits t, t + 512, ...; each of its warps sums 32
    // consecutive splits by a butterfly; the warp sums are added in order). A split's lse is
    // parked in weight[] by the lane that later reads it back (the same s % 32).
    for (uint32_t g = warp; g < n_group; g += n_warps) {
        const uint32_t head = kv_head * n_group + g;
        float* w = weight + (size_t)g * n;
        float m = -INFINITY;
        for (uint32_t s = lane; s < n; s += 32) {
            const float l = __ldcg(p.part_lse + (size_t)s * p.n_head + head);
            w[s] = l;
            m = fmaxf(m, l);
        }
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float sum_w = 0.0f;
        for (uint32_t c = 0; c < kMergeThreads / 32 && 32 * c < n; ++c) {
            float mine = 0.0f;
            for (uint32_t s = 32 * c + lane; s < n; s += kMergeThreads) {
                const float ws = m == -INFINITY ? 0.0f : __expf(w[s] - m);
                w[s] = ws;
                mine += ws;
            }
            for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
            sum_w += mine;
        }
        if (lane == 0) {
            head_max[g] = m;
            head_weight_sum[g] = sum_w;
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();

    // Thread = one dim of one query head (warp-uniform: 32 | D); the groups' sums run side by
    // side, split s going to group s % kGroups as in the merge kernel.
    for (uint32_t idx = tid; idx < chunk; idx += blockDim.x) {
        const uint32_t g = idx / D, d = idx % D, head = kv_head * n_group + g;
        const float m = head_max[g], sum_w = head_weight_sum[g];
        const float* w = weight + (size_t)g * n;
        float group[kGroups];
#pragma unroll
        for (uint32_t k = 0; k < kGroups; ++k) group[k] = 0.0f;
        uint32_t s = 0;
        for (; s + kGroups <= n; s += kGroups)
#pragma unroll
            for (uint32_t k = 0; k < kGroups; ++k)
                group[k] = __fmaf_rn(w[s + k], staged[(size_t)(s + k) * chunk + idx], group[k]);
#pragma unroll
        for (uint32_t k = 0; k < kGroups; ++k)
            if (s + k < n) group[k] = __fmaf_rn(w[s + k], staged[(size_t)(s + k) * chunk + idx], group[k]);
        float total = 0.0f;
#pragma unroll
        for (uint32_t k = 0; k < kGroups; ++k) total += group[k];
        const float o = m == -INFINITY ? 0.0f : total / sum_w;
        p.tail_out[(size_t)head * D + d] = o;
        if (d == 0) p.tail_lse[head] = m == -INFINITY ? -INFINITY : m + logf(sum_w);
        const size_t first = (size_t)head * D + (d & ~31u);
        if (p.out_q != nullptr) quantize_act_q16_warp(o, lane, p.out_q + first, p.out_d + first / 32);
    }
}

}  // namespace spillway
