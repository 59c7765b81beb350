#include "probe/machine_probe.h"

#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "probe/host_probe.h"

namespace spillway {

MachineProbeResult probe_machine(const ModelSpec& model, bool refresh) {
    // The clock starts after the GPU is identified: creating the CUDA context (~0.1 s) is
    // paid by any GPU program whether or not it probes, and is not the probe's cost.
    MachineProbeResult result;
    GpuIdentity gpu = gpu_identity();
    auto start = std::chrono::steady_clock::now();
    result.key = {gpu.uuid, gpu.driver, attention_shape_class(model)};
    result.cache_path = probe_cache_path();
    if (!refresh) {
        if (auto cached = load_cached_probe(result.cache_path, result.key)) {
            result.values = *cached;
            // Free memory changes from run to run; the cache holds the bandwidths.
            result.values.vram_free_mib = gpu.vram_free_mib;
            result.values.vram_total_mib = gpu.vram_total_mib;
            result.from_cache = true;
            result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            return result;
        }
    }
    result.values = measure_device_probe(device_probe_shape(model));
    HostRamBandwidth host = measure_host_ram_bandwidth();
    result.values.host_ram_gbps = host.single_thread_gbps;
    result.host_ram_multi_thread_gbps = host.multi_thread_gbps;
    try {
        store_cached_probe(result.cache_path, result.key, result.values);
    } catch (const Error& e) {
        log_warn(std::string("probe results not cached: ") + e.what());
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
}

ProbeValues MachineProbeSource::measure() {
    ++calls_;
    MachineProbeResult r = probe_machine(model_, false);
    log_info("probe: " + std::string(r.from_cache ? "loaded from " : "measured and cached in ") + r.cache_path +
             " (" + std::to_string(r.seconds * 1000.0) + " ms)");
    return r.values;
}

}  // namespace spillway
