#pragma once
// Device-side measurements (spec T2/T3) on our own kernels: VRAM read bandwidth, pinned
// host->device copy bandwidth (the path a spilled tail takes), attention cost per cell per
// KV tier, and c_engage — the fixed per-token cost of turning the streaming path on. No
// CUDA types in this header: plan/ and app/ include it freely; without a CUDA build the
// functions throw a clear error.
#include <cstdint>
#include <string>

#include "probe/probe_values.h"

namespace spillway {

struct GpuIdentity {
    std::string name;
    std::string uuid;    // "GPU-xxxxxxxx-..." as nvidia-smi prints it
    std::string driver;  // CUDA driver API version, e.g. "13000"
    double vram_total_mib = 0;
    double vram_free_mib = 0;
    int sm_count = 0;
};

// True when built with CUDA and a device is usable.
bool cuda_device_available();
GpuIdentity gpu_identity();

struct DeviceProbeShape {
    uint32_t n_layer = 48;
    uint32_t n_head = 40;
    uint32_t n_head_kv = 8;
    uint32_t head_dim = 128;
};
DeviceProbeShape device_probe_shape(const ModelSpec& model);

// HBM read bandwidth on a streaming-read kernel over a buffer far larger than L2 (median of
// repeats). Also the denominator of `spillway bench`'s % of roofline.
double measure_vram_read_gbps();

// Pinned host->device copy bandwidth as the spilled tail streams: per-layer pieces of a few
// MiB from a large pinned arena (the planner's and the bench's h2d term).
double measure_pinned_h2d_gbps();

// Measures everything (target: under 2 s on a modern GPU). host_ram_gbps is filled by the
// host probe, not here.
ProbeValues measure_device_probe(const DeviceProbeShape& shape);

}  // namespace spillway
