#pragma once
// Bulk copies global -> shared memory (sm_90's TMA engine) completed on an mbarrier, for
// kernels that stream data through shared memory without spending one instruction per 16
// bytes per lane: plain byte ranges (decode_layer.cu's weights) and boxes of a tensor map
// (prefill_attention_ws.cu's K / V tiles, swizzled). A copy is tracked only by its mbarrier,
// not by cp.async groups, so a kernel may wait for other cp.async traffic (an activation
// vector) while these copies are still in flight.
#include <cuda_runtime.h>

#include <cstdint>

namespace spillway {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t shared_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// `count` arrivals complete a phase. Call once per barrier, then mbarrier_init_fence() before
// any other thread or the TMA engine uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also expects `bytes` more bytes of transactions in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(bytes)
                 : "memory");
}

// Spins until the phase with this parity has completed (parity = fill number & 1).
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(shared_addr(bar)),
        "r"(parity)
        : "memory");
}

// Whether the phase with this parity has completed, without waiting.
__device__ __forceinline__ bool mbarrier_test_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(shared_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

// Orders this thread's earlier generic-proxy accesses of shared memory (e.g. reads of a ring
// slot, made visible to it by __syncwarp) before later async-proxy writes (a bulk copy into
// that slot).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// An L2 policy for data read once (weights in a decode step): evicted first.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}

// bytes % 16 == 0, both addresses 16-byte aligned; completes `bytes` transactions on bar.
__device__ __forceinline__ void bulk_copy_global_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                           uint64_t l2_policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
            shared_addr(dst)),
        "l"(src), "r"(bytes), "r"(shared_addr(bar)), "l"(l2_policy)
        : "memory");
}

// One plain arrival (a consumer handing a ring slot back).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_addr(bar)) : "memory");
}

// The box at (c0, c1) of a 2-D tensor map (a TMA tensor copy, with the map's swizzle; elements
// outside the tensor arrive as zeros) into shared memory, completed on bar (the whole box's
// bytes). `tensor_map`: the address of a __grid_constant__ CUtensorMap kernel parameter.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, int32_t c0, int32_t c1, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            shared_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(shared_addr(bar))
        : "memory");
}

// Shared -> global through the TMA engine (bulk-group completion, tracked per issuing thread):
// the box at (c0, c1) of a 2-D tensor map written from shared memory laid out as the map's
// box (with its swizzle); elements outside the tensor are not written. The writing threads
// fence_proxy_async_shared() their writes of src first.
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, int32_t c0, int32_t c1, const void* src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     reinterpret_cast<uint64_t>(tensor_map)),
                 "r"(c0), "r"(c1), "r"(shared_addr(src))
                 : "memory");
}
// The same, adding each element to the one in global memory (one f32 add per element, in L2).
__device__ __forceinline__ void tma_add_2d(const void* tensor_map, int32_t c0, int32_t c1, const void* src) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     reinterpret_cast<uint64_t>(tensor_map)),
                 "r"(c0), "r"(c1), "r"(shared_addr(src))
                 : "memory");
}
// Closes this thread's bulk stores issued since the last commit into one group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most `n` of this thread's newest groups still read their shared memory.
template <int n>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(n) : "memory");
}
// Until every group of this thread is complete (its writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

#endif

}  // namespace spillway
