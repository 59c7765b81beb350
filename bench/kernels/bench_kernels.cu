// Kernel micro-benchmarks: every op of engine/cuda on shapes of Qwen2.5-14B, on random data
// generated on the GPU, each input set rotated among copies totalling >= 1 GiB so that no
// timed launch reads from L2 (60 MB on the H200). Median of N launches timed by events.
// Prints a markdown table: achieved GB/s (bytes the kernel must move / time) and its share
// of two ceilings measured in the same run: HBM read (a read-only reduction kernel) and
// device-to-device copy (bytes read + written).
//
// Usage: bench_kernels [--iters N] [--only SUBSTRING]
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "engine/cuda/attention.cuh"
#include "engine/cuda/attention_mma.cuh"
#include "engine/cuda/attention_timeline.h"
#include "engine/cuda/bulk_copy_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kv_write.cuh"
#include "engine/cuda/act_quant.cuh"
#include "engine/cuda/decode_layer.cuh"
#include "engine/cuda/global_timer_device.cuh"
#include "engine/cuda/matvec.cuh"
#include "engine/cuda/matvec_q8s.cuh"
#include "engine/cuda/pdl_launch.cuh"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"
#include "gguf/ggml_types.h"

using namespace spillway;

namespace {

constexpr size_t kRotateBytes = size_t(1) << 30;

__device__ uint32_t hash32(uint64_t i, uint32_t salt) {
    uint32_t x = (uint32_t)(i ^ (i >> 32)) * 0x9E3779B1u ^ salt;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}
__device__ float hash_unit(uint64_t i, uint32_t salt) { return (hash32(i, salt) >> 8) * (2.0f / 16777216.0f) - 1.0f; }

// Random bytes everywhere (fill_bytes), then a valid small f16 scale at the start of each
// block (fix_block_scales, a second launch: blocks of one launch do not wait for each other).
__global__ void fill_bytes(uint8_t* p, size_t bytes, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)hash32(i, salt);
}
__global__ void fix_block_scales(uint8_t* p, size_t bytes, uint32_t block_bytes, uint32_t salt) {
    const size_t n_blocks = bytes / block_bytes;
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < n_blocks; b += (size_t)gridDim.x * blockDim.x) {
        const __half d = __float2half(0.01f * (1.0f + hash_unit(b, salt + 1)));
        memcpy(p + b * block_bytes, &d, 2);
    }
}
__global__ void fill_f16(__half* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half(hash_unit(i, salt));
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float f = hash_unit(i, salt);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        p[i] = (uint16_t)(bits >> 16);
    }
}
__global__ void fill_f32(float* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = hash_unit(i, salt);
}

// XOR of the 16-byte vectors p[start], p[start + stride], ... below n, 4 loads in flight
// (evict-first): a pure read stream whose result only keeps the loads alive.
__device__ __forceinline__ uint32_t xor_stream(const uint4* p, size_t n, size_t start, size_t stride) {
    uint32_t acc = 0;
    size_t i = start;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    return acc;
}

// The HBM read ceiling: each thread streams a grid-strided share.
__global__ void read_kernel(const uint4* p, size_t n, uint32_t* sink) {
    const uint32_t acc = xor_stream(p, n, blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
    if (acc == 0x12345678u) *sink = acc;  // practically never: keeps the loads alive
}

// Lab ("sm speed"): does an SM stream HBM at a speed of its own, launch after launch? One
// block per SM (the dynamic shared memory keeps a second one out) streams the same number of
// bytes while every other SM does too; the block records its SM and start / end (global ns).
// If the slow SMs are the same ones in every launch, a GEMV or attention could give them less
// work statically (session 19 saw a 17-28% spread of per-SM finish times in the attention).
__global__ void __launch_bounds__(512, 1) sm_stream_kernel(const uint4* p, size_t per_block, uint64_t* stamps,
                                                           uint32_t* sink) {
    const uint4* base = p + blockIdx.x * per_block;
    __syncthreads();
    const uint64_t t0 = global_timer_ns();
    const uint32_t acc = xor_stream(base, per_block, threadIdx.x, blockDim.x);
    if (acc == 0x12345678u) *sink = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        stamps[3 * blockIdx.x] = sm;
        stamps[3 * blockIdx.x + 1] = t0;
        stamps[3 * blockIdx.x + 2] = global_timer_ns();
    }
}

void fill_type(GgmlType type, void* p, size_t bytes, uint32_t salt) {
    const dim3 grid(4096), block(256);
    switch (type) {
        case GgmlType::F16: fill_f16<<<grid, block>>>(static_cast<__half*>(p), bytes / 2, salt); break;
        case GgmlType::BF16: fill_bf16<<<grid, block>>>(static_cast<uint16_t*>(p), bytes / 2, salt); break;
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
            fill_bytes<<<grid, block>>>(static_cast<uint8_t*>(p), bytes, salt);
            fix_block_scales<<<grid, block>>>(static_cast<uint8_t*>(p), bytes, type == GgmlType::Q8_0 ? 34 : 18, salt);
            break;
        default: fail("bench: no filler for this type");
    }
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}

GgmlType ggml_of(KvType t) { return t == KvType::f16 ? GgmlType::F16 : t == KvType::q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0; }

struct Options {
    int iters = 50;
    std::string only;
};

// Per-launch time the engine will see: `iters` launches (rotating input sets) captured in one
// CUDA graph, as a decode step will be; the graph is replayed 7 times after a warm-up and the
// median replay time is divided by `iters`. Launch gaps inside a graph are ~1 us or less, so
// this is kernel time plus that gap; timing single launches with an event pair each adds
// several microseconds of event overhead (seen in the first run: a 0.9 MB matvec "took" 5 us).
double median_us(const std::function<void(cudaStream_t, int)>& launch, int iters) {
    cudaStream_t stream;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < 3; ++i) launch(stream, i);  // module load, attribute set-up
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    SPILLWAY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; ++i) launch(stream, i);
    SPILLWAY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    SPILLWAY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    SPILLWAY_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    constexpr int kReplays = 7;
    cudaEvent_t ev[kReplays + 1];
    for (auto& e : ev) SPILLWAY_CUDA_CHECK(cudaEventCreate(&e));
    SPILLWAY_CUDA_CHECK(cudaEventRecord(ev[0], stream));
    for (int r = 0; r < kReplays; ++r) {
        SPILLWAY_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        SPILLWAY_CUDA_CHECK(cudaEventRecord(ev[r + 1], stream));
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ms(kReplays);
    for (int r = 0; r < kReplays; ++r) SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]));
    for (auto& e : ev) cudaEventDestroy(e);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    std::nth_element(ms.begin(), ms.begin() + kReplays / 2, ms.end());
    return ms[kReplays / 2] * 1000.0 / iters;
}

// Plain event-pair timing for the ceilings (one big transfer each, overhead negligible).
double median_event_us(const std::function<void()>& launch, int iters) {
    for (int i = 0; i < 2; ++i) launch();
    std::vector<float> ms(iters);
    cudaEvent_t a, b;
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&a));
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < iters; ++i) {
        SPILLWAY_CUDA_CHECK(cudaEventRecord(a));
        launch();
        SPILLWAY_CUDA_CHECK(cudaEventRecord(b));
        SPILLWAY_CUDA_CHECK(cudaEventSynchronize(b));
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
    return ms[iters / 2] * 1000.0;
}

struct Row {
    std::string kernel, shape;
    double mbytes, us, gbps;
};

struct Report {
    double read_gbps = 0, copy_gbps = 0;
    std::vector<Row> rows;
    void add(const std::string& kernel, const std::string& shape, double bytes, double us) {
        rows.push_back({kernel, shape, bytes / 1e6, us, bytes / (us * 1e3)});
        std::printf("  %-28s %-30s %9.1f MB %9.2f us %7.0f GB/s\n", kernel.c_str(), shape.c_str(), bytes / 1e6, us,
                    bytes / (us * 1e3));
        std::fflush(stdout);
    }
};

size_t rotation_count(size_t bytes) { return std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes); }

void bench_ceilings(Report& r, const Options& o) {
    const size_t bytes = size_t(2) << 30;
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    DeviceBuffer<uint32_t> sink(1);
    fill_type(GgmlType::F16, a.data(), bytes, 1);
    const double copy_us = median_event_us([&]() { SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice)); }, 10);
    const double read_us = median_event_us([&]() {
        read_kernel<<<132 * 16, 256>>>(reinterpret_cast<const uint4*>(a.data()), bytes / 16, sink.data());
    }, 10);
    (void)o;
    r.copy_gbps = 2.0 * bytes / (copy_us * 1e3);
    r.read_gbps = bytes / (read_us * 1e3);
    std::printf("ceilings: device copy %.0f GB/s (read+write), HBM read %.0f GB/s\n", r.copy_gbps, r.read_gbps);
}

// q8_kernel: force a Q8_0 variant (its name is appended); unset = what matvec_cuda picks.
void bench_matvec(Report& r, const Options& o, GgmlType type, uint32_t rows, uint32_t cols, uint32_t n_tokens,
                  std::optional<MatvecQ8Kernel> q8_kernel = std::nullopt) {
    static const char* const kQ8Names[] = {"staged", "stream2", "stream3", "stream2_i8"};
    const std::string name = std::string("matvec ") + ggml_type_name(type) + (n_tokens > 1 ? " x" + std::to_string(n_tokens) : "") +
                             (q8_kernel ? std::string(" ") + kQ8Names[(int)*q8_kernel] : std::string());
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const size_t w_bytes = *ggml_row_bytes(type, cols) * rows;
    const size_t n_sets = rotation_count(w_bytes);
    std::vector<DeviceBuffer<uint8_t>> w;
    for (size_t i = 0; i < n_sets; ++i) {
        w.emplace_back(w_bytes);
        fill_type(type, w.back().data(), w_bytes, 100 + i);
    }
    DeviceBuffer<float> x((size_t)n_tokens * cols), y((size_t)n_tokens * rows);
    fill_f32<<<256, 256>>>(x.data(), x.size(), 7);
    const double us = median_us([&](cudaStream_t st, int i) {
        if (q8_kernel) matvec_q8_0_cuda(*q8_kernel, w[i % n_sets].data(), x.data(), y.data(), rows, cols, n_tokens, st);
        else matvec_cuda(type, w[i % n_sets].data(), x.data(), y.data(), rows, cols, n_tokens, st);
    }, o.iters);
    r.add(name, std::to_string(rows) + "x" + std::to_string(cols), (double)w_bytes, us);
}

// A random x of n values quantized to int16 blocks once, outside the timed graph, as its
// producer (rmsnorm / swiglu) does in the engine.
struct QuantizedX {
    DeviceBuffer<int16_t> q;
    DeviceBuffer<float> d;
    explicit QuantizedX(uint32_t n) : q(n), d(n / 32) {
        DeviceBuffer<float> x(n);
        fill_f32<<<256, 256>>>(x.data(), x.size(), 7);
        quantize_act_q16_cuda(x.data(), n, 1, act(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    }
    ActQ16 act() const { return ActQ16{q.data(), d.data()}; }
};

// Q8_0 times x pre-quantized to int16 blocks (the engine's decode path); x quantized once
// outside the timed graph, as its producer (rmsnorm / swiglu) does in the engine.
void bench_matvec_q16x(Report& r, const Options& o, uint32_t rows, uint32_t cols,
                       std::optional<MatvecQ16xKernel> kernel = std::nullopt) {
    static const char* const kNames[] = {"smem4", "smem8", "global4", "smem4_r1", "smem8_r1", "smem4_s3", "smem4_s4"};
    const std::string name = std::string("matvec q8_0 q16x") + (kernel ? std::string(" ") + kNames[(int)*kernel] : "");
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    // --only may name the shape too ("q16x smem4 5120x5120"), e.g. to profile one launch with ncu.
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const size_t w_bytes = *ggml_row_bytes(GgmlType::Q8_0, cols) * rows;
    const size_t n_sets = rotation_count(w_bytes);
    std::vector<DeviceBuffer<uint8_t>> w;
    for (size_t i = 0; i < n_sets; ++i) {
        w.emplace_back(w_bytes);
        fill_type(GgmlType::Q8_0, w.back().data(), w_bytes, 100 + i);
    }
    const QuantizedX xq(cols);
    DeviceBuffer<float> y(rows);
    const double us = median_us([&](cudaStream_t st, int i) {
        if (kernel) matvec_q8_0_q16x_cuda_with(*kernel, w[i % n_sets].data(), xq.act(), y.data(), rows, cols, st);
        else matvec_q8_0_q16x_cuda(w[i % n_sets].data(), xq.act(), y.data(), rows, cols, st);
    }, o.iters);
    r.add(name, shape, (double)w_bytes, us);
}

// The split-layout Q8_0 GEMV (matvec_q8s.cuh): the same bytes as GGUF Q8_0, random codes and scales.
struct Q8SplitBuffers {
    DeviceBuffer<int8_t> codes;
    DeviceBuffer<uint16_t> scales;
    Q8SplitBuffers(uint32_t rows, uint32_t cols, uint32_t salt)
        : codes((size_t)rows * cols), scales((size_t)rows * cols / 32) {
        fill_bytes<<<4096, 256>>>(reinterpret_cast<uint8_t*>(codes.data()), codes.size(), salt);
        fill_f16<<<4096, 256>>>(reinterpret_cast<__half*>(scales.data()), scales.size(), salt + 1);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    }
    Q8SplitConst view() const { return {codes.data(), scales.data()}; }
};

const char* q8s_name(MatvecQ8sKernel k) {
    static const char* const kNames[] = {"w8u4",   "w8u8",   "w4u4",     "w8u4p",   "w8u4nc",
                                         "sweep1", "sweep2", "sweep1r2", "sweep1r4", "sweep1r8"};
    return kNames[(int)k];
}

void bench_matvec_q8s(Report& r, const Options& o, uint32_t rows, uint32_t cols, MatvecQ8sKernel kernel) {
    const std::string name = std::string("matvec q8s ") + q8s_name(kernel);
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const size_t w_bytes = *ggml_row_bytes(GgmlType::Q8_0, cols) * rows;
    const size_t n_sets = rotation_count(w_bytes);
    std::vector<Q8SplitBuffers> w;
    w.reserve(n_sets);
    for (size_t i = 0; i < n_sets; ++i) w.emplace_back(rows, cols, 100 + 2 * (uint32_t)i);
    const QuantizedX xq(cols);
    DeviceBuffer<float> y(rows);
    const double us = median_us([&](cudaStream_t st, int i) {
        matvec_q8s_cuda_with(kernel, w[i % n_sets].view(), xq.act(), y.data(), rows, cols, st);
    }, o.iters);
    r.add(name, shape, (double)w_bytes, us);
}

// One 14B layer's four decode GEMVs in the split layout (qkv, wo, gate|up, down), in enough
// rotating sets that consecutive layers miss L2.
struct LayerChainWeights {
    const std::vector<std::pair<uint32_t, uint32_t>> shapes{{7168, 5120}, {5120, 5120}, {27648, 5120}, {5120, 13824}};
    size_t layer_bytes = 0;
    std::vector<std::vector<Q8SplitBuffers>> sets;
    explicit LayerChainWeights(uint32_t salt) {
        for (const auto& [rows, cols] : shapes) layer_bytes += *ggml_row_bytes(GgmlType::Q8_0, cols) * rows;
        sets.resize(rotation_count(layer_bytes));
        for (size_t i = 0; i < sets.size(); ++i) {
            sets[i].reserve(shapes.size());
            for (size_t j = 0; j < shapes.size(); ++j)
                sets[i].emplace_back(shapes[j].first, shapes[j].second, salt + 10 * (uint32_t)i + 2 * (uint32_t)j);
        }
    }
};

// The q16x layer chain's four GEMVs in the split layout. release: each GEMV lets the next
// one be scheduled at its entry (programmatic launch).
void bench_q8s_layer_chain(Report& r, const Options& o, MatvecQ8sKernel kernel, bool release) {
    const std::string name = std::string("q8s layer chain ") + q8s_name(kernel) + (release ? " release" : "");
    const std::string shape = "qkv, wo, gate|up, down";
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const LayerChainWeights chain(500);
    const auto& shapes = chain.shapes;
    const auto& w = chain.sets;
    const size_t n_sets = w.size(), layer_bytes = chain.layer_bytes;
    const QuantizedX xq(13824);
    DeviceBuffer<float> y(27648);
    const double us = median_us([&](cudaStream_t st, int i) {
        for (size_t j = 0; j < shapes.size(); ++j)
            matvec_q8s_cuda_with(kernel, w[i % n_sets][j].view(), xq.act(), y.data(),
                                 shapes[j].first, shapes[j].second, st, release);
    }, o.iters);
    r.add(name, shape, (double)layer_bytes, us);
}

// The same four GEMVs as the engine runs them fused (matvec_q8s_fused_cuda, session 28): q|k|v
// and gate|up norm the f32 stream themselves, down forms SwiGLU from gate and up, wo and down
// add into the stream; each lets the next be scheduled at its entry. Against "q8s layer chain
// sweep1r2 release" it prices the fused prologues; against the engine's layer time, the rest.
// which: "" all fused; "norms" only the RMSNorm prologues (down reads quantized x); "swiglu"
// only down's; "adds" only the residual adds (every x quantized).
void bench_q8s_layer_chain_fused(Report& r, const Options& o, const std::string& which) {
    const std::string name = "q8s layer chain fused" + (which.empty() ? "" : " " + which);
    const std::string shape = "qkv, wo, gate|up, down";
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const LayerChainWeights chain(700);
    const auto& w = chain.sets;
    const size_t n_sets = w.size(), layer_bytes = chain.layer_bytes;
    const QuantizedX x_q(13824);
    DeviceBuffer<float> stream(5120), norm_w(5120), qkv(7168), gate_up(27648);
    fill_f32<<<64, 256>>>(stream.data(), stream.size(), 11);
    fill_f32<<<64, 256>>>(norm_w.data(), norm_w.size(), 12);
    fill_f32<<<256, 256>>>(gate_up.data(), gate_up.size(), 13);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    const float eps = 1e-5f;
    const bool norms = which.empty() || which == "norms", swiglu = which.empty() || which == "swiglu";
    const GemvX normed = norms ? GemvX{GemvXFrom::rmsnorm, {}, stream.data(), norm_w.data(), eps}
                               : GemvX{GemvXFrom::q16, x_q.act()};
    const GemvX gated = swiglu ? GemvX{GemvXFrom::swiglu, {}, gate_up.data(), gate_up.data() + 13824}
                               : GemvX{GemvXFrom::q16, x_q.act()};
    const double us = median_us([&](cudaStream_t st, int i) {
        const std::vector<Q8SplitBuffers>& L = w[i % n_sets];
        matvec_q8s_fused_cuda(L[0].view(), normed, qkv.data(), false, 7168, 5120, st, true);
        matvec_q8s_fused_cuda(L[1].view(), GemvX{GemvXFrom::q16, x_q.act()}, stream.data(), true, 5120, 5120, st, true);
        matvec_q8s_fused_cuda(L[2].view(), normed, gate_up.data(), false, 27648, 5120, st, true);
        matvec_q8s_fused_cuda(L[3].view(), gated, stream.data(), true, 5120, 13824, st, true);
    }, o.iters);
    r.add(name, shape, (double)layer_bytes, us);
}

// A one-warp programmatic kernel between two GEMVs: waits for its producer and releases its
// dependent (the boundary a small kernel puts between two GEMVs, without its work); with
// stamps, thread 0 also stamps its entry, its wait's return and its end.
__global__ void hop_kernel(uint64_t* stamps) {
    if (stamps != nullptr && threadIdx.x == 0) stamps[0] = global_timer_ns();
    pdl_wait_for_producer();
    if (stamps != nullptr && threadIdx.x == 0) stamps[1] = global_timer_ns();
    pdl_release_dependents();
    if (stamps != nullptr && threadIdx.x == 0) stamps[2] = global_timer_ns();
}

// The f32 vectors and the int16 x that a 14B layer's small kernels read and write between its
// GEMVs (rows "q8s layer hops", "q8s hop timeline"), filled with random values.
// glu_*: down's x and the arrival counts when gate|up runs SwiGLU in its epilogue.
struct LayerHopBuffers {
    DeviceBuffer<float> stream, proj, norm_w, attn, xn, qkv, gate_up;
    DeviceBuffer<int16_t> q16, glu_q16;
    DeviceBuffer<float> d16, glu_d16;
    DeviceBuffer<uint32_t> glu_arrivals;
    // norm_*: the norm chain's x, its counts and sums of squares (variant "chain").
    DeviceBuffer<int16_t> norm_q16;
    DeviceBuffer<float> norm_d16, norm_partials;
    DeviceBuffer<uint32_t> norm_arrivals;
    explicit LayerHopBuffers(uint32_t salt)
        : stream(5120), proj(5120), norm_w(5120), attn(5120), xn(5120), qkv(7168), gate_up(27648), q16(13824),
          glu_q16(13824), d16(13824 / 32), glu_d16(13824 / 32), glu_arrivals(13824 / 32), norm_q16(5120),
          norm_d16(5120 / 32), norm_partials(kNormOutMaxBlocks), norm_arrivals(5120 / 32) {
        SPILLWAY_CUDA_CHECK(cudaMemset(glu_arrivals.data(), 0, glu_arrivals.bytes()));
        SPILLWAY_CUDA_CHECK(cudaMemset(norm_arrivals.data(), 0, norm_arrivals.bytes()));
        fill_f32<<<64, 256>>>(stream.data(), stream.size(), salt);
        fill_f32<<<64, 256>>>(norm_w.data(), norm_w.size(), salt + 1);
        fill_f32<<<256, 256>>>(gate_up.data(), gate_up.size(), salt + 2);
        fill_f32<<<64, 256>>>(proj.data(), proj.size(), salt + 3);
        fill_f32<<<64, 256>>>(attn.data(), attn.size(), salt + 4);
        quantize_act_q16_cuda(gate_up.data(), 13824, 1, act(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    }
    ActQ16 act() const { return ActQ16{q16.data(), d16.data()}; }
    ActQ16 glu_act() const { return ActQ16{glu_q16.data(), glu_d16.data()}; }
    HandOver hand_over = HandOver::lean;  // the chained epilogues' (lab variants: matvec_q8s.cuh)
    GluScratch glu_scratch() const { return GluScratch{gate_up.data(), glu_arrivals.data(), hand_over}; }
    ActQ16 norm_act() const { return ActQ16{norm_q16.data(), norm_d16.data()}; }
    NormOut norm_out() const {
        return NormOut{stream.data(), norm_w.data(), norm_partials.data(), norm_act(),
                       GluScratch{proj.data(), norm_arrivals.data(), hand_over}};
    }
};

// "chain-fence" / "-skip" (bench variants of "chain" and "norm-chain", which hand over as the
// engine does, lean): the chained epilogues' hand-over (HandOver, matvec_q8s.cuh); skip writes
// wrong values, its time is the floor of any hand-over. "-wowait": wo lets gate|up launch when
// its wait returns, not at its entry (NormOut::release_after_wait, which hands over with fence).
HandOver hand_over_of(const std::string& variant) {
    if (variant.find("-fence") != std::string::npos) return HandOver::fence;
    if (variant.find("-skip") != std::string::npos) return HandOver::skip;
    return HandOver::lean;
}

// The four GEMVs with the engine's small kernels between them (RMSNorm with the residual add
// before q|k|v and gate|up, SwiGLU before down, and one more RMSNorm standing in for the
// attention's hop before wo), each GEMV but wo releasing its successor at entry as the
// separate launches do. Against "q8s layer chain <kernel> release" it prices the hops (session
// 29: 85.5-86.5 vs 72.8-74.1 us per layer); against the engine's layer time at depth 0, the
// attention and the rest. Variant "empty": each small kernel replaced by hop_kernel (one
// warp, no stamps), the boundaries alone; "glu": gate|up runs SwiGLU in its epilogue
// (matvec_q8s_swiglu_cuda) and down follows it directly: 3 hops. "chain": also the norms split across the GEMVs (wo and down
// norm_out, q|k|v and gate|up normed), the engine's default decode: the attention's hop only.
void bench_q8s_layer_hops(Report& r, const Options& o, MatvecQ8sKernel kernel, const std::string& variant) {
    const bool empty = variant == "empty", glu = variant == "glu", norm_chain = variant.rfind("chain", 0) == 0;
    const bool wo_after_wait = variant.find("-wowait") != std::string::npos;
    const std::string name = "q8s layer hops " + (variant.empty() ? "" : variant + " ") + q8s_name(kernel);
    const std::string shape = norm_chain ? "qkv, wo, gate|up+SwiGLU, down + 1 hop"
                              : glu ? "qkv, wo, gate|up+SwiGLU, down + 3 hops"
                                    : "qkv, wo, gate|up, down + 4 hops";
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const LayerChainWeights chain(900);
    const auto& w = chain.sets;
    const size_t n_sets = w.size(), layer_bytes = chain.layer_bytes;
    LayerHopBuffers b(11);
    b.hand_over = hand_over_of(variant);
    const ActQ16 act = b.act();
    const auto& [stream, proj, norm_w, attn, xn, qkv, gate_up] =
        std::tie(b.stream, b.proj, b.norm_w, b.attn, b.xn, b.qkv, b.gate_up);
    const float eps = 1e-5f;
    const auto hop = [&](cudaStream_t st, const std::function<void()>& small) {
        if (empty) launch_with_pdl(true, hop_kernel, dim3(1), dim3(32), 0, st, static_cast<uint64_t*>(nullptr));
        else small();
    };
    uint32_t n_partials = 0;
    if (norm_chain) {  // the partial sums the first q|k|v reads
        n_partials = matvec_q8s_norm_out_cuda(w[0][3].view(), b.glu_act(), 5120, 13824, b.norm_out(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    }
    const NormedX normed{b.norm_partials.data(), n_partials, eps};
    const double us = median_us([&](cudaStream_t st, int i) {
        const std::vector<Q8SplitBuffers>& L = w[i % n_sets];
        if (norm_chain) {
            matvec_q8s_normed_cuda(L[0].view(), b.norm_act(), normed, qkv.data(), 7168, 5120, st, true);
            rmsnorm_cuda(attn.data(), nullptr, norm_w.data(), xn.data(), 1, 5120, eps, st, act);  // the attention's hop
            NormOut wo_out = b.norm_out();
            wo_out.release_after_wait = wo_after_wait;
            matvec_q8s_norm_out_cuda(L[1].view(), act, 5120, 5120, wo_out, st, !wo_after_wait);
            matvec_q8s_swiglu_cuda(L[2].view(), b.norm_act(), 13824, 5120, b.glu_act(), b.glu_scratch(), st, true,
                                   normed);
            matvec_q8s_norm_out_cuda(L[3].view(), b.glu_act(), 5120, 13824, b.norm_out(), st, true);
            return;
        }
        hop(st, [&] { rmsnorm_cuda(stream.data(), proj.data(), norm_w.data(), xn.data(), 1, 5120, eps, st, act); });
        matvec_q8s_cuda_with(kernel, L[0].view(), act, qkv.data(), 7168, 5120, st, true);
        hop(st, [&] { rmsnorm_cuda(attn.data(), nullptr, norm_w.data(), xn.data(), 1, 5120, eps, st, act); });
        matvec_q8s_cuda_with(kernel, L[1].view(), act, proj.data(), 5120, 5120, st, false);
        hop(st, [&] { rmsnorm_cuda(stream.data(), proj.data(), norm_w.data(), xn.data(), 1, 5120, eps, st, act); });
        if (glu) {
            matvec_q8s_swiglu_cuda(L[2].view(), act, 13824, 5120, b.glu_act(), b.glu_scratch(), st, true);
            matvec_q8s_cuda_with(kernel, L[3].view(), b.glu_act(), proj.data(), 5120, 13824, st, true);
            return;
        }
        matvec_q8s_cuda_with(kernel, L[2].view(), act, gate_up.data(), 27648, 5120, st, true);
        hop(st, [&] { swiglu_q16_cuda(gate_up.data(), gate_up.data() + 13824, 13824, act, st); });
        matvec_q8s_cuda_with(kernel, L[3].view(), act, proj.data(), 5120, 13824, st, true);
    }, o.iters);
    r.add(name, shape, (double)layer_bytes, us);
}

// Lab: where a boundary between two decode GEMVs goes (session 30). The layer's four GEMVs
// (sweep1r2 with global-timer stamps, matvec_q8s_stamped_cuda) released as in the engine,
// with between each pair: nothing ("chain", every GEMV released at entry), the stamping
// one-warp kernel ("empty"), or the engine's RMSNorm and SwiGLU, the latter stamped
// (swiglu_q16_stamped_cuda; "small": its blocks' stamps are printed under the last boundary);
// "norm-chain": the engine's default decode (session 31: the stamped twins of the chained
// sweeps, an RMSNorm standing in for the attention before wo, no other launch). 16 layers
// per graph, weight sets rotating; after three replays, a middle layer's four boundaries are
// printed in us from the previous GEMV's last block end (t = 0): that GEMV's skew (its first
// block end), the hop kernel's entry / wait return / end, and the next GEMV's blocks' entry,
// wait return, x landed, sweep done and end (min / median / max over blocks).
void bench_q8s_hop_timeline(const Options& o, const std::string& mode) {
    const std::string name = "q8s hop timeline " + mode;
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const LayerChainWeights chain(1100);
    const auto& w = chain.sets;
    const auto& shapes = chain.shapes;
    constexpr uint32_t kLayers = 16, kMaxBlocks = 1024, kStampsPerBlock = 5;
    const size_t slots = (size_t)kMaxBlocks * kStampsPerBlock + 3;  // a GEMV's blocks, then the hop's 3
    DeviceBuffer<uint64_t> stamps(kLayers * 4 * slots);
    constexpr uint32_t kSwigluBlocks = (13824 / 4 + 255) / 256;
    DeviceBuffer<uint64_t> swiglu_stamps(kLayers * kSwigluBlocks * 4);
    const auto gemv_stamps = [&](uint32_t l, uint32_t k) { return stamps.data() + (l * 4 + k) * slots; };
    LayerHopBuffers b(21);
    b.hand_over = hand_over_of(mode);
    const ActQ16 act = b.act();
    const DeviceBuffer<float>&stream = b.stream, &proj = b.proj, &norm_w = b.norm_w, &xn = b.xn, &y = b.gate_up;
    const bool chain_only = mode == "chain", small = mode == "small", norm_chain = mode.rfind("norm-chain", 0) == 0;
    const bool wo_after_wait = mode.find("-wowait") != std::string::npos;
    // The separate launches' releases (qkv, gate|up and down at entry, wo not); all of them in
    // the chain and the norm chain.
    const bool release[4] = {true, chain_only || norm_chain, true, true};
    uint32_t n_partials = 0;
    if (norm_chain) {  // the partial sums the first q|k|v reads
        n_partials = matvec_q8s_norm_out_cuda(w[0][3].view(), b.glu_act(), 5120, 13824, b.norm_out(), nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    }
    uint32_t blocks[4] = {};
    cudaStream_t st;
    SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const auto layer = [&](uint32_t l) {
        const std::vector<Q8SplitBuffers>& L = w[l % w.size()];
        if (norm_chain) {  // the engine's default decode: q|k|v, the attention's stand-in, wo, gate|up, down
            const auto normed = [&] { return NormedX{b.norm_partials.data(), n_partials, 1e-5f}; };
            blocks[0] = matvec_q8s_normed_cuda(L[0].view(), b.norm_act(), normed(), b.qkv.data(), 7168, 5120, st,
                                               release[0], gemv_stamps(l, 0));
            rmsnorm_cuda(b.attn.data(), nullptr, norm_w.data(), xn.data(), 1, 5120, 1e-5f, st, act);
            NormOut wo_out = b.norm_out();
            wo_out.release_after_wait = wo_after_wait;
            blocks[1] = matvec_q8s_norm_out_cuda(L[1].view(), act, 5120, 5120, wo_out, st,
                                                 release[1] && !wo_after_wait, gemv_stamps(l, 1));
            const NormedX ffn_norm = normed();  // wo's partials: the same count and slots
            blocks[2] = matvec_q8s_swiglu_cuda(L[2].view(), b.norm_act(), 13824, 5120, b.glu_act(), b.glu_scratch(),
                                               st, release[2], ffn_norm, gemv_stamps(l, 2));
            blocks[3] = matvec_q8s_norm_out_cuda(L[3].view(), b.glu_act(), 5120, 13824, b.norm_out(), st, release[3],
                                                 gemv_stamps(l, 3));
            return;
        }
        for (uint32_t k = 0; k < 4; ++k) {
            if (small) {
                if (k != 3) {
                    rmsnorm_cuda(stream.data(), k == 1 ? nullptr : proj.data(), norm_w.data(), xn.data(), 1, 5120,
                                 1e-5f, st, act);
                } else if (swiglu_q16_stamped_cuda(y.data(), y.data() + 13824, 13824, act, st,
                                                   swiglu_stamps.data() + l * kSwigluBlocks * 4) != kSwigluBlocks) {
                    fail("q8s hop timeline: SwiGLU's block count changed");
                }
            } else if (!chain_only) {
                launch_with_pdl(true, hop_kernel, dim3(1), dim3(32), 0, st,
                                gemv_stamps(l, k) + (size_t)kMaxBlocks * kStampsPerBlock);
            }
            blocks[k] = matvec_q8s_stamped_cuda(L[k].view(), act, y.data(), shapes[k].first, shapes[k].second, st,
                                                release[k], gemv_stamps(l, k));
        }
    };
    for (uint32_t l = 0; l < 2; ++l) layer(l);  // attributes, module load
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st));
    for (uint32_t k = 0; k < 4; ++k)
        if (blocks[k] > kMaxBlocks) fail("q8s hop timeline: more blocks than stamp slots");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    SPILLWAY_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (uint32_t l = 0; l < kLayers; ++l) layer(l);
    SPILLWAY_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    SPILLWAY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) SPILLWAY_CUDA_CHECK(cudaGraphLaunch(exec, st));
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<uint64_t> h(stamps.size());
    SPILLWAY_CUDA_CHECK(cudaMemcpy(h.data(), stamps.data(), stamps.bytes(), cudaMemcpyDeviceToHost));
    std::vector<uint64_t> hs(swiglu_stamps.size());
    SPILLWAY_CUDA_CHECK(cudaMemcpy(hs.data(), swiglu_stamps.data(), swiglu_stamps.bytes(), cudaMemcpyDeviceToHost));
    SPILLWAY_CUDA_CHECK(cudaGraphExecDestroy(exec));
    SPILLWAY_CUDA_CHECK(cudaGraphDestroy(graph));
    SPILLWAY_CUDA_CHECK(cudaStreamDestroy(st));
    const auto at = [&](uint32_t l, uint32_t k) { return h.data() + (l * 4 + k) * slots; };
    const auto spread = [&](uint32_t l, uint32_t k, uint32_t which, double t0) {
        std::vector<double> v(blocks[k]);
        for (uint32_t b = 0; b < blocks[k]; ++b) v[b] = ((double)at(l, k)[b * kStampsPerBlock + which] - t0) / 1000.0;
        std::sort(v.begin(), v.end());
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.2f/%.2f/%.2f", v.front(), v[v.size() / 2], v.back());
        return std::string(buf);
    };
    const auto ends = [&](uint32_t l, uint32_t k) {  // last and first block end
        uint64_t last = 0, first = ~0ull;
        for (uint32_t b = 0; b < blocks[k]; ++b) {
            last = std::max(last, at(l, k)[b * kStampsPerBlock + 4]);
            first = std::min(first, at(l, k)[b * kStampsPerBlock + 4]);
        }
        return std::pair<double, double>((double)last, (double)first);
    };
    const uint32_t l = kLayers / 2;
    const char* names[4] = {"down->qkv", "qkv->wo", "wo->gate|up", "gate|up->down"};
    std::printf("%s (us from the previous GEMV's last block end; min/median/max over blocks)\n", name.c_str());
    for (uint32_t k = 0; k < 4; ++k) {
        const auto [t0, first] = k == 0 ? ends(l - 1, 3) : ends(l, k - 1);
        std::string hop = "-";
        if (!chain_only && !small && !norm_chain) {
            const uint64_t* e = at(l, k) + (size_t)kMaxBlocks * kStampsPerBlock;
            char buf[96];
            std::snprintf(buf, sizeof buf, "%.2f/%.2f/%.2f", (e[0] - t0) / 1000.0, (e[1] - t0) / 1000.0,
                          (e[2] - t0) / 1000.0);
            hop = buf;
        }
        std::printf("  %-14s prev first end %.2f | hop entry/wait/end %s | entry %s | wait %s | x %s | swept %s | "
                    "end %s\n",
                    names[k], (first - t0) / 1000.0, hop.c_str(), spread(l, k, 0, t0).c_str(),
                    spread(l, k, 1, t0).c_str(), spread(l, k, 2, t0).c_str(), spread(l, k, 3, t0).c_str(),
                    spread(l, k, 4, t0).c_str());
        if (small && k == 3) {
            std::string line;
            for (uint32_t which = 0; which < 4; ++which) {
                std::vector<double> v(kSwigluBlocks);
                for (uint32_t b = 0; b < kSwigluBlocks; ++b)
                    v[b] = ((double)hs[(l * kSwigluBlocks + b) * 4 + which] - t0) / 1000.0;
                std::sort(v.begin(), v.end());
                char buf[64];
                std::snprintf(buf, sizeof buf, " %s %.2f/%.2f/%.2f", which == 0 ? "entry" : which == 1 ? "| wait" :
                              which == 2 ? "| formed" : "| stored", v.front(), v[v.size() / 2], v.back());
                line += buf;
            }
            std::printf("  %-14s SwiGLU blocks:%s\n", "", line.c_str());
        }
    }
}

// Rotating sets of random Q8_0 matrices of the given (rows, cols) shapes, enough sets that
// consecutive launches miss L2; returns the bytes of one set.
size_t rotating_q8_sets(const std::vector<std::pair<uint32_t, uint32_t>>& shapes, uint32_t salt,
                        std::vector<std::vector<DeviceBuffer<uint8_t>>>& sets) {
    size_t set_bytes = 0;
    for (const auto& [rows, cols] : shapes) set_bytes += *ggml_row_bytes(GgmlType::Q8_0, cols) * rows;
    sets.clear();
    sets.resize(rotation_count(set_bytes));
    for (size_t i = 0; i < sets.size(); ++i)
        for (size_t j = 0; j < shapes.size(); ++j) {
            const size_t bytes = *ggml_row_bytes(GgmlType::Q8_0, shapes[j].second) * shapes[j].first;
            sets[i].emplace_back(bytes);
            fill_type(GgmlType::Q8_0, sets[i].back().data(), bytes, salt + 10 * (uint32_t)i + (uint32_t)j);
        }
    return set_bytes;
}

// One 14B layer's decode GEMVs back to back (qkv, wo, gate|up, down; programmatic launches as
// in the engine, the small kernels between them left out), weight sets rotating per layer:
// the chain's time per layer against the sum of the single-GEMV rows and the HBM floor.
void bench_q16x_layer_chain(Report& r, const Options& o) {
    const std::string name = "q16x layer chain";
    const std::string shape = "qkv, wo, gate|up, down";
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    const std::vector<std::pair<uint32_t, uint32_t>> shapes{{7168, 5120}, {5120, 5120}, {27648, 5120}, {5120, 13824}};
    std::vector<std::vector<DeviceBuffer<uint8_t>>> w;
    const size_t layer_bytes = rotating_q8_sets(shapes, 500, w);
    const size_t n_sets = w.size();
    const QuantizedX xq(13824);
    DeviceBuffer<float> y(27648);
    const double us = median_us([&](cudaStream_t st, int i) {
        for (size_t j = 0; j < shapes.size(); ++j)
            matvec_q8_0_q16x_cuda(w[i % n_sets][j].data(), xq.act(), y.data(), shapes[j].first,
                                  shapes[j].second, st);
    }, o.iters);
    r.add(name, shape, (double)layer_bytes, us);
}

// The same layer as the chain above through the persistent layer kernel (decode_layer.cuh):
// wo, gate|up, down, the next q|k|v in one launch, with the residual adds, the two RMSNorms
// and SwiGLU that the chain row leaves out done inside it.
void bench_decode_layer(Report& r, const Options& o) {
    const std::string name = "decode layer kernel";
    const std::string shape = "wo, gate|up, down, qkv";
    if (!o.only.empty() && (name + " " + shape).find(o.only) == std::string::npos) return;
    if (!decode_layer_supported()) {
        std::printf("  %-28s skipped: needs sm_90\n", name.c_str());
        return;
    }
    const std::vector<std::pair<uint32_t, uint32_t>> shapes{{5120, 5120}, {27648, 5120}, {5120, 13824}, {7168, 5120}};
    std::vector<std::vector<DeviceBuffer<uint8_t>>> w;
    const size_t layer_bytes = rotating_q8_sets(shapes, 700, w);
    const size_t n_sets = w.size();
    DeviceBuffer<float> stream(5120), norm_w(5120), gate_up(27648), qkv(7168);
    const QuantizedX xq(5120);
    DeviceBuffer<uint8_t> barrier(decode_layer_scratch_bytes());
    SPILLWAY_CUDA_CHECK(cudaMemset(barrier.data(), 0, barrier.bytes()));
    fill_f32<<<256, 256>>>(stream.data(), stream.size(), 8);
    fill_f32<<<256, 256>>>(norm_w.data(), norm_w.size(), 9);
    // The timed launches run on a non-blocking stream, which does not wait for the legacy
    // stream's zeroing of the barrier words above.
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    // The engine's arrangement (enqueue_decode_layer): gate|up writes SwiGLU, down reads it.
    const auto layer_args = [&](size_t set) {
        const auto& ws = w[set % n_sets];
        DecodeLayerArgs a;
        a.stream = stream.data();
        a.x_q16 = xq.act();
        a.phases[0] = DecodeGemvPhase{ws[0].data(), 5120, 5120, DecodeX::act_q16, DecodeY::add_to_stream};
        a.phases[1] = DecodeGemvPhase{ws[1].data(), 27648, 5120, DecodeX::stream_rmsnorm, DecodeY::swiglu_pairs,
                                      norm_w.data(), nullptr, gate_up.data()};
        a.phases[2] = DecodeGemvPhase{ws[2].data(), 5120, 13824, DecodeX::f32, DecodeY::add_to_stream, nullptr,
                                      nullptr, nullptr, gate_up.data()};
        a.phases[3] = DecodeGemvPhase{ws[3].data(), 7168, 5120, DecodeX::stream_rmsnorm, DecodeY::store, norm_w.data(),
                                      nullptr, qkv.data()};
        a.n_phases = 4;
        return a;
    };
    // Every ring shape (decode_layer.cuh), the engine's default first.
    std::vector<DecodeRing> rings{decode_ring_default()};
    for (uint32_t i = 0; i < kDecodeRingShapes; ++i)
        if ((DecodeRing)i != rings[0]) rings.push_back((DecodeRing)i);
    for (const DecodeRing ring : rings) {
        const double us = median_us(
            [&](cudaStream_t st, int i) { decode_layer_cuda(layer_args(i), barrier.data(), st, nullptr, ring); }, o.iters);
        r.add(name + " " + decode_ring_name(ring), shape, (double)layer_bytes, us);

        // Where a launch's time goes (lab timeline, globaltimer stamps per block): per phase the
        // x prologue, the weight loop, and the wait at the grid barrier, averaged over blocks and
        // launches; "span" is first start to last block done.
        const uint32_t blocks = decode_layer_grid_blocks();
        constexpr int kLaunches = 8;
        DeviceBuffer<uint64_t> timeline((size_t)blocks * kDecodeTimelineSlots);
        double prologue[4] = {}, loop[4] = {}, wait[4] = {}, span = 0, start_skew = 0, dep_wait = 0;
        // Skew at each barrier: inside a block (its last warp done - its first) and across blocks
        // (the last block done - the mean block), to tell which balance a fix must improve.
        double warp_skew[4] = {}, block_skew[4] = {};
        double ring_in_flight[4] = {}, ring_landed[4] = {};  // per warp at x ready
        for (int l = 0; l < kLaunches; ++l) {
            decode_layer_cuda(layer_args(l), barrier.data(), nullptr, timeline.data(), ring);
            SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<uint64_t> t((size_t)blocks * kDecodeTimelineSlots);
            SPILLWAY_CUDA_CHECK(cudaMemcpy(t.data(), timeline.data(), t.size() * 8, cudaMemcpyDeviceToHost));
            uint64_t first = UINT64_MAX, last = 0;
            for (uint32_t b = 0; b < blocks; ++b) first = std::min(first, t[(size_t)b * kDecodeTimelineSlots]);
            for (uint32_t b = 0; b < blocks; ++b) {
                const uint64_t* tb = t.data() + (size_t)b * kDecodeTimelineSlots;
                start_skew += (double)(tb[0] - first);
                dep_wait += (double)(tb[1] - tb[0]);
                for (int p = 0; p < 4; ++p) {
                    const uint64_t begin = p == 0 ? tb[1] : tb[4 + 3 * (p - 1)];
                    prologue[p] += (double)(tb[2 + 3 * p] - begin);
                    loop[p] += (double)(tb[3 + 3 * p] - tb[2 + 3 * p]);
                    if (p < 3) wait[p] += (double)(tb[4 + 3 * p] - tb[3 + 3 * p]);
                }
                last = std::max(last, tb[3 + 3 * 3]);
                for (int p = 0; p < 4; ++p) {
                    const uint64_t* ring = tb + 2 + 3 * kDecodeMaxPhases + (kDecodeMaxPhases + p) * kDecodeLayerWarps;
                    for (uint32_t w = 0; w < kDecodeLayerWarps; ++w) {
                        ring_in_flight[p] += (double)(uint32_t)ring[w];
                        ring_landed[p] += (double)(ring[w] >> 32);
                    }
                }
                for (int p = 0; p < 4; ++p) {
                    const uint64_t* wd = tb + 2 + 3 * kDecodeMaxPhases + p * kDecodeLayerWarps;
                    warp_skew[p] += (double)(*std::max_element(wd, wd + kDecodeLayerWarps) -
                                             *std::min_element(wd, wd + kDecodeLayerWarps));
                }
            }
            for (int p = 0; p < 4; ++p) {
                double mean = 0;
                uint64_t latest = 0;
                for (uint32_t b = 0; b < blocks; ++b) {
                    const uint64_t done = t[(size_t)b * kDecodeTimelineSlots + 3 + 3 * p];
                    mean += (double)done / blocks;
                    latest = std::max(latest, done);
                }
                block_skew[p] += (double)latest - mean;
            }
            span += (double)(last - first);
        }
        const double n = (double)blocks * kLaunches * 1000.0;  // sums of ns over blocks and launches -> mean us
        std::printf("  decode layer %s timeline (us, mean over %u blocks x %d launches, not graph-timed): start skew %.2f, "
                    "dependency wait %.2f, span %.2f\n", decode_ring_name(ring), blocks, kLaunches, start_skew / n,
                    dep_wait / n, span / kLaunches / 1000.0);
        const char* const names[] = {"wo", "gate|up", "down", "qkv"};
        for (int p = 0; p < 4; ++p)
            std::printf("    %-8s x prologue %6.2f  weight loop %7.2f  barrier wait %6.2f  skew in block %6.2f  across blocks "
                        "%6.2f  ring at x ready: %.2f chunks in flight, %.2f landed\n",
                        names[p], prologue[p] / n, loop[p] / n, p < 3 ? wait[p] / n : 0.0, warp_skew[p] / n,
                        block_skew[p] / kLaunches / 1000.0, ring_in_flight[p] * 1000.0 / n / kDecodeLayerWarps,
                        ring_landed[p] * 1000.0 / n / kDecodeLayerWarps);
    }
    // How much of the default ring's time the phase boundaries cost: the same launch without
    // the grid barriers (each block still syncs and builds x), then without any boundary.
    // Timing only: the outputs are wrong.
    for (const int bound : {1, 2}) {
        const double us = median_us(
            [&](cudaStream_t st, int i) { decode_layer_timing_bound_cuda(layer_args(i), barrier.data(), st, bound); }, o.iters);
        r.add(name + (bound == 1 ? " bound: no grid barrier" : " bound: no boundary"), shape, (double)layer_bytes, us);
    }
}

// kernel == nullptr: attention_partial_cuda's default choice; otherwise that kernel, named.
void bench_attention(Report& r, const Options& o, KvType kt, KvType vt, uint32_t n_cells, int sms,
                     const AttentionKernel* kernel = nullptr, const char* prefix = "attention ") {
    const std::string name = std::string(prefix) + kv_type_name(kt) + "/" + kv_type_name(vt) +
                             (kernel ? (*kernel == AttentionKernel::int_dot ? " int_dot"
                                        : *kernel == AttentionKernel::mma   ? " mma"
                                                                            : " tensor_core")
                                     : "");
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const AttentionShape s{40, 8, 128, 128, 1.0f / std::sqrt(128.0f)};
    const size_t k_bytes = kv_row_bytes(kt, 8 * 128) * n_cells, v_bytes = kv_row_bytes(vt, 8 * 128) * n_cells;
    const size_t n_sets = rotation_count(k_bytes + v_bytes);
    std::vector<DeviceBuffer<uint8_t>> k, v;
    for (size_t i = 0; i < n_sets; ++i) {
        k.emplace_back(k_bytes);
        v.emplace_back(v_bytes);
        fill_type(ggml_of(kt), k.back().data(), k_bytes, 200 + i);
        fill_type(ggml_of(vt), v.back().data(), v_bytes, 300 + i);
    }
    DeviceBuffer<float> q(40 * 128), out(40 * 128), lse(40);
    fill_f32<<<64, 256>>>(q.data(), q.size(), 9);
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
    const double us = median_us([&](cudaStream_t st, int i) {
        if (kernel)
            attention_partial_cuda_with(*kernel, s, q.data(), kt, k[i % n_sets].data(), vt, v[i % n_sets].data(),
                                        n_cells, out.data(), lse.data(), ws.data(), ws.bytes(), sms, st);
        else
            attention_partial_cuda(s, q.data(), kt, k[i % n_sets].data(), vt, v[i % n_sets].data(), n_cells,
                                   out.data(), lse.data(), ws.data(), ws.bytes(), sms, st);
    }, o.iters);
    r.add(name, "40/8x128, " + std::to_string(n_cells / 1024) + "k cells", (double)(k_bytes + v_bytes), us);
}

// Where one mma decode attention launch's time goes (lab timeline, globaltimer stamps per
// warp and per merge block; single launches, not graph-timed): per-warp means of each phase,
// the tail of the last warp, and the split merge after it.
// Pearson correlation of two equally long series.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
    const size_t n = a.size();
    double ma = 0, mb = 0;
    for (size_t i = 0; i < n; ++i) ma += a[i] / n, mb += b[i] / n;
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < n; ++i) sab += (a[i] - ma) * (b[i] - mb), saa += (a[i] - ma) * (a[i] - ma), sbb += (b[i] - mb) * (b[i] - mb);
    return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

// The mean correlation of consecutive series (per-SM times of consecutive launches): 1 when
// the same SMs are late in every launch.
double mean_consecutive_correlation(const std::vector<std::vector<double>>& series) {
    double sum = 0.0;
    for (size_t l = 1; l < series.size(); ++l) sum += correlation(series[l - 1], series[l]) / (double)(series.size() - 1);
    return sum;
}

void bench_attention_timeline(const Options& o, KvType kt, KvType vt, uint32_t n_cells, int sms) {
    const std::string name = std::string("attention timeline ") + kv_type_name(kt) + "/" + kv_type_name(vt) + " " +
                             std::to_string(n_cells / 1024) + "k";
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const AttentionShape s{40, 8, 128, 128, 1.0f / std::sqrt(128.0f)};
    if (attention_default_kernel(s, kt, vt, n_cells) != AttentionKernel::mma) return;
    // The stamps are the single-warp kernel's: plan for it too (the warp-specialized default
    // would plan half the blocks, and the timeline's launch runs the single-warp kernel).
    struct SingleWarp {
        SingleWarp() { attention_mma::lab_warp_specialized(0, 0); }
        ~SingleWarp() { attention_mma::lab_warp_specialized(-1, -1); }
    } single_warp;
    const size_t k_bytes = kv_row_bytes(kt, 8 * 128) * n_cells, v_bytes = kv_row_bytes(vt, 8 * 128) * n_cells;
    DeviceBuffer<uint8_t> k(k_bytes), v(v_bytes);
    fill_type(ggml_of(kt), k.data(), k_bytes, 200);
    fill_type(ggml_of(vt), v.data(), v_bytes, 300);
    DeviceBuffer<float> q(40 * 128), out(40 * 128), lse(40);
    fill_f32<<<64, 256>>>(q.data(), q.size(), 9);
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, attention_workspace_bytes(s, n_cells, sms)));
    const uint32_t splits = attention_split_count(AttentionKernel::mma, s, kt, vt, n_cells, sms);
    const size_t warps = (size_t)8 * splits * kAttentionTimelineWarpsPerBlock, merges = splits > 1 ? 40 : 0;
    const size_t slots = (warps + merges) * kAttentionTimelineSlots;
    DeviceBuffer<uint64_t> stamps(slots);
    // A flush of L2 between launches (a 256 MB write) so every launch reads the cache from HBM.
    DeviceBuffer<uint8_t> flush(size_t(256) << 20);
    constexpr int kLaunches = 8;
    std::vector<std::vector<double>> sm_done;
    int blocks_min = 1 << 30, blocks_max = 0;
    AttentionTimelineLaunch sum;  // per-launch phases summed, then divided by the launches
    double span = 0;
    for (int l = 0; l < kLaunches + 1; ++l) {
        SPILLWAY_CUDA_CHECK(cudaMemset(flush.data(), l, flush.bytes()));
        SPILLWAY_CUDA_CHECK(cudaMemset(stamps.data(), 0, stamps.bytes()));
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        attention_lab_timeline(stamps.data());
        attention_partial_cuda(s, q.data(), kt, k.data(), vt, v.data(), n_cells, out.data(), lse.data(), ws.data(),
                               ws.bytes(), sms, nullptr);
        attention_lab_timeline(nullptr);
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        if (l == 0) continue;  // module load, attributes
        std::vector<uint64_t> t(slots);
        SPILLWAY_CUDA_CHECK(cudaMemcpy(t.data(), stamps.data(), stamps.bytes(), cudaMemcpyDeviceToHost));
        AttentionTimelineLaunch y;
        if (!attention_timeline_launch(t.data(), warps, merges, y)) fail("attention timeline: no warp stamped");
        span += (double)(y.end - y.start);
        for (auto [total, part] : {std::pair{&sum.entry, y.entry}, {&sum.entry_spread, y.entry_spread},
                                   {&sum.pre_wait, y.pre_wait}, {&sum.q, y.q}, {&sum.first, y.first},
                                   {&sum.loop, y.loop}, {&sum.steps, y.steps}, {&sum.barrier, y.barrier},
                                   {&sum.epilogue, y.epilogue}, {&sum.stores, y.stores}, {&sum.tail, y.tail},
                                   {&sum.merge_start, y.merge_start}, {&sum.merge_wait, y.merge_wait},
                                   {&sum.merge_run, y.merge_run}, {&sum.merge_loads, y.merge_loads},
                                   {&sum.merge_sums, y.merge_sums}, {&sum.merge_out, y.merge_out}})
            *total += part;
        // Per SM (slot 9): blocks placed on it and when its last warp finished.
        std::vector<double> done_at(sms, 0.0);
        std::vector<int> sm_warps(sms, 0);
        for (size_t w = 0; w < warps; ++w) {
            const uint64_t* tw = t.data() + w * kAttentionTimelineSlots;
            if (tw[0] == 0) continue;
            const size_t sm = std::min<size_t>(tw[9], (size_t)sms - 1);
            done_at[sm] = std::max(done_at[sm], (double)(tw[6] - y.start) / 1000.0);
            ++sm_warps[sm];
        }
        sm_done.push_back(done_at);
        for (int sm = 0; sm < sms; ++sm) {
            blocks_min = std::min(blocks_min, sm_warps[sm] / (int)kAttentionTimelineWarpsPerBlock);
            blocks_max = std::max(blocks_max, sm_warps[sm] / (int)kAttentionTimelineWarpsPerBlock);
        }
    }
    // Is an SM's finish time a property of the SM (the same SMs late in every launch)? The
    // mean correlation of per-SM finish times between consecutive launches says.
    std::vector<double> sm_mean(sms, 0.0);
    for (const auto& d : sm_done)
        for (int sm = 0; sm < sms; ++sm) sm_mean[sm] += d[sm] / (double)sm_done.size();
    const double corr = mean_consecutive_correlation(sm_done);
    const auto [sm_first, sm_last] = std::minmax_element(sm_mean.begin(), sm_mean.end());
    std::printf("  %s per SM: %d-%d blocks; last warp done at %.2f (earliest SM) .. %.2f (latest SM) us, mean of "
                "launches; launch-to-launch correlation of per-SM finish %.2f\n",
                name.c_str(), blocks_min, blocks_max, *sm_first, *sm_last, corr);
    const double L = kLaunches * 1000.0;  // ns sums over launches -> us means
    std::printf("  %s (%u splits, %zu warps, cold L2, us): span %.2f | per warp: entry %.2f (last %.2f), wait %.2f, "
                "q %.2f, first cells %.2f, loop %.2f (%.1f steps, %.3f per step), barrier %.2f, epilogue %.2f + "
                "stores %.2f | tail %.2f | merge: entry at %.2f, waits %.2f after the last warp, runs %.2f (per "
                "block: loads %.2f, sums %.2f, out %.2f)\n",
                name.c_str(), splits, warps, span / L, sum.entry / L, sum.entry_spread / L, sum.pre_wait / L, sum.q / L,
                sum.first / L, sum.loop / L, sum.steps / kLaunches,
                sum.loop / std::max(1.0, sum.steps - kLaunches) / 1000.0, sum.barrier / L, sum.epilogue / L,
                sum.stores / L, sum.tail / L, sum.merge_start / L, sum.merge_wait / L, sum.merge_run / L,
                sum.merge_loads / L, sum.merge_sums / L, sum.merge_out / L);
}

// Per-SM streaming speed (lab, no table row): for a long (8 MiB per SM, ~250 us) and a
// GEMV-sized (1 MiB per SM) launch, 12 launches each: per launch the spread of the blocks'
// durations; across launches the correlation of per-SM durations between consecutive
// launches and between the means of odd and even launches (1 = the same SMs slow every time).

// Lab ("stream shapes"): how fast ONE block per SM streams HBM with a given number of bytes in
// flight, the persistent decode kernel's situation (16 warps, ~174 KB of bulk copies in flight
// per SM; its layer streams at ~3.6 TB/s with no boundary at all, session 26) against the read
// ceiling's 2048 threads x 4 loads per SM. Loads: every thread keeps kLoads 16-byte loads in
// flight; bulk: every warp keeps `slots` bulk copies of `chunk` bytes in flight (lane 0 issues,
// an mbarrier per slot), the warps of a block taking adjacent chunks in turn.
template <int kLoads>
__global__ void __launch_bounds__(1024, 1) stream_loads_kernel(const uint4* p, size_t per_block, uint32_t* sink) {
    const uint4* base = p + blockIdx.x * per_block;
    uint32_t acc = 0;
    for (size_t i = threadIdx.x; i + (kLoads - 1) * (size_t)blockDim.x < per_block; i += kLoads * (size_t)blockDim.x) {
        uint4 v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) v[u] = __ldcs(base + i + u * (size_t)blockDim.x);
#pragma unroll
        for (int u = 0; u < kLoads; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

__global__ void __launch_bounds__(1024, 1) stream_bulk_kernel(const uint8_t* p, size_t per_block, uint32_t slots,
                                                              uint32_t chunk, uint32_t* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    uint8_t* ring = smem + (size_t)warp * slots * chunk;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + (size_t)warps * slots * chunk) + (size_t)warp * slots;
    const uint8_t* base = p + blockIdx.x * per_block;
    const size_t per_warp = per_block / chunk / warps;  // chunks warp, warp + warps, ...
    const uint64_t policy = l2_evict_first_policy();
    if (lane == 0) {
        for (uint32_t s = 0; s < slots; ++s) mbarrier_init(&bars[s], 1);
        mbarrier_init_fence();
        for (uint32_t s = 0; s < slots && s < per_warp; ++s) {
            mbarrier_arrive_expect_tx(&bars[s], chunk);
            bulk_copy_global_to_shared(ring + (size_t)s * chunk, base + ((size_t)s * warps + warp) * chunk, chunk, &bars[s],
                                       policy);
        }
    }
    __syncwarp();
    uint32_t acc = 0;
    for (size_t k = 0; k < per_warp; ++k) {
        const uint32_t s = (uint32_t)(k % slots);
        mbarrier_wait_parity(&bars[s], (uint32_t)(k / slots) & 1u);
        acc ^= reinterpret_cast<const uint32_t*>(ring + (size_t)s * chunk)[lane];
        __syncwarp();
        if (lane == 0 && k + slots < per_warp) {
            fence_proxy_async_shared();
            mbarrier_arrive_expect_tx(&bars[s], chunk);
            bulk_copy_global_to_shared(ring + (size_t)s * chunk, base + ((k + slots) * warps + warp) * chunk, chunk, &bars[s],
                                       policy);
        }
    }
    if (acc == 0x12345678u) *sink = acc;
#endif
}

void bench_stream_shapes(Report& r, const Options& o, int sms) {
    const std::string name = "stream shapes";
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const size_t per_sm = size_t(8) << 20, region = per_sm * sms;
    DeviceBuffer<uint8_t> buf(2 * region);
    DeviceBuffer<uint32_t> sink(1);
    fill_type(GgmlType::F16, buf.data(), buf.size(), 11);
    const auto src = [&](int i) { return buf.data() + (size_t)(i % 2) * region; };
    const auto loads = [&](auto kernel, int threads, int in_flight) {
        SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024));
        const double us = median_us([&](cudaStream_t st, int i) {
            kernel<<<sms, threads, 160 * 1024, st>>>(reinterpret_cast<const uint4*>(src(i)), per_sm / 16, sink.data());
            SPILLWAY_CUDA_CHECK(cudaGetLastError());
        }, 6);
        r.add(name + " loads", std::to_string(threads) + " threads x " + std::to_string(in_flight) + " in flight, " +
                                   std::to_string(threads * in_flight * 16 / 1024) + " KB/SM", (double)region, us);
    };
    loads(stream_loads_kernel<4>, 512, 4);
    loads(stream_loads_kernel<8>, 512, 8);
    loads(stream_loads_kernel<16>, 512, 16);
    loads(stream_loads_kernel<4>, 1024, 4);
    loads(stream_loads_kernel<8>, 1024, 8);
    int major = 0;
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) return;
    SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(stream_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    struct Shape { uint32_t warps, slots, chunk; };
    for (const Shape sh : {Shape{16, 2, 2048}, Shape{16, 4, 2048}, Shape{16, 5, 2176}, Shape{16, 6, 2048}, Shape{16, 10, 1088},
                           Shape{16, 3, 4096}, Shape{16, 1, 8192}, Shape{16, 2, 6144}, Shape{8, 2, 12288}, Shape{4, 3, 16384},
                           Shape{32, 3, 2048}, Shape{32, 1, 6144}}) {
        // (at least 120 KB, so that no SM holds two blocks)
        const size_t smem = std::max<size_t>((size_t)sh.warps * sh.slots * (sh.chunk + 8), 120 * 1024);
        const double us = median_us([&](cudaStream_t st, int i) {
            stream_bulk_kernel<<<sms, sh.warps * 32, smem, st>>>(src(i), per_sm, sh.slots, sh.chunk, sink.data());
            SPILLWAY_CUDA_CHECK(cudaGetLastError());
        }, 6);
        const double streamed = (double)sms * (per_sm / sh.chunk / sh.warps) * sh.warps * sh.chunk;  // whole chunks per warp
        r.add(name + " bulk", std::to_string(sh.warps) + " warps x " + std::to_string(sh.slots) + " x " + std::to_string(sh.chunk) +
                                  " B, " + std::to_string(sh.warps * sh.slots * sh.chunk / 1024) + " KB/SM",
              streamed, us);
    }
}

// Lab ("stream chain"): the floor of the separate-launch decode design. One 14B layer's GEMV
// weights (qkv 39.0, wo 27.9, gate|up 150.4, down 75.2 MB) streamed with no arithmetic at
// all: as one launch; as four plain launches; as four programmatic launches chained as the
// engine chains its GEMVs (each releases the next at entry and waits for its predecessor
// after its first loads); and as four programmatic launches that never wait (what perfect
// overlap between launches would give). Each block reads a contiguous region with every
// thread keeping kLoads 16-byte loads in flight; 512 threads and no shared memory, so the next
// launch's blocks fit beside this one's on an SM.
template <int kLoads>
__global__ void __launch_bounds__(512) stream_phase_kernel(const uint4* p, size_t n_vecs, uint32_t wait, uint32_t* sink) {
    pdl_release_dependents();
    const size_t per_block = (n_vecs + gridDim.x - 1) / gridDim.x;
    const size_t begin = min(n_vecs, blockIdx.x * per_block), end = min(n_vecs, begin + per_block);
    uint32_t acc = 0;
    size_t i = begin + threadIdx.x;
    for (bool first = true; i + (kLoads - 1) * (size_t)blockDim.x < end; i += kLoads * (size_t)blockDim.x, first = false) {
        uint4 v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) v[u] = __ldcs(p + i + u * (size_t)blockDim.x);
        if (first && wait) pdl_wait_for_producer();  // the GEMV's dependency wait, behind its first loads
#pragma unroll
        for (int u = 0; u < kLoads; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

void bench_stream_chain(Report& r, const Options& o, int sms) {
    const std::string name = "stream chain";
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const std::vector<std::pair<uint32_t, uint32_t>> shapes{{7168, 5120}, {5120, 5120}, {27648, 5120}, {5120, 13824}};
    std::vector<size_t> part_vecs;
    size_t layer_bytes = 0;
    for (const auto& [rows, cols] : shapes) {
        const size_t bytes = (*ggml_row_bytes(GgmlType::Q8_0, cols) * rows + 15) / 16 * 16;
        part_vecs.push_back(bytes / 16);
        layer_bytes += bytes;
    }
    const size_t n_sets = rotation_count(layer_bytes);
    DeviceBuffer<uint8_t> buf(n_sets * layer_bytes);
    fill_type(GgmlType::F16, buf.data(), buf.size(), 13);
    DeviceBuffer<uint32_t> sink(1);
    const auto set = [&](int i) { return reinterpret_cast<const uint4*>(buf.data() + (size_t)(i % n_sets) * layer_bytes); };
    constexpr int kLoads = 8;
    for (const int blocks_per_sm : {1, 2}) {
        const dim3 grid(sms * blocks_per_sm), block(512);
        const std::string shape = std::to_string(blocks_per_sm) + " x 512 thr/SM x " + std::to_string(kLoads) + " loads";
        r.add(name + " one launch", shape, (double)layer_bytes, median_us([&](cudaStream_t st, int i) {
            launch_with_pdl(false, stream_phase_kernel<kLoads>, grid, block, 0, st, set(i), layer_bytes / 16, 0u, sink.data());
        }, o.iters));
        struct Mode { const char* label; bool pdl; uint32_t wait; };
        for (const Mode m : {Mode{" 4 plain", false, 0u}, Mode{" 4 chained", true, 1u}, Mode{" 4 no wait", true, 0u}}) {
            r.add(name + m.label, shape, (double)layer_bytes, median_us([&](cudaStream_t st, int i) {
                const uint4* p = set(i);
                for (const size_t vecs : part_vecs) {
                    launch_with_pdl(m.pdl, stream_phase_kernel<kLoads>, grid, block, 0, st, p, vecs, m.wait, sink.data());
                    p += vecs;
                }
            }, o.iters));
        }
    }
}

void bench_sm_speed(const Options& o, int sms) {
    if (!o.only.empty() && std::string("sm speed").find(o.only) == std::string::npos) return;
    constexpr int kLaunches = 12;
    constexpr int kSmem = 160 * 1024;
    SPILLWAY_CUDA_CHECK(cudaFuncSetAttribute(sm_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    for (const size_t per_sm : {size_t(8) << 20, size_t(1) << 20}) {
        const size_t region = per_sm * sms;
        const int copies = (int)std::max<size_t>(2, (kRotateBytes + region - 1) / region);
        DeviceBuffer<uint8_t> buf(region * copies);
        DeviceBuffer<uint64_t> stamps(3 * (size_t)sms * kLaunches);
        DeviceBuffer<uint32_t> sink(1);
        fill_type(GgmlType::F16, buf.data(), buf.size(), 7);
        for (int l = -2; l < kLaunches; ++l) {  // two untimed launches first
            const uint4* src = reinterpret_cast<const uint4*>(buf.data() + (size_t)((l + 2) % copies) * region);
            sm_stream_kernel<<<sms, 512, kSmem>>>(src, per_sm / 16, stamps.data() + 3 * (size_t)sms * std::max(l, 0), sink.data());
            SPILLWAY_CUDA_CHECK(cudaGetLastError());
        }
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint64_t> h(stamps.size());
        SPILLWAY_CUDA_CHECK(cudaMemcpy(h.data(), stamps.data(), stamps.bytes(), cudaMemcpyDeviceToHost));
        // dur[l][k] in us for the k-th SM id seen in launch 0 (%smid values need not be
        // contiguous); a launch that put two blocks on one SM is reported and skipped.
        constexpr uint64_t kMaxSmId = 1024;
        std::vector<int> slot_of(kMaxSmId, -1);
        std::vector<int> sm_of;
        for (int b = 0; b < sms; ++b) {
            const uint64_t id = h[3 * (size_t)b];
            if (id < kMaxSmId && slot_of[id] < 0) slot_of[id] = (int)sm_of.size(), sm_of.push_back((int)id);
        }
        std::vector<std::vector<double>> dur;
        double spread_sum = 0, span_sum = 0, start_skew_sum = 0;
        for (int l = 0; l < kLaunches; ++l) {
            std::vector<double> d(sm_of.size(), -1.0);
            uint64_t first = UINT64_MAX, last_start = 0, last_end = 0;
            bool shared = false;
            for (int b = 0; b < sms; ++b) {
                const uint64_t* s = h.data() + 3 * ((size_t)l * sms + b);
                const int k = s[0] < kMaxSmId ? slot_of[s[0]] : -1;
                if (k < 0 || d[k] >= 0) { shared = true; continue; }
                d[k] = (s[2] - s[1]) / 1e3;
                first = std::min(first, s[1]), last_start = std::max(last_start, s[1]), last_end = std::max(last_end, s[2]);
            }
            if (shared || (int)sm_of.size() != sms) {
                std::printf("sm speed: launch %d had two blocks on one SM, skipped\n", l);
                continue;
            }
            const auto [mn, mx] = std::minmax_element(d.begin(), d.end());
            spread_sum += (*mx - *mn) / *mn;
            span_sum += (last_end - first) / 1e3;
            start_skew_sum += (last_start - first) / 1e3;
            dur.push_back(d);
        }
        if (dur.size() < 4) continue;
        const size_t n = dur.size();
        const double consecutive = mean_consecutive_correlation(dur);
        std::vector<double> odd(sms, 0.0), even(sms, 0.0), mean(sms, 0.0);
        for (size_t l = 0; l < n; ++l)
            for (int s = 0; s < sms; ++s) (l % 2 ? odd : even)[s] += dur[l][s], mean[s] += dur[l][s] / n;
        std::vector<int> order(sms);
        for (int s = 0; s < sms; ++s) order[s] = s;
        std::sort(order.begin(), order.end(), [&](int a, int b) { return mean[a] > mean[b]; });
        const double mean_all = std::accumulate(mean.begin(), mean.end(), 0.0) / sms;
        std::printf("sm speed %zu MiB per SM (%zu launches): span %.1f us, start skew %.1f us, duration spread (max-min)/min "
                    "%.1f%%; per-SM mean %.1f us, slowest %.1f (SM %d), fastest %.1f (SM %d); correlation consecutive %.2f, "
                    "odd vs even means %.2f\n",
                    per_sm >> 20, n, span_sum / n, start_skew_sum / n, 100.0 * spread_sum / n, mean_all, mean[order[0]],
                    sm_of[order[0]], mean[order[sms - 1]], sm_of[order[sms - 1]], consecutive, correlation(odd, even));
        std::printf("  slowest SMs by mean (us):");
        for (int k = 0; k < 16; ++k) std::printf(" %d:%.1f", sm_of[order[k]], mean[order[k]]);
        std::vector<double> by_id(kMaxSmId, 0.0);
        int max_id = 0;
        for (int k = 0; k < sms; ++k) by_id[sm_of[k]] = mean[k] / mean_all, max_id = std::max(max_id, sm_of[k]);
        std::printf("\n  per-SM mean / overall mean by SM id 0..%d (0 = absent):", max_id);
        for (int id = 0; id <= max_id; ++id) std::printf("%s%.3f", id % 16 ? " " : "\n   ", by_id[id]);
        std::printf("\n");
    }
}

void bench_small_ops(Report& r, const Options& o) {
    if (!o.only.empty() && std::string("small").find(o.only) == std::string::npos) return;
    const uint32_t dim = 5120, ffn = 13824;
    DeviceBuffer<float> x(dim), add(dim), w(dim), out(dim), gate(ffn), up(ffn), h(ffn), qk(48 * 128);
    for (auto* b : {&x, &add, &w, &out}) fill_f32<<<16, 256>>>(b->data(), b->size(), 3);
    for (auto* b : {&gate, &up, &qk}) fill_f32<<<16, 256>>>(b->data(), b->size(), 4);
    std::vector<double> inv(64);
    for (int i = 0; i < 64; ++i) inv[i] = std::pow(1e6, -2.0 * i / 128);
    DeviceBuffer<double> d_inv(64);
    SPILLWAY_CUDA_CHECK(cudaMemcpy(d_inv.data(), inv.data(), d_inv.bytes(), cudaMemcpyHostToDevice));
    const int32_t pos_host = 65000;
    DeviceBuffer<int32_t> pos(1);
    SPILLWAY_CUDA_CHECK(cudaMemcpy(pos.data(), &pos_host, 4, cudaMemcpyHostToDevice));
    RopeDeviceTables rt;
    rt.neox = true;
    rt.n_dims = 128;
    rt.inv_freq = d_inv.data();
    DeviceBuffer<uint8_t> cache(kv_row_bytes(KvType::q8_0, 1024) * 16);
    DeviceBuffer<int16_t> xq(ffn);
    DeviceBuffer<float> xd(ffn / 32);
    const ActQ16 aq{xq.data(), xd.data()};
    r.add("rmsnorm+add", "1x5120", 4.0 * dim * 5, median_us([&](cudaStream_t st, int) {
        rmsnorm_cuda(x.data(), add.data(), w.data(), out.data(), 1, dim, 1e-6f, st); }, o.iters));
    r.add("rmsnorm+add+q16", "1x5120", 4.0 * dim * 5 + 2.125 * dim, median_us([&](cudaStream_t st, int) {
        rmsnorm_cuda(x.data(), add.data(), w.data(), out.data(), 1, dim, 1e-6f, st, aq); }, o.iters));
    r.add("quantize q16", "5120", 6.125 * dim, median_us([&](cudaStream_t st, int) {
        quantize_act_q16_cuda(out.data(), dim, 1, aq, st); }, o.iters));
    r.add("swiglu q16", "13824", 10.125 * ffn, median_us([&](cudaStream_t st, int) {
        swiglu_q16_cuda(gate.data(), up.data(), ffn, aq, st); }, o.iters));
    r.add("rope neox", "48 heads x128", 2.0 * 4 * qk.size(), median_us([&](cudaStream_t st, int) {
        rope_cuda(rt, qk.data(), 1, 48, 128, pos.data(), st); }, o.iters));
    r.add("swiglu", "13824", 3.0 * 4 * ffn, median_us([&](cudaStream_t st, int) {
        swiglu_cuda(gate.data(), up.data(), h.data(), ffn, st); }, o.iters));
    r.add("kv_write q8_0", "1x1024", 4.0 * 1024 + 34 * 32, median_us([&](cudaStream_t st, int i) {
        kv_write_cuda(KvType::q8_0, qk.data(), cache.data(), i % 16, 1, 1024, st); }, o.iters));
    // The fused decode step after the QKV matvec (bias + RoPE + K/V write), 14B shape.
    DeviceBuffer<float> qkv(40 * 128 + 2 * 1024), bias(40 * 128 + 2 * 1024);
    for (auto* b : {&qkv, &bias}) fill_f32<<<16, 256>>>(b->data(), b->size(), 5);
    DeviceBuffer<uint8_t> v_cache(kv_row_bytes(KvType::q8_0, 1024) * 16);
    r.add("qkv_post q8_0/q8_0", "40/8x128", 4.0 * 2 * qkv.size() + 2 * 34 * 32, median_us([&](cudaStream_t st, int i) {
        qkv_post_cuda(QkvPostShape{40, 8, 128}, rt, qkv.data(), qkv.data() + 40 * 128, qkv.data() + 40 * 128 + 1024,
                      bias.data(), 1, pos.data(), KvType::q8_0, cache.data(), KvType::q8_0, v_cache.data(), i % 16, st); }, o.iters));
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = std::max(5, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) o.only = argv[++i];
        else {
            std::fprintf(stderr, "usage: bench_kernels [--iters N] [--only SUBSTRING]\n");
            return 2;
        }
    }
    try {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            std::printf("bench_kernels: no CUDA device\n");
            return 0;
        }
        cudaDeviceProp prop{};
        SPILLWAY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
        Report r;
        bench_ceilings(r, o);
        for (GgmlType t : {GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16}) {
            bench_matvec(r, o, t, 5120, 13824, 1);
            bench_matvec(r, o, t, 13824, 5120, 1);
            bench_matvec(r, o, t, 152064, 5120, 1);
        }
        // Q8_0 variants side by side (the default row above is matvec_q8_0_kernel_for's pick).
        for (MatvecQ8Kernel k : {MatvecQ8Kernel::staged, MatvecQ8Kernel::stream2, MatvecQ8Kernel::stream3,
                                 MatvecQ8Kernel::stream2_i8}) {
            bench_matvec(r, o, GgmlType::Q8_0, 5120, 13824, 1, k);
            bench_matvec(r, o, GgmlType::Q8_0, 13824, 5120, 1, k);
            bench_matvec(r, o, GgmlType::Q8_0, 152064, 5120, 1, k);
            bench_matvec(r, o, GgmlType::Q8_0, 27648, 5120, 1, k);  // 14B gate|up as one launch
        }
        bench_matvec(r, o, GgmlType::Q8_0, 5120, 5120, 1);
        // Pre-quantized x (the decode path): the 14B shapes, default pick then every variant.
        for (std::optional<MatvecQ16xKernel> k : {std::optional<MatvecQ16xKernel>{}, std::optional{MatvecQ16xKernel::smem4},
                                                  std::optional{MatvecQ16xKernel::smem8}, std::optional{MatvecQ16xKernel::smem4_r1},
                                                  std::optional{MatvecQ16xKernel::smem8_r1},
                                                  std::optional{MatvecQ16xKernel::smem4_s3},
                                                  std::optional{MatvecQ16xKernel::smem4_s4}}) {
            for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
                     {5120, 13824}, {13824, 5120}, {152064, 5120}, {27648, 5120}, {7168, 5120}, {5120, 5120}})
                bench_matvec_q16x(r, o, rows, cols, k);
        }
        bench_q16x_layer_chain(r, o);
        for (int ki = 0; ki <= (int)MatvecQ8sKernel::sweep1r8; ++ki) {
            const auto k = (MatvecQ8sKernel)ki;
            for (const auto& [rows, cols] : std::vector<std::pair<uint32_t, uint32_t>>{
                     {5120, 13824}, {13824, 5120}, {152064, 5120}, {27648, 5120}, {7168, 5120}, {5120, 5120}})
                bench_matvec_q8s(r, o, rows, cols, k);
            bench_q8s_layer_chain(r, o, k, false);
            bench_q8s_layer_chain(r, o, k, true);
        }
        for (const char* variant : {"", "empty", "glu", "chain", "chain-fence", "chain-skip", "chain-wowait"})
            bench_q8s_layer_hops(r, o, MatvecQ8sKernel::sweep1r2, variant);
        for (const char* mode : {"chain", "empty", "small", "norm-chain", "norm-chain-fence", "norm-chain-skip",
                                 "norm-chain-wowait"})
            bench_q8s_hop_timeline(o, mode);
        for (const char* which : {"", "norms", "swiglu", "adds"}) bench_q8s_layer_chain_fused(r, o, which);
        bench_decode_layer(r, o);
        bench_matvec(r, o, GgmlType::Q8_0, 896, 896, 1);  // 0.5B shape: unaligned rows, launch-bound
        for (uint32_t n : {2u, 4u, 8u}) bench_matvec(r, o, GgmlType::Q8_0, 13824, 5120, n);
        for (uint32_t n : {4u, 8u}) bench_matvec(r, o, GgmlType::F16, 13824, 5120, n);
        for (uint32_t cells : {8192u, 32768u, 65536u}) {
            bench_attention(r, o, KvType::f16, KvType::f16, cells, prop.multiProcessorCount);
            bench_attention(r, o, KvType::q8_0, KvType::q8_0, cells, prop.multiProcessorCount);
            bench_attention(r, o, KvType::q4_0, KvType::q4_0, cells, prop.multiProcessorCount);
        }
        bench_attention(r, o, KvType::q8_0, KvType::q4_0, 65536, prop.multiProcessorCount);
        // Time against depth for the default pick ("attention scan"): the intercept of a line
        // through these rows is the launch's fixed cost.
        for (KvType t : {KvType::f16, KvType::q8_0, KvType::q4_0})
            for (uint32_t cells : {16384u, 24576u, 32768u, 49152u, 65536u, 98304u, 131072u})
                bench_attention(r, o, t, t, cells, prop.multiProcessorCount, nullptr, "attention scan ");
        for (KvType t : {KvType::f16, KvType::q8_0, KvType::q4_0})
            for (uint32_t cells : {32768u, 65536u, 131072u})
                bench_attention_timeline(o, t, t, cells, prop.multiProcessorCount);
        // Quantized-K attention kernels side by side (the rows above use the default pick).
        for (AttentionKernel k : {AttentionKernel::tensor_core, AttentionKernel::int_dot})
            for (KvType t : {KvType::q8_0, KvType::q4_0})
                for (uint32_t cells : {8192u, 65536u}) bench_attention(r, o, t, t, cells, prop.multiProcessorCount, &k);
        // Every kernel for f16 KV and the mixed pair, at 8k and 64k (the default rows above
        // are the pick).
        // The explicit mma rows are the single-warp kernel (the default rows above take the
        // warp-specialized one where it is the default; the ws rows below force it).
        attention_mma::lab_warp_specialized(0, 0);
        for (AttentionKernel k : {AttentionKernel::tensor_core, AttentionKernel::mma})
            for (uint32_t cells : {8192u, 65536u}) {
                bench_attention(r, o, KvType::f16, KvType::f16, cells, prop.multiProcessorCount, &k);
                if (k == AttentionKernel::mma)
                    for (KvType t : {KvType::q8_0, KvType::q4_0})
                        bench_attention(r, o, t, t, cells, prop.multiProcessorCount, &k);
            }
        for (AttentionKernel k : {AttentionKernel::int_dot, AttentionKernel::mma})
            bench_attention(r, o, KvType::q8_0, KvType::q4_0, 65536, prop.multiProcessorCount, &k);
        attention_mma::lab_warp_specialized(-1, -1);
        // The mma kernel's warp-specialized variant (lab, session 55) at 4 and 8 streams per block,
        // beside the mma rows above.
        // "bk": per-block K steps for the equal quantized pairs too.
        for (int variant : {4, 8, -4}) {
            const AttentionKernel mma = AttentionKernel::mma;
            const int streams = variant < 0 ? -variant : variant;
            const std::string prefix = "attention ws" + std::to_string(streams) + (variant < 0 ? "bk " : " ");
            attention_mma::lab_warp_specialized(streams, variant < 0 ? 1 : 0);
            for (uint32_t cells : {8192u, 32768u, 65536u})
                for (KvType t : {KvType::q8_0, KvType::q4_0})  // (f16 V stays on the single-warp kernel)
                    bench_attention(r, o, t, t, cells, prop.multiProcessorCount, &mma, prefix.c_str());
            bench_attention(r, o, KvType::q8_0, KvType::q4_0, 65536, prop.multiProcessorCount, &mma, prefix.c_str());
            attention_mma::lab_warp_specialized(-1, -1);
        }
        bench_small_ops(r, o);
        bench_sm_speed(o, prop.multiProcessorCount);
        bench_stream_shapes(r, o, prop.multiProcessorCount);
        bench_stream_chain(r, o, prop.multiProcessorCount);

        std::printf("\n| kernel | shape | MB moved | median us | GB/s | %% HBM read (%.0f) | %% copy (%.0f) |\n",
                    r.read_gbps, r.copy_gbps);
        std::printf("|---|---|---:|---:|---:|---:|---:|\n");
        for (const Row& row : r.rows)
            std::printf("| %s | %s | %.1f | %.2f | %.0f | %.1f%% | %.1f%% |\n", row.kernel.c_str(), row.shape.c_str(),
                        row.mbytes, row.us, row.gbps, 100.0 * row.gbps / r.read_gbps, 100.0 * row.gbps / r.copy_gbps);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_kernels: %s\n", e.what());
        return 1;
    }
    return 0;
}
