// Device probes on our own kernels. Timings use CUDA events, warm-up first, median of
// repeats; buffers are larger than L2 where bandwidth is measured.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>

#include "engine/cuda/attention.cuh"
#include "engine/cuda/cuda_check.h"
#include "model/model_spec.h"
#include "probe/device_probe.h"

namespace spillway {
namespace {

__global__ void read_bandwidth_kernel(const float4* data, size_t n, float* sink) {
    float acc = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = data[i];
        acc += v.x + v.y + v.z + v.w;
    }
    // A data-dependent store keeps the loads alive without costing bandwidth.
    if (acc == 1234.5f) sink[blockIdx.x] = acc;
}

class EventTimer {
public:
    EventTimer() {
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&start_));
        SPILLWAY_CUDA_CHECK(cudaEventCreate(&stop_));
    }
    ~EventTimer() {
        cudaEventDestroy(start_);
        cudaEventDestroy(stop_);
    }
    // Median milliseconds of `repeats` runs of fn(stream), after one warm-up.
    template <typename Fn>
    double median_ms(cudaStream_t stream, int repeats, Fn&& fn) {
        fn(stream);
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<double> ms;
        for (int r = 0; r < repeats; ++r) {
            SPILLWAY_CUDA_CHECK(cudaEventRecord(start_, stream));
            fn(stream);
            SPILLWAY_CUDA_CHECK(cudaEventRecord(stop_, stream));
            SPILLWAY_CUDA_CHECK(cudaEventSynchronize(stop_));
            float t = 0;
            SPILLWAY_CUDA_CHECK(cudaEventElapsedTime(&t, start_, stop_));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    }

private:
    cudaEvent_t start_{}, stop_{};
};

class Stream {
public:
    Stream() { SPILLWAY_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s_); }
    operator cudaStream_t() const { return s_; }

private:
    cudaStream_t s_{};
};

double measure_vram_read_gbps(cudaStream_t stream, const GpuIdentity& gpu) {
    size_t bytes = size_t(1) << 30;
    while (bytes > (size_t(64) << 20) && (double)bytes * 4 > gpu.vram_free_mib * 1048576.0) bytes /= 2;
    DeviceBuffer<float4> data(bytes / sizeof(float4));
    DeviceBuffer<float> sink(4096);
    SPILLWAY_CUDA_CHECK(cudaMemsetAsync(data.data(), 0, bytes, stream));
    int blocks = gpu.sm_count * 8;
    EventTimer timer;
    double ms = timer.median_ms(stream, 7, [&](cudaStream_t s) {
        read_bandwidth_kernel<<<blocks, 512, 0, s>>>(data.data(), data.size(), sink.data());
        SPILLWAY_CUDA_CHECK(cudaGetLastError());
    });
    return (double)bytes / (ms * 1e-3) / 1e9;
}

// Pinned host -> device bandwidth on the path a spilled tail takes (engine/cuda/kv_spill):
// one copy per layer for K and one for V, each a few MiB, walking a pinned arena far larger
// than a piece into a two-buffer staging ring. Measured this way because one large copy
// from a small, hot buffer overstates it: per copy the engine pays a fixed ~5 us, and the
// tail is spread over GiBs of pinned pages (H200: 55.3 GB/s for one 256 MiB copy, 50-53
// GB/s for the spill's pattern; docs/perf-notes.md, "Spill, session 10").
double measure_pinned_h2d_gbps(cudaStream_t stream) {
    const size_t piece = size_t(4) << 20, arena = size_t(512) << 20;
    PinnedBuffer host(arena);
    DeviceBuffer<uint8_t> staging(4 * piece);
    std::memset(host.data(), 1, arena);
    EventTimer timer;
    double ms = timer.median_ms(stream, 3, [&](cudaStream_t s) {
        for (size_t off = 0, i = 0; off + piece <= arena; off += piece, ++i)
            SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(staging.data() + (i % 4) * piece,
                                                static_cast<const uint8_t*>(host.data()) + off, piece,
                                                cudaMemcpyHostToDevice, s));
    });
    return (double)arena / (ms * 1e-3) / 1e9;
}

// One layer's KV for `cells` cells of a tier, filled with small finite values (0x11 bytes:
// f16 0x1111 ~ 6e-4, q8_0 scale 6e-4 with quants 17) so the timing runs on real numbers.
struct LayerKv {
    DeviceBuffer<uint8_t> k, v;
    LayerKv(const LayerKvLayout& layout, uint32_t cells, cudaStream_t stream)
        : k(layout.k_row_bytes() * cells), v(layout.v_row_bytes() * cells) {
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(k.data(), 0x11, k.bytes(), stream));
        SPILLWAY_CUDA_CHECK(cudaMemsetAsync(v.data(), 0x11, v.bytes(), stream));
    }
};

}  // namespace

bool cuda_device_available() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return false;
    }
    return n > 0;
}

GpuIdentity gpu_identity() {
    if (!cuda_device_available()) fail("no CUDA device is available");
    int device = 0;
    SPILLWAY_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    SPILLWAY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    GpuIdentity id;
    id.name = prop.name;
    const unsigned char* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                  u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    id.uuid = uuid;
    int driver = 0;
    SPILLWAY_CUDA_CHECK(cudaDriverGetVersion(&driver));
    id.driver = std::to_string(driver);
    size_t free_bytes = 0, total_bytes = 0;
    SPILLWAY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    id.vram_total_mib = (double)total_bytes / 1048576.0;
    id.vram_free_mib = (double)free_bytes / 1048576.0;
    id.sm_count = prop.multiProcessorCount;
    return id;
}

double measure_vram_read_gbps() {
    GpuIdentity gpu = gpu_identity();
    Stream stream;
    return measure_vram_read_gbps(stream, gpu);
}

double measure_pinned_h2d_gbps() {
    Stream stream;
    return measure_pinned_h2d_gbps(stream);
}

ProbeValues measure_device_probe(const DeviceProbeShape& shape) {
    GpuIdentity gpu = gpu_identity();
    ProbeValues values;
    values.gpu_name = gpu.name;
    values.vram_total_mib = gpu.vram_total_mib;
    values.vram_free_mib = gpu.vram_free_mib;
    values.origin = "measured on " + gpu.name;
    Stream compute, copy;
    values.vram_bw_gbps = measure_vram_read_gbps(compute, gpu);
    values.pcie_h2d_gbps = measure_pinned_h2d_gbps(copy);

    AttentionShape attn;
    attn.n_head = shape.n_head;
    attn.n_head_kv = shape.n_head_kv;
    attn.head_dim_k = attn.head_dim_v = shape.head_dim;
    attn.scale = 1.0f / std::sqrt((float)shape.head_dim);
    if (!attention_supports(attn)) {
        values.c_engage_ms = std::nullopt;
        return values;  // the planner reports c_engage as missing for this shape
    }
    // The slope between two long ranges: the decode attention picks its kernel by range length
    // (attention_default_kernel: tensor cores from kAttentionMmaMinCells), and a slope across
    // the switch would mix two kernels; long ranges are what a spill decision is about.
    const uint32_t small = kAttentionMmaMinCells, big = 2 * small, sm = (uint32_t)gpu.sm_count;
    DeviceBuffer<float> q(attn.n_head * attn.head_dim_k), out(attn.n_head * attn.head_dim_v), lse(attn.n_head);
    DeviceBuffer<float> tail_out(attn.n_head * attn.head_dim_v), tail_lse(attn.n_head);
    SPILLWAY_CUDA_CHECK(cudaMemsetAsync(q.data(), 0, q.bytes(), compute));
    size_t ws_bytes = attention_workspace_bytes(attn, big, sm);
    DeviceBuffer<uint8_t> workspace(std::max<size_t>(ws_bytes, 1));
    EventTimer timer;

    for (KvType type : {KvType::f16, KvType::q8_0, KvType::q4_0}) {
        LayerKvLayout layout{type, type, attn.n_head_kv, attn.head_dim_k, attn.head_dim_v};
        LayerKv kv(layout, big, compute);
        auto attend = [&](uint32_t cells) {
            return timer.median_ms(compute, 15, [&](cudaStream_t s) {
                attention_partial_cuda(attn, q.data(), type, kv.k.data(), type, kv.v.data(), cells, out.data(),
                                       lse.data(), workspace.data(), ws_bytes, sm, s);
            });
        };
        double ms_big = attend(big), ms_small = attend(small);
        values.attn_ms_per_cell[type] = std::max(0.0, (ms_big - ms_small) / (double)(big - small));
    }

    // c_engage on the path the spill uses: per layer, a minimal tail (one cell) is copied
    // from pinned memory on the copy stream, attended, and merged with the resident
    // partial. The difference to resident-only attention over all layers is the fixed
    // per-token cost of engaging the stream.
    {
        KvType type = KvType::f16;
        LayerKvLayout layout{type, type, attn.n_head_kv, attn.head_dim_k, attn.head_dim_v};
        const uint32_t resident = 8192;
        LayerKv kv(layout, resident, compute);
        const size_t tail_bytes = layout.k_row_bytes() + layout.v_row_bytes();
        PinnedBuffer host_tail(tail_bytes * shape.n_layer);
        std::memset(host_tail.data(), 0x11, host_tail.bytes());
        DeviceBuffer<uint8_t> staging(tail_bytes * 2);  // double-buffered by layer parity
        cudaEvent_t copied[2], consumed[2];
        for (int i = 0; i < 2; ++i) {
            SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
            SPILLWAY_CUDA_CHECK(cudaEventCreateWithFlags(&consumed[i], cudaEventDisableTiming));
            SPILLWAY_CUDA_CHECK(cudaEventRecord(consumed[i], compute));
        }
        auto resident_token = [&](cudaStream_t s) {
            for (uint32_t l = 0; l < shape.n_layer; ++l)
                attention_partial_cuda(attn, q.data(), type, kv.k.data(), type, kv.v.data(), resident, out.data(),
                                       lse.data(), workspace.data(), ws_bytes, sm, s);
        };
        auto spilled_token = [&](cudaStream_t s) {
            for (uint32_t l = 0; l < shape.n_layer; ++l) {
                int slot = l & 1;
                uint8_t* stage = staging.data() + slot * tail_bytes;
                SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(copy, consumed[slot], 0));
                SPILLWAY_CUDA_CHECK(cudaMemcpyAsync(stage, (const uint8_t*)host_tail.data() + l * tail_bytes,
                                                    tail_bytes, cudaMemcpyHostToDevice, copy));
                SPILLWAY_CUDA_CHECK(cudaEventRecord(copied[slot], copy));
                attention_partial_cuda(attn, q.data(), type, kv.k.data(), type, kv.v.data(), resident, out.data(),
                                       lse.data(), workspace.data(), ws_bytes, sm, s);
                SPILLWAY_CUDA_CHECK(cudaStreamWaitEvent(s, copied[slot], 0));
                attention_partial_cuda(attn, q.data(), type, stage, type, stage + layout.k_row_bytes(), 1,
                                       tail_out.data(), tail_lse.data(), workspace.data(), ws_bytes, sm, s);
                attention_merge_cuda(attn.n_head, attn.head_dim_v, out.data(), lse.data(), tail_out.data(),
                                     tail_lse.data(), s);
                SPILLWAY_CUDA_CHECK(cudaEventRecord(consumed[slot], s));
            }
        };
        double t_resident = timer.median_ms(compute, 9, resident_token);
        double t_spilled = timer.median_ms(compute, 9, spilled_token);
        SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(copy));
        for (int i = 0; i < 2; ++i) {
            cudaEventDestroy(copied[i]);
            cudaEventDestroy(consumed[i]);
        }
        values.c_engage_ms = std::max(0.0, t_spilled - t_resident);
    }
    SPILLWAY_CUDA_CHECK(cudaStreamSynchronize(compute));
    return values;
}

}  // namespace spillway
