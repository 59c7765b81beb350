#include "engine/cuda/rmsnorm.cuh"

#include <cstdlib>
#include <string>

#include "common/error.h"
#include "engine/cuda/act_ops_device.cuh"
#include "engine/cuda/act_quant_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/lab_knob.h"

namespace spillway {
namespace {

constexpr int kThreads = 256;

// Any dim: one block per row, one value per thread per step.
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ add,
                                                           const float* __restrict__ weight, float* __restrict__ out,
                                                           __half* __restrict__ out16, uint32_t dim, float eps) {
    __shared__ float warp_sums[kThreads / 32];
    float* xr = x + (size_t)blockIdx.x * dim;
    const float* ar = add != nullptr ? add + (size_t)blockIdx.x * dim : nullptr;
    float* outr = out != nullptr ? out + (size_t)blockIdx.x * dim : nullptr;
    __half* out16r = out16 != nullptr ? out16 + (size_t)blockIdx.x * dim : nullptr;

    float sum = 0.0f;
    for (uint32_t i = threadIdx.x; i < dim; i += kThreads) {
        float v = xr[i];
        if (ar != nullptr) {
            v += ar[i];
            xr[i] = v;
        }
        sum = fmaf(v, v, sum);
    }
    const float inv_rms = rsqrtf(block_sum(sum, warp_sums, kThreads / 32) / (float)dim + eps);
    // Each thread re-reads only the elements it wrote itself, so no barrier is needed here.
    for (uint32_t i = threadIdx.x; i < dim; i += kThreads) {
        const float o = xr[i] * inv_rms * weight[i];
        if (outr != nullptr) outr[i] = o;
        if (out16r != nullptr) out16r[i] = __float2half_rn(o);
    }
}

// dim % 4 == 0 and dim <= 4 * kVecThreads * kVecPerThread: the row is held in registers as
// float4, so it is read once and all loads of a thread are in flight together (the scalar
// kernel's chain of ~20 dependent loads per thread took ~8 us for one 5120 row).
// Many rows (a prefill chunk): 128 threads and up to 10 float4 each per row, so several rows
// run per SM at once (the 512-thread block holds an SM alone: a 2048-row chunk then runs as
// 16 latency-bound waves, ~65 us for 2048 x 5120 against a ~35 us memory floor).
constexpr int kVecThreads = 512;
constexpr int kVecPerThread = 8;
constexpr int kRowsThreads = 128;
constexpr int kRowsPerThread = 10;
constexpr uint32_t kManyRows = 64;  // from this many rows on, the many-rows shape

template <int kBlockThreads, int kPerThread>
__global__ void __launch_bounds__(kBlockThreads) rmsnorm_vec_kernel(float* __restrict__ x, const float* __restrict__ add,
                                                                  const float* __restrict__ weight,
                                                                  float* __restrict__ out, __half* __restrict__ out16,
                                                                  uint32_t dim, float eps, int16_t* __restrict__ q,
                                                                  float* __restrict__ qd) {
    // Programmatic launch (pdl_launch.cuh): the producer's writes are visible after the wait;
    // then the Q8_0 matvec reading this output may launch and prefetch its weights. (Releasing
    // only after this block's loads measured 2-3% slower: sessions 30-31, docs/perf-notes.md.)
    pdl_wait_for_producer();
    pdl_release_dependents();
    __shared__ float warp_sums[kBlockThreads / 32];
    const uint32_t n4 = dim / 4;
    float4* xr = reinterpret_cast<float4*>(x + (size_t)blockIdx.x * dim);
    const float4* ar = add != nullptr ? reinterpret_cast<const float4*>(add + (size_t)blockIdx.x * dim) : nullptr;
    const float4* wr = reinterpret_cast<const float4*>(weight);
    // The weights are loaded with x, before the block reduction: loaded after it, each step's
    // load would wait a full L2 trip behind the previous step's quantizing shuffles.
    float4 v[kPerThread], g[kPerThread];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
        const uint32_t i = threadIdx.x + k * kBlockThreads;
        if (i < n4) {
            v[k] = xr[i];
            g[k] = wr[i];
            if (ar != nullptr) {
                const float4 a = ar[i];
                v[k].x += a.x;
                v[k].y += a.y;
                v[k].z += a.z;
                v[k].w += a.w;
                xr[i] = v[k];
            }
            sum = fmaf(v[k].x, v[k].x, sum);
            sum = fmaf(v[k].y, v[k].y, sum);
            sum = fmaf(v[k].z, v[k].z, sum);
            sum = fmaf(v[k].w, v[k].w, sum);
        }
    }
    const float inv_rms = rsqrtf(block_sum(sum, warp_sums, kBlockThreads / 32) / (float)dim + eps);
    float4* outr = out != nullptr ? reinterpret_cast<float4*>(out + (size_t)blockIdx.x * dim) : nullptr;
    uint2* out16r = out16 != nullptr ? reinterpret_cast<uint2*>(out16 + (size_t)blockIdx.x * dim) : nullptr;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
        const uint32_t i = threadIdx.x + k * kBlockThreads;
        if (i < n4) {  // q: dim % 32 == 0, so 8-lane groups are all in or all out
            // Same operation order as the scalar kernel and rmsnorm_cpu: (x * inv_rms) * w.
            const float4 o = make_float4(v[k].x * inv_rms * g[k].x, v[k].y * inv_rms * g[k].y,
                                         v[k].z * inv_rms * g[k].z, v[k].w * inv_rms * g[k].w);
            if (outr != nullptr) outr[i] = o;
            if (out16r != nullptr) {
                const __half2 lo = __floats2half2_rn(o.x, o.y), hi = __floats2half2_rn(o.z, o.w);
                out16r[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
            }
            if (q != nullptr)
                quantize_act_q16_group(o, threadIdx.x % 32, q + (size_t)blockIdx.x * dim + 4 * i,
                                       qd + (size_t)blockIdx.x * (dim / 32) + i / 8);
        }
    }
}

}  // namespace

void rmsnorm_cuda(float* x, const float* residual_add, const float* weight, float* out,
                  uint32_t n_rows, uint32_t dim, float eps, cudaStream_t stream, ActQ16 q_out, __half* out_f16) {
    if (n_rows == 0) return;
    if (dim == 0) fail("rmsnorm_cuda: dim must be positive");
    if (out == nullptr && out_f16 == nullptr) fail("rmsnorm_cuda: no output");
    if (out != nullptr && (out == x || out == residual_add)) fail("rmsnorm_cuda: out must not alias x or residual_add");
    if (q_out && out == nullptr) fail("rmsnorm_cuda: the quantized output comes with the f32 one");
    const bool vec = dim % 4 == 0 && dim <= 4u * kVecThreads * kVecPerThread &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(out_f16) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                     (residual_add == nullptr || reinterpret_cast<uintptr_t>(residual_add) % 16 == 0);
    if (q_out && (!vec || dim % kActBlock != 0 || !q_out.d))
        fail("rmsnorm_cuda: quantized output needs dim % 32 == 0, dim <= 16384 and 16-byte aligned rows");
    // SPILLWAY_RMSNORM_MANY_ROWS=0 (lab): the 512-thread shape for every row count.
    static const bool many_rows_shape = !lab_knob("SPILLWAY_RMSNORM_MANY_ROWS", "0", "1");
    if (vec && many_rows_shape && n_rows >= kManyRows && dim <= 4u * kRowsThreads * kRowsPerThread)
        rmsnorm_vec_kernel<kRowsThreads, kRowsPerThread><<<n_rows, kRowsThreads, 0, stream>>>(
            x, residual_add, weight, out, out_f16, dim, eps, q_out.q, q_out.d);
    else if (vec)
        launch_with_pdl(pdl_site_on(PdlSite::rmsnorm), rmsnorm_vec_kernel<kVecThreads, kVecPerThread>, dim3(n_rows),
                        dim3(kVecThreads), 0, stream, x, residual_add, weight, out, out_f16, dim, eps, q_out.q, q_out.d);
    else
        rmsnorm_kernel<<<n_rows, kThreads, 0, stream>>>(x, residual_add, weight, out, out_f16, dim, eps);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace spillway
