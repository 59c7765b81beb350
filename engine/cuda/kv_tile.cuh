#pragma once
// Byte geometry of one head's K or V slice in the cache's block formats, and the cp.async
// copies, shared by the decode and prefill attention kernels that stage cells in shared memory.
#include <cstddef>
#include <cstdint>

#include "model/model_spec.h"

namespace spillway::kv_tile {

// Bytes of one head's d values in a cell: f16 2 B/value, q8_0 34 B and q4_0 18 B per 32.
__host__ __device__ constexpr uint32_t slice_bytes(KvType type, int d) {
    return type == KvType::f16 ? d * 2 : type == KvType::q8_0 ? d / 32 * 34 : d / 32 * 18;
}
// The widest cp.async chunk (16, 8 or 4 bytes) that tiles a slice exactly.
__host__ __device__ constexpr uint32_t copy_chunk(uint32_t slice) {
    return slice % 16 == 0 ? 16 : slice % 8 == 0 ? 8 : 4;
}
__host__ __device__ constexpr size_t align128(size_t n) { return (n + 127) / 128 * 128; }

#ifdef __CUDACC__
// One asynchronous global->shared copy of kBytes (16 bypasses L1; 4 and 8 cache in it).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
    if constexpr (kBytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(kBytes));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
#endif

}  // namespace spillway::kv_tile
