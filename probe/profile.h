#pragma once
// --profile FILE: a JSON description of a GPU and host (profiles/*.json), and the
// flag/env overrides applied on top of any source of probe values.
//
// Format (numbers are JSON numbers; "source" documents where each number came from):
//   { "name": "rtx3090-pcie4-ddr4", "gpu_name": "NVIDIA GeForce RTX 3090",
//     "vram_total_mib": 24576, "vram_free_mib": 24000 (optional),
//     "vram_bw_gbps": 936, "pcie_h2d_gbps": 6.7, "host_ram_gbps": 11.5, "c_engage_ms": 0.80,
//     "attn_ms_per_cell": { "f16": 6.2e-4 } (optional),
//     "source": { "<field>": "where it came from", ... } }
#include <optional>
#include <string>

#include "probe/probe_values.h"

namespace spillway {

// Parses and validates a profile. Every defect (missing, negative, NaN/infinite, wrong
// type, unknown field) is reported at once, each naming the field; `what` names the file.
ProbeValues parse_probe_profile(const std::string& json_text, const std::string& what);
ProbeValues load_probe_profile(const std::string& path);

// Values given on the command line or in the environment win over a profile or cache.
struct ProbeOverrides {
    std::optional<double> vram_free_mib;
    std::optional<double> vram_bw_gbps;
    std::optional<double> pcie_h2d_gbps;
    std::optional<double> host_ram_gbps;
    std::optional<double> c_engage_ms;
};
void apply_probe_overrides(ProbeValues& values, const ProbeOverrides& overrides);

// The message for "the decision needs measurements and none exist": names each missing
// field and the flags/profiles that supply it.
std::string missing_measurements_message(const ProbeValues& values);

}  // namespace spillway
