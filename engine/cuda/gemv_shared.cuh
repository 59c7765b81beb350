#pragma once
// Host helpers shared by the decode GEMVs that size their grid to be resident at once and
// may split a row (or row pair) between two warps (matvec.cu's q16x, matvec_q8s.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "engine/cuda/cuda_check.h"

namespace spillway {

// The stream's slots through which a warp hands one part of a split row's partial sums to
// the warp that adds them, on the current device: at least `needed` 64-bit words, zero
// between launches (a launch that uses a slot clears it). Allocated on the stream's first
// call, which must not be inside a graph capture. GEMVs on one stream use them one at a time.
unsigned long long* gemv_carry_slots(cudaStream_t stream, uint32_t needed);

// Warps of kKernel (blocks of `warps_per_block` warps, `smem` bytes of dynamic shared
// memory) resident on the whole device at once. The first call per instance raises the
// kernel's dynamic shared-memory limit to `max_smem` (a host query otherwise, no stream
// work: fine inside graph capture).
template <auto kKernel>
uint32_t gemv_resident_warps(int warps_per_block, size_t smem, size_t max_smem) {
    static const int sms = [max_smem] {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)max_smem));
        int device = 0, n = 0;
        SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
        SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
        return n;
    }();
    int per_sm = 0;
    SPILLWAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, warps_per_block * 32, smem));
    return (uint32_t)std::max(1, sms * per_sm) * (uint32_t)warps_per_block;
}

}  // namespace spillway
