#pragma once
// The T*-aware auto KV tier decision (spec/tstar_auto_spill.md): walk the ladder from
// least to most compression and take the first tier whose spill is <= T*, where T* is the
// largest tail whose predicted per-token drop stays under the target; the floor takes the
// rest. Pure: measurements come from a ProbeSource, called lazily and at most once.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "plan/budget.h"
#include "plan/drop_model.h"
#include "plan/knobs.h"
#include "plan/kv_tiers.h"
#include "probe/probe_values.h"

namespace spillway {

// The measured terms the drop model needs, with their origin, for one host and GPU.
struct HostTerms {
    double vram_bw_gbps = 0;
    EffectiveBandwidth bw;
    double c_engage_ms = 0;
    std::string origin;  // where the values came from, for the diagnostics
};
// Throws spillway::Error listing every missing measurement and how to supply it.
// knobs.host_ram_gbps (flag/env) wins over the probed host RAM bandwidth.
HostTerms host_terms_from(const ProbeValues& values, const PlanKnobs& knobs);

enum class RowVerdict {
    fits,               // whole cache resident
    spill_within_tstar, // spills, but no more than T*
    spill_over_tstar,   // spills more than T*
    spills,             // spills; T* unknown (nothing measured)
};
const char* row_verdict_name(RowVerdict verdict);  // "fits", "spill<=T*", "spill>T*", "spills"

struct LadderRow {
    KvTier tier;
    uint64_t kv_bytes = 0;
    SpillWindow window;
    uint64_t staging_bytes = 0;  // VRAM of the spill's staging ring, paid from the budget
    // Present when host terms are known:
    std::optional<double> t_resident_ms;
    std::optional<uint64_t> tstar_unclamped_bytes;
    std::optional<uint64_t> tstar_bytes;      // after the DCA ceiling (--max-spill-mib)
    std::optional<double> predicted_drop;     // 0 when the tier fits
    std::optional<double> predicted_tok_s;    // 1000 / predicted token ms
    RowVerdict verdict = RowVerdict::spills;
};

LadderRow make_ladder_row(const ModelSpec& model, uint64_t n_ctx, uint64_t budget_bytes, KvTier tier,
                          const HostTerms* terms, const PlanKnobs& knobs);

enum class PlanMode {
    auto_off,        // switch off: requested (or default) types, spill window only
    full_walk,       // switch on, no -ctk/-ctv
    v_walk,          // switch on, -ctk pins K, V walks {f16, q8_0, q4_0}
    explicit_v,      // switch on, -ctv given: auto-tier disabled, only the window is automatic
};
const char* plan_mode_name(PlanMode mode);

struct KvPlan {
    PlanMode mode = PlanMode::auto_off;
    uint64_t n_ctx = 0;
    KvTier tier;
    size_t chosen = 0;                    // index into ladder
    uint64_t kv_bytes = 0;
    SpillWindow window;                   // resident/spilled cells and bytes of the chosen tier
    uint64_t staging_bytes = 0;           // the spill's staging ring (0 when nothing spills)
    Budget budget;
    std::optional<HostTerms> terms;       // present only when the probe was called
    std::optional<uint64_t> tstar_bytes;  // the chosen tier's T*, when computed
    std::optional<double> predicted_drop;
    std::optional<double> predicted_tok_s;
    bool probed = false;
    std::string reason;                   // "fits", "spill 30 MiB <= T* 45 MiB", ...
    std::vector<LadderRow> ladder;        // the ladder this mode walks (or would walk)
    std::vector<std::string> diagnostics; // the WARN lines logged (empty with the switch off)
};

// The ladder a mode walks given the explicit axes, without tiers whose quantized blocks do
// not fit the model's head dims. Throws when an explicitly requested type does not fit.
std::vector<KvTier> ladder_for(const ModelSpec& model, const PlanKnobs& knobs);

// Decides the KV tier and spill window. Logs the diagnostics at WARN only when the switch
// is on; with it off nothing is probed and nothing is logged.
KvPlan plan_kv(const ModelSpec& model, uint64_t n_ctx, const BudgetInputs& budget_inputs,
               const PlanKnobs& knobs, ProbeSource& probe);

}  // namespace spillway
