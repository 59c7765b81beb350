#include "engine/cuda/hopper_support.cuh"

#include <cuda_runtime.h>

#include "engine/cuda/cuda_check.h"

namespace spillway {

bool sm90a_kernels_usable(const void* compiled_flag, uint32_t smem_bytes) {
    int dev = 0, major = 0, minor = 0, smem_optin = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (major != 9 || minor != 0 || smem_optin < (int)smem_bytes) return false;
    int compiled = 0;
    if (cudaMemcpyFromSymbol(&compiled, compiled_flag, sizeof compiled) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return compiled == 1;
}

}  // namespace spillway
