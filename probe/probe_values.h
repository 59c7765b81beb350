#pragma once
// What the planner needs to know about a GPU and its host, however it was obtained: a
// --profile JSON file, flag/env overrides, or (later issue) boot measurements cached on
// disk. Plain data; no CUDA here: plan/ is tested with injected values.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace spillway {

struct ProbeValues {
    std::string gpu_name;
    std::optional<double> vram_total_mib;
    std::optional<double> vram_free_mib;     // when unknown, plan uses vram_total_mib
    std::optional<double> vram_bw_gbps;      // GPU memory read bandwidth
    std::optional<double> pcie_h2d_gbps;     // pinned host->device copy bandwidth
    std::optional<double> host_ram_gbps;     // host RAM single-thread memcpy bandwidth
    std::optional<double> c_engage_ms;       // fixed cost of engaging the streaming path
    std::map<KvType, double> attn_ms_per_cell;  // attention time per cell per tier, if known
    std::string origin;                      // "profile FILE", "flags", ... for diagnostics
    std::vector<std::string> overridden;     // fields replaced by flags/env, e.g. "pcie_h2d_gbps (--pcie-gbps)"
};

// The planner asks a ProbeSource for measurements only when the decision needs them
// (switch on, top tier does not fit), and at most once per plan. A boot implementation
// measures (expensive); tests count calls.
class ProbeSource {
public:
    virtual ~ProbeSource() = default;
    virtual ProbeValues measure() = 0;
};

// Hands out values known up front (a profile plus overrides).
class FixedProbeSource : public ProbeSource {
public:
    explicit FixedProbeSource(ProbeValues values) : values_(std::move(values)) {}
    ProbeValues measure() override {
        ++calls_;
        return values_;
    }
    int calls() const { return calls_; }

private:
    ProbeValues values_;
    int calls_ = 0;
};

}  // namespace spillway
