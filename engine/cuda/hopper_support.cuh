#pragma once
// Whether a build's sm_90a kernels can run on this GPU. Internal to engine/cuda.
#include <cstdint>

namespace spillway {

// True on an sm_90 GPU that grants smem_bytes of shared memory per block, where the
// __device__ int at `compiled_flag` (the address of the variable, set to 1 in the translation
// unit's sm_90a code and 0 elsewhere) reads 1: a plain sm_90 image, or PTX JIT-compiled from an
// older architecture, lacks the kernels. An error reading the flag counts as absent.
bool sm90a_kernels_usable(const void* compiled_flag, uint32_t smem_bytes);

}  // namespace spillway
