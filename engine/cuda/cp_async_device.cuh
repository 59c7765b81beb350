#pragma once
// cp.async (sm_80+) helpers shared by the kernels that stream weights into shared memory
// through per-warp rings (matvec.cu's streaming GEMVs, decode_layer.cu): 16 bytes from global
// memory through L2 only (.cg: coherent with other SMs' writes), commit and wait by group.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// 4 bytes (.ca: the only size-4 form; after a producer wait, as an ordinary load would be).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace spillway
