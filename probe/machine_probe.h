#pragma once
// Probe values for this machine: from the cache when a valid entry exists for this GPU,
// driver and attention shape, otherwise measured (device + host) and stored. A ProbeSource,
// so the planner calls it only when its decision needs measurements.
#include <string>

#include "probe/device_probe.h"
#include "probe/probe_cache.h"
#include "probe/probe_values.h"

namespace spillway {

struct MachineProbeResult {
    ProbeValues values;
    ProbeCacheKey key;
    std::string cache_path;
    bool from_cache = false;
    double seconds = 0;  // measurement or cache load, after the GPU was identified
    double host_ram_multi_thread_gbps = 0;  // informational; 0 when loaded from cache
};

// refresh: ignore the cache and measure. A cache that cannot be written is reported at
// WARN and the measured values are still returned.
MachineProbeResult probe_machine(const ModelSpec& model, bool refresh);

class MachineProbeSource : public ProbeSource {
public:
    explicit MachineProbeSource(const ModelSpec& model) : model_(model) {}
    ProbeValues measure() override;
    int calls() const { return calls_; }

private:
    const ModelSpec& model_;
    int calls_ = 0;
};

}  // namespace spillway
