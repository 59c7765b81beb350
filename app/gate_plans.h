#pragma once
// What the planner says about the spec's four gate cells: the f16/f16 window the budget
// leaves with the switch off (the f16_spill cell) and the auto-tier walk's choice (the auto
// cell), for this GPU or a --profile, the budget capped by --vram-target. Shared by the
// gate on a model file and the speed-only gate on a synthetic model.
#include <cstdint>
#include <optional>
#include <string>

#include "app/args.h"
#include "model/model_spec.h"
#include "plan/planner.h"
#include "quality/gate_cells.h"

namespace spillway {

struct GatePlans {
    KvPlan f16;        // switch off, f16/f16: its spill window
    KvPlan automatic;  // switch on
    std::string source;
};

// nullopt on the CPU engine without --profile (no GPU to plan for).
std::optional<GatePlans> plan_gate_cells(const ArgParser& args, bool on_cpu, const ModelSpec& spec, uint64_t n_ctx);

AutoDecision auto_decision_from(const GatePlans& plans);

}  // namespace spillway
