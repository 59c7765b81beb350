// Stand-alone activation quantizer (act_quant.cuh) for activations whose producer does not
// quantize them itself (the attention output before the wo matvec): one float4 per thread.
#include "engine/cuda/act_quant.cuh"

#include "common/error.h"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/pdl_launch.cuh"

namespace spillway {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) quantize_act_q16_kernel(const float* __restrict__ x, uint32_t n4,
                                                                    int16_t* __restrict__ q, float* __restrict__ d) {
    // Programmatic launch (pdl_launch.cuh): the producer's writes are visible after the wait;
    // then the Q8_0 matvec reading this output may launch and prefetch its weights.
    pdl_wait_for_producer();
    pdl_release_dependents();
    const uint32_t i = blockIdx.x * kThreads + threadIdx.x;  // float4 index
    if (i >= n4) return;  // n4 % 8 == 0: whole 8-lane groups leave together
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    quantize_act_q16_group(v, threadIdx.x % 32, q + 4 * (size_t)i, d + i / 8);
}

}  // namespace

void quantize_act_q16_cuda(const float* x, uint32_t n, uint32_t n_tokens, ActQ16 out, cudaStream_t stream) {
    if (n == 0 || n_tokens == 0) return;
    if (n % kActBlock != 0) fail("quantize_act_q16_cuda: n must be a multiple of 32");
    if (!out.q || !out.d) fail("quantize_act_q16_cuda: no output buffers");
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out.q) % 16 != 0)
        fail("quantize_act_q16_cuda: x and q must be 16-byte aligned");
    const uint32_t n4 = n / 4 * n_tokens;
    launch_with_pdl(pdl_site_on(PdlSite::merge), quantize_act_q16_kernel, dim3((n4 + kThreads - 1) / kThreads),
                    dim3(kThreads), 0, stream, x, n4, out.q, out.d);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
