#pragma once
// What the warp-specialized Hopper kernels share (prefill_attention_ws.cu, prefill_gemm_q8s.cu):
// named barriers among a subset of the block's warps, and the register hand-over from a
// producer warpgroup to the consumer warpgroups. sm_90a only (callers guard with
// __CUDA_ARCH_FEAT_SM90_ALL). Internal to engine/cuda.
#include <cstdint>

namespace spillway::ws {

// Waits at named barrier `id` (1..15; 0 is __syncthreads) until `threads` threads have
// arrived or waited there.
__device__ __forceinline__ void named_sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting.
__device__ __forceinline__ void named_arrive(uint32_t id, uint32_t threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A 384-thread block launches at 168 registers per thread; the producer warpgroup gives most
// of them back and the two consumer warpgroups take 240 each. A register file is per SM
// sub-partition (16,384 each) and holds one warp of every warpgroup: 24 + 2 x 240 = 504
// registers per lane there.
__device__ __forceinline__ void producer_registers() { asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory"); }
__device__ __forceinline__ void consumer_registers() { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory"); }

}  // namespace spillway::ws
