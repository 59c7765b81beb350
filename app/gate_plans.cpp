#include "app/gate_plans.h"

#include "app/plan_args.h"
#include "common/log.h"

namespace spillway {

// The planner's two views of the gate's configuration: the f16 window with the switch off
// (what f16_spill runs) and the auto-tier walk (what auto runs), from --profile FILE or
// this machine's GPU, the budget capped by --vram-target.
std::optional<GatePlans> plan_gate_cells(const ArgParser& args, bool on_cpu, const ModelSpec& spec, uint64_t n_ctx) {
    // On the CPU engine without a profile there is no GPU to plan for.
    if (on_cpu && !args.has("--profile")) return std::nullopt;
    const PlanKnobs knobs = resolve_plan_knobs(knob_flags_from(args), process_env());
    const PlanSource source = plan_source_from(args);
    const BudgetInputs budget = budget_inputs_from(args, spec, source.values, knobs);
    GatePlans plans;
    plans.source = source.values.origin + ", ctx " + std::to_string(n_ctx);
    PlanKnobs off = knobs;
    off.auto_tier = false;
    off.type_k = off.type_v = KvType::f16;
    PlanKnobs on = knobs;
    on.auto_tier = true;
    on.type_k = on.type_v = std::nullopt;
    ScopedLogCapture quiet;  // the WARN lines are kept in the plan's diagnostics and shown below
    plans.f16 = plan_from_source(spec, n_ctx, budget, off, source);
    plans.automatic = plan_from_source(spec, n_ctx, budget, on, source);
    return plans;
}

AutoDecision auto_decision_from(const GatePlans& plans) {
    AutoDecision d;
    d.tier = kv_tier_name(plans.automatic.tier);
    d.reason = plans.automatic.reason;
    d.source = plans.source;
    d.f16_spills = plans.f16.window.spilled_cells > 0;
    return d;
}

}  // namespace spillway
