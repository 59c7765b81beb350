#pragma once
// The end of every decode attention kernel (split, int_dot, mma) with a single split: the
// block's partial is the output, and the int16 copy of it that the Q8_0 output projection
// reads is written here instead of by a quantize launch of its own (one producer-consumer
// hand-off less per layer while the context fits one split; docs/perf-notes.md, session 17).
// Several splits keep the merge kernel, which writes the int16 copy itself: a merge by the
// last block of each KV head was measured slower (one SM reading every split's partials).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/attention_mma.cuh"

namespace spillway {

// Called by every thread of the block after its writes of out (p.part_out with one split).
// head_dim % 32 == 0 and the block's thread count a multiple of 32: each warp quantizes
// whole 32-value blocks of one head.
template <uint32_t D>
__device__ void attention_finish_single_split(const attention_mma::Params& p, uint32_t kv_head) {
    if (p.n_splits != 1 || p.out_q == nullptr) return;
    const uint32_t lane = threadIdx.x % 32;
    __syncthreads();  // the block's writes of out are visible to the whole block
    for (uint32_t idx = threadIdx.x; idx < p.n_group * D; idx += blockDim.x) {  // warp-uniform: 32 | n_group * D
        const size_t at = (size_t)(kv_head * p.n_group) * D + idx;
        quantize_act_q16_warp(p.part_out[at], lane, p.out_q + (at & ~(size_t)31), p.out_d + at / 32);
    }
}

}  // namespace spillway
