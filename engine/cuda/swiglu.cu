#include "engine/cuda/swiglu.cuh"

#include <algorithm>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/pdl_launch.cuh"

namespace spillway {
namespace {

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = silu_times(gate[i], up[i]);
}

__global__ void swiglu_f16_kernel(const float* gate, const float* up, __half* out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(silu_times_f16_out(gate[i], up[i]));
}

// n % 4 == 0, 16-byte aligned inputs: four values per thread, one 8-byte store.
__global__ void swiglu_f16_vec_kernel(const float4* __restrict__ gate, const float4* __restrict__ up,
                                      uint2* __restrict__ out, size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 g = gate[i], u = up[i];
        const __half2 lo = __floats2half2_rn(silu_times_f16_out(g.x, u.x), silu_times_f16_out(g.y, u.y));
        const __half2 hi = __floats2half2_rn(silu_times_f16_out(g.z, u.z), silu_times_f16_out(g.w, u.w));
        out[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
}

constexpr int kQ16Threads = 256;

// kStamps (lab, bench "q8s hop timeline"): thread 0 of each block stamps the global timer at
// entry, producer wait returned, its values formed and its values stored, at stamps[block *
// kSwigluStamps + k]. Its own instance, so the default's code stays as measured.
constexpr uint32_t kSwigluStamps = 4;
template <bool kStamps>
__global__ void __launch_bounds__(kQ16Threads) swiglu_q16_kernel(const float4* __restrict__ gate,
                                                                 const float4* __restrict__ up, uint32_t n4,
                                                                 int16_t* __restrict__ q, float* __restrict__ d,
                                                                 uint64_t* stamps) {
    const auto stamp = [&](uint32_t k) {
        if constexpr (kStamps) {
            if (threadIdx.x == 0) stamps[blockIdx.x * kSwigluStamps + k] = global_timer_ns();
        }
    };
    stamp(0);
    // Programmatic launch (pdl_launch.cuh): the producer's writes are visible after the wait;
    // then the Q8_0 matvec reading this output may launch and prefetch its weights.
    pdl_wait_for_producer();
    stamp(1);
    pdl_release_dependents();
    const uint32_t i = blockIdx.x * kQ16Threads + threadIdx.x;
    if (i >= n4) return;  // n4 % 8 == 0: whole 8-lane groups leave together; thread 0 never does
    const float4 g = gate[i], u = up[i];
    const float4 h = make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z), silu_times(g.w, u.w));
    stamp(2);
    quantize_act_q16_group(h, threadIdx.x % 32, q + 4 * (size_t)i, d + i / 8);
    stamp(3);
}

}  // namespace

void swiglu_cuda(const float* gate, const float* up, float* out, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const size_t blocks = (n + 255) / 256;
    swiglu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(gate, up, out, n);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

void swiglu_f16_cuda(const float* gate, const float* up, __half* out, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(up) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
    const size_t units = vec ? n / 4 : n;
    const size_t blocks = std::min<size_t>((units + 255) / 256, 65535);
    if (vec)
        swiglu_f16_vec_kernel<<<(unsigned)blocks, 256, 0, stream>>>(reinterpret_cast<const float4*>(gate),
                                                                     reinterpret_cast<const float4*>(up),
                                                                     reinterpret_cast<uint2*>(out), units);
    else
        swiglu_f16_kernel<<<(unsigned)blocks, 256, 0, stream>>>(gate, up, out, n);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

namespace {

// Checks, launches, and returns the block count; stamps != nullptr: the stamped instances.
uint32_t launch_swiglu_q16(const float* gate, const float* up, uint32_t n, ActQ16 out, cudaStream_t stream,
                           uint64_t* stamps) {
    if (n == 0) return 0;
    if (n % kActBlock != 0 || !out.q || !out.d) fail("swiglu_q16_cuda: n must be a multiple of 32, with outputs");
    if (reinterpret_cast<uintptr_t>(gate) % 16 != 0 || reinterpret_cast<uintptr_t>(up) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(out.q) % 16 != 0)
        fail("swiglu_q16_cuda: gate, up and q must be 16-byte aligned");
    const uint32_t n4 = n / 4, blocks = (n4 + kQ16Threads - 1) / kQ16Threads;
    const auto kernel = stamps != nullptr ? swiglu_q16_kernel<true> : swiglu_q16_kernel<false>;
    launch_with_pdl(pdl_site_on(PdlSite::swiglu), kernel, dim3(blocks), dim3(kQ16Threads), 0, stream,
                    reinterpret_cast<const float4*>(gate), reinterpret_cast<const float4*>(up), n4, out.q, out.d,
                    stamps);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    return blocks;
}

}  // namespace

void swiglu_q16_cuda(const float* gate, const float* up, uint32_t n, ActQ16 out, cudaStream_t stream) {
    launch_swiglu_q16(gate, up, n, out, stream, nullptr);
}

uint32_t swiglu_q16_stamped_cuda(const float* gate, const float* up, uint32_t n, ActQ16 out, cudaStream_t stream,
                                 uint64_t* stamps) {
    if (stamps == nullptr) fail("swiglu_q16_stamped_cuda: no stamp buffer");
    return launch_swiglu_q16(gate, up, n, out, stream, stamps);
}

}  // namespace spillway
