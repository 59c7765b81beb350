#pragma once
// The planner's command-line surface, shared by plan, run, bench and gate: the knobs
// (auto-tier switch, drop target and model, DCA ceiling, VRAM cap, host RAM override), the
// probe overrides, where probe values come from (a profile, this machine's GPU, or flags),
// and the budget. One place, so every command resolves the same flags the same way.
#include <cstdint>
#include <optional>
#include <string>

#include "app/args.h"
#include "model/model_spec.h"
#include "plan/budget.h"
#include "plan/knobs.h"
#include "plan/planner.h"
#include "probe/machine_probe.h"
#include "probe/profile.h"
#include "probe/probe_values.h"

namespace spillway {

// Declares --kv-auto-tier, --tstar-drop, --max-spill-mib, --drop-model, --host-ram-gbps,
// --vram-target, the probe overrides (--pcie-gbps, --vram-bw-gbps, --c-engage-ms,
// --vram-free-mib), --compute-reserve-mib and, when with_profile, --profile FILE.
// -ctk/-ctv are declared by each command (their help differs).
void add_plan_options(ArgParser& args, bool with_profile);

// The knob flags as given (the -ctk/-ctv texts included); resolve with resolve_plan_knobs.
KnobFlags knob_flags_from(const ArgParser& args);
ProbeOverrides probe_overrides_from(const ArgParser& args);

// Where the planner's measurements come from.
struct PlanSource {
    ProbeValues values;        // profile or GPU identity, overrides applied
    bool use_machine = false;  // bandwidths and c_engage: this GPU's probe (cache or measure)
    ProbeOverrides overrides;
};
// --profile FILE if declared and given; else this machine's GPU when one is usable (its
// identity now; bandwidths only when the walk asks); else the flags alone.
PlanSource plan_source_from(const ArgParser& args);

// Budget inputs: free VRAM from the source (or --vram-target alone), the cap, the weights,
// the compute reserve (--compute-reserve-mib or the model's estimate).
BudgetInputs budget_inputs_from(const ArgParser& args, const ModelSpec& model, const ProbeValues& values,
                                const PlanKnobs& knobs);

// This machine's probe (cache or measurement) with the override flags applied on top.
class OverriddenMachineProbe : public ProbeSource {
public:
    OverriddenMachineProbe(const ModelSpec& model, ProbeOverrides overrides)
        : machine_(model), overrides_(overrides) {}
    ProbeValues measure() override;
    int calls() const { return machine_.calls(); }

private:
    MachineProbeSource machine_;
    ProbeOverrides overrides_;
};

// plan_kv with the source above: the machine's probe, or the fixed values.
KvPlan plan_from_source(const ModelSpec& model, uint64_t n_ctx, const BudgetInputs& budget, const PlanKnobs& knobs,
                        const PlanSource& source);

}  // namespace spillway
