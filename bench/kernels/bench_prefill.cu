// Prefill micro-benchmarks on the Qwen2.5-14B shape (40 query heads, 8 KV heads, dim 128;
// 5120 / 13824 hidden): achieved TFLOP/s against the dense f16 tensor rate.
//  - attention: one layer's causal prefill attention over a whole prompt (8k or 64k tokens)
//    run chunk by chunk as the engine does, per kernel and K/V tier; flops = 4 * D * (cells
//    each query token sees) per query head.
//  - GEMM: matmul_prefill_cuda on Q8_0 weights (tile dequantization to f16 + cuBLAS) for
//    chunks of 512..4096 tokens, next to the dequantization alone and cuBLAS alone (f16
//    weights in place), to see what the dequantization costs.
//    Where the Hopper kernel runs (sm_90a), the same weights in the split layout through
//    prefill_gemm_q8s_cuda (codes converted in registers), per block width.
//    Grouped launches (q|k|v, gate|up, gate|up + SwiGLU) and down with a split over k.
//  - GEMM sequence: a layer boundary's down -> RMSNorm -> q -> q-shaped, each step event-timed.
//  - small ops: a 2048-token chunk's RMSNorm (+ residual add, f16 out), bias + RoPE + K/V
//    write (qkv_post) and SwiGLU (f16 out), in us and GB/s of the bytes they must move.
// Median of a few event-timed repetitions (each is milliseconds long, so event overhead is
// negligible).
//
// Usage: bench_prefill [--only SUBSTRING] [--reps N] [--tokens T (the GEMM rows' chunk length)] [--energy-ms MS]
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernels/gpu_energy.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_prefill.cuh"
#include "engine/cuda/matvec_q8s.cuh"
#include "engine/cuda/prefill_attention_wgmma.cuh"
#include "engine/cuda/prefill_gemm_q8s.cuh"
#include "engine/cuda/prefill_attention_ws.cuh"
#include "engine/cpu/rope.h"
#include "engine/cuda/qkv_post.cuh"
#include "engine/cuda/rmsnorm.cuh"
#include "engine/cuda/rope.cuh"
#include "engine/cuda/swiglu.cuh"
#include "gguf/ggml_types.h"

using namespace spillway;

namespace {

__device__ uint32_t mix32(uint64_t i, uint32_t salt) {
    uint32_t x = (uint32_t)(i ^ (i >> 32)) * 0x9E3779B1u ^ salt;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    return x ^ (x >> 16);
}
__device__ float unit(uint64_t i, uint32_t salt) { return (mix32(i, salt) >> 8) * (2.0f / 16777216.0f) - 1.0f; }

// Random valid data of a GGUF block type: f16 values in [-1, 1), or random quants with a
// small positive f16 scale at the start of each block (one thread per block or value).
__global__ void fill_kernel(uint8_t* p, uint64_t bytes, int type, uint32_t salt) {
    const uint32_t block = type == (int)GgmlType::Q8_0 ? 34 : type == (int)GgmlType::Q4_0 ? 18 : 2;
    const uint64_t n = bytes / block;
    for (uint64_t b = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; b < n; b += (uint64_t)gridDim.x * blockDim.x) {
        uint8_t* dst = p + b * block;
        if (block == 2) {
            *reinterpret_cast<__half*>(dst) = __float2half(unit(b, salt));
            continue;
        }
        *reinterpret_cast<__half*>(dst) = __float2half(0.01f * (1.5f + unit(b, salt)));
        for (uint32_t i = 2; i < block; ++i) dst[i] = (uint8_t)mix32(b * 64 + i, salt + 7);
    }
}
__global__ void fill_f32_kernel(float* p, size_t n, uint32_t salt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = unit(i, salt);
}

void fill(GgmlType type, uint8_t* p, uint64_t bytes, uint32_t salt) {
    fill_kernel<<<4096, 256>>>(p, bytes, (int)type, salt);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
}
GgmlType ggml_of(KvType t) { return t == KvType::f16 ? GgmlType::F16 : t == KvType::q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0; }

struct Options {
    std::string only;
    int reps = 3;
    uint32_t tokens = 0;  // the GEMM rows' chunk length only (0: every one)
    bool runs_tokens(uint32_t T) const { return tokens == 0 || tokens == T; }
};

// Keeps every SM busy for about `seconds`: the GPU comes up idle at a few hundred MHz, and a
// process's first rows ran ~10% slow against the same rows run later (session 45), which biased
// any A/B whose baseline ran first.
__global__ void spin_kernel(long long cycles, int* sink) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}
void warm_up_clocks(double seconds) {
    DeviceBuffer<int> sink(1);
    cudaEvent_t a, b;
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&a));
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&b));
    float ms = 0.0f;
    for (double spent = 0.0; spent < seconds * 1000.0; spent += ms) {
        SPILLWAY_CUDA_CHECK(cudaEventRecord(a));
        spin_kernel<<<1024, 256>>>(20'000'000, sink.data());  // ~10-60 ms by clock
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
        SPILLWAY_CUDA_CHECK(cudaEventRecord(b));
        SPILLWAY_CUDA_CHECK(cudaEventSynchronize(b));
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

// The GPU's energy counter (NVML, when the driver's library is there): a row's joules per run,
// mean power and SM clock, beside its time. They come from a window of back-to-back runs after the
// timed ones (`--energy-ms`, default 1500; 0: no energy columns), read between two steps of the
// counter (EnergyWindow, gpu_energy.h).
int current_device() {
    int dev = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    return dev;
}
const GpuEnergy& gpu_energy() {
    static const GpuEnergy energy(current_device());
    return energy;
}
int g_energy_ms = 1500;

struct Timed {
    double ms = 0;                      // median over the timed runs
    std::optional<double> joules;       // per run, in the energy window
    std::optional<double> watts;        // mean over the energy window
    std::optional<unsigned> sm_mhz;     // mean over the energy window
};

Timed median_ms(const std::function<void()>& run, int reps) {
    run();  // warm-up: module load, shared-memory attributes, cuBLAS heuristics
    SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&a));
    SPILLWAY_CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> ms(reps);
    for (int r = 0; r < reps; ++r) {
        SPILLWAY_CUDA_CHECK(cudaEventRecord(a));
        run();
        SPILLWAY_CUDA_CHECK(cudaEventRecord(b));
        SPILLWAY_CUDA_CHECK(cudaEventSynchronize(b));
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&ms[r], a, b));
    }
    Timed t;
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    t.ms = ms[reps / 2];
    if (g_energy_ms > 0 && gpu_energy().joules() && t.ms > 0) {
        const int n = std::max(1, (int)std::ceil(g_energy_ms / t.ms));
        EnergyWindow window(gpu_energy());
        SPILLWAY_CUDA_CHECK(cudaEventRecord(a));
        for (int r = 0; r < n; ++r) run();
        SPILLWAY_CUDA_CHECK(cudaEventRecord(b));
        SPILLWAY_CUDA_CHECK(cudaEventSynchronize(b));
        float window_ms = 0;
        SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&window_ms, a, b));
        if (const auto reading = window.finish()) {
            t.watts = reading->watts;
            t.joules = reading->watts * (window_ms * 1e-3 / n);
            t.sm_mhz = reading->sm_mhz;
        }
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t;
}

int sm_count() {
    int dev = 0, sms = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&dev));
    SPILLWAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
}

// A row: time and TFLOP/s, then the energy columns (TFLOP per kJ = GFLOP per J; "-" without
// NVML's counter).
void row(const std::string& what, const std::string& shape, double flops, const Timed& t) {
    std::printf("| %s | %s | %.3f | %.1f |", what.c_str(), shape.c_str(), t.ms, flops / (t.ms * 1e9));
    if (t.joules && t.watts)
        std::printf(" %.3f | %.0f | %.0f |", *t.joules, *t.watts, flops / (*t.joules * 1e9));
    else
        std::printf(" - | - | - |");
    if (t.sm_mhz) std::printf(" %u |\n", *t.sm_mhz);
    else std::printf(" - |\n");
    std::fflush(stdout);
}

// One layer's attention (14B shape, random K/V of the tiers and random q) over a whole prompt
// of n_prompt tokens in chunks of `chunk`, timed and printed as a row; attend(s, q, k, v,
// pos0, n_tokens, out) runs one chunk.
template <typename Attend>
void time_prompt_attention(const Options& o, const std::string& name, const std::string& shape_note, KvType kt,
                           KvType vt, uint32_t n_prompt, uint32_t chunk, Attend&& attend) {
    const AttentionShape s{40, 8, 128, 128, 1.0f / std::sqrt(128.0f)};
    const uint64_t k_row = kv_row_bytes(kt, 8 * 128), v_row = kv_row_bytes(vt, 8 * 128);
    DeviceBuffer<uint8_t> k(k_row * n_prompt), v(v_row * n_prompt);
    fill(ggml_of(kt), k.data(), k.bytes(), 11);
    fill(ggml_of(vt), v.data(), v.bytes(), 12);
    DeviceBuffer<float> q((size_t)chunk * 40 * 128), out((size_t)chunk * 40 * 128);
    fill_f32_kernel<<<1024, 256>>>(q.data(), q.size(), 13);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    const Timed timed = median_ms([&] {
        for (uint32_t pos0 = 0; pos0 < n_prompt; pos0 += chunk)
            attend(s, q.data(), k.data(), v.data(), pos0, std::min(chunk, n_prompt - pos0), out.data());
    }, o.reps);
    // Query token p sees p + 1 cells: sum = n (n + 1) / 2 per query head.
    const double flops = 4.0 * 128 * 40 * ((double)n_prompt * (n_prompt + 1) / 2);
    row(name, std::to_string(n_prompt / 1024) + "k prompt, chunk " + std::to_string(chunk) + shape_note, flops, timed);
}

// One kernel on the cells as they are in the cache.
void bench_attention(const Options& o, PrefillAttentionKernel kernel, KvType kt, KvType vt, uint32_t n_prompt,
                     uint32_t chunk) {
    const std::string name = std::string("prefill attention ") + prefill_attention_kernel_name(kernel) + " " +
                             kv_type_name(kt) + "/" + kv_type_name(vt);
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    time_prompt_attention(o, name, "", kt, vt, n_prompt, chunk,
                          [&](const AttentionShape& s, const float* q, const uint8_t* k, const uint8_t* v, uint32_t pos0,
                              uint32_t n_tokens, float* out) {
                              prefill_attention_partial_cuda_with(kernel, s, q, kt, k, vt, v, 0, pos0 + chunk, pos0,
                                                                  n_tokens, out, nullptr, nullptr);
                          });
}

// One schedule of the wgmma kernels on f16 cells (where they cannot run: the m32 fallback is
// not timed, the row says so).
void bench_wgmma_schedule(const Options& o, WgmmaSchedule schedule, const char* schedule_name, uint32_t n_prompt,
                          uint32_t chunk) {
    const std::string name = std::string("prefill attention wgmma schedule ") + schedule_name + " f16/f16";
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    if (!prefill_attention_wgmma_available() || (schedule == WgmmaSchedule::specialized && !prefill_attention_ws_available())) {
        std::printf("| %s | not available on this GPU / build | - | - |\n", name.c_str());
        return;
    }
    time_prompt_attention(o, name, "", KvType::f16, KvType::f16, n_prompt, chunk,
                          [&](const AttentionShape& s, const float* q, const uint8_t* k, const uint8_t* v, uint32_t pos0,
                              uint32_t n_tokens, float* out) {
                              prefill_attention_wgmma_cuda(s, q, KvType::f16, k, KvType::f16, v, 0, pos0 + chunk, pos0,
                                                           n_tokens, out, nullptr, nullptr, schedule);
                          });
}

// The engine's path for a quantized cache: prefill_attention_cuda with f16 pieces (each
// piece dequantized once, then the default f16 kernel; partials merged).
void bench_attention_pieces(const Options& o, KvType kt, KvType vt, uint32_t n_prompt, uint32_t chunk) {
    const std::string name = std::string("prefill attention dequantized pieces ") + kv_type_name(kt) + "/" +
                             kv_type_name(vt);
    if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
    const uint32_t piece = prefill_kv_f16_piece_cells(8 * 128);
    DeviceBuffer<__half> kf((size_t)piece * 8 * 128), vf((size_t)piece * 8 * 128);
    DeviceBuffer<float> piece_out((size_t)chunk * 40 * 128), piece_lse((size_t)chunk * 40), lse((size_t)chunk * 40);
    const PrefillKvF16Scratch scratch{kf.data(), vf.data(), piece, piece_out.data(), piece_lse.data(), lse.data()};
    time_prompt_attention(o, name, ", pieces of " + std::to_string(piece), kt, vt, n_prompt, chunk,
                          [&](const AttentionShape& s, const float* q, const uint8_t* k, const uint8_t* v, uint32_t pos0,
                              uint32_t n_tokens, float* out) {
                              prefill_attention_cuda(s, q, kt, k, vt, v, pos0, n_tokens, out, nullptr, &scratch);
                          });
}

// GGUF Q8_0 rows on the device repacked into the split layout the Hopper GEMM reads; rows(r0, n)
// views n of them from row r0.
struct SplitWeights {
    DeviceBuffer<int8_t> codes;
    DeviceBuffer<uint16_t> scales;
    uint32_t n_in = 0;
    SplitWeights(const uint8_t* gguf_rows, uint32_t n_rows, uint32_t n_in_)
        : codes((size_t)n_rows * n_in_), scales((size_t)n_rows * (n_in_ / 32)), n_in(n_in_) {
        q8_0_to_split_cuda(gguf_rows, n_rows, n_in, Q8Split{codes.data(), scales.data()}, nullptr);
    }
    CudaMatrix rows(uint32_t r0, uint32_t n) const {
        CudaMatrix w{GgmlType::Q8_0, reinterpret_cast<const uint8_t*>(codes.data()) + (uint64_t)r0 * n_in, n_in, n,
                     *ggml_row_bytes(GgmlType::Q8_0, n_in)};
        w.q8_scales = scales.data() + (uint64_t)r0 * (n_in / 32);
        return w;
    }
};

// The codes GEMM's stream-K workspace for one block per SM (flags zeroed once).
struct StreamKSpace {
    DeviceBuffer<float> partials{prefill_gemm_q8s_partial_floats((uint32_t)sm_count())};
    DeviceBuffer<uint32_t> flags{(size_t)sm_count()};
    StreamKSpace() { SPILLWAY_CUDA_CHECK(cudaMemset(flags.data(), 0, flags.bytes())); }
    GemmWorkspace view() const {
        return GemmWorkspace{partials.data(), partials.size(), flags.data(), (uint32_t)flags.size()};
    }
};

void bench_gemm(const Options& o, cublasHandle_t cublas, uint32_t n_in, uint32_t n_out, uint32_t T) {
    const std::string shape = std::to_string(n_out) + "x" + std::to_string(n_in) + ", T " + std::to_string(T);
    if (!o.only.empty() && std::string("gemm").find(o.only) == std::string::npos) return;
    const uint64_t q8_row = *ggml_row_bytes(GgmlType::Q8_0, n_in), f16_row = 2ull * n_in;
    DeviceBuffer<uint8_t> wq(q8_row * n_out), wh(f16_row * n_out);
    fill(GgmlType::Q8_0, wq.data(), wq.bytes(), 21);
    fill(GgmlType::F16, wh.data(), wh.bytes(), 22);
    DeviceBuffer<float> x((size_t)T * n_in), y((size_t)T * n_out);
    fill_f32_kernel<<<1024, 256>>>(x.data(), x.size(), 23);
    DeviceBuffer<__half> act((size_t)T * n_in), tile(32ull << 20);  // the engine's 64 MiB tile
    const CudaMatrix q8{GgmlType::Q8_0, wq.data(), n_in, n_out, q8_row};
    const CudaMatrix f16{GgmlType::F16, wh.data(), n_in, n_out, f16_row};
    const double flops = 2.0 * T * n_in * n_out;
    row("gemm q8_0 (dequant tiles + cuBLAS)", shape, flops, median_ms([&] {
        matmul_prefill_cuda(cublas, q8, x.data(), T, y.data(), act.data(), tile.data(), tile.size(), nullptr);
    }, o.reps));
    row("gemm f16 (cuBLAS, weights in place)", shape, flops, median_ms([&] {
        matmul_prefill_cuda(cublas, f16, x.data(), T, y.data(), act.data(), tile.data(), tile.size(), nullptr);
    }, o.reps));
    if (prefill_gemm_q8s_available()) {
        // The same weights in the split layout, read as codes by the Hopper kernel (x converted
        // to f16 inside the timing, as the rows above do).
        const SplitWeights split_weights(wq.data(), n_out, n_in);
        const CudaMatrix split_w = split_weights.rows(0, n_out);
        const StreamKSpace space;
        auto codes_row = [&](const std::string& name, bool add, Q8sGemmSplit split, const GemmWorkspace& ws) {
            row(name, shape, flops, median_ms([&] {
                prefill_act_to_f16_cuda(x.data(), (size_t)T * n_in, act.data(), nullptr);
                if (!prefill_gemm_q8s_cuda(split_w, act.data(), T, y.data(), add, nullptr, split, ws))
                    throw std::runtime_error("prefill_gemm_q8s_cuda declined the shape");
            }, o.reps));
        };
        const Q8sGemmSplit chosen = prefill_gemm_q8s_split(T, n_out, (uint32_t)sm_count());
        codes_row("gemm q8_0 split (wgmma, codes in registers), whole tiles, width auto = rows " +
                      std::to_string(chosen.rows_wide) + " x 256 + " + std::to_string(chosen.rows_narrow) + " x 128",
                  false, Q8sGemmSplit{}, GemmWorkspace{});
        codes_row("gemm q8_0 split (wgmma, codes in registers), whole tiles, width 128", false, Q8sGemmSplit{0, n_out}, {});
        codes_row("gemm q8_0 split (wgmma, codes in registers), whole tiles, width 256", false, Q8sGemmSplit{n_out, 0}, {});
        // The engine's default: the tail wave cut along k (stream-K).
        codes_row("gemm q8_0 split (wgmma, codes in registers), stream-K", false, Q8sGemmSplit{}, space.view());
        codes_row("gemm q8_0 split, y += W x, whole tiles", true, Q8sGemmSplit{}, GemmWorkspace{});
        codes_row("gemm q8_0 split, y += W x, stream-K", true, Q8sGemmSplit{}, space.view());
    }
    const uint32_t rows = (uint32_t)std::min<uint64_t>(n_out, tile.size() / n_in);
    const double dq_ms = median_ms([&] {
        for (uint32_t r0 = 0; r0 < n_out; r0 += rows)
            dequantize_rows_f16_cuda(q8, r0, std::min(rows, n_out - r0), tile.data(), nullptr);
    }, o.reps).ms;
    std::printf("| dequant q8_0 -> f16 alone | %ux%u | %.3f | (%.0f GB/s read+write) |\n", n_out, n_in, dq_ms,
                (double)(q8_row + f16_row) * n_out / (dq_ms * 1e6));
}

// The engine's grouped launches on the 14B shape: q|k|v (7168 rows) as one launch against the
// three alone, and gate|up (2 x 13824 rows) as one launch, with and without the SwiGLU epilogue.
void bench_gemm_groups(const Options& o, uint32_t T) {
    if (!o.only.empty() && std::string("gemm groups").find(o.only) == std::string::npos) return;
    if (!prefill_gemm_q8s_available()) return;
    const uint32_t n_in = 5120, qd = 5120, kd = 1024, ff = 13824;
    const uint32_t n_rows = std::max(qd + 2 * kd, 2 * ff);
    const uint64_t q8_row = *ggml_row_bytes(GgmlType::Q8_0, n_in);
    DeviceBuffer<uint8_t> wq(q8_row * n_rows);
    fill(GgmlType::Q8_0, wq.data(), wq.bytes(), 31);
    const SplitWeights weights(wq.data(), n_rows, n_in);
    DeviceBuffer<float> x((size_t)T * n_in), y((size_t)T * n_rows);
    fill_f32_kernel<<<1024, 256>>>(x.data(), x.size(), 33);
    DeviceBuffer<__half> act((size_t)T * n_in), glu((size_t)T * ff);
    prefill_act_to_f16_cuda(x.data(), x.size(), act.data(), nullptr);
    auto rows_of = [&](uint32_t r0, uint32_t n) { return weights.rows(r0, n); };
    auto run = [&](const char* what, double flops, const std::function<bool()>& gemm) {
        row(what, "T " + std::to_string(T), flops, median_ms([&] {
            if (!gemm()) throw std::runtime_error(std::string(what) + ": declined");
        }, o.reps));
    };
    float* yq = y.data();
    float* yk = yq + (size_t)T * qd;
    float* yv = yk + (size_t)T * kd;
    const double qkv_flops = 2.0 * T * n_in * (qd + 2 * kd), ff_flops = 2.0 * T * n_in * 2 * ff;
    run("gemm group q, k, v (three launches)", qkv_flops, [&] {
        return prefill_gemm_q8s_cuda(rows_of(0, qd), act.data(), T, yq, false, nullptr) &&
               prefill_gemm_q8s_cuda(rows_of(qd, kd), act.data(), T, yk, false, nullptr) &&
               prefill_gemm_q8s_cuda(rows_of(qd + kd, kd), act.data(), T, yv, false, nullptr);
    });
    const GemmOutput qkv[3] = {{yq, qd, qd}, {yk, kd, kd}, {yv, kd, kd}};
    run("gemm group q|k|v (one launch)", qkv_flops, [&] {
        return prefill_gemm_q8s_cuda(rows_of(0, qd + 2 * kd), act.data(), T, std::span<const GemmOutput>(qkv), false,
                                     nullptr);
    });
    const GemmOutput gate_up[2] = {{y.data(), ff, ff}, {y.data() + (size_t)T * ff, ff, ff}};
    run("gemm group gate|up (one launch, f32 out)", ff_flops, [&] {
        return prefill_gemm_q8s_cuda(rows_of(0, 2 * ff), act.data(), T, std::span<const GemmOutput>(gate_up), false,
                                     nullptr);
    });
    run("gemm group gate|up + SwiGLU epilogue (f16 out)", ff_flops,
        [&] { return prefill_gemm_q8s_swiglu_cuda(rows_of(0, 2 * ff), act.data(), T, glu.data(), nullptr); });
    // With the tail wave cut along k (the engine's default).
    const StreamKSpace space;
    run("gemm group q|k|v (one launch), stream-K", qkv_flops, [&] {
        return prefill_gemm_q8s_cuda(rows_of(0, qd + 2 * kd), act.data(), T, std::span<const GemmOutput>(qkv), false,
                                     nullptr, {}, space.view());
    });
    run("gemm group gate|up + SwiGLU epilogue (f16 out), stream-K", ff_flops, [&] {
        return prefill_gemm_q8s_swiglu_cuda(rows_of(0, 2 * ff), act.data(), T, glu.data(), nullptr, {}, space.view());
    });
}

// The engine's op times show the first GEMM after each layer boundary of an 8k prefill
// (down projection, then RMSNorm, then q) taking ~2.2x what the same GEMM takes right after
// it (docs/perf-notes.md, session 12). This replays that sequence outside the engine, f16
// weights in place (no dequantization, one stream), T = 2048, and times each step with
// events: down (5120 x 13824) -> RMSNorm of 2048 x 5120 (residual add, f16 out) -> q (5120 x
// 5120) -> another GEMM of q's shape. Variants: no kernel between down and q, or a 42 MB
// device copy instead of the norm. Prints the median us of each step over 20 repetitions.
void bench_gemm_sequence(const Options& o, cublasHandle_t cublas) {
    if (!o.only.empty() && std::string("gemm sequence").find(o.only) == std::string::npos) return;
    constexpr uint32_t T = 2048, E = 5120, F = 13824;
    // The step after q multiplies a second q-sized weight: the first one's 52 MB would partly still
    // be in L2 (60 MB on the H200) and flatter the second GEMM.
    DeviceBuffer<__half> w_down((size_t)E * F), w_q((size_t)E * E), w_q2((size_t)E * E), act_ffn((size_t)T * F),
        act((size_t)T * E);
    DeviceBuffer<float> x((size_t)T * E), proj((size_t)T * E), y((size_t)T * E), norm_w(E), scratch((size_t)T * E);
    fill(GgmlType::F16, reinterpret_cast<uint8_t*>(w_down.data()), w_down.bytes(), 31);
    fill(GgmlType::F16, reinterpret_cast<uint8_t*>(w_q.data()), w_q.bytes(), 32);
    fill(GgmlType::F16, reinterpret_cast<uint8_t*>(w_q2.data()), w_q2.bytes(), 36);
    fill(GgmlType::F16, reinterpret_cast<uint8_t*>(act_ffn.data()), act_ffn.bytes(), 33);
    fill_f32_kernel<<<1024, 256>>>(x.data(), x.size(), 34);
    fill_f32_kernel<<<64, 256>>>(norm_w.data(), norm_w.size(), 35);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    SPILLWAY_CUDA_CHECK(cublasSetStream(cublas, nullptr));
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&](const __half* w, uint32_t n_out, uint32_t n_in, const __half* in, float* out) {
        SPILLWAY_CUDA_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)T, (int)n_in, &one, w,
                                         CUDA_R_16F, (int)n_in, in, CUDA_R_16F, (int)n_in, &zero, out, CUDA_R_32F,
                                         (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    for (const char* between : {"rmsnorm", "none", "copy 42 MB"}) {
        constexpr int kReps = 20, kSteps = 4;  // down, between, q, a second q-shaped GEMM
        std::vector<cudaEvent_t> ev(kReps * (kSteps + 1));
        for (auto& e : ev) SPILLWAY_CUDA_CHECK(cudaEventCreate(&e));
        for (int r = 0; r < kReps; ++r) {
            cudaEvent_t* e = &ev[(size_t)r * (kSteps + 1)];
            SPILLWAY_CUDA_CHECK(cudaEventRecord(e[0]));
            gemm(w_down.data(), E, F, act_ffn.data(), proj.data());
            SPILLWAY_CUDA_CHECK(cudaEventRecord(e[1]));
            if (std::string(between) == "rmsnorm")
                rmsnorm_cuda(x.data(), proj.data(), norm_w.data(), nullptr, T, E, 1e-6f, nullptr, {}, act.data());
            else if (std::string(between) == "copy 42 MB")
                SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(scratch.data(), proj.data(), proj.bytes(), cudaMemcpyDeviceToDevice));
            SPILLWAY_CUDA_CHECK(cudaEventRecord(e[2]));
            gemm(w_q.data(), E, E, act.data(), y.data());
            SPILLWAY_CUDA_CHECK(cudaEventRecord(e[3]));
            gemm(w_q2.data(), E, E, act.data(), y.data());
            SPILLWAY_CUDA_CHECK(cudaEventRecord(e[4]));
        }
        SPILLWAY_CUDA_CHECK(cudaDeviceSynchronize());
        const char* names[kSteps] = {"down 5120x13824", "between", "q 5120x5120 (first)", "q-shaped 5120x5120 (next)"};
        for (int k = 0; k < kSteps; ++k) {
            std::vector<float> us(kReps);
            for (int r = 0; r < kReps; ++r) {
                SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&us[r], ev[(size_t)r * (kSteps + 1) + k],
                                                         ev[(size_t)r * (kSteps + 1) + k + 1]));
                us[r] *= 1000.0f;
            }
            std::nth_element(us.begin(), us.begin() + kReps / 2, us.end());
            std::printf("| gemm sequence, between = %s | %s, T %u | %.1f us | |\n", between, names[k], T, us[kReps / 2]);
        }
        for (auto& e : ev) cudaEventDestroy(e);
    }
}

// A 2048-token chunk's small ops on the 14B shape, each alone (median of 20 event-timed
// launches): us and GB/s of the bytes each must read and write at least. The engine's
// SPILLWAY_OP_TIMES=1 puts their sum per prefill at ~56 ms of ~530 (8k, session 21).
void bench_small_ops(const Options& o) {
    constexpr uint32_t T = 2048, E = 5120, F = 13824, H = 40, HKV = 8, D = 128;
    auto timed = [&](const std::string& what, double bytes, const std::function<void()>& run) {
        const std::string name = "small op " + what;
        if (!o.only.empty() && name.find(o.only) == std::string::npos) return;
        const double ms = median_ms(run, 20).ms;
        std::printf("| %s | T %u | %.1f us | %.0f GB/s |\n", name.c_str(), T, ms * 1000.0, bytes / (ms * 1e6));
        std::fflush(stdout);
    };
    DeviceBuffer<float> x((size_t)T * E), add((size_t)T * E), norm_w(E);
    DeviceBuffer<__half> out16((size_t)T * F);
    fill_f32_kernel<<<1024, 256>>>(x.data(), x.size(), 41);
    fill_f32_kernel<<<1024, 256>>>(add.data(), add.size(), 42);
    fill_f32_kernel<<<64, 256>>>(norm_w.data(), norm_w.size(), 43);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    // x read and written, the residual read (f32), the f16 output written.
    timed("rmsnorm + add, f16 out", (double)T * E * (4 + 4 + 4 + 2), [&] {
        rmsnorm_cuda(x.data(), add.data(), norm_w.data(), nullptr, T, E, 1e-6f, nullptr, {}, out16.data());
    });
    DeviceBuffer<float> gate((size_t)T * F), up((size_t)T * F);
    fill_f32_kernel<<<1024, 256>>>(gate.data(), gate.size(), 44);
    fill_f32_kernel<<<1024, 256>>>(up.data(), up.size(), 45);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    timed("swiglu, f16 out", (double)T * F * (4 + 4 + 2),
          [&] { swiglu_f16_cuda(gate.data(), up.data(), out16.data(), (size_t)T * F, nullptr); });
    RopeSpec spec;
    spec.type = RopeType::neox;
    spec.freq_base = 1000000.0f;
    const RopeTables tables = make_rope_tables(spec, D);
    DeviceBuffer<double> inv(tables.inv_freq.size());
    SPILLWAY_CUDA_CHECK(cudaMemcpy(inv.data(), tables.inv_freq.data(), inv.bytes(), cudaMemcpyHostToDevice));
    RopeDeviceTables dt;
    dt.neox = true;
    dt.n_dims = tables.n_dims;
    dt.inv_freq = inv.data();
    std::vector<int32_t> pos_host(T);
    for (uint32_t t = 0; t < T; ++t) pos_host[t] = (int32_t)(4096 + t);
    DeviceBuffer<int32_t> pos(T);
    SPILLWAY_CUDA_CHECK(cudaMemcpy(pos.data(), pos_host.data(), pos.bytes(), cudaMemcpyHostToDevice));
    DeviceBuffer<float2> table((size_t)T * (D / 2));
    rope_table_cuda(dt, pos.data(), T, table.data(), nullptr);
    DeviceBuffer<float> qkv((size_t)T * (H + 2 * HKV) * D), bias((H + 2 * HKV) * D);
    fill_f32_kernel<<<1024, 256>>>(qkv.data(), qkv.size(), 46);
    fill_f32_kernel<<<64, 256>>>(bias.data(), bias.size(), 47);
    SPILLWAY_CUDA_CHECK(cudaGetLastError());
    float* q = qkv.data();
    float* k = q + (size_t)T * H * D;
    float* v = k + (size_t)T * HKV * D;
    for (KvType t : {KvType::f16, KvType::q8_0}) {
        const uint64_t row = kv_row_bytes(t, HKV * D);
        DeviceBuffer<uint8_t> kc(row * T), vc(row * T);
        // q|k|v read and written (f32, in place), two cache rows written per token.
        timed(std::string("qkv_post, ") + kv_type_name(t) + " cache", (double)T * ((H + 2 * HKV) * D * 8 + 2 * row), [&] {
            qkv_post_cuda(QkvPostShape{H, HKV, D}, dt, q, k, v, bias.data(), T, pos.data(), t, kc.data(), t, vc.data(), 0,
                          nullptr, table.data(), 256);
        });
    }
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--only") && i + 1 < argc) o.only = argv[++i];
        else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--energy-ms") && i + 1 < argc) g_energy_ms = std::max(0, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
            o.tokens = (uint32_t)std::atoi(argv[++i]);
            if (o.tokens != 512 && o.tokens != 1024 && o.tokens != 2048 && o.tokens != 4096) {
                std::fprintf(stderr, "bench_prefill: --tokens takes 512, 1024, 2048 or 4096 (the GEMM rows' chunks)\n");
                return 2;
            }
        }
        else {
            std::fprintf(stderr, "usage: bench_prefill [--only SUBSTRING] [--reps N] [--tokens T] [--energy-ms MS]\n");
            return 2;
        }
    }
    try {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            std::printf("bench_prefill: no CUDA device\n");
            return 0;
        }
        cudaDeviceProp prop{};
        SPILLWAY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("device: %s, %d SMs\n\n| what | shape | ms | TFLOP/s | J / run | W | GFLOP/J | SM MHz |\n|---|---|---:|---:|---:|---:|---:|---:|\n", prop.name,
                    prop.multiProcessorCount);
        warm_up_clocks(1.5);
        using K = PrefillAttentionKernel;
        const KvType f16 = KvType::f16, q8 = KvType::q8_0, q4 = KvType::q4_0;
        bench_attention(o, K::simt, f16, f16, 8192, 512);
        // The 16-row kernels (runs P2-1 / P2-2) as the baseline of the same run.
        for (K k : {K::tensor_core, K::tensor_core_wide}) {
            bench_attention(o, k, f16, f16, 8192, 512);
            bench_attention(o, k, f16, f16, 8192, 2048);
            bench_attention(o, k, f16, f16, 65536, 2048);
        }
        bench_attention(o, K::tensor_core_wide, q8, q8, 65536, 2048);
        bench_attention(o, K::tensor_core_wide, q4, q4, 65536, 2048);
        // 32 rows per warp: never split, split over clusters where the waves fill better
        // (the default for f16), and the 8-warp one (the default for quantized K/V).
        for (uint32_t chunk : {512u, 2048u}) bench_attention(o, K::tensor_core_m32_unsplit, f16, f16, 8192, chunk);
        for (uint32_t chunk : {2048u, 4096u}) bench_attention(o, K::tensor_core_m32_unsplit, f16, f16, 65536, chunk);
        for (uint32_t chunk : {512u, 2048u}) bench_attention(o, K::tensor_core_m32, f16, f16, 8192, chunk);
        for (uint32_t chunk : {512u, 2048u, 4096u}) bench_attention(o, K::tensor_core_m32, f16, f16, 65536, chunk);
        for (KvType t : {q8, q4}) bench_attention(o, K::tensor_core_m32, t, t, 65536, 2048);
        bench_attention(o, K::tensor_core_m32_wide, f16, f16, 65536, 2048);
        for (KvType t : {q8, q4}) bench_attention(o, K::tensor_core_m32_wide, t, t, 65536, 2048);
        bench_attention(o, K::tensor_core_m32_wide, q8, q4, 65536, 2048);
        // Hopper wgmma (other GPUs / builds run tensor_core_m32 under this name).
        for (uint32_t chunk : {512u, 2048u}) bench_attention(o, K::tensor_core_wgmma, f16, f16, 8192, chunk);
        for (uint32_t chunk : {2048u, 4096u}) bench_attention(o, K::tensor_core_wgmma, f16, f16, 65536, chunk);
        for (KvType t : {q8, q4}) bench_attention(o, K::tensor_core_wgmma, t, t, 65536, 2048);
        bench_attention(o, K::tensor_core_wgmma, q8, q4, 65536, 2048);
        // The default (specialized, session 42) against the kernel before it, in one run.
        for (uint32_t chunk : {512u, 2048u})
            for (const auto& [schedule, schedule_name] :
                 {std::pair{WgmmaSchedule::skew128, "skew128"}, std::pair{WgmmaSchedule::specialized, "specialized"}})
                bench_wgmma_schedule(o, schedule, schedule_name, chunk == 512 ? 8192 : 65536, chunk);
        for (KvType t : {q8, q4}) bench_attention_pieces(o, t, t, 65536, 2048);
        bench_attention_pieces(o, q8, q4, 65536, 2048);
        bench_attention_pieces(o, q8, q8, 8192, 2048);
        bench_small_ops(o);
        cublasHandle_t cublas = nullptr;
        SPILLWAY_CUDA_CHECK(cublasCreate(&cublas));
        bench_gemm_sequence(o, cublas);
        for (uint32_t T : {512u, 2048u})
            if (o.runs_tokens(T)) bench_gemm_groups(o, T);
        for (uint32_t T : {512u, 1024u, 2048u, 4096u}) {
            if (!o.runs_tokens(T)) continue;
            bench_gemm(o, cublas, 5120, 13824, T);  // gate / up
            bench_gemm(o, cublas, 13824, 5120, T);  // down
            bench_gemm(o, cublas, 5120, 5120, T);   // q / o
            bench_gemm(o, cublas, 5120, 1024, T);   // k / v
        }
        cublasDestroy(cublas);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_prefill: %s\n", e.what());
        return 1;
    }
    return 0;
}
